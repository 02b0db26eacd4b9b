/* bench_llama.h: runs llama.cpp's llama-bench as a subprocess (-o json) on the same GGUF with the same thread
 * count, and collects its prompt-processing (pp) and text-generation (tg) samples in tok/s. */
#ifndef FM_TOOLS_BENCH_LLAMA_H
#define FM_TOOLS_BENCH_LLAMA_H

#include <stddef.h>

#include "bench_util.h"

#define BENCH_LLAMA_MAX_PP 8

typedef struct {
    int n_prompt;     /* batch size of the prompt test (pp512: 512; pp8: a block of 8 tokens) */
    bench_samples ts; /* tok/s, one per llama-bench repetition */
} bench_llama_pp;

typedef struct {
    bench_llama_pp pp[BENCH_LLAMA_MAX_PP];
    int n_pp;
    bench_samples tg_ts; /* decode tok/s */
    char build_commit[64];
    char cpu_info[128];
    int runs; /* successful llama-bench invocations */
} bench_llama;

/* One llama-bench invocation: -m model -t threads -p prompts -n n_gen -r reps -o json, prompts a list such as
 * "512,8,17". Appends its samples; on failure writes one line (exit status and the last line of llama-bench's
 * stderr) into err and returns -1. */
int bench_llama_run(bench_llama *b, const char *llama_bench, const char *model, int threads,
                    const char *prompts, int n_gen, int reps, char *err, size_t errlen);
/* The samples of the pp test with that prompt size; NULL when none was measured. */
const bench_samples *bench_llama_pp_samples(const bench_llama *b, int n_prompt);

#endif
