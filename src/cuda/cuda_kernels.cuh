/* cuda_kernels.cuh: host launchers of the CUDA backend's kernels, called by cuda_backend.cu and
 * cuda_drafter.cu. One kernel family per .cu file: cuda_q8.cu (Q8_0 weights), cuda_bf16.cu (BF16 weights),
 * cuda_attn.cu (the target's attention), cuda_kernels.cu (norms, RoPE, argmax and the drafter's element-wise
 * kernels).
 *
 * Layouts (device memory):
 *   q8 matrix   [ceil(N/16)][K/32] tiles of 16 rows x one Q8_0 block, each the 512 quant bytes in the
 * register order of the int8 tensor-core instruction (mma m16n8k32: lane l's 16 bytes are its A fragment)
 *               plus [ceil(N/16)][K/32][8] pairs of f16 scales (row g, row g + 8). Same bytes, same values
 *               as the GGUF blocks; rows past N are zero.
 *   bf16 matrix [ceil(N/16)][K/16] tiles of 16 x 16 in the register order of mma m16n8k16.
 *   activations f32 [T][width]; quantised activations int8 in "fragment order" [T/8][K/32][32][8] (lane
 *               (g, c) of a block holds bytes 4c..4c+3 and 16+4c..16+4c+3 of token g: the B operand of
 *               mma.m16n8k32, one coalesced 8-byte load per lane) with f32 scales [T/8][K/32][8] (the f16
 *               scale, widened); values bit-identical to ggml's quantize_row_q8_0_ref. Buffers hold whole
 *               groups of 8 tokens.
 * Invariant (losslessness): a Q8_0 product's (row, token) result is the exact int32 dot of each 32-block,
 * scaled and summed in f32 in an order fixed by the matrix alone (its K split), never by T; norms, attention
 * and quantisation likewise compute each token with the same threads in the same order whatever T is. So a
 * verify block's rows equal single steps bit for bit.
 *
 * pdl: launch with programmatic dependent launch (see cuda_device.cuh); only for kernels in one stream
 * whose predecessors are kernels of this file set. */
#ifndef FM_CUDA_KERNELS_CUH
#define FM_CUDA_KERNELS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>
#include <utility>
#include <vector>

/* How a product splits its work (fixed per matrix, never by T): a group of rt row tiles (1; 4 for the
 * gate/up product: 32 gate + 32 up rows) is computed by kc blocks, each of rt * w warps; warp (r, i) of block
 * j streams tile r's 32-blocks [(j w + i) nbw, (j w + i + 1) nbw), nbw = K/32 / (w kc). Partial sums are
 * added in warp order inside a block, then, when kc > 1, in block order: by block 0 of the group when its kc
 * blocks run as a thread-block cluster (sm_90: the others' sums pushed into its shared memory), else by
 * the group's last block (scratch `part`, arrival counters `cnt`, one per group, zero between launches). */
typedef struct {
    int rt, w, kc;
    float *part;   /* [groups][kc][rt][4 n-tiles][4][32] */
    unsigned *cnt; /* [groups] */
} fmc_split;

typedef struct {
    const int4 *qs;     /* [NT16][NB][32] */
    const uint32_t *sc; /* [NT16][NB][8] */
    int N, K;
    fmc_split sp;
} fmc_q8;

typedef struct {
    const uint4 *w; /* [NT16][K/16][32] */
    int N, K;
    fmc_split sp;
} fmc_bf16;

/* Scratch a product needs (floats of part, counters) for its split. */
void fmc_split_scratch(const fmc_split *sp, int N, size_t *part_floats, int *counters);

/* Sets the kernels' shared-memory limits; once per process, before any launch. */
int fmc_init(void);
/* The current device's streaming multiprocessors (132 on an H200), read once: the work splits are sized by
 * it. */
int fmc_sm_count(void);
/* The device's peak memory bandwidth per SM, GB/s (its memory clock and bus width; 0 where unknown): an H100
 * SXM's 3.35 TB/s over 132 SMs is 25, an H200's 4.9 TB/s 37. */
double fmc_mem_gbps_per_sm(void);

/* Launches k with an optional programmatic-dependent-launch attribute and, for cluster > 1, in thread-block
 * clusters of `cluster` consecutive blocks along x (sm_90; grid.x a multiple of it). */
template <typename... P, typename... A>
static inline void fmc_launch_cluster(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                                      int pdl, int cluster, A &&...args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[2];
    unsigned n = 0;
    if (pdl) {
        at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster > 1) {
        at[n].id = cudaLaunchAttributeClusterDimension;
        at[n].val.clusterDim.x = (unsigned)cluster;
        at[n].val.clusterDim.y = at[n].val.clusterDim.z = 1;
        n++;
    }
    cfg.attrs = at;
    cfg.numAttrs = n;
    cudaLaunchKernelEx(&cfg, k, std::forward<A>(args)...);
}
template <typename... P, typename... A>
static inline void fmc_launch(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, int pdl,
                              A &&...args) {
    fmc_launch_cluster(k, grid, block, smem, s, pdl, 1, std::forward<A>(args)...);
}

/* Median milliseconds of `reps` calls of run() on stream s, each timed by events, after `warm` unmeasured
 * ones (benchmarks and device checks). */
template <class F> static double fmc_median_ms(F &&run, cudaStream_t s, int warm, int reps) {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<float> ms;
    for (int i = 0; i < warm + reps; i++) {
        cudaEventRecord(e0, s);
        run();
        cudaEventRecord(e1, s);
        cudaEventSynchronize(e1);
        float t = 0;
        cudaEventElapsedTime(&t, e0, e1);
        if (i >= warm) ms.push_back(t);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    std::sort(ms.begin(), ms.end());
    return ms.empty() ? 0 : ms[ms.size() / 2];
}

/* ---- Q8_0 (cuda_q8.cu) ---- */

/* GGUF blocks of N rows x K (device, row-major [N][K/32] x 34 bytes) -> tiled layout (qs, sc: device buffers
 * of fmc_q8_bytes). Also chooses the split (w->sp; its part / cnt stay NULL: the caller provides scratch of
 * fmc_split_scratch before a launch); glu: the matrix is [gate; up] for fmc_q8_glu. */
void fmc_q8_bytes(int N, int K, size_t *qs_bytes, size_t *sc_bytes);
void fmc_q8_repack(const void *blocks, int N, int K, int glu, int4 *qs, uint32_t *sc, fmc_q8 *w,
                   cudaStream_t s);
/* The split again, with other limits (gemm_plan's per_sm and below; experiments on the drafter's). */
void fmc_q8_plan(fmc_q8 *w, int per_sm, int below);
/* 8 K shares a group instead of 4 where a plain (not GLU) matrix has few row tiles and one block a group (the
 * target's wo and down: the persistent step's warps); every path follows w->sp, so results stay the same
 * bits across paths. */
void fmc_q8_widen(fmc_q8 *w);

/* The activations of a Q8_0 product: quantised (xq, xd, fragment order), or, when x != NULL, f32 rows x (row
 * stride ldx) that the launcher first normalises (RMSNorm with weight nw, when nw != NULL) and quantises
 * into xq, xd. */
typedef struct {
    int8_t *xq;
    float *xd;
    const float *x;
    int ldx;
    const float *nw;
    float eps;
} fmc_q8_in;

/* x [T][ldx] -> RMSNorm (nw may be NULL) -> Q8_0 in fragment order, one block of 256 threads per token (a
 * fixed reduction order: a token's values never depend on T), or without a norm per 1,024 values of one. */
void fmc_q8_quant(const float *x, int ldx, const float *nw, float eps, int K, int T, int8_t *xq, float *xd,
                  int pdl, cudaStream_t s);
/* y[t][r] (+)= W[r] . x[t] for t < T (add: accumulate); y2 (may be NULL): a copy of the result. */
/* 1: every one-token target product (store, add, gate/up) on the register loop (cuda_q8.cu), not only those
 * it pays for (tests); the same bits either way. */
void fmc_q8_set_reg_all(int on);
/* 1: every store / add product of up to 24 tokens whose blocks hold one row tile of the split's w warps
 * on the row-tile loop (cuda_q8_rows.cuh), not only grids of many waves (tests); the same bits either way. */
void fmc_q8_set_rows_all(int on);
/* The products of 1..8 rows with their activations in shared memory (cuda_q8.cu): rd 8, 12 or 16 tiles in
 * flight for every class of product, 0 none, -1 the default choice (tests); the same bits either way. */
void fmc_q8_set_gemv(int rd);
/* 0: the drafter's Q8_0 products merge a group's several blocks through L2, not in clusters (cuda_q8.cu;
 * tests); the same bits either way. Returns whether clusters are now used (never below sm_90). */
int fmc_q8_set_cluster(int on);
void fmc_q8_matmul(const fmc_q8 *w, const fmc_q8_in *in, int T, float *y, int ldy, int add, float *y2,
                   int ldy2, int pdl, cudaStream_t s);
/* W = [gate; up] (2F rows): h = silu(gate . x) * (up . x), quantised to oq, od (fragment order, K = F). */
void fmc_q8_glu(const fmc_q8 *w, const fmc_q8_in *in, int T, int8_t *oq, float *od, int pdl, cudaStream_t s);
/* The drafter's Q8_0 copy: v = W[r] . x[t] + bias[r] (bias may be NULL), then mode as fmc_bf16_matmul
 * (FMC_BF16_STORE, _GELU, _GATE_ADD). Activations as fmc_q8_matmul (in->x: quantised first, no norm). */
void fmc_q8_dmatmul(const fmc_q8 *w, const fmc_q8_in *in, int T, float *y, int ldy, const float *bias,
                    int mode, const float *gate, int pdl, cudaStream_t s);
/* The drafter's AdaLN as fmc_ln_mod_rows computes it, quantised into xq, xd (fragment order) for a following
 * fmc_q8_dmatmul with in->x == NULL: one kernel, the rows never stored. n % 32 == 0, n <= FMC_LN_MOD_MAX_N
 * (a row, its scale and shift in shared memory). */
enum { FMC_LN_MOD_MAX_N = 12288 };
void fmc_ln_mod_quant(const float *x, const float *scale, const float *shift, int T, int n, float eps,
                      int8_t *xq, float *xd, int pdl, cudaStream_t s);
/* x[t] = dequantised rows ids[t] of a q8 table. */
void fmc_embed_q8(const fmc_q8 *tab, const int32_t *ids, int T, float *x, cudaStream_t s);
/* The same for the tokens of argmaxes am [T] as fmc_argmax packs them. */
void fmc_embed_q8_argmax(const fmc_q8 *tab, const unsigned long long *am, int T, float *x, cudaStream_t s);

/* An experiment for the benchmark only (cuda_q8_persist.cu): 1-token products run back to back in one
 * persistent launch (form 0: each block runs the narrow kernel's blocks of every product in turn; 1: one ring
 * of 16 one-tile stages per warp across products, by cp.async; 2, 3, 4: the same ring with stages of 2, 4, 8
 * tiles (8, 4, 3 stages) by cp.async.bulk), each waiting for the one before it (waits) or not. The GLU
 * products write oq, od. prepare returns the grid and shared memory to launch with, or < 0. */
enum { FMC_PERSIST_STORE = 0, FMC_PERSIST_ADD = 1, FMC_PERSIST_GLU = 2, FMC_PERSIST_FORMS = 5 };
typedef struct {
    const fmc_q8 *w;
    const int8_t *xq;
    const float *xd;
    int mode;
    float *y;
    int ldy;
} fmc_persist_product;
int fmc_q8_persist_prepare(const fmc_persist_product *pr, int n, int8_t *oq, float *od, int form, int *grid,
                           int *smem);
/* done: n device counters (zeroed by the launch) */
void fmc_q8_persist_launch(int form, unsigned *done, int n, int waits, int grid, int smem, cudaStream_t s);

/* ---- the one-token forward's layers in one persistent launch (cuda_megakernel.cu) ---- */

typedef struct {
    const fmc_q8 *qkv, *wo, *gu, *down;
    const float *attn_norm, *q_norm, *k_norm, *ffn_norm;
    __half *kc, *vc; /* the layer's caches [n_ctx][n_kv * hd] */
    float *cap;      /* where the layer's output is also copied (the drafter's features), or NULL */
} fmc_mk_layer;
/* The target and the buffers its kernels use (cuda_backend.cu): x [T][dim] (the embedding in, the last
 * layer's output out), qkv, the attention's partials, the normed queries q [T][n_heads * hd] (tokens > 1),
 * xq / xd (fragment order, maxK); tokens: 1 for the step's instance, more for the verify blocks' (up to
 * fmc_mk_max_tokens); ldcap: the stride of the layers' captured rows. */
typedef struct {
    int n_layers, dim, n_heads, n_kv, hd, ffn, max_splits;
    float eps;
    const fmc_mk_layer *layers; /* host array of n_layers */
    float *x, *qkv, *part, *q;
    int8_t *xq;
    float *xd;
    int8_t *xqn; /* a verify launch's norm outputs (fragment order) */
    float *xdn;
    const float *rope;
    const int *pos;
    int tokens, ldcap;
} fmc_mk_desc;
typedef struct fmc_mk fmc_mk;
/* 0 and *out on success; 1 when this device or model cannot take it (why says what); -1 on an error. */
int fmc_mk_create(const fmc_mk_desc *d, fmc_mk **out, char *why, size_t whylen);
/* The forward of T tokens (1 .. fmc_mk_max_tokens) at *pos .. through every layer (x in place), on stream s
 * (graph-capturable). */
void fmc_mk_launch(const fmc_mk *mk, int T, cudaStream_t s);
int fmc_mk_max_tokens(const fmc_mk *mk);
void fmc_mk_free(fmc_mk *mk);
/* 1 (default): launched as a cooperative kernel (the driver checks that every block is resident at once);
 * 0: a plain launch of one block per SM (where a graph cannot hold cooperative launches: its blocks are
 * resident at once all the same, as nothing else runs beside it in the backend's stream). */
void fmc_mk_set_cooperative(fmc_mk *mk, int on);
int fmc_mk_cooperative(const fmc_mk *mk);
/* Diagnostics: on, every block records the clock at every phase boundary of every layer (a graph captured
 * after this takes it); fmc_mk_trace_read: each phase's mean microseconds over the middle layers, block 0's
 * into us[0 .. n), the slowest block's into us[n .. 2n) and the fastest's into us[2n .. 3n); returns n, the
 * phases (18: norm, qkv, barrier, q/k norm, barrier, attention, barrier, merge, barrier, activations, wo,
 * barrier, norm, gate/up, barrier, activations, down, barrier; the q/k norm and the barrier after it are
 * empty since the attention's units norm their own heads), < 0 without a trace. us[3n .. 3n + 8): a warp's
 * mean cycles a layer waiting for ring stages and issuing their copies, for each product (qkv, wo, gate/up,
 * down), summed over the steps since the last read (builds with -DFM_MK_PROFILE=1; else 0). */
int fmc_mk_trace(fmc_mk *mk, int on);
int fmc_mk_trace_read(const fmc_mk *mk, double *us);
/* The same trace block by block: each phase's mean microseconds over the middle layers into
 * us[block * n + phase], and into info[block * 5 ..] the block's SM and its groups of qkv, wo, gate/up and
 * down; returns the blocks (<= max_blocks), < 0 without a trace. */
int fmc_mk_trace_blocks(const fmc_mk *mk, double *us, int *info, int max_blocks);
/* Ring stages of 4 weight tiles each warp keeps in flight. */
int fmc_mk_stages(const fmc_mk *mk);
/* Warps of its blocks: 16 where a matrix has 8 K shares (fmc_q8_widen), else 12. */
int fmc_mk_warps(const fmc_mk *mk);

/* ---- BF16 (cuda_bf16.cu) ---- */

enum { FMC_BF16_STORE = 0, FMC_BF16_GELU = 1, FMC_BF16_GATE_ADD = 2 };
void fmc_bf16_bytes(int N, int K, size_t *bytes);
/* Row-major bf16 [N][K] (device) -> tiled layout; chooses the split as fmc_q8_repack. */
void fmc_bf16_repack(const void *rows, int N, int K, uint4 *w_out, fmc_bf16 *w, cudaStream_t s);
/* v = W[r] . x[t] + bias[r] (f32 activations carried as bf16 hi + lo, products exact, f32 sums);
 * STORE: y = v; GELU: y = gelu(v); GATE_ADD: y += gate[r] * v. */
void fmc_bf16_matmul(const fmc_bf16 *w, const float *x, int ldx, int T, float *y, int ldy, const float *bias,
                     int mode, const float *gate, int pdl, cudaStream_t s);

/* ---- target attention (cuda_attn.cu) ---- */

/* qkv [T][q_dim + 2 kv_dim] -> per-head RMSNorm (q_norm / k_norm), NEOX RoPE at *pos + t; q into q_out
 * [T][q_dim], K/V rows into the f16 caches [n_ctx][kv_dim] at *pos + t. rope: [n_ctx][hd/2][2]. */
void fmc_qk_norm_rope_kv(const float *qkv, int T, int n_heads, int n_kv, int hd, const float *q_norm,
                         const float *k_norm, float eps, const float *rope, const int *pos, float *q_out,
                         __half *k_cache, __half *v_cache, int pdl, cudaStream_t s);
/* Causal GQA attention of T rows at *pos + t over the f16 caches, split-K ("flash decoding"): splits of
 * FMC_ATT_SPLIT keys at fixed boundaries, each block loading one split of one KV head once for all its query
 * heads and up to 128 / G rows, scores and weighted sums on the f16 tensor cores (q and the probabilities
 * as two f16 parts each, f32 accumulation); partials [T][n_heads][max_splits][hd + 2] merged in split order,
 * and the output quantised to xq, xd (fragment order, K = q_dim). hd: see fmc_attn_head_dim_ok (32 at least
 * for this variant). */
#define FMC_ATT_SPLIT 64
/* The most query heads per KV head the attention kernels take (a block holds at least one row of them). */
#define FMC_ATT_MAX_GROUP 128
/* Causal launches of more rows than this (prefill chunks) run a one-pass kernel when fmc_attn_prefill_fits
 * (at most 32 query heads per KV head, heads of at most 128 dimensions): the same bits as the split kernel
 * (cuda_attn.cuh says how), without its partial results, which grow with T x context (H200, context ~600:
 * 128 rows 46 us a layer split against 51 one-pass, 256 rows 99 against 61, with an earlier one-pass kernel
 * that rescaled as it went). */
#define FMC_ATT_SPLIT_MAX_T 64
int fmc_attn_prefill_fits(int n_heads, int n_kv, int hd);
/* Whether the attention kernels take heads of hd dimensions (16, 32, 64, 128 or 256). */
int fmc_attn_head_dim_ok(int hd);
/* form: FMC_ATT_SHORT, or FMC_ATT_LONG for long contexts, where launches of at most 64 rows x heads of a
 * group (steps, the drafter's slots, verify blocks of up to 16 rows of Qwen3-4B) run on many small blocks
 * (cuda_attn.cu): faster from about 900 positions, slower below. The same bits either way. */
enum { FMC_ATT_SHORT = 0, FMC_ATT_LONG = 1 };
/* Whether a launch of T rows has a long form distinct from the short one. */
int fmc_attn_long_form(int T, int n_heads, int n_kv);
void fmc_attention_q8(const float *q, int T, int n_heads, int n_kv, int hd, const __half *k_cache,
                      const __half *v_cache, const int *pos, int causal, int max_splits, float *part,
                      int8_t *xq, float *xd, int form, int pdl, cudaStream_t s);
/* The same kernels with an f32 output [T][n_heads * hd]. Both: causal as above, or without a mask (the
 * drafter's cross-attention: every row attends to keys 0 .. *pos). The quantised output needs hd % 32 == 0
 * (the merge quantises a 32-block per warp of a head). */
void fmc_attention_f32(const float *q, int T, int n_heads, int n_kv, int hd, const __half *k_cache,
                       const __half *v_cache, const int *pos, int causal, int max_splits, float *part,
                       float *out, int form, int pdl, cudaStream_t s);

/* ---- argmax and the drafter's small kernels (cuda_kernels.cu) ---- */

/* out[t] = max over i of (key(x[t][i]) << 32 | ~i): the argmax (ties to the lowest index, NaN never wins)
 * packed so that atomicMax finds it in any order. out must be zeroed first; fmc_argmax_index decodes it. */
void fmc_argmax(const float *x, int T, int n, unsigned long long *out, int pdl, cudaStream_t s);
__host__ __device__ static inline int32_t fmc_argmax_index(unsigned long long p) {
    return p ? (int32_t)(0xffffffffu - (uint32_t)(p & 0xffffffffu)) : 0;
}
/* The drafter's small kernels take pdl as the products do (cuda_device.cuh): with pdl = 1 they may start
 * before their predecessor is done and wait for it before touching its data. */
/* y = x * (w / rms(x)) per row (double sums as the CPU reference). */
void fmc_rmsnorm_rows(const float *x, const float *w, int T, int n, float eps, float *y, int pdl,
                      cudaStream_t s);
/* y = LN(x) * (1 + scale) + shift. */
void fmc_ln_mod_rows(const float *x, const float *scale, const float *shift, int T, int n, float eps,
                     float *y, int pdl, cudaStream_t s);
/* In place on x [T][ld] (heads at col 0): per-head RMSNorm w, then interleaved RoPE (2i, 2i+1) of row t by
 * rope[t][i] (fmc_dr_slots' table). */
void fmc_dr_norm_rope(float *x, int ld, int T, int n_heads, int hd, const float *w, float eps,
                      const float2 *rope, int pdl, cudaStream_t s);
/* The drafter's cross keys and values of every layer in one launch: layer l's keys are x + l * lstride (row
 * stride ld), its values x + l * lstride + vofs, its key norm L->w[l], its caches L->kc[l] / L->vc[l]. The
 * keys are normed as fmc_dr_norm_rope does (the same device code), rotated at position p0 + t, p0 = pos0 +
 * (dpos ? *dpos : 0), by angle (float)(p0 + t) * inv_freq[i] (cosine and sine in double), and go to the key
 * cache rows p0 + t (f16, row stride n_heads * hd), the values to the value cache rows; x is left as it was.
 * n_layers <= FMC_DR_MAX_LAYERS. */
enum { FMC_DR_MAX_LAYERS = 16 };
typedef struct {
    const float *w[FMC_DR_MAX_LAYERS];
    __half *kc[FMC_DR_MAX_LAYERS], *vc[FMC_DR_MAX_LAYERS];
} fmc_dr_kv_layers;
void fmc_dr_kv_rows(float *x, int ld, int T, int n_heads, int hd, int n_layers, size_t lstride, size_t vofs,
                    const fmc_dr_kv_layers *L, float eps, const int *dpos, int pos0, const float *inv_freq,
                    int pdl, cudaStream_t s);
/* The drafter's self-attention over its T slots, no mask: queries at column 0 of qkv [T][ld], keys at
 * n_heads * hd, values at 2 n_heads * hd; queries and keys per-head RMS-normed (wq, wk, eps) and rotated
 * by rope[t] (fmc_dr_slots' table) as fmc_dr_norm_rope does, inside the kernel (qkv is not changed);
 * o[t][h] = softmax(q . k / sqrt(hd)) v. With xq (hd a multiple of 32), o is not written: the rows go
 * quantised into xq, xd (fragment order, K = n_heads hd), the bits fmc_q8_quant would give them. hd <=
 * FMC_DR_HD_MAX, T <= FMC_DR_MAX_SLOTS (its shared memory: hd (2 T + 1) + T floats). */
enum { FMC_DR_HD_MAX = 256, FMC_DR_MAX_SLOTS = 64 };
void fmc_dr_self_attention(const float *qkv, int ld, int T, int n_heads, int hd, const float *wq,
                           const float *wk, float eps, const float2 *rope, float *o, int8_t *xq, float *xd,
                           int pdl, cudaStream_t s);
/* The draft's slots: x[t] = row (broadcast), and rope[t][i] = (cos, sin) of RoPE pair i < half at position
 * pos0 + *dpos + t (angle as fmc_dr_kv_rows), for the layers' norms and attention to share. */
void fmc_dr_slots(const float *row, int T, int n, float *x, const int *dpos, int pos0, const float *inv_freq,
                  int half, float2 *rope, int pdl, cudaStream_t s);

#endif
