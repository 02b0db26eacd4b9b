/* matmul_k_avx512.c: the AVX-512 VNNI K-quant kernels (Q4_K, Q5_K, Q6_K weights x Q8_K activations); run
 * only after matmul.c checked avx512vnni (without it the AVX-512 level takes the AVX2 ones).
 *
 * The scheme of matmul_k_avx2.c (read its top comment first): exact integer super-block sums, then per
 * (row, token) lane the scalar kernel's f32 steps, so results are the scalar kernel's bit for bit at any T;
 * batches of 1 or 2 tokens with lanes over (row, token) and a reduction tree, longer ones in panels of rows.
 *
 * - 1 or 2 tokens: a row's super-block is unpacked into 4 zmm registers of unsigned bytes (64 weights each,
 *   the layout of the activations' 64-byte quarters) and kept for the tile's tokens; per token 4 vpdpbusd
 *   (4 products per int32 lane, no saturation) leave 64 sums within int16 (|sum| <= 4 * 63 * 127), 2
 *   vpackssdw pack them (exact) and vpmaddwd + vpdpwssd multiply them by their sub-blocks' scales into 16
 *   lanes, folded to 8 for the tree.
 * - 3 or more: panels of 16 rows, one per 32-bit lane. Each super-block is unpacked once per pass (16 x 16
 *   transposes of the packed words, the nibble split, scales gathered per lane); per token, 4 activation
 *   bytes broadcast to all lanes feed one vpdpbusd (64 products) per weight vector, so a sub-block's dot
 *   product for 16 rows sits in one accumulator after 8 (Q6_K: 4) of them, and one vpmulld by the
 *   sub-block's scales adds it to the rows' isums. The mins (Q4_K, Q5_K) and Q6_K's offset of 32 go through
 *   the bsums: vpdpwssd of per-row int16 pairs, (m_k, m_k) or (-32 sc_2k, -32 sc_2k+1), by broadcast bsum
 *   pairs. Per (16 rows, token, super-block): 64 vpdpbusd + 8 vpmulld + 8 vpdpwssd + a few f32 operations,
 *   about as many multiplies per weight as the VNNI Q8_0 kernel. Tokens in tiles of 8 (their accumulators
 *   and isums in registers), with as many sub-blocks at once as keep 8 vpdpbusd chains in flight. */
#include <immintrin.h>
#include <string.h>

#include "cpu/matmul_k_simd.h"
#include "cpu/matmul_kernels.h"
#include "cpu/simd_avx.h"

enum {
    KQ_PANEL = 16, /* rows per panel: one per 32-bit lane */
    KQ_TILE = 8,   /* tokens per tile */
    KQ_PASS = 64,  /* tokens per pass over a panel (their f32 accumulators wait on the stack) */
};

/* ---- batches of 1 or 2 tokens: lanes over (row, token), reduced by a tree ---- */

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

/* One row's super-block (blk) against TP tokens (x blocks xb[t * xstride]): per token t, the isum partials
 * li[t] (8 lanes summing to quant_k.c's isum, Q6_K's offset included) and the msum partials lm[t] (Q4_K /
 * Q5_K; zeros for Q6_K). */
FM_INLINE void kq_block(const int kind, const int TP, const uint8_t *blk, const fm_block_q8_K *xb,
                        int64_t xstride, __m256i *li, __m256i *lm) {
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

#include "cpu/matmul_k_small.h" /* kq_small_rows, around kq_block above */

/* ---- batches of 3 or more tokens: panels of 16 rows, one per lane ---- */

/* One super-block of a panel, unpacked (lane r: row r). */
typedef struct {
    __m512i w[64];  /* w[k]: weights 4k .. 4k + 3, unsigned bytes (Q6_K: q + 32) */
    __m512i sc[16]; /* int32 sub-block scales: 8 of 32 weights (Q4_K, Q5_K) or 16 of 16 (Q6_K) */
    __m512i
        mp[8]; /* int16 pairs against bsums (2k, 2k + 1): (m_k, m_k), or Q6_K's (-32 sc_2k, -32 sc_2k+1) */
    __m512 dw, dm; /* d and dmin (0 for Q6_K) as f32 */
} kq_panel;

/* out[j] lane r = 32-bit word j of the 64 bytes at row[r] + off. */
FM_INLINE void kq_transpose16(const uint8_t *const row[KQ_PANEL], int off, __m512i out[16]) {
    __m512i a[16], t[16];
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) a[r] = _mm512_loadu_si512(row[r] + off);
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(a[2 * i], a[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(a[2 * i], a[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) { /* a[4i + j], 128-bit lane q: word 4q + j of rows 4i .. 4i + 3 */
        a[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        a[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        a[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        a[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        const __m512i b0 = _mm512_shuffle_i32x4(a[j], a[4 + j], 0x44),
                      b1 = _mm512_shuffle_i32x4(a[j], a[4 + j], 0xEE);
        const __m512i c0 = _mm512_shuffle_i32x4(a[8 + j], a[12 + j], 0x44),
                      c1 = _mm512_shuffle_i32x4(a[8 + j], a[12 + j], 0xEE);
        out[j] = _mm512_shuffle_i32x4(b0, c0, 0x88);
        out[4 + j] = _mm512_shuffle_i32x4(b0, c0, 0xDD);
        out[8 + j] = _mm512_shuffle_i32x4(b1, c1, 0x88);
        out[12 + j] = _mm512_shuffle_i32x4(b1, c1, 0xDD);
    }
}

FM_INLINE __m512i kq_byte(__m512i v, int i) { /* byte i of each 32-bit lane, zero-extended */
    return _mm512_and_si512(_mm512_srli_epi32(v, 8 * i), _mm512_set1_epi32(0xFF));
}

/* Q5_K's fifth bit: bit k of each byte of v moved to bit 4 (32-bit shifts; the mask keeps each byte's own) */
FM_INLINE __m512i kq_bit_to_4(__m512i v, const int k) {
    const __m512i bit4 = _mm512_set1_epi8(0x10);
    if (k <= 4) return _mm512_and_si512(_mm512_slli_epi32(v, 4 - k), bit4);
    return _mm512_and_si512(_mm512_srli_epi32(v, k - 4), bit4);
}

/* Unpacks super-block b of the panel's rows (row[r] points at it; roff: each row's byte offset from row[0],
 * for the gathers of the scales). */
FM_INLINE void kq_stage(const int kind, const uint8_t *const row[KQ_PANEL], __m512i roff, kq_panel *p) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    if (kind != KQ_Q6) {
        /* d | dmin, then the 12 scale bytes as words a, b, c: scales 0-3 = a & 63, mins 0-3 = b & 63, scales
         * 4-7 = (c & 15) | (a >> 6) << 4, mins 4-7 = (c >> 4) | (b >> 6) << 4, byte by byte */
        const __m512i d = _mm512_i32gather_epi32(roff, row[0], 1),
                      a = _mm512_i32gather_epi32(roff, row[0] + 4, 1),
                      b = _mm512_i32gather_epi32(roff, row[0] + 8, 1),
                      c = _mm512_i32gather_epi32(roff, row[0] + 12, 1);
        const __m512i low6 = _mm512_set1_epi8(0x3F), low4 = _mm512_set1_epi8(0x0F),
                      bits45 = _mm512_set1_epi8(0x30);
        const __m512i s03 = _mm512_and_si512(a, low6), m03 = _mm512_and_si512(b, low6);
        const __m512i s47 =
            _mm512_or_si512(_mm512_and_si512(c, low4), _mm512_and_si512(_mm512_srli_epi32(a, 2), bits45));
        const __m512i m47 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(c, 4), low4),
                                            _mm512_and_si512(_mm512_srli_epi32(b, 2), bits45));
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            p->sc[i] = kq_byte(s03, i);
            p->sc[4 + i] = kq_byte(s47, i);
            const __m512i ml = kq_byte(m03, i), mh = kq_byte(m47, i);
            p->mp[i] = _mm512_or_si512(ml, _mm512_slli_epi32(ml, 16));
            p->mp[4 + i] = _mm512_or_si512(mh, _mm512_slli_epi32(mh, 16));
        }
        p->dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d));
        p->dm = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(d, 16)));
        /* quants: word n of qs holds the low nibbles of weight word 16 (n / 8) + n % 8 and the high nibbles
         * of word 16 (n / 8) + 8 + n % 8 (chunk c = n / 8 of 64 weights); Q5_K's fifth bits: bit 2c (low)
         * and 2c + 1 (high) of qh word n % 8 */
        __m512i q[32], qh[8];
        if (kind == KQ_Q4) {
            kq_transpose16(row, 16, q);
            kq_transpose16(row, 80, q + 16);
        } else {
            __m512i t[16];
            kq_transpose16(row, 16, t); /* qh words 0-7, qs words 0-7 */
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) qh[i] = t[i], q[i] = t[8 + i];
            kq_transpose16(row, 80, q + 8); /* qs words 8-23 */
            kq_transpose16(row, 112, t);    /* qs words 16-31 */
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) q[24 + i] = t[8 + i];
        }
#pragma GCC unroll 32
        for (int n = 0; n < 32; n++) {
            const int c = n / 8, m = n % 8;
            __m512i lo = _mm512_and_si512(q[n], nib), hi = _mm512_and_si512(_mm512_srli_epi32(q[n], 4), nib);
            if (kind == KQ_Q5) {
                lo = _mm512_or_si512(lo, kq_bit_to_4(qh[m], 2 * c));
                hi = _mm512_or_si512(hi, kq_bit_to_4(qh[m], 2 * c + 1));
            }
            p->w[16 * c + m] = lo;
            p->w[16 * c + 8 + m] = hi;
        }
        return;
    }
    /* Q6_K: ql [128], qh [64], scales [16] (int8), d (f16, read as the top half of the word at 206) */
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        const __m512i s = _mm512_i32gather_epi32(roff, row[0] + 192 + 4 * i, 1);
#pragma GCC unroll 4
        for (int e = 0; e < 4; e++)
            p->sc[4 * i + e] = _mm512_srai_epi32(_mm512_slli_epi32(s, 24 - 8 * e), 24);
    }
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        const __m512i n0 = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(p->sc[2 * k], 5));
        const __m512i n1 = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(p->sc[2 * k + 1], 5));
        p->mp[k] =
            _mm512_or_si512(_mm512_and_si512(n0, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(n1, 16));
    }
    p->dw = _mm512_cvtph_ps(
        _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_i32gather_epi32(roff, row[0] + 206, 1), 16)));
    p->dm = _mm512_setzero_ps();
    /* weight 128h + 32i + l (l = 4m + byte): low 4 bits in ql word 16h + 8 (i & 1) + m (low nibbles for
     * i < 2, high for i >= 2), high 2 bits = bits 2i, 2i + 1 of qh word 8h + m */
    __m512i ql[32], qh[16];
    kq_transpose16(row, 0, ql);
    kq_transpose16(row, 64, ql + 16);
    kq_transpose16(row, 128, qh);
    const __m512i bits45 = _mm512_set1_epi8(0x30);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++)
#pragma GCC unroll 8
        for (int m = 0; m < 8; m++) {
            const __m512i l0 = ql[16 * h + m], l1 = ql[16 * h + 8 + m], q = qh[8 * h + m];
            p->w[32 * h + m] =
                _mm512_or_si512(_mm512_and_si512(l0, nib), _mm512_and_si512(_mm512_slli_epi32(q, 4), bits45));
            p->w[32 * h + 8 + m] =
                _mm512_or_si512(_mm512_and_si512(l1, nib), _mm512_and_si512(_mm512_slli_epi32(q, 2), bits45));
            p->w[32 * h + 16 + m] =
                _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(l0, 4), nib), _mm512_and_si512(q, bits45));
            p->w[32 * h + 24 + m] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(l1, 4), nib),
                                                    _mm512_and_si512(_mm512_srli_epi32(q, 2), bits45));
        }
}

FM_INLINE __m512i kq_bcast4(const void *p) { /* 4 bytes at p in every 32-bit lane */
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* The panel's super-block against TT tokens (x blocks xb[t * xstride]); s[t] lane r += row r's block value.
 * J sub-blocks at a time, so that at least 8 vpdpbusd chains are in flight (their latency is ~5 cycles). */
FM_INLINE void kq_tokens(const int kind, const int TT, const kq_panel *p, const fm_block_q8_K *xb,
                         int64_t xstride, __m512 *s) {
    const int nsub = kind == KQ_Q6 ? 16 : 8, words = 64 / nsub; /* sub-blocks, weight words in each */
    const int J = TT >= 8 ? 1 : TT >= 4 ? 2 : TT >= 2 ? 4 : 8;
    __m512i isum[KQ_TILE];
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++) isum[t] = _mm512_setzero_si512();
#pragma GCC unroll 1
    for (int j0 = 0; j0 < nsub; j0 += J) {
        __m512i acc[8][KQ_TILE];
#pragma GCC unroll 8
        for (int j = 0; j < J; j++)
#pragma GCC unroll 8
            for (int t = 0; t < TT; t++) acc[j][t] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int k = 0; k < words; k++)
#pragma GCC unroll 8
            for (int j = 0; j < J; j++) {
                const int word = (j0 + j) * words + k;
                const __m512i w = _mm512_load_si512(&p->w[word]);
#pragma GCC unroll 8
                for (int t = 0; t < TT; t++)
                    acc[j][t] = _mm512_dpbusd_epi32(acc[j][t], w, kq_bcast4(xb[t * xstride].qs + 4 * word));
            }
#pragma GCC unroll 8
        for (int j = 0; j < J; j++) {
            const __m512i sc = _mm512_load_si512(&p->sc[j0 + j]);
#pragma GCC unroll 8
            for (int t = 0; t < TT; t++)
                isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(acc[j][t], sc));
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++) {
        /* the bsum terms: msum (Q4_K, Q5_K) or Q6_K's -32 sum_j sc_j bsum_j, in two chains */
        const int16_t *bs = xb[t * xstride].bsums;
        __m512i m0 = _mm512_setzero_si512(), m1 = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int k = 0; k < 8; k += 2) {
            m0 = _mm512_dpwssd_epi32(m0, p->mp[k], kq_bcast4(bs + 2 * k));
            m1 = _mm512_dpwssd_epi32(m1, p->mp[k + 1], kq_bcast4(bs + 2 * k + 2));
        }
        const __m512i m = _mm512_add_epi32(m0, m1);
        __m512 v;
        if (kind == KQ_Q6) {
            v = _mm512_mul_ps(p->dw, _mm512_cvtepi32_ps(_mm512_add_epi32(isum[t], m)));
        } else {
            v = _mm512_sub_ps(_mm512_mul_ps(p->dw, _mm512_cvtepi32_ps(isum[t])),
                              _mm512_mul_ps(p->dm, _mm512_cvtepi32_ps(m)));
        }
        s[t] = _mm512_add_ps(s[t], _mm512_mul_ps(_mm512_set1_ps(xb[t * xstride].d), v));
    }
}

/* kq_tokens with compile-time tiles of 1..8 tokens, per kind. */
typedef void (*kq_tokens_fn)(const kq_panel *, const fm_block_q8_K *, int64_t, __m512 *);
#define KQ_TOKENS_FN(kind, TT)                                                                               \
    static void kq_tokens_##kind##_##TT(const kq_panel *p, const fm_block_q8_K *xb, int64_t xstride,         \
                                        __m512 *s) {                                                         \
        kq_tokens(kind, TT, p, xb, xstride, s);                                                              \
    }
#define KQ_TOKENS_FNS(kind)                                                                                  \
    KQ_TOKENS_FN(kind, 1)                                                                                    \
    KQ_TOKENS_FN(kind, 2)                                                                                    \
    KQ_TOKENS_FN(kind, 3)                                                                                    \
    KQ_TOKENS_FN(kind, 4)                                                                                    \
    KQ_TOKENS_FN(kind, 5)                                                                                    \
    KQ_TOKENS_FN(kind, 6)                                                                                    \
    KQ_TOKENS_FN(kind, 7)                                                                                    \
    KQ_TOKENS_FN(kind, 8)
KQ_TOKENS_FNS(KQ_Q4)
KQ_TOKENS_FNS(KQ_Q5)
KQ_TOKENS_FNS(KQ_Q6)
#undef KQ_TOKENS_FNS
#undef KQ_TOKENS_FN
#define KQ_TOKENS_ROW(kind)                                                                                  \
    {                                                                                                        \
        kq_tokens_##kind##_1, kq_tokens_##kind##_2, kq_tokens_##kind##_3, kq_tokens_##kind##_4,              \
            kq_tokens_##kind##_5, kq_tokens_##kind##_6, kq_tokens_##kind##_7, kq_tokens_##kind##_8           \
    }
static const kq_tokens_fn k_tokens[3][KQ_TILE] = {KQ_TOKENS_ROW(KQ_Q4), KQ_TOKENS_ROW(KQ_Q5),
                                                  KQ_TOKENS_ROW(KQ_Q6)};
#undef KQ_TOKENS_ROW

static void kq_stage_q4(const uint8_t *const row[KQ_PANEL], __m512i roff, kq_panel *p) {
    kq_stage(KQ_Q4, row, roff, p);
}
static void kq_stage_q5(const uint8_t *const row[KQ_PANEL], __m512i roff, kq_panel *p) {
    kq_stage(KQ_Q5, row, roff, p);
}
static void kq_stage_q6(const uint8_t *const row[KQ_PANEL], __m512i roff, kq_panel *p) {
    kq_stage(KQ_Q6, row, roff, p);
}
typedef void (*kq_stage_fn)(const uint8_t *const[KQ_PANEL], __m512i, kq_panel *);
static const kq_stage_fn k_stage[3] = {kq_stage_q4, kq_stage_q5, kq_stage_q6};

/* The AVX2 kernels, for the last rows of a range when they would fill half a panel or less (the ranges of
 * many workers are short: 2560 rows over 16 workers' chunks of 20): their 8-row panels, the same bits. */
static const fm_mm_kernel k_avx2_kernels[3] = {fm_mm_q4_K_avx2, fm_mm_q5_K_avx2, fm_mm_q6_K_avx2};

/* Rows [r0, r1) in panels of 16 (a last, partial one repeats its first row in the missing lanes and stores
 * only its own; 8 rows or fewer go to the AVX2 kernel), tokens in passes of up to KQ_PASS. */
static void kq_panel_rows(const int kind, const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias,
                          int64_t r0, int64_t r1) {
    const int64_t nb = w->cols / FM_QK_K, bb = kq_block_bytes(kind), row_bytes = nb * bb;
    const uint8_t *base = w->data;
    const int T = a->T;
    kq_panel panel __attribute__((aligned(64)));
    __m512 s[KQ_PASS];
    for (int64_t rp = r0; rp < r1; rp += KQ_PANEL) {
        const int nr = r1 - rp < KQ_PANEL ? (int)(r1 - rp) : KQ_PANEL;
        if (nr <= KQ_PANEL / 2) {
            k_avx2_kernels[kind](w, a, y, bias, rp, r1, NULL);
            break;
        }
        const __mmask16 live = (__mmask16)((1u << nr) - 1);
        int32_t off[KQ_PANEL];
        for (int r = 0; r < KQ_PANEL; r++) off[r] = r < nr ? (int32_t)(r * row_bytes) : 0;
        const __m512i roff = _mm512_loadu_si512(off);
        /* the next panel (past r1 too: likely this worker's next chunk), spread over the first pass */
        const int64_t next_end = rp + 2 * KQ_PANEL < w->rows ? rp + 2 * KQ_PANEL : w->rows;
        const char *pf = (const char *)base + (rp + nr) * row_bytes,
                   *pf_end = (const char *)base + next_end * row_bytes;
        const int per_block = pf_end > pf ? (int)(((pf_end - pf) / 64 + nb - 1) / nb) : 0;
        const __m512 bv = bias ? _mm512_maskz_loadu_ps(live, bias + rp) : _mm512_setzero_ps();
        for (int ts = 0; ts < T; ts += KQ_PASS) {
            const int nts = T - ts < KQ_PASS ? T - ts : KQ_PASS;
            for (int t = 0; t < nts; t++) s[t] = _mm512_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                for (int i = 0; i < per_block && pf < pf_end; i++, pf += 64) _mm_prefetch(pf, _MM_HINT_T1);
                const uint8_t *row[KQ_PANEL];
                for (int r = 0; r < KQ_PANEL; r++)
                    row[r] = base + (rp + (r < nr ? r : 0)) * row_bytes + b * bb;
                k_stage[kind](row, roff, &panel);
                const fm_block_q8_K *xb = a->xk + (int64_t)ts * nb + b;
                for (int t0 = 0; t0 < nts; t0 += KQ_TILE) {
                    const int tt = nts - t0 < KQ_TILE ? nts - t0 : KQ_TILE;
                    k_tokens[kind][tt - 1](&panel, xb + (int64_t)t0 * nb, nb, s + t0);
                }
            }
            /* y = s + bias (or + 0), as fm_mm_store */
            for (int t = 0; t < nts; t++)
                _mm512_mask_storeu_ps(y + (int64_t)(ts + t) * w->rows + rp, live, _mm512_add_ps(s[t], bv));
        }
    }
}

void fm_mm_q4_K_vnni_avx512(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                            int64_t r1, void *tls) {
    (void)tls;
    if (a->T <= 2)
        kq_small_rows(KQ_Q4, w, a, y, bias, r0, r1);
    else
        kq_panel_rows(KQ_Q4, w, a, y, bias, r0, r1);
}

void fm_mm_q5_K_vnni_avx512(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                            int64_t r1, void *tls) {
    (void)tls;
    if (a->T <= 2)
        kq_small_rows(KQ_Q5, w, a, y, bias, r0, r1);
    else
        kq_panel_rows(KQ_Q5, w, a, y, bias, r0, r1);
}

void fm_mm_q6_K_vnni_avx512(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                            int64_t r1, void *tls) {
    (void)tls;
    if (a->T <= 2)
        kq_small_rows(KQ_Q6, w, a, y, bias, r0, r1);
    else
        kq_panel_rows(KQ_Q6, w, a, y, bias, r0, r1);
}
