/* cuda_q8_rows.cuh: the narrow Q8_0 product of a matrix of many row tiles (the lm_head's 9,496), as one wave
 * of blocks that each walk a run of row tiles. The other forms launch a block a row tile, and each of its
 * warps reads its tokens' activations for its K share from L2 beside every weight tile: at 16 tokens as many
 * bytes as the weights themselves (40 KB against 43.5 KB a row tile of Qwen3-4B's lm_head), so the lm_head
 * at 9..17 rows ran at the pace of L2 rather than of the memory (ncu, H100: 170 us at 16 rows). Here a block
 * copies the activations of all of K into shared memory once; its groups of w warps (a row tile each, warp i
 * its K share i, as in every form) walk their row tiles with rd weight tiles a warp in flight in registers,
 * the next row tile's first ones loaded while the current one's last are used. The same tiles, mma, scaling
 * and merge in the same order as the other forms (cuda_q8.cuh): the same bits. cuda_q8.cu takes it from 9
 * tokens (q8_rows_depth: below, the other forms already stream the lm_head at the copy rate). */
#ifndef FM_CUDA_Q8_ROWS_CUH
#define FM_CUDA_Q8_ROWS_CUH

#include "cuda/cuda_q8_narrow.cuh"

/* Most weight tiles a warp keeps in flight (rd <= ROWS_RD dividing the warp's share: cuda_q8.cu picks it),
 * and most n-tiles of 8 tokens. */
enum { ROWS_RD = 10, ROWS_MAX_NT = 3 };

/* Shared memory of a block of `warps` warps: two merge buffers [warps][NT][4][32] (a group's next row tile
 * writes the other one while its warp 0 may still read this one), then NT n-tiles of activations: fragments
 * [NT][NB][32 lanes][8 bytes] and scales [NT][NB][8] (cuda_device.cuh, frag_off / frag_d). */
__host__ __device__ constexpr size_t q8_rows_smem(int warps, int NT, int NB) {
    return (size_t)2 * warps * NT * 4 * 32 * 4 + (size_t)NT * NB * (256 + 32);
}

/* Block b takes row tiles [b per, (b + 1) per); its group r (warps r w .. r w + w - 1) those r, r + groups,
 * ... of them. */
template <int NT, int MODE> __device__ __forceinline__ void q8_rows_block(const q8_args &a, int per, int rd) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int w = a.sp.w, warps = blockDim.x >> 5, groups = warps / w;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, r = warp / w, i = warp - r * w;
    const int g = lane >> 2, c = lane & 3;
    const int NB = a.K >> 5, NT16 = (a.N + 15) >> 4, nbw = NB / w, b0 = i * nbw;
    const int last = min((int)(blockIdx.x + 1) * per, NT16);
    int tile = (int)blockIdx.x * per + r;
    float *red = (float *)smem;
    const size_t redf = (size_t)warps * NT * 4 * 32;
    uint2 *xs = (uint2 *)(red + 2 * redf);
    const float *ds = (const float *)(xs + (size_t)NT * NB * 32);
    /* from one of the group's row tiles to its next: weights, scale pairs */
    const int64_t wstep = (int64_t)groups * NB * 32, sstep = (int64_t)groups * NB * 8;
    const int4 *ap = a.qs + ((int64_t)tile * NB + b0) * 32 + lane;
    const uint32_t *sp8 = a.sc + ((int64_t)tile * NB + b0) * 8 + g;

    /* Weights never change: the first row tile's in flight before the predecessor is done. */
    int4 W[ROWS_RD];
    uint32_t S[ROWS_RD];
#pragma unroll
    for (int k = 0; k < ROWS_RD; k++)
        if (k < rd && tile < last) W[k] = ld_stream16(ap + k * 32), S[k] = __ldg(sp8 + k * 8);
    pdl_trigger();
    pdl_wait();
    /* Fragments of tokens past T as zeros (not read); their scales are copied (within the buffer's groups
     * of 8 tokens) and meet only sums that no one stores. */
    for (int j = threadIdx.x; j < NT * NB * 16; j += blockDim.x) {
        const int t = 8 * (j / (NB * 16)) + ((j & 15) >> 1);
        cp_async16((int4 *)xs + j, (const int4 *)a.xq + j, t < a.T ? 16 : 0);
    }
    for (int j = threadIdx.x; j < NT * NB * 2; j += blockDim.x)
        cp_async16((float4 *)ds + j, (const float4 *)a.xd + j);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    const named_bar bar{1 + r, w * 32};
    for (int par = 0; tile < last; tile += groups, par ^= 1) {
        const bool next = tile + groups < last;
        float acc[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
        for (int it0 = 0; it0 < nbw; it0 += rd) {
#pragma unroll
            for (int k = 0; k < ROWS_RD; k++) {
                if (k >= rd) break;
                const int kb = b0 + it0 + k;
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    const uint2 xv = xs[((size_t)n * NB + kb) * 32 + lane];
                    const float2 dx = *(const float2 *)(ds + ((size_t)n * NB + kb) * 8 + 2 * c);
                    int d[4];
                    mma_s8(d, W[k], xv.x, xv.y);
                    q8_scale_add<4>(acc[n], d, half_lo(S[k]), half_hi(S[k]), dx);
                }
                /* the slot's next tile: of this row tile, or the first ones of the group's next */
                const int nx = it0 + k + rd;
                if (nx < nbw)
                    W[k] = ld_stream16(ap + nx * 32), S[k] = __ldg(sp8 + nx * 8);
                else if (next)
                    W[k] = ld_stream16(ap + wstep + (nx - nbw) * 32),
                    S[k] = __ldg(sp8 + sstep + (nx - nbw) * 8);
            }
        }
        ap += wstep, sp8 += sstep;
        if (w > 1) gemm_merge_warps(acc, w, i, red + par * redf, bar);
        if (i != 0) continue;
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int row = tile * 16 + g + (j >> 1) * 8, t = 8 * n + 2 * c + (j & 1);
                if (t < a.T && row < a.N) q8_out<MODE>(a, row, t, acc[n][j]);
            }
    }
}

#endif
