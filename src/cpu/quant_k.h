/* quant_k.h: the K-quants (Q4_K, Q5_K, Q6_K) on the CPU: dequantisation (token lookups, tests), the Q8_K
 * activation quantiser their products read, and the scalar definition of a row-block product that every
 * SIMD kernel reproduces.
 *
 * A super-block's product with Q8_K activations is computed exactly in integers, as ggml does: for Q4_K and
 * Q5_K, isum = sum_j sc_j * dot(q_j, x_j) and msum = sum_j m_j * (sum of x_j), over the 8 sub-blocks j of
 * 32; then  d_x * (d * isum - dmin * msum)  in f32. Q6_K: isum = sum_j sc_j * dot(q_j - 32, x_j) over its 16
 * sub-blocks of 16, then d_x * d * isum. */
#ifndef FM_CPU_QUANT_K_H
#define FM_CPU_QUANT_K_H

#include <stdint.h>

#include "core/dtype.h"

/* ggml's quantize_row_q8_K_ref, bit for bit: per 256 values, the one of largest magnitude maps to -127
 * (d = -max / 127), q = round-half-even(x / d) capped at 127; bsums[j] = the sum of q[16j .. 16j + 15].
 * An all-zero block gets d = 0, q = 0, bsums = 0. n must be a multiple of 256. */
void fm_quant_q8_K_ref(const float *x, fm_block_q8_K *y, int64_t n);

/* out[0 .. n) = the weights of n / 256 consecutive blocks of type t (a K-quant), as ggml dequantises them. */
void fm_dequant_row_k(fm_dtype t, const void *blocks, float *out, int64_t n);

/* The integer sums of one super-block against one Q8_K block (see the top of this file). */
typedef struct {
    int32_t isum, msum; /* msum is 0 for Q6_K */
} fm_k_sums;

fm_k_sums fm_k_sums_q4_K(const fm_block_q4_K *w, const fm_block_q8_K *x);
fm_k_sums fm_k_sums_q5_K(const fm_block_q5_K *w, const fm_block_q8_K *x);
fm_k_sums fm_k_sums_q6_K(const fm_block_q6_K *w, const fm_block_q8_K *x);

/* A Q4_K / Q5_K block's contribution to its row's dot product, from its integer sums; the f32 steps in the
 * order every kernel uses. */
static inline float fm_k_block_value(float dw, float dminw, float dx, fm_k_sums s) {
    return dx * (dw * (float)s.isum - dminw * (float)s.msum);
}

/* One super-block of type t (a K-quant) against one Q8_K block: its term of the row's dot product,
 * fm_k_block_value of its sums. */
float fm_k_block_dot(fm_dtype t, const void *w, const fm_block_q8_K *x);

#endif
