/* matmul_legacy_avx2.c: Q4_0 / Q5_0 weights x block-major Q8_0 activations with AVX2, bit-identical to the
 * scalar kernels (matmul_scalar.c) at any T. A block's 32 weights are unpacked once per tile of 8 tokens into
 * one vector of int8 (q - 8, or q - 16 with the fifth bits); each token's int8 dot product is exact in int32
 * (|w| * sign-adjusted x in int16 pairs of at most 2 * 16 * 127, then int32 sums), and the f32 step
 * s += isum * (d_w * d_x) is the scalar kernel's, block by block, in its order. The product is kept a
 * statement of its own so that no compiler fuses it with the sum (the scalar build has no FMA). */
#include <immintrin.h>
#include <string.h>

#include "cpu/matmul_kernels.h"

/* Weights j < 16 from the low nibbles (lane 0), j >= 16 from the high ones (lane 1), as 0..15. */
static inline __m256i nibbles(const uint8_t qs[16]) {
    const __m128i v = _mm_loadu_si128((const __m128i *)qs), m = _mm_set1_epi8(0xF);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

static inline __m256i unpack_q4_0(const fm_block_q4_0 *b) {
    return _mm256_sub_epi8(nibbles(b->qs), _mm256_set1_epi8(8));
}

/* Byte j gets 0x10 when bit j of qh is set: byte j / 8 of qh spread over bytes 8 (j / 8) .. 8 (j / 8) + 7,
 * then each byte tested against its bit. */
static inline __m256i unpack_q5_0(const fm_block_q5_0 *b) {
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
                                               _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                                                 0x0101010101010101LL, 0x0000000000000000LL));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    const __m256i q = _mm256_or_si256(nibbles(b->qs), _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    return _mm256_sub_epi8(q, _mm256_set1_epi8(16));
}

/* sum_j w_j x_j exactly: |w| <= 16 and |x| <= 127 (Q8_0 activations), so the int16 pairs cannot saturate. */
static inline int32_t dot32(__m256i w, const int8_t *x) {
    const __m256i xv = _mm256_loadu_si256((const __m256i *)x);
    const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xv, w));
    const __m256i p32 = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(p32), _mm256_extracti128_si256(p32, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

void fm_mm_legacy_avx2(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                       int64_t r1, void *tls) {
    (void)tls;
    enum { TILE = 8 };
    const int64_t nb = w->cols / FM_QK8_0;
    const size_t row_bytes = fm_dtype_row_bytes(w->dtype, w->cols);
    const int five = w->dtype == FM_DTYPE_Q5_0;
    for (int64_t r = r0; r < r1; r++) {
        const char *wr = (const char *)w->data + (size_t)r * row_bytes;
        for (int t0 = 0; t0 < a->T; t0 += TILE) {
            const int nt = a->T - t0 < TILE ? a->T - t0 : TILE;
            float s[TILE] = {0};
            for (int64_t b = 0; b < nb; b++) {
                __m256i q;
                float dw;
                if (five) {
                    const fm_block_q5_0 *wb = (const fm_block_q5_0 *)wr + b;
                    q = unpack_q5_0(wb);
                    dw = _cvtsh_ss(wb->d);
                } else {
                    const fm_block_q4_0 *wb = (const fm_block_q4_0 *)wr + b;
                    q = unpack_q4_0(wb);
                    dw = _cvtsh_ss(wb->d);
                }
                const fm_block_q8_0 *xb = a->xq + b * a->T + t0;
                for (int i = 0; i < nt; i++) {
                    const int32_t isum = dot32(q, xb[i].qs);
                    const float p = (float)isum * (dw * _cvtsh_ss(xb[i].d));
                    s[i] += p;
                }
            }
            for (int i = 0; i < nt; i++) fm_mm_store(w, y, bias, r, t0 + i, s[i]);
        }
    }
}
