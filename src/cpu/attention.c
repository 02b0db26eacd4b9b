/* attention.c: GQA attention (causal, or over all n_keys rows). A work item takes up to FM_ATTN_ITEM_QUERIES
 * (row, head) queries of one KV head and runs them over the keys block by block, so each key and value row
 * is read once per item; each query's scores live in the worker's scratch; softmax is max-subtracted in
 * f32. */
#include "cpu/attention.h"

#include <math.h>
#include <pthread.h>

#include "core/dtype.h"
#include "cpu/attention_kernels.h"
#include "cpu/cpu_features.h"

static float f16_table[1 << 16];
static pthread_once_t f16_once = PTHREAD_ONCE_INIT;

static void f16_table_init(void) {
    for (uint32_t i = 0; i < (1u << 16); i++) f16_table[i] = fm_f16_to_f32((uint16_t)i);
}

float fm_f16_lookup(uint16_t h) {
    return f16_table[h];
}

/* Scalar reference loops (the f16 table is exact). */
static float dot_f16_scalar(const float *q, const uint16_t *k, int n) {
    float s = 0;
    for (int d = 0; d < n; d++) s += q[d] * f16_table[k[d]];
    return s;
}

static void axpy_f16_scalar(float *o, float p, const uint16_t *v, int n) {
    for (int d = 0; d < n; d++) o[d] += p * f16_table[v[d]];
}

typedef struct {
    const fm_attention_args *a;
    fm_attn_dot_fn dot;
    fm_attn_axpy_fn axpy;
    int qpi; /* queries (row, head) of one KV head per work item */
} attention_job;

/* Keys of a block: its K (or V) rows of one KV head, 64 x head_dim f16, stay in L1 while every query of the
 * item uses them. */
enum { KEY_BLOCK = 64 };

/* One item: queries q0 .. q1-1 of KV head kvh, query i = row i / G, head kvh * G + i % G. Each query gets
 * the same operations in the same order as on its own (scores in key order, the max, exp and sum in key
 * order, then o += p v in key order): only the loops are interchanged, so its bits never depend on which
 * queries share its item, on T or on the thread count. */
static void attention_item(const attention_job *job, int kvh, int q0, int q1, float *sc0, int64_t stride) {
    const fm_attention_args *a = job->a;
    const int hd = a->head_dim, kv_dim = a->n_kv_heads * hd, q_dim = a->n_heads * hd;
    const int G = a->n_heads / a->n_kv_heads;
    const float scale = 1.0f / sqrtf((float)hd);
    const uint16_t *kb = a->k_cache + (int64_t)kvh * hd, *vb = a->v_cache + (int64_t)kvh * hd;
    int len[FM_ATTN_ITEM_QUERIES], nmax = 0;
    float inv[FM_ATTN_ITEM_QUERIES];
    for (int i = q0; i < q1; i++) { /* causal: row t attends to keys 0 .. pos0+t */
        len[i - q0] = a->n_keys > 0 ? a->n_keys : a->pos0 + i / G + 1;
        if (len[i - q0] > nmax) nmax = len[i - q0];
    }
    for (int j0 = 0; j0 < nmax; j0 += KEY_BLOCK)
        for (int i = q0; i < q1; i++) {
            const float *q = a->q + (int64_t)(i / G) * q_dim + (int64_t)(kvh * G + i % G) * hd;
            float *sc = sc0 + (i - q0) * stride;
            const int j1 = j0 + KEY_BLOCK < len[i - q0] ? j0 + KEY_BLOCK : len[i - q0];
            for (int j = j0; j < j1; j++) sc[j] = job->dot(q, kb + (int64_t)j * kv_dim, hd) * scale;
        }
    for (int i = q0; i < q1; i++) {
        float *sc = sc0 + (i - q0) * stride, mx = -INFINITY, sum = 0;
        const int n = len[i - q0];
        for (int j = 0; j < n; j++)
            if (sc[j] > mx) mx = sc[j];
        for (int j = 0; j < n; j++) {
            sc[j] = expf(sc[j] - mx);
            sum += sc[j];
        }
        inv[i - q0] = 1.0f / sum;
        float *o = a->out + (int64_t)(i / G) * q_dim + (int64_t)(kvh * G + i % G) * hd;
        for (int d = 0; d < hd; d++) o[d] = 0;
    }
    for (int j0 = 0; j0 < nmax; j0 += KEY_BLOCK)
        for (int i = q0; i < q1; i++) {
            const float *sc = sc0 + (i - q0) * stride;
            float *o = a->out + (int64_t)(i / G) * q_dim + (int64_t)(kvh * G + i % G) * hd;
            const int j1 = j0 + KEY_BLOCK < len[i - q0] ? j0 + KEY_BLOCK : len[i - q0];
            for (int j = j0; j < j1; j++) job->axpy(o, sc[j] * inv[i - q0], vb + (int64_t)j * kv_dim, hd);
        }
}

static void attention_items(void *ctx, int64_t begin, int64_t end, int thread) {
    const attention_job *job = ctx;
    const fm_attention_args *a = job->a;
    const int nq = a->T * (a->n_heads / a->n_kv_heads), chunks = (nq + job->qpi - 1) / job->qpi;
    const int64_t stride = a->n_keys > 0 ? a->n_keys : a->pos0 + a->T;
    float *sc0 = a->scratch + (int64_t)thread * FM_ATTN_ITEM_QUERIES * stride;
    for (int64_t item = begin; item < end; item++) {
        const int kvh = (int)(item / chunks), q0 = (int)(item % chunks) * job->qpi;
        attention_item(job, kvh, q0, q0 + job->qpi < nq ? q0 + job->qpi : nq, sc0, stride);
    }
}

void fm_attention(fm_pool *pool, const fm_attention_args *a) {
    pthread_once(&f16_once, f16_table_init);
    const int fast = fm_cpu_isa() >= FM_ISA_AVX2;
    /* As many queries per item as keep every thread busy: a KV head's keys are then read once per item
     * instead of once per query (4x less cache traffic for a Qwen3-4B step, 16x for the drafter's slots). */
    const int nq = a->T * (a->n_heads / a->n_kv_heads), threads = fm_pool_size(pool);
    int qpi = nq * a->n_kv_heads / (threads > 0 ? threads : 1);
    qpi = qpi < 1 ? 1 : qpi > FM_ATTN_ITEM_QUERIES ? FM_ATTN_ITEM_QUERIES : qpi > nq ? nq : qpi;
    attention_job job = {a, fast ? fm_attn_dot_f16_avx2 : dot_f16_scalar,
                         fast ? fm_attn_axpy_f16_avx2 : axpy_f16_scalar, qpi};
    fm_pool_for(pool, (int64_t)a->n_kv_heads * ((nq + qpi - 1) / qpi), 1, attention_items, &job);
}
