/* cuda_gemm.cuh: what the Q8_0 and BF16 products share (cuda_q8.cu, cuda_bf16.cu): the choice of their work
 * split (fmc_split in cuda_kernels.cuh), the per-warp cp.async pipeline that keeps several weight tiles of
 * 512 bytes and their activation fragments in flight per warp without holding them in registers, and the
 * deterministic merge of the warps' and blocks' partial sums. */
#ifndef FM_CUDA_GEMM_CUH
#define FM_CUDA_GEMM_CUH

#include "cuda/cuda_device.cuh"
#include "cuda/cuda_kernels.cuh"

#include <cooperative_groups.h>

enum { GEMM_MAX_TOK = 32, GEMM_SLOT = 4 * 4 * 32 /* floats of one tile's partial, 4 n-tiles */ };

/* Pipeline depth (tiles in flight per warp): 8, or 4 for 17..32 tokens, whose activation fragments make a
 * stage large. */
__host__ __device__ constexpr int gemm_stages(int NT) {
    return NT <= 2 ? 8 : 4;
}

/* nb: K blocks of a row tile (K/32 for Q8_0, K/16 for BF16). Warps per tile w: 4 (1 for the gate/up group of
 * 4 tiles), fewer when nb does not divide; blocks per group kc: doubled while the grid keeps under `below`
 * blocks per SM (4) and within one wave of `per_sm` resident blocks per SM, and each warp keeps at least 8
 * tiles. The split sets the order of a row's sums, so it depends on the matrix and the device only, never
 * on T. */
static inline void gemm_plan(fmc_split *sp, int nb, int NT16, int glu, int per_sm, int below = 4) {
    sp->rt = glu ? 4 : 1;
    const long groups = glu ? NT16 / 4 : NT16, sms = fmc_sm_count();
    int w = glu ? 1 : 4;
    while (w > 1 && nb % w) w /= 2;
    int kc = 1;
    while (groups * kc < below * sms && groups * kc * 2 <= per_sm * sms && nb % (w * kc * 2) == 0 &&
           nb / (w * kc * 2) >= 8)
        kc *= 2;
    sp->w = w;
    sp->kc = kc;
    sp->part = NULL;
    sp->cnt = NULL;
}

/* Shared memory for a launch of `blocks` product blocks that each need smem: grown (up to limit) so that the
 * grid spreads evenly over the SMs when it runs in one wave (cuda_q8.cu). */
size_t fmc_gemm_spread(size_t smem, unsigned blocks, size_t limit);

/* Floats of the kc blocks' sums that block 0 of a cluster takes in (gemm_merge's cs): [kc][rt][NT][4][32]. */
__host__ __device__ constexpr size_t gemm_cluster_floats(int kc, int rt, int NT) {
    return (size_t)kc * rt * NT * 4 * 32;
}

/* acc[n][j] += p[q * stride + (n * 4 + j) * 32] for q = 1 .. count - 1, in that order (round to nearest
 * each time: a merge's sums are the same whichever way they came). */
template <int NT>
__device__ __forceinline__ void gemm_add_in_order(float (&acc)[NT][4], int count, const float *p,
                                                  size_t stride) {
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float v = acc[n][j];
            for (int q = 1; q < count; q++) v = __fadd_rn(v, p[q * stride + (n * 4 + j) * 32]);
            acc[n][j] = v;
        }
}

/* The w warps of a tile (this warp its K share i; red: shared [warps][NT][4][32] of the block's warps) add
 * their sums in warp order into warp i == 0's acc; bar: a barrier of (at least) those w warps. */
template <int NT, class BAR>
__device__ __forceinline__ void gemm_merge_warps(float (&acc)[NT][4], int w, int i, float *red,
                                                 const BAR &bar) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int j = 0; j < 4; j++) red[((warp * NT + n) * 4 + j) * 32 + lane] = acc[n][j];
    bar.sync();
    if (i == 0) gemm_add_in_order(acc, w, red + (size_t)warp * NT * 4 * 32 + lane, (size_t)NT * 4 * 32);
}

/* Merges the partial sums acc of warp (r, i) (tile r of the group, K share i) of block kci of group `group`:
 * the w warps of a tile in warp order (red: shared [warps][NT][4][32]), then, when kc > 1, the kc blocks in
 * block order. With CL (the group's kc blocks launched as one cluster; cs: gemm_cluster_floats of shared
 * memory that the block no longer needs once all its threads are past the warp merge) by block 0, the others'
 * sums pushed into its cs through distributed shared memory; else by the last block to arrive, through `part`
 * in L2. The same additions in the same order either way. Returns -1 in the blocks that do not finish the
 * group (the whole block), else 1 in the warps that hold their tile's final sums (i == 0) and 0 in the
 * others. */
template <int NT, bool CL = false>
__device__ int gemm_merge(float (&acc)[NT][4], const fmc_split &sp, int group, int kci, float *red,
                          float *cs = nullptr) {
    __shared__ unsigned last;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, r = warp / sp.w, i = warp - r * sp.w;
    if (sp.w > 1) gemm_merge_warps(acc, sp.w, i, red, block_bar{});
    if (sp.kc == 1) return i == 0;
    if constexpr (CL) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        /* A global store, atomic and load chain (L2 round trips on the last block's path)
         * becomes two cluster barriers and one store into block 0's shared memory. The first barrier: every
         * block of the cluster has started and block 0 is past its stages, where cs lies; the second: the
         * pushed sums are visible to block 0 (release / acquire), and no block exits while another still
         * writes into it. */
        namespace cg = cooperative_groups;
        const cg::cluster_group cl = cg::this_cluster();
        const size_t tile = (size_t)NT * 4 * 32; /* floats of one tile's sums */
        cl.sync();
        if (kci > 0) {
            if (i == 0) {
                float *dst = cl.map_shared_rank(cs, 0) + ((size_t)kci * sp.rt + r) * tile + lane;
#pragma unroll
                for (int n = 0; n < NT; n++)
#pragma unroll
                    for (int j = 0; j < 4; j++) dst[(n * 4 + j) * 32] = acc[n][j];
            }
            cl.sync();
            return -1;
        }
        cl.sync();
        if (i == 0) gemm_add_in_order(acc, sp.kc, cs + (size_t)r * tile + lane, (size_t)sp.rt * tile);
        return i == 0;
#else
        __trap(); /* the host launches clusters on sm_90 and newer only */
#endif
    }
    float *slot = sp.part + ((size_t)group * sp.kc * sp.rt + r) * GEMM_SLOT;
    const size_t stride = (size_t)sp.rt * GEMM_SLOT; /* from block kci to kci + 1 */
    if (i == 0)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int j = 0; j < 4; j++) __stcg(slot + kci * stride + (n * 4 + j) * 32 + lane, acc[n][j]);
    /* release the block's sums, and in the last block acquire the others' (cuda_device.cuh: no fences) */
    __syncthreads();
    if (threadIdx.x == 0) last = atom_add_acq_rel(sp.cnt + group, 1u) == (unsigned)(sp.kc - 1);
    __syncthreads();
    if (!last) return -1;
    if (i == 0)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float v = __ldcg(slot + (n * 4 + j) * 32 + lane);
                for (int k = 1; k < sp.kc; k++)
                    v = __fadd_rn(v, __ldcg(slot + k * stride + (n * 4 + j) * 32 + lane));
                acc[n][j] = v;
            }
    if (threadIdx.x == 0) sp.cnt[group] = 0; /* ready for the next launch */
    return i == 0;
}

#endif
