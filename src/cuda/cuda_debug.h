/* cuda_debug.h: read-back and timing hooks of the CUDA backend for device tests and benchmarks (not used by
 * the engine). Plain C. Those on a backend are in cuda_backend_debug.cu, the device's and single kernels'
 * in cuda_debug.cu. */
#ifndef FM_CUDA_DEBUG_H
#define FM_CUDA_DEBUG_H

#include <stddef.h>
#include <stdint.h>

#include "cuda/cuda_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Logits of the last eval that asked for argmax: rows [rows][vocab] (1 row for last-row evals). */
int fm_cuda_debug_logits(fm_cuda_backend *b, float *out, int rows);
/* Captured features of the last eval: [rows][n_capture * dim]. */
int fm_cuda_debug_features(fm_cuda_backend *b, float *out, int rows);
/* The last draft's head outputs [block][target_dim] (a draft of n_out <= 8 writes the first 8 rows only). */
int fm_cuda_debug_draft_head(fm_cuda_backend *b, float *out);
/* The last draft's logits, slots 0..rows-1 [rows][vocab] (penalised in place when penalties are on). */
int fm_cuda_debug_draft_logits(fm_cuda_backend *b, float *out, int rows);
/* The drafter's context rows start .. start+n-1 from host feature rows feat [n][feature width] (in place of
 * the target's own captured features), for tests that compare the drafter alone. */
int fm_cuda_debug_drafter_context(fm_cuda_backend *b, const float *feat, int n, int start);
/* 0: no CUDA graphs (every kernel launched each call); 1 (default): graphs for evals of up to 32 rows. */
void fm_cuda_debug_set_graphs(fm_cuda_backend *b, int on);
/* rows 1 (default): a verify block's rows go into the drafter's context as the block is launched, and the
 * commit keeps a prefix of them; 0: the committed rows go there at the next draft (FMC_EARLY_ROWS=0).
 * anchors 1 (FMC_EARLY_ANCHOR=1): with them, the anchor slot of each row's argmax, which the next draft
 * takes when its anchor is one; 0 (default): the draft makes its anchor slot itself. Either way it forgets
 * the rows and slots a block has made so far: call it before the block, not between the block and the draft.
 */
void fm_cuda_debug_set_early_rows(fm_cuda_backend *b, int rows, int anchors);
/* Drafts so far whose anchor slot was made with a verify block's rows. */
long fm_cuda_debug_anchor_hits(const fm_cuda_backend *b);
/* Device-to-device copy bandwidth in GB/s (bytes read + written), median of reps copies of `bytes`. */
double fm_cuda_debug_copy_bandwidth(size_t bytes, int reps);
/* Device name and driver version into buf. */
void fm_cuda_debug_device_name(char *buf, size_t len);
/* Bytes of device weights the target reads per step (quants + scales of every matrix + lm_head). */
uint64_t fm_cuda_debug_step_bytes(const fm_cuda_backend *b);
/* Synchronises the device (for host-side timing). */
void fm_cuda_debug_sync(void);
/* 0: plain launches; 1 (default): programmatic dependent launch inside forwards of up to 32 rows. */
void fm_cuda_debug_set_pdl(fm_cuda_backend *b, int on);
/* 1: every Q8_0 store / add product of up to 16 rows and the one-token gate/up through the register loop
 * (process-wide; the default 0 takes it where it pays: cuda_q8.cu), so that the tiny models' bit-for-bit
 * checks run it. */
void fm_cuda_debug_set_q8_reg_all(fm_cuda_backend *b, int on);
/* 1: every Q8_0 store / add product of up to 24 rows whose split allows it on the row-tile loop (the
 * default takes it for grids of many waves only, the lm_head, from 9 rows: cuda_q8.cu), so that the tiny
 * models' bit-for-bit checks run it (process-wide). */
void fm_cuda_debug_set_q8_rows_all(fm_cuda_backend *b, int on);
/* rd 8, 12, 16: every target product of 1..8 rows copies its activations to shared memory and keeps rd
 * weight tiles a warp in registers (process-wide); 0: none; -1: the default choice (one row, by the
 * matrix's shape). */
void fm_cuda_debug_set_q8_gemv(fm_cuda_backend *b, int rd);
/* Steps (one-token forwards) and verify blocks of up to 8 rows with their layers in one persistent launch
 * (cuda_megakernel.cu), where the backend has it: mode 0 never (kernels), 1 every one, 2 while the
 * attention takes its short form (the default; FMC_MEGA=0 / 1 choose the others). Returns the mode now in use
 * (mode < 0: only that). */
int fm_cuda_debug_set_mega(fm_cuda_backend *b, int mode);
/* The persistent step kernel's phase clock (cuda_kernels.cuh, fmc_mk_trace): us == NULL: on (1; 2: the
 * verify blocks' instance instead) / off (graphs are captured again); else the last step's phase means into
 * us[0 .. 54) (block 0's, the slowest block's, the fastest block's) and a profiling build's stalls into us[54
 * .. 70) (fmc_mk_trace_read), returning 18, or < 0. */
int fm_cuda_debug_mega_trace(fm_cuda_backend *b, int on, double *us);
/* The same trace for every block (fmc_mk_trace_blocks): us[block * 18 + phase], info[block * 5 ..] = the
 * block's SM and its groups of the four products; returns the blocks, or < 0. */
int fm_cuda_debug_mega_blocks(fm_cuda_backend *b, double *us, int *info, int max_blocks);
/* "on" / "off" for the persistent step kernel (with its launch: cooperative or plain), its ring stages and
 * warps a block, or why the backend has none (stages 0). */
const char *fm_cuda_debug_mega(const fm_cuda_backend *b, int *stages, int *warps);
/* Whether verify blocks of 2 .. *max_T rows run persistent too (by the steps' mode), or why not (*max_T 0).
 */
const char *fm_cuda_debug_mega_verify(const fm_cuda_backend *b, int *max_T);
/* 0: the drafter's Q8_0 products merge the sums of a group's several blocks through L2 instead of in
 * thread-block clusters (process-wide, for launches made after it; the same bits either way). Returns 1 if
 * clusters are now used, 0 if not (off, or a device below sm_90). */
int fm_cuda_debug_set_cluster(int on);
/* Milliseconds the backend's creation spent capturing its graphs (a step, the verify block sizes, drafts). */
double fm_cuda_debug_warm_ms(const fm_cuda_backend *b);
/* Microseconds per launch of one kernel group on T rows, replayed in a graph over all layers' weights (so
 * that they do not sit in L2): 0 qkv, 1 wo, 2 gate/up + SiLU, 3 down, 4 lm_head, 5 attention (split + merge
 * at the current position). bytes: that matrix's weight bytes (0 for attention). 6, 7: the drafter's fc1 (+
 * GELU) and fc2 (+ gated add), T <= block. Negative on error. */
double fm_cuda_debug_time_kernel(fm_cuda_backend *b, int which, int T, int pdl, uint64_t *bytes);
/* The persistent-launch experiment (cuda_q8_persist.cu): milliseconds for a step's 145 one-token products
 * alone, as a graph of launches (form -1; waits: with PDL) or as one persistent launch of form 0..4 (see
 * fmc_q8_persist_prepare), waiting for each product's predecessor or not. waits < 0: how many of 5 products
 * (qkv, wo, gate/up, down, lm_head) that form computes differently from the engine's launches (bits of the
 * output). Negative on error. */
double fm_cuda_debug_persist(fm_cuda_backend *b, int form, int waits);
/* Kernel tests, on caller data (host arrays). Q8_0: blocks are N rows of K/32 GGUF Q8_0 blocks; x [T][K] is
 * RMSNorm'd with nw (when not NULL) and quantised in the kernel; launches of `chunk` tokens; glu: y [T][N/2]
 * = the dequantised SiLU(gate) * up output (rows [gate; up]), else y [T][N]. */
int fm_cuda_debug_q8_matmul(const void *blocks, int N, int K, const float *x, const float *nw, float eps,
                            int T, int chunk, int glu, float *y);
/* BF16: w [N][K] row-major; mode 0 store, 1 GELU, 2 gated add (y += gate * v, y in/out); bias, gate may be
 * NULL. */
int fm_cuda_debug_bf16_matmul(const uint16_t *w, int N, int K, const float *x, int T, const float *bias,
                              int mode, const float *gate, float *y);
/* The drafter's Q8_0 product: blocks as fm_cuda_debug_q8_matmul (x quantised in the kernel, no norm), the
 * epilogue as fm_cuda_debug_bf16_matmul (mode, bias, gate; y in/out). */
int fm_cuda_debug_q8_dmatmul(const void *blocks, int N, int K, const float *x, int T, const float *bias,
                             int mode, const float *gate, float *y);
/* The target's attention kernels (split + merge, f32 output) on caller data: q [T][n_heads * hd], the f16
 * caches k, v [n_keys][n_kv * hd] with n_keys = pos + T (causal: row t attends to keys 0 .. pos + t) or pos
 * + 1 (causal = 0: every row attends to keys 0 .. pos); out [T][n_heads * hd]; form: FMC_ATT_SHORT (0) or
 * _LONG (1). */
int fm_cuda_debug_attention(const float *q, int T, int n_heads, int n_kv, int hd, const uint16_t *k,
                            const uint16_t *v, int pos, int causal, int form, float *out);

#ifdef __cplusplus
}
#endif

#endif
