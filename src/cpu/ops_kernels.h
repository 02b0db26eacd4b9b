/* ops_kernels.h: the SIMD forms of ops.c's reductions (ops.c picks one per call from fm_cpu_isa()); each
 * returns what the scalar form returns. */
#ifndef FM_CPU_OPS_KERNELS_H
#define FM_CPU_OPS_KERNELS_H

#include <stdint.h>

int64_t fm_argmax_avx2(const float *x, int64_t n);

#endif
