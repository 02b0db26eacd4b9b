#include "cpu/ops.h"

#include <math.h>

#include "cpu/cpu_features.h"
#include "cpu/ops_kernels.h"

void fm_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    double ss = 0; /* double: the sum of 10k squares must not lose the small ones */
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    const float r = (float)(1.0 / sqrt(ss / (double)n + eps));
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * r * w[i];
}

void fm_silu_mul(float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

int64_t fm_argmax(const float *x, int64_t n) {
#if defined(__x86_64__) || defined(__i386__)
    if (fm_cpu_isa() >= FM_ISA_AVX2) return fm_argmax_avx2(x, n);
#endif
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best] || (x[best] != x[best] && x[i] == x[i])) best = i;
    return best;
}

void fm_softmax(float *x, int64_t n) {
    float mx = -INFINITY, sum = 0;
    for (int64_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    for (int64_t i = 0; i < n; i++) sum += (x[i] = expf(x[i] - mx));
    for (int64_t i = 0; i < n; i++) x[i] /= sum;
}

float fm_dot_f32(const float *a, const float *b, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

void fm_axpy(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}
