/* matmul.h: the CPU's weight-times-activations products, for every weight type, for T tokens at once.
 * One call reads each weight byte once for all T rows of x (the point of verify blocks and drafts).
 * Kernels: a scalar reference per type beside AVX2 and AVX-512 versions, chosen at run time (cpu_features).
 */
#ifndef FM_CPU_MATMUL_H
#define FM_CPU_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/threadpool.h"

/* How a Q8_0 matrix's bytes are laid out. FM_LAYOUT_ROWS: as in the file, rows of 34-byte blocks.
 * FM_LAYOUT_Q8_VNNI4: the same bytes rearranged in place (fm_matrix_repack_vnni4) for the AVX-512 VNNI
 * kernel, which then reads them with plain vector loads instead of transposing every block it streams. Rows
 * go in units of 4 and columns in groups of 512 (16 blocks); unit u, group g is 2176 bytes at
 * (u * cols / 512 + g) * 2176: first 32 vectors of 64 bytes, vector 4 j + r (j = 0..7, row r = 0..3) holding
 * in its 32-bit lane l bytes [4j, 4j + 4) of row r's block 16 g + l, each XOR 0x80 (w + 128, unsigned, as
 * vpdpbusd takes it), so that the kernel reads them in address order; then row r = 0..3's 16 block scales
 * (f16). That is 4 x 16 blocks of 34 bytes: the size of the rows it replaces. */
typedef enum { FM_LAYOUT_ROWS = 0, FM_LAYOUT_Q8_VNNI4 = 1 } fm_layout;

/* A read-only row-major matrix [rows][cols] in one weight type (a GGUF or safetensors tensor in place).
 * packed: NULL, or (Q8_0 only) the same rows already in the layout the AVX2 kernel's batches read
 * (fm_matrix_pack_q8_0), which then skip widening them; data stays the matrix for every other kernel.
 * layout: FM_LAYOUT_ROWS except after fm_matrix_repack_vnni4. */
typedef struct {
    fm_dtype dtype;
    int64_t rows, cols;
    const void *data;
    const void *packed;
    fm_layout layout;
} fm_matrix;

/* Checks what fm_matmul assumes: a known dtype, rows/cols > 0, cols a multiple of the block size
 * (32 for Q8_0, Q4_0 and Q5_0, 256 for the K-quants), data not NULL. Loaders call it once per weight;
 * fm_matmul itself does not check. */
int fm_matrix_check(const fm_matrix *w, char *err, size_t errlen);

/* y[t * rows + r] = sum_k W[r][k] * x[t * cols + k] (+ bias[r] when bias != NULL), for t < T.
 * Q8_0 weights quantise x to Q8_0 blocks once per call (as llama.cpp does) and use int8 dot products, and so
 * do Q4_0 / Q5_0 weights (cpu/quant_legacy.h);
 * K-quant weights (Q4_K, Q5_K, Q6_K) quantise it to Q8_K blocks of 256 (cpu/quant_k.h), as llama.cpp does.
 * x and y must not overlap. */
void fm_matmul(fm_pool *pool, const fm_matrix *w, const float *x, int T, float *y, const float *bias);

/* ys[i] = ws[i] x for i < n: the results of n fm_matmul calls (bit for bit), in one pool job, with x
 * prepared once (Q8_0 quantisation) and the workers taking row chunks of all matrices from one counter
 * (q/k/v, gate/up). The matrices must share cols (x's row length); of different dtypes, or more than 16,
 * they run as separate fm_matmul calls. No biases. */
void fm_matmul_multi(fm_pool *pool, const fm_matrix *const *ws, int n, const float *x, int T,
                     float *const *ys);

/* Bytes of a pre-packed copy of w that batches of T tokens would read at the current ISA level: the AVX2
 * Q8_0 kernel's int16 rows (about twice the Q8_0 bytes) from 10 tokens; 0 where they would read w->data as
 * it is (other dtypes, fewer tokens, the AVX-512 VNNI and AMX kernels, the scalar level). */
size_t fm_matrix_packed_bytes(const fm_matrix *w, int T);
/* Fills dst (fm_matrix_packed_bytes(w, T) bytes, 64-byte aligned, owned by the caller and kept while w is
 * used) with w's rows pre-packed and points w->packed at it; results stay bit for bit those of the unpacked
 * matrix. Does nothing when fm_matrix_packed_bytes(w, T) is 0. pool may be NULL. */
void fm_matrix_pack_q8_0(fm_pool *pool, fm_matrix *w, int T, void *dst);

/* Whether fm_matrix_repack_vnni4 would pay off for w at the current ISA level: a Q8_0 matrix in rows, with
 * rows a multiple of 4 and cols of 512, on a CPU whose Q8_0 kernel is the AVX-512 VNNI one (not where AMX
 * takes batches: its tiles read the rows as they are); never with FLASHMAP_NO_REPACK=1 in the environment. */
int fm_matrix_wants_vnni4(const fm_matrix *w);
/* Rearranges w's bytes in place into FM_LAYOUT_Q8_VNNI4 and sets w->layout; `bytes` is w->data, writable.
 * w must be a Q8_0 matrix in rows with rows % 4 == 0 and cols % 512 == 0 (else nothing changes and -1 is
 * returned). Every fm_matmul of the matrix stays bit for bit what it was, at every ISA level (levels without
 * the VNNI kernel read it through a temporary copy in rows: slow, for tests). pool may be NULL. */
int fm_matrix_repack_vnni4(fm_pool *pool, fm_matrix *w, void *bytes);
/* Rows a batch's cost goes up by in steps of, for w at the current ISA level: 8 where Q8_0 batches of 9..16
 * tokens take the AMX kernel (one 16-row tile; 9 and 16 tokens cost alike) and 17..24 the VNNI one again (on
 * an Emerald Rapids Xeon, 2 threads, bench/RESULTS.md: verify blocks of 8 rows 1.50 steps, of 9 rows 1.84,
 * of 17 rows 3.31), else 1 (cost grows row by row). The adaptive verify width models costs by it. */
int fm_matrix_batch_granule(const fm_matrix *w);
/* Block b of row `row` of a Q8_0 matrix in either layout, as the file stores it. */
fm_block_q8_0 fm_matrix_q8_0_block(const fm_matrix *w, int64_t row, int64_t b);

/* out[k] = W[row][k] as f32 (token-table lookups, uniform_embeds). */
void fm_matrix_row_f32(const fm_matrix *w, int64_t row, float *out);

/* The same product computed by the scalar reference kernels only (tests, parity checks). */
void fm_matmul_reference(const fm_matrix *w, const float *x, int T, float *y, const float *bias);

/* Activation quantisation to Q8_0, bit-identical to ggml's quantize_row_q8_0_ref: per block of 32,
 * d = amax / 127 (stored as f16, round-to-nearest-even), q = roundf(x * (d ? 1/d : 0)) (ties away from 0).
 * n must be a multiple of 32. The first uses the fastest kernel of the current ISA level, the second is the
 * scalar reference; both give the same bytes. */
void fm_quantize_row_q8_0(const float *x, fm_block_q8_0 *y, int64_t n);
void fm_quantize_row_q8_0_reference(const float *x, fm_block_q8_0 *y, int64_t n);

/* fm_matmul keeps a per-thread workspace for quantised activations (grown, never shrunk). Threads of the
 * pool free theirs at exit; this frees the calling thread's now (also registered with atexit). */
void fm_matmul_scratch_release(void);

#endif
