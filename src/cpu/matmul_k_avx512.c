/* matmul_k_avx512.c: the AVX-512 VNNI K-quant kernels (Q4_K, Q5_K, Q6_K weights x Q8_K activations); run
 * only after matmul.c checked avx512vnni (without it the AVX-512 level takes the AVX2 ones).
 *
 * Same scheme as matmul_k_avx2.c (read its top comment first): exact integer sums per super-block and
 * token, then per (row, token) lane the scalar kernel's f32 steps, block by block, in groups of 8 lanes; so
 * results are those of the scalar kernel bit for bit, whatever T and the tile. What differs is the integer
 * part. A row's super-block is unpacked once into 4 zmm registers of unsigned bytes (64 weights each, the
 * layout of the activations' 64-byte quarters) and stays there for all the tile's tokens; per token:
 * - 4 vpdpbusd (bytes x int8 activations, 4 products per int32 lane, no saturation) leave 64 sums of 4
 *   products, each within int16 (|sum| <= 4 * 63 * 127);
 * - 2 vpackssdw pack them to int16 (exact), and vpmaddwd + vpdpwssd multiply them by their sub-blocks'
 *   scales and add them into 16 int32 lanes, folded to 8 for the reduction tree.
 * That is 6 multiply instructions per (row, token, super-block) against the AVX2 kernel's 16 (vpmaddubsw +
 * vpmaddwd per 32 weights). The mins (Q4_K, Q5_K) and Q6_K's offset of 32 go through the bsums as there,
 * Q6_K's by one vpdpwssd. */
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

/* The 8 6-bit scales and 8 mins of a Q4_K / Q5_K block as bytes (as in matmul_k_avx2.c). */
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

/* vpermw indices giving, for the packed products of quarters (0, 1) or (2, 3), each int16 lane its
 * sub-block's scale. After vpackssdw(A, B) the 128-bit lane k holds 4 sums of A's lane k, then 4 of B's.
 * Q4_K / Q5_K (sub-blocks of 32): lane k of quarter c is sub-block 2c + k / 2, so quarters (0, 1) read
 * scales (0, 2 | 0, 2 | 1, 3 | 1, 3); Q6_K (sub-blocks of 16): lane k of quarter c is 4c + k, so (0, 1) read
 * (0, 4 | 1, 5 | 2, 6 | 3, 7). Quarters (2, 3): the same + 4 (Q4_K / Q5_K) or + 8 (Q6_K). Indexed
 * [Q6_K][pair]. */
static const int16_t k_scale_index[2][2][32] __attribute__((aligned(64))) = {
    {{0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 3, 3, 3, 3, 1, 1, 1, 1, 3, 3, 3, 3},
     {4, 4, 4, 4, 6, 6, 6, 6, 4, 4, 4, 4, 6, 6, 6, 6, 5, 5, 5, 5, 7, 7, 7, 7, 5, 5, 5, 5, 7, 7, 7, 7}},
    {{0, 0, 0, 0, 4, 4, 4, 4, 1, 1, 1, 1, 5, 5, 5, 5, 2, 2, 2, 2, 6, 6, 6, 6, 3, 3, 3, 3, 7, 7, 7, 7},
     {8,  8,  8,  8,  12, 12, 12, 12, 9,  9,  9,  9,  13, 13, 13, 13,
      10, 10, 10, 10, 14, 14, 14, 14, 11, 11, 11, 11, 15, 15, 15, 15}},
};

FM_INLINE __m512i kq_scale_index(const int kind, int pair) {
    return _mm512_load_si512(k_scale_index[kind == KQ_Q6][pair]);
}

FM_INLINE __m512i kq_bcast256(const void *p) {
    return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
}

/* One row's super-block (blk) against TP tokens (nt of them; x blocks xb[t * xstride]): per token t, the
 * isum partials li[t] (8 lanes summing to quant_k.c's isum, Q6_K's offset included) and the msum partials
 * lm[t] (Q4_K / Q5_K). Tokens t >= nt get zeros. */
FM_INLINE void kq_block(const int kind, const int TP, const uint8_t *blk, const fm_block_q8_K *xb,
                        int64_t xstride, int nt, __m256i *li, __m256i *lm) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    __m512i wq[4]; /* weights 64c .. 64c + 63 as unsigned bytes */
    __m512i s01, s23;
    __m256i mins = _mm256_setzero_si256(), off = _mm256_setzero_si256();
    if (kind != KQ_Q6) {
        uint64_t sc8, mn8;
        kq_scales_mins(blk + 4, &sc8, &mn8);
        const __m512i sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc8)));
        s01 = _mm512_permutexvar_epi16(kq_scale_index(kind, 0), sc16);
        s23 = _mm512_permutexvar_epi16(kq_scale_index(kind, 1), sc16);
        /* min j against bsums 2j, 2j + 1 */
        const __m256i mn16 = _mm256_castsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mn8)));
        mins =
            _mm256_permutexvar_epi16(_mm256_setr_epi16(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7), mn16);
        const uint8_t *qs = blk + (kind == KQ_Q4 ? 16 : 48);
        /* low nibbles in the lower 32 bytes, high nibbles in the upper */
        const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
        const __m512i qh = kind == KQ_Q5 ? kq_bcast256(blk + 16) : _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            wq[c] = _mm512_and_si512(_mm512_srlv_epi16(kq_bcast256(qs + 32 * c), shift), nib);
            if (kind == KQ_Q5) { /* fifth bit: bit 2c of qh[l] (lower half), 2c + 1 (upper) */
                const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * c))),
                                                       _mm256_set1_epi8((char)(1 << (2 * c + 1))), 1);
                wq[c] = _mm512_mask_add_epi8(wq[c], _mm512_test_epi8_mask(qh, bit), wq[c],
                                             _mm512_set1_epi8(0x10));
            }
        }
    } else {
        /* Q6_K: quarter c = half h = c / 2 of 128 weights: its 64 ql bytes' low nibbles (c even) or high
         * (c odd), and 2 bits of its 32 qh bytes: 0-1 | 2-3 (c even), 4-5 | 6-7 (c odd). */
        const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
        s01 = _mm512_permutexvar_epi16(kq_scale_index(kind, 0), _mm512_castsi256_si512(s16));
        s23 = _mm512_permutexvar_epi16(kq_scale_index(kind, 1), _mm512_castsi256_si512(s16));
        off = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(s16, 5)); /* -32 sc_j */
        const __m512i bits45 = _mm512_set1_epi8(0x30);
        const __m512i up = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
        const __m512i down = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const int h = c / 2;
            const __m512i l = _mm512_loadu_si512(blk + 64 * h), q = kq_bcast256(blk + 128 + 32 * h);
            if (c % 2 == 0)
                wq[c] = _mm512_or_si512(_mm512_and_si512(l, nib),
                                        _mm512_and_si512(_mm512_sllv_epi16(q, up), bits45));
            else
                wq[c] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), nib),
                                        _mm512_and_si512(_mm512_srlv_epi16(q, down), bits45));
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < TP; t++) {
        if (t >= nt) {
            li[t] = lm[t] = _mm256_setzero_si256();
            continue;
        }
        const int8_t *x = xb[t * xstride].qs;
        __m512i p[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            p[c] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[c], _mm512_loadu_si512(x + 64 * c));
        __m512i acc = _mm512_madd_epi16(_mm512_packs_epi32(p[0], p[1]), s01);
        acc = _mm512_dpwssd_epi32(acc, _mm512_packs_epi32(p[2], p[3]), s23);
        __m256i s = _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
        const __m256i bs = _mm256_loadu_si256((const __m256i *)xb[t * xstride].bsums);
        if (kind == KQ_Q6) {
            li[t] = _mm256_dpwssd_epi32(s, bs, off);
            lm[t] = _mm256_setzero_si256();
        } else {
            li[t] = s;
            lm[t] = _mm256_madd_epi16(bs, mins);
        }
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

void fm_mm_q4_K_vnni_avx512(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                            int64_t r1, void *tls) {
    (void)tls;
    kq_rows(KQ_Q4, w, a, y, bias, r0, r1);
}

void fm_mm_q5_K_vnni_avx512(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                            int64_t r1, void *tls) {
    (void)tls;
    kq_rows(KQ_Q5, w, a, y, bias, r0, r1);
}

void fm_mm_q6_K_vnni_avx512(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                            int64_t r1, void *tls) {
    (void)tls;
    kq_rows(KQ_Q6, w, a, y, bias, r0, r1);
}
