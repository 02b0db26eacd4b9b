/* attention_kernels.h: the inner loops of attention over an f16 KV cache, per ISA (attention.c picks one per
 * call from fm_cpu_isa()). Within one level the result of a (row, head) never depends on the batch. */
#ifndef FM_CPU_ATTENTION_KERNELS_H
#define FM_CPU_ATTENTION_KERNELS_H

#include <stdint.h>

/* sum_i q[i] * f32(k[i]) */
typedef float (*fm_attn_dot_fn)(const float *q, const uint16_t *k, int n);
/* o[i] += p * f32(v[i]) */
typedef void (*fm_attn_axpy_fn)(float *o, float p, const uint16_t *v, int n);
/* s[j] = e^(s[j] - mx) for j < n (mx >= every s[j]); returns their sum (each level in its own fixed order) */
typedef float (*fm_attn_exp_sum_fn)(float *s, int n, float mx);

float fm_attn_dot_f16_avx2(const float *q, const uint16_t *k, int n);
void fm_attn_axpy_f16_avx2(float *o, float p, const uint16_t *v, int n);
float fm_attn_exp_sum_avx2(float *s, int n, float mx);
/* Four queries against nk key rows, and nk value rows into four outputs (rows at k / v + j * stride, in key
 * order; scores scaled into out[u][j]; weights p[u][j]), with each query's operations those of the one-query
 * kernels above (the same bits), each row loaded and converted once for the four; rows j < npf also
 * prefetch row j + ahead. n % 16 == 0. */
void fm_attn_dot4_rows_f16_avx2(const float *const q[4], const uint16_t *k, int64_t stride, int nk, int n,
                                float scale, float *const out[4], int npf, int ahead);
void fm_attn_axpy4_rows_f16_avx2(float *const o[4], const float *const p[4], const uint16_t *v,
                                 int64_t stride, int nk, int n, int npf, int ahead);

#endif
