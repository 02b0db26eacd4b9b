/* ops_avx2.c: the argmax of a logit row, 8 lanes at a time (compiled with -mavx2; called only when
 * fm_cpu_isa() >= FM_ISA_AVX2). The scalar loop's data-dependent branch took 3.5 ns a value on Zen 4, 0.53 ms
 * for a 151,936-token row: 9 ms of a 17-row verify block. */
#include <immintrin.h>
#include <math.h>

#include "cpu/ops_kernels.h"

/* Two passes, the scalar loop's answer: the largest non-NaN value (vmaxps returns its second operand when
 * the first is NaN, so NaN never enters the running maximum), then the first index holding a value equal to
 * it (+0 and -0 alike, as the scalar comparison has them); 0 when every value is NaN. */
int64_t fm_argmax_avx2(const float *x, int64_t n) {
    __m256 m8 = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) m8 = _mm256_max_ps(_mm256_loadu_ps(x + i), m8);
    float lanes[8];
    _mm256_storeu_ps(lanes, m8);
    float m = -INFINITY;
    for (int k = 0; k < 8; k++) m = lanes[k] > m ? lanes[k] : m;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    const __m256 mv = _mm256_set1_ps(m);
    for (i = 0; i + 8 <= n; i += 8) {
        const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), mv, _CMP_EQ_OQ));
        if (hit) return i + __builtin_ctz((unsigned)hit);
    }
    for (; i < n; i++)
        if (x[i] == m) return i;
    return 0;
}
