/* matmul.h: the CPU's weight-times-activations products, for every weight type, for T tokens at once.
 * One call reads each weight byte once for all T rows of x (the point of verify blocks and drafts).
 * Kernels: a scalar reference per type beside AVX2 and AVX-512 versions, chosen at run time (cpu_features). */
#ifndef FM_CPU_MATMUL_H
#define FM_CPU_MATMUL_H

#include <stdint.h>

#include "core/dtype.h"
#include "core/threadpool.h"

/* A read-only row-major matrix [rows][cols] in one weight type (a GGUF or safetensors tensor in place). */
typedef struct {
    fm_dtype dtype;
    int64_t rows, cols;
    const void *data;
} fm_matrix;

/* y[t * rows + r] = sum_k W[r][k] * x[t * cols + k] (+ bias[r] when bias != NULL), for t < T.
 * Q8_0 weights quantise x to Q8_0 blocks once per call (as llama.cpp does) and use int8 dot products.
 * x and y must not overlap. */
void fm_matmul(fm_pool *pool, const fm_matrix *w, const float *x, int T, float *y, const float *bias);

/* out[k] = W[row][k] as f32 (token-table lookups, uniform_embeds). */
void fm_matrix_row_f32(const fm_matrix *w, int64_t row, float *out);

/* The same product computed by the scalar reference kernels only (tests, parity checks). */
void fm_matmul_reference(const fm_matrix *w, const float *x, int T, float *y, const float *bias);

#endif
