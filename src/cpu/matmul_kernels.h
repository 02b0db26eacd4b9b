/* matmul_kernels.h: internal interface between the matmul dispatcher (matmul.c) and the per-ISA kernels
 * (matmul_scalar.c, matmul_avx2.c, matmul_avx512.c). Not part of the public contract.
 *
 * A kernel computes the output rows [r0, r1) of y = W x for all T tokens of one call:
 *   y[t * rows + r] = dot(W[r], x[t]) + (bias ? bias[r] : 0).
 * It reads the activations from fm_mm_act, prepared once per call by the dispatcher, and must give the same
 * result as the scalar kernel of its type up to f32 summation order. Kernels tile rows x tokens so that each
 * weight block is loaded from memory once and reused for every token of the tile. */
#ifndef FM_CPU_MATMUL_KERNELS_H
#define FM_CPU_MATMUL_KERNELS_H

#include "cpu/matmul.h"

/* The SIMD Q8_0 kernels use an interleaved layout: a row's blocks go in groups of G (8 for AVX2, 16 for
 * AVX-512); a group is 8 vectors of 4 G bytes, and vector j holds bytes [4j, 4j + 4) of block g * G + l in
 * its 32-bit lane l. Integer dot products of a weight group with an activation group then leave the G block
 * sums in the G lanes, ready for one f32 multiply-add by the G block scales: no horizontal reductions. The
 * last group of a row is padded with zero blocks of scale 0. */
enum { FM_Q8_VECS = 8 }; /* vectors per group: 32 bytes of a block in 4-byte lanes */

typedef struct {
    int T;
    const float *x; /* [T][cols] f32 activations */
    /* Q8_0 weights, scalar kernel; Q4_0 / Q5_0 weights at every level: */
    const fm_block_q8_0 *xq; /* [cols / 32][T] Q8_0 activations, block-major */
    /* Q8_0 weights, SIMD kernels (interleaved layout above): */
    int64_t ng;        /* groups per row: ceil(cols / 32 / G) */
    const int8_t *xr;  /* [T][ng][8][4 G] interleaved activations (AVX2 batches of 10+ tokens: [T][ng][16][32]
                          int16 pairs, see matmul_q8_avx2.c) */
    const float *xs;   /* [T][ng][G] f32 value of each block's f16 scale; 0 in the padding */
    const int32_t *xc; /* [T][ng][G] 128 * (sum of the block's int8 values): the VNNI kernel's correction */
    /* K-quant weights: */
    const fm_block_q8_K *xk; /* [T][cols / 256] Q8_K activations, token-major */
    /* BF16 weights with AVX512-BF16: */
    const uint16_t *xbf_hi; /* [T][cols] bf16(x) */
    const uint16_t *xbf_lo; /* [T][cols] bf16(x - f32(xbf_hi)): hi + lo carries ~16 mantissa bits */
} fm_mm_act;

/* Computes rows [r0, r1) of y for all T tokens. `tls` is the calling worker's private scratch of the size
 * the kernel family asked for (fm_mm_q8_family.tls_bytes), or NULL for kernels that need none. */
typedef void (*fm_mm_kernel)(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                             int64_t r1, void *tls);
/* Quantises n values (a multiple of 32) to Q8_0 blocks y[i * stride] and, when d is not NULL, each block's
 * scale as f32 to d[i * stride]. */
typedef void (*fm_mm_quant_fn)(const float *x, fm_block_q8_0 *y, float *d, int64_t n, int64_t stride);

/* What the dispatcher needs to run a SIMD Q8_0 kernel: the activation preparation (into a workspace of
 * act_bytes(T, cols), filling a->ng, xr, xs and xc) and each worker's scratch size. pack_bytes/pack_rows
 * (NULL where the family reads the Q8_0 blocks as they are): the bytes of a matrix pre-packed for batches
 * of T tokens (0: those batches would not read it), and the packing of rows [r0, r1) into dst (the whole
 * matrix's buffer), which the kernel then reads through w->packed. Only the AVX2 family packs, so a packed
 * matrix stays valid at every level: the others ignore w->packed. */
typedef struct {
    size_t (*act_bytes)(int T, int64_t cols);
    void (*act_prep)(const float *x, int T, int64_t cols, void *ws, fm_mm_act *a);
    size_t (*tls_bytes)(int T, int64_t cols);
    fm_mm_kernel kern;
    size_t (*pack_bytes)(int T, int64_t rows, int64_t cols);
    void (*pack_rows)(const fm_matrix *w, int64_t r0, int64_t r1, void *dst);
    int reads_vnni4; /* kern also takes FM_LAYOUT_Q8_VNNI4 matrices (in row ranges of whole units of 4) */
} fm_mm_q8_family;

void fm_mm_f32_scalar(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                      int64_t r1, void *tls);
void fm_mm_f16_scalar(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                      int64_t r1, void *tls);
void fm_mm_bf16_scalar(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                       int64_t r1, void *tls);
void fm_mm_q8_0_scalar(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                       int64_t r1, void *tls);
void fm_quant_q8_0_scalar(const float *x, fm_block_q8_0 *y, float *d, int64_t n, int64_t stride);
/* Q4_0 / Q5_0 weights (either; w->dtype tells) x the block-major Q8_0 activations a->xq (quant_legacy.h). */
void fm_mm_legacy_scalar(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                         int64_t r1, void *tls);
/* Q4_K / Q5_K / Q6_K weights x the Q8_K activations a->xk, each super-block's term from fm_k_block_dot. */
void fm_mm_k_scalar(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                    int64_t r1, void *tls);

/* Compiled with AVX2+FMA+F16C; call only when fm_cpu_isa() >= FM_ISA_AVX2. */
void fm_mm_f32_avx2(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                    int64_t r1, void *tls);
void fm_mm_f16_avx2(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                    int64_t r1, void *tls);
void fm_mm_bf16_avx2(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                     int64_t r1, void *tls);
extern const fm_mm_q8_family fm_q8_family_avx2;
/* K-quants x Q8_K activations (matmul_k_avx2.c); bit-identical to the scalar kernels. */
void fm_mm_q4_K_avx2(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                     int64_t r1, void *tls);
void fm_mm_q5_K_avx2(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                     int64_t r1, void *tls);
void fm_mm_q6_K_avx2(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                     int64_t r1, void *tls);
/* Q4_0 / Q5_0 x block-major Q8_0 activations (matmul_legacy_avx2.c); bit-identical to the scalar kernel. */
void fm_mm_legacy_avx2(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                       int64_t r1, void *tls);
/* fm_quant_q8_K_ref (cpu/quant_k.h), the same bytes for every input, NaN and infinities included. */
void fm_quant_q8_K_avx2(const float *x, fm_block_q8_K *y, int64_t n);
void fm_quant_q8_0_avx2(const float *x, fm_block_q8_0 *y, float *d, int64_t n, int64_t stride);

/* Compiled with AVX-512 F/BW/VL/DQ (+VNNI, +BF16); call only when fm_cpu_isa() == FM_ISA_AVX512, and the
 * _vnni / _dpbf16 ones only when the CPU reports avx512vnni / avx512bf16. */
void fm_mm_f32_avx512(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                      int64_t r1, void *tls);
void fm_mm_f16_avx512(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                      int64_t r1, void *tls);
void fm_mm_bf16_avx512(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                       int64_t r1, void *tls);
void fm_mm_bf16_dpbf16_avx512(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                              int64_t r1, void *tls);
extern const fm_mm_q8_family fm_q8_family_vnni_avx512;
/* K-quants x Q8_K activations with VNNI (matmul_k_avx512.c); bit-identical to the scalar kernels. */
void fm_mm_q4_K_vnni_avx512(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                            int64_t r1, void *tls);
void fm_mm_q5_K_vnni_avx512(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                            int64_t r1, void *tls);
void fm_mm_q6_K_vnni_avx512(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                            int64_t r1, void *tls);
/* Compiled with AVX-512 + AMX-TILE/INT8 when the compiler supports them (FLASHMAP_HAVE_AMX); call only when
 * fm_cpu_amx() says the tiles may be used. Bit-identical to fm_q8_family_vnni_avx512 for every (row, token).
 */
extern const fm_mm_q8_family fm_q8_family_amx;
/* Whether this build has the AMX kernel, and the calls of fm_matmul / fm_matmul_multi that ran it (tests). */
int fm_mm_have_amx(void);
unsigned long fm_mm_amx_calls(void);
/* Splits x [n] into bf16 hi and lo parts (see fm_mm_act). */
void fm_split_bf16_avx512(const float *x, uint16_t *hi, uint16_t *lo, int64_t n);

/* y[t][r] = v + bias[r]: where every kernel writes one result. */
static inline void fm_mm_store(const fm_matrix *w, float *y, const float *bias, int64_t r, int t, float v) {
    y[(int64_t)t * w->rows + r] = v + (bias ? bias[r] : 0.0f);
}

/* Element k of a float-type row (F32, F16, BF16) as f32: the kernels' column tails. */
static inline float fm_mm_load1(fm_dtype dt, const void *row, int64_t k) {
    switch (dt) {
    case FM_DTYPE_F16:
        return fm_f16_to_f32(((const uint16_t *)row)[k]);
    case FM_DTYPE_BF16:
        return fm_bf16_to_f32(((const uint16_t *)row)[k]);
    default:
        return ((const float *)row)[k];
    }
}

#endif
