/* drafter_internal.h: the drafter's weights and state, shared by drafter_load.c, drafter_forward.c and
 * drafter_ops.c. Matrices point into the safetensors mapping in their stored type (BF16 as shipped); norm
 * weights and biases are f32 copies. Not a public header. */
#ifndef FM_DRAFTER_INTERNAL_H
#define FM_DRAFTER_INTERNAL_H

#include "drafter/flashmap_drafter.h"
#include "io/safetensors.h"

typedef struct {
    fm_matrix q, k, v, o; /* [dim][dim], no biases */
    float *q_norm;        /* [head_dim] */
    float *k_norm;        /* [head_dim] */
} fmd_attn;

typedef struct {
    fmd_attn self, cross;
    fm_matrix fc1; /* [ffn][dim] */
    fm_matrix fc2; /* [dim][ffn] */
    float *fc1_b;  /* [ffn] or NULL */
    float *fc2_b;  /* [dim] or NULL */
    /* [n_heads][max_ctx][head_dim] f16: cross-attention keys (normed, rotated) and values, each head's rows
     * one contiguous stream (as the target's cache; cpu/attention.c reads it faster than rows of all heads)
     */
    uint16_t *k_cache, *v_cache;
} fmd_layer;

/* Time modulation of one adaptive LayerNorm: [scale dim | shift dim | gate dim]. */
typedef struct {
    float *scale, *shift, *gate;
} fmd_mod;

struct fm_drafter {
    fm_drafter_hparams hp;
    st_file *st;
    void *q8_data;   /* the Q8_0 copy the matrices point into after fm_drafter_quantize_q8_0, else NULL */
    size_t q8_bytes; /* its size */
    void *q8_packed; /* the draft matrices' pre-packed rows after fm_drafter_pack_q8_0, else NULL */
    size_t q8_packed_bytes;
    const qwen3_model *target;
    int max_ctx;
    int length; /* verified context rows */

    fm_matrix fc;          /* [dim][feat_width] */
    float *hidden_norm;    /* [dim] */
    fm_matrix anchor_proj; /* [dim][target_dim] */
    float *anchor_proj_b;  /* [dim] or NULL */
    float *anchor_norm;    /* [dim] */
    fm_matrix head;        /* [target_dim][dim] */
    float *head_b;         /* [target_dim] or NULL */
    fmd_layer *layers;     /* [n_layers] */

    /* Constants computed at load. */
    float *mods;         /* [(n_layers*3 + 1) * 3 * dim]: per layer self, cross, mlp; then final */
    fmd_mod *layer_mods; /* [n_layers * 3] views into mods */
    fmd_mod final_mod;
    float *slot_input; /* [dim]: x_embed(state_norm(uniform_embeds)), every slot's start */

    /* Scratch, sized for max(block, ctx_rows) rows. */
    int scratch_rows;
    float *x, *h, *q, *k, *v, *att, *y; /* [rows][dim] */
    float *u;                           /* [block][ffn] */
    float *tmp_feat;                    /* [1][target_dim] anchor embedding */
    float *head_out;                    /* [block][target_dim] */
    float *logits;                      /* [block][vocab] */
    float *rope_cos, *rope_sin;         /* [rows][head_dim/2] */
    float *inv_freq;                    /* [head_dim/2] */
    float *scores; /* attention scratch for score_threads workers (drafter_forward.c: ensure_scores) */
    int score_threads;
};

/* ---- ops (drafter_ops.c) ---- */
/* y[t] = x[t] * (w * 1/sqrt(mean(x[t]^2) + eps)) over rows of n; y may equal x. */
void fmd_rmsnorm_rows(const float *x, const float *w, int T, int n, float eps, float *y);
/* y[t] = LayerNorm(x[t]) (no affine) * (1 + scale) + shift; rows spread over the pool (NULL: the caller). */
void fmd_ln_mod_rows(fm_pool *pool, const float *x, const fmd_mod *m, int T, int n, float eps, float *y);
/* In place per row t and head: RMSNorm over head_dim with w, then RoPE on pairs (2i, 2i+1) with the row's
 * cos/sin [T][head_dim/2]; rows spread over the pool (NULL: the caller). */
void fmd_head_norm_rope(fm_pool *pool, float *x, const float *w, int T, int n_heads, int head_dim, float eps,
                        const float *cos, const float *sin);
/* cos/sin [n][head_dim/2] for positions pos0 .. pos0+n-1: angle = pos * inv_freq[i]. */
void fmd_rope_rows(const float *inv_freq, int half, int pos0, int n, float *cos, float *sin);
/* x[t][i] += gate[i] * y[t][i]. */
void fmd_gate_add(float *x, const float *y, const float *gate, int T, int n);
/* Exact GELU x * Phi(x) with erff, in place, spread over the pool (NULL: the caller). */
void fmd_gelu(fm_pool *pool, float *x, int64_t n);
void fmd_silu(float *x, int64_t n);
/* Attention without a mask: o[t][h] = softmax(q[t][h] . k[j][h] / sqrt(head_dim)) v[j][h] over j < L. K/V
 * are either f32 (kf/vf) rows of dim = n_heads * head_dim, or f16 (kh/vh) laid out [n_heads][rows][head_dim]
 * with `rows` rows a head. scores: [pool threads][L] for f32, fm_attention's scratch for f16. */
void fmd_attention(fm_pool *pool, const float *q, int T, const float *kf, const float *vf, const uint16_t *kh,
                   const uint16_t *vh, int rows, int L, int n_heads, int head_dim, float *o, float *scores);

#endif
