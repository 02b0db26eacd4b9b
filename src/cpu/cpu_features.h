/* cpu_features.h: what the running CPU can do (CPUID + XGETBV), and which kernel level is in use. */
#ifndef FM_CPU_FEATURES_H
#define FM_CPU_FEATURES_H

typedef enum {
    FM_ISA_SCALAR = 0,
    FM_ISA_AVX2,   /* AVX2 + FMA + F16C */
    FM_ISA_AVX512, /* AVX-512 F/BW/VL/DQ; VNNI and BF16 reported separately */
} fm_isa;

typedef struct {
    int avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, avx512bf16, avxvnni;
} fm_cpu_features;

const fm_cpu_features *fm_cpu_features_get(void);
/* The level in use: the best this CPU runs, unless fm_cpu_set_isa lowered it. */
fm_isa fm_cpu_isa(void);
/* The best level this CPU (and OS) supports, whatever fm_cpu_set_isa chose. */
fm_isa fm_cpu_isa_best(void);
/* Forces a level (tests compare every level with the scalar reference); returns -1 if the CPU lacks it. */
int fm_cpu_set_isa(fm_isa isa);
const char *fm_isa_name(fm_isa isa);

#endif
