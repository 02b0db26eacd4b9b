/* matmul_q8_avx2.c: the AVX2 Q8_0 kernel: int8 weights times int8 activations, the products of each 32-value
 * block summed exactly in int32 and scaled by d_w * d_x in f32, as ggml's vec_dot_q8_0_q8_0.
 *
 * Layout (matmul_kernels.h): blocks in groups of 8, each vector of a group holding 4 bytes of each of the 8
 * blocks, one block per 32-bit lane. Integer products summed lane by lane then leave the group's 8 block sums
 * in the 8 lanes, and one convert, one multiply (8 weight scales by 8 activation scales) and one FMA per
 * (row, token, group) apply the scales: no horizontal reduction until the end of the row.
 *
 * Two integer paths give the same 8 block sums (integer sums are exact in any order):
 * - direct (T < Q8_PACK_MIN_T: decode steps, short batches; memory bound): each row's blocks are interleaved
 *   in registers as they stream in, once per tile of up to 9 tokens (every batch it takes: with tiles of 4, a
 *   second interleave of the row cost T = 5..8 0.3-0.5 ms of 9728x2560's 1.7-2.4); per 32 bytes,
 *   |w| * sign(x, w) by vpmaddubsw (pairs exact in int16: x is never -128) widened by vpmaddwd with ones.
 * - packed (verify blocks, prefill; compute bound): a chunk of rows is widened once per call to int16 pairs
 *   in the worker's scratch (per 4-byte lane b0 b1 b2 b3: (b0, b2) and (b1, b3), sign-extended by shifts),
 *   the activations likewise, and vpmaddwd multiplies them directly: 2 ops on Zen 3's two integer-multiply
 *   pipes per (block, token) where the direct path needs 3 (vpsignb shares those pipes), in tiles of 3 rows x
 *   4 tokens so that each load feeds 3 to 4 products (7 loads per 12 vpmaddwd; 2 x 4 tiles took 6 per 8),
 *   over row segments whose activations stay in L1. The next chunk's weights are prefetched into L2 during
 *   the tiles, so memory and arithmetic overlap. Measured on Zen 3 (2 madd + 2 add per block-token run at
 *   ~3.2 vector ops per cycle): ~1.45 cycles per (block, token) in L1 with 2 x 4 tiles, against ~1.9 for the
 *   direct path's arithmetic; 3 x 4 tiles took ~7 % less time at 256 tokens (user time, interleaved runs on
 *   this noisy VM). A matrix may carry its rows already packed (w->packed, q8_pack_rows: per row its ng
 *   int16 groups, then its ng x 8 f32 scales: the bytes a chunk's scratch holds for it); the chunks then
 *   read them from there (twice the Q8_0 bytes) instead of widening them.
 *
 * Both paths run the same f32 operations for a (row, token) whatever T, the tile, the chunk or the worker:
 * acc = fma(float(isum_g), d_w,g * d_x,g, acc) for the groups g in order, then hsum256(acc). So the rows of a
 * verify block equal single steps bit for bit, which speculative decoding needs to be lossless. */
#include <immintrin.h>

#include "cpu/matmul_kernels.h"
#include "cpu/simd_avx.h"

enum {
    G8 = 8,                   /* blocks per group */
    GROUP8 = FM_Q8_VECS * 32, /* bytes of an int8 group */
    GROUP16 = 2 * GROUP8,     /* bytes of an int16 group */
    Q8_PACK_MIN_T = 10,       /* batches of this size and more take the packed path */
    Q8_PREFETCH = 1536,       /* bytes ahead of its reads that a row stream prefetches */
    Q8_PACK_L2 = 256 << 10,   /* packed rows per chunk: as many as fit in this much of the L2 */
    Q8_PRE_L2 = 80 << 10,     /* the same for pre-packed rows (w->packed), read from memory */
    Q8_SEG_GROUPS = 12,       /* groups per segment of a row (<= 24 KB of a 4-token tile's activations) */
};

static const int8_t k_zero_block[FM_QK8_0]; /* the padding of a row's last group */

static int64_t q8_groups(int64_t cols) {
    return (cols / FM_QK8_0 + G8 - 1) / G8;
}

static size_t align64(size_t n) {
    return (n + 63) & ~(size_t)63;
}

static int q8_packed(int T) {
    return T >= Q8_PACK_MIN_T;
}

/* The 8 x 8 transpose of 32-bit words that makes a group: v[j] lane l = word j of block l (m blocks, zero
 * blocks after them). */
FM_INLINE void q8_interleave(const fm_block_q8_0 *b, int m, __m256i v[8]) {
    __m256i a[8], t[8], u[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) a[i] = _mm256_loadu_si256((const __m256i *)(i < m ? b[i].qs : k_zero_block));
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) { /* t[2i]: words 0, 1 | 4, 5 of blocks 2i, 2i+1; t[2i+1]: 2, 3 | 6, 7 */
        t[2 * i] = _mm256_unpacklo_epi32(a[2 * i], a[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(a[2 * i], a[2 * i + 1]);
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) { /* u[4h + k]: word k | k + 4 of blocks 4h .. 4h + 3 */
        u[4 * h + 0] = _mm256_unpacklo_epi64(t[4 * h + 0], t[4 * h + 2]);
        u[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h + 0], t[4 * h + 2]);
        u[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
        u[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x20);
        v[4 + k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x31);
    }
}

/* The f32 scales of m blocks, zeros after them. The 8 f16 values are gathered in two general registers
 * (integer pipes, idle here) rather than by 8 vpinsrw on the vector pipes. */
FM_INLINE __m256 q8_scales(const fm_block_q8_0 *b, int m) {
    if (m == G8) {
        const uint64_t lo =
            (uint64_t)b[0].d | (uint64_t)b[1].d << 16 | (uint64_t)b[2].d << 32 | (uint64_t)b[3].d << 48;
        const uint64_t hi =
            (uint64_t)b[4].d | (uint64_t)b[5].d << 16 | (uint64_t)b[6].d << 32 | (uint64_t)b[7].d << 48;
        return _mm256_cvtph_ps(_mm_set_epi64x((long long)hi, (long long)lo));
    }
    float d[G8];
    for (int l = 0; l < G8; l++) d[l] = l < m ? fm_f16_to_f32(b[l].d) : 0.0f;
    return _mm256_loadu_ps(d);
}

/* An interleaved int8 vector as two int16 vectors: per 32-bit lane b0 b1 b2 b3, lo = (b0, b2) and
 * hi = (b1, b3), sign-extended. vpmaddwd of two such vectors sums two products within each lane's block. */
FM_INLINE void q8_widen(__m256i v, __m256i *lo, __m256i *hi) {
    *lo = _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 8);
    *hi = _mm256_srai_epi16(v, 8);
}

/* ---- activations ---- */

static size_t q8_act_bytes(int T, int64_t cols) {
    const size_t n = (size_t)T * (size_t)q8_groups(cols);
    return align64(n * (q8_packed(T) ? GROUP16 : GROUP8)) + align64(n * G8 * sizeof(float));
}

/* Quantises each token (bit-identical to the scalar quantiser) and lays its blocks out for the path T takes:
 * xr [T][ng][8 vectors of int8] (direct) or [T][ng][16 vectors of int16] (packed); xs [T][ng][8]. */
static void q8_act_prep(const float *x, int T, int64_t cols, void *ws, fm_mm_act *a) {
    const int64_t nb = cols / FM_QK8_0, ng = q8_groups(cols);
    const int packed = q8_packed(T);
    const size_t gbytes = packed ? GROUP16 : GROUP8;
    int8_t *xr = ws;
    float *xs = (float *)((char *)ws + align64((size_t)T * (size_t)ng * gbytes));
    for (int t = 0; t < T; t++)
        for (int64_t g = 0; g < ng; g++) {
            fm_block_q8_0 blk[G8];
            float d[G8];
            const int m = nb - g * G8 < G8 ? (int)(nb - g * G8) : G8;
            fm_quant_q8_0_avx2(x + (int64_t)t * cols + g * G8 * FM_QK8_0, blk, d, (int64_t)m * FM_QK8_0, 1);
            __m256i v[8];
            q8_interleave(blk, m, v);
            const int64_t tg = (int64_t)t * ng + g;
            int8_t *dst = xr + (size_t)tg * gbytes;
            for (int j = 0; j < FM_Q8_VECS; j++) {
                if (packed) {
                    __m256i lo, hi;
                    q8_widen(v[j], &lo, &hi);
                    _mm256_store_si256((__m256i *)(dst + 64 * j), lo);
                    _mm256_store_si256((__m256i *)(dst + 64 * j + 32), hi);
                } else {
                    _mm256_store_si256((__m256i *)(dst + 32 * j), v[j]);
                }
            }
            for (int l = 0; l < G8; l++) xs[tg * G8 + l] = l < m ? d[l] : 0.0f;
        }
    a->ng = ng;
    a->xr = xr;
    a->xs = xs;
}

/* ---- direct path: T < Q8_PACK_MIN_T ---- */

/* One row x TT tokens (1..9) from t0. */
FM_INLINE void q8_direct_tile(const fm_block_q8_0 *wb, int64_t nb, int64_t ng, const fm_mm_act *a, int t0,
                              const int TT, float out[9]) {
    const int64_t xq_stride = ng * GROUP8, xs_stride = ng * G8;
    const int8_t *xr = a->xr + t0 * xq_stride;
    const float *xs = a->xs + t0 * xs_stride;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[9];
#pragma GCC unroll 9
    for (int t = 0; t < TT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g++, wb += G8, xr += GROUP8, xs += G8) {
#pragma GCC unroll 5
        for (int i = 0; i < 5; i++) _mm_prefetch((const char *)wb + Q8_PREFETCH + 64 * i, _MM_HINT_T0);
        const int m = nb - g * G8 < G8 ? (int)(nb - g * G8) : G8;
        __m256i v[8];
        q8_interleave(wb, m, v);
        __m256i ia[9];
#pragma GCC unroll 9
        for (int t = 0; t < TT; t++) ia[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int j = 0; j < FM_Q8_VECS; j++) {
            const __m256i aw = _mm256_abs_epi8(v[j]);
#pragma GCC unroll 9
            for (int t = 0; t < TT; t++) {
                const __m256i x = _mm256_load_si256((const __m256i *)(xr + t * xq_stride + 32 * j));
                const __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, v[j]));
                ia[t] = _mm256_add_epi32(ia[t], _mm256_madd_epi16(p, ones));
                FM_PIN(ia[t]);
            }
        }
        const __m256 dw = q8_scales(wb, m);
#pragma GCC unroll 9
        for (int t = 0; t < TT; t++) {
            const __m256 s = _mm256_mul_ps(dw, _mm256_load_ps(xs + t * xs_stride));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[t]), s, acc[t]);
        }
    }
#pragma GCC unroll 9
    for (int t = 0; t < TT; t++) out[t] = hsum256(acc[t]);
}

/* Rows [r0, r1) x tokens [t0, t0 + TT), a tile a row. */
FM_INLINE void q8_direct_rows(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                              int64_t r1, int t0, const int TT) {
    const int64_t nb = w->cols / FM_QK8_0;
    for (int64_t r = r0; r < r1; r++) {
        float out[9];
        q8_direct_tile((const fm_block_q8_0 *)w->data + r * nb, nb, a->ng, a, t0, TT, out);
        for (int t = 0; t < TT; t++) fm_mm_store(w, y, bias, r, t0 + t, out[t]);
    }
}

/* q8_direct_rows with compile-time tiles of 1..9 tokens, by count - 1. */
typedef void (*q8_direct_fn)(const fm_matrix *, const fm_mm_act *, float *, const float *, int64_t, int64_t,
                             int);
#define Q8_DIRECT_ROWS(N)                                                                                    \
    static void q8_direct_rows_##N(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias,      \
                                   int64_t r0, int64_t r1, int t0) {                                         \
        q8_direct_rows(w, a, y, bias, r0, r1, t0, N);                                                        \
    }
Q8_DIRECT_ROWS(1)
Q8_DIRECT_ROWS(2)
Q8_DIRECT_ROWS(3)
Q8_DIRECT_ROWS(4)
Q8_DIRECT_ROWS(5)
Q8_DIRECT_ROWS(6)
Q8_DIRECT_ROWS(7)
Q8_DIRECT_ROWS(8)
Q8_DIRECT_ROWS(9)
#undef Q8_DIRECT_ROWS
static const q8_direct_fn k_direct_rows[9] = {q8_direct_rows_1, q8_direct_rows_2, q8_direct_rows_3,
                                              q8_direct_rows_4, q8_direct_rows_5, q8_direct_rows_6,
                                              q8_direct_rows_7, q8_direct_rows_8, q8_direct_rows_9};

/* Tiles of up to 9 tokens (so one tile for every batch below Q8_PACK_MIN_T): each row is read from memory and
 * interleaved once. With 8 or 9 tokens the integer sums, scaled sums and an interleaved group outnumber the
 * 16 registers and the compiler keeps some in L1; still, against tiles of 4 (bench_kernels, 2 threads,
 * 9728x2560): T = 5 1.75 -> 1.45 ms, T = 8 2.38 -> 2.05 ms, T = 4 unchanged; and T = 9 2.33 ms against the
 * packed path's 2.56. From 10 tokens the sums spill inside the loop (T = 10 3.5 ms against 2.7 packed). */
static void q8_direct(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                      int64_t r1) {
    for (int t0 = 0; t0 < a->T; t0 += 9)
        k_direct_rows[(a->T - t0 < 9 ? a->T - t0 : 9) - 1](w, a, y, bias, r0, r1, t0);
}

/* ---- packed path: T >= Q8_PACK_MIN_T ---- */

/* One group of a row (m blocks) widened to int16: q [16 vectors], d [8 scales]. */
FM_INLINE void q8_pack_group(const fm_block_q8_0 *wb, int m, int8_t *q, float *d) {
    __m256i v[8];
    q8_interleave(wb, m, v);
#pragma GCC unroll 8
    for (int j = 0; j < FM_Q8_VECS; j++) {
        __m256i lo, hi;
        q8_widen(v[j], &lo, &hi);
        _mm256_store_si256((__m256i *)(q + 64 * j), lo);
        _mm256_store_si256((__m256i *)(q + 64 * j + 32), hi);
    }
    _mm256_store_ps(d, q8_scales(wb, m));
}

/* Bytes of a packed row (in a chunk's scratch or pre-packed): ng int16 groups, then ng x 8 f32 scales
 * (32-byte aligned at a 64-byte base). */
static int64_t q8_prow_bytes(int64_t cols) {
    return q8_groups(cols) * (GROUP16 + G8 * (int64_t)sizeof(float));
}

/* Rows packed per chunk: as many as fit in Q8_PACK_L2 (each token tile's activations are then reused from L1
 * by all of them), a multiple of the tiles' 3 rows. Pre-packed rows (pre) go in smaller chunks: the next
 * chunk prefetched into L2 is then as large as the current one, not half of it (both of 256 KB filled this
 * Zen 3's 512 KB L2: drafts took ~5 % longer than with chunks of a third of that). */
static int64_t q8_chunk_rows(int64_t cols, int pre) {
    const int64_t n = (pre ? Q8_PRE_L2 : Q8_PACK_L2) / q8_prow_bytes(cols);
    return n < 3 ? 3 : n > 30 ? 30 : n - n % 3;
}

static size_t q8_tls_bytes(int T, int64_t cols) {
    if (!q8_packed(T)) return 0;
    const size_t rc = (size_t)q8_chunk_rows(cols, 0); /* the larger chunk: a matrix may be pre-packed */
    return rc * (size_t)q8_prow_bytes(cols) + rc * 4 * G8 * sizeof(float);
}

/* Row wb (nb blocks) into ng int16 groups q [ng][16 vectors] and their scales d [ng][8]. */
static void q8_pack_row(const fm_block_q8_0 *wb, int64_t nb, int64_t ng, int8_t *q, float *d) {
    for (int64_t g = 0; g < ng; g++, wb += G8, q += GROUP16, d += G8) {
#pragma GCC unroll 5
        for (int i = 0; i < 5; i++) _mm_prefetch((const char *)wb + Q8_PREFETCH + 64 * i, _MM_HINT_T0);
        q8_pack_group(wb, nb - g * G8 < G8 ? (int)(nb - g * G8) : G8, q, d);
    }
}

static size_t q8_pack_bytes(int T, int64_t rows, int64_t cols) {
    return q8_packed(T) ? (size_t)rows * (size_t)q8_prow_bytes(cols) : 0;
}

/* Rows [r0, r1) of w into dst [rows][q8_prow_bytes]: the same bytes q8_packed_rows writes to its scratch. */
static void q8_pack_rows(const fm_matrix *w, int64_t r0, int64_t r1, void *dst) {
    const int64_t nb = w->cols / FM_QK8_0, ng = q8_groups(w->cols), prow = q8_prow_bytes(w->cols);
    for (int64_t r = r0; r < r1; r++) {
        int8_t *q = (int8_t *)dst + r * prow;
        q8_pack_row((const fm_block_q8_0 *)w->data + r * nb, nb, ng, q, (float *)(q + ng * GROUP16));
    }
}

/* A stream of cache lines to prefetch into L2, a few per group of the tiles: the next chunk's weights. */
typedef struct {
    const char *p, *end;
    int per_group;
} q8_prefetch;

/* R packed rows (1..3; groups at wq + r * rq, scales at wd + r * rd) x TT tokens (1..4) from t0, over the
 * groups [g0, g1) of a row. The f32 accumulators live in accbuf [R][4][8] (zeroed when g0 == 0): 12 integer
 * sums, 3 weight vectors and a token's fill the 16 registers, and an accumulator is touched once a group.
 * After the last group the sums go to out. */
FM_INLINE void q8_tile(const int8_t *wq, const float *wd, int64_t rq, int64_t rd, const fm_mm_act *a, int t0,
                       int64_t g0, int64_t g1, float *accbuf, const int R, const int TT, float out[3][4],
                       q8_prefetch *pf) {
    const int64_t ng = a->ng, xq_stride = ng * GROUP16, xs_stride = ng * G8;
    const int8_t *xr = a->xr + (int64_t)t0 * xq_stride + g0 * GROUP16;
    const float *xs = a->xs + (int64_t)t0 * xs_stride + g0 * G8;
    wq += g0 * GROUP16;
    wd += g0 * G8;
    if (!g0)
#pragma GCC unroll 3
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) _mm256_store_ps(accbuf + (r * 4 + t) * 8, _mm256_setzero_ps());
    /* At most about what one core streams from memory while a group's products run (~5 lines per 64
     * block-tokens): more would queue in the miss buffers and stall the tile's own loads. */
    const int cap = (R * TT * 5 + 7) / 8, n_pf = pf->per_group < cap ? pf->per_group : cap;
    for (int64_t g = g0; g < g1; g++, wq += GROUP16, wd += G8, xr += GROUP16, xs += G8) {
        for (int i = 0; i < n_pf && pf->p < pf->end; i++, pf->p += 64) _mm_prefetch(pf->p, _MM_HINT_T1);
        __m256i ia[3][4];
#pragma GCC unroll 3
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) ia[r][t] = _mm256_setzero_si256();
#pragma GCC unroll 16
        for (int j = 0; j < 2 * FM_Q8_VECS; j++) {
            __m256i wv[3];
#pragma GCC unroll 3
            for (int r = 0; r < R; r++) wv[r] = _mm256_load_si256((const __m256i *)(wq + r * rq + 32 * j));
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) {
                __m256i x = _mm256_load_si256((const __m256i *)(xr + t * xq_stride + 32 * j));
                FM_PIN(x); /* one load for all rows, not a memory operand per product */
#pragma GCC unroll 3
                for (int r = 0; r < R; r++) {
                    ia[r][t] = _mm256_add_epi32(ia[r][t], _mm256_madd_epi16(wv[r], x));
                    FM_PIN(ia[r][t]);
                }
            }
        }
#pragma GCC unroll 3
        for (int r = 0; r < R; r++) {
            const __m256 dw = _mm256_load_ps(wd + r * rd);
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) {
                float *ap = accbuf + (r * 4 + t) * 8;
                const __m256 s = _mm256_mul_ps(dw, _mm256_load_ps(xs + t * xs_stride));
                _mm256_store_ps(ap, _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[r][t]), s, _mm256_load_ps(ap)));
            }
        }
    }
    if (g1 == ng)
#pragma GCC unroll 3
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) out[r][t] = hsum256(_mm256_load_ps(accbuf + (r * 4 + t) * 8));
}

/* The tile of R rows x tt tokens, with compile-time shapes. */
static void q8_tile_any(const int8_t *wq, const float *wd, int64_t rq, int64_t rd, const fm_mm_act *a, int t0,
                        int64_t g0, int64_t g1, float *accbuf, int R, int tt, float out[3][4],
                        q8_prefetch *pf) {
    switch (R * 4 + tt) {
    case 16:
        q8_tile(wq, wd, rq, rd, a, t0, g0, g1, accbuf, 3, 4, out, pf);
        break;
    case 15:
        q8_tile(wq, wd, rq, rd, a, t0, g0, g1, accbuf, 3, 3, out, pf);
        break;
    case 14:
        q8_tile(wq, wd, rq, rd, a, t0, g0, g1, accbuf, 3, 2, out, pf);
        break;
    case 13:
        q8_tile(wq, wd, rq, rd, a, t0, g0, g1, accbuf, 3, 1, out, pf);
        break;
    case 12:
        q8_tile(wq, wd, rq, rd, a, t0, g0, g1, accbuf, 2, 4, out, pf);
        break;
    case 11:
        q8_tile(wq, wd, rq, rd, a, t0, g0, g1, accbuf, 2, 3, out, pf);
        break;
    case 10:
        q8_tile(wq, wd, rq, rd, a, t0, g0, g1, accbuf, 2, 2, out, pf);
        break;
    case 9:
        q8_tile(wq, wd, rq, rd, a, t0, g0, g1, accbuf, 2, 1, out, pf);
        break;
    case 8:
        q8_tile(wq, wd, rq, rd, a, t0, g0, g1, accbuf, 1, 4, out, pf);
        break;
    case 7:
        q8_tile(wq, wd, rq, rd, a, t0, g0, g1, accbuf, 1, 3, out, pf);
        break;
    case 6:
        q8_tile(wq, wd, rq, rd, a, t0, g0, g1, accbuf, 1, 2, out, pf);
        break;
    default:
        q8_tile(wq, wd, rq, rd, a, t0, g0, g1, accbuf, 1, 1, out, pf);
        break;
    }
}

/* Rows [r0, r1) by chunks: pack the chunk's rows (their only pass over memory; or take them pre-packed from
 * w->packed), then, for each 4-token tile, run the chunk's rows three at a time over segments of
 * Q8_SEG_GROUPS groups (the tile's activations for a segment stay in L1 while all the chunk's rows pass; the
 * accumulators wait in the scratch), while the next chunk is prefetched. */
static void q8_packed_rows(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                           int64_t r1, void *tls) {
    const int8_t *pre = w->packed; /* [rows][prow] or NULL */
    const int64_t nb = w->cols / FM_QK8_0, ng = a->ng, rc_max = q8_chunk_rows(w->cols, pre != NULL);
    const int64_t prow = q8_prow_bytes(w->cols);
    /* Row strides: scratch [rc_max][ng][16 vectors] then [rc_max][ng][8]; pre-packed rows, prow. */
    const int64_t rq = pre ? prow : ng * GROUP16, rd = pre ? prow / (int64_t)sizeof(float) : ng * G8;
    /* The stream the next chunk is prefetched from: whichever one the rows are read from. */
    const char *sbase = pre ? (const char *)pre : (const char *)w->data;
    const int64_t row_bytes = nb * (int64_t)sizeof(fm_block_q8_0), srow = pre ? prow : row_bytes;
    const int64_t nseg = (ng + Q8_SEG_GROUPS - 1) / Q8_SEG_GROUPS, seg = (ng + nseg - 1) / nseg;
    int8_t *pq = tls;
    float *pd = (float *)(pq + rc_max * ng * GROUP16);
    float *accbuf = pd + rc_max * ng * G8; /* [rc_max][4][8] */
    for (int64_t rc = r0; rc < r1; rc += rc_max) {
        const int64_t n = r1 - rc < rc_max ? r1 - rc : rc_max;
        const int8_t *cq = pq; /* the chunk's first row: groups, scales */
        const float *cd = pd;
        if (pre) {
            cq = pre + rc * prow;
            cd = (const float *)(cq + ng * GROUP16);
        } else {
            for (int64_t i = 0; i < n; i++)
                q8_pack_row((const fm_block_q8_0 *)w->data + (rc + i) * nb, nb, ng, pq + i * rq, pd + i * rd);
        }
        /* The rows after this chunk (past r1 too: likely this worker's next chunk), spread over its tiles. */
        const int64_t next_end = rc + n + rc_max < w->rows ? rc + n + rc_max : w->rows;
        const int64_t tiles = (int64_t)((a->T + 3) / 4) * ((n + 2) / 3) * ng;
        q8_prefetch pf = {sbase + (rc + n) * srow, sbase + next_end * srow, 0};
        pf.per_group = (int)(((pf.end - pf.p) / 64 + tiles - 1) / tiles);
        /* Tokens in tiles of sizes as equal as 4 allows (18 = 4 + 4 + 4 + 3 + 3, not 4 x 4 + 2): verify(17)'s
         * products 1-2 % faster (bench_kernels, three alternations), 9 and 10 tokens unchanged */
        const int nt = (a->T + 3) / 4;
        for (int k = 0, t0 = 0; k < nt; k++) {
            const int tt = a->T / nt + (k < a->T % nt);
            for (int64_t g0 = 0; g0 < ng; g0 += seg) {
                const int64_t g1 = g0 + seg < ng ? g0 + seg : ng;
                for (int64_t i = 0; i < n; i += 3) {
                    const int R = n - i < 3 ? (int)(n - i) : 3;
                    float out[3][4];
                    q8_tile_any(cq + i * rq, cd + i * rd, rq, rd, a, t0, g0, g1, accbuf + i * 32, R, tt, out,
                                &pf);
                    if (g1 == ng)
                        for (int r = 0; r < R; r++)
                            for (int t = 0; t < tt; t++)
                                fm_mm_store(w, y, bias, rc + i + r, t0 + t, out[r][t]);
                }
            }
            t0 += tt;
        }
    }
}

static void q8_kernel(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                      int64_t r1, void *tls) {
    if (q8_packed(a->T))
        q8_packed_rows(w, a, y, bias, r0, r1, tls);
    else
        q8_direct(w, a, y, bias, r0, r1);
}

const fm_mm_q8_family fm_q8_family_avx2 = {
    .act_bytes = q8_act_bytes,
    .act_prep = q8_act_prep,
    .tls_bytes = q8_tls_bytes,
    .kern = q8_kernel,
    .pack_bytes = q8_pack_bytes,
    .pack_rows = q8_pack_rows,
};
