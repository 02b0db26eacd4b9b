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
 * lanes of 4 consecutive blocks of one row with a vphaddd tree first, per token, in the same order for every
 * T (so rows do not depend on the batch). Rows are processed one at a time, so each thread reads its weights
 * as one sequential stream, with a software prefetch 1 KB ahead.
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

/* One row x TT tokens (TT = 1..4), four blocks per step. For each token the int32 lanes of the 4 block
 * products are folded by three vphaddd into [b0..b3 | b0..b3] (low and high halves of each block), so the f32
 * part (convert, scale, FMA) runs once per 4 blocks; the 4 scales d_w * d_x come from one vcvtph2ps of the 4
 * weight scales times the token's 4 activation scales. The weight blocks are loaded once for all TT tokens.
 *
 * The f32 operations of one (row, token) are the same sequence whatever TT and T are: a verify block's rows
 * equal single steps bit for bit, which speculative decoding needs to be lossless. Never give a token a
 * different folding (e.g. across tokens) than the others. */
FM_INLINE void q8_row_tile(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r,
                           int t0, const int TT) {
    const int64_t nb = w->cols / FM_QK8_0, T = a->T;
    const fm_block_q8_0 *wb = (const fm_block_q8_0 *)w->data + r * nb;
    const fm_block_q8_0 *xb = a->xq + t0;           /* block b of token t0 + t: xb[b * T + t] */
    const float *xd = a->xd_tok + (int64_t)t0 * nb; /* token t0 + t, block b: xd[t * nb + b] */
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4];
#pragma GCC unroll 4
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
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) {
            __m256i p[4];
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) {
                const __m256i xq = _mm256_loadu_si256((const __m256i *)xb[u * T + t].qs);
                p[u] = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(_mm256_sign_epi8(wq[u], wq[u]), _mm256_sign_epi8(xq, wq[u])), ones);
            }
            const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
            const __m128 dx = _mm_loadu_ps(xd + (int64_t)t * nb + b);
            const __m128 s4 = _mm_mul_ps(dw, dx);
            const __m256 s = _mm256_insertf128_ps(_mm256_castps128_ps256(s4), s4, 1);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), s, acc[t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < TT; t++) {
        float sum = hsum256(acc[t]);
        const fm_block_q8_0 *wt = wb, *xt = xb + t;
        const float *dt = xd + (int64_t)t * nb;
        for (int64_t bt = b; bt < nb; bt++, wt++, xt += T) {
            const __m256i wq = _mm256_loadu_si256((const __m256i *)wt->qs);
            const __m256i xq = _mm256_loadu_si256((const __m256i *)xt->qs);
            const __m256i pr = _mm256_madd_epi16(
                _mm256_maddubs_epi16(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xq, wq)), ones);
            sum += hsum256(_mm256_mul_ps(_mm256_cvtepi32_ps(pr), _mm256_set1_ps(_cvtsh_ss(wt->d) * dt[bt])));
        }
        fm_mm_store(w, y, bias, r, t0 + t, sum);
    }
}

/* Up to a verify block (T <= 17), rows one at a time: a row (a few KB) is read from memory once and from L1
 * for its other token tiles. Longer batches (prefill) go by chunks of Q8_ROW_CHUNK rows (~85 KB at dim 2560,
 * kept in L2) with tiles of 4 tokens inside, so each tile's activations stay in L1 across the chunk instead
 * of the whole batch's activations (700 KB at T = 256) being swept once per row. */
enum { Q8_ROW_CHUNK = 32, Q8_CHUNK_MIN_T = 18 };

void fm_mm_q8_0_avx2(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                     int64_t r1) {
    const int64_t chunk = a->T >= Q8_CHUNK_MIN_T ? Q8_ROW_CHUNK : 1;
    for (int64_t rc = r0; rc < r1; rc += chunk) {
        const int64_t rend = rc + chunk < r1 ? rc + chunk : r1;
        int t = 0;
        for (; t + 4 <= a->T; t += 4)
            for (int64_t r = rc; r < rend; r++) q8_row_tile(w, a, y, bias, r, t, 4);
        for (int64_t r = rc; r < rend; r++) {
            switch (a->T - t) {
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
