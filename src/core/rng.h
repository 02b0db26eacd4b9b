/* rng.h: splitmix64, the small counter-based generator used wherever the engine needs reproducible random
 * numbers (synthetic weights, simulated acceptance, benchmark prompts): same seed, same stream, on any
 * machine. */
#ifndef FM_CORE_RNG_H
#define FM_CORE_RNG_H

#include <stdint.h>

static inline uint64_t fm_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 53 random bits. */
static inline double fm_rng_uniform(uint64_t *state) {
    return (double)(fm_splitmix64(state) >> 11) * 0x1.0p-53;
}

#endif
