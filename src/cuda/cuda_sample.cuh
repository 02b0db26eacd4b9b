/* cuda_sample.cuh: what the GPU does for sampling (decode/sampler.h): it never sends a whole row of 151,936
 * logits back, only each row's candidates, chosen by the settings:
 *   top-k      the top logit tiers that hold k tokens (a superset of the k largest and their ties);
 *   top-p      (no top-k) the top logit tiers that hold top_p of the mass, and one tier more;
 *   neither    the draw itself starts here: the row's mass in fixed point, summed per 1024-id chunk, locates
 *              the chunk the row's uniform number falls in, and only that chunk comes back (the host walks
 * it). Masses are fixed point (w = exp((logit - max) / T) scaled by 2^44, rounded): integer sums do not
 * depend on the order atomics run in, so a row gives the same candidates in a step and in a verify block.
 * Tiers slice [max - range, max] into FMC_SAMPLE_TIERS equal parts; tokens below it are never candidates. */
#ifndef FM_CUDA_SAMPLE_CUH
#define FM_CUDA_SAMPLE_CUH

#include <cuda_runtime.h>
#include <stdint.h>

enum { FMC_SAMPLE_TIERS = 64, FMC_SAMPLE_CHUNK = 1024 };
#define FMC_SAMPLE_SCALE 17592186044416.0 /* 2^44: fixed-point masses */

typedef struct {
    float logit;
    int32_t id;
    float w; /* exp((logit - max) / T) as the GPU computed it (the chunk walk's masses) */
} fmc_candidate;

typedef struct {
    float range, inv_t; /* candidates: within range of the row's max; 1 / temperature */
    int top_k;          /* > 0: top-k tiers */
    float top_p;        /* < 1 (no top-k): top-p tiers; else the chunk of the draw */
    const double *u;    /* [T] the rows' uniform numbers (the chunk of the draw) */
} fmc_sample_args;

/* Scratch the launcher needs for T rows of n tokens, zeroed by fmc_sample_gather itself. */
typedef struct {
    int *tier_n;                          /* [T][FMC_SAMPLE_TIERS] */
    unsigned long long *tier_w, *chunk_w; /* [T][FMC_SAMPLE_TIERS], [T][ceil(n / FMC_SAMPLE_CHUNK)] */
} fmc_sample_scratch;

/* The candidates of T rows of x ([T][n], am: fmc_argmax's result for them) into out[t][0..cap), in any
 * order; count[t] = how many there were (may exceed cap: then read the row whole); aux[t] = {the row's
 * fixed-point mass, the mass of the chunks before the one returned (chunk mode)}. */
void fmc_sample_gather(const float *x, int T, int n, const unsigned long long *am, const fmc_sample_args *a,
                       const fmc_sample_scratch *scr, int cap, int *count, fmc_candidate *out,
                       unsigned long long *aux, cudaStream_t s);

/* The fixed-point mass of one weight, as the kernels compute it (host and device). */
static inline __host__ __device__ unsigned long long fmc_sample_fixed(float w) {
#ifdef __CUDA_ARCH__
    return __double2ull_rn((double)w * FMC_SAMPLE_SCALE);
#else
    return (unsigned long long)llrint((double)w * FMC_SAMPLE_SCALE);
#endif
}

/* The draw's target in fixed point: the same expression on both sides. */
static inline __host__ __device__ unsigned long long fmc_sample_target(double u, unsigned long long total) {
    const unsigned long long t = (unsigned long long)(u * (double)total);
    return t < total ? t : total - 1;
}

#endif
