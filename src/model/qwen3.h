/* qwen3.h: the Qwen3 dense target. Hyper-parameters come from the GGUF metadata (qwen3.*), weights stay in
 * the mapping in their GGUF type. One forward takes T tokens, so the same path serves a prefill chunk, a
 * single step (T = 1) and a verify block (T <= 17). The KV cache (f16, as llama.cpp's default) can be
 * rewound to any earlier position, and the residual stream after chosen layers can be captured per row. */
#ifndef FM_MODEL_QWEN3_H
#define FM_MODEL_QWEN3_H

#include <stddef.h>
#include <stdint.h>

#include "core/threadpool.h"
#include "cpu/matmul.h"
#include "io/gguf.h"

typedef struct {
    int n_layers;     /* qwen3.block_count */
    int dim;          /* qwen3.embedding_length */
    int n_heads;      /* qwen3.attention.head_count */
    int n_kv_heads;   /* qwen3.attention.head_count_kv */
    int head_dim;     /* qwen3.attention.key_length (else dim / n_heads) */
    int ffn;          /* qwen3.feed_forward_length */
    int vocab;        /* rows of token_embd.weight */
    int ctx_train;    /* qwen3.context_length */
    float rope_theta; /* qwen3.rope.freq_base */
    float rms_eps;    /* qwen3.attention.layer_norm_rms_epsilon */
    int tied;         /* 1 when output.weight is absent and the token table is the lm_head */
} qwen3_hparams;

typedef struct {
    fm_matrix wq;           /* [n_heads*head_dim][dim] */
    fm_matrix wk, wv;       /* [n_kv_heads*head_dim][dim] */
    fm_matrix wo;           /* [dim][n_heads*head_dim] */
    fm_matrix w_gate, w_up; /* [ffn][dim] */
    fm_matrix w_down;       /* [dim][ffn] */
    float *attn_norm;       /* [dim]      (f32 copies of the norm weights) */
    float *q_norm;          /* [head_dim] */
    float *k_norm;          /* [head_dim] */
    float *ffn_norm;        /* [dim] */
} qwen3_layer;

typedef struct {
    qwen3_hparams hp;
    gguf_file *gguf;
    fm_matrix tok_embd; /* [vocab][dim] */
    fm_matrix output;   /* [vocab][dim]: output.weight, or tok_embd when tied */
    float *output_norm; /* [dim] */
    qwen3_layer *layers;
    int n_repacked; /* matrices in FM_LAYOUT_Q8_VNNI4 */
} qwen3_model;

int qwen3_model_load(const char *path, qwen3_model **out, char *err, size_t errlen);
void qwen3_model_free(qwen3_model *m);
/* Bytes of weights one decode step reads (all matrices + the lm_head), for roofline figures. */
uint64_t qwen3_model_weight_bytes(const qwen3_model *m);
/* The distinct types of the model's matrices (lm_head and token table included), most bytes first, joined
 * by '+' into buf ("q8_0", "q4_k+q6_k"); and whether every matrix is of type t. */
void qwen3_model_weight_types(const qwen3_model *m, char *buf, size_t len);
int qwen3_model_all_matrices(const qwen3_model *m, fm_dtype t);
/* For CPU decoding: the weights move into anonymous huge pages (gguf_make_resident); 1 when done. Then, where
 * the CPU's Q8_0 kernel is the AVX-512 VNNI one, its Q8_0 matrices are rearranged in that copy for it
 * (fm_matrix_repack_vnni4; the products stay bit for bit the same; FLASHMAP_NO_REPACK=1 turns it off). */
int qwen3_model_make_resident(qwen3_model *m, fm_pool *pool);
/* How many matrices qwen3_model_make_resident rearranged (the tied token table counts once). */
int qwen3_model_repacked(const qwen3_model *m);

/* Per-sequence state: KV cache, scratch for up to max_batch rows, captured features. */
typedef struct qwen3_state qwen3_state;

typedef struct {
    int n_ctx;                 /* KV cache positions */
    int max_batch;             /* largest T one forward may take (prefill chunk size) */
    const int *capture_layers; /* 0-based decoder layers whose output (before the final norm) is captured */
    int n_capture;
} qwen3_state_params;

int qwen3_state_create(const qwen3_model *m, const qwen3_state_params *p, qwen3_state **out, char *err,
                       size_t errlen);
void qwen3_state_free(qwen3_state *s);
int qwen3_state_pos(const qwen3_state *s); /* tokens held in the KV cache */
int qwen3_state_n_ctx(const qwen3_state *s);
/* Drops every position >= pos (pos <= current position). */
void qwen3_state_rewind(qwen3_state *s, int pos);

typedef enum {
    QWEN3_OUT_NONE = 0,    /* fill the KV cache (and features) only */
    QWEN3_OUT_LAST_LOGITS, /* logits of the last row */
    QWEN3_OUT_ALL_LOGITS,  /* logits of every row */
    QWEN3_OUT_ALL_ARGMAX,  /* argmax of every row (ties to the lowest id) */
} qwen3_out;

/* Runs tokens[0..T) at positions pos .. pos+T-1 and advances the position by T. T <= max_batch, and the
 * cache must have room (else -1 and a clear error, the state unchanged). */
int qwen3_forward(const qwen3_model *m, qwen3_state *s, fm_pool *pool, const int32_t *tokens, int T,
                  qwen3_out out, char *err, size_t errlen);
/* Results of the last forward: logits [rows][vocab] (1 row for LAST_LOGITS, T for ALL_LOGITS), argmax [T],
 * features [T][n_capture * dim] (row t = concatenation of the captured layers' outputs at that position). */
const float *qwen3_state_logits(const qwen3_state *s);
const int32_t *qwen3_state_argmax(const qwen3_state *s);
const float *qwen3_state_features(const qwen3_state *s);
int qwen3_state_feature_width(const qwen3_state *s);

#endif
