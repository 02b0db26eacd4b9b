/* attention_avx2.c: the f16-cache inner loops of attention (a query against one key row, one probability
 * times one value row) with F16C conversion and FMA, 8 lanes at a time. Called only when fm_cpu_isa() >=
 * AVX2. */
#include <immintrin.h>
#include <string.h>

#include "cpu/attention_kernels.h"
#include "cpu/simd_avx.h"

/* One query's reduction of its accumulator, in the same order in every kernel here. */
static inline float reduce1(__m256 acc) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One accumulator, 8 dimensions at a time in order: the operations every dot product here performs. */
float fm_attn_dot_f16_avx2(const float *q, const uint16_t *k, int n) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i),
                              _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i))), acc);
    float sum = reduce1(acc);
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

/* Four queries against nk key rows (k + j * stride, in key order): out[u][j] = (q_u . k_j) * scale, each dot
 * product with fm_attn_dot_f16_avx2's operations (the same bits), each row loaded and converted once for the
 * four; rows j < npf also prefetch row j + ahead (the next block). Two rows at a time: eight accumulators,
 * each a chain of n / 8 FMAs, and each query's 8 values loaded once for both rows (pinned in a register:
 * GCC otherwise folded the load into both FMAs). Named accumulators, not arrays: GCC kept an array of them
 * on the stack. */
void fm_attn_dot4_rows_f16_avx2(const float *const q[4], const uint16_t *k, int64_t stride, int nk, int n,
                                float scale, float *const out[4], int npf, int ahead) {
    const float *q0 = q[0], *q1 = q[1], *q2 = q[2], *q3 = q[3];
    float *o0 = out[0], *o1 = out[1], *o2 = out[2], *o3 = out[3];
    int j = 0;
    for (; j + 2 <= nk; j += 2, k += 2 * stride) {
        for (int r = 0; r < 2; r++)
            if (j + r < npf)
                for (int off = 0; off < n; off += 32)
                    _mm_prefetch((const char *)(k + (int64_t)(ahead + r) * stride + off), _MM_HINT_T0);
        const uint16_t *k1 = k + stride;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        for (int i = 0; i < n; i += 8) {
            const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i)));
            const __m256 y = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k1 + i)));
            __m256 w = _mm256_loadu_ps(q0 + i);
            FM_PIN(w);
            a0 = _mm256_fmadd_ps(w, x, a0), b0 = _mm256_fmadd_ps(w, y, b0);
            w = _mm256_loadu_ps(q1 + i);
            FM_PIN(w);
            a1 = _mm256_fmadd_ps(w, x, a1), b1 = _mm256_fmadd_ps(w, y, b1);
            w = _mm256_loadu_ps(q2 + i);
            FM_PIN(w);
            a2 = _mm256_fmadd_ps(w, x, a2), b2 = _mm256_fmadd_ps(w, y, b2);
            w = _mm256_loadu_ps(q3 + i);
            FM_PIN(w);
            a3 = _mm256_fmadd_ps(w, x, a3), b3 = _mm256_fmadd_ps(w, y, b3);
        }
        o0[j] = reduce1(a0) * scale, o1[j] = reduce1(a1) * scale;
        o2[j] = reduce1(a2) * scale, o3[j] = reduce1(a3) * scale;
        o0[j + 1] = reduce1(b0) * scale, o1[j + 1] = reduce1(b1) * scale;
        o2[j + 1] = reduce1(b2) * scale, o3[j + 1] = reduce1(b3) * scale;
    }
    if (j < nk) { /* the last row of an odd count */
        if (j < npf)
            for (int off = 0; off < n; off += 32)
                _mm_prefetch((const char *)(k + (int64_t)ahead * stride + off), _MM_HINT_T0);
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int i = 0; i < n; i += 8) {
            const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i)));
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + i), x, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + i), x, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + i), x, a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + i), x, a3);
        }
        o0[j] = reduce1(a0) * scale, o1[j] = reduce1(a1) * scale;
        o2[j] = reduce1(a2) * scale, o3[j] = reduce1(a3) * scale;
    }
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

/* e^x for x <= 0, 8 lanes: x = n ln2 + r with |r| <= ln2 / 2, e^r by a degree-7 polynomial (Cephes' expf
 * coefficients), times 2^n built in the exponent bits; x below -87.3 gives e^-87.3 (~1e-38, a softmax weight
 * of nothing). Within 2 ulp of expf. */
static inline __m256 exp_nonpos(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

float fm_attn_exp_sum_avx2(float *s, int n, float mx) {
    const __m256 m = _mm256_set1_ps(mx);
    __m256 acc = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 e = exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(s + j), m));
        _mm256_storeu_ps(s + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    if (j < n) { /* the last 1..7 through the same lanes, zero-padded (e^-87.3 is dropped, not summed) */
        float t[8] = {0};
        memcpy(t, s + j, sizeof(float) * (size_t)(n - j));
        const __m256 keep =
            _mm256_cmp_ps(_mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_ps((float)(n - j)), _CMP_LT_OQ);
        const __m256 e = _mm256_and_ps(keep, exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(t), m)));
        _mm256_storeu_ps(t, e);
        memcpy(s + j, t, sizeof(float) * (size_t)(n - j));
        acc = _mm256_add_ps(acc, e);
    }
    return reduce1(acc);
}
