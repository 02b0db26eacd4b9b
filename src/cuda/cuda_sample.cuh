/* cuda_sample.cuh: what the GPU does for sampling (decode/sampler.h): it never sends a whole row of 151,936
 * logits back, only each row's candidates, or its draw: *   top-k      the top logit tiers that hold k tokens
 * (a superset of the k largest and their ties), and the host filters and draws; top-p      (no top-k) the
 * draw itself, over the tokens up to top-p's cut, which one block a row finds in the tier the cut falls in (a
 * row whose cut sub-tier holds more than 4096 tokens: count -1, and the host reads it whole); neither    the
 * draw itself: the Gumbel-max of decode/sample_noise.h over the row's tokens within range (narrowed by
 * min-p), the same scores the host would compute, so only the token comes back. Tier masses are fixed point
 * (w = exp((logit - max) / T) x 2^44, rounded): integer sums do not depend on the order atomics run in, so a
 * row gives the same candidates in a step and in a verify block. Tiers slice [max - range, max] into
 * FMC_SAMPLE_TIERS equal parts; tokens below it are never candidates. */
#ifndef FM_CUDA_SAMPLE_CUH
#define FM_CUDA_SAMPLE_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "decode/sampler.h"

enum { FMC_SAMPLE_TIERS = 64 };
#define FMC_SAMPLE_SCALE 17592186044416.0 /* 2^44: fixed-point masses */

typedef struct {
    float logit;
    int32_t id;
} fmc_candidate;

typedef struct {
    float temperature;
    float range;    /* top-k / top-p candidates: tokens within range of the row's max */
    int top_k;      /* > 0: top-k tiers */
    float top_p;    /* < 1 (no top-k): top-p tiers; else the draw */
    double floor_d; /* the draw: tokens with (logit - max) / T >= floor_d (-30, or log min-p) */
    uint64_t seed;  /* the draw: row t's key is fm_sample_row_key(seed, pos0 + t) */
    int pos0;
} fmc_sample_args;

/* Scratch for T rows, zeroed by fmc_sample_rows itself. */
typedef struct {
    int *tier_n;                /* [T][FMC_SAMPLE_TIERS] */
    unsigned long long *tier_w; /* [T][FMC_SAMPLE_TIERS] */
    fmc_candidate *cut;         /* [T]: top-p's last kept token */
} fmc_sample_scratch;

/* Penalties (decode/sampler.h's fm_penalty_list): logits[t][p[i].id] -= p[i].delta for i in offsets[t] ..
 * offsets[t + 1] (ids distinct within a row). */
void fmc_penalize(float *logits, int T, int n, const int *offsets, const fm_penalty *p, cudaStream_t s);

/* For T rows of x ([T][n], am: fmc_argmax's result for them): with top-k, their candidates into
 * out[t][0..cap) in any order, count[t] = how many there were (may exceed cap: then read the row whole); else
 * the drawn token of row t, packed as fmc_argmax packs, into pick[t] (fmc_argmax_index decodes it), unless
 * count[t] == -1 (top-p: read the row whole). */
void fmc_sample_rows(const float *x, int T, int n, const unsigned long long *am, const fmc_sample_args *a,
                     const fmc_sample_scratch *scr, int cap, int *count, fmc_candidate *out,
                     unsigned long long *pick, cudaStream_t s);

#endif
