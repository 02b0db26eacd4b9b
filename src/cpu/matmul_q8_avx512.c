/* matmul_q8_avx512.c: the AVX-512 VNNI Q8_0 kernel (F/BW/VL/DQ + VNNI; runs only after matmul.c checked
 * avx512vnni). Same scheme as matmul_q8_avx2.c with 16 blocks per group (one per 32-bit lane of a zmm):
 * vpdpbusd multiplies 4 unsigned bytes by 4 signed bytes and adds them to an int32 lane without saturation,
 * so weights are read as w + 128 (unsigned), activations stay signed, and 128 * sum(x) per block (computed
 * once per token) is subtracted: one instruction per 64 bytes of products, no sign or widening step.
 *
 * A matrix the engine repacked (FM_LAYOUT_Q8_VNNI4, matmul.h; where this kernel is the CPU's Q8_0 kernel and
 * AMX is not) takes one path for every T: 4-row x 3-token tiles over the prepared groups (v4_rows). Matrices
 * in the file's rows (other shapes, FLASHMAP_NO_REPACK=1, and where AMX takes batches) take one of three ways
 * through the rows, by batch size T (thresholds measured on an Emerald Rapids Xeon, 2 threads):
 * - direct (T <= 8: decode steps, verify(7)): each row interleaved in registers as it streams in, one tile of
 *   1 row x T tokens;
 * - row pairs (T = 9..12, and up to 24 for rows of 8192+ columns: verify blocks, the drafter's 16 slots): two
 *   rows interleaved once per group and kept in registers for every 4-token tile, so each activation load
 *   feeds two rows; columns in segments whose activations stay in L1 (this is what wins on long rows);
 * - packed (longer batches: prefill): a chunk of rows packed once per call into the worker's scratch, then
 *   tiles of 1 row x 8 tokens over it.
 * The f32 part per (row, token, group) is one convert, one scale multiply and one FMA, in the same order for
 * every T and path, so verify rows equal single steps bit for bit (speculative decoding depends on it). */
#include <immintrin.h>

#include "cpu/matmul_kernels.h"
#include "cpu/q8_layout.h"
#include "cpu/simd_avx.h"

enum {
    G16 = 16,                      /* blocks per group */
    GROUP_BYTES = FM_Q8_VECS * 64, /* bytes of a group */
    Q8_PREFETCH = 2048,            /* bytes ahead of its reads that a row stream prefetches */
    Q8_DIRECT_MAX_T = 8,           /* batches up to this size read each row directly (one tile) */
    Q8_PAIR_MAX_T = 12,            /* longer batches up to this size take the row-pair path, */
    Q8_PAIR_LONG_MAX_T = 24,       /* and up to this size when rows have Q8_PAIR_LONG_GROUPS groups or more */
    Q8_PAIR_LONG_GROUPS = 16,      /* (8192 columns: the MLP down projections) */
    Q8_PAIR_ROWS = 8,              /* rows per chunk of the row-pair path */
    Q8_PAIR_L1 = 24 << 10,         /* bytes of activations per segment of the row-pair path (L1: 48 KB) */
};

static const int8_t k_zero_block[FM_QK8_0]; /* the padding of a row's last group */

/* The 16 x 8 transpose of 32-bit words that makes a group (matmul_kernels.h): v[j] lane l = word j of block l
 * (m blocks from b, zero blocks after them). Vector i holds blocks q and q + 4 (q = 0..3, 8..11) so that the
 * in-lane unpacks and one 128-bit shuffle leave the blocks in natural lane order. flip XORs 0x80 into every
 * byte: w + 128 as unsigned bytes. */
FM_INLINE void q8_interleave16(const fm_block_q8_0 *b, int m, int flip, __m512i v[8]) {
    __m512i z[8], t[8], u[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        const int q = i < 4 ? i : i + 4;
        const int8_t *lo = q < m ? b[q].qs : k_zero_block, *hi = q + 4 < m ? b[q + 4].qs : k_zero_block;
        z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)lo)),
                                  _mm256_loadu_si256((const __m256i *)hi), 1);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]);
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        u[4 * h + 0] = _mm512_unpacklo_epi64(t[4 * h + 0], t[4 * h + 2]);
        u[4 * h + 1] = _mm512_unpackhi_epi64(t[4 * h + 0], t[4 * h + 2]);
        u[4 * h + 2] = _mm512_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
        u[4 * h + 3] = _mm512_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
    }
    const __m512i fl = _mm512_set1_epi8(flip ? (char)0x80 : 0);
#pragma GCC unroll 4
    for (int k = 0; k < 4;
         k++) { /* u[k]: 128-bit lanes = blocks 0-3 word k, k + 4; blocks 4-7 word k, k + 4 */
        v[k] = _mm512_xor_si512(fl, _mm512_shuffle_i32x4(u[k], u[4 + k], 0x88));
        v[4 + k] = _mm512_xor_si512(fl, _mm512_shuffle_i32x4(u[k], u[4 + k], 0xdd));
    }
}

/* The f32 scales of m blocks, zeros after them. */
FM_INLINE __m512 q8_scales16(const fm_block_q8_0 *b, int m) {
    uint16_t h[G16];
    for (int l = 0; l < G16; l++) h[l] = l < m ? b[l].d : 0;
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
}

static int64_t q8_groups(int64_t cols) {
    return (cols / FM_QK8_0 + G16 - 1) / G16;
}

static size_t align64(size_t n) {
    return (n + 63) & ~(size_t)63;
}

static size_t q8_act_bytes(int T, int64_t cols) {
    const size_t n = (size_t)T * (size_t)q8_groups(cols);
    return align64(n * GROUP_BYTES) + 2 * align64(n * G16 * sizeof(float));
}

/* Quantises each token (bit-identical to the scalar quantiser), interleaves its blocks and records
 * 128 * sum(q) per block: the kernel multiplies w + 128 (unsigned) by x, so it subtracts that. */
static void q8_act_prep(const float *x, int T, int64_t cols, void *ws, fm_mm_act *a) {
    const int64_t nb = cols / FM_QK8_0, ng = q8_groups(cols);
    const size_t n = (size_t)T * (size_t)ng;
    int8_t *xr = ws;
    float *xs = (float *)((char *)ws + align64(n * GROUP_BYTES));
    int32_t *xc = (int32_t *)((char *)xs + align64(n * G16 * sizeof(float)));
    for (int t = 0; t < T; t++)
        for (int64_t g = 0; g < ng; g++) {
            fm_block_q8_0 blk[G16];
            float d[G16];
            const int m = nb - g * G16 < G16 ? (int)(nb - g * G16) : G16;
            fm_quant_q8_0_avx2(x + (int64_t)t * cols + g * G16 * FM_QK8_0, blk, d, (int64_t)m * FM_QK8_0, 1);
            const int64_t tg = (int64_t)t * ng + g;
            __m512i v[8];
            q8_interleave16(blk, m, 0, v);
            for (int j = 0; j < FM_Q8_VECS; j++) _mm512_store_si512(xr + tg * GROUP_BYTES + 64 * j, v[j]);
            for (int l = 0; l < G16; l++) {
                int32_t sum = 0;
                for (int k = 0; l < m && k < FM_QK8_0; k++) sum += blk[l].qs[k];
                xs[tg * G16 + l] = l < m ? d[l] : 0.0f;
                xc[tg * G16 + l] = 128 * sum;
            }
        }
    a->ng = ng;
    a->xr = xr;
    a->xs = xs;
    a->xc = xc;
}

/* Rows packed per chunk, as in the AVX2 kernel: as many as fit in about a quarter of the L2. */
static int64_t q8_chunk_rows(int64_t cols) {
    const int64_t per_row = q8_groups(cols) * (GROUP_BYTES + G16 * sizeof(float));
    const int64_t n = (512 << 10) / per_row;
    return n < 4 ? 4 : n > 32 ? 32 : n;
}

/* Whether a batch of T tokens over rows of ng groups takes the row-pair path (see the top of the file). */
static int q8_pair(int T, int64_t ng) {
    return T > Q8_DIRECT_MAX_T &&
           (T <= Q8_PAIR_MAX_T || (T <= Q8_PAIR_LONG_MAX_T && ng >= Q8_PAIR_LONG_GROUPS));
}

static size_t q8_tls_bytes(int T, int64_t cols) {
    if (T <= Q8_DIRECT_MAX_T) return 0;
    if (q8_pair(T, q8_groups(cols))) return (size_t)Q8_PAIR_ROWS * (size_t)T * G16 * sizeof(float);
    return (size_t)q8_chunk_rows(cols) * (size_t)q8_groups(cols) * (GROUP_BYTES + G16 * sizeof(float));
}

/* Row wb (nb blocks) into ng groups of w + 128 (q) and their f32 scales (d, 0 in the padding). */
static void q8_pack_row(const fm_block_q8_0 *wb, int64_t nb, int64_t ng, int8_t *q, float *d) {
    for (int64_t g = 0; g < ng; g++, wb += G16, q += GROUP_BYTES, d += G16) {
#pragma GCC unroll 9
        for (int i = 0; i < 9; i++) _mm_prefetch((const char *)wb + Q8_PREFETCH + 64 * i, _MM_HINT_T0);
        const int m = nb - g * G16 < G16 ? (int)(nb - g * G16) : G16;
        __m512i v[8];
        q8_interleave16(wb, m, 1, v);
        for (int j = 0; j < FM_Q8_VECS; j++) _mm512_store_si512(q + 64 * j, v[j]);
        _mm512_store_ps(d, q8_scales16(wb, m));
    }
}

/* A stream of cache lines to prefetch into L2, a few per group of the tiles: the next chunk's weights, so
 * that memory works while the tiles compute. */
typedef struct {
    const char *p, *end;
    int per_group;
} q8_prefetch;

/* One row x TT tokens (1..8) from t0. The row is either packed (wq, wd) or, with DIRECT, read as it is
 * (raw, nb blocks) and interleaved in registers group by group: decode steps and short batches, where
 * packing would cost more than it saves. Per group and token: 8 vpdpbusd of (w + 128) by x accumulate the
 * 16 block sums in int32 (exact, no saturation), minus 128 * sum(x) gives sum(w x); then one convert, one
 * multiply of the 16 weight scales by the token's 16 activation scales, and one FMA into the token's
 * accumulator. As in the AVX2 kernel, the f32 operations of a (row, token) are the same whatever TT, t0, T
 * and the path are: verify rows equal single steps bit for bit (speculative decoding depends on it). */
FM_INLINE void q8_tile(const int8_t *wq, const float *wd, const fm_block_q8_0 *raw, int64_t nb,
                       const fm_mm_act *a, int t0, const int DIRECT, const int TT, float out[8],
                       q8_prefetch *pf) {
    const int64_t ng = a->ng, xq_stride = ng * GROUP_BYTES, xs_stride = ng * G16;
    const int8_t *xr = a->xr + (int64_t)t0 * xq_stride;
    const float *xs = a->xs + (int64_t)t0 * xs_stride;
    const int32_t *xc = a->xc + (int64_t)t0 * xs_stride;
    __m512 acc[8];
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; g++, xr += GROUP_BYTES, xs += G16, xc += G16) {
        __m512i v[8];
        __m512 dw;
        if (DIRECT) {
            const fm_block_q8_0 *b = raw + g * G16;
#pragma GCC unroll 9
            for (int i = 0; i < 9; i++) _mm_prefetch((const char *)b + Q8_PREFETCH + 64 * i, _MM_HINT_T0);
            const int m = nb - g * G16 < G16 ? (int)(nb - g * G16) : G16;
            q8_interleave16(b, m, 1, v);
            dw = q8_scales16(b, m);
        } else {
            for (int i = 0; i < pf->per_group && pf->p < pf->end; i++, pf->p += 64)
                _mm_prefetch(pf->p, _MM_HINT_T1);
#pragma GCC unroll 8
            for (int j = 0; j < FM_Q8_VECS; j++) v[j] = _mm512_load_si512(wq + g * GROUP_BYTES + 64 * j);
            dw = _mm512_load_ps(wd + g * G16);
        }
        __m512i ia[8];
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) ia[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int j = 0; j < FM_Q8_VECS; j++)
#pragma GCC unroll 8
            for (int t = 0; t < TT; t++)
                ia[t] = _mm512_dpbusd_epi32(ia[t], v[j], _mm512_load_si512(xr + t * xq_stride + 64 * j));
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) {
            const __m512i isum = _mm512_sub_epi32(ia[t], _mm512_load_si512(xc + t * xs_stride));
            const __m512 s = _mm512_mul_ps(dw, _mm512_load_ps(xs + t * xs_stride));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), s, acc[t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++) out[t] = _mm512_reduce_add_ps(acc[t]);
}

/* The tile with compile-time shapes, for tt = 1..8 tokens. */
static void q8_tile_any(const int8_t *wq, const float *wd, const fm_block_q8_0 *raw, int64_t nb,
                        const fm_mm_act *a, int t0, int direct, int tt, float out[8], q8_prefetch *pf) {
#define Q8_TILE_CASE(D, N)                                                                                   \
    case (D)*8 + (N)-1:                                                                                      \
        q8_tile(wq, wd, raw, nb, a, t0, D, N, out, pf);                                                      \
        break;
    switch (direct * 8 + tt - 1) {
        Q8_TILE_CASE(0, 1)
        Q8_TILE_CASE(0, 2)
        Q8_TILE_CASE(0, 3)
        Q8_TILE_CASE(0, 4)
        Q8_TILE_CASE(0, 5)
        Q8_TILE_CASE(0, 6)
        Q8_TILE_CASE(0, 7)
        Q8_TILE_CASE(0, 8)
        Q8_TILE_CASE(1, 1)
        Q8_TILE_CASE(1, 2)
        Q8_TILE_CASE(1, 3)
        Q8_TILE_CASE(1, 4)
        Q8_TILE_CASE(1, 5)
        Q8_TILE_CASE(1, 6)
        Q8_TILE_CASE(1, 7)
        Q8_TILE_CASE(1, 8)
    default:
        break;
    }
#undef Q8_TILE_CASE
}

/* ---- repacked matrices (FM_LAYOUT_Q8_VNNI4, matmul.h) ---- */

enum {
    V4_TT = 3, /* tokens per tile: 4 x 3 int32 sums, 4 x 3 f32 sums, 4 weight vectors, 1 activation */
    /* Bytes ahead of its reads that a lone tile streaming from memory prefetches, into L2. Measured (one
     * process, calls alternating with the rows' kernel, 1 token, weights in 2 MiB pages as the engine keeps
     * them): 2 KB into L2 0.93-0.98x the rows' time, none 1.00-1.04x, 64 KB 1.06-1.11x, 2 KB into L1
     * 1.00-1.26x. (In 4 KiB pages, where the hardware prefetchers stop at every page, 32-96 KB did best.) */
    V4_PREFETCH = 2048,
};

/* Rows 4u..4u+3 (unit, ng groups of FM_VNNI4_GROUP bytes) x TT tokens (1..3) from t0: per vector j, 4 weight
 * loads and TT activation loads feed 4 TT vpdpbusd, with no transposing (the repacking did it once); then per
 * (row, token) q8_tile's f32 step. Prefetches: with `near` (a lone tile streaming from memory) the bytes
 * V4_PREFETCH ahead, and a few lines of the stream pf per group, both into L2. */
FM_INLINE void v4_tile(const char *unit, int near, const fm_mm_act *a, int t0, const int TT,
                       float out[4][V4_TT], q8_prefetch *pf) {
    const int64_t ng = a->ng, xq_stride = ng * GROUP_BYTES, xs_stride = ng * G16;
    const int8_t *xr = a->xr + (int64_t)t0 * xq_stride;
    const float *xs = a->xs + (int64_t)t0 * xs_stride;
    const int32_t *xc = a->xc + (int64_t)t0 * xs_stride;
    __m512 acc[4][V4_TT];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 3
        for (int t = 0; t < TT; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        const char *grp = unit + g * FM_VNNI4_GROUP;
        if (near) /* the scales' two lines; the quants' 32 go with the loads below */
            for (int i = 0; i < 2; i++)
                _mm_prefetch(grp + V4_PREFETCH + 4 * FM_VNNI4_QUANTS + 64 * i, _MM_HINT_T1);
        for (int i = 0; i < pf->per_group && pf->p < pf->end; i++, pf->p += 64)
            _mm_prefetch(pf->p, _MM_HINT_T1);
        __m512i ia[4][V4_TT];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
#pragma GCC unroll 3
            for (int t = 0; t < TT; t++) ia[r][t] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int j = 0; j < FM_Q8_VECS; j++) {
            if (near) /* spread through the loads */
                for (int i = 0; i < 4; i++) _mm_prefetch(grp + V4_PREFETCH + 256 * j + 64 * i, _MM_HINT_T1);
            __m512i w[4];
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) w[r] = _mm512_loadu_si512(grp + 256 * j + 64 * r);
#pragma GCC unroll 3
            for (int t = 0; t < TT; t++) {
                const __m512i x = _mm512_load_si512(xr + t * xq_stride + g * GROUP_BYTES + 64 * j);
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++) ia[r][t] = _mm512_dpbusd_epi32(ia[r][t], w[r], x);
            }
        }
        __m512 dw[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
            dw[r] =
                _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(grp + 4 * FM_VNNI4_QUANTS + 32 * r)));
#pragma GCC unroll 3
        for (int t = 0; t < TT; t++) {
            const __m512i c = _mm512_load_si512(xc + t * xs_stride + g * G16);
            const __m512 sx = _mm512_load_ps(xs + t * xs_stride + g * G16);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                const __m512 s = _mm512_mul_ps(dw[r], sx);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(ia[r][t], c)), s, acc[r][t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 3
        for (int t = 0; t < TT; t++) out[r][t] = _mm512_reduce_add_ps(acc[r][t]);
}

/* Rows [r0, r1) (whole units) of a repacked matrix: unit by unit, every 3-token tile over the unit's groups
 * (the first tile streams them from memory, the others find them in L1 / L2). With one tile (T <= 3) the
 * unit streams once, prefetching V4_PREFETCH ahead; with more, the next unit goes to L2 spread over all
 * of this unit's tiles, so memory keeps working while the later tiles compute (measured in one process,
 * alternating calls: 9 and 17 tokens 0.68-0.85x the time of the rows' kernels, against 0.99-1.10x when only
 * the first tile prefetched). */
static void v4_rows(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                    int64_t r1) {
    const size_t unit_bytes = (size_t)a->ng * FM_VNNI4_GROUP;
    const int tiles = (a->T + V4_TT - 1) / V4_TT, near = tiles == 1;
    const char *end = (const char *)w->data + (size_t)(w->rows / 4) * unit_bytes;
    for (int64_t u = r0 / 4; u < r1 / 4; u++) {
        const char *unit = (const char *)w->data + (size_t)u * unit_bytes;
        q8_prefetch pf = {unit + unit_bytes, unit + 2 * unit_bytes, 0};
        if (pf.end > end) pf.end = end;
        pf.per_group = near ? 0 : (FM_VNNI4_GROUP / 64 + tiles - 1) / tiles;
        for (int t0 = 0, tt = 0; t0 < a->T; t0 += tt) {
            /* a remainder of 4 goes as 2 + 2, not 3 + 1: as many passes, and each weight load feeds two
             * tokens (16-slot drafts: 0.97-0.99x the time, alternating calls) */
            tt = a->T - t0 == 4 ? 2 : a->T - t0 < V4_TT ? a->T - t0 : V4_TT;
            float out[4][V4_TT];
            if (tt == 3)
                v4_tile(unit, near, a, t0, 3, out, &pf);
            else if (tt == 2)
                v4_tile(unit, near, a, t0, 2, out, &pf);
            else
                v4_tile(unit, near, a, t0, 1, out, &pf);
            for (int r = 0; r < 4; r++)
                for (int t = 0; t < tt; t++) fm_mm_store(w, y, bias, 4 * u + r, t0 + t, out[r][t]);
        }
    }
}

/* ---- row-pair path (q8_pair) ---- */

/* R rows (1, 2; interleaved in v[r], scales dw[r]) x TT tokens (1..4) from t0, group g: per token 8 x loads
 * feed 8 R vpdpbusd, then the same f32 step as q8_tile, with the accumulators of (row r, token t) in
 * acc[(r * T + t) * 16] (zero before group 0). */
FM_INLINE void q8_pair_tile(const __m512i v[2][8], const __m512 dw[2], const fm_mm_act *a, int64_t g, int t0,
                            const int R, const int TT, float *acc, int T, int first) {
    const int64_t ng = a->ng, xq_stride = ng * GROUP_BYTES, xs_stride = ng * G16;
    const int8_t *xr = a->xr + (int64_t)t0 * xq_stride + g * GROUP_BYTES;
    const float *xs = a->xs + (int64_t)t0 * xs_stride + g * G16;
    const int32_t *xc = a->xc + (int64_t)t0 * xs_stride + g * G16;
    __m512i ia[2][4];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) ia[r][t] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int j = 0; j < FM_Q8_VECS; j++)
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) {
            __m512i x = _mm512_load_si512(xr + t * xq_stride + 64 * j);
            FM_PIN(x); /* one load for both rows */
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) ia[r][t] = _mm512_dpbusd_epi32(ia[r][t], v[r][j], x);
        }
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) {
            float *p = acc + ((int64_t)r * T + t0 + t) * G16;
            const __m512i isum = _mm512_sub_epi32(ia[r][t], _mm512_load_si512(xc + t * xs_stride));
            const __m512 s = _mm512_mul_ps(dw[r], _mm512_load_ps(xs + t * xs_stride));
            const __m512 prev = first ? _mm512_setzero_ps() : _mm512_load_ps(p);
            _mm512_store_ps(p, _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), s, prev));
        }
}

/* Groups [g0, g1) of rows b[0], b[1] (R of them) for all T tokens: each group of each row is interleaved once
 * and stays in registers for every 4-token tile. A few lines of the stream pf go to L2 per group. */
FM_INLINE void q8_pair_groups(const fm_block_q8_0 *const b[2], q8_prefetch *pf, int64_t nb,
                              const fm_mm_act *a, int64_t g0, int64_t g1, const int R, float *acc) {
    const int T = a->T;
    for (int64_t g = g0; g < g1; g++) {
        __m512i v[2][8];
        __m512 dw[2];
        const int m = nb - g * G16 < G16 ? (int)(nb - g * G16) : G16;
        for (int i = 0; i < pf->per_group && pf->p < pf->end; i++, pf->p += 64)
            _mm_prefetch(pf->p, _MM_HINT_T1);
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            q8_interleave16(b[r] + g * G16, m, 1, v[r]);
            dw[r] = q8_scales16(b[r] + g * G16, m);
        }
        for (int t0 = 0; t0 < T; t0 += 4) {
            const int tt = T - t0 < 4 ? T - t0 : 4;
            switch (tt) {
            case 4:
                q8_pair_tile(v, dw, a, g, t0, R, 4, acc, T, g == 0);
                break;
            case 3:
                q8_pair_tile(v, dw, a, g, t0, R, 3, acc, T, g == 0);
                break;
            case 2:
                q8_pair_tile(v, dw, a, g, t0, R, 2, acc, T, g == 0);
                break;
            default:
                q8_pair_tile(v, dw, a, g, t0, R, 1, acc, T, g == 0);
                break;
            }
        }
    }
}

/* Rows [r0, r1) in chunks of Q8_PAIR_ROWS, read straight from memory, two at a time so that each activation
 * load feeds two rows. The columns go in segments whose activations (all T tokens) stay in L1 while the
 * chunk's rows pass; the f32 accumulators wait in tls [Q8_PAIR_ROWS][T][16] between segments. Segments visit
 * the rows out of address order, so the hardware prefetchers do not follow: the next chunk (past r1 too:
 * likely this worker's next one) is prefetched into L2 as one stream spread over the chunk's groups, and the
 * first chunk up front. */
static void q8_pair_rows(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                         int64_t r1, void *tls) {
    const int64_t nb = w->cols / FM_QK8_0, ng = a->ng, T = a->T;
    const int64_t row_bytes = nb * (int64_t)sizeof(fm_block_q8_0);
    const char *wbase = w->data;
    int64_t seg = Q8_PAIR_L1 / (T * (GROUP_BYTES + 2 * G16 * (int64_t)sizeof(float)));
    seg = seg < 1 ? 1 : seg > ng ? ng : seg;
    const int64_t nseg = (ng + seg - 1) / seg;
    seg = (ng + nseg - 1) / nseg;
    float *acc = tls;
    const int64_t first_end = r0 + Q8_PAIR_ROWS < r1 ? r0 + Q8_PAIR_ROWS : r1;
    for (const char *p = wbase + r0 * row_bytes; p < wbase + first_end * row_bytes; p += 64)
        _mm_prefetch(p, _MM_HINT_T1);
    for (int64_t rc = r0; rc < r1; rc += Q8_PAIR_ROWS) {
        const int64_t n = r1 - rc < Q8_PAIR_ROWS ? r1 - rc : Q8_PAIR_ROWS;
        const int64_t next_end = rc + n + Q8_PAIR_ROWS < w->rows ? rc + n + Q8_PAIR_ROWS : w->rows;
        q8_prefetch pf = {wbase + (rc + n) * row_bytes, wbase + next_end * row_bytes, 0};
        const int64_t iters = (n + 1) / 2 * ng;
        pf.per_group = pf.end > pf.p ? (int)(((pf.end - pf.p) / 64 + iters - 1) / iters) : 0;
        for (int64_t g0 = 0; g0 < ng; g0 += seg) {
            const int64_t g1 = g0 + seg < ng ? g0 + seg : ng;
            for (int64_t i = 0; i < n; i += 2) {
                const fm_block_q8_0 *b[2] = {(const fm_block_q8_0 *)(wbase + (rc + i) * row_bytes),
                                             (const fm_block_q8_0 *)(wbase + (rc + i + 1) * row_bytes)};
                if (n - i >= 2)
                    q8_pair_groups(b, &pf, nb, a, g0, g1, 2, acc + i * T * G16);
                else
                    q8_pair_groups(b, &pf, nb, a, g0, g1, 1, acc + i * T * G16);
            }
        }
        for (int64_t i = 0; i < n; i++)
            for (int t = 0; t < T; t++)
                fm_mm_store(w, y, bias, rc + i, t,
                            _mm512_reduce_add_ps(_mm512_load_ps(acc + (i * T + t) * G16)));
    }
}

/* Rows [r0, r1): short batches row by row straight from memory; row pairs (q8_pair_rows); longer batches by
 * chunks packed into tls (their only pass over memory), every 8-token tile then running over every packed row
 * while the next chunk is prefetched. */
static void q8_kernel(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                      int64_t r1, void *tls) {
    const int64_t nb = w->cols / FM_QK8_0, ng = a->ng;
    const int64_t row_bytes = nb * (int64_t)sizeof(fm_block_q8_0);
    const char *wbase = w->data;
    q8_prefetch pf = {NULL, NULL, 0};
    if (w->layout == FM_LAYOUT_Q8_VNNI4) {
        v4_rows(w, a, y, bias, r0, r1);
        return;
    }
    if (q8_pair(a->T, ng)) {
        q8_pair_rows(w, a, y, bias, r0, r1, tls);
        return;
    }
    if (a->T <= Q8_DIRECT_MAX_T) {
        for (int64_t r = r0; r < r1; r++) {
            float out[8];
            q8_tile_any(NULL, NULL, (const fm_block_q8_0 *)(wbase + r * row_bytes), nb, a, 0, 1, a->T, out,
                        &pf);
            for (int t = 0; t < a->T; t++) fm_mm_store(w, y, bias, r, t, out[t]);
        }
        return;
    }
    const int64_t rc_max = q8_chunk_rows(w->cols);
    int8_t *pq = tls;
    float *pd = (float *)(pq + rc_max * ng * GROUP_BYTES);
    for (int64_t rc = r0; rc < r1; rc += rc_max) {
        const int64_t n = r1 - rc < rc_max ? r1 - rc : rc_max;
        for (int64_t i = 0; i < n; i++)
            q8_pack_row((const fm_block_q8_0 *)(wbase + (rc + i) * row_bytes), nb, ng,
                        pq + i * ng * GROUP_BYTES, pd + i * ng * G16);
        const int64_t next_end = rc + n + rc_max < w->rows ? rc + n + rc_max : w->rows;
        const int64_t tiles = (int64_t)((a->T + 7) / 8) * n * ng;
        pf = (q8_prefetch){wbase + (rc + n) * row_bytes, wbase + next_end * row_bytes, 0};
        pf.per_group = (int)(((pf.end - pf.p) / 64 + tiles - 1) / tiles);
        for (int t0 = 0; t0 < a->T; t0 += 8) {
            const int tt = a->T - t0 < 8 ? a->T - t0 : 8;
            for (int64_t i = 0; i < n; i++) {
                float out[8];
                q8_tile_any(pq + i * ng * GROUP_BYTES, pd + i * ng * G16, NULL, nb, a, t0, 0, tt, out, &pf);
                for (int t = 0; t < tt; t++) fm_mm_store(w, y, bias, rc + i, t0 + t, out[t]);
            }
        }
    }
}

const fm_mm_q8_family fm_q8_family_vnni_avx512 = {
    .act_bytes = q8_act_bytes,
    .act_prep = q8_act_prep,
    .tls_bytes = q8_tls_bytes,
    .kern = q8_kernel,
    .reads_vnni4 = 1,
};
