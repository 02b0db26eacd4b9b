/* matmul_k_avx2.c: the AVX2 K-quant kernels (Q4_K, Q5_K, Q6_K weights x Q8_K activations), and the Q8_K
 * activation quantiser of the SIMD levels.
 *
 * Every kernel computes each super-block's integer sums exactly (so in any order: quant_k.c's isum and
 * msum), with the weights unpacked to unsigned bytes (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63, its offset of 32
 * taken out through the activations' bsums) times the int8 activations by vpmaddubsw, and then takes per
 * (row, token) the scalar kernel's f32 step
 *   s += dx * (dw * isum - dmin * msum)
 * in one vector lane, block by block. So a result is the scalar kernel's bit for bit, whatever T, the tile,
 * the lane or the chunk it falls in: speculative decoding's verify rows equal single steps.
 *
 * Two ways through the rows, by batch size (crossover measured with bench_kernels-style runs on Zen 4):
 * - 1 or 2 tokens (decode steps; memory bound): lanes over (row, token). A row's super-block is unpacked in
 *   registers and multiplied by each token's activations, 32 weights per vpmaddubsw + vpmaddwd (by the
 *   sub-block's scale), leaving 8 int32 partial sums per (row, token); a transposing tree of vphaddd turns
 *   8 such vectors into one vector of 8 isums (msums likewise, from one vpmaddwd of the bsums by the mins).
 *   Tiles of 8 rows x 1 token or 8 x 2 (two groups).
 * - 3 or more (verify blocks, drafts, prefill; compute bound): panels of 8 rows, one per 32-bit lane, so no
 *   reduction at all. Each super-block of the panel is unpacked once per pass of up to 64 tokens into 64
 *   vectors (vector k, lane r: weights 4k .. 4k + 3 of row r; 8 x 8 transposes of the packed words, then the
 *   nibble split) and its scales likewise; then per token, 4 activation bytes broadcast to every lane and
 *   vpmaddubsw give 8 rows' products of one weight word, summed in int16 over the words of a sub-block
 *   (Q4_K: 8, exact below 2^15; Q5_K in two runs of 4, Q6_K in runs of 2), widened once by vpmaddwd with the
 *   scale pairs. Tokens in tiles of 4 (each weight vector loaded once per tile). About 20 operations per
 *   (row, token, super-block), against the first way's 36.
 * While a tile or panel runs, the next one's rows are prefetched into L2. */
#include <immintrin.h>
#include <string.h>

#include "cpu/matmul_k_simd.h"
#include "cpu/matmul_kernels.h"
#include "cpu/simd_avx.h"

enum {
    KQ_PANEL = 8, /* rows per panel: one per 32-bit lane */
    KQ_TILE = 4,  /* tokens per tile */
    KQ_PASS = 64, /* tokens per pass over a panel (their f32 accumulators wait on the stack) */
};

/* ---- batches of 1 or 2 tokens: lanes over (row, token), reduced by a tree ---- */

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

/* Q5_K's fifth bits: bit k of each byte of v moved to bit 4 (the shifts cross bytes, the mask keeps each
 * byte's own bit). */
FM_INLINE __m256i kq_bit_to_4(__m256i v, const int k) {
    const __m256i bit4 = _mm256_set1_epi8(0x10);
    if (k <= 4) return _mm256_and_si256(_mm256_slli_epi32(v, 4 - k), bit4);
    return _mm256_and_si256(_mm256_srli_epi32(v, k - 4), bit4);
}

/* One row's super-block (blk) against TP tokens (x blocks xb[t * xstride]): per token t, the isum partials
 * li[t] (8 lanes summing to quant_k.c's isum, Q6_K's offset included) and the msum partials lm[t] (Q4_K /
 * Q5_K; zeros for Q6_K). */
FM_INLINE void kq_block(const int kind, const int TP, const uint8_t *blk, const fm_block_q8_K *xb,
                        int64_t xstride, __m256i *li, __m256i *lm) {
    const __m256i nib = _mm256_set1_epi8(0x0F);
    __m256i acc[2];
#pragma GCC unroll 2
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
                lo = _mm256_or_si256(lo, kq_bit_to_4(qh, 2 * c));
                hi = _mm256_or_si256(hi, kq_bit_to_4(qh, 2 * c + 1));
            }
            const __m256i s0 = _mm256_shuffle_epi8(scb, kq_pick16(2 * c));
            const __m256i s1 = _mm256_shuffle_epi8(scb, kq_pick16(2 * c + 1));
#pragma GCC unroll 8
            for (int t = 0; t < TP; t++) {
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
            lm[t] = _mm256_madd_epi16(kq_load(xb[t * xstride].bsums), mins);
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
        li[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(kq_load(xb[t * xstride].bsums), off));
        lm[t] = _mm256_setzero_si256();
    }
}

#include "cpu/matmul_k_small.h" /* kq_small_rows, around kq_block above */

/* ---- batches of 3 or more tokens: panels of 8 rows, one per lane ---- */

/* One super-block of a panel, unpacked (lane r: row r). */
typedef struct {
    __m256i w[64];  /* w[k]: weights 4k .. 4k + 3, unsigned bytes (Q6_K: q + 32) */
    __m256i sc[16]; /* int16 pairs (sc, sc): 8 sub-blocks of 32 weights (Q4_K, Q5_K) or 16 of 16 (Q6_K) */
    __m256i
        mp[8]; /* int16 pairs against bsums (2k, 2k + 1): (m_k, m_k), or Q6_K's (-32 sc_2k, -32 sc_2k+1) */
    __m256 dw, dm; /* d and dmin (0 for Q6_K) as f32 */
} kq_panel;

/* out[j] lane r = 32-bit word j of the 32 bytes at row[r] + off. */
FM_INLINE void kq_transpose8(const uint8_t *const row[KQ_PANEL], int off, __m256i out[8]) {
    __m256i a[8], t[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++) a[r] = kq_load(row[r] + off);
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(a[2 * i], a[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(a[2 * i], a[2 * i + 1]);
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) { /* a[4i + j], 128-bit half q: word 4q + j of rows 4i .. 4i + 3 */
        a[4 * i + 0] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        a[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        a[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        a[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        out[j] = _mm256_permute2x128_si256(a[j], a[4 + j], 0x20);
        out[4 + j] = _mm256_permute2x128_si256(a[j], a[4 + j], 0x31);
    }
}

/* The 4 words of 16 bytes at row[r] + off, r < 8: out[j] lane r = word j of row r. */
FM_INLINE void kq_transpose8x4(const uint8_t *const row[KQ_PANEL], int off, __m256i out[4]) {
    __m256i y[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        y[i] = _mm256_loadu2_m128i((const __m128i *)(row[i + 4] + off), (const __m128i *)(row[i] + off));
    const __m256i t0 = _mm256_unpacklo_epi32(y[0], y[1]), t1 = _mm256_unpackhi_epi32(y[0], y[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(y[2], y[3]), t3 = _mm256_unpackhi_epi32(y[2], y[3]);
    out[0] = _mm256_unpacklo_epi64(t0, t2);
    out[1] = _mm256_unpackhi_epi64(t0, t2);
    out[2] = _mm256_unpacklo_epi64(t1, t3);
    out[3] = _mm256_unpackhi_epi64(t1, t3);
}

/* vpshufb mask: in each 32-bit lane, its byte i as an int16 pair (b_i, b_i), zero-extended (hi = 0), or
 * placed in the high bytes (hi = 1: (b_i << 8, b_i' << 8), i' = i + odd), for sign extension by a shift. */
FM_INLINE __m256i kq_pair_mask(int i, int hi, int odd) {
    const int8_t z = -1;
    int8_t m[16];
    for (int d = 0; d < 4; d++) {
        m[4 * d + 0] = hi ? z : (int8_t)(4 * d + i);
        m[4 * d + 1] = hi ? (int8_t)(4 * d + i) : z;
        m[4 * d + 2] = hi ? z : (int8_t)(4 * d + i);
        m[4 * d + 3] = hi ? (int8_t)(4 * d + i + odd) : z;
    }
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)m));
}

/* Unpacks super-block b of the panel's rows (row[r] points at it). */
FM_INLINE void kq_stage(const int kind, const uint8_t *const row[KQ_PANEL], kq_panel *p) {
    const __m256i nib = _mm256_set1_epi8(0x0F);
    if (kind != KQ_Q6) {
        /* d | dmin, then the 12 scale bytes as words a, b, c (see kq_scales_mins), byte by byte */
        __m256i h[4];
        kq_transpose8x4(row, 0, h);
        const __m256i a = h[1], b = h[2], c = h[3];
        const __m256i low6 = _mm256_set1_epi8(0x3F), low4 = _mm256_set1_epi8(0x0F),
                      bits45 = _mm256_set1_epi8(0x30);
        const __m256i s03 = _mm256_and_si256(a, low6), m03 = _mm256_and_si256(b, low6);
        const __m256i s47 =
            _mm256_or_si256(_mm256_and_si256(c, low4), _mm256_and_si256(_mm256_srli_epi32(a, 2), bits45));
        const __m256i m47 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(c, 4), low4),
                                            _mm256_and_si256(_mm256_srli_epi32(b, 2), bits45));
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            const __m256i m = kq_pair_mask(i, 0, 0);
            p->sc[i] = _mm256_shuffle_epi8(s03, m);
            p->sc[4 + i] = _mm256_shuffle_epi8(s47, m);
            p->mp[i] = _mm256_shuffle_epi8(m03, m);
            p->mp[4 + i] = _mm256_shuffle_epi8(m47, m);
        }
        /* d, dmin: the two halves of word 0, as 8 f16 each */
        const __m256i dd = _mm256_permute4x64_epi64(
            _mm256_shuffle_epi8(h[0], _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                                       0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15)),
            0xD8);
        p->dw = _mm256_cvtph_ps(_mm256_castsi256_si128(dd));
        p->dm = _mm256_cvtph_ps(_mm256_extracti128_si256(dd, 1));
        /* quants as in matmul_k_avx512.c: qs word n = low nibbles of weight word 16 (n / 8) + n % 8, high
         * nibbles of 16 (n / 8) + 8 + n % 8; Q5_K's fifth bits: bits 2c, 2c + 1 of qh word n % 8 */
        __m256i q[32], qh[8];
        const int qs_off = kind == KQ_Q4 ? 16 : 48;
        if (kind == KQ_Q5) kq_transpose8(row, 16, qh);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) kq_transpose8(row, qs_off + 32 * i, q + 8 * i);
#pragma GCC unroll 32
        for (int n = 0; n < 32; n++) {
            const int c = n / 8, m = n % 8;
            __m256i lo = _mm256_and_si256(q[n], nib), hi = _mm256_and_si256(_mm256_srli_epi32(q[n], 4), nib);
            if (kind == KQ_Q5) {
                lo = _mm256_or_si256(lo, kq_bit_to_4(qh[m], 2 * c));
                hi = _mm256_or_si256(hi, kq_bit_to_4(qh[m], 2 * c + 1));
            }
            p->w[16 * c + m] = lo;
            p->w[16 * c + 8 + m] = hi;
        }
        return;
    }
    /* Q6_K: scales (int8) at 192, d (f16) at 208: the top half of the word at 206 */
    __m256i sv[4], dv[4];
    kq_transpose8x4(row, 192, sv);
    kq_transpose8x4(row, 194, dv);
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++) /* (sc_j, sc_j), sign-extended from the high bytes */
        p->sc[j] = _mm256_srai_epi16(_mm256_shuffle_epi8(sv[j / 4], kq_pair_mask(j % 4, 1, 0)), 8);
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) { /* (-32 sc_2k, -32 sc_2k+1) */
        const __m256i v =
            _mm256_srai_epi16(_mm256_shuffle_epi8(sv[k / 2], kq_pair_mask((2 * k) % 4, 1, 1)), 3);
        p->mp[k] = _mm256_sub_epi16(_mm256_setzero_si256(), v);
    }
    const __m256i d32 = _mm256_srli_epi32(dv[3], 16);
    p->dw = _mm256_cvtph_ps(
        _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(d32, d32), 0x08)));
    p->dm = _mm256_setzero_ps();
    /* weight 128h + 32i + l (l = 4m + byte): low 4 bits in ql word 16h + 8 (i & 1) + m (low nibbles for
     * i < 2, high for i >= 2), high 2 bits = bits 2i, 2i + 1 of qh word 8h + m */
    __m256i ql[32], qh[16];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) kq_transpose8(row, 32 * i, ql + 8 * i);
    kq_transpose8(row, 128, qh);
    kq_transpose8(row, 160, qh + 8);
    const __m256i bits45 = _mm256_set1_epi8(0x30);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++)
#pragma GCC unroll 8
        for (int m = 0; m < 8; m++) {
            const __m256i l0 = ql[16 * h + m], l1 = ql[16 * h + 8 + m], q = qh[8 * h + m];
            p->w[32 * h + m] =
                _mm256_or_si256(_mm256_and_si256(l0, nib), _mm256_and_si256(_mm256_slli_epi32(q, 4), bits45));
            p->w[32 * h + 8 + m] =
                _mm256_or_si256(_mm256_and_si256(l1, nib), _mm256_and_si256(_mm256_slli_epi32(q, 2), bits45));
            p->w[32 * h + 16 + m] =
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(l0, 4), nib), _mm256_and_si256(q, bits45));
            p->w[32 * h + 24 + m] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(l1, 4), nib),
                                                    _mm256_and_si256(_mm256_srli_epi32(q, 2), bits45));
        }
}

FM_INLINE __m256i kq_bcast4(const void *p) { /* 4 bytes at p in every 32-bit lane */
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* The panel's super-block against TT tokens (x blocks xb[t * xstride]); s[t] lane r += row r's block value.
 * vpmaddubsw products of a sub-block are summed in int16 over RUN weight words (the bound 2 * q_max * 127
 * * RUN stays below 2^15: 8 words for Q4_K, 4 for Q5_K, 2 for Q6_K) before one vpmaddwd by the scales
 * widens them. */
FM_INLINE void kq_tokens(const int kind, const int TT, const kq_panel *p, const fm_block_q8_K *xb,
                         int64_t xstride, __m256 *s) {
    const int nsub = kind == KQ_Q6 ? 16 : 8, words = 64 / nsub,
              run = kind == KQ_Q4   ? 8
                    : kind == KQ_Q5 ? 4
                                    : 2;
    __m256i isum[KQ_TILE];
#pragma GCC unroll 4
    for (int t = 0; t < TT; t++) isum[t] = _mm256_setzero_si256();
#pragma GCC unroll 1
    for (int j = 0; j < nsub; j++) {
        const __m256i sc = _mm256_load_si256(&p->sc[j]);
#pragma GCC unroll 4
        for (int k0 = 0; k0 < words; k0 += run) {
            __m256i s16[KQ_TILE];
#pragma GCC unroll 8
            for (int k = 0; k < run; k++) {
                const int word = j * words + k0 + k;
                const __m256i w = _mm256_load_si256(&p->w[word]);
#pragma GCC unroll 4
                for (int t = 0; t < TT; t++) {
                    const __m256i v = _mm256_maddubs_epi16(w, kq_bcast4(xb[t * xstride].qs + 4 * word));
                    s16[t] = k ? _mm256_add_epi16(s16[t], v) : v;
                    FM_PIN(s16[t]); /* a chain in this order, not a tree of spilled products */
                }
            }
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(s16[t], sc));
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < TT; t++) {
        /* the bsum terms: msum (Q4_K, Q5_K) or Q6_K's -32 sum_j sc_j bsum_j, in two chains */
        const int16_t *bs = xb[t * xstride].bsums;
        __m256i m0 = _mm256_setzero_si256(), m1 = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int k = 0; k < 8; k += 2) {
            m0 = _mm256_add_epi32(m0, _mm256_madd_epi16(p->mp[k], kq_bcast4(bs + 2 * k)));
            m1 = _mm256_add_epi32(m1, _mm256_madd_epi16(p->mp[k + 1], kq_bcast4(bs + 2 * k + 2)));
        }
        const __m256i m = _mm256_add_epi32(m0, m1);
        __m256 v;
        if (kind == KQ_Q6) {
            v = _mm256_mul_ps(p->dw, _mm256_cvtepi32_ps(_mm256_add_epi32(isum[t], m)));
        } else {
            v = _mm256_sub_ps(_mm256_mul_ps(p->dw, _mm256_cvtepi32_ps(isum[t])),
                              _mm256_mul_ps(p->dm, _mm256_cvtepi32_ps(m)));
        }
        s[t] = _mm256_add_ps(s[t], _mm256_mul_ps(_mm256_set1_ps(xb[t * xstride].d), v));
    }
}

/* kq_tokens with compile-time tiles of 1..8 tokens, per kind. */
typedef void (*kq_tokens_fn)(const kq_panel *, const fm_block_q8_K *, int64_t, __m256 *);
#define KQ_TOKENS_FN(kind, TT)                                                                               \
    static void kq_tokens_##kind##_##TT(const kq_panel *p, const fm_block_q8_K *xb, int64_t xstride,         \
                                        __m256 *s) {                                                         \
        kq_tokens(kind, TT, p, xb, xstride, s);                                                              \
    }
#define KQ_TOKENS_FNS(kind)                                                                                  \
    KQ_TOKENS_FN(kind, 1)                                                                                    \
    KQ_TOKENS_FN(kind, 2)                                                                                    \
    KQ_TOKENS_FN(kind, 3)                                                                                    \
    KQ_TOKENS_FN(kind, 4)
KQ_TOKENS_FNS(KQ_Q4)
KQ_TOKENS_FNS(KQ_Q5)
KQ_TOKENS_FNS(KQ_Q6)
#undef KQ_TOKENS_FNS
#undef KQ_TOKENS_FN
#define KQ_TOKENS_ROW(kind)                                                                                  \
    { kq_tokens_##kind##_1, kq_tokens_##kind##_2, kq_tokens_##kind##_3, kq_tokens_##kind##_4 }
static const kq_tokens_fn k_tokens[3][KQ_TILE] = {KQ_TOKENS_ROW(KQ_Q4), KQ_TOKENS_ROW(KQ_Q5),
                                                  KQ_TOKENS_ROW(KQ_Q6)};
#undef KQ_TOKENS_ROW

static void kq_stage_q4(const uint8_t *const row[KQ_PANEL], kq_panel *p) {
    kq_stage(KQ_Q4, row, p);
}
static void kq_stage_q5(const uint8_t *const row[KQ_PANEL], kq_panel *p) {
    kq_stage(KQ_Q5, row, p);
}
static void kq_stage_q6(const uint8_t *const row[KQ_PANEL], kq_panel *p) {
    kq_stage(KQ_Q6, row, p);
}
typedef void (*kq_stage_fn)(const uint8_t *const[KQ_PANEL], kq_panel *);
static const kq_stage_fn k_stage[3] = {kq_stage_q4, kq_stage_q5, kq_stage_q6};

/* Rows [r0, r1) in panels of 8 (a last, partial one repeats its first row in the missing lanes and stores
 * only its own), tokens in passes of up to KQ_PASS. */
static void kq_panel_rows(const int kind, const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias,
                          int64_t r0, int64_t r1) {
    const int64_t nb = w->cols / FM_QK_K, bb = kq_block_bytes(kind), row_bytes = nb * bb;
    const uint8_t *base = w->data;
    const int T = a->T;
    kq_panel panel __attribute__((aligned(64)));
    __m256 s[KQ_PASS];
    for (int64_t rp = r0; rp < r1; rp += KQ_PANEL) {
        const int nr = r1 - rp < KQ_PANEL ? (int)(r1 - rp) : KQ_PANEL;
        /* lanes of rows past nr repeat row 0 and are not stored */
        const __m256i live =
            _mm256_cmpgt_epi32(_mm256_set1_epi32(nr), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        /* the next panel (past r1 too: likely this worker's next chunk), spread over the first pass */
        const int64_t next_end = rp + 2 * KQ_PANEL < w->rows ? rp + 2 * KQ_PANEL : w->rows;
        const char *pf = (const char *)base + (rp + nr) * row_bytes,
                   *pf_end = (const char *)base + next_end * row_bytes;
        const int per_block = pf_end > pf ? (int)(((pf_end - pf) / 64 + nb - 1) / nb) : 0;
        const __m256 bv = bias ? _mm256_maskload_ps(bias + rp, live) : _mm256_setzero_ps();
        for (int ts = 0; ts < T; ts += KQ_PASS) {
            const int nts = T - ts < KQ_PASS ? T - ts : KQ_PASS;
            for (int t = 0; t < nts; t++) s[t] = _mm256_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                for (int i = 0; i < per_block && pf < pf_end; i++, pf += 64) _mm_prefetch(pf, _MM_HINT_T1);
                const uint8_t *row[KQ_PANEL];
                for (int r = 0; r < KQ_PANEL; r++)
                    row[r] = base + (rp + (r < nr ? r : 0)) * row_bytes + b * bb;
                k_stage[kind](row, &panel);
                const fm_block_q8_K *xb = a->xk + (int64_t)ts * nb + b;
                for (int t0 = 0; t0 < nts; t0 += KQ_TILE) {
                    const int tt = nts - t0 < KQ_TILE ? nts - t0 : KQ_TILE;
                    k_tokens[kind][tt - 1](&panel, xb + (int64_t)t0 * nb, nb, s + t0);
                }
            }
            /* y = s + bias (or + 0), as fm_mm_store */
            for (int t = 0; t < nts; t++)
                _mm256_maskstore_ps(y + (int64_t)(ts + t) * w->rows + rp, live, _mm256_add_ps(s[t], bv));
        }
    }
}

void fm_mm_q4_K_avx2(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                     int64_t r1, void *tls) {
    (void)tls;
    if (a->T <= 2)
        kq_small_rows(KQ_Q4, w, a, y, bias, r0, r1);
    else
        kq_panel_rows(KQ_Q4, w, a, y, bias, r0, r1);
}

void fm_mm_q5_K_avx2(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                     int64_t r1, void *tls) {
    (void)tls;
    if (a->T <= 2)
        kq_small_rows(KQ_Q5, w, a, y, bias, r0, r1);
    else
        kq_panel_rows(KQ_Q5, w, a, y, bias, r0, r1);
}

void fm_mm_q6_K_avx2(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                     int64_t r1, void *tls) {
    (void)tls;
    if (a->T <= 2)
        kq_small_rows(KQ_Q6, w, a, y, bias, r0, r1);
    else
        kq_panel_rows(KQ_Q6, w, a, y, bias, r0, r1);
}

/* ---- the Q8_K activation quantiser ---- */

/* fm_quant_q8_K_ref, bit for bit, 8 values at a time: the same f32 operations per value (the product by
 * iscale, then ggml's round-half-even by adding 1.5 * 2^23 and reading the mantissa bits), the same first
 * element of largest magnitude (NaNs skipped: vmaxps returns its second operand when the first is NaN), the
 * same truncation to int8 (the low byte, even for the out-of-range values NaN or infinite inputs give) and
 * bsums summed from those bytes. */
void fm_quant_q8_K_avx2(const float *x, fm_block_q8_K *y, int64_t n) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t b = 0; b < n / FM_QK_K; b++, x += FM_QK_K) {
        fm_block_q8_K *o = &y[b];
        __m256 vmax = _mm256_setzero_ps();
        for (int i = 0; i < FM_QK_K; i += 8)
            vmax = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask), vmax);
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        if (amax == 0.0f) {
            memset(o, 0, sizeof *o);
            continue;
        }
        const __m256 vamax = _mm256_set1_ps(amax);
        int first = 0;
        for (int i = 0; i < FM_QK_K; i += 8) {
            const int eq = _mm256_movemask_ps(
                _mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask), vamax, _CMP_EQ_OQ));
            if (eq) {
                first = i + __builtin_ctz((unsigned)eq);
                break;
            }
        }
        const float iscale = -127.0f / x[first];
        const __m256 vs = _mm256_set1_ps(iscale), magic = _mm256_set1_ps(12582912.0f);
        const __m256i mant = _mm256_set1_epi32(0x007fffff), half = _mm256_set1_epi32(0x00400000),
                      cap = _mm256_set1_epi32(127), low8 = _mm256_set1_epi32(0xFF);
        for (int i = 0; i < FM_QK_K; i += 32) {
            __m256i v[4];
            for (int k = 0; k < 4; k++) {
                const __m256 f = _mm256_add_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(x + i + 8 * k)), magic);
                const __m256i q = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(f), mant), half);
                v[k] = _mm256_and_si256(_mm256_min_epi32(q, cap), low8); /* the byte (int8_t) keeps */
            }
            /* 4 x 8 bytes, in order: packs interleave the 128-bit halves, the permute undoes it */
            const __m256i bytes = _mm256_permutevar8x32_epi32(
                _mm256_packus_epi16(_mm256_packus_epi32(v[0], v[1]), _mm256_packus_epi32(v[2], v[3])),
                _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(o->qs + i), bytes);
            /* bsums 2 (i / 32), + 1: sums of the signed bytes, as sums of (byte + 128) over 8 bytes - 8 * 128
             */
            const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(bytes, _mm256_set1_epi8((char)0x80)),
                                                _mm256_setzero_si256());
            const __m256i pair = _mm256_add_epi64(sad, _mm256_shuffle_epi32(sad, 0x4E));
            o->bsums[i / 16] = (int16_t)(_mm256_cvtsi256_si32(pair) - 2048);
            o->bsums[i / 16 + 1] = (int16_t)(_mm256_extract_epi32(pair, 4) - 2048);
        }
        o->d = 1.0f / iscale;
    }
}
