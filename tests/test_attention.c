/* test_attention.c: the CPU's attention over an f16 cache (cpu/attention.h) against a double-precision
 * reference, at every ISA level this CPU runs, and the invariance the engine relies on: a row's output is the
 * same bits whether it was computed alone (a step), in a block of T rows (a verify block or a prompt chunk),
 * and whatever the thread count (which changes how many queries share a work item). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/threadpool.h"
#include "cpu/attention.h"
#include "cpu/attention_kernels.h"
#include "cpu/cpu_features.h"
#include "attention_ref.h"
#include "test_util.h"

static float uniform(uint64_t *s) { /* [-1, 1) */
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) * (2.0 / 16777216.0) - 1.0);
}

/* fm_attention on `threads` workers; rows t0 .. t0+T-1 of q / out (row t at position pos0 + t). */
/* keys: rows of the caches, laid out [keys][n_kv][hd], or [n_kv][keys][hd] with per_head. */
static void run(int threads, int T, int t0, int n_heads, int n_kv, int hd, const uint16_t *k,
                const uint16_t *v, int pos0, int n_keys, const float *q, float *out, int per_head, int keys) {
    fm_pool *pool = fm_pool_create(threads);
    float *scratch = malloc(sizeof(float) * fm_attention_scratch_floats(threads));
    const int W = n_heads * hd;
    fm_attention_args a = {.n_heads = n_heads,
                           .n_kv_heads = n_kv,
                           .head_dim = hd,
                           .k_cache = k,
                           .v_cache = v,
                           .pos0 = pos0 + t0,
                           .n_keys = n_keys,
                           .T = T,
                           .q = q + (size_t)t0 * W,
                           .out = out + (size_t)t0 * W,
                           .scratch = scratch,
                           .row_stride = per_head ? hd : 0,
                           .head_stride = per_head ? (int64_t)keys * hd : 0};
    fm_attention(pool, &a);
    free(scratch);
    fm_pool_free(pool);
}

static void check(int T, int n_heads, int n_kv, int hd, int pos0, int n_keys, uint64_t seed) {
    const int W = n_heads * hd, KW = n_kv * hd, keys = n_keys > 0 ? n_keys : pos0 + T;
    uint64_t s = seed;
    float *q = malloc(sizeof(float) * (size_t)T * W), *ref = malloc(sizeof(float) * (size_t)T * W);
    float *y2 = malloc(sizeof(float) * (size_t)T * W), *y1 = malloc(sizeof(float) * (size_t)T * W);
    float *y3 = malloc(sizeof(float) * (size_t)T * W), *y4 = malloc(sizeof(float) * (size_t)T * W);
    uint16_t *k = malloc(2 * (size_t)keys * KW), *v = malloc(2 * (size_t)keys * KW);
    uint16_t *kh = malloc(2 * (size_t)keys * KW), *vh = malloc(2 * (size_t)keys * KW);
    for (size_t i = 0; i < (size_t)T * W; i++) q[i] = 2.0f * uniform(&s);
    for (size_t i = 0; i < (size_t)keys * KW; i++)
        k[i] = fm_f32_to_f16(uniform(&s)), v[i] = fm_f32_to_f16(uniform(&s));
    for (int j = 0; j < keys; j++) /* the same caches with each KV head's rows contiguous */
        for (int h = 0; h < n_kv; h++) {
            memcpy(kh + ((size_t)h * keys + j) * hd, k + (size_t)j * KW + (size_t)h * hd, 2 * (size_t)hd);
            memcpy(vh + ((size_t)h * keys + j) * hd, v + (size_t)j * KW + (size_t)h * hd, 2 * (size_t)hd);
        }
    double num = 0, den = 0;
    attention_ref(q, T, n_heads, n_kv, hd, k, v, pos0, n_keys, ref);
    for (int isa = FM_ISA_SCALAR; isa <= (int)fm_cpu_isa_best(); isa++) {
        fm_cpu_set_isa((fm_isa)isa);
        run(2, T, 0, n_heads, n_kv, hd, k, v, pos0, n_keys, q, y2, 0, keys);
        run(64, T, 0, n_heads, n_kv, hd, k, v, pos0, n_keys, q, y3, 0, keys); /* fewer queries an item */
        run(3, T, 0, n_heads, n_kv, hd, kh, vh, pos0, n_keys, q, y4, 1, keys);
        for (int t = 0; t < T; t++) /* one row at a time, one worker: every query its own item */
            run(1, 1, t, n_heads, n_kv, hd, k, v, pos0, n_keys > 0 ? n_keys : 0, q, y1, 0, keys);
        num = den = 0;
        for (size_t i = 0; i < (size_t)T * W; i++)
            num += ((double)y2[i] - ref[i]) * ((double)y2[i] - ref[i]), den += (double)ref[i] * ref[i];
        const double e = sqrt(num / den);
        CHECK_MSG(e < 1e-5, "T=%d heads %d/%d hd %d pos0 %d keys %d isa %d: rel err vs double %.2e", T,
                  n_heads, n_kv, hd, pos0, n_keys, isa, e);
        CHECK_MSG(!memcmp(y2, y3, sizeof(float) * (size_t)T * W),
                  "T=%d heads %d/%d isa %d: 2 and 64 workers give the same bits", T, n_heads, n_kv, isa);
        CHECK_MSG(!memcmp(y2, y4, sizeof(float) * (size_t)T * W),
                  "T=%d heads %d/%d isa %d: caches per KV head, 3 workers: the same bits", T, n_heads, n_kv,
                  isa);
        CHECK_MSG(!memcmp(y2, y1, sizeof(float) * (size_t)T * W),
                  "T=%d heads %d/%d isa %d: rows == 1-row launches bit for bit", T, n_heads, n_kv, isa);
    }
    fm_cpu_set_isa(fm_cpu_isa_best());
    free(q), free(ref), free(y1), free(y2), free(y3), free(y4), free(k), free(v), free(kh), free(vh);
}

/* The AVX2 softmax exponentials against exp in double: every element within 3e-7 relative (2.5 ulp) down to
 * -87 (the clamp), the sum within 1e-6, for lengths through a full vector and a partial one. */
static void check_exp_sum(void) {
    if (fm_cpu_isa_best() < FM_ISA_AVX2) return;
    uint64_t seed = 11;
    for (int n = 1; n <= 41; n += 4) {
        float s[48], mx = -INFINITY;
        for (int j = 0; j < n; j++) {
            s[j] = j == 0 ? 3.5f : 3.5f - 45.0f * (uniform(&seed) + 1.0f); /* differences 0 .. -90 */
            if (s[j] > mx) mx = s[j];
        }
        double ref[48], rsum = 0, worst = 0;
        for (int j = 0; j < n; j++) rsum += ref[j] = exp((double)s[j] - (double)mx);
        const float sum = fm_attn_exp_sum_avx2(s, n, mx);
        for (int j = 0; j < n; j++)
            if (isfinite(s[j]) && ref[j] > 1e-37) {
                const double e = fabs(s[j] - ref[j]) / ref[j];
                if (e > worst) worst = e;
            }
        CHECK_MSG(worst < 3e-7 && fabs(sum - rsum) / rsum < 1e-6,
                  "exp_sum avx2 n=%d: worst element rel err %.2e (tol 3e-7), sum rel err %.2e (tol 1e-6)", n,
                  worst, fabs(sum - rsum) / rsum);
    }
}

int main(void) {
    check_exp_sum();
    check(1, 32, 8, 128, 700, 0, 1);  /* a Qwen3-4B step: 4 queries of a KV head share an item */
    check(17, 32, 8, 128, 60, 0, 2);  /* a verify block: items of 16 queries, rows of different lengths */
    check(9, 4, 2, 32, 5, 0, 3);      /* the test models' heads */
    check(40, 8, 8, 64, 130, 0, 4);   /* no grouping, more rows than an item holds */
    check(16, 16, 16, 64, 0, 300, 5); /* the drafter's cross-attention: no mask, all rows of one head share */
    check(1, 32, 8, 128, 2100, 0, 6); /* a step over 33 key blocks, the last one partial */
    check(17, 32, 8, 128, 1010, 0, 7); /* a verify block whose rows end in two different key blocks */
    check(64, 32, 8, 128, 300, 0, 8);  /* a prompt chunk: items of 128 queries, 16 rows of a KV head */
    return fm_test_report("test_attention");
}
