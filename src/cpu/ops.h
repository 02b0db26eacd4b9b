/* ops.h: small f32 vector ops of the forward passes (norms, activations, reductions). Row-local and cheap
 * next to the matrix products, so plain C that compilers vectorise is enough here, but for the argmax of a
 * vocabulary-sized row (its branch does not vectorise: ops_avx2.c). */
#ifndef FM_CPU_OPS_H
#define FM_CPU_OPS_H

#include <stdint.h>

/* out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]; out may equal x. */
void fm_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps);
/* g[i] = silu(g[i]) * u[i]. */
void fm_silu_mul(float *g, const float *u, int64_t n);
/* Index of the largest value; ties go to the lowest index (NaN never wins). */
int64_t fm_argmax(const float *x, int64_t n);
/* x = softmax(x), max-subtracted. */
void fm_softmax(float *x, int64_t n);
float fm_dot_f32(const float *a, const float *b, int64_t n);
/* y[i] += a * x[i]. */
void fm_axpy(float *y, float a, const float *x, int64_t n);

#endif
