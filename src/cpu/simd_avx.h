/* simd_avx.h: helpers shared by the AVX2 and AVX-512 kernel files (include only from files compiled with AVX2
 * or wider: matmul_avx2.c, matmul_avx512.c). */
#ifndef FM_CPU_SIMD_AVX_H
#define FM_CPU_SIMD_AVX_H

#include <immintrin.h>

#define FM_INLINE static inline __attribute__((always_inline))

/* Makes the compiler materialise v here, in a register: keeps an integer accumulation a chain in the order
 * written (GCC otherwise reassociates it into a tree of partial sums and spills them). */
#define FM_PIN(v) __asm__("" : "+x"(v))

/* Sum of the 8 lanes, in a fixed order (pairs of halves, then pairs within). */
FM_INLINE float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#endif
