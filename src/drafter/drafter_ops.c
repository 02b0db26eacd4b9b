/* drafter_ops.c: the drafter's small element-wise and attention ops in f32 (products go through fm_matmul).
 * Reductions accumulate in double so results do not depend on the order of summation to f32 precision.
 * Kept private to the drafter until the shared CPU ops cover AdaLN modulation and f16 cross-attention. */
#include <math.h>

#include "cpu/attention.h"
#include "drafter/drafter_internal.h"

void fmd_rmsnorm_rows(const float *x, const float *w, int T, int n, float eps, float *y) {
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * n;
        float *yr = y + (size_t)t * n;
        double ss = 0;
        for (int i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        float r = (float)(1.0 / sqrt(ss / n + eps));
        for (int i = 0; i < n; i++) yr[i] = xr[i] * (w[i] * r);
    }
}

typedef struct {
    const float *x;
    const fmd_mod *m;
    int n;
    float eps;
    float *y;
} ln_mod_job;

static void ln_mod_range(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const ln_mod_job *j = ctx;
    const int n = j->n;
    for (int64_t t = begin; t < end; t++) {
        const float *xr = j->x + (size_t)t * n;
        float *yr = j->y + (size_t)t * n;
        double s = 0, q = 0;
        for (int i = 0; i < n; i++) s += xr[i];
        double mu = s / n;
        for (int i = 0; i < n; i++) q += (xr[i] - mu) * (xr[i] - mu);
        float r = (float)(1.0 / sqrt(q / n + j->eps)), muf = (float)mu;
        for (int i = 0; i < n; i++) yr[i] = (xr[i] - muf) * r * (1.0f + j->m->scale[i]) + j->m->shift[i];
    }
}

/* A row a work item (two sequential double passes, ~5 us a 2048-wide row): the same bits however split. */
void fmd_ln_mod_rows(fm_pool *pool, const float *x, const fmd_mod *m, int T, int n, float eps, float *y) {
    ln_mod_job j = {x, m, n, eps, y};
    fm_pool_for(pool, T, 2, ln_mod_range, &j);
}

void fmd_rope_rows(const float *inv_freq, int half, int pos0, int n, float *cos_out, float *sin_out) {
    for (int t = 0; t < n; t++)
        for (int i = 0; i < half; i++) {
            float a = (float)(pos0 + t) * inv_freq[i]; /* f32 angle, as the reference computes it */
            cos_out[(size_t)t * half + i] = (float)cos((double)a);
            sin_out[(size_t)t * half + i] = (float)sin((double)a);
        }
}

typedef struct {
    float *x;
    const float *w, *cs, *sn;
    int n_heads, head_dim;
    float eps;
} head_norm_rope_job;

static void head_norm_rope_range(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const head_norm_rope_job *j = ctx;
    const int n_heads = j->n_heads, head_dim = j->head_dim, half = head_dim / 2;
    const float *w = j->w;
    for (int64_t t = begin; t < end; t++)
        for (int h = 0; h < n_heads; h++) {
            float *v = j->x + ((size_t)t * n_heads + h) * head_dim;
            const float *c = j->cs + (size_t)t * half, *s = j->sn + (size_t)t * half;
            double ss = 0;
            for (int i = 0; i < head_dim; i++) ss += (double)v[i] * v[i];
            float r = (float)(1.0 / sqrt(ss / head_dim + j->eps));
            for (int i = 0; i < half; i++) {
                float a0 = v[2 * i] * (w[2 * i] * r), a1 = v[2 * i + 1] * (w[2 * i + 1] * r);
                v[2 * i] = a0 * c[i] - a1 * s[i];
                v[2 * i + 1] = a1 * c[i] + a0 * s[i];
            }
        }
}

void fmd_head_norm_rope(fm_pool *pool, float *x, const float *w, int T, int n_heads, int head_dim, float eps,
                        const float *cs, const float *sn) {
    head_norm_rope_job j = {x, w, cs, sn, n_heads, head_dim, eps};
    fm_pool_for(pool, T, 2, head_norm_rope_range, &j);
}

void fmd_gate_add(float *x, const float *y, const float *gate, int T, int n) {
    for (int t = 0; t < T; t++)
        for (int i = 0; i < n; i++) x[(size_t)t * n + i] += gate[i] * y[(size_t)t * n + i];
}

static void gelu_range(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    float *x = ctx;
    for (int64_t i = begin; i < end; i++) x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

/* Spread over the pool: erff costs ~16 ns an element here, so the 16 x 8192 activations of a layer took
 * 2.1 ms on one core (13 ms a draft, ~18 % of it on 2 cores, with the other core idle). */
void fmd_gelu(fm_pool *pool, float *x, int64_t n) {
    fm_pool_for(pool, n, 4096, gelu_range, x);
}

void fmd_silu(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] / (1.0f + expf(-x[i]));
}

typedef struct {
    const float *q, *kf, *vf;
    int T, L, n_heads, head_dim;
    float *o;
    float *scores; /* [threads][L] */
} attn_ctx;

/* The slots' self-attention (f32 K/V, L = 16 rows): one (row, head) pair per item; each worker keeps its L
 * scores in its own slice of the scratch. */
static void attn_task(void *p, int64_t begin, int64_t end, int thread) {
    const attn_ctx *a = p;
    int D = a->n_heads * a->head_dim, hd = a->head_dim;
    float *sc = a->scores + (size_t)thread * a->L;
    float scale = 1.0f / sqrtf((float)hd);
    for (int64_t it = begin; it < end; it++) {
        int t = (int)(it / a->n_heads), h = (int)(it % a->n_heads);
        const float *q = a->q + (size_t)t * D + (size_t)h * hd;
        float mx = -INFINITY;
        for (int j = 0; j < a->L; j++) {
            size_t kb = (size_t)j * D + (size_t)h * hd;
            double s = 0;
            for (int d = 0; d < hd; d++) s += (double)q[d] * a->kf[kb + d];
            sc[j] = (float)s * scale;
            if (sc[j] > mx) mx = sc[j];
        }
        double sum = 0;
        for (int j = 0; j < a->L; j++) {
            sc[j] = expf(sc[j] - mx);
            sum += sc[j];
        }
        float *o = a->o + (size_t)t * D + (size_t)h * hd;
        for (int d = 0; d < hd; d++) o[d] = 0;
        for (int j = 0; j < a->L; j++) {
            size_t vb = (size_t)j * D + (size_t)h * hd;
            float p = sc[j];
            for (int d = 0; d < hd; d++) o[d] += p * a->vf[vb + d];
        }
        float inv = (float)(1.0 / sum);
        for (int d = 0; d < hd; d++) o[d] *= inv;
    }
}

void fmd_attention(fm_pool *pool, const float *q, int T, const float *kf, const float *vf, const uint16_t *kh,
                   const uint16_t *vh, int rows, int L, int n_heads, int head_dim, float *o, float *scores) {
    if (kh) { /* the context: as many rows as the target's cache, so its SIMD kernels */
        const fm_attention_args fa = {.n_heads = n_heads,
                                      .n_kv_heads = n_heads,
                                      .head_dim = head_dim,
                                      .k_cache = kh,
                                      .v_cache = vh,
                                      .n_keys = L,
                                      .T = T,
                                      .q = q,
                                      .out = o,
                                      .scratch = scores,
                                      .row_stride = head_dim,
                                      .head_stride = (int64_t)rows * head_dim};
        fm_attention(pool, &fa);
        return;
    }
    attn_ctx a = {q, kf, vf, T, L, n_heads, head_dim, o, scores};
    fm_pool_for(pool, (int64_t)T * n_heads, 1, attn_task, &a);
}
