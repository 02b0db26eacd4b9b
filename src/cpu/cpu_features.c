/* cpu_features.c: CPUID + XGETBV feature detection and the kernel level in use.
 * A feature counts only when the CPU reports it AND the OS saves its register state (XCR0): AVX needs the
 * SSE+AVX bits, AVX-512 additionally the opmask/ZMM bits. Detection runs once (pthread_once); the level is
 * an atomic so tests may lower it while other threads read it. AMX tiles also need the kernel's permission
 * (Linux 5.16+: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)), which applies to the whole process, so
 * detection asks for it once and counts AMX only when it is granted. */
#include "cpu/cpu_features.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define FM_X86 1
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#define FM_LINUX_X86_64 1
#endif

static fm_cpu_features g_features;
static fm_isa g_best;
static atomic_int g_isa, g_amx;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

#ifdef FM_X86
static unsigned long long read_xcr0(void) {
    unsigned eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}
#endif

/* Asks Linux for the AMX tile data state (XFEATURE_XTILEDATA = 18) for this process; 0 when granted. */
static int request_amx(void) {
#ifdef FM_LINUX_X86_64
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 0 : -1;
#else
    return -1;
#endif
}

static void detect(void) {
    fm_cpu_features f = {0};
#ifdef FM_X86
    unsigned a, b, c, d, max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf >= 1 && __get_cpuid(1, &a, &b, &c, &d)) {
        int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
        unsigned long long xcr0 = osxsave ? read_xcr0() : 0;
        int os_avx = osxsave && avx && (xcr0 & 0x6) == 0x6; /* XMM + YMM state */
        int os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;    /* opmask + ZMM_Hi256 + Hi16_ZMM */
        if (os_avx) {
            f.fma = (c >> 12) & 1;
            f.f16c = (c >> 29) & 1;
        }
        if (max_leaf >= 7 && __get_cpuid_count(7, 0, &a, &b, &c, &d)) {
            unsigned b7 = b, c7 = c;
            if (os_avx) f.avx2 = (b7 >> 5) & 1;
            /* AMX-TILE (EDX 24) + AMX-INT8 (EDX 25), with XTILECFG + XTILEDATA state (XCR0 bits 17, 18). */
            const int amx_cpu = ((d >> 24) & 1) && ((d >> 25) & 1) && (xcr0 & 0x60000) == 0x60000;
            if (os_avx512) {
                f.amx_int8 = amx_cpu && request_amx() == 0;
                f.avx512f = (b7 >> 16) & 1;
                f.avx512dq = (b7 >> 17) & 1;
                f.avx512bw = (b7 >> 30) & 1;
                f.avx512vl = (b7 >> 31) & 1;
                f.avx512vnni = (c7 >> 11) & 1;
            }
            if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) {
                if (os_avx) f.avxvnni = (a >> 4) & 1;
                if (os_avx512) f.avx512bf16 = (a >> 5) & 1;
            }
        }
    }
#endif
    g_features = f;
    g_best = FM_ISA_SCALAR;
    if (f.avx2 && f.fma && f.f16c) g_best = FM_ISA_AVX2;
    if (g_best == FM_ISA_AVX2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq) g_best = FM_ISA_AVX512;
    atomic_store(&g_isa, (int)g_best);
    const char *no_amx = getenv("FLASHMAP_NO_AMX");
    atomic_store(&g_amx, f.amx_int8 && !(no_amx && no_amx[0] && strcmp(no_amx, "0") != 0));
}

const fm_cpu_features *fm_cpu_features_get(void) {
    pthread_once(&g_once, detect);
    return &g_features;
}

fm_isa fm_cpu_isa(void) {
    pthread_once(&g_once, detect);
    return (fm_isa)atomic_load_explicit(&g_isa, memory_order_relaxed);
}

fm_isa fm_cpu_isa_best(void) {
    pthread_once(&g_once, detect);
    return g_best;
}

int fm_cpu_set_isa(fm_isa isa) {
    pthread_once(&g_once, detect);
    if ((int)isa < FM_ISA_SCALAR || isa > g_best) return -1;
    atomic_store(&g_isa, (int)isa);
    return 0;
}

int fm_cpu_amx(void) {
    pthread_once(&g_once, detect);
    return atomic_load_explicit(&g_amx, memory_order_relaxed);
}

int fm_cpu_set_amx(int on) {
    pthread_once(&g_once, detect);
    if (on && !g_features.amx_int8) return -1;
    atomic_store(&g_amx, on != 0);
    return 0;
}

const char *fm_isa_name(fm_isa isa) {
    switch (isa) {
    case FM_ISA_SCALAR:
        return "scalar";
    case FM_ISA_AVX2:
        return "avx2";
    case FM_ISA_AVX512:
        return "avx512";
    }
    return "?";
}
