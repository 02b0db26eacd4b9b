/* quant_legacy.h: llama.cpp's legacy Q4_0 and Q5_0 weights on the CPU: dequantisation (token lookups,
 * tests), the integer block sums their products use, and the round-to-nearest quantiser of synthetic models.
 *
 * A block's product with a Q8_0 activation block is computed as ggml does: isum = sum_j (q_j - o) * x_j
 * exactly in int32 (o = 8 for Q4_0, 16 for Q5_0), then s += isum * (d_w * d_x) in f32, block after block:
 * the same f32 step as the Q8_0 kernels, so a row's result does not depend on the batch it is in. */
#ifndef FM_CPU_QUANT_LEGACY_H
#define FM_CPU_QUANT_LEGACY_H

#include <stdint.h>

#include "core/dtype.h"

/* out[0 .. n) = the weights of n / 32 consecutive blocks of type t (Q4_0 or Q5_0): d * (q - o), as ggml
 * (and gguf-py) dequantise them; every such product is exact in f32. */
void fm_dequant_row_legacy(fm_dtype t, const void *blocks, float *out, int64_t n);

/* The 32 signed weights q - o of one block of type t, as int8 (what the products multiply); returns the
 * block's f32 scale. */
float fm_legacy_unpack(fm_dtype t, const void *block, int8_t q[32]);

/* isum of a block of type t against one Q8_0 activation block; *dw gets the block's f32 scale. */
int32_t fm_legacy_isum(fm_dtype t, const void *w, const fm_block_q8_0 *x, float *dw);

/* Round-to-nearest quantiser of n weights (a multiple of 32) into blocks of type t (synth models): per
 * block d = max|x| / 7 (Q4_0) or / 15 (Q5_0), rounded to f16 (to the next f16 up where a subnormal's
 * rounding would leave the largest weight more than half a step outside), and q = nearest(x / d) (ties away
 * from 0) clamped to -8..7 (-16..15). The largest weight then sits at +-7 (+-15) steps, inside the range on
 * both sides, so every weight is within half a step (plus the f16 rounding of d) of its value; ggml's
 * reference instead maps the signed extreme to -8 (-16), which gains a step on one side only. */
void fm_quant_legacy_rtn(fm_dtype t, const float *x, void *y, int64_t n);

#endif
