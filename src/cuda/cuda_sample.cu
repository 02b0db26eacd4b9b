/* cuda_sample.cu: each row's sampling candidates or draw (cuda_sample.cuh says which). Candidates take two
 * launches over the rows: tier statistics, then the gather, whose blocks each derive the same cut from
 * those integers; a draw takes one. */
#include <math.h>

#include "cuda/cuda_sample.cuh"
#include "decode/sample_noise.h"

enum { BLOCK_TOKENS = 4096 };

/* The row's largest logit from fmc_argmax's packed (key << 32 | ~index). */
__device__ __forceinline__ float packed_max(unsigned long long am) {
    const uint32_t key = (uint32_t)(am >> 32);
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

/* The same packing: larger score first, then the lower id. */
__device__ __forceinline__ unsigned long long pack(float v, int i) {
    uint32_t u = __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return (unsigned long long)u << 32 | (0xffffffffu - (uint32_t)i);
}

/* A token's tier (0: the top slice), or FMC_SAMPLE_TIERS below the range; both candidate kernels call it. */
__device__ __forceinline__ int tier_of(float v, float m, float range) {
    if (!(v >= m - range)) return FMC_SAMPLE_TIERS;
    const int t = (int)((m - v) / range * FMC_SAMPLE_TIERS);
    return t < FMC_SAMPLE_TIERS ? t : FMC_SAMPLE_TIERS - 1;
}

/* The sum of v over the warp's lanes where `mine` (every lane gets it): a warp's lanes mostly fall in one or
 * two tiers, and a shared-memory atomic per lane there would serialise. */
__device__ __forceinline__ unsigned long long warp_sum(unsigned long long v, bool mine) {
    v = mine ? v : 0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* grid (ceil(n / BLOCK_TOKENS), T). Every lane of a warp runs the same iterations (the ballots need it). */
__global__ void k_sample_stats(const float *x, int n, const unsigned long long *am, fmc_sample_args a,
                               fmc_sample_scratch scr) {
    __shared__ int cnt[FMC_SAMPLE_TIERS];
    __shared__ unsigned long long mass[FMC_SAMPLE_TIERS];
    const int t = blockIdx.y, c0 = blockIdx.x * BLOCK_TOKENS, c1 = min(n, c0 + BLOCK_TOKENS);
    const int lane = threadIdx.x & 31;
    for (int j = threadIdx.x; j < FMC_SAMPLE_TIERS; j += blockDim.x) cnt[j] = 0, mass[j] = 0;
    __syncthreads();
    const float m = packed_max(am[t]), inv_t = 1.0f / a.temperature;
    const float *r = x + (size_t)t * n;
    for (int i0 = c0; i0 < c1; i0 += blockDim.x) {
        const int i = i0 + threadIdx.x;
        const float v = i < c1 ? r[i] : -INFINITY;
        const int tier = tier_of(v, m, a.range);
        const unsigned long long q =
            tier < FMC_SAMPLE_TIERS ? __double2ull_rn((double)expf((v - m) * inv_t) * FMC_SAMPLE_SCALE) : 0;
        unsigned todo = __ballot_sync(0xffffffffu, tier < FMC_SAMPLE_TIERS);
        while (todo) { /* one round per distinct tier among the warp's lanes */
            const int lead = __shfl_sync(0xffffffffu, tier, __ffs(todo) - 1);
            const unsigned same = __ballot_sync(0xffffffffu, tier == lead);
            const unsigned long long tq = warp_sum(q, tier == lead);
            if (lane == __ffs(todo) - 1) {
                atomicAdd(&cnt[lead], __popc(same));
                atomicAdd(&mass[lead], tq);
            }
            todo &= ~same;
        }
    }
    __syncthreads();
    for (int j = threadIdx.x; j < FMC_SAMPLE_TIERS; j += blockDim.x)
        if (cnt[j]) {
            atomicAdd(scr.tier_n + t * FMC_SAMPLE_TIERS + j, cnt[j]);
            atomicAdd(scr.tier_w + t * FMC_SAMPLE_TIERS + j, mass[j]);
        }
}

/* grid (ceil(n / BLOCK_TOKENS), T): every block of a row derives the same cut, then appends its tokens. */
__global__ void k_sample_gather(const float *x, int n, const unsigned long long *am, fmc_sample_args a,
                                fmc_sample_scratch scr, int cap, int *count, unsigned long long *mass,
                                fmc_candidate *out) {
    const int t = blockIdx.y, c0 = blockIdx.x * BLOCK_TOKENS, c1 = min(n, c0 + BLOCK_TOKENS);
    const int *tn = scr.tier_n + t * FMC_SAMPLE_TIERS;
    const unsigned long long *tw = scr.tier_w + t * FMC_SAMPLE_TIERS;
    unsigned long long total = 0;
    for (int j = 0; j < FMC_SAMPLE_TIERS; j++) total += tw[j];
    int last_tier = FMC_SAMPLE_TIERS - 1;
    if (a.top_k > 0) {
        for (int j = 0, sum = 0; j < FMC_SAMPLE_TIERS; j++)
            if ((sum += tn[j]) >= a.top_k) {
                last_tier = j;
                break;
            }
    } else {
        const unsigned long long limit = (unsigned long long)((double)a.top_p * (double)total);
        unsigned long long sum = 0;
        for (int j = 0; j < FMC_SAMPLE_TIERS; j++)
            if ((sum += tw[j]) >= limit) {
                last_tier = min(j + 1, FMC_SAMPLE_TIERS - 1); /* one tier more: the host's sums round too */
                break;
            }
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) mass[t] = total;
    const float m = packed_max(am[t]);
    const float *r = x + (size_t)t * n;
    const int lane = threadIdx.x & 31;
    for (int i0 = c0; i0 < c1; i0 += blockDim.x) {
        const int i = i0 + threadIdx.x;
        const bool take = i < c1 && tier_of(r[i], m, a.range) <= last_tier;
        const unsigned mask = __ballot_sync(0xffffffffu, take);
        if (!mask) continue;
        int base = 0;
        if (lane == 0) base = atomicAdd(count + t, __popc(mask)); /* one atomic per warp */
        base = __shfl_sync(0xffffffffu, base, 0) + __popc(mask & ((1u << lane) - 1));
        if (take && base < cap) out[(size_t)t * cap + base] = fmc_candidate{r[i], i};
    }
}

/* grid (ceil(n / BLOCK_TOKENS), T): the Gumbel-max of each row, as the host's sampler computes it. */
__global__ void k_sample_draw(const float *x, int n, const unsigned long long *am, fmc_sample_args a,
                              unsigned long long *pick) {
    __shared__ unsigned long long sb[32];
    const int t = blockIdx.y, c0 = blockIdx.x * BLOCK_TOKENS, c1 = min(n, c0 + BLOCK_TOKENS);
    const float m = packed_max(am[t]);
    const uint64_t key = fm_sample_row_key(a.seed, a.pos0 + t);
    const float *r = x + (size_t)t * n;
    unsigned long long best = 0;
    for (int i = c0 + threadIdx.x; i < c1; i += blockDim.x) {
        const float v = r[i];
        if (!(((double)v - m) / a.temperature >= a.floor_d)) continue;
        const unsigned long long p = pack(fm_sample_score(v, m, a.temperature, key, i), i);
        best = p > best ? p : best;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long b = __shfl_xor_sync(0xffffffffu, best, o);
        best = b > best ? b : best;
    }
    if ((threadIdx.x & 31) == 0) sb[threadIdx.x >> 5] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) best = sb[w] > best ? sb[w] : best;
        if (best) atomicMax(pick + t, best);
    }
}

void fmc_sample_rows(const float *x, int T, int n, const unsigned long long *am, const fmc_sample_args *a,
                     const fmc_sample_scratch *scr, int cap, int *count, unsigned long long *mass,
                     fmc_candidate *out, unsigned long long *pick, cudaStream_t s) {
    const dim3 grid((n + BLOCK_TOKENS - 1) / BLOCK_TOKENS, T);
    if (a->top_k == 0 && !(a->top_p < 1)) {
        cudaMemsetAsync(pick, 0, (size_t)T * sizeof *pick, s);
        k_sample_draw<<<grid, 256, 0, s>>>(x, n, am, *a, pick);
        return;
    }
    cudaMemsetAsync(count, 0, (size_t)T * sizeof *count, s);
    cudaMemsetAsync(scr->tier_n, 0, (size_t)T * FMC_SAMPLE_TIERS * sizeof *scr->tier_n, s);
    cudaMemsetAsync(scr->tier_w, 0, (size_t)T * FMC_SAMPLE_TIERS * sizeof *scr->tier_w, s);
    k_sample_stats<<<grid, 256, 0, s>>>(x, n, am, *a, *scr);
    k_sample_gather<<<grid, 256, 0, s>>>(x, n, am, *a, *scr, cap, count, mass, out);
}
