/* bench_e2e.h: end-to-end decoding through the public API (fm_session_generate): plain greedy decoding, and
 * speculative decoding at SIMULATED acceptance (the drafter runs in full, its proposals are replaced by the
 * plain run's tokens for k ~ Binomial(block, mean/block) drafts per round). Every speculative output is
 * compared with the plain output of the same run. */
#ifndef FM_TOOLS_BENCH_E2E_H
#define FM_TOOLS_BENCH_E2E_H

#include <stddef.h>
#include <stdint.h>

#include "flashmap.h"

typedef struct {
    double tok_s;         /* new tokens after the first (which comes from the prefill) / decode wall time */
    double mean_accepted; /* drafts accepted per round, as measured */
    int rounds, plain_steps, n_generated;
    int identical; /* 1 when the tokens equal the plain reference */
} bench_e2e_result;

typedef struct bench_e2e bench_e2e;

int bench_e2e_create(fm_engine *e, const int32_t *prompt, int n_prompt, int n_gen, int verify, int fallback,
                     bench_e2e **out, char *err, size_t errlen);
void bench_e2e_free(bench_e2e *b);
/* Plain decoding. The first call's tokens become the reference; later calls are checked against it. */
int bench_e2e_plain(bench_e2e *b, bench_e2e_result *r, char *err, size_t errlen);
/* Sampling for every later call (greedy until set); set it before the first plain call, whose tokens the
 * simulated runs replay. */
void bench_e2e_set_sampling(bench_e2e *b, const fm_sampling *s);
/* Speculative decoding at simulated mean acceptance sim_mean (needs a drafter and a prior plain call). */
int bench_e2e_simulated(bench_e2e *b, double sim_mean, uint64_t seed, bench_e2e_result *r, char *err,
                        size_t errlen);

#endif
