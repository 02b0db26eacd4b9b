/* matmul_avx2.c: AVX2 + FMA + F16C kernels for every weight type, and the AVX2 Q8_0 activation quantiser.
 *
 * Tiling: for each tile of rows x tokens the loop runs over the whole row, keeping the tile's accumulators in
 * registers. A row (or a 4-row group: a few KB to tens of KB) is read from memory by the first token tile and
 * from L1/L2 by the next ones, so DRAM sees each weight byte once per call; x is small and stays in cache.
 *
 * The Q8_0 kernels are in matmul_q8_avx2.c; the Q8_0 activation quantiser is here.
 *
 * Float types: weights are widened to f32 (F16 by vcvtph2ps, BF16 by a 16-bit shift), x stays f32, FMA. */
#include <immintrin.h>
#include <math.h>

#include "cpu/matmul_kernels.h"
#include "cpu/simd_avx.h"

/* The tile loops over rows (R) and tokens (TT) have compile-time trip counts after inlining; they must be
 * fully unrolled so that the accumulators live in registers (GCC -O2 does not do it by itself). */

/* ---------------- float weights ---------------- */

FM_INLINE __m256 load8(fm_dtype dt, const void *row, int64_t k) {
    switch (dt) {
    case FM_DTYPE_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + k)));
    case FM_DTYPE_BF16: {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + k)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    }
    default:
        return _mm256_loadu_ps((const float *)row + k);
    }
}

/* R rows from r, TT tokens from t0: full dot products, written to y. */
FM_INLINE void float_tile(fm_dtype dt, const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias,
                          int64_t r, int t0, const int R, const int TT) {
    const int64_t K = w->cols, K8 = K & ~(int64_t)7;
    const size_t rb = fm_dtype_row_bytes(dt, K);
    const char *w0 = (const char *)w->data + (size_t)r * rb;
    const float *x0 = a->x + (int64_t)t0 * K;
    __m256 acc[4][4];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) acc[i][t] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K8; k += 8) {
        __m256 xv[4];
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) xv[t] = _mm256_loadu_ps(x0 + t * K + k);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m256 wv = load8(dt, w0 + i * rb, k);
#pragma GCC unroll 8
            for (int t = 0; t < TT; t++) acc[i][t] = _mm256_fmadd_ps(wv, xv[t], acc[i][t]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) {
            float s = hsum256(acc[i][t]);
            for (int64_t k = K8; k < K; k++) s += fm_mm_load1(dt, w0 + i * rb, k) * x0[t * K + k];
            fm_mm_store(w, y, bias, r + i, t0 + t, s);
        }
}

/* Rows in groups of 4 with tokens in groups of 2 (8 accumulators, x in 2 registers), remainder rows one by
 * one. */
FM_INLINE void float_rows(fm_dtype dt, const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias,
                          int64_t r0, int64_t r1) {
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {
        int t = 0;
        for (; t + 3 <= a->T; t += 3) float_tile(dt, w, a, y, bias, r, t, 4, 3);
        if (a->T - t == 2) float_tile(dt, w, a, y, bias, r, t, 4, 2);
        if (a->T - t == 1) float_tile(dt, w, a, y, bias, r, t, 4, 1);
    }
    for (; r < r1; r++) {
        int t = 0;
        for (; t + 4 <= a->T; t += 4) float_tile(dt, w, a, y, bias, r, t, 1, 4);
        for (; t < a->T; t++) float_tile(dt, w, a, y, bias, r, t, 1, 1);
    }
}

void fm_mm_f32_avx2(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                    int64_t r1, void *tls) {
    (void)tls;
    float_rows(FM_DTYPE_F32, w, a, y, bias, r0, r1);
}
void fm_mm_f16_avx2(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                    int64_t r1, void *tls) {
    (void)tls;
    float_rows(FM_DTYPE_F16, w, a, y, bias, r0, r1);
}
void fm_mm_bf16_avx2(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                     int64_t r1, void *tls) {
    (void)tls;
    float_rows(FM_DTYPE_BF16, w, a, y, bias, r0, r1);
}

/* Bit-identical to fm_quant_q8_0_scalar: max is exact in any order, d and 1/d are the same scalar ops, the
 * product x * id is one IEEE multiply per lane, and roundf (ties away from zero) is rebuilt exactly from
 * truncation: r = trunc(v); r += sign(v) when |v - r| >= 0.5 (v - r is exact for |v| < 2^23). */
void fm_quant_q8_0_avx2(const float *x, fm_block_q8_0 *y, float *d, int64_t n, int64_t stride) {
    const int64_t nb = n / FM_QK8_0;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    for (int64_t i = 0; i < nb; i++) {
        const int64_t b = i * stride;
        const float *xb = x + i * FM_QK8_0;
        __m256 v[4], m = _mm256_setzero_ps();
#pragma GCC unroll 8
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(xb + 8 * j);
            m = _mm256_max_ps(m, _mm256_and_ps(v[j], absmask));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float db = amax / 127.0f;
        const float id = db != 0.0f ? 1.0f / db : 0.0f;
        y[b].d = fm_f32_to_f16(db);
        if (d) d[b] = fm_f16_to_f32(y[b].d);
        const __m256 idv = _mm256_set1_ps(id);
        __m256i q[4];
#pragma GCC unroll 8
        for (int j = 0; j < 4; j++) {
            const __m256 s = _mm256_mul_ps(v[j], idv);
            __m256 t = _mm256_round_ps(s, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            const __m256 frac = _mm256_and_ps(_mm256_sub_ps(s, t), absmask);
            const __m256 step = _mm256_or_ps(one, _mm256_andnot_ps(absmask, s)); /* +-1 with s's sign */
            t = _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(frac, half, _CMP_GE_OQ), step));
            q[j] = _mm256_cvttps_epi32(t);
        }
        /* 4 x 8 int32 -> 32 int8 in order: packs work per 128-bit lane, a final permute restores the order.
         */
        const __m256i p01 = _mm256_packs_epi32(q[0], q[1]), p23 = _mm256_packs_epi32(q[2], q[3]);
        const __m256i p = _mm256_packs_epi16(p01, p23);
        const __m256i ord = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)y[b].qs, ord);
    }
}
