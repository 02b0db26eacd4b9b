/* test_matmul.c: every weight type x every ISA level this CPU runs, against the scalar reference; the
 * scalar reference against an independent double-precision product; Q8_0 activation quantisation against a
 * plain reimplementation of ggml's quantize_row_q8_0_ref (bytes must match), edge cases included;
 * fm_matrix_row_f32 and fm_matrix_check; batch independence (every token's row of a T-token product equals,
 * bit for bit, the single-token product, for every T in 1..40, at every ISA level, with and without the pool:
 * speculative decoding is lossless only because of it); the K-quant kernels equal the scalar ones bit for
 * bit at every level; fm_matmul_multi against separate fm_matmul calls;
 * the AVX2 kernel's pre-packed rows (layout, and results bit for bit those of the unpacked matrix); the
 * in-place VNNI layout (the same, at every level).
 *
 * Tolerances. All kernels accumulate in f32; they differ from the reference only in summation order (SIMD
 * lanes, tiles), and for Q8_0 the int8 products are exact in both, so the difference is bounded by
 * ~n * 2^-24 * sum_k |w_k x_k| (Higham's bound for recursive summation, n terms; a SIMD tree has a smaller
 * bound). With n <= 1100 terms (cols, or blocks for Q8_0) that is <= 6.6e-5, so we allow
 * 1e-4 * sum|w x| + 1e-6. A wrong or missing term is caught: one term is on average sum|w x| / cols ~ 1e-3
 * of it. The AVX512-BF16 kernel carries x as bf16 hi+lo (~2^-17 relative per term), inside the same bound. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/threadpool.h"
#include "cpu/cpu_features.h"
#include "cpu/matmul.h"
#include "cpu/matmul_kernels.h"
#include "cpu/quant_k.h"
#include "test_util.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rng_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}
static float rng_uniform(void) {
    return (float)(rng_u32() & 0xffffff) / 8388608.0f - 1.0f;
} /* [-1, 1) */

/* ggml's quantize_row_q8_0_ref as its source reads, written out independently of the library. */
static void ggml_style_q8_0(const float *x, fm_block_q8_0 *y, int64_t k) {
    for (int64_t i = 0; i < k / 32; i++) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) {
            const float v = x[i * 32 + j];
            amax = amax > fabsf(v) ? amax : fabsf(v);
        }
        const float d = amax / ((1 << 7) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = fm_f32_to_f16(d);
        for (int j = 0; j < 32; ++j) y[i].qs[j] = (int8_t)roundf(x[i * 32 + j] * id);
    }
}

/* Random K-quant blocks: every byte of the quants and packed scales random (all 6-bit scales and mins, all
 * q values, Q6_K's int8 scales -128 included), the f16 super-block scales small and positive. */
static void make_k_blocks(fm_dtype dt, char *row, int64_t nb) {
    const size_t bb = (size_t)fm_dtype_block_bytes(dt);
    for (size_t i = 0; i < (size_t)nb * bb; i++) row[i] = (char)(rng_u32() & 0xff);
    for (int64_t b = 0; b < nb; b++) {
        char *blk = row + (size_t)b * bb;
        const uint16_t d = fm_f32_to_f16(0.0005f + 0.001f * (rng_uniform() + 1.0f)),
                       dmin = fm_f32_to_f16(0.0005f + 0.002f * (rng_uniform() + 1.0f));
        if (dt == FM_DTYPE_Q6_K) {
            memcpy(blk + offsetof(fm_block_q6_K, d), &d, 2);
        } else { /* Q4_K and Q5_K start with d, dmin */
            memcpy(blk, &d, 2);
            memcpy(blk + 2, &dmin, 2);
        }
    }
}

/* Random weights of a type; Q8_0 blocks get random scales and int8 values including -128 (legal in GGUF). */
static void *make_weights(fm_dtype dt, int64_t rows, int64_t cols) {
    size_t rb = fm_dtype_row_bytes(dt, cols);
    char *data = malloc(rb * (size_t)rows);
    for (int64_t r = 0; r < rows; r++) {
        char *row = data + (size_t)r * rb;
        for (int64_t k = 0; k < cols; k++) {
            float v = rng_uniform();
            if (dt == FM_DTYPE_F32) ((float *)row)[k] = v;
            if (dt == FM_DTYPE_F16) ((uint16_t *)row)[k] = fm_f32_to_f16(v);
            if (dt == FM_DTYPE_BF16) ((uint16_t *)row)[k] = fm_f32_to_bf16(v);
        }
        if (fm_dtype_is_k_quant(dt)) make_k_blocks(dt, row, cols / FM_QK_K);
        if (fm_dtype_is_legacy_quant(dt)) { /* Q4_0 / Q5_0: every quant and fifth bit random, d small */
            const size_t bb = (size_t)fm_dtype_block_bytes(dt);
            for (size_t i = 0; i < rb; i++) row[i] = (char)(rng_u32() & 0xff);
            for (int64_t b = 0; b < cols / 32; b++) {
                const uint16_t d = fm_f32_to_f16(0.002f + 0.04f * (rng_uniform() + 1.0f));
                memcpy(row + (size_t)b * bb, &d, 2);
            }
        }
        if (dt == FM_DTYPE_Q8_0)
            for (int64_t b = 0; b < cols / 32; b++) {
                fm_block_q8_0 *blk = (fm_block_q8_0 *)row + b;
                blk->d = fm_f32_to_f16(0.001f + 0.02f * (rng_uniform() + 1.0f));
                for (int j = 0; j < 32; j++) blk->qs[j] = (int8_t)(rng_u32() % 256 - 128);
            }
    }
    return data;
}

/* sum_k |w_k x_k| per (t, r): the scale of the tolerance. */
static double magnitude(const fm_matrix *w, const float *wrow, const float *xt) {
    double m = 0;
    for (int64_t k = 0; k < w->cols; k++) m += fabs((double)wrow[k] * xt[k]);
    return m;
}

static const int k_tokens[] = {1, 2, 3, 7, 8, 16, 17, 33};
#define N_TOKENS ((int)(sizeof k_tokens / sizeof *k_tokens))

/* The kernel variants under test: every ISA level this CPU runs (AMX off), then the AVX-512 level once more
 * with the AMX Q8_0 kernel where the CPU has it (the Q8_0 batches of matmul.c's amx_batch then take it). */
static int g_amx_default;
static int n_variants(void) {
    const int amx = fm_cpu_isa_best() == FM_ISA_AVX512 && fm_cpu_features_get()->amx_int8 && fm_mm_have_amx();
    return (int)fm_cpu_isa_best() + 1 + amx;
}
static const char *set_variant(int v) {
    const fm_isa best = fm_cpu_isa_best();
    const int amx = v > (int)best;
    CHECK(fm_cpu_set_isa(amx ? best : (fm_isa)v) == 0);
    CHECK(fm_cpu_set_amx(amx) == 0);
    return amx ? "avx512+amx" : fm_isa_name((fm_isa)v);
}
static void reset_variant(void) {
    fm_cpu_set_isa(fm_cpu_isa_best());
    fm_cpu_set_amx(g_amx_default);
}

static void test_type(fm_dtype dt, int64_t rows, int64_t cols, fm_pool *pool) {
    fm_matrix w = {dt, rows, cols, make_weights(dt, rows, cols), NULL, FM_LAYOUT_ROWS};
    const int Tmax = 33;
    float *x = malloc(sizeof(float) * (size_t)(Tmax * cols));
    float *bias = malloc(sizeof(float) * (size_t)rows);
    float *yref = malloc(sizeof(float) * (size_t)(Tmax * rows)),
          *y = malloc(sizeof(float) * (size_t)(Tmax * rows));
    float *wf = malloc(sizeof(float) * (size_t)(rows * cols));
    for (int64_t i = 0; i < Tmax * cols; i++) x[i] = rng_uniform() * 2.0f;
    for (int64_t r = 0; r < rows; r++) bias[r] = rng_uniform();
    for (int64_t r = 0; r < rows; r++) fm_matrix_row_f32(&w, r, wf + r * cols);
    /* For Q8_0 the exact product uses x as quantised then dequantised (what the kernels multiply). */
    float *xe = malloc(sizeof(float) * (size_t)(Tmax * cols));
    memcpy(xe, x, sizeof(float) * (size_t)(Tmax * cols));
    if (dt == FM_DTYPE_Q8_0 || fm_dtype_is_legacy_quant(dt)) { /* Q4_0 / Q5_0 read Q8_0 activations too */
        fm_block_q8_0 *q = malloc(sizeof *q * (size_t)(Tmax * cols / 32));
        ggml_style_q8_0(x, q, Tmax * cols);
        fm_matrix xm = {FM_DTYPE_Q8_0, Tmax, cols, q, NULL, FM_LAYOUT_ROWS};
        for (int t = 0; t < Tmax; t++) fm_matrix_row_f32(&xm, t, xe + t * cols);
        free(q);
    }
    if (fm_dtype_is_k_quant(dt)) { /* likewise Q8_K: d * q */
        fm_block_q8_K *q = malloc(sizeof *q * (size_t)(Tmax * cols / FM_QK_K));
        fm_quant_q8_K_ref(x, q, Tmax * cols);
        for (int64_t i = 0; i < Tmax * cols; i++) xe[i] = q[i / FM_QK_K].d * q[i / FM_QK_K].qs[i % FM_QK_K];
        free(q);
    }
    for (int ti = 0; ti < N_TOKENS; ti++) {
        const int T = k_tokens[ti];
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            const float *bp = with_bias ? bias : NULL;
            fm_matmul_reference(&w, x, T, yref, bp);
            /* Reference vs double precision. */
            int bad = 0;
            double worst = 0;
            for (int t = 0; t < T; t++)
                for (int64_t r = 0; r < rows; r++) {
                    double e = bp ? bp[r] : 0.0;
                    for (int64_t k = 0; k < cols; k++) e += (double)wf[r * cols + k] * xe[t * cols + k];
                    double tol = 1e-4 * magnitude(&w, wf + r * cols, xe + t * cols) + 1e-6;
                    double err = fabs(yref[t * rows + r] - e);
                    if (err > tol) bad++;
                    if (err / tol > worst) worst = err / tol;
                }
            CHECK_MSG(bad == 0,
                      "%s %lldx%lld T=%d bias=%d: reference off the double product in %d outputs "
                      "(worst err/tol %.2f)",
                      fm_dtype_name(dt), (long long)rows, (long long)cols, T, with_bias, bad, worst);
            for (int v = 0; v < n_variants(); v++) {
                const char *vname = set_variant(v);
                for (int use_pool = 0; use_pool < 2; use_pool++) {
                    for (int64_t i = 0; i < T * rows; i++) y[i] = NAN;
                    fm_matmul(use_pool ? pool : NULL, &w, x, T, y, bp);
                    bad = 0;
                    worst = 0;
                    for (int t = 0; t < T; t++)
                        for (int64_t r = 0; r < rows; r++) {
                            double tol = 1e-4 * magnitude(&w, wf + r * cols, xe + t * cols) + 1e-6;
                            double err = fabs((double)y[t * rows + r] - yref[t * rows + r]);
                            if (!(err <= tol)) bad++;
                            if (err / tol > worst) worst = err / tol;
                        }
                    CHECK_MSG(bad == 0,
                              "%s %s %lldx%lld T=%d bias=%d pool=%d: %d outputs off (worst err/tol %.2f)",
                              fm_dtype_name(dt), vname, (long long)rows, (long long)cols, T, with_bias,
                              use_pool, bad, worst);
                }
            }
            reset_variant();
        }
    }
    free((void *)w.data);
    free(x);
    free(xe);
    free(bias);
    free(yref);
    free(y);
    free(wf);
}

static void check_quant_same(const float *x, int64_t n, const char *what) {
    fm_block_q8_0 *a = calloc((size_t)n / 32, sizeof *a), *b = calloc((size_t)n / 32, sizeof *b);
    ggml_style_q8_0(x, a, n);
    fm_quantize_row_q8_0_reference(x, b, n);
    CHECK_MSG(memcmp(a, b, sizeof *a * (size_t)(n / 32)) == 0, "%s: reference quantiser differs from ggml's",
              what);
    const fm_isa best = fm_cpu_isa_best();
    for (int lvl = FM_ISA_SCALAR; lvl <= (int)best; lvl++) {
        fm_cpu_set_isa((fm_isa)lvl);
        memset(b, 0x55, sizeof *b * (size_t)(n / 32));
        fm_quantize_row_q8_0(x, b, n);
        CHECK_MSG(memcmp(a, b, sizeof *a * (size_t)(n / 32)) == 0, "%s: %s quantiser differs from ggml's",
                  what, fm_isa_name((fm_isa)lvl));
    }
    fm_cpu_set_isa(best);
    free(a);
    free(b);
}

static void test_quantise(void) {
    float x[32 * 8];
    memset(x, 0, sizeof x);
    check_quant_same(x, 32, "all zeros");
    fm_block_q8_0 q;
    fm_quantize_row_q8_0(x, &q, 32);
    CHECK(q.d == 0);
    int zeros = 1;
    for (int j = 0; j < 32; j++) zeros &= q.qs[j] == 0;
    CHECK(zeros);

    for (int j = 0; j < 32; j++) x[j] = 0.001f * (float)(j - 16);
    x[7] = 1e4f; /* one huge value: everything else rounds to 0 */
    check_quant_same(x, 32, "one huge value");
    fm_quantize_row_q8_0(x, &q, 32);
    CHECK(q.qs[7] == 127 && q.qs[0] == 0);
    x[7] = 1e30f; /* d overflows f16 to inf, as in ggml */
    check_quant_same(x, 32, "d beyond f16 range");

    for (int j = 0; j < 32; j++) x[j] = 0.5f * (float)(j % 5);
    x[3] = -9.0f; /* negative max: q = -127 there */
    check_quant_same(x, 32, "negative max");
    fm_quantize_row_q8_0(x, &q, 32);
    CHECK(q.qs[3] == -127);

    /* Ties: amax = 127 makes id = 1 exactly, so x = k + 0.5 must round away from zero (roundf), not to even.
     */
    for (int j = 0; j < 32; j++) x[j] = (float)(j - 16) + 0.5f;
    x[0] = 127.0f;
    check_quant_same(x, 32, "ties");
    fm_quantize_row_q8_0(x, &q, 32);
    CHECK(q.qs[1] == -15 && q.qs[2] == -14 && q.qs[17] == 2 && q.qs[18] == 3); /* -14.5, -13.5, 1.5, 2.5 */

    for (int j = 0; j < 32 * 8; j++) x[j] = rng_uniform() * (float)(1 << (j % 12));
    check_quant_same(x, 32 * 8, "random");
    for (int j = 0; j < 32 * 8; j++) x[j] = rng_uniform() * 1e-6f;
    check_quant_same(x, 32 * 8, "tiny (f16 subnormal scales)");
}

/* The AVX2 Q8_K quantiser (every SIMD level's) gives fm_quant_q8_K_ref's bytes: random blocks of many
 * magnitudes, and the cases where rounding, the sign of the max, ties between +m and -m, subnormal and huge
 * values, infinities and NaNs decide the bytes. */
static void check_quant_k_same(const float *x, const char *what) {
    fm_block_q8_K a, b;
    memset(&a, 0x11, sizeof a);
    memset(&b, 0x22, sizeof b);
    fm_quant_q8_K_ref(x, &a, FM_QK_K);
    fm_quant_q8_K_avx2(x, &b, FM_QK_K);
    CHECK_MSG(memcmp(&a, &b, sizeof a) == 0, "Q8_K quantiser, %s: AVX2 bytes differ from the reference",
              what);
}

static void test_quantise_k(void) {
    if (fm_cpu_isa_best() < FM_ISA_AVX2) {
        printf("test_matmul: skipping the AVX2 Q8_K quantiser: no AVX2\n");
        return;
    }
    float x[FM_QK_K];
    for (int rep = 0; rep < 200; rep++) {
        const float scale = ldexpf(1.0f, rep % 60 - 30);
        for (int j = 0; j < FM_QK_K; j++) x[j] = rng_uniform() * scale;
        check_quant_k_same(x, "random");
    }
    memset(x, 0, sizeof x);
    check_quant_k_same(x, "zeros");
    x[100] = -0.0f;
    check_quant_k_same(x, "zeros and -0");
    for (int j = 0; j < FM_QK_K; j++) x[j] = (float)(j % 37) - 18.0f;
    x[5] = -127.0f; /* iscale = 1: x = k + 0.5 below are ties, to even */
    for (int j = 10; j < 40; j++) x[j] = (float)(j - 25) + 0.5f;
    check_quant_k_same(x, "ties");
    x[200] = 127.0f; /* +127 after -127: the first one is the max */
    check_quant_k_same(x, "equal magnitudes");
    x[5] = 3.0f;
    check_quant_k_same(x, "positive max");
    for (int j = 0; j < FM_QK_K; j++) x[j] = rng_uniform() * 1e-40f; /* subnormal: iscale overflows */
    check_quant_k_same(x, "subnormal");
    for (int j = 0; j < FM_QK_K; j++) x[j] = rng_uniform() * 3e38f;
    check_quant_k_same(x, "huge");
    x[17] = INFINITY;
    check_quant_k_same(x, "infinity");
    for (int j = 0; j < FM_QK_K; j++) x[j] = rng_uniform();
    x[3] = NAN;
    x[250] = -NAN;
    check_quant_k_same(x, "NaN");
    for (int j = 0; j < FM_QK_K; j++) x[j] = NAN;
    check_quant_k_same(x, "all NaN");
}

static void test_row_and_check(void) {
    char err[FM_ERROR_LEN];
    fm_block_q8_0 blk[2];
    for (int b = 0; b < 2; b++) {
        blk[b].d = fm_f32_to_f16(0.5f * (float)(b + 1));
        for (int j = 0; j < 32; j++) blk[b].qs[j] = (int8_t)(j - 16 + b);
    }
    fm_matrix m = {FM_DTYPE_Q8_0, 1, 64, blk, NULL, FM_LAYOUT_ROWS};
    float out[64];
    fm_matrix_row_f32(&m, 0, out);
    CHECK_NEAR(out[0], 0.5f * -16.0f, 0);
    CHECK_NEAR(out[63], 1.0f * 16.0f, 0);
    uint16_t h[6] = {fm_f32_to_f16(1.5f),  fm_f32_to_f16(-2.0f),  fm_f32_to_f16(0.25f),
                     fm_f32_to_bf16(1.5f), fm_f32_to_bf16(-2.0f), fm_f32_to_bf16(3.0f)};
    fm_matrix mh = {FM_DTYPE_F16, 2, 3, h, NULL, FM_LAYOUT_ROWS};
    fm_matrix_row_f32(&mh, 0, out);
    CHECK(out[0] == 1.5f && out[1] == -2.0f && out[2] == 0.25f);
    fm_matrix mb = {FM_DTYPE_BF16, 2, 3, h, NULL, FM_LAYOUT_ROWS};
    fm_matrix_row_f32(&mb, 1, out);
    CHECK(out[0] == 1.5f && out[1] == -2.0f && out[2] == 3.0f);
    float f[4] = {1, 2, 3, 4};
    fm_matrix mf = {FM_DTYPE_F32, 2, 2, f, NULL, FM_LAYOUT_ROWS};
    fm_matrix_row_f32(&mf, 1, out);
    CHECK(out[0] == 3 && out[1] == 4);

    /* Q4_0 / Q5_0 by hand: weight j < 16 in the low nibble of qs[j], j + 16 in its high nibble; Q5_0's fifth
     * bit of weight j is bit j of qh read little-endian. */
    fm_block_q4_0 b4 = {fm_f32_to_f16(0.5f), {0}};
    b4.qs[0] = 0xF0;  /* weight 0: 0 - 8, weight 16: 15 - 8 */
    b4.qs[15] = 0x39; /* weight 15: 9 - 8, weight 31: 3 - 8 */
    fm_matrix m4 = {FM_DTYPE_Q4_0, 1, 32, &b4, NULL, FM_LAYOUT_ROWS};
    fm_matrix_row_f32(&m4, 0, out);
    CHECK(out[0] == -4.0f && out[16] == 3.5f && out[15] == 0.5f && out[31] == -2.5f && out[1] == -4.0f);
    fm_block_q5_0 b5 = {fm_f32_to_f16(0.25f), {0x01, 0, 0, 0x80}, {0}};
    b5.qs[0] = 0xF0;  /* weight 0: 16 + 0 - 16, weight 16: 15 - 16 */
    b5.qs[15] = 0x3F; /* weight 15: 15 - 16, weight 31: 16 + 3 - 16 */
    fm_matrix m5 = {FM_DTYPE_Q5_0, 1, 32, &b5, NULL, FM_LAYOUT_ROWS};
    fm_matrix_row_f32(&m5, 0, out);
    CHECK(out[0] == 0.0f && out[16] == -0.25f && out[15] == -0.25f && out[31] == 0.75f && out[1] == -4.0f);
    CHECK(fm_dtype_row_bytes(FM_DTYPE_Q4_0, 64) == 36 && fm_dtype_row_bytes(FM_DTYPE_Q5_0, 64) == 44);
    CHECK(fm_dtype_to_ggml(FM_DTYPE_Q4_0) == 2 && fm_dtype_to_ggml(FM_DTYPE_Q5_0) == 6);
    fm_dtype pt;
    CHECK(fm_dtype_parse("Q4_0", &pt) == 0 && pt == FM_DTYPE_Q4_0);
    CHECK(fm_dtype_parse("q5_0", &pt) == 0 && pt == FM_DTYPE_Q5_0);

    CHECK(fm_matrix_check(&m, err, sizeof err) == 0);
    fm_matrix bad = {FM_DTYPE_Q8_0, 4, 48, blk, NULL, FM_LAYOUT_ROWS};
    CHECK(fm_matrix_check(&bad, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "multiple of 32") != NULL, "message: %s", err);
    bad = (fm_matrix){FM_DTYPE_F32, 0, 4, f, NULL, FM_LAYOUT_ROWS};
    CHECK(fm_matrix_check(&bad, err, sizeof err) == -1);
    bad = (fm_matrix){FM_DTYPE_F32, 2, 2, NULL, NULL, FM_LAYOUT_ROWS};
    CHECK(fm_matrix_check(&bad, err, sizeof err) == -1);
}

static void test_isa_levels(void) {
    const fm_isa best = fm_cpu_isa_best();
    CHECK(fm_cpu_isa() == best);
    for (int lvl = FM_ISA_SCALAR; lvl <= FM_ISA_AVX512; lvl++) {
        int rc = fm_cpu_set_isa((fm_isa)lvl);
        CHECK(rc == (lvl <= (int)best ? 0 : -1));
        if (rc != 0)
            printf("test_matmul: skipping ISA level %s: this CPU lacks it\n", fm_isa_name((fm_isa)lvl));
    }
    fm_cpu_set_isa(best);
    const fm_cpu_features *f = fm_cpu_features_get();
    printf("test_matmul: best level %s (avx2 %d fma %d f16c %d avx512f %d bw %d vl %d dq %d vnni %d bf16 %d "
           "avx-vnni %d)\n",
           fm_isa_name(best), f->avx2, f->fma, f->f16c, f->avx512f, f->avx512bw, f->avx512vl, f->avx512dq,
           f->avx512vnni, f->avx512bf16, f->avxvnni);
    if (n_variants() > (int)best + 1)
        printf(
            "test_matmul: AMX-INT8 granted: the AVX-512 level is tested again with the AMX Q8_0 kernel%s\n",
            g_amx_default ? "" : " (FLASHMAP_NO_AMX is set: off outside the tests)");
    else
        printf("test_matmul: skipping the AMX Q8_0 kernel: %s\n",
               !f->amx_int8 ? "this CPU (or OS) lacks AMX-INT8" : "this build has no AMX kernel");
}

/* Rows of a T-token call must equal single-token calls bit for bit, wherever the token falls in the kernel's
 * tiles and chunks. Shapes cover a partial last group of blocks (cols 1056 = 33 blocks), odd row counts
 * (2-row tiles), several row chunks per worker, a prefetch that reaches the matrix end, and rows long enough
 * (cols 9728) that a batch's activations are split into many column segments (AVX-512 row-pair path). */
static void test_batch_independence(fm_dtype dt, int64_t rows, int64_t cols, fm_pool *pool) {
    enum { TMAX = 40 };
    fm_matrix w = {dt, rows, cols, make_weights(dt, rows, cols), NULL, FM_LAYOUT_ROWS};
    float *x = malloc(sizeof(float) * (size_t)(TMAX * cols));
    float *y1 = malloc(sizeof(float) * (size_t)(TMAX * rows)),
          *y = malloc(sizeof(float) * (size_t)(TMAX * rows));
    float *bias = malloc(sizeof(float) * (size_t)rows);
    for (int64_t i = 0; i < TMAX * cols; i++) x[i] = rng_uniform() * 3.0f;
    for (int64_t r = 0; r < rows; r++) bias[r] = rng_uniform();
    for (int v = 0; v < n_variants(); v++) {
        const char *vname = set_variant(v);
        for (int t = 0; t < TMAX; t++) fm_matmul(NULL, &w, x + t * cols, 1, y1 + t * rows, bias);
        for (int T = 2; T <= TMAX; T++) {
            const int use_pool = T % 2;
            for (int64_t i = 0; i < T * rows; i++) y[i] = NAN;
            fm_matmul(use_pool ? pool : NULL, &w, x, T, y, bias);
            int bad = 0, first = -1;
            for (int64_t i = 0; i < T * rows; i++)
                if (memcmp(&y[i], &y1[i], sizeof(float)) != 0) {
                    bad++;
                    if (first < 0) first = (int)i;
                }
            CHECK_MSG(bad == 0,
                      "%s %s %lldx%lld T=%d pool=%d: %d outputs differ from the single-token product "
                      "(first: token %d row %d: %.9g vs %.9g)",
                      fm_dtype_name(dt), vname, (long long)rows, (long long)cols, T, use_pool, bad,
                      first < 0 ? 0 : first / (int)rows, first < 0 ? 0 : first % (int)rows,
                      first < 0 ? 0.0 : y[first], first < 0 ? 0.0 : y1[first]);
        }
    }
    reset_variant();
    free((void *)w.data);
    free(x);
    free(y1);
    free(y);
    free(bias);
}

/* The K-quant kernels of every level give the scalar kernel's results bit for bit (they sum each super-block
 * exactly in integers and take the scalar f32 steps per (row, token) in its order): stronger than
 * test_type's tolerance, and what makes batch independence hold by construction. Rows not a multiple of the
 * kernels' row tiles, T across their token tiles and passes, with and without the pool. */
static void test_k_exact(fm_dtype dt, int64_t rows, int64_t cols, fm_pool *pool) {
    enum { TMAX = 70 };
    fm_matrix w = {dt, rows, cols, make_weights(dt, rows, cols), NULL, FM_LAYOUT_ROWS};
    float *x = malloc(sizeof(float) * (size_t)(TMAX * cols));
    float *yref = malloc(sizeof(float) * (size_t)(TMAX * rows)),
          *y = malloc(sizeof(float) * (size_t)(TMAX * rows));
    float *bias = malloc(sizeof(float) * (size_t)rows);
    for (int64_t i = 0; i < TMAX * cols; i++) x[i] = rng_uniform() * 4.0f;
    for (int64_t r = 0; r < rows; r++) bias[r] = rng_uniform();
    static const int Ts[] = {1, 2, 3, 4, 5, 8, 9, 12, 16, 17, 21, 70}; /* 70: two passes over a panel */
    for (size_t k = 0; k < sizeof Ts / sizeof *Ts; k++) {
        const int T = Ts[k];
        fm_matmul_reference(&w, x, T, yref, k % 2 ? bias : NULL);
        for (int v = 0; v < n_variants(); v++) {
            const char *vname = set_variant(v);
            for (int64_t i = 0; i < T * rows; i++) y[i] = NAN;
            fm_matmul(T % 2 ? pool : NULL, &w, x, T, y, k % 2 ? bias : NULL);
            int bad = 0;
            for (int64_t i = 0; i < T * rows; i++) bad += memcmp(&y[i], &yref[i], sizeof(float)) != 0;
            CHECK_MSG(bad == 0, "%s %s %lldx%lld T=%d: %d outputs differ from the scalar kernel's bits",
                      fm_dtype_name(dt), vname, (long long)rows, (long long)cols, T, bad);
        }
        reset_variant();
    }
    free((void *)w.data);
    free(x);
    free(yref);
    free(y);
    free(bias);
}

/* fm_matrix_batch_granule: 8 exactly where a 9-token Q8_0 product takes the AMX kernel, 1 for other types and
 * levels (the adaptive verify width reads it as the cost steps of verify blocks). */
static void test_batch_granule(fm_pool *pool) {
    const int64_t rows = 64, cols = 256;
    fm_matrix q = {FM_DTYPE_Q8_0, rows, cols, make_weights(FM_DTYPE_Q8_0, rows, cols), NULL, FM_LAYOUT_ROWS};
    fm_matrix f = {FM_DTYPE_F32, rows, cols, make_weights(FM_DTYPE_F32, rows, cols), NULL, FM_LAYOUT_ROWS};
    float *x = malloc(sizeof(float) * 9 * cols), *y = malloc(sizeof(float) * 9 * rows);
    for (int64_t i = 0; i < 9 * cols; i++) x[i] = rng_uniform();
    for (int v = 0; v < n_variants(); v++) {
        const char *vname = set_variant(v);
        const unsigned long before = fm_mm_amx_calls();
        fm_matmul(pool, &q, x, 9, y, NULL);
        const int amx = fm_mm_amx_calls() > before, g = fm_matrix_batch_granule(&q);
        CHECK_MSG(g == (amx ? 8 : 1), "%s: granule %d, the AMX kernel %s", vname, g,
                  amx ? "ran" : "did not run");
        CHECK(fm_matrix_batch_granule(&f) == 1);
    }
    reset_variant();
    free(x), free(y), free((void *)q.data), free((void *)f.data);
}

/* fm_matmul_multi gives what separate fm_matmul calls give, bit for bit; mixed dtypes fall back to them. */
static void test_multi(fm_pool *pool) {
    const int64_t cols = 288, rows[3] = {37, 8, 70};
    const fm_dtype types[2][3] = {{FM_DTYPE_Q8_0, FM_DTYPE_Q8_0, FM_DTYPE_Q8_0},
                                  {FM_DTYPE_Q8_0, FM_DTYPE_F16, FM_DTYPE_BF16}};
    const int Ts[] = {1, 5, 17, 33};
    float *x = malloc(sizeof(float) * 33 * cols);
    for (int64_t i = 0; i < 33 * cols; i++) x[i] = rng_uniform();
    for (int mix = 0; mix < 2; mix++) {
        fm_matrix w[3];
        const fm_matrix *wp[3];
        float *ya[3], *yb[3];
        for (int i = 0; i < 3; i++) {
            w[i] = (fm_matrix){types[mix][i], rows[i],       cols, make_weights(types[mix][i], rows[i], cols),
                               NULL,          FM_LAYOUT_ROWS};
            wp[i] = &w[i];
            ya[i] = malloc(sizeof(float) * 33 * (size_t)rows[i]);
            yb[i] = malloc(sizeof(float) * 33 * (size_t)rows[i]);
        }
        for (int v = 0; v < n_variants(); v++) {
            const char *vname = set_variant(v);
            for (size_t k = 0; k < sizeof Ts / sizeof *Ts; k++) {
                const int T = Ts[k];
                for (int i = 0; i < 3; i++) {
                    for (int64_t j = 0; j < T * rows[i]; j++) ya[i][j] = NAN;
                    fm_matmul(pool, &w[i], x, T, yb[i], NULL);
                }
                fm_matmul_multi(pool, wp, 3, x, T, ya);
                for (int i = 0; i < 3; i++)
                    CHECK_MSG(memcmp(ya[i], yb[i], sizeof(float) * (size_t)(T * rows[i])) == 0,
                              "multi mix=%d %s T=%d: matrix %d differs from fm_matmul", mix, vname, T, i);
            }
        }
        reset_variant();
        for (int i = 0; i < 3; i++) {
            free((void *)w[i].data);
            free(ya[i]);
            free(yb[i]);
        }
    }
    free(x);
}

/* The AVX2 kernel's pre-packed rows (fm_matrix_pack_q8_0): its bytes are the documented layout (per row, ng
 * groups of 8 blocks as 8 pairs of int16 vectors, lane l of pair j = bytes 4j, 4j + 2 | 4j + 1, 4j + 3 of
 * block 8g + l, then the ng x 8 f32 scales, zeros past the last block), and a packed matrix gives the
 * unpacked one's results bit for bit for every T (and at every level: the others ignore it), through
 * fm_matmul and fm_matmul_multi, with and without the pool. Shapes as test_batch_independence's. */
static void check_packed_layout(const fm_matrix *w, const int8_t *p) {
    const int64_t nb = w->cols / 32, ng = (nb + 7) / 8, prow = ng * (512 + 32);
    int bad = 0;
    for (int64_t r = 0; r < w->rows; r++) {
        const fm_block_q8_0 *row = (const fm_block_q8_0 *)w->data + r * nb;
        const int8_t *q = p + r * prow;
        const float *d = (const float *)(q + ng * 512);
        for (int64_t g = 0; g < ng; g++)
            for (int l = 0; l < 8; l++) {
                const int64_t b = g * 8 + l;
                float ds;
                memcpy(&ds, d + g * 8 + l, sizeof ds);
                bad += ds != (b < nb ? fm_f16_to_f32(row[b].d) : 0.0f);
                for (int j = 0; j < 8; j++) {
                    int16_t v[4];
                    memcpy(&v[0], q + g * 512 + 64 * j + 4 * l, 4);      /* bytes 4j, 4j + 2 */
                    memcpy(&v[2], q + g * 512 + 64 * j + 32 + 4 * l, 4); /* bytes 4j + 1, 4j + 3 */
                    static const int byte[4] = {0, 2, 1, 3};
                    for (int i = 0; i < 4; i++) bad += v[i] != (b < nb ? row[b].qs[4 * j + byte[i]] : 0);
                }
            }
    }
    CHECK_MSG(bad == 0, "packed %lldx%lld: %d values differ from the Q8_0 rows", (long long)w->rows,
              (long long)w->cols, bad);
}

/* Products of wp (the same matrix as w in another layout) equal w's bit for bit at every level, for T in
 * 1..18 and some up to 40, with and without the pool, with a bias, and in fm_matmul_multi beside w. */
static void check_same_products(const char *what, const fm_matrix *w, const fm_matrix *wp, fm_pool *pool) {
    enum { TMAX = 40 };
    const int64_t rows = w->rows, cols = w->cols;
    float *x = malloc(sizeof(float) * (size_t)(TMAX * cols));
    float *bias = malloc(sizeof(float) * (size_t)rows);
    float *ya = malloc(sizeof(float) * (size_t)(TMAX * rows)),
          *yb = malloc(sizeof(float) * (size_t)(TMAX * rows));
    for (int64_t i = 0; i < TMAX * cols; i++) x[i] = rng_uniform() * 3.0f;
    for (int64_t r = 0; r < rows; r++) bias[r] = rng_uniform();
    for (int v = 0; v < n_variants(); v++) {
        const char *vname = set_variant(v);
        for (int T = 1; T <= TMAX; T += T < 18 ? 1 : 7) {
            const int use_pool = T % 2;
            for (int64_t i = 0; i < T * rows; i++) ya[i] = yb[i] = NAN;
            fm_matmul(use_pool ? pool : NULL, w, x, T, ya, bias);
            fm_matmul(use_pool ? pool : NULL, wp, x, T, yb, bias);
            CHECK_MSG(memcmp(ya, yb, sizeof(float) * (size_t)(T * rows)) == 0,
                      "%s %s %lldx%lld T=%d pool=%d: results differ from the matrix in rows", what, vname,
                      (long long)rows, (long long)cols, T, use_pool);
            const fm_matrix *pair[2] = {wp, w};
            float *ys[2] = {yb, ya};
            fm_matmul_multi(pool, pair, 2, x, T, ys);
            CHECK_MSG(memcmp(ya, yb, sizeof(float) * (size_t)(T * rows)) == 0,
                      "%s %s %lldx%lld T=%d: fm_matmul_multi results differ", what, vname, (long long)rows,
                      (long long)cols, T);
        }
    }
    reset_variant();
    free(x);
    free(bias);
    free(ya);
    free(yb);
}

static void test_prepacked(int64_t rows, int64_t cols, fm_pool *pool) {
    if (fm_cpu_isa_best() < FM_ISA_AVX2) {
        printf("test_matmul: skipping pre-packed Q8_0 rows: no AVX2\n");
        return;
    }
    fm_matrix w = {FM_DTYPE_Q8_0, rows, cols, make_weights(FM_DTYPE_Q8_0, rows, cols), NULL, FM_LAYOUT_ROWS},
              wp = w;
    CHECK(fm_cpu_set_isa(FM_ISA_AVX2) == 0);
    /* the packed path takes batches from 10 tokens (matmul_q8_avx2.c, Q8_PACK_MIN_T) */
    CHECK(fm_matrix_packed_bytes(&w, 9) == 0);
    const size_t bytes = fm_matrix_packed_bytes(&w, 16);
    CHECK(bytes == (size_t)rows * (size_t)((cols / 32 + 7) / 8) * (512 + 32));
    CHECK(fm_matrix_packed_bytes(&w, 10) == bytes && fm_matrix_packed_bytes(&w, 40) == bytes);
    void *buf = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    fm_matrix_pack_q8_0(pool, &wp, 16, buf);
    CHECK(wp.packed == buf && wp.data == w.data);
    check_packed_layout(&w, buf);
    reset_variant();
    check_same_products("pre-packed", &w, &wp, pool);
    free(buf);
    free((void *)w.data);
}

/* The in-place VNNI layout (fm_matrix_repack_vnni4): its bytes are the documented layout (every block reads
 * back as it was, through fm_matrix_q8_0_block and fm_matrix_row_f32, and one block checked byte by byte at
 * its documented offsets), shapes it cannot take are refused untouched, and every product equals the rows'
 * bit for bit at every level (the VNNI kernel reads it; other levels go through a copy in rows), for T in
 * 1..40, with and without the pool, with a bias and in fm_matmul_multi beside a matrix still in rows. */
static void test_vnni4(int64_t rows, int64_t cols, fm_pool *pool) {
    const int64_t nb = cols / 32;
    fm_matrix w = {FM_DTYPE_Q8_0, rows, cols, make_weights(FM_DTYPE_Q8_0, rows, cols), NULL, FM_LAYOUT_ROWS};
    const size_t bytes = (size_t)rows * (size_t)nb * sizeof(fm_block_q8_0);
    void *copy = malloc(bytes);
    memcpy(copy, w.data, bytes);
    fm_matrix wp = w;
    wp.data = copy;
    CHECK(fm_matrix_repack_vnni4(pool, &wp, copy) == 0 && wp.layout == FM_LAYOUT_Q8_VNNI4);
    CHECK(fm_matrix_repack_vnni4(pool, &wp, copy) == -1); /* already repacked */
    CHECK_MSG(memcmp(copy, w.data, bytes) != 0, "repack %lldx%lld changed no byte", (long long)rows,
              (long long)cols);
    int bad = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            const fm_block_q8_0 x = fm_matrix_q8_0_block(&wp, r, b),
                                y = ((const fm_block_q8_0 *)w.data)[r * nb + b];
            bad += memcmp(&x, &y, sizeof x) != 0;
        }
    CHECK_MSG(bad == 0, "repack %lldx%lld: %d blocks read back differently", (long long)rows, (long long)cols,
              bad);
    if (rows >= 8 && nb >= 22) { /* row 6 (unit 1, r = 2), block 21 (group 1, lane 5), where matmul.h says */
        const unsigned char *grp = (const unsigned char *)copy + (size_t)(1 * (cols / 512) + 1) * 2176;
        const fm_block_q8_0 y = ((const fm_block_q8_0 *)w.data)[6 * nb + 21];
        int ok = memcmp(grp + 4 * 512 + 2 * 32 + 5 * 2, &y.d, 2) == 0;
        for (int k = 0; k < 32; k++)
            ok &=
                grp[(k / 4) * 256 + 2 * 64 + 5 * 4 + k % 4] == (unsigned char)((unsigned char)y.qs[k] ^ 0x80);
        CHECK_MSG(ok, "repack %lldx%lld: block (6, 21) is not at its documented offsets", (long long)rows,
                  (long long)cols);
    }
    float *fa = malloc(sizeof(float) * (size_t)cols), *fb = malloc(sizeof(float) * (size_t)cols);
    fm_matrix_row_f32(&w, rows - 1, fa);
    fm_matrix_row_f32(&wp, rows - 1, fb);
    CHECK(memcmp(fa, fb, sizeof(float) * (size_t)cols) == 0);
    free(fa);
    free(fb);
    check_same_products("vnni4", &w, &wp, pool);
    /* Shapes the layout cannot hold are refused and left as they were. */
    fm_matrix odd = w;
    odd.rows = rows - 1;
    CHECK(fm_matrix_repack_vnni4(pool, &odd, (void *)odd.data) == -1 && odd.layout == FM_LAYOUT_ROWS);
    CHECK(!fm_matrix_wants_vnni4(&odd));
    odd = w;
    odd.cols = cols - 32;
    odd.rows = rows; /* (cols - 32) % 512 != 0 */
    CHECK(fm_matrix_repack_vnni4(pool, &odd, (void *)odd.data) == -1 && !fm_matrix_wants_vnni4(&odd));
    CHECK(!fm_matrix_wants_vnni4(&wp)); /* already repacked */
    free(copy);
    free((void *)w.data);
}

int main(void) {
    g_amx_default = fm_cpu_amx();
    test_isa_levels();
    test_quantise();
    test_quantise_k();
    test_row_and_check();
    fm_pool *pool = fm_pool_create(2);
    static const int64_t shapes[][2] = {{1, 32}, {5, 64}, {37, 96}, {67, 256}, {13, 1056}};
    for (int dt = 0; dt < FM_DTYPE_COUNT; dt++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes && !fm_dtype_is_k_quant(dt); s++)
            test_type((fm_dtype)dt, shapes[s][0], shapes[s][1], pool);
    /* K-quants: cols in blocks of 256, up to Qwen3-4B's dim. */
    static const int64_t k_shapes[][2] = {{1, 256}, {5, 512}, {37, 768}, {13, 2560}};
    for (int dt = FM_DTYPE_Q4_K; dt <= FM_DTYPE_Q6_K; dt++)
        for (size_t s = 0; s < sizeof k_shapes / sizeof *k_shapes; s++)
            test_type((fm_dtype)dt, k_shapes[s][0], k_shapes[s][1], pool);
    /* Float types also take any cols: tails shorter than a vector. */
    for (int dt = FM_DTYPE_F32; dt <= FM_DTYPE_BF16; dt++) {
        test_type((fm_dtype)dt, 9, 100, pool);
        test_type((fm_dtype)dt, 6, 7, pool);
    }
    static const int64_t bi_shapes[][2] = {{67, 1056}, {301, 2560}, {9, 64}, {21, 9728}};
    for (size_t s = 0; s < sizeof bi_shapes / sizeof *bi_shapes; s++)
        test_batch_independence(FM_DTYPE_Q8_0, bi_shapes[s][0], bi_shapes[s][1], pool);
    for (int dt = FM_DTYPE_F32; dt <= FM_DTYPE_BF16; dt++)
        test_batch_independence((fm_dtype)dt, 13, 100, pool);
    for (int dt = FM_DTYPE_Q4_K; dt <= FM_DTYPE_Q6_K; dt++) {
        test_batch_independence((fm_dtype)dt, 67, 2560, pool);
        test_batch_independence((fm_dtype)dt, 21, 9728, pool);
        test_k_exact((fm_dtype)dt, 45, 1280, pool);
        test_k_exact((fm_dtype)dt, 7, 256, pool);
    }
    for (int dt = FM_DTYPE_Q4_0; dt <= FM_DTYPE_Q5_0; dt++) {
        test_batch_independence((fm_dtype)dt, 67, 1056, pool);
        test_batch_independence((fm_dtype)dt, 21, 9728, pool);
        test_batch_independence((fm_dtype)dt, 9, 64, pool);
        test_k_exact((fm_dtype)dt, 45, 1280, pool); /* the AVX2 kernel gives the scalar bits too */
        test_k_exact((fm_dtype)dt, 7, 32, pool);
    }
    test_multi(pool);
    test_batch_granule(pool);
    for (size_t s = 0; s < sizeof bi_shapes / sizeof *bi_shapes; s++)
        test_prepacked(bi_shapes[s][0], bi_shapes[s][1], pool);
    static const int64_t v4_shapes[][2] = {{4, 512}, {12, 2560}, {268, 1024}, {8, 9728}};
    for (size_t s = 0; s < sizeof v4_shapes / sizeof *v4_shapes; s++)
        test_vnni4(v4_shapes[s][0], v4_shapes[s][1], pool);
    if (n_variants() > (int)fm_cpu_isa_best() + 1) {
        printf("test_matmul: the AMX kernel ran in %lu products\n", fm_mm_amx_calls());
        CHECK(fm_mm_amx_calls() > 0);
    }
    fm_pool_free(pool);
    return fm_test_report("test_matmul");
}
