/* speculative.h: lossless greedy decoding of a Qwen3 target, plain or with the FlashMap drafter.
 *
 * A round: the drafter proposes `block` tokens after the anchor (the last token not yet in the target's KV
 * cache); the target verifies [anchor, d1..dK] in one forward and returns the argmax of every row; the longest
 * prefix with d_i == row_{i-1} is accepted, plus the target's own token at the first mismatch, so every round
 * yields at least one token and the output is exactly the target's greedy decoding. The KV cache is rewound past
 * the rejected rows, and the drafter's context at pos .. pos+accepted is overwritten with the target's features
 * of the accepted rows. */
#ifndef FM_DECODE_SPECULATIVE_H
#define FM_DECODE_SPECULATIVE_H

#include "flashmap.h"
#include "core/threadpool.h"
#include "drafter/flashmap_drafter.h"
#include "model/qwen3.h"

/* The state a decoding run works on; owned by an fm_session. */
typedef struct {
    const qwen3_model *model;
    qwen3_state *state;
    fm_drafter *drafter; /* NULL: plain decoding only */
    fm_pool *pool;
    int prefill_chunk;
    /* Feature rows not yet in the drafter's context (plain steps are batched into one context update). */
    float *pending;   /* [pending_cap][feature width] */
    int pending_rows, pending_start, pending_cap;
    int drafter_len; /* drafter context positions that hold the target's features */
    /* Timing averages of the fallback rule (ms), kept across calls of one session. */
    double ema_accept, ema_tokens, round_ms, step_ms, verify_ms;
    int n_rounds_total;
} fm_decoder;

/* Prefills ids at the current position (chunked, feeding the drafter's context), then decodes per p. The first
 * generated token comes from the prefill's last row. On return *next is the last generated token, which is not
 * yet in the KV cache (the next call prefills it first). */
int fm_decode_run(fm_decoder *d, const int32_t *ids, int n_ids, const fm_generate_params *p,
                  int (*is_stop)(const void *ctx, int32_t id), const void *stop_ctx, int32_t **out, int *n_out,
                  fm_generate_stats *stats, char *err, size_t errlen);

#endif
