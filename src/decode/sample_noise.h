/* sample_noise.h: the random numbers of a sampled draw, shared by the C sampler and the CUDA kernels so that
 * both compute them bit for bit. A draw is a Gumbel-max: the kept token with the largest
 * (logit - max) / T + G, where G = -log(-log(u)) and u is uniform in (0, 1), made from (seed, position, id)
 * alone. That picks each kept token with its softmax probability, needs no sort and no sum, and couples
 * draws: a drafter that draws its slot with the same numbers draws what the target will, wherever the two
 * distributions agree (acceptance near 1 - total variation, where one fixed draft is accepted with the
 * target's probability of it). */
#ifndef FM_DECODE_SAMPLE_NOISE_H
#define FM_DECODE_SAMPLE_NOISE_H

#include <math.h>
#include <stdint.h>

#include "core/rng.h"

#define FM_SAMPLE_HD FM_RNG_HD

/* The key of the draw of the token after position pos. */
static inline FM_SAMPLE_HD uint64_t fm_sample_row_key(uint64_t seed, int pos) {
    return fm_splitmix64_mix(seed ^ ((uint64_t)(uint32_t)pos * 0xd1b54a32d192ed03ull));
}

/* A token's score in the draw with that key (the largest score is drawn; ties to the lower id). */
static inline FM_SAMPLE_HD float fm_sample_score(float logit, float max, double temperature, uint64_t key,
                                                 int32_t id) {
    const uint64_t z = fm_splitmix64_mix(key ^ ((uint64_t)(uint32_t)id * 0x8cb92ba72f3d8dd7ull));
    const double u = ((double)(z >> 11) + 0.5) * 0x1.0p-53;
    return (float)(((double)logit - max) / temperature - log(-log(u)));
}

#endif
