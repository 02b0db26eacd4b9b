/* matmul_k_simd.h: what the AVX2 and AVX-512 K-quant kernels (matmul_k_avx2.c, matmul_k_avx512.c) share
 * before their own code: the weight kinds and the unpacking of a block's 6-bit scales and mins. Each file
 * compiles it with its own ISA flags. */
#ifndef FM_CPU_MATMUL_K_SIMD_H
#define FM_CPU_MATMUL_K_SIMD_H

#include <stdint.h>
#include <string.h>

#include "core/dtype.h"
#include "cpu/simd_avx.h"

enum { KQ_Q4 = 0, KQ_Q5 = 1, KQ_Q6 = 2 };

static inline int kq_block_bytes(const int kind) {
    return kind == KQ_Q4   ? (int)sizeof(fm_block_q4_K)
           : kind == KQ_Q5 ? (int)sizeof(fm_block_q5_K)
                           : (int)sizeof(fm_block_q6_K);
}

/* The 8 6-bit scales and 8 mins of a Q4_K / Q5_K block as bytes (fm_k_scale_min for all j at once): j < 4
 * in the low 6 bits of bytes j (scales) and j + 4 (mins); j >= 4 in the nibbles of byte j + 4, with their
 * top 2 bits in the top bits of bytes j - 4 (scales) and j (mins). */
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

#endif
