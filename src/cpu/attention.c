/* attention.c: GQA attention (causal, or over all n_keys rows), one (row, head) pair per work item. Scores
 * for one pair live in the worker's scratch row; softmax is max-subtracted in f32. */
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
} attention_job;

static void attention_items(void *ctx, int64_t begin, int64_t end, int thread) {
    const attention_job *job = ctx;
    const fm_attention_args *a = job->a;
    const int hd = a->head_dim, kv_dim = a->n_kv_heads * hd, q_dim = a->n_heads * hd;
    const int group = a->n_heads / a->n_kv_heads;
    const float scale = 1.0f / sqrtf((float)hd);
    float *sc = a->scratch + (int64_t)thread * (a->n_keys > 0 ? a->n_keys : a->pos0 + a->T);
    for (int64_t item = begin; item < end; item++) {
        const int t = (int)(item / a->n_heads), h = (int)(item % a->n_heads), kvh = h / group;
        const float *q = a->q + (int64_t)t * q_dim + (int64_t)h * hd;
        const int n = a->n_keys > 0 ? a->n_keys : a->pos0 + t + 1; /* causal: keys 0 .. pos0+t */
        float mx = -INFINITY;
        for (int j = 0; j < n; j++) {
            const float s = job->dot(q, a->k_cache + (int64_t)j * kv_dim + (int64_t)kvh * hd, hd) * scale;
            sc[j] = s;
            if (s > mx) mx = s;
        }
        float sum = 0;
        for (int j = 0; j < n; j++) {
            sc[j] = expf(sc[j] - mx);
            sum += sc[j];
        }
        const float inv = 1.0f / sum;
        float *o = a->out + (int64_t)t * q_dim + (int64_t)h * hd;
        for (int d = 0; d < hd; d++) o[d] = 0;
        for (int j = 0; j < n; j++) {
            job->axpy(o, sc[j] * inv, a->v_cache + (int64_t)j * kv_dim + (int64_t)kvh * hd, hd);
        }
    }
}

void fm_attention(fm_pool *pool, const fm_attention_args *a) {
    pthread_once(&f16_once, f16_table_init);
    const int fast = fm_cpu_isa() >= FM_ISA_AVX2;
    attention_job job = {a, fast ? fm_attn_dot_f16_avx2 : dot_f16_scalar,
                         fast ? fm_attn_axpy_f16_avx2 : axpy_f16_scalar};
    fm_pool_for(pool, (int64_t)a->T * a->n_heads, 1, attention_items, &job);
}
