/* attention_avx2.c: the f16-cache inner loops of attention (a query against one key row, one probability
 * times one value row) with F16C conversion and FMA, 8 lanes at a time. Called only when fm_cpu_isa() >=
 * AVX2. */
#include <immintrin.h>

#include "cpu/attention_kernels.h"

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
    const __m256 acc = _mm256_add_ps(acc0, acc1);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    float sum = _mm_cvtss_f32(s);
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
