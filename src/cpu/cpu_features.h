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
    int amx_int8; /* AMX-TILE + AMX-INT8 reported, the OS saves tile state (XCR0), and Linux let this process
                     use the tiles (arch_prctl ARCH_REQ_XCOMP_PERM, asked once at detection) */
} fm_cpu_features;

const fm_cpu_features *fm_cpu_features_get(void);
/* The level in use: the best this CPU runs, unless fm_cpu_set_isa lowered it. */
fm_isa fm_cpu_isa(void);
/* The best level this CPU (and OS) supports, whatever fm_cpu_set_isa chose. */
fm_isa fm_cpu_isa_best(void);
/* Forces a level (tests compare every level with the scalar reference); returns -1 if the CPU lacks it. */
int fm_cpu_set_isa(fm_isa isa);
const char *fm_isa_name(fm_isa isa);
/* Whether the AVX-512 level may use the AMX-INT8 Q8_0 kernel: amx_int8 above, unless FLASHMAP_NO_AMX=1 was
 * set at detection or fm_cpu_set_amx(0) turned it off. */
int fm_cpu_amx(void);
/* Turns the AMX kernel on or off (tests, benchmarks); returns -1 when turning it on on a CPU without it. */
int fm_cpu_set_amx(int on);

#endif
