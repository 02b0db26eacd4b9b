/* matmul_avx2.c: AVX2 + FMA + F16C kernels for every weight type, and the AVX2 Q8_0 activation quantiser.
 *
 * Tiling: for each tile of rows x tokens the loop runs over the whole row, keeping the tile's accumulators in
 * registers. A row (or a 4-row group: a few KB to tens of KB) is read from memory by the first token tile and
 * from L1/L2 by the next ones, so DRAM sees each weight byte once per call; x is small and stays in cache.
 *
 * Q8_0 (int8 x int8, as ggml): per 32-value block, |w| (unsigned) times sign(x, w) (signed) with
 * vpmaddubsw gives 16 exact int16 pair sums (|pair| <= 2 * 128 * 127 < 32768 since x never is -128),
 * vpmaddwd with ones widens them to 8 int32 lanes, and the block's f32 scale d_w * d_x multiplies them into
 * f32 accumulators. Every int product is exact; only the f32 additions differ in order from the reference.
 * The f32 part (convert, scale, FMA: 3 of the 6 ops per block product) is amortised by folding the int32
 * lanes of 4 block products with a vphaddd tree first: 4 consecutive blocks of one row at T = 1 (decode),
 * 4 tokens of one block at T >= 3 (prefill, verify). Rows are processed one at a time, so each thread reads
 * its weights as one sequential stream, with a software prefetch 1 KB ahead.
 *
 * Float types: weights are widened to f32 (F16 by vcvtph2ps, BF16 by a 16-bit shift), x stays f32, FMA. */
#include <immintrin.h>
#include <math.h>

#include "cpu/matmul_kernels.h"

#define FM_INLINE static inline __attribute__((always_inline))
/* The tile loops over rows (R) and tokens (TT) have compile-time trip counts after inlining; they must be
 * fully unrolled so that the accumulators live in registers (GCC -O2 does not do it by itself). */

FM_INLINE float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

FM_INLINE void store_out(const fm_matrix *w, float *y, const float *bias, int64_t r, int t, float v) {
    y[(int64_t)t * w->rows + r] = v + (bias ? bias[r] : 0.0f);
}

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

FM_INLINE float load1(fm_dtype dt, const void *row, int64_t k) {
    switch (dt) {
    case FM_DTYPE_F16:
        return fm_f16_to_f32(((const uint16_t *)row)[k]);
    case FM_DTYPE_BF16:
        return fm_bf16_to_f32(((const uint16_t *)row)[k]);
    default:
        return ((const float *)row)[k];
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
            for (int64_t k = K8; k < K; k++) s += load1(dt, w0 + i * rb, k) * x0[t * K + k];
            store_out(w, y, bias, r + i, t0 + t, s);
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
                    int64_t r1) {
    float_rows(FM_DTYPE_F32, w, a, y, bias, r0, r1);
}
void fm_mm_f16_avx2(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                    int64_t r1) {
    float_rows(FM_DTYPE_F16, w, a, y, bias, r0, r1);
}
void fm_mm_bf16_avx2(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                     int64_t r1) {
    float_rows(FM_DTYPE_BF16, w, a, y, bias, r0, r1);
}

/* ---------------- Q8_0 ---------------- */

FM_INLINE void q8_tile(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r, int t0,
                       const int R, const int TT) {
    const int64_t nb = w->cols / FM_QK8_0;
    const fm_block_q8_0 *w0 = (const fm_block_q8_0 *)w->data + r * nb;
    const int64_t T = a->T;
    const fm_block_q8_0 *x0 = a->xq + t0; /* block b of token t0 + t: x0[b * T + t] */
    const float *d0 = a->xd + t0;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4][8];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) acc[i][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, x0 += T, d0 += T) {
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            const fm_block_q8_0 *wb = w0 + i * nb + b;
            /* Rows are short streams (a few KB): prefetch ~1 KB ahead, across row ends too. */
            _mm_prefetch((const char *)wb + 1024, _MM_HINT_T0);
            const __m256i wq = _mm256_loadu_si256((const __m256i *)wb->qs);
            const __m256i wa = _mm256_sign_epi8(wq, wq); /* |w|; -128 stays 0x80 = 128 unsigned */
            const __m256 dw = _mm256_set1_ps(_cvtsh_ss(wb->d));
#pragma GCC unroll 8
            for (int t = 0; t < TT; t++) {
                const __m256i xq = _mm256_loadu_si256((const __m256i *)x0[t].qs);
                const __m256i p16 = _mm256_maddubs_epi16(wa, _mm256_sign_epi8(xq, wq));
                const __m256i p32 = _mm256_madd_epi16(p16, ones);
                const __m256 s = _mm256_mul_ps(dw, _mm256_broadcast_ss(d0 + t));
                acc[i][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32), s, acc[i][t]);
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) store_out(w, y, bias, r + i, t0 + t, hsum256(acc[i][t]));
}

/* T = 2 (and a model of the decode kernel): one row at a time, so each thread reads its rows as one
 * sequential stream (rows are contiguous; short rows read 4 at a time defeat the hardware prefetcher), with
 * two blocks per step in separate accumulators to hide the FMA latency. */
FM_INLINE void q8_row_small_t(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r,
                              const int TT) {
    const int64_t nb = w->cols / FM_QK8_0, T = a->T;
    const fm_block_q8_0 *wb = (const fm_block_q8_0 *)w->data + r * nb;
    const fm_block_q8_0 *xb = a->xq;
    const float *xd = a->xd;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[2][2];
#pragma GCC unroll 2
    for (int u = 0; u < 2; u++)
#pragma GCC unroll 2
        for (int t = 0; t < TT; t++) acc[u][t] = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2, wb += 2, xb += 2 * T, xd += 2 * T) {
        _mm_prefetch((const char *)wb + 1024, _MM_HINT_T0);
#pragma GCC unroll 2
        for (int u = 0; u < 2; u++) {
            const __m256i wq = _mm256_loadu_si256((const __m256i *)wb[u].qs);
            const __m256i wa = _mm256_sign_epi8(wq, wq);
            const __m256 dw = _mm256_set1_ps(_cvtsh_ss(wb[u].d));
#pragma GCC unroll 2
            for (int t = 0; t < TT; t++) {
                const __m256i xq = _mm256_loadu_si256((const __m256i *)xb[u * T + t].qs);
                const __m256i p32 =
                    _mm256_madd_epi16(_mm256_maddubs_epi16(wa, _mm256_sign_epi8(xq, wq)), ones);
                const __m256 s = _mm256_mul_ps(dw, _mm256_broadcast_ss(xd + u * T + t));
                acc[u][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32), s, acc[u][t]);
            }
        }
    }
    if (b < nb) {
        const __m256i wq = _mm256_loadu_si256((const __m256i *)wb->qs);
        const __m256i wa = _mm256_sign_epi8(wq, wq);
        const __m256 dw = _mm256_set1_ps(_cvtsh_ss(wb->d));
#pragma GCC unroll 2
        for (int t = 0; t < TT; t++) {
            const __m256i xq = _mm256_loadu_si256((const __m256i *)xb[t].qs);
            const __m256i p32 = _mm256_madd_epi16(_mm256_maddubs_epi16(wa, _mm256_sign_epi8(xq, wq)), ones);
            const __m256 s = _mm256_mul_ps(dw, _mm256_broadcast_ss(xd + t));
            acc[0][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32), s, acc[0][t]);
        }
    }
#pragma GCC unroll 2
    for (int t = 0; t < TT; t++) store_out(w, y, bias, r, t, hsum256(_mm256_add_ps(acc[0][t], acc[1][t])));
}

/* Decode (T = 1): one row, four blocks per step. The int32 lanes of the 4 blocks are folded by three vphaddd
 * into [b0..b3 | b0..b3], so convert/scale/FMA run once per 4 blocks, with the 4 scales d_w * d_x built by
 * one vcvtph2ps of the 4 weight scales and one 128-bit load of the activation scales. */
FM_INLINE void q8_row_t1(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r,
                         int t) {
    const int64_t nb = w->cols / FM_QK8_0, T = a->T;
    const fm_block_q8_0 *wb = (const fm_block_q8_0 *)w->data + r * nb;
    const fm_block_q8_0 *xb = a->xq + t; /* block b of token t: xb[b * T] */
    const float *xd = a->xd + t;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4, wb += 4, xb += 4 * T, xd += 4 * T) {
        _mm_prefetch((const char *)wb + 1024, _MM_HINT_T0);
        _mm_prefetch((const char *)wb + 1024 + 64, _MM_HINT_T0);
        __m256i p[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) {
            const __m256i wq = _mm256_loadu_si256((const __m256i *)wb[u].qs);
            const __m256i xq = _mm256_loadu_si256((const __m256i *)xb[u * T].qs);
            p[u] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xq, wq)),
                                     ones);
        }
        const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
        const __m128 dw = _mm_cvtph_ps(
            _mm_setr_epi16((short)wb[0].d, (short)wb[1].d, (short)wb[2].d, (short)wb[3].d, 0, 0, 0, 0));
        const __m128 dx = T == 1 ? _mm_loadu_ps(xd) : _mm_setr_ps(xd[0], xd[T], xd[2 * T], xd[3 * T]);
        const __m128 s4 = _mm_mul_ps(dw, dx);
        const __m256 s = _mm256_insertf128_ps(_mm256_castps128_ps256(s4), s4, 1);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), s, acc);
    }
    float sum = hsum256(acc);
    for (; b < nb; b++, wb++, xb += T, xd += T) {
        const __m256i wq = _mm256_loadu_si256((const __m256i *)wb->qs);
        const __m256i xq = _mm256_loadu_si256((const __m256i *)xb->qs);
        const __m256i p =
            _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xq, wq)), ones);
        const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(_cvtsh_ss(wb->d) * xd[0]));
        sum += hsum256(f);
    }
    store_out(w, y, bias, r, t, sum);
}

/* Prefill/verify: one row x G groups of 4 tokens (G = 1 or 2). The int32 lanes of 4 tokens are folded by
 * three vphaddd into one vector [t0..t3 | t0..t3] (low and high halves of each block), so the f32 part
 * (convert, scale, FMA) runs once per 4 tokens instead of once per token; the scales d_w * d_x of 4 tokens
 * come from one 128-bit load (xd is block-major). Folding happens on exact int32 sums, so results equal the
 * per-token kernel up to f32 summation order. */
FM_INLINE void q8_tile_x4(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r,
                          int t0, const int G) {
    const int64_t nb = w->cols / FM_QK8_0, T = a->T;
    const fm_block_q8_0 *wb = (const fm_block_q8_0 *)w->data + r * nb;
    const fm_block_q8_0 *x0 = a->xq + t0;
    const float *d0 = a->xd + t0;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[2];
#pragma GCC unroll 2
    for (int g = 0; g < G; g++) acc[g] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, wb++, x0 += T, d0 += T) {
        _mm_prefetch((const char *)wb + 1024, _MM_HINT_T0);
        const __m256i wq = _mm256_loadu_si256((const __m256i *)wb->qs);
        const __m256i wa = _mm256_sign_epi8(wq, wq);
        const __m256 dw = _mm256_set1_ps(_cvtsh_ss(wb->d));
#pragma GCC unroll 2
        for (int g = 0; g < G; g++) {
            __m256i p[4];
#pragma GCC unroll 4
            for (int t = 0; t < 4; t++) {
                const __m256i xq = _mm256_loadu_si256((const __m256i *)x0[4 * g + t].qs);
                p[t] = _mm256_madd_epi16(_mm256_maddubs_epi16(wa, _mm256_sign_epi8(xq, wq)), ones);
            }
            const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
            const __m256 s = _mm256_mul_ps(dw, _mm256_broadcast_ps((const __m128 *)(d0 + 4 * g)));
            acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), s, acc[g]);
        }
    }
#pragma GCC unroll 2
    for (int g = 0; g < G; g++) {
        float out[4];
        _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(acc[g]), _mm256_extractf128_ps(acc[g], 1)));
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++) store_out(w, y, bias, r, t0 + 4 * g + t, out[t]);
    }
}

/* Prefill/verify (T >= 3): tokens in groups of 8 then 4 (q8_tile_x4), the last 1-3 by the plain tile. The row
 * (a few KB) is re-read from L1 for each token group. */
FM_INLINE void q8_row_tokens(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r) {
    int t = 0;
    for (; t + 8 <= a->T; t += 8) q8_tile_x4(w, a, y, bias, r, t, 2);
    if (a->T - t >= 4) q8_tile_x4(w, a, y, bias, r, t, 1), t += 4;
    switch (a->T - t) {
    case 3:
        q8_tile(w, a, y, bias, r, t, 1, 3);
        break;
    case 2:
        q8_tile(w, a, y, bias, r, t, 1, 2);
        break;
    case 1:
        q8_row_t1(w, a, y, bias, r, t); /* e.g. the 17th token of a verify block */
        break;
    default:
        break;
    }
}

void fm_mm_q8_0_avx2(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                     int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
        if (a->T == 1)
            q8_row_t1(w, a, y, bias, r, 0);
        else if (a->T == 2)
            q8_row_small_t(w, a, y, bias, r, 2);
        else
            q8_row_tokens(w, a, y, bias, r);
    }
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
