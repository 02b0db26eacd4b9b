/* bench_machine.h: a one-paragraph description of the machine a benchmark ran on (CPU model, cores, the SIMD
 * flags that matter to the kernels, memory, kernel), from /proc and uname. */
#ifndef FM_TOOLS_BENCH_MACHINE_H
#define FM_TOOLS_BENCH_MACHINE_H

#include <stddef.h>

/* Writes e.g. "AMD EPYC, 2 logical CPUs (2 cores), avx2 yes, avx512f no, ..., 23.4 GiB RAM, Linux 6.1". */
void bench_machine_describe(char *out, size_t outlen);

#endif
