/* cuda_sample.cu: each row's sampling candidates (cuda_sample.cuh says which). Two launches over the rows:
 * statistics (tier counts and masses, chunk masses), then the gather, whose blocks each derive the same
 * cut from those integers. */
#include <math.h>

#include "cuda/cuda_sample.cuh"

enum { BLOCK_TOKENS = 4096, CHUNKS_PER_BLOCK = BLOCK_TOKENS / FMC_SAMPLE_CHUNK };

/* The row's largest logit from fmc_argmax's packed (key << 32 | ~index). */
__device__ __forceinline__ float packed_max(unsigned long long am) {
    const uint32_t key = (uint32_t)(am >> 32);
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

/* A token's tier (0: the top slice), or FMC_SAMPLE_TIERS below the range; both kernels call this. */
__device__ __forceinline__ int tier_of(float v, float m, float range) {
    if (!(v >= m - range)) return FMC_SAMPLE_TIERS;
    const int t = (int)((m - v) / range * FMC_SAMPLE_TIERS);
    return t < FMC_SAMPLE_TIERS ? t : FMC_SAMPLE_TIERS - 1;
}

__device__ __forceinline__ float weight(float v, float m, float inv_t) {
    return expf((v - m) * inv_t);
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
__global__ void k_sample_stats(const float *x, int n, const unsigned long long *am, float range, float inv_t,
                               fmc_sample_scratch scr) {
    __shared__ int cnt[FMC_SAMPLE_TIERS];
    __shared__ unsigned long long mass[FMC_SAMPLE_TIERS], sub[CHUNKS_PER_BLOCK];
    const int t = blockIdx.y, c0 = blockIdx.x * BLOCK_TOKENS, c1 = min(n, c0 + BLOCK_TOKENS);
    const int n_chunks = (n + FMC_SAMPLE_CHUNK - 1) / FMC_SAMPLE_CHUNK, lane = threadIdx.x & 31;
    for (int j = threadIdx.x; j < FMC_SAMPLE_TIERS; j += blockDim.x) cnt[j] = 0, mass[j] = 0;
    if (threadIdx.x < CHUNKS_PER_BLOCK) sub[threadIdx.x] = 0;
    __syncthreads();
    const float m = packed_max(am[t]);
    const float *r = x + (size_t)t * n;
    for (int i0 = c0; i0 < c1; i0 += blockDim.x) {
        const int i = i0 + threadIdx.x;
        const float v = i < c1 ? r[i] : -INFINITY;
        const int tier = tier_of(v, m, range);
        const unsigned long long q = tier < FMC_SAMPLE_TIERS ? fmc_sample_fixed(weight(v, m, inv_t)) : 0;
        unsigned todo = __ballot_sync(0xffffffffu, tier < FMC_SAMPLE_TIERS);
        if (!todo) continue;
        /* The warp's 32 ids lie in one chunk (256-token steps from a multiple of 1024). */
        const unsigned long long chunk_q = warp_sum(q, true);
        if (lane == 0) atomicAdd(&sub[(i0 - c0 + (int)(threadIdx.x & ~31u)) / FMC_SAMPLE_CHUNK], chunk_q);
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
    const int chunk = blockIdx.x * CHUNKS_PER_BLOCK + (int)threadIdx.x;
    if (threadIdx.x < CHUNKS_PER_BLOCK && chunk < n_chunks)
        scr.chunk_w[(size_t)t * n_chunks + chunk] = sub[threadIdx.x];
}

/* grid (ceil(n / BLOCK_TOKENS), T): every block of a row derives the same cut, then appends its tokens. */
__global__ void k_sample_gather(const float *x, int n, const unsigned long long *am, fmc_sample_args a,
                                fmc_sample_scratch scr, int cap, int *count, fmc_candidate *out,
                                unsigned long long *aux) {
    const int t = blockIdx.y, c0 = blockIdx.x * BLOCK_TOKENS, c1 = min(n, c0 + BLOCK_TOKENS);
    const int n_chunks = (n + FMC_SAMPLE_CHUNK - 1) / FMC_SAMPLE_CHUNK;
    const int *tn = scr.tier_n + t * FMC_SAMPLE_TIERS;
    const unsigned long long *tw = scr.tier_w + t * FMC_SAMPLE_TIERS,
                             *cw = scr.chunk_w + (size_t)t * n_chunks;
    unsigned long long total = 0, before = 0;
    for (int j = 0; j < FMC_SAMPLE_TIERS; j++) total += tw[j];
    int last_tier = FMC_SAMPLE_TIERS - 1, chunk = -1;
    if (a.top_k > 0) {
        for (int j = 0, sum = 0; j < FMC_SAMPLE_TIERS; j++)
            if ((sum += tn[j]) >= a.top_k) {
                last_tier = j;
                break;
            }
    } else if (a.top_p < 1) {
        const unsigned long long limit = (unsigned long long)((double)a.top_p * (double)total);
        unsigned long long sum = 0;
        for (int j = 0; j < FMC_SAMPLE_TIERS; j++)
            if ((sum += tw[j]) >= limit) {
                last_tier = min(j + 1, FMC_SAMPLE_TIERS - 1); /* one tier more: the host's sums round too */
                break;
            }
    } else {
        const unsigned long long target = fmc_sample_target(a.u[t], total);
        for (chunk = 0; chunk < n_chunks - 1 && before + cw[chunk] <= target; chunk++) before += cw[chunk];
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) aux[2 * t] = total, aux[2 * t + 1] = before;
    const int i_lo = chunk < 0 ? c0 : max(c0, chunk * FMC_SAMPLE_CHUNK),
              i_hi = chunk < 0 ? c1 : min(c1, (chunk + 1) * FMC_SAMPLE_CHUNK);
    if (i_lo >= i_hi) return;
    const float m = packed_max(am[t]);
    const float *r = x + (size_t)t * n;
    const int lane = threadIdx.x & 31;
    for (int i0 = i_lo; i0 < i_hi; i0 += blockDim.x) {
        const int i = i0 + threadIdx.x;
        const bool take = i < i_hi && tier_of(r[i], m, a.range) <= last_tier;
        const unsigned mask = __ballot_sync(0xffffffffu, take);
        if (!mask) continue;
        int base = 0;
        if (lane == 0) base = atomicAdd(count + t, __popc(mask)); /* one atomic per warp */
        base = __shfl_sync(0xffffffffu, base, 0) + __popc(mask & ((1u << lane) - 1));
        if (take && base < cap)
            out[(size_t)t * cap + base] = fmc_candidate{r[i], i, weight(r[i], m, a.inv_t)};
    }
}

void fmc_sample_gather(const float *x, int T, int n, const unsigned long long *am, const fmc_sample_args *a,
                       const fmc_sample_scratch *scr, int cap, int *count, fmc_candidate *out,
                       unsigned long long *aux, cudaStream_t s) {
    const dim3 grid((n + BLOCK_TOKENS - 1) / BLOCK_TOKENS, T);
    cudaMemsetAsync(count, 0, (size_t)T * sizeof *count, s);
    cudaMemsetAsync(scr->tier_n, 0, (size_t)T * FMC_SAMPLE_TIERS * sizeof *scr->tier_n, s);
    cudaMemsetAsync(scr->tier_w, 0, (size_t)T * FMC_SAMPLE_TIERS * sizeof *scr->tier_w, s);
    k_sample_stats<<<grid, 256, 0, s>>>(x, n, am, a->range, a->inv_t, *scr);
    k_sample_gather<<<grid, 256, 0, s>>>(x, n, am, *a, *scr, cap, count, out, aux);
}
