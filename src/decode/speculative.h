/* speculative.h: lossless decoding of a Qwen3 target, plain or with the FlashMap drafter.
 *
 * A round: the drafter proposes `block` tokens after the anchor (the last token not yet in the target's KV
 * cache); the target verifies [anchor, d1..dK] in one forward and returns the token of every row (its argmax,
 * or its seeded draw when sampling: sampler.h); the longest prefix with d_i == row_{i-1} is accepted, plus
 * the target's own token at the first mismatch, so every round yields at least one token and the output is
 * exactly the target's own decoding, greedy or sampled. The KV cache
 * is rewound past the rejected rows, and the drafter's context at pos .. pos+accepted is overwritten with the
 * target's features of the accepted rows. */
#ifndef FM_DECODE_SPECULATIVE_H
#define FM_DECODE_SPECULATIVE_H

#include "flashmap.h"
#include "decode/decode_backend.h"
#include "decode/verify_width.h"

/* The loop's state kept across the calls of one session: the running averages of the adaptive verify width
 * and of the fallback rule (ms; NaN until measured). */
typedef struct {
    double ema_accept, ema_tokens, round_ms, step_ms, verify_ms;
    int n_rounds;
    int plain_stretch; /* plain steps the next fallback takes: doubles while probing rounds keep losing */
    fm_width_model width;
} fm_decode_averages;

void fm_decode_averages_reset(fm_decode_averages *a);

/* Prefills ids at the backend's current position (in chunks of max_eval, each chunk's features committed to
 * the drafter), then decodes per p. The first generated token comes from the prefill's last row. The last
 * generated token is not fed to the target (the caller prefills it before the next input).
 * before[0..n_before) are the tokens already in the cache (a session's earlier turns), which the repetition
 * penalty reads. */
int fm_decode_run(const fm_decode_backend *b, fm_decode_averages *avg, const int32_t *before, int n_before,
                  const int32_t *ids, int n_ids, const fm_generate_params *p,
                  int (*is_stop)(const void *ctx, int32_t id), const void *stop_ctx, int32_t **out,
                  int *n_out, fm_generate_stats *stats, char *err, size_t errlen);

#endif
