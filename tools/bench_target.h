/* bench_target.h: micro-timings of the engine's building blocks through the internal model and drafter APIs:
 * a plain step (T = 1), verify blocks (T = 8, 17; argmax of every row), one drafter forward, and a chunked
 * prefill. Every timing starts from the same state (a fixed prompt in the KV cache, the drafter's context
 * holding its features) and rewinds to it afterwards, so repetitions are interchangeable. */
#ifndef FM_TOOLS_BENCH_TARGET_H
#define FM_TOOLS_BENCH_TARGET_H

#include <stddef.h>
#include <stdint.h>

#include "flashmap.h"

typedef struct bench_target bench_target;

/* prompt[prefill_len]: token ids; the first prompt_len of them are the context every step/verify/draft sits
 * on (prompt_len <= prefill chunk). The state uses the engine's weights, threads and capture layers. */
int bench_target_create(fm_engine *e, const int32_t *prompt, int prompt_len, int prefill_len,
                        bench_target **out, char *err, size_t errlen);
void bench_target_free(bench_target *b);

/* One untimed step: every target weight is read once (keeps mmap'd weights hot before timing). */
int bench_target_warm(bench_target *b, char *err, size_t errlen);
/* One forward of T tokens (all-rows argmax) at position prompt_len, rewound afterwards: *ms. */
int bench_target_forward_ms(bench_target *b, int T, double *ms, char *err, size_t errlen);
/* One fm_drafter_draft for the anchor after the prompt (needs a drafter): *ms. */
int bench_target_draft_ms(bench_target *b, double *ms, char *err, size_t errlen);
/* Prefill of the whole prefill_len prompt from position 0 in the engine's chunks: *tok_s. */
int bench_target_prefill_tps(bench_target *b, double *tok_s, char *err, size_t errlen);

#endif
