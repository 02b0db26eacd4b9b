/* attention.h: grouped-query attention over an f16 KV cache, for T query rows at once, on the CPU: causal
 * for the target (a prefill chunk, a step, or a verify block), over every cached row for the drafter's
 * cross-attention to its context. */
#ifndef FM_CPU_ATTENTION_H
#define FM_CPU_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "core/threadpool.h"

typedef struct {
    int n_heads, n_kv_heads, head_dim;
    const uint16_t *k_cache; /* [n_ctx][n_kv_heads*head_dim] f16, positions 0 .. pos0+T-1 filled */
    const uint16_t *v_cache; /* same layout */
    int pos0;                /* causal: position of query row 0; row t attends to positions 0 .. pos0+t */
    int n_keys;              /* > 0: no mask, every row attends to positions 0 .. n_keys-1 (pos0 unused) */
    int T;
    const float *q; /* [T][n_heads*head_dim] */
    float *out;     /* [T][n_heads*head_dim] */
    float *scratch; /* fm_attention_scratch_floats(fm_pool_size) floats: a block of scores per worker */
    /* The caches' layout, in elements: from one position's row to the next (0: n_kv_heads * head_dim) and
     * from one KV head to the next (0: head_dim), so [n_ctx][n_kv_heads][head_dim] by default;
     * [n_kv_heads][n_ctx] [head_dim] is row_stride = head_dim, head_stride = n_ctx * head_dim. */
    int64_t row_stride, head_stride;
} fm_attention_args;

/* Queries (row, head) one work item of fm_attention takes at most. */
#define FM_ATTN_ITEM_QUERIES 128

/* Floats of fm_attention_args.scratch for a pool of `threads` workers (a block of scores per query of an
 * item), whatever the context length. */
size_t fm_attention_scratch_floats(int threads);

/* One position's keys and values k, v [n_heads][head_dim] (f32) into f16 caches laid out
 * [n_heads][rows][head_dim] (head_stride = rows * head_dim elements), at row pos. */
void fm_attention_store_kv(uint16_t *k_cache, uint16_t *v_cache, int64_t head_stride, int pos, const float *k,
                           const float *v, int n_heads, int head_dim);

/* out = softmax(q k^T / sqrt(head_dim)) v per head, query head h reading kv head h / (n_heads/n_kv_heads). */
void fm_attention(fm_pool *pool, const fm_attention_args *a);

/* f16 -> f32 through a table (built once); fast enough for the scalar path and exact. */
float fm_f16_lookup(uint16_t h);

#endif
