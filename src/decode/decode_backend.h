/* decode_backend.h: what the decoding loop needs from a device: the target (eval T tokens at the current
 * position, rewind) and the drafter (its context from the target's features, a draft). The CPU implements it
 * in cpu_backend.c, CUDA in src/cuda/; the loop in speculative.c is the same for both.
 *
 * Features never pass through the loop: a backend keeps the captured rows of its last eval and hands them to
 * its drafter in commit_features, so on a GPU they stay on the GPU. */
#ifndef FM_DECODE_BACKEND_H
#define FM_DECODE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "flashmap.h"

typedef struct {
    void *ctx;
    int n_ctx; /* KV cache positions */
    int vocab;
    int max_eval;          /* most tokens one eval may take */
    int block;             /* drafter block size; 0 when there is no drafter */
    int drafter_ctx;       /* drafter context positions; a round needs pos + block + 1 <= drafter_ctx */
    int (*pos)(void *ctx); /* tokens held in the KV cache */
    /* Runs ids[0..n) at positions pos .. pos+n-1. argmax == NULL: fill the cache only; else all_rows ? the
     * token of every row : of the last row only, into argmax[]: the argmax, or the draw of set_sampling's
     * rule (sampler.h). */
    int (*eval)(void *ctx, const int32_t *ids, int n, int all_rows, int32_t *argmax, char *err,
                size_t errlen);
    /* How eval's rows choose their token from now on (fm_sampling_check'ed). NULL: greedy only. */
    int (*set_sampling)(void *ctx, const fm_sampling *s, char *err, size_t errlen);
    /* With penalties (fm_sampling_penalized): the tokens generated so far, valid until the next eval; row r
     * of an all-rows eval adds ids[1..r] (the drafts ahead of it) to them. NULL: no penalties. */
    void (*set_generated)(void *ctx, const int32_t *ids, int n);
    /* Drops positions >= pos. */
    void (*rewind)(void *ctx, int pos);
    /* The features of rows [0, n) of the last eval become the drafter's context at start .. start+n-1
     * (a backend may defer the work until the next draft). No-op without a drafter. */
    int (*commit_features)(void *ctx, int n, int start, char *err, size_t errlen);
    /* The drafter's first n_out (1..block) tokens after anchor (at context position pos) into out[]; a
     * backend may fill up to `block` entries (so out has room for block), the rest are never read. */
    int (*draft)(void *ctx, int32_t anchor, int pos, int n_out, int32_t *out, char *err, size_t errlen);
    /* Forgets everything (position 0, empty drafter context). */
    void (*reset)(void *ctx);
    /* Seconds on the backend's clock, which the loop's timing decisions read; NULL: the monotonic wall
     * clock (a test's fake backend passes virtual time here). */
    double (*clock)(void *ctx);
} fm_decode_backend;

#endif
