/* matmul_avx512.c: AVX-512 kernels (F/BW/VL/DQ, plus VNNI and BF16 variants). This file is compiled with
 * those ISA flags but its functions run only after matmul.c checked CPUID (fm_cpu_isa() == FM_ISA_AVX512,
 * and avx512vnni / avx512bf16 for the variants that need them).
 *
 * Float kernels tile 4 rows x 4 tokens of 16-lane accumulators (32 vector registers):
 * - F32/F16/BF16: weights widened to f32, x f32, FMA.
 * - BF16 with AVX512-BF16: vdpbf16ps on raw bf16 weights. x is carried as two bf16 vectors hi + lo
 *   (hi = bf16(x), lo = bf16(x - hi)), so each product keeps ~16 mantissa bits of x (relative error about
 *   2^-17 per term) instead of bf16's 8; the products of two bf16 are exact in f32.
 * - Q8_0 with VNNI: per 32-value block vpdpbusd(|w|, sign(x, w)) gives 8 exact int32 lanes in one
 *   instruction (no int16 step); then the same structure as the AVX2 kernel: one row streamed at a time, 4
 *   blocks folded per vphaddd tree for each token, in the same order for every T. */
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
                      int64_t r1) {
    float_rows(FM_DTYPE_F32, w, a, y, bias, r0, r1);
}
void fm_mm_f16_avx512(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                      int64_t r1) {
    float_rows(FM_DTYPE_F16, w, a, y, bias, r0, r1);
}
void fm_mm_bf16_avx512(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                       int64_t r1) {
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
                              int64_t r1) {
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

/* ---------------- Q8_0 with VNNI ---------------- */

/* The int32 dot of one Q8_0 block pair: 8 lanes, exact. */
FM_INLINE __m256i q8_dot(__m256i wq, __m256i xq) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(wq), _mm256_sign_epi8(xq, wq));
}

/* One row x TT tokens (TT = 1..8), 4 blocks per step, each token's 4 block products folded by vphaddd into
 * [b0..b3 | b0..b3] so the f32 convert/scale/FMA run once per 4 blocks. As in the AVX2 kernel, the f32
 * operations of one (row, token) are the same sequence for every T: verify rows equal single steps bit for
 * bit (speculative decoding depends on it). */
FM_INLINE void q8_row_tile(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r,
                           int t0, const int TT) {
    const int64_t nb = w->cols / FM_QK8_0, T = a->T;
    const fm_block_q8_0 *wb = (const fm_block_q8_0 *)w->data + r * nb;
    const fm_block_q8_0 *xb = a->xq + t0;           /* block b of token t0 + t: xb[b * T + t] */
    const float *xd = a->xd_tok + (int64_t)t0 * nb; /* token t0 + t, block b: xd[t * nb + b] */
    __m256 acc[8];
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++) acc[t] = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4, wb += 4, xb += 4 * T) {
        _mm_prefetch((const char *)wb + 1024, _MM_HINT_T0);
        _mm_prefetch((const char *)wb + 1024 + 64, _MM_HINT_T0);
        __m256i wq[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) wq[u] = _mm256_loadu_si256((const __m256i *)wb[u].qs);
        const __m128 dw = _mm_cvtph_ps(
            _mm_setr_epi16((short)wb[0].d, (short)wb[1].d, (short)wb[2].d, (short)wb[3].d, 0, 0, 0, 0));
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) {
            __m256i p[4];
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++)
                p[u] = q8_dot(wq[u], _mm256_loadu_si256((const __m256i *)xb[u * T + t].qs));
            const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
            const __m128 dx = _mm_loadu_ps(xd + (int64_t)t * nb + b);
            const __m128 s4 = _mm_mul_ps(dw, dx);
            const __m256 s = _mm256_insertf128_ps(_mm256_castps128_ps256(s4), s4, 1);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), s, acc[t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++) {
        float sum = hsum256(acc[t]);
        const fm_block_q8_0 *wt = wb, *xt = xb + t;
        const float *dt = xd + (int64_t)t * nb;
        for (int64_t bt = b; bt < nb; bt++, wt++, xt += T) {
            const __m256i pr = q8_dot(_mm256_loadu_si256((const __m256i *)wt->qs),
                                      _mm256_loadu_si256((const __m256i *)xt->qs));
            sum += hsum256(_mm256_mul_ps(_mm256_cvtepi32_ps(pr), _mm256_set1_ps(_cvtsh_ss(wt->d) * dt[bt])));
        }
        fm_mm_store(w, y, bias, r, t0 + t, sum);
    }
}

/* As the AVX2 kernel: rows one at a time up to a verify block, chunks of Q8_ROW_CHUNK rows (tiles of 8 tokens
 * inside) for longer batches, so a prefill's activations stay in cache across a chunk. */
enum { Q8_ROW_CHUNK = 32, Q8_CHUNK_MIN_T = 18 };

void fm_mm_q8_0_vnni_avx512(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                            int64_t r1) {
    const int64_t chunk = a->T >= Q8_CHUNK_MIN_T ? Q8_ROW_CHUNK : 1;
    for (int64_t rc = r0; rc < r1; rc += chunk) {
        const int64_t rend = rc + chunk < r1 ? rc + chunk : r1;
        int t = 0;
        for (; t + 8 <= a->T; t += 8)
            for (int64_t r = rc; r < rend; r++) q8_row_tile(w, a, y, bias, r, t, 8);
        for (int64_t r = rc; r < rend; r++) {
            switch (a->T - t) {
            case 7:
                q8_row_tile(w, a, y, bias, r, t, 7);
                break;
            case 6:
                q8_row_tile(w, a, y, bias, r, t, 6);
                break;
            case 5:
                q8_row_tile(w, a, y, bias, r, t, 5);
                break;
            case 4:
                q8_row_tile(w, a, y, bias, r, t, 4);
                break;
            case 3:
                q8_row_tile(w, a, y, bias, r, t, 3);
                break;
            case 2:
                q8_row_tile(w, a, y, bias, r, t, 2);
                break;
            case 1:
                q8_row_tile(w, a, y, bias, r, t, 1);
                break;
            default:
                break;
            }
        }
    }
}
