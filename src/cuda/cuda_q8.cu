/* cuda_q8.cu: Q8_0 weights on the GPU: the tiled layout (see cuda_kernels.cuh), its repack from GGUF blocks,
 * token lookup, the activation quantiser, and the matrix product for 1..32 tokens per launch on the int8
 * tensor cores (its per-block code in cuda_q8_narrow.cuh; more tokens: the wide kernel of cuda_q8_wide.cu,
 * same results; see cuda_q8.cuh).
 *
 * The product streams each weight byte once for all tokens of a launch. The work split (fmc_split) is fixed
 * per matrix: a warp owns one 16-row tile and a fixed run of its K/32 blocks, keeps up to 8 tiles of 512
 * bytes with their activation fragments in flight through cp.async (cuda_gemm.cuh; the weights of the first
 * stages before the preceding kernel is done), and per block gets the exact int32 dots of 16 rows x 8
 * tokens from one mma.m16n8k32. Each (row, token) then takes acc += isum * (dw * dx) in f32, block by block
 * in the warp's order; the warps' and blocks' partial sums are added in a fixed order: the same operations
 * whatever T is (explicit __fmaf_rn / __fadd_rn keep the compiler from contracting differently in the
 * per-T instantiations). Activations come quantised in "fragment order" (a lane's 8 bytes of a block for 8
 * tokens contiguous), so a warp's activation load is one coalesced 256-byte read. The quantiser (RMSNorm +
 * Q8_0) runs one token per 256-thread block with a fixed reduction order, so a token's values never depend
 * on T either. */
#include <algorithm>
#include <cstring>

#include "cuda/cuda_q8_rows.cuh"

/* ---- layout ---- */

void fmc_q8_bytes(int N, int K, size_t *qs_bytes, size_t *sc_bytes) {
    const size_t tiles = (size_t)((N + 15) / 16) * (K / 32);
    *qs_bytes = tiles * 512;
    *sc_bytes = tiles * 32;
}

/* One thread per (tile, lane): its A fragment a0..a3 = rows g, g+8 x quants 4c..4c+3, then 16+4c..16+4c+3. */
__global__ void k_repack_q8(const uint8_t *blocks, int N, int NB, int64_t total, int4 *qs, uint32_t *sc) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int lane = (int)(i & 31), g = lane >> 2, c = lane & 3;
    const int64_t tile = i >> 5;
    const int rt = (int)(tile / NB), b = (int)(tile % NB);
    const int r0 = rt * 16 + g, r1 = r0 + 8;
    uint32_t w[4];
    for (int reg = 0; reg < 4; reg++) {
        const int r = (reg & 1) ? r1 : r0, k0 = ((reg & 2) ? 16 : 0) + 4 * c;
        uint32_t v = 0;
        if (r < N) {
            const uint8_t *q = blocks + ((int64_t)r * NB + b) * 34 + 2 + k0;
            v = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
        }
        w[reg] = v;
    }
    qs[i] = make_int4((int)w[0], (int)w[1], (int)w[2], (int)w[3]);
    if (c == 0) {
        uint32_t d0 = 0, d1 = 0;
        if (r0 < N)
            d0 = blocks[((int64_t)r0 * NB + b) * 34] | (uint32_t)blocks[((int64_t)r0 * NB + b) * 34 + 1] << 8;
        if (r1 < N)
            d1 = blocks[((int64_t)r1 * NB + b) * 34] | (uint32_t)blocks[((int64_t)r1 * NB + b) * 34 + 1] << 8;
        sc[tile * 8 + g] = d0 | d1 << 16;
    }
}

void fmc_q8_repack(const void *blocks, int N, int K, int glu, int4 *qs, uint32_t *sc, fmc_q8 *w,
                   cudaStream_t s) {
    const int NB = K / 32, NT16 = (N + 15) / 16;
    const int64_t total = (int64_t)NT16 * NB * 32;
    k_repack_q8<<<(unsigned)((total + 255) / 256), 256, 0, s>>>((const uint8_t *)blocks, N, NB, total, qs,
                                                                sc);
    w->qs = qs;
    w->sc = sc;
    w->N = N;
    w->K = K;
    /* Blocks of K shares kept to 2 an SM (FMC_Q8_PER_SM overrides, for experiments): the split of K over
     * fewer blocks means fewer partial sums to merge through L2, and fmc_gemm_spread spreads the grids
     * evenly. On the H200 against 5 an SM (the shared-memory limit), same run: plain step 2.589 -> 2.515 ms,
     * verify(17) 4.44 -> 4.11 ms, prefill 512 26.7 -> 25.9 ms, the Q8_0 draft 1.032 -> 1.026 ms (per_sm 3:
     * step 2.52-2.55 ms). */
    const char *e = getenv("FMC_Q8_PER_SM"), *eb = getenv("FMC_Q8_PLAN_BELOW"); /* (experiments) */
    gemm_plan(&w->sp, NB, NT16, glu, e && atoi(e) > 0 ? atoi(e) : 2, eb && atoi(eb) > 0 ? atoi(eb) : 4);
}

void fmc_q8_plan(fmc_q8 *w, int per_sm, int below) {
    gemm_plan(&w->sp, w->K / 32, (w->N + 15) / 16, 0, per_sm, below);
}

/* The persistent step runs a group's K shares on as many warps. Qwen3-4B's wo and down have 160 row tiles, so
 * their 4 shares kept 640 of 1,584 warps (12 a block, 132 SMs) at work, each walking its chain of stages at
 * the pace of its latency, not of the memory (the same time on an H100 and an H200). 8 shares halve each
 * chain, on 16 warps a block (fmc_mk_create), whose rings are shallower (4 stages a warp instead of 6): that
 * pays where the memory is fast for the SMs. Same builds, process by process (bench/RESULTS.md,
 * thirty-eighth and thirty-ninth sessions): an H200 (37 GB/s an SM) step 1.868 -> 1.803-1.809 ms; an H100
 * (25 GB/s an SM) 2.178-2.182 -> 2.222-2.225 ms, its verify blocks up to 6 % slower. So 8 from 31 GB/s an SM;
 * FMC_Q8_W8=0 / 1 keeps 4 / takes 8 on any device (experiments); without it FMC_MEGA_WARPS=12 keeps 4, the
 * form 12 warps take (alone it left every matrix of 8 shares, which 12 warps refuse, to the kernels). */
void fmc_q8_widen(fmc_q8 *w) {
    const int NB = w->K / 32, NT16 = (w->N + 15) / 16;
    const char *e = getenv("FMC_Q8_W8"), *mw = getenv("FMC_MEGA_WARPS");
    if (e ? atoi(e) == 0 : (mw && atoi(mw) == 12) || fmc_mem_gbps_per_sm() < 31.0) return;
    if (w->sp.kc == 1 && w->sp.w == 4 && NT16 <= 2 * fmc_sm_count() && NB % 8 == 0 && NB / 8 >= 8)
        w->sp.w = 8;
}

void fmc_split_scratch(const fmc_split *sp, int N, size_t *part_floats, int *counters) {
    const int groups = (N + 15) / 16 / sp->rt;
    *part_floats = sp->kc > 1 ? (size_t)groups * sp->kc * sp->rt * GEMM_SLOT : 0;
    *counters = sp->kc > 1 ? groups : 0;
}

/* Element (r, k) of a tiled matrix, dequantised as the CPU does: f32(d) * q. */
__device__ __forceinline__ float q8_get(const int4 *qs, const uint32_t *sc, int NB, int64_t r, int k) {
    const int64_t rt = r >> 4;
    const int rr = (int)(r & 15), g = rr & 7, hi = rr >> 3, b = k >> 5, kk = k & 31;
    const int c = (kk & 15) >> 2, reg = hi + 2 * (kk >> 4);
    const int8_t *t = (const int8_t *)(qs + (rt * NB + b) * 32 + g * 4 + c);
    const uint32_t s2 = sc[(rt * NB + b) * 8 + g];
    const float d = __half2float(__ushort_as_half((unsigned short)(hi ? s2 >> 16 : s2 & 0xffff)));
    return d * (float)t[reg * 4 + (kk & 3)];
}

/* Values of a row a block of k_embed_q8 takes: 4 a thread. One block a row took 8 us at 2,560 (a step's
 * first kernel, and the draft's anchor), 10 loads a thread one after another. */
enum { EMBED_CHUNK = 1024 };

/* A row's index: a token id, or an argmax as fmc_argmax packs it (fmc_argmax_index). */
__device__ __forceinline__ int64_t embed_row(int32_t id) {
    return id;
}
__device__ __forceinline__ int64_t embed_row(unsigned long long am) {
    return fmc_argmax_index(am);
}

/* grid (T, chunks of EMBED_CHUNK), 256 threads */
template <class ID>
__global__ void k_embed_q8(const int4 *qs, const uint32_t *sc, int K, const ID *ids, float *x) {
    pdl_trigger();
    const int t = blockIdx.x, end = min(K, (int)(blockIdx.y + 1) * EMBED_CHUNK);
    const int64_t row = embed_row(ids[t]);
    for (int i = blockIdx.y * EMBED_CHUNK + threadIdx.x; i < end; i += blockDim.x)
        x[(size_t)t * K + i] = q8_get(qs, sc, K / 32, row, i);
}

template <class ID> static void embed_q8(const fmc_q8 *tab, const ID *ids, int T, float *x, cudaStream_t s) {
    k_embed_q8<<<dim3(T, (tab->K + EMBED_CHUNK - 1) / EMBED_CHUNK), 256, 0, s>>>(tab->qs, tab->sc, tab->K,
                                                                                 ids, x);
}

void fmc_embed_q8(const fmc_q8 *tab, const int32_t *ids, int T, float *x, cudaStream_t s) {
    embed_q8(tab, ids, T, x, s);
}

void fmc_embed_q8_argmax(const fmc_q8 *tab, const unsigned long long *am, int T, float *x, cudaStream_t s) {
    embed_q8(tab, am, T, x, s);
}

/* ---- activations in fragment order ---- */

/* Values a block of k_quant takes from a row without a norm: one float4 a thread. */
enum { QUANT_CHUNK = 4 * Q8_THREADS };

/* grid (T, chunks): token t of x [T][ldx], the whole row in one block with a norm, else QUANT_CHUNK values
 * from blockIdx.y QUANT_CHUNK a block. One block took a row of 8,192 (the drafter's fc2 input) in 6.7 us,
 * 8 loads a thread one after another; a 32-block's quants depend on its own values only, so the chunks give
 * the same bits. */
__global__ void __launch_bounds__(Q8_THREADS)
    k_quant(const float *x, int ldx, const float *nw, float eps, int K, int8_t *xq, float *xd) {
    pdl_trigger();
    pdl_wait();
    const int t = blockIdx.x, c0 = blockIdx.y * QUANT_CHUNK;
    q8_quant_row(x + (size_t)t * ldx + c0, nw, eps, nw ? K : min(QUANT_CHUNK, K - c0),
                 q8_frag_sink{xq, xd, t, K >> 5, c0 >> 5}, block_bar{});
}

/* The quantiser's source for the drafter's AdaLN: row x, scale and shift staged in shared memory (n floats
 * each, one after the other at xs), each value (x - mu) * r * (1 + scale) + shift as fmc_ln_mod_rows
 * computes it (no norm of the quantiser's own). */
struct q8_src_ln_mod {
    const float *xs;
    int n;
    float mu, r;
    __device__ __forceinline__ bool norm() const { return false; }
    __device__ __forceinline__ float4 first(int) const { return make_float4(0.f, 0.f, 0.f, 0.f); }
    __device__ __forceinline__ float4 w4(int) const { return make_float4(1.f, 1.f, 1.f, 1.f); }
    __device__ __forceinline__ float one(float x, float sc, float sh) const {
        return (x - mu) * r * (1.0f + sc) + sh;
    }
    __device__ __forceinline__ float4 x4(int i) const {
        const float4 x = *(const float4 *)(xs + i), sc = *(const float4 *)(xs + n + i),
                     sh = *(const float4 *)(xs + 2 * n + i);
        return make_float4(one(x.x, sc.x, sh.x), one(x.y, sc.y, sh.y), one(x.z, sc.z, sh.z),
                           one(x.w, sc.w, sh.w));
    }
};

/* grid (T): the drafter's AdaLN LN(x) * (1 + scale) + shift of token t, quantised (q8_quant_row_src) for the
 * next Q8_0 product. The row is read once into shared memory, with the modulation's scale and shift in the
 * same round trip (3 n floats), its mean and variance summed from there in double; the AdaLN's values are
 * made where the quantiser reads them and never stored (the product takes only the quants). Reading the row
 * through L2 three times (two passes, then the stored values read back) took 8.2 us against 5.4. */
__global__ void __launch_bounds__(Q8_THREADS)
    k_ln_mod_quant(const float *x, const float *scale, const float *shift, int n, float eps, int8_t *xq,
                   float *xd) {
    extern __shared__ __align__(16) float lnx[];
    __shared__ double part[Q8_WARPS];
    pdl_trigger();
    pdl_wait();
    const float *xr = x + (size_t)blockIdx.x * n;
    double su = 0;
    for (int j = threadIdx.x; j < n / 4; j += Q8_THREADS) {
        const float4 v = ld_cg4(xr + 4 * j);
        *(float4 *)(lnx + 4 * j) = v;
        *(float4 *)(lnx + n + 4 * j) = __ldg((const float4 *)(scale + 4 * j));
        *(float4 *)(lnx + 2 * n + 4 * j) = __ldg((const float4 *)(shift + 4 * j));
        su += (double)v.x + (double)v.y + (double)v.z + (double)v.w;
    }
    const double mu = group_sum_d(su, block_group{part}) / n;
    double q = 0;
    for (int j = threadIdx.x; j < n / 4; j += Q8_THREADS) { /* the thread's own values */
        const float4 v = *(const float4 *)(lnx + 4 * j);
        q += (v.x - mu) * (v.x - mu) + (v.y - mu) * (v.y - mu) + (v.z - mu) * (v.z - mu) +
             (v.w - mu) * (v.w - mu);
    }
    q = group_sum_d(q, block_group{part}); /* its barriers also publish lnx to the block */
    const q8_src_ln_mod src{lnx, n, (float)mu, (float)(1.0 / sqrt(q / n + eps))};
    q8_quant_row_src(src, 0.0f, n, q8_frag_sink{xq, xd, (int)blockIdx.x, n >> 5}, block_bar{});
}

void fmc_ln_mod_quant(const float *x, const float *scale, const float *shift, int T, int n, float eps,
                      int8_t *xq, float *xd, int pdl, cudaStream_t s) {
    fmc_launch(k_ln_mod_quant, dim3(T), dim3(Q8_THREADS), (size_t)3 * n * sizeof(float), s, pdl, x, scale,
               shift, n, eps, xq, xd);
}

/* ---- the product ---- */

/* CL: launched in clusters of the kc blocks of a group (q8_takes_cluster). */
template <int NT, int MODE, bool CL>
__global__ void __launch_bounds__(Q8_THREADS) k_q8_gemm(const q8_args a) {
    q8_gemm_block<NT, MODE, q8_pdl_sync, 0, CL>(a, blockIdx.x, q8_pdl_sync{});
}
/* REG_DEPTH tiles a warp in flight in registers (q8_reg_loop): the same bits. Up to two n-tiles (16
 * tokens): at three (159 -> 212 registers a thread) the lm_head at 17 tokens took 227 against 199-202 us
 * staged (H200, same run). */
enum { REG_DEPTH = 8, REG_MAX_NT = 2 };
template <int NT, int MODE, bool CL>
__global__ void __launch_bounds__(Q8_THREADS) k_q8_gemm_reg(const q8_args a) {
    q8_gemm_block<NT, MODE, q8_pdl_sync, REG_DEPTH, CL>(a, blockIdx.x, q8_pdl_sync{});
}
/* One n-tile, the activations copied to shared memory once a block (q8_gemv_loop), RD tiles a warp in
 * registers; XS 1: one token, 2: up to 8 (q8_pick_gemv). */
template <int MODE, int RD, int XS> __global__ void __launch_bounds__(Q8_THREADS) k_q8_gemv(const q8_args a) {
    q8_gemm_block<1, MODE, q8_pdl_sync, RD, false, XS>(a, blockIdx.x, q8_pdl_sync{});
}
/* A run of row tiles a block, the activations of all of K in shared memory (cuda_q8_rows.cuh), rd weight
 * tiles a warp in flight; blocks of Q8_WARPS warps, groups of the matrix's w. */
template <int NT, int MODE>
__global__ void __launch_bounds__(Q8_THREADS) k_q8_rows(const q8_args a, const int per, const int rd) {
    q8_rows_block<NT, MODE>(a, per, rd);
}
/* clang-format off */
#define Q8_ROWS_KERNELS(X)                                                                                   \
    X(1, Q8_STORE) X(2, Q8_STORE) X(3, Q8_STORE) X(1, Q8_ADD) X(2, Q8_ADD) X(3, Q8_ADD)
/* clang-format on */
/* clang-format off */
#define Q8_GEMV_MODES(X, rd, xs) X(Q8_STORE, rd, xs) X(Q8_ADD, rd, xs) X(Q8_GLU, rd, xs)
#define Q8_GEMV_KERNELS(X)                                                                                   \
    Q8_GEMV_MODES(X, 8, 1) Q8_GEMV_MODES(X, 12, 1) Q8_GEMV_MODES(X, 16, 1)                                   \
    Q8_GEMV_MODES(X, 8, 2) Q8_GEMV_MODES(X, 12, 2) Q8_GEMV_MODES(X, 16, 2)
/* clang-format on */
/* The register loop's kernels: the target's store / add up to REG_MAX_NT n-tiles, its GLU at one, the
 * drafter's modes at two (its 16 slots). */
/* clang-format off */
#define Q8_REG_KERNELS(X)                                                                                    \
    X(1, Q8_STORE) X(2, Q8_STORE) X(1, Q8_ADD) X(2, Q8_ADD) X(1, Q8_GLU)                                     \
    X(2, Q8_DSTORE) X(2, Q8_DGELU) X(2, Q8_DGATE)
/* clang-format on */

/* A mode a line, kept out of clang-format, which reflows X-macro lists differently on each pass. */
/* clang-format off */
#define Q8_KERNELS(X)                                                                                        \
    X(1, Q8_STORE) X(2, Q8_STORE) X(3, Q8_STORE) X(4, Q8_STORE)                                              \
    X(1, Q8_ADD) X(2, Q8_ADD) X(3, Q8_ADD) X(4, Q8_ADD)                                                      \
    X(1, Q8_GLU) X(2, Q8_GLU) X(3, Q8_GLU) X(4, Q8_GLU)                                                      \
    X(1, Q8_DSTORE) X(2, Q8_DSTORE) X(3, Q8_DSTORE) X(4, Q8_DSTORE)                                          \
    X(1, Q8_DGELU) X(2, Q8_DGELU) X(3, Q8_DGELU) X(4, Q8_DGELU)                                              \
    X(1, Q8_DGATE) X(2, Q8_DGATE) X(3, Q8_DGATE) X(4, Q8_DGATE)
/* The drafter's modes also launch in clusters (q8_takes_cluster): staged at every width, on the register
 * loop at its 16 slots. */
#define Q8_CLUSTER_KERNELS(X)                                                                                \
    X(1, Q8_DSTORE) X(2, Q8_DSTORE) X(3, Q8_DSTORE) X(4, Q8_DSTORE)                                          \
    X(1, Q8_DGELU) X(2, Q8_DGELU) X(3, Q8_DGELU) X(4, Q8_DGELU)                                              \
    X(1, Q8_DGATE) X(2, Q8_DGATE) X(3, Q8_DGATE) X(4, Q8_DGATE)
#define Q8_REG_CLUSTER_KERNELS(X) X(2, Q8_DSTORE) X(2, Q8_DGELU) X(2, Q8_DGATE)
/* clang-format on */

typedef void (*q8_kernel)(const q8_args);

/* Blocks an SM may hold of a narrow launch: -1 (default) the fewest that hold the grid in one wave, 0 as many
 * as fit, n > 0 at most n (FMC_Q8_MAXB, for experiments). */
static int g_maxb = -1;
/* Shared memory of an SM, and what a block takes besides its dynamic share (the reserved 1 KB on sm_80/90
 * and at most 1.5 KB of static shared memory in these kernels). */
static size_t g_sm_bytes = (size_t)228 * 1024, g_block_extra = 2560;
/* Blocks of `smem` dynamic shared memory each that fit an SM. */
static unsigned blocks_fit_sm(size_t smem) {
    return (unsigned)(g_sm_bytes / (smem + g_block_extra));
}

/* A narrow launch's shared memory, grown (never shrunk, at most `limit`) so that at most the cap of its
 * blocks fit an SM. The block scheduler does not spread a one-wave grid evenly by itself: the step's qkv
 * product (384 blocks, 5 fit an SM by shared memory) ran in 13.1 us, held to 3 an SM in 10.6-10.9 us (H200,
 * bench_cuda, kernel alone), and the plain step went 2.70 -> 2.58 ms. Grids that fill their SMs anyway (wo,
 * gate/up, down: 608-640 blocks, 5 an SM) are left as they are: padding them cost the step 4 % (it leaves no
 * room for the next kernel's blocks, which PDL starts early). The BF16 products use it too (cuda_bf16.cu). */
size_t fmc_gemm_spread(size_t smem, unsigned blocks, size_t limit) {
    const unsigned sms = (unsigned)fmc_sm_count(), fit = blocks_fit_sm(smem);
    const unsigned cap = g_maxb < 0 ? (blocks + sms - 1) / sms : (unsigned)g_maxb;
    if (cap == 0 || cap >= fit || blocks > cap * sms) return smem;
    const size_t room = g_sm_bytes / cap - g_block_extra;
    return room < limit ? room : limit;
}

/* Which products take the register loop (fm_cuda_debug_set_q8_reg_all: every store / add product of up to
 * 16 tokens and the one-token gate/up, so that the tiny test models run it). Measured on the H200
 * (bench_cuda, FM_BENCH_TARGET_ONLY=1; each kernel alone at one token, staged -> registers): lm_head 122.7
 * -> 104.6 us (9,496 blocks: many waves), down 13.2 -> 12.7 us (76 tiles a warp), but gate/up 25.1 ->
 * 31.8, qkv 10.6 -> 11.3, wo 6.6 -> 6.8 us; in the step's graph with these two only, three rounds against
 * the staged loop in one call: 2.550 -> 2.508 ms. At 9..16 tokens every product but gate/up takes it
 * (verify(9) 3.37-3.39 -> 3.27-3.30 ms, verify(16) 3.45 -> 3.36-3.38; gate/up there too: verify(9) 3.46
 * ms), the drafter's 16 slots included (a draft 1.017-1.022 -> 0.985-0.986 ms, though fc1 / fc2 alone
 * take 13.7 / 21.2-21.4 -> 16.5-16.8 / 23.0-23.1 us: in the draft's graph the blocks without stage memory
 * win). */
static int g_reg_all = 0;
/* A grid of many waves (the lm_head's): more than 8 blocks an SM. */
static bool q8_many_waves(const fmc_q8 *w) {
    const unsigned grid = (unsigned)((w->N + 15) / 16 / w->sp.rt) * w->sp.kc;
    return grid > 8u * (unsigned)fmc_sm_count();
}
static bool q8_takes_reg_loop(const fmc_q8 *w, int T, int mode) {
    const bool store = mode == Q8_STORE || mode == Q8_ADD;
    if (g_reg_all && ((store && T <= 8 * REG_MAX_NT) || (mode == Q8_GLU && T == 1))) return true;
    if (T > 8 * REG_MAX_NT) return false;
    if (T > 8) return mode != Q8_GLU;
    if (!store) return false;
    const int tiles_a_warp = (w->K / 32) / (w->sp.w * w->sp.kc);
    /* Many waves, up to 8 tokens (verify(8), drafts of 7: the lm_head at 8 tokens 124.2 -> 108.4 us); long
     * warp shares at one token only (down at 8 tokens 13.27 -> 13.40 us). */
    if (q8_many_waves(w)) return true;
    return T == 1 && tiles_a_warp >= 64;
}

void fmc_q8_set_reg_all(int on) {
    g_reg_all = on;
}

/* The row-tile loop (cuda_q8_rows.cuh) for store / add products of a grid of many waves (the lm_head) from
 * g_rows_from tokens on (FMC_Q8_ROWS=n: from n, 0 never, for experiments); g_rows_all: every store / add
 * product of one block a group whose warps' shares it can split (tests). Returns the weight tiles a warp
 * keeps in flight, the most that divide its share, or 0 for another form. From 9 tokens: the lm_head alone
 * (bench_cuda, H100, the same binary with FMC_Q8_ROWS=1 and 9) at 16 / 17 tokens took 156.3 / 160.2 us
 * against 170 (ncu) / 206.5 on the register and staged loops, but at 1 / 8 tokens 137.5 / 146.5 against
 * 132.7-133.5 / 142.3-143.2 on theirs, which already stream at 96-104 % of the copy rate; verify(17) 4.090
 * -> 4.040 ms, a draft of 16 slots 0.820 -> 0.800 ms (bench/RESULTS.md, forty-fourth session). */
static int g_rows_from = 9, g_rows_all = 0;
/* Blocks of each row-tile kernel an SM holds by its registers and threads ([NT - 1][mode], fmc_q8_init: the
 * occupancy query is not made during a graph's capture); shared memory decides the rest at launch. */
static int g_rows_fit[ROWS_MAX_NT][2];
static int q8_rows_depth(const fmc_q8 *w, const q8_args &a, int mode) {
    if ((mode != Q8_STORE && mode != Q8_ADD) || a.T > 8 * ROWS_MAX_NT || w->sp.kc != 1 || w->sp.rt != 1 ||
        Q8_WARPS % w->sp.w || ((uintptr_t)a.xq | (uintptr_t)a.xd) % 16 ||
        q8_rows_smem(Q8_WARPS, (a.T + 7) / 8, w->K / 32) > Q8_SMEM_LIMIT)
        return 0;
    if (!g_rows_all && (g_rows_from <= 0 || a.T < g_rows_from || !q8_many_waves(w))) return 0;
    const int nbw = w->K / 32 / w->sp.w;
    int rd = ROWS_RD;
    while (nbw % rd) rd--;
    return rd >= 4 || g_rows_all ? rd : 0;
}

void fmc_q8_set_rows_all(int on) {
    g_rows_all = on;
}

/* One wave: as many blocks as fit an SM (shared memory, registers) on every SM, each a run of row tiles
 * that its groups share evenly. */
static void q8_rows_run(const fmc_q8 *w, const q8_args &a, int mode, int rd, int pdl, cudaStream_t s) {
    const int NT = (a.T + 7) / 8, NT16 = (w->N + 15) / 16, groups = Q8_WARPS / w->sp.w;
    const size_t smem = q8_rows_smem(Q8_WARPS, NT, w->K / 32);
    void (*k)(const q8_args, int, int) = NULL;
#define X(nt, m)                                                                                             \
    if (NT == nt && mode == m) k = k_q8_rows<nt, m>;
    Q8_ROWS_KERNELS(X)
#undef X
    const int by_smem = (int)blocks_fit_sm(smem), by_regs = g_rows_fit[NT - 1][mode];
    const int fit = std::max(1, std::min(by_smem, by_regs));
    const int blocks = std::min((NT16 + groups - 1) / groups, fit * fmc_sm_count());
    const int per = ((NT16 + blocks - 1) / blocks + groups - 1) / groups * groups;
    fmc_launch(k, dim3((unsigned)((NT16 + per - 1) / per)), dim3(Q8_THREADS), smem, s, pdl, a, per, rd);
}

/* A drafter product whose groups span several blocks (kc > 1) runs each group as one thread-block cluster, so
 * that the blocks' partial sums meet in shared memory (gemm_merge) rather than through L2 with a fence and
 * an atomic: the same additions in the same order. On sm_90 and newer, up to the portable 8 blocks a
 * cluster; FMC_Q8_NO_CLUSTER (or fmc_q8_set_cluster(0)) keeps the L2 path. Measured on the H200
 * (bench_cuda, alternated in one call, two calls): a Q8_0 draft of 16 / 7 out 0.982-0.998 / 0.943-0.956 ->
 * 0.930-0.942 / 0.890-0.905 ms. Not used where it was not measured to pay: the BF16 drafter's products (a
 * draft 1.247-1.250 -> 1.248-1.258 ms) and the target's (at Qwen3-4B's shapes every target product has kc
 * = 1, so none merges across blocks). */
static bool g_cluster_ok = false, g_cluster = false;
/* Once a process (fmc_init runs once per backend and per debug call): what the device and the environment
 * say, before any fmc_q8_set_cluster. */
static void q8_cluster_detect(void) {
    static bool done = false;
    int dev = 0, major = 0;
    if (done) return;
    done = true;
    g_cluster_ok = cudaGetDevice(&dev) == cudaSuccess &&
                   cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                   major >= 9;
    g_cluster = g_cluster_ok && !getenv("FMC_Q8_NO_CLUSTER");
}
static bool q8_takes_cluster(const fmc_q8 *w, int mode) {
    return g_cluster && mode >= Q8_DSTORE && w->sp.kc > 1 && w->sp.kc <= 8;
}

int fmc_q8_set_cluster(int on) {
    q8_cluster_detect();
    g_cluster = on && g_cluster_ok;
    return g_cluster;
}

/* Which products of one n-tile take q8_gemv_loop, at what depth (tiles in flight a warp; 0: not), by
 * class: q the qkv shape (N > K), o wo and down (N <= K), g gate/up, h grids of many waves (the lm_head,
 * whose blocks would each copy the activations: at 2..8 tokens 23 KB a block, so it keeps the register
 * loop there); [0] one token, [1] 2..8. FMC_Q8_GEMV / FMC_Q8_GEMV8 override them (experiments): "0" none,
 * or letters with depths, e.g. "q12,o0". */
enum { GEMV_Q, GEMV_O, GEMV_G, GEMV_H, GEMV_CLASSES };
/* Measured on the H200 (RESULTS, twenty-third session), against the staged / register loops: at one token
 * qkv 10.6 -> 10.4, gate/up 25.3 -> 20.9, down 12.7 -> 12.1, lm_head 104 -> 95 us, wo the same, plain step
 * 2.51 -> 2.24 ms; at 2..8 tokens only gate/up gains (25.5 -> 24.5 us) while qkv, wo and down lose 40-55 %
 * (their copies to shared memory, 288 bytes a 32-block, sit on the critical path): verify(8) 2.71 -> 3.13
 * ms, so off there (FMC_Q8_GEMV8 for experiments; the tests run it). */
static const int g_gemv_default[2][GEMV_CLASSES] = {{16, 16, 16, 8}, {0, 0, 0, 0}};
static int g_gemv[2][GEMV_CLASSES] = {{16, 16, 16, 8}, {0, 0, 0, 0}};
static int gemv_class(const fmc_q8 *w, int mode) {
    if (q8_many_waves(w)) return GEMV_H;
    return mode == Q8_GLU ? GEMV_G : w->N > w->K ? GEMV_Q : GEMV_O;
}
static void gemv_parse(int *rd, const char *e) {
    if (!strcmp(e, "0")) {
        for (int c = 0; c < GEMV_CLASSES; c++) rd[c] = 0;
        return;
    }
    for (const char *p = e; *p; p++) {
        const char *cls = strchr("qogh", *p);
        if (cls && *cls) rd[cls - "qogh"] = atoi(p + 1);
    }
}
void fmc_q8_set_gemv(int rd) {
    for (int f = 0; f < 2; f++)
        for (int c = 0; c < GEMV_CLASSES; c++) g_gemv[f][c] = rd < 0 ? g_gemv_default[f][c] : rd;
}
static q8_kernel q8_pick_gemv(const fmc_q8 *w, int T, int mode) {
    if (T > 8 || mode > Q8_GLU) return NULL;
    const int xs = T > 1 ? 2 : 1, rd = g_gemv[xs - 1][gemv_class(w, mode)];
#define X(m, d, x)                                                                                           \
    if (mode == m && rd == d && xs == x) return k_q8_gemv<m, d, x>;
    Q8_GEMV_KERNELS(X)
#undef X
    return NULL;
}

/* NULL for a combination not instantiated. */
static q8_kernel q8_pick(int NT, int mode, bool reg, bool cl) {
#define X(nt, m)                                                                                             \
    if (reg && !cl && NT == nt && mode == m) return k_q8_gemm_reg<nt, m, false>;
    Q8_REG_KERNELS(X)
#undef X
#define X(nt, m)                                                                                             \
    if (!reg && !cl && NT == nt && mode == m) return k_q8_gemm<nt, m, false>;
    Q8_KERNELS(X)
#undef X
#define X(nt, m)                                                                                             \
    if (reg && cl && NT == nt && mode == m) return k_q8_gemm_reg<nt, m, true>;
    Q8_REG_CLUSTER_KERNELS(X)
#undef X
#define X(nt, m)                                                                                             \
    if (!reg && cl && NT == nt && mode == m) return k_q8_gemm<nt, m, true>;
    Q8_CLUSTER_KERNELS(X)
#undef X
    return NULL;
}

int fmc_q8_init(void) {
    int bad = 0;
    auto smem_limit = [&bad](auto k) {
        bad |= cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, Q8_SMEM_LIMIT) !=
               cudaSuccess;
    };
#define X(nt, m) smem_limit(k_q8_gemm<nt, m, false>);
    Q8_KERNELS(X)
#undef X
#define X(nt, m) smem_limit(k_q8_gemm_reg<nt, m, false>);
    Q8_REG_KERNELS(X)
#undef X
#define X(nt, m) smem_limit(k_q8_gemm<nt, m, true>);
    Q8_CLUSTER_KERNELS(X)
#undef X
#define X(nt, m) smem_limit(k_q8_gemm_reg<nt, m, true>);
    Q8_REG_CLUSTER_KERNELS(X)
#undef X
#define X(m, rd, xs) smem_limit(k_q8_gemv<m, rd, xs>);
    Q8_GEMV_KERNELS(X)
#undef X
#define X(nt, m)                                                                                             \
    smem_limit(k_q8_rows<nt, m>);                                                                            \
    bad |= cudaOccupancyMaxActiveBlocksPerMultiprocessor(&g_rows_fit[nt - 1][m], k_q8_rows<nt, m>,           \
                                                         Q8_THREADS, 0) != cudaSuccess;
    Q8_ROWS_KERNELS(X)
#undef X
    bad |= cudaFuncSetAttribute(k_ln_mod_quant, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                3 * FMC_LN_MOD_MAX_N * (int)sizeof(float)) != cudaSuccess;
    if (getenv("FMC_Q8_GEMV")) gemv_parse(g_gemv[0], getenv("FMC_Q8_GEMV"));
    if (getenv("FMC_Q8_GEMV8")) gemv_parse(g_gemv[1], getenv("FMC_Q8_GEMV8"));
    const char *e = getenv("FMC_Q8_MAXB");
    if (e) g_maxb = atoi(e);
    /* the register loop wherever g_reg_all takes it (experiments; on the H200 a step with every one-token
     * product on it took 2.66 ms against 2.49, and 2.80-2.83 with FMC_Q8_PER_SM / FMC_Q8_PLAN_BELOW at 8
     * or 16: more blocks in several waves merge more partial sums than the waves save, RESULTS "Twentieth
     * session") */
    if (getenv("FMC_Q8_REG_ALL")) g_reg_all = 1;
    if ((e = getenv("FMC_Q8_ROWS"))) g_rows_from = atoi(e);
    q8_cluster_detect();
    int dev = 0, sm = 0, reserved = 0;
    if (cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev) == cudaSuccess &&
        sm > 0) {
        g_sm_bytes = (size_t)sm;
        g_block_extra = (size_t)reserved + 1536;
    }
    return bad || q8_wide_init() ? -1 : 0;
}

void fmc_q8_quant(const float *x, int ldx, const float *nw, float eps, int K, int T, int8_t *xq, float *xd,
                  int pdl, cudaStream_t s) {
    const dim3 grid(T, nw ? 1 : (K + QUANT_CHUNK - 1) / QUANT_CHUNK);
    fmc_launch(k_quant, grid, dim3(Q8_THREADS), 0, s, pdl, x, ldx, nw, eps, K, xq, xd);
}

/* f32 input: the quantiser kernel first. Then one launch: of the narrow kernel up to 32 tokens, of the wide
 * one (cuda_q8_wide.cu) beyond. */
static void q8_run(const fmc_q8 *w, const fmc_q8_in *in, int T, int mode, float *y, int ldy, float *y2,
                   int ldy2, int8_t *oq, float *od, const float *bias, const float *gate, int pdl,
                   cudaStream_t s) {
    if (in->x) fmc_q8_quant(in->x, in->ldx, in->nw, in->eps, w->K, T, in->xq, in->xd, pdl, s);
    q8_args a;
    a.qs = w->qs, a.sc = w->sc, a.N = w->N, a.K = w->K, a.T = T, a.sp = w->sp;
    a.xq = in->xq, a.xd = in->xd;
    a.y = y, a.ldy = ldy, a.y2 = y2, a.ldy2 = ldy2, a.oq = oq, a.od = od;
    a.bias = bias, a.gate = gate;
    if (T > GEMM_MAX_TOK) {
        q8_wide_run(w, a, mode, pdl, s);
        return;
    }
    const int rd = q8_rows_depth(w, a, mode);
    if (rd) {
        q8_rows_run(w, a, mode, rd, pdl, s);
        return;
    }
    const unsigned groups = (unsigned)((w->N + 15) / 16 / w->sp.rt);
    const int NT = (T + 7) / 8;
    q8_kernel k = q8_pick_gemv(w, T, mode);
    const bool gv = k != NULL, reg = gv || q8_takes_reg_loop(w, T, mode);
    if (!k && q8_takes_cluster(w, mode)) k = q8_pick(NT, mode, reg, true);
    const bool cl = k != NULL && !gv;
    if (!k) k = q8_pick(NT, mode, reg, false);
    const size_t smem =
        q8_smem(&w->sp, NT, mode, reg, cl, gv ? q8_gemv_xs_bytes(w->K / 32 / w->sp.kc, T > 1) : 0);
    fmc_launch_cluster(k, dim3(groups * w->sp.kc), dim3(w->sp.rt * w->sp.w * 32),
                       fmc_gemm_spread(smem, groups * w->sp.kc, Q8_SMEM_LIMIT), s, pdl, cl ? w->sp.kc : 1, a);
}

void fmc_q8_matmul(const fmc_q8 *w, const fmc_q8_in *in, int T, float *y, int ldy, int add, float *y2,
                   int ldy2, int pdl, cudaStream_t s) {
    q8_run(w, in, T, add ? Q8_ADD : Q8_STORE, y, ldy, y2, ldy2, NULL, NULL, NULL, NULL, pdl, s);
}

void fmc_q8_glu(const fmc_q8 *w, const fmc_q8_in *in, int T, int8_t *oq, float *od, int pdl, cudaStream_t s) {
    q8_run(w, in, T, Q8_GLU, NULL, 0, NULL, 0, oq, od, NULL, NULL, pdl, s);
}

void fmc_q8_dmatmul(const fmc_q8 *w, const fmc_q8_in *in, int T, float *y, int ldy, const float *bias,
                    int mode, const float *gate, int pdl, cudaStream_t s) {
    q8_run(w, in, T, Q8_DSTORE + mode, y, ldy, NULL, 0, NULL, NULL, bias, gate, pdl, s);
}
