/* matmul_avx512.c: AVX-512 kernels (F/BW/VL/DQ, plus VNNI and BF16 variants). This file is compiled with
 * those ISA flags but its functions run only after matmul.c checked CPUID (fm_cpu_isa() == FM_ISA_AVX512,
 * and avx512vnni / avx512bf16 for the variants that need them).
 *
 * Float kernels tile 4 rows x 4 tokens of 16-lane accumulators (32 vector registers):
 * - F32/F16/BF16: weights widened to f32, x f32, FMA.
 * - BF16 with AVX512-BF16: vdpbf16ps on raw bf16 weights. x is carried as two bf16 vectors hi + lo
 *   (hi = bf16(x), lo = bf16(x - hi)), so each product keeps ~16 mantissa bits of x (relative error about
 *   2^-17 per term) instead of bf16's 8; the products of two bf16 are exact in f32.
 * The Q8_0 kernel (VNNI) is in matmul_q8_avx512.c. */
#include <immintrin.h>

#include "cpu/matmul_kernels.h"
#include "cpu/simd_avx.h"

/* The tile loops over rows (R) and tokens (TT) have compile-time trip counts after inlining; they must be
 * fully unrolled so that the accumulators live in registers (GCC -O2 does not do it by itself). */

/* ---------------- float weights, widened to f32 ---------------- */

FM_INLINE __m512 load16(fm_dtype dt, const void *row, int64_t k) {
    switch (dt) {
    case FM_DTYPE_F16:
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + k)));
    case FM_DTYPE_BF16: {
        __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + k)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    }
    default:
        return _mm512_loadu_ps((const float *)row + k);
    }
}

FM_INLINE void float_tile(fm_dtype dt, const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias,
                          int64_t r, int t0, const int R, const int TT) {
    const int64_t K = w->cols, K16 = K & ~(int64_t)15;
    const size_t rb = fm_dtype_row_bytes(dt, K);
    const char *w0 = (const char *)w->data + (size_t)r * rb;
    const float *x0 = a->x + (int64_t)t0 * K;
    __m512 acc[4][4];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) acc[i][t] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K16; k += 16) {
        __m512 xv[4];
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) xv[t] = _mm512_loadu_ps(x0 + t * K + k);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m512 wv = load16(dt, w0 + i * rb, k);
#pragma GCC unroll 8
            for (int t = 0; t < TT; t++) acc[i][t] = _mm512_fmadd_ps(wv, xv[t], acc[i][t]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) {
            float s = _mm512_reduce_add_ps(acc[i][t]);
            for (int64_t k = K16; k < K; k++) s += fm_mm_load1(dt, w0 + i * rb, k) * x0[t * K + k];
            fm_mm_store(w, y, bias, r + i, t0 + t, s);
        }
}

FM_INLINE void float_rows(fm_dtype dt, const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias,
                          int64_t r0, int64_t r1) {
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {
        int t = 0;
        for (; t + 4 <= a->T; t += 4) float_tile(dt, w, a, y, bias, r, t, 4, 4);
        for (; t < a->T; t++) float_tile(dt, w, a, y, bias, r, t, 4, 1);
    }
    for (; r < r1; r++) {
        int t = 0;
        for (; t + 4 <= a->T; t += 4) float_tile(dt, w, a, y, bias, r, t, 1, 4);
        for (; t < a->T; t++) float_tile(dt, w, a, y, bias, r, t, 1, 1);
    }
}

void fm_mm_f32_avx512(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                      int64_t r1, void *tls) {
    (void)tls;
    float_rows(FM_DTYPE_F32, w, a, y, bias, r0, r1);
}
void fm_mm_f16_avx512(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                      int64_t r1, void *tls) {
    (void)tls;
    float_rows(FM_DTYPE_F16, w, a, y, bias, r0, r1);
}
void fm_mm_bf16_avx512(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                       int64_t r1, void *tls) {
    (void)tls;
    float_rows(FM_DTYPE_BF16, w, a, y, bias, r0, r1);
}

/* ---------------- BF16 with vdpbf16ps ---------------- */

FM_INLINE __m512bh load_bh(const uint16_t *p) {
    return (__m512bh)_mm512_loadu_si512((const void *)p);
}

FM_INLINE void dpbf16_tile(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r,
                           int t0, const int R, const int TT) {
    const int64_t K = w->cols, K32 = K & ~(int64_t)31;
    const uint16_t *w0 = (const uint16_t *)w->data + r * K;
    const uint16_t *hi0 = a->xbf_hi + (int64_t)t0 * K, *lo0 = a->xbf_lo + (int64_t)t0 * K;
    __m512 acc[4][4];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) acc[i][t] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K32; k += 32) {
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            const __m512bh wv = load_bh(w0 + i * K + k);
#pragma GCC unroll 8
            for (int t = 0; t < TT; t++) {
                acc[i][t] = _mm512_dpbf16_ps(acc[i][t], wv, load_bh(hi0 + t * K + k));
                acc[i][t] = _mm512_dpbf16_ps(acc[i][t], wv, load_bh(lo0 + t * K + k));
            }
        }
    }
    const float *x0 = a->x + (int64_t)t0 * K;
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) {
            float s = _mm512_reduce_add_ps(acc[i][t]);
            for (int64_t k = K32; k < K; k++) s += fm_bf16_to_f32(w0[i * K + k]) * x0[t * K + k];
            fm_mm_store(w, y, bias, r + i, t0 + t, s);
        }
}

void fm_mm_bf16_dpbf16_avx512(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                              int64_t r1, void *tls) {
    (void)tls;
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {
        int t = 0;
        for (; t + 4 <= a->T; t += 4) dpbf16_tile(w, a, y, bias, r, t, 4, 4);
        for (; t < a->T; t++) dpbf16_tile(w, a, y, bias, r, t, 4, 1);
    }
    for (; r < r1; r++) {
        int t = 0;
        for (; t + 4 <= a->T; t += 4) dpbf16_tile(w, a, y, bias, r, t, 1, 4);
        for (; t < a->T; t++) dpbf16_tile(w, a, y, bias, r, t, 1, 1);
    }
}

void fm_split_bf16_avx512(const float *x, uint16_t *hi, uint16_t *lo, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        const __m256bh h = _mm512_cvtneps_pbh(v);
        const __m512 hf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h), 16));
        const __m256bh l = _mm512_cvtneps_pbh(_mm512_sub_ps(v, hf));
        _mm256_storeu_si256((__m256i *)(hi + i), (__m256i)h);
        _mm256_storeu_si256((__m256i *)(lo + i), (__m256i)l);
    }
    for (; i < n; i++) {
        hi[i] = fm_f32_to_bf16(x[i]);
        lo[i] = fm_f32_to_bf16(x[i] - fm_bf16_to_f32(hi[i]));
    }
}
