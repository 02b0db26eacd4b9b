/* attention_avx2.c: the f16-cache inner loops of attention (a query against one key row, one probability
 * times one value row) with F16C conversion and FMA, 8 lanes at a time. Called only when fm_cpu_isa() >=
 * AVX2. */
#include <immintrin.h>

#include "cpu/attention_kernels.h"

/* One query's reduction of its two accumulators, in the same order in every kernel here. */
static inline float reduce2(__m256 acc0, __m256 acc1) {
    const __m256 acc = _mm256_add_ps(acc0, acc1);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

float fm_attn_dot_f16_avx2(const float *q, const uint16_t *k, int n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i),
                               _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i))), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8),
                               _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i + 8))), acc1);
    }
    for (; i + 8 <= n; i += 8)
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i),
                               _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i))), acc0);
    float sum = reduce2(acc0, acc1);
    for (; i < n; i++) sum += q[i] * _cvtsh_ss(k[i]);
    return sum;
}

void fm_attn_axpy_f16_avx2(float *o, float p, const uint16_t *v, int n) {
    const __m256 pv = _mm256_set1_ps(p);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(o + i,
                         _mm256_fmadd_ps(pv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + i))),
                                         _mm256_loadu_ps(o + i)));
    for (; i < n; i++) o[i] += p * _cvtsh_ss(v[i]);
}

/* Named accumulators, not arrays: GCC kept an array of them on the stack. */
void fm_attn_dot4_f16_avx2(const float *const q[4], const uint16_t *k, int n, float out[4]) {
    const float *q0 = q[0], *q1 = q[1], *q2 = q[2], *q3 = q[3];
    __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0, b3 = a0;
    for (int i = 0; i < n; i += 16) {
        const __m256 k0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i)));
        const __m256 k1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i + 8)));
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + i), k0, a0);
        b0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + i + 8), k1, b0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + i), k0, a1);
        b1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + i + 8), k1, b1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + i), k0, a2);
        b2 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + i + 8), k1, b2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + i), k0, a3);
        b3 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + i + 8), k1, b3);
    }
    out[0] = reduce2(a0, b0), out[1] = reduce2(a1, b1), out[2] = reduce2(a2, b2), out[3] = reduce2(a3, b3);
}

/* nk value rows (v + j * stride, in key order) into four outputs, the outputs held in registers 16
 * dimensions at a time across the rows rather than loaded and stored for every row (which made the stores
 * the limit): each output element gets fm_attn_axpy_f16_avx2's fmadds in the same order (the same bits).
 * p[u][j]: query u's weight of row j. Rows j < npf also prefetch row j + ahead (the next block). */
void fm_attn_axpy4_rows_f16_avx2(float *const o[4], const float *const p[4], const uint16_t *v,
                                 int64_t stride, int nk, int n, int npf, int ahead) {
    const float *p0 = p[0], *p1 = p[1], *p2 = p[2], *p3 = p[3];
    for (int c = 0; c < n; c += 16) {
        float *o0 = o[0] + c, *o1 = o[1] + c, *o2 = o[2] + c, *o3 = o[3] + c;
        __m256 a0 = _mm256_loadu_ps(o0), b0 = _mm256_loadu_ps(o0 + 8), a1 = _mm256_loadu_ps(o1),
               b1 = _mm256_loadu_ps(o1 + 8), a2 = _mm256_loadu_ps(o2), b2 = _mm256_loadu_ps(o2 + 8),
               a3 = _mm256_loadu_ps(o3), b3 = _mm256_loadu_ps(o3 + 8);
        const uint16_t *r = v + c;
        for (int j = 0; j < nk; j++, r += stride) {
            if (c == 0 && j < npf) /* one row's lines per row, spread over the first pass */
                for (int off = 0; off < n; off += 32)
                    _mm_prefetch((const char *)(r + (int64_t)ahead * stride + off), _MM_HINT_T0);
            const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)r));
            const __m256 y = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + 8)));
            const __m256 w0 = _mm256_broadcast_ss(p0 + j), w1 = _mm256_broadcast_ss(p1 + j);
            a0 = _mm256_fmadd_ps(w0, x, a0), b0 = _mm256_fmadd_ps(w0, y, b0);
            a1 = _mm256_fmadd_ps(w1, x, a1), b1 = _mm256_fmadd_ps(w1, y, b1);
            const __m256 w2 = _mm256_broadcast_ss(p2 + j), w3 = _mm256_broadcast_ss(p3 + j);
            a2 = _mm256_fmadd_ps(w2, x, a2), b2 = _mm256_fmadd_ps(w2, y, b2);
            a3 = _mm256_fmadd_ps(w3, x, a3), b3 = _mm256_fmadd_ps(w3, y, b3);
        }
        _mm256_storeu_ps(o0, a0), _mm256_storeu_ps(o0 + 8, b0), _mm256_storeu_ps(o1, a1);
        _mm256_storeu_ps(o1 + 8, b1), _mm256_storeu_ps(o2, a2), _mm256_storeu_ps(o2 + 8, b2);
        _mm256_storeu_ps(o3, a3), _mm256_storeu_ps(o3 + 8, b3);
    }
}
