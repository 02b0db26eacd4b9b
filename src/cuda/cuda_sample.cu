/* cuda_sample.cu: each row's sampling candidates or draw (cuda_sample.cuh says which). Candidates take two
 * launches over the rows: tier statistics, then the gather, whose blocks each derive the same cut from
 * those integers; a draw takes one. */
#include <math.h>

#include "cuda/cuda_device.cuh"
#include "cuda/cuda_sample.cuh"
#include "decode/sample_noise.h"

enum { BLOCK_TOKENS = 4096 };

/* The first of w[0..n) at which the running sum, from *before, reaches limit (n - 1 if none); *before ends as
 * the sum ahead of it. */
__device__ __forceinline__ int crossing(const unsigned long long *w, int n, unsigned long long limit,
                                        unsigned long long *before) {
    for (int j = 0; j < n; j++) {
        if (*before + w[j] >= limit) return j;
        *before += w[j];
    }
    return n - 1;
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
    const float m = argmax_value(am[t]), inv_t = 1.0f / a.temperature;
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

/* grid (ceil(n / BLOCK_TOKENS), T): top-k's candidates; every block of a row derives the same last tier from
 * the counts, then appends its tokens. */
__global__ void k_sample_gather(const float *x, int n, const unsigned long long *am, fmc_sample_args a,
                                fmc_sample_scratch scr, int cap, int *count, fmc_candidate *out) {
    const int t = blockIdx.y, c0 = blockIdx.x * BLOCK_TOKENS, c1 = min(n, c0 + BLOCK_TOKENS);
    const int *tn = scr.tier_n + t * FMC_SAMPLE_TIERS;
    int last_tier = FMC_SAMPLE_TIERS - 1;
    for (int j = 0, sum = 0; j < FMC_SAMPLE_TIERS; j++)
        if ((sum += tn[j]) >= a.top_k) {
            last_tier = j;
            break;
        }
    const float m = argmax_value(am[t]);
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

enum { CUT_SUBTIERS = 256, CUT_MAX = 4096, CUT_THREADS = 1024, UNROLL = 8 };

/* fn(v, i) for every logit of a row: one block reads it whole, UNROLL loads in flight a thread (one at a
 * time, the scan is a chain of latencies). */
template <typename F> __device__ __forceinline__ void scan_row(const float *r, int n, F fn) {
    for (int i0 = threadIdx.x; i0 < n; i0 += CUT_THREADS * UNROLL) {
        float v[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; k++)
            v[k] = i0 + k * CUT_THREADS < n ? r[i0 + k * CUT_THREADS] : -INFINITY;
#pragma unroll
        for (int k = 0; k < UNROLL; k++) fn(v[k], i0 + k * CUT_THREADS);
    }
}

/* Larger logit first, then the lower id: the order top-p keeps tokens in (decode/sampler.c). */
__device__ __forceinline__ bool before_in_order(fmc_candidate x, fmc_candidate y) {
    return x.logit > y.logit || (x.logit == y.logit && x.id < y.id);
}

/* grid (T), CUT_THREADS: top-p's cut of each row, found where the host finds it: the tokens by descending
 * logit (ties by id) while the mass before each is under top_p of the row's. The tier statistics give the
 * tier the cut falls in; 256 sub-tiers of it, the sub-tier; its tokens (at most CUT_MAX) are sorted in
 * shared memory and walked. Writes the last kept token (cut[t]) or, when the sub-tier holds more, count[t]
 * = -1 (the host reads the row whole). */
__global__ void __launch_bounds__(CUT_THREADS)
    k_sample_cut(const float *x, int n, const unsigned long long *am, fmc_sample_args a,
                 fmc_sample_scratch scr, int *count, fmc_candidate *cut) {
    __shared__ int sub_n[CUT_SUBTIERS], n_list;
    __shared__ unsigned long long sub_w[CUT_SUBTIERS];
    __shared__ fmc_candidate list[CUT_MAX];
    __shared__ int sub_cut;
    __shared__ unsigned long long before_sub;
    const int t = blockIdx.x;
    const float m = argmax_value(am[t]), inv_t = 1.0f / a.temperature;
    const unsigned long long *tw = scr.tier_w + t * FMC_SAMPLE_TIERS;
    unsigned long long total = 0, before = 0;
    for (int j = 0; j < FMC_SAMPLE_TIERS; j++) total += tw[j];
    const unsigned long long limit = (unsigned long long)((double)a.top_p * (double)total);
    const int tier = crossing(tw, FMC_SAMPLE_TIERS, limit, &before);
    for (int j = threadIdx.x; j < CUT_SUBTIERS; j += blockDim.x) sub_n[j] = 0, sub_w[j] = 0;
    if (threadIdx.x == 0) n_list = 0;
    __syncthreads();
    const float *r = x + (size_t)t * n;
    /* Sub-tier of a token of the crossing tier (monotone in the logit, as the tier is). */
    auto sub_of = [&](float v) {
        const int s = (int)(((m - v) / a.range * FMC_SAMPLE_TIERS - tier) * CUT_SUBTIERS);
        return s < 0 ? 0 : s < CUT_SUBTIERS ? s : CUT_SUBTIERS - 1;
    };
    auto weight = [&](float v) { return __double2ull_rn((double)expf((v - m) * inv_t) * FMC_SAMPLE_SCALE); };
    scan_row(r, n, [&](float v, int) {
        if (tier_of(v, m, a.range) != tier) return;
        const int s = sub_of(v);
        atomicAdd(&sub_n[s], 1);
        atomicAdd(&sub_w[s], weight(v));
    });
    __syncthreads();
    if (threadIdx.x == 0) sub_cut = crossing(sub_w, CUT_SUBTIERS, limit, &before), before_sub = before;
    __syncthreads();
    const int s_cut = sub_cut;
    if (sub_n[s_cut] > CUT_MAX) {
        if (threadIdx.x == 0) count[t] = -1;
        return;
    }
    scan_row(r, n, [&](float v, int i) {
        if (tier_of(v, m, a.range) == tier && sub_of(v) == s_cut)
            list[atomicAdd(&n_list, 1)] = fmc_candidate{v, i};
    });
    __syncthreads();
    /* Bitonic sort of the list, padded to a power of two with entries that sort last. */
    const int len = n_list;
    int p2 = 1;
    while (p2 < len) p2 <<= 1;
    for (int i = len + threadIdx.x; i < p2; i += blockDim.x) list[i] = fmc_candidate{-INFINITY, 0x7fffffff};
    __syncthreads();
    for (int k = 2; k <= p2; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < p2; i += blockDim.x) {
                const int l = i ^ j;
                if (l > i) {
                    const bool up = (i & k) == 0;
                    const fmc_candidate x0 = list[i], x1 = list[l];
                    if (before_in_order(x1, x0) == up) list[i] = x1, list[l] = x0;
                }
            }
            __syncthreads();
        }
    if (threadIdx.x == 0) {
        unsigned long long run = before_sub;
        fmc_candidate last = len ? list[len - 1] : fmc_candidate{m, 0};
        for (int i = 0; i < len; i++)
            if (run + weight(list[i].logit) >= limit || i == len - 1) {
                last = list[i];
                break;
            } else {
                run += weight(list[i].logit);
            }
        cut[t] = last;
    }
}

/* grid (ceil(n / BLOCK_TOKENS), T): the Gumbel-max of each row, as the host's sampler computes it. */
__global__ void k_sample_draw(const float *x, int n, const unsigned long long *am, fmc_sample_args a,
                              const int *count, const fmc_candidate *cut, unsigned long long *pick) {
    const int t = blockIdx.y, c0 = blockIdx.x * BLOCK_TOKENS, c1 = min(n, c0 + BLOCK_TOKENS);
    const float m = argmax_value(am[t]);
    const uint64_t key = fm_sample_row_key(a.seed, a.pos0 + t);
    const float *r = x + (size_t)t * n;
    /* With top-p: the tokens up to its cut (by descending logit, ties by id); none when the host takes over.
     */
    const bool top_p = cut != NULL;
    if (top_p && count[t] < 0) return;
    const fmc_candidate last = top_p ? cut[t] : fmc_candidate{-INFINITY, 0x7fffffff};
    unsigned long long best = 0;
    for (int i = c0 + threadIdx.x; i < c1; i += blockDim.x) {
        const float v = r[i];
        if (!(((double)v - m) / a.temperature >= a.floor_d)) continue;
        if (v < last.logit || (v == last.logit && i > last.id)) continue;
        const unsigned long long p = argmax_pack(fm_sample_score(v, m, a.temperature, key, i), i);
        best = p > best ? p : best;
    }
    block_argmax_to(best, pick + t);
}

/* fm_penalty_apply's arithmetic, each operation rounded as the CPU's. */
__global__ void k_penalize(float *logits, int n, const int *offsets, const fm_penalty *p) {
    const int t = blockIdx.x;
    for (int i = offsets[t] + threadIdx.x; i < offsets[t + 1]; i += blockDim.x) {
        float *v = logits + (size_t)t * n + p[i].id;
        const float r = *v > 0 ? __fdiv_rn(*v, p[i].scale) : __fmul_rn(*v, p[i].scale);
        *v = __fsub_rn(r, p[i].delta);
    }
}

void fmc_penalize(float *logits, int T, int n, const int *offsets, const fm_penalty *p, cudaStream_t s) {
    k_penalize<<<T, 256, 0, s>>>(logits, n, offsets, p);
}

void fmc_sample_rows(const float *x, int T, int n, const unsigned long long *am, const fmc_sample_args *a,
                     const fmc_sample_scratch *scr, int cap, int *count, fmc_candidate *out,
                     unsigned long long *pick, cudaStream_t s) {
    const dim3 grid((n + BLOCK_TOKENS - 1) / BLOCK_TOKENS, T);
    cudaMemsetAsync(pick, 0, (size_t)T * sizeof *pick, s);
    cudaMemsetAsync(count, 0, (size_t)T * sizeof *count, s);
    if (a->top_k == 0 && !(a->top_p < 1)) {
        k_sample_draw<<<grid, 256, 0, s>>>(x, n, am, *a, count, NULL, pick);
        return;
    }
    cudaMemsetAsync(scr->tier_n, 0, (size_t)T * FMC_SAMPLE_TIERS * sizeof *scr->tier_n, s);
    cudaMemsetAsync(scr->tier_w, 0, (size_t)T * FMC_SAMPLE_TIERS * sizeof *scr->tier_w, s);
    k_sample_stats<<<grid, 256, 0, s>>>(x, n, am, *a, *scr);
    if (a->top_k == 0) {
        k_sample_cut<<<T, CUT_THREADS, 0, s>>>(x, n, am, *a, *scr, count, scr->cut);
        k_sample_draw<<<grid, 256, 0, s>>>(x, n, am, *a, count, scr->cut, pick);
        return;
    }
    k_sample_gather<<<grid, 256, 0, s>>>(x, n, am, *a, *scr, cap, count, out);
}
