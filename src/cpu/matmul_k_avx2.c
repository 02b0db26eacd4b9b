/* matmul_k_avx2.c: the AVX2 K-quant kernels (Q4_K, Q5_K, Q6_K weights x Q8_K activations).
 *
 * Integer part, per super-block of 256 weights and token (exact, so any order gives quant_k.c's sums):
 * the weights are unpacked to unsigned bytes (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63; Q6_K's offset of 32 is
 * taken out through the activations' bsums), vpmaddubsw multiplies them by the int8 activations into int16
 * pairs (at most 2 * 63 * 127: no saturation), and vpmaddwd by the sub-block's scale widens them to int32:
 * 8 lanes of partial sums per (row, token). The Q4_K / Q5_K mins term is one vpmaddwd of the 16 bsums by
 * the mins, likewise 8 lanes.
 *
 * f32 part: 8 (row, token) pairs are a group; one transposing tree of vphaddd turns their 8 partial-sum
 * vectors into one vector of their 8 isums (msums likewise), and the group's f32 accumulator takes
 *   s += dx * (dw * isum - dmin * msum)
 * in one lane per pair, block by block: per lane the scalar kernel's operations in its order. So a result
 * does not depend on T, the tile or the lane it falls in (speculative decoding's verify rows equal single
 * steps bit for bit), and it equals the scalar kernel's.
 *
 * Tiles: 8 rows at a time; their tokens in tiles of up to 8. A tile of TP tokens (1, 2, 4 or 8 lanes per
 * row) unpacks each row's super-block once for its tokens: 8 rows x 1 token for decode steps, 8 x 2, 8 x 4,
 * and 4 rows x 8 tokens (twice) for longer batches. While the first token tile of 8 rows runs, the next 8
 * rows are prefetched into L2. */
#include <immintrin.h>
#include <string.h>

#include "cpu/matmul_kernels.h"
#include "cpu/simd_avx.h"

enum {
    KQ_Q4 = 0,
    KQ_Q5 = 1,
    KQ_Q6 = 2,
    KQ_ROWS = 8,  /* rows per row tile */
    KQ_GROUP = 8, /* (row, token) lanes per reduction group */
};

static int kq_block_bytes(const int kind) {
    return kind == KQ_Q4   ? (int)sizeof(fm_block_q4_K)
           : kind == KQ_Q5 ? (int)sizeof(fm_block_q5_K)
                           : (int)sizeof(fm_block_q6_K);
}

/* The 8 6-bit scales and 8 mins of a Q4_K / Q5_K block as bytes (fm_k_scale_min for all j at once): j < 4
 * in the low 6 bits of bytes j (scales) and j + 4 (mins); j >= 4 in the nibbles of byte j + 4, with their
 * top 2 bits in the top bits of bytes j - 4 (scales) and j (mins). */
FM_INLINE void kq_scales_mins(const uint8_t *p, uint64_t *sc, uint64_t *mn) {
    uint32_t a, b, c;
    memcpy(&a, p, 4);
    memcpy(&b, p + 4, 4);
    memcpy(&c, p + 8, 4);
    const uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, bits45 = 0x30303030;
    const uint32_t s47 = (c & low4) | ((a >> 2) & bits45), m47 = ((c >> 4) & low4) | ((b >> 2) & bits45);
    *sc = (uint64_t)(a & low6) | (uint64_t)s47 << 32;
    *mn = (uint64_t)(b & low6) | (uint64_t)m47 << 32;
}

/* vpshufb masks (as int16 lanes: low byte picked, high byte zeroed) on a register holding bytes b0..b7 in
 * each 64-bit half: b_j in every int16 lane (sub-block j's scale); b_j in int16 lanes 2j, 2j + 1 (a min
 * against its sub-block's two bsums). */
FM_INLINE __m256i kq_pick16(int j) {
    return _mm256_set1_epi16((short)(0xFF00 | j));
}
FM_INLINE __m256i kq_pick_mins(void) {
    return _mm256_setr_epi16((short)0xFF00, (short)0xFF00, (short)0xFF01, (short)0xFF01, (short)0xFF02,
                             (short)0xFF02, (short)0xFF03, (short)0xFF03, (short)0xFF04, (short)0xFF04,
                             (short)0xFF05, (short)0xFF05, (short)0xFF06, (short)0xFF06, (short)0xFF07,
                             (short)0xFF07);
}
/* Q6_K: on a register holding int16 scales s0..s7 in each 128-bit half, s_2i in the low half's 8 lanes and
 * s_2i+1 in the high half's: the scales of the two 16-weight sub-blocks of a 32-byte vector. */
FM_INLINE __m256i kq_pick_q6(int i) {
    return _mm256_setr_m128i(_mm_set1_epi16((short)((4 * i) | (4 * i + 1) << 8)),
                             _mm_set1_epi16((short)((4 * i + 2) | (4 * i + 3) << 8)));
}

FM_INLINE __m256i kq_load(const void *p) {
    return _mm256_loadu_si256((const __m256i *)p);
}

/* Q5_K's fifth bits for one 32-weight half-chunk: bit k of each qh byte moved to bit 4 (16-bit shifts keep
 * each byte's bit within its byte once masked). */
FM_INLINE __m256i kq_q5_high(__m256i qh, const int k) {
    const __m256i bit4 = _mm256_set1_epi8(0x10);
    if (k <= 4) return _mm256_and_si256(_mm256_slli_epi16(qh, 4 - k), bit4);
    return _mm256_and_si256(_mm256_srli_epi16(qh, k - 4), bit4);
}

/* One row's super-block (blk) against TP tokens (nt of them; x blocks xb[t * xstride]): per token t, the
 * isum partials li[t] (8 lanes summing to quant_k.c's isum, Q6_K's offset included) and the msum partials
 * lm[t] (Q4_K / Q5_K). Tokens t >= nt get zeros. */
FM_INLINE void kq_block(const int kind, const int TP, const uint8_t *blk, const fm_block_q8_K *xb,
                        int64_t xstride, int nt, __m256i *li, __m256i *lm) {
    const __m256i nib = _mm256_set1_epi8(0x0F);
    __m256i acc[8];
#pragma GCC unroll 8
    for (int t = 0; t < TP; t++) acc[t] = _mm256_setzero_si256();
    if (kind != KQ_Q6) {
        uint64_t sc8, mn8;
        kq_scales_mins(blk + 4, &sc8, &mn8);
        const __m256i scb = _mm256_set1_epi64x((long long)sc8);
        const uint8_t *qs = blk + (kind == KQ_Q4 ? 16 : 48);
        const __m256i qh = kind == KQ_Q5 ? kq_load(blk + 16) : _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const __m256i v = kq_load(qs + 32 * c);
            __m256i lo = _mm256_and_si256(v, nib), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
            if (kind == KQ_Q5) {
                lo = _mm256_or_si256(lo, kq_q5_high(qh, 2 * c));
                hi = _mm256_or_si256(hi, kq_q5_high(qh, 2 * c + 1));
            }
            const __m256i s0 = _mm256_shuffle_epi8(scb, kq_pick16(2 * c));
            const __m256i s1 = _mm256_shuffle_epi8(scb, kq_pick16(2 * c + 1));
#pragma GCC unroll 8
            for (int t = 0; t < TP; t++) {
                if (t >= nt) break;
                const int8_t *x = xb[t * xstride].qs + 64 * c;
                const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, kq_load(x)), s0);
                const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, kq_load(x + 32)), s1);
                acc[t] = _mm256_add_epi32(acc[t], _mm256_add_epi32(p0, p1));
            }
        }
        const __m256i mins = _mm256_shuffle_epi8(_mm256_set1_epi64x((long long)mn8), kq_pick_mins());
#pragma GCC unroll 8
        for (int t = 0; t < TP; t++) {
            li[t] = acc[t];
            lm[t] = t < nt ? _mm256_madd_epi16(kq_load(xb[t * xstride].bsums), mins) : _mm256_setzero_si256();
        }
        return;
    }
    /* Q6_K: ql [128], qh [64], scales [16], d. Weight 128h + 32i + l: low 4 bits in ql[64h + l + 32 (i & 1)]
     * (low nibble for i < 2, high for i >= 2), high 2 bits = bits 2i, 2i + 1 of qh[32h + l]. */
    const uint8_t *ql = blk, *qhp = blk + 128;
    const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
    const __m256i sc_lo = _mm256_permute2x128_si256(s16, s16, 0x00),
                  sc_hi = _mm256_permute2x128_si256(s16, s16, 0x11);
    const __m256i bits45 = _mm256_set1_epi8(0x30);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) { /* weights 64c .. 64c + 63: half h = c / 2, i = 2 (c & 1) and that + 1 */
        const int h = c / 2;
        const __m256i l0 = kq_load(ql + 64 * h), l1 = kq_load(ql + 64 * h + 32), q = kq_load(qhp + 32 * h);
        __m256i w0, w1;
        if (c % 2 == 0) {
            w0 =
                _mm256_or_si256(_mm256_and_si256(l0, nib), _mm256_and_si256(_mm256_slli_epi16(q, 4), bits45));
            w1 =
                _mm256_or_si256(_mm256_and_si256(l1, nib), _mm256_and_si256(_mm256_slli_epi16(q, 2), bits45));
        } else {
            w0 =
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), nib), _mm256_and_si256(q, bits45));
            w1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), nib),
                                 _mm256_and_si256(_mm256_srli_epi16(q, 2), bits45));
        }
        const __m256i src = c < 2 ? sc_lo : sc_hi; /* vector k = 2c, 2c + 1: sub-blocks 4c .. 4c + 3 */
        const __m256i s0 = _mm256_shuffle_epi8(src, kq_pick_q6((2 * c) % 4));
        const __m256i s1 = _mm256_shuffle_epi8(src, kq_pick_q6((2 * c + 1) % 4));
#pragma GCC unroll 8
        for (int t = 0; t < TP; t++) {
            if (t >= nt) break;
            const int8_t *x = xb[t * xstride].qs + 64 * c;
            const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(w0, kq_load(x)), s0);
            const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(w1, kq_load(x + 32)), s1);
            acc[t] = _mm256_add_epi32(acc[t], _mm256_add_epi32(p0, p1));
        }
    }
    /* sum_j sc_j * 32 * bsum_j, subtracted: (q - 32) x summed as q x - 32 x */
    const __m256i off = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(s16, 5));
#pragma GCC unroll 8
    for (int t = 0; t < TP; t++) {
        li[t] = t < nt ? _mm256_add_epi32(acc[t], _mm256_madd_epi16(kq_load(xb[t * xstride].bsums), off))
                       : _mm256_setzero_si256();
        lm[t] = _mm256_setzero_si256();
    }
}

/* v[0..7] (8 int32 lanes each) to the vector of their 8 lane sums, in order. */
FM_INLINE __m256i kq_tree(const __m256i v[8]) {
    const __m256i h01 = _mm256_hadd_epi32(v[0], v[1]), h23 = _mm256_hadd_epi32(v[2], v[3]);
    const __m256i h45 = _mm256_hadd_epi32(v[4], v[5]), h67 = _mm256_hadd_epi32(v[6], v[7]);
    const __m256i q0 = _mm256_hadd_epi32(h01, h23), q1 = _mm256_hadd_epi32(h45, h67); /* halves: 0-3 | 4-7 */
    return _mm256_add_epi32(_mm256_permute2x128_si256(q0, q1, 0x21), _mm256_blend_epi32(q0, q1, 0xF0));
}

/* A stream of cache lines to prefetch into L2 (the next row tile), a few per block of a tile. */
typedef struct {
    const char *p, *end;
    int per_block;
} kq_prefetch;

/* Rows wr + r * row_bytes (r < nr of 8 NG / TP) x tokens xk[t * nb] (t < nt of TP), all nb blocks.
 * Lane l of group g is row g * 8 / TP + l / TP, token l % TP. out[g * 8 + l]: the lane's dot product. */
FM_INLINE void kq_tile(const int kind, const int TP, const int NG, const uint8_t *wr, int64_t row_bytes,
                       int nr, const fm_block_q8_K *xk, int64_t nb, int nt, float *out, kq_prefetch *pf) {
    const int RG = KQ_GROUP / TP, bb = kq_block_bytes(kind);
    const __m256i lane_row =
        _mm256_setr_epi32(0 / TP, 1 / TP, 2 / TP, 3 / TP, 4 / TP, 5 / TP, 6 / TP, 7 / TP);
    __m256 s[4];
#pragma GCC unroll 4
    for (int g = 0; g < NG; g++) s[g] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        for (int i = 0; i < pf->per_block && pf->p < pf->end; i++, pf->p += 64)
            _mm_prefetch(pf->p, _MM_HINT_T1);
        const fm_block_q8_K *xb = xk + b;
        float dxt[8];
#pragma GCC unroll 8
        for (int t = 0; t < TP; t++) dxt[t] = t < nt ? xb[t * nb].d : 0.0f;
        __m256 dx;
        if (TP == 8)
            dx = _mm256_setr_ps(dxt[0], dxt[1], dxt[2], dxt[3], dxt[4], dxt[5], dxt[6], dxt[7]);
        else if (TP == 4)
            dx = _mm256_setr_ps(dxt[0], dxt[1], dxt[2], dxt[3], dxt[0], dxt[1], dxt[2], dxt[3]);
        else if (TP == 2)
            dx = _mm256_setr_ps(dxt[0], dxt[1], dxt[0], dxt[1], dxt[0], dxt[1], dxt[0], dxt[1]);
        else
            dx = _mm256_set1_ps(dxt[0]);
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) {
            __m256i li[8], lm[8];
            uint64_t d16[2] = {0, 0}, m16[2] = {0, 0};
#pragma GCC unroll 8
            for (int rr = 0; rr < RG; rr++) {
                const int r = g * RG + rr;
                if (r >= nr) {
#pragma GCC unroll 8
                    for (int t = 0; t < TP; t++) li[rr * TP + t] = lm[rr * TP + t] = _mm256_setzero_si256();
                    continue;
                }
                const uint8_t *blk = wr + r * row_bytes + b * bb;
                kq_block(kind, TP, blk, xb, nb, nt, li + rr * TP, lm + rr * TP);
                uint16_t d, dmin = 0;
                memcpy(&d, blk + (kind == KQ_Q6 ? 208 : 0), 2);
                if (kind != KQ_Q6) memcpy(&dmin, blk + 2, 2);
                d16[rr / 4] |= (uint64_t)d << (16 * (rr % 4));
                m16[rr / 4] |= (uint64_t)dmin << (16 * (rr % 4));
            }
            __m256 dw = _mm256_cvtph_ps(_mm_set_epi64x((long long)d16[1], (long long)d16[0]));
            if (TP > 1) dw = _mm256_permutevar8x32_ps(dw, lane_row);
            const __m256 isum = _mm256_cvtepi32_ps(kq_tree(li));
            __m256 v;
            if (kind == KQ_Q6) {
                v = _mm256_mul_ps(dw, isum); /* dw * isum - 0 * 0: the same bits */
            } else {
                __m256 dm = _mm256_cvtph_ps(_mm_set_epi64x((long long)m16[1], (long long)m16[0]));
                if (TP > 1) dm = _mm256_permutevar8x32_ps(dm, lane_row);
                v = _mm256_sub_ps(_mm256_mul_ps(dw, isum),
                                  _mm256_mul_ps(dm, _mm256_cvtepi32_ps(kq_tree(lm))));
            }
            s[g] = _mm256_add_ps(s[g], _mm256_mul_ps(dx, v));
        }
    }
#pragma GCC unroll 4
    for (int g = 0; g < NG; g++) _mm256_storeu_ps(out + 8 * g, s[g]);
}

/* The tiles with compile-time shapes, per kind. */
#define KQ_TILE_FN(kind, TP, NG)                                                                             \
    static void kq_tile_##kind##_##TP(const uint8_t *wr, int64_t row_bytes, int nr, const fm_block_q8_K *xk, \
                                      int64_t nb, int nt, float *out, kq_prefetch *pf) {                     \
        kq_tile(kind, TP, NG, wr, row_bytes, nr, xk, nb, nt, out, pf);                                       \
    }
#define KQ_TILE_FNS(kind)                                                                                    \
    KQ_TILE_FN(kind, 1, 1)                                                                                   \
    KQ_TILE_FN(kind, 2, 2)                                                                                   \
    KQ_TILE_FN(kind, 4, 4)                                                                                   \
    KQ_TILE_FN(kind, 8, 4)
KQ_TILE_FNS(KQ_Q4)
KQ_TILE_FNS(KQ_Q5)
KQ_TILE_FNS(KQ_Q6)
#undef KQ_TILE_FNS
#undef KQ_TILE_FN

typedef void (*kq_tile_fn)(const uint8_t *, int64_t, int, const fm_block_q8_K *, int64_t, int, float *,
                           kq_prefetch *);
static const kq_tile_fn k_tiles[3][4] = {
    {kq_tile_KQ_Q4_1, kq_tile_KQ_Q4_2, kq_tile_KQ_Q4_4, kq_tile_KQ_Q4_8},
    {kq_tile_KQ_Q5_1, kq_tile_KQ_Q5_2, kq_tile_KQ_Q5_4, kq_tile_KQ_Q5_8},
    {kq_tile_KQ_Q6_1, kq_tile_KQ_Q6_2, kq_tile_KQ_Q6_4, kq_tile_KQ_Q6_8},
};

/* Rows [r0, r1) by tiles of 8 rows; each tile's tokens in tiles of 8 (as 2 x 4 rows), 4, 2 or 1. */
static void kq_rows(const int kind, const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias,
                    int64_t r0, int64_t r1) {
    const int64_t nb = w->cols / FM_QK_K, row_bytes = nb * kq_block_bytes(kind);
    const uint8_t *base = w->data;
    const int T = a->T;
    for (int64_t rt = r0; rt < r1; rt += KQ_ROWS) {
        const int nr = r1 - rt < KQ_ROWS ? (int)(r1 - rt) : KQ_ROWS;
        /* the next 8 rows (past r1 too: likely this worker's next chunk), spread over the first token tile */
        const int64_t next_end = rt + 2 * KQ_ROWS < w->rows ? rt + 2 * KQ_ROWS : w->rows;
        kq_prefetch pf = {(const char *)base + (rt + nr) * row_bytes,
                          (const char *)base + next_end * row_bytes, 0};
        if (pf.end > pf.p) pf.per_block = (int)(((pf.end - pf.p) / 64 + nb - 1) / nb);
        for (int t0 = 0; t0 < T;) {
            const int n = T - t0;
            const int sel = n >= 5 ? 3 : n >= 3 ? 2 : n - 1; /* TP = 8, 4, 2, 1 */
            const int tp = 1 << sel, nt = n < tp ? n : tp;
            const fm_block_q8_K *xk = a->xk + (int64_t)t0 * nb;
            float out[32];
            const int parts = sel == 3 ? 2 : 1, rows_per = KQ_ROWS / parts;
            for (int p = 0; p < parts; p++) {
                const int prow = p * rows_per, pnr = nr - prow < rows_per ? nr - prow : rows_per;
                if (pnr <= 0) break;
                k_tiles[kind][sel](base + (rt + prow) * row_bytes, row_bytes, pnr, xk, nb, nt, out, &pf);
                for (int r = 0; r < pnr; r++)
                    for (int t = 0; t < nt; t++)
                        fm_mm_store(w, y, bias, rt + prow + r, t0 + t, out[r * tp + t]);
            }
            t0 += nt;
        }
    }
}

void fm_mm_q4_K_avx2(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                     int64_t r1, void *tls) {
    (void)tls;
    kq_rows(KQ_Q4, w, a, y, bias, r0, r1);
}

void fm_mm_q5_K_avx2(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                     int64_t r1, void *tls) {
    (void)tls;
    kq_rows(KQ_Q5, w, a, y, bias, r0, r1);
}

void fm_mm_q6_K_avx2(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                     int64_t r1, void *tls) {
    (void)tls;
    kq_rows(KQ_Q6, w, a, y, bias, r0, r1);
}
