/* rng.h: splitmix64, the small counter-based generator used wherever the engine needs reproducible random
 * numbers (synthetic weights, simulated acceptance, benchmark prompts): same seed, same stream, on any
 * machine. */
#ifndef FM_CORE_RNG_H
#define FM_CORE_RNG_H

#include <stdint.h>

#ifdef __CUDACC__
#define FM_RNG_HD __host__ __device__
#else
#define FM_RNG_HD
#endif

/* The output of a splitmix64 stream whose state is z before the step (a stateless hash of z; the CUDA
 * sampling kernels use it too). */
static inline FM_RNG_HD uint64_t fm_splitmix64_mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t fm_splitmix64(uint64_t *state) {
    const uint64_t r = fm_splitmix64_mix(*state);
    *state += 0x9e3779b97f4a7c15ull;
    return r;
}

/* Uniform in [0, 1) with 53 random bits. */
static inline double fm_rng_uniform(uint64_t *state) {
    return (double)(fm_splitmix64(state) >> 11) * 0x1.0p-53;
}

#endif
