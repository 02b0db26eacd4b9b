/* cuda_device.cuh: device-side helpers shared by the CUDA backend's kernel files (warp reductions, the Q8_0
 * activation quantiser, programmatic dependent launch, loads that bypass L1, cp.async).
 *
 * Programmatic dependent launch (PDL, sm_90): a kernel launched with fmc_launch(..., pdl = 1) may start while
 * the kernel before it in the stream still runs. Such a kernel calls pdl_wait() before its first access to
 * memory that an earlier kernel writes or reads (weights, which never change, may be read before), and every
 * kernel calls pdl_trigger() at its start so that its successor can be scheduled early. pdl_wait() makes
 * the direct predecessor's writes visible; data written further back is read with ld_cg (L2, coherent), so no
 * stale L1 line can be hit whatever the hardware does to L1 at launch. */
#ifndef FM_CUDA_DEVICE_CUH
#define FM_CUDA_DEVICE_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#define WARP 32

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* GPU-scope synchronisation through one counter in L2 (sm_70+). A block counts itself in after a
 * __syncthreads (or named barrier) with a release operation, which covers the writes the barrier ordered
 * before it (cumulativity), and a reader waits with acquire loads; neither needs a __threadfence (a
 * MEMBAR.SC.GPU, about an L2 round trip on the caller's path: bench/RESULTS.md, thirty-second session). */
__device__ __forceinline__ unsigned ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void red_release(unsigned *p, unsigned v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
/* The last of several blocks to count itself in also acquires the writes of all the others. */
__device__ __forceinline__ unsigned atom_add_acq_rel(unsigned *p, unsigned v) {
    unsigned old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

/* cp.async copies global -> shared (sm_80+), bypassing the registers. */
/* 16 bytes; src_bytes = 0 fills the destination with zeros (and reads nothing). */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes = 16) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
        "l"(src), "r"(src_bytes)
        : "memory");
#endif
}
/* An L2 policy that evicts the lines it loads first: for data read once per kernel (the KV cache in the
 * attention), so that what is read again soon (the splits' partial results, read by the merge) stays. */
__device__ __forceinline__ uint64_t l2_evict_first() {
    uint64_t p = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
#endif
    return p;
}
/* cp_async16 with an L2 policy (l2_evict_first). */
__device__ __forceinline__ void cp_async16_hint(void *dst, const void *src, int src_bytes, uint64_t pol) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(
                     (unsigned)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(src_bytes), "l"(pol)
                 : "memory");
#endif
}
__device__ __forceinline__ void cp_async4(void *dst, const void *src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
                 "l"(src)
                 : "memory");
#endif
}
/* 8 bytes; src_bytes = 0 fills the destination with zeros (and reads nothing). */
__device__ __forceinline__ void cp_async8(void *dst, const void *src, int src_bytes = 8) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
        "l"(src), "r"(src_bytes)
        : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

/* Bulk copies by the copy engine with mbarrier completion (sm_90; the bench's persistent kernels and probe
 * only: elsewhere they trap). A barrier of `count` arrivals; mb_expect arrives and adds the bytes the
 * copies signalled on it will bring; mb_wait spins until the phase of the given parity completes. */
__device__ __forceinline__ unsigned smem_addr(const void *p) {
    return (unsigned)__cvta_generic_to_shared(p);
}
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FM_SM90_ASM(...) asm volatile(__VA_ARGS__)
#else
#define FM_SM90_ASM(...) __trap()
#endif
__device__ __forceinline__ void mb_init(uint64_t *b, unsigned count) {
    FM_SM90_ASM("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mb_expect(uint64_t *b, unsigned bytes) {
    FM_SM90_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(b)), "r"(bytes)
                : "memory");
}
__device__ __forceinline__ void mb_arrive(uint64_t *b) {
    FM_SM90_ASM("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(b)) : "memory");
}
__device__ __forceinline__ void mb_wait(uint64_t *b, unsigned parity) {
    FM_SM90_ASM(
        "{\n.reg .pred p;\nW%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W%=;\n}" ::
            "r"(smem_addr(b)),
        "r"(parity)
        : "memory");
}
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, unsigned bytes, uint64_t *b) {
    FM_SM90_ASM(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(smem_addr(b))
        : "memory");
}
/* bulk_copy with an L2 policy (l2_evict_first: weights read once a step). */
__device__ __forceinline__ void bulk_copy_hint(void *dst, const void *src, unsigned bytes, uint64_t *b,
                                               uint64_t pol) {
    FM_SM90_ASM(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], "
        "%2, [%3], %4;" ::"r"(smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(smem_addr(b)), "l"(pol)
        : "memory");
}
#undef FM_SM90_ASM

__device__ __forceinline__ float ld_cg(const float *p) {
    return __ldcg(p);
}
__device__ __forceinline__ float4 ld_cg4(const float *p) {
    return __ldcg((const float4 *)p);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
/* Barrier id (1 .. 15; 0 is __syncthreads) of n threads (a multiple of 32): a group of warps meets without
 * stopping the rest of the block. */
__device__ __forceinline__ void named_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}
/* The same as an object, for code that takes its barrier as a parameter (the quantiser, an attention tile
 * on several warps, a merge unit). */
struct named_bar {
    int id, n;
    __device__ __forceinline__ void sync() const { named_sync(id, n); }
};
/* The whole block (barrier 0), for the same code in a kernel of its own. */
struct block_bar {
    __device__ __forceinline__ void sync() const { __syncthreads(); }
};

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Threads that sum together with group_sum_d: the whole block, or a group of a persistent block
 * (cuda_megakernel.cu) with a named barrier; sh: 32 doubles of the group's own. */
struct block_group {
    double *sh;
    __device__ __forceinline__ int tid() const { return threadIdx.x; }
    __device__ __forceinline__ int size() const { return blockDim.x; }
    __device__ __forceinline__ void sync() const { __syncthreads(); }
};

/* Sum over a group's threads (a multiple of 32) in a fixed order: the warp butterfly, then the warps in
 * order; every thread gets the result. */
template <class GRP> __device__ __forceinline__ double group_sum_d(double v, const GRP &grp) {
    const int lane = grp.tid() & 31, w = grp.tid() >> 5, nw = grp.size() >> 5;
    v = warp_sum_d(v);
    grp.sync();
    if (lane == 0) grp.sh[w] = v;
    grp.sync();
    double t = 0;
    for (int i = 0; i < nw; i++) t += grp.sh[i];
    return t;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Quantised activations in "fragment order" (the B operand of mma.m16n8k32, see cuda_kernels.cuh): byte
 * offset of (token t, column k) for NB = K/32 blocks in [T/8][NB][32 lanes][8 bytes], lane (g, c) holding
 * bytes 4c..4c+3 and 16+4c..16+4c+3 of its block for token g of the 8; and the index of the scale of (t,
 * block b) in [T/8][NB][8]. */
__device__ __forceinline__ size_t frag_off(int t, int k, int NB) {
    const int kk = k & 31, m = kk >> 2;
    return (((size_t)(t >> 3) * NB + (k >> 5)) * 32 + (t & 7) * 4 + (m & 3)) * 8 + (m >> 2) * 4 + (kk & 3);
}
__device__ __forceinline__ size_t frag_d(int t, int b, int NB) {
    return ((size_t)(t >> 3) * NB + b) * 8 + (t & 7);
}

/* ggml's quantize_row_q8_0_ref for one 32-block held one value per lane: d = amax / 127, id = d ? 1/d : 0,
 * q = roundf(v * id); the scale is returned as the f32 value of its f16 rounding. */
__device__ __forceinline__ int8_t quant_lane(float v, float *d_out) {
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    *d_out = __half2float(__float2half_rn(d));
    return (int8_t)roundf(v * id);
}

/* The same for a 32-block held by 8 lanes of a warp (lanes 8k .. 8k + 7, lane i its values 4 (i % 8) ..
 * 4 (i % 8) + 3): the block's amax by a max butterfly (max is exact: any order gives ggml's), the lane's 4
 * quants packed into *word; every lane gets the scale. Every lane of the warp calls it. */
__device__ __forceinline__ float quant_lanes8(const float (&v)[4], uint32_t *word) {
    float amax = fmaxf(fmaxf(fmaxf(fmaxf(0.0f, fabsf(v[0])), fabsf(v[1])), fabsf(v[2])), fabsf(v[3]));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint32_t p = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) p |= (uint32_t)(uint8_t)(int8_t)roundf(v[j] * id) << (8 * j);
    *word = p;
    return __half2float(__float2half_rn(d));
}

/* A (value, index) pair packed so that the larger value wins an unsigned max, then the lower index:
 * (order-preserving key of v) << 32 | ~i. 0 is below every packed pair (nothing found). */
__device__ __forceinline__ unsigned long long argmax_pack(float v, int i) {
    uint32_t u = __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return (unsigned long long)u << 32 | (0xffffffffu - (uint32_t)i);
}

/* The value of a packed pair. */
__device__ __forceinline__ float argmax_value(unsigned long long p) {
    const uint32_t key = (uint32_t)(p >> 32);
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

/* The block's largest packed pair into *out by atomicMax (out starts at 0). Every thread calls it. */
__device__ __forceinline__ void block_argmax_to(unsigned long long best, unsigned long long *out) {
    __shared__ unsigned long long sb[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long b = __shfl_xor_sync(0xffffffffu, best, o);
        best = b > best ? b : best;
    }
    if ((threadIdx.x & 31) == 0) sb[threadIdx.x >> 5] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) best = sb[w] > best ? sb[w] : best;
        if (best) atomicMax(out, best);
    }
}

#endif
