/* attention.h: causal grouped-query attention over an f16 KV cache, for T query rows at once (a prefill
 * chunk, a step, or a verify block), on the CPU. */
#ifndef FM_CPU_ATTENTION_H
#define FM_CPU_ATTENTION_H

#include <stdint.h>

#include "core/threadpool.h"

typedef struct {
    int n_heads, n_kv_heads, head_dim;
    const uint16_t *k_cache; /* [n_ctx][n_kv_heads*head_dim] f16, positions 0 .. pos0+T-1 filled */
    const uint16_t *v_cache; /* same layout */
    int pos0;                /* position of query row 0; row t attends to positions 0 .. pos0+t */
    int T;
    const float *q; /* [T][n_heads*head_dim] */
    float *out;     /* [T][n_heads*head_dim] */
    float *scratch; /* [fm_pool_size][pos0+T] scores per worker */
} fm_attention_args;

/* out = softmax(q k^T / sqrt(head_dim)) v per head, query head h reading kv head h / (n_heads/n_kv_heads). */
void fm_attention_causal(fm_pool *pool, const fm_attention_args *a);

/* f16 -> f32 through a table (built once); fast enough for the scalar path and exact. */
float fm_f16_lookup(uint16_t h);

#endif
