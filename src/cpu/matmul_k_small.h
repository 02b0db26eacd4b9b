/* matmul_k_small.h: the 1-2 token way of the SIMD K-quant kernels (matmul_k_avx2.c's top comment), the
 * same in both files around their own kq_block: a file includes it after defining
 *   kq_block(kind, TP, blk, xb, xstride, li, lm)
 * (one row's super-block against TP tokens: per token 8 int32 lanes of isum partials li and of msum
 * partials lm), and gets kq_small_rows. Not a header of its own: it is part of the file that includes it,
 * compiled with that file's ISA flags. */

/* v[0..7] (8 int32 lanes each) to the vector of their 8 lane sums, in order. */
FM_INLINE __m256i kq_tree(const __m256i v[8]) {
    const __m256i h01 = _mm256_hadd_epi32(v[0], v[1]), h23 = _mm256_hadd_epi32(v[2], v[3]);
    const __m256i h45 = _mm256_hadd_epi32(v[4], v[5]), h67 = _mm256_hadd_epi32(v[6], v[7]);
    const __m256i q0 = _mm256_hadd_epi32(h01, h23), q1 = _mm256_hadd_epi32(h45, h67); /* halves: 0-3 | 4-7 */
    return _mm256_add_epi32(_mm256_permute2x128_si256(q0, q1, 0x21), _mm256_blend_epi32(q0, q1, 0xF0));
}

/* Rows wr + r * row_bytes (r < nr of 8) x TP tokens (1 or 2; xk[t * nb]), all nb blocks. Lane l of group
 * g (of TP) is row 8 g / TP + l / TP, token l % TP; out[g * 8 + l] its dot product. Per block and group, the
 * 8 lanes' partial-sum vectors go through kq_tree to one vector of isums (msums likewise), then the f32
 * step. Per lane the scalar kernel's operations. */
FM_INLINE void kq_small_tile(const int kind, const int TP, const uint8_t *wr, int64_t row_bytes, int nr,
                             const fm_block_q8_K *xk, int64_t nb, float *out, const char **pf,
                             const char *pf_end, int per_block) {
    const int RG = 8 / TP, bb = kq_block_bytes(kind);
    const __m256i lane_row =
        _mm256_setr_epi32(0 / TP, 1 / TP, 2 / TP, 3 / TP, 4 / TP, 5 / TP, 6 / TP, 7 / TP);
    __m256 s[2];
#pragma GCC unroll 2
    for (int g = 0; g < TP; g++) s[g] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        for (int i = 0; i < per_block && *pf < pf_end; i++, *pf += 64) _mm_prefetch(*pf, _MM_HINT_T1);
        const fm_block_q8_K *xb = xk + b;
        const __m256 dx = TP == 1 ? _mm256_set1_ps(xb[0].d)
                                  : _mm256_setr_ps(xb[0].d, xb[nb].d, xb[0].d, xb[nb].d, xb[0].d, xb[nb].d,
                                                   xb[0].d, xb[nb].d);
#pragma GCC unroll 2
        for (int g = 0; g < TP; g++) {
            __m256i li[8], lm[8];
            uint64_t d16[2] = {0, 0}, m16[2] = {0, 0};
#pragma GCC unroll 8
            for (int rr = 0; rr < RG; rr++) {
                const int r = g * RG + rr;
                if (r >= nr) {
#pragma GCC unroll 2
                    for (int t = 0; t < TP; t++) li[rr * TP + t] = lm[rr * TP + t] = _mm256_setzero_si256();
                    continue;
                }
                const uint8_t *blk = wr + r * row_bytes + b * bb;
                kq_block(kind, TP, blk, xb, nb, li + rr * TP, lm + rr * TP);
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
#pragma GCC unroll 2
    for (int g = 0; g < TP; g++) _mm256_storeu_ps(out + 8 * g, s[g]);
}

#define KQ_SMALL_FN(kind, TP)                                                                                \
    static void kq_small_##kind##_##TP(const uint8_t *wr, int64_t row_bytes, int nr,                         \
                                       const fm_block_q8_K *xk, int64_t nb, float *out, const char **pf,     \
                                       const char *pf_end, int per_block) {                                  \
        kq_small_tile(kind, TP, wr, row_bytes, nr, xk, nb, out, pf, pf_end, per_block);                      \
    }
KQ_SMALL_FN(KQ_Q4, 1)
KQ_SMALL_FN(KQ_Q4, 2)
KQ_SMALL_FN(KQ_Q5, 1)
KQ_SMALL_FN(KQ_Q5, 2)
KQ_SMALL_FN(KQ_Q6, 1)
KQ_SMALL_FN(KQ_Q6, 2)
#undef KQ_SMALL_FN
typedef void (*kq_small_fn)(const uint8_t *, int64_t, int, const fm_block_q8_K *, int64_t, float *,
                            const char **, const char *, int);
static const kq_small_fn k_small[3][2] = {{kq_small_KQ_Q4_1, kq_small_KQ_Q4_2},
                                          {kq_small_KQ_Q5_1, kq_small_KQ_Q5_2},
                                          {kq_small_KQ_Q6_1, kq_small_KQ_Q6_2}};

/* Batches of 1 or 2 tokens: rows in tiles of 8, the next 8 prefetched into L2 while a tile runs. */
static void kq_small_rows(const int kind, const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias,
                          int64_t r0, int64_t r1) {
    const int64_t nb = w->cols / FM_QK_K, row_bytes = nb * kq_block_bytes(kind);
    const uint8_t *base = w->data;
    const int T = a->T;
    for (int64_t rt = r0; rt < r1; rt += 8) {
        const int nr = r1 - rt < 8 ? (int)(r1 - rt) : 8;
        const int64_t next_end = rt + 16 < w->rows ? rt + 16 : w->rows;
        const char *pf = (const char *)base + (rt + nr) * row_bytes,
                   *pf_end = (const char *)base + next_end * row_bytes;
        const int per_block = pf_end > pf ? (int)(((pf_end - pf) / 64 + nb - 1) / nb) : 0;
        float out[16];
        k_small[kind][T - 1](base + rt * row_bytes, row_bytes, nr, a->xk, nb, out, &pf, pf_end, per_block);
        for (int r = 0; r < nr; r++)
            for (int t = 0; t < T; t++) fm_mm_store(w, y, bias, rt + r, t, out[r * T + t]);
    }
}
