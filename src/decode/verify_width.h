/* verify_width.h: the adaptive verify width. Each round verifies K drafts in a block of K + 1 rows; more
 * drafts can yield more tokens but cost more to verify (a CPU verify block is compute bound, a GPU one is
 * not, and the costs differ by machine). The loop therefore learns, per session, how likely each draft slot
 * is to be accepted and what a verify block of each size costs, and picks the K with the most expected tokens
 * per millisecond of draft + verify: tokens(K) = 1 + sum_{i=1..K} P(slots 1..i all accepted),   K* = argmax
 * tokens(K) / (draft(K) + verify(K+1)). Slot i's acceptance is estimated from the rounds that reached it
 * (decayed counts, shrunk towards slot i-1's estimate, so slots never tested inherit their neighbour's);
 * verify costs are measured per block size and interpolated linearly, within the backend's row granule and
 * across granules (a GPU's verify block costs about the same for 9 rows as for 16, its tiles being 8 rows,
 * and jumps at 17: a line through 8 and 17 would never try 16); the draft cost is a line in K (a CPU
 * drafter skips the lm_head of the slots not verified, a GPU one drafts the whole block): its level a fast
 * running average of every round, its slope fitted over the last ~10 rounds, so that one slow draft (a graph
 * capture, a page fault) is forgotten whichever K comes next. Until two block sizes have been timed, the
 * caller's rule decides (see choose). */
#ifndef FM_DECODE_VERIFY_WIDTH_H
#define FM_DECODE_VERIFY_WIDTH_H

#include "flashmap.h"

typedef struct {
    double tested[FM_MAX_BLOCK + 1];  /* [i]: decayed count of rounds whose slot i was compared (1-based) */
    double passed[FM_MAX_BLOCK + 1];  /* [i]: ... of which slot i was accepted */
    double cost_ms[FM_MAX_BLOCK + 2]; /* [T]: running verify time of a T-row block; NaN until timed */
    /* Draft (+ context) time of a round: running averages of the time and of K (the level), and decayed
     * sums of 1, K, K^2, time and K * time (the slope's least-squares fit). */
    double draft_ms, draft_k;
    double s1, sk, skk, sy, sky;
    /* Block sizes whose costs go together: sizes k g + 1 .. (k + 1) g form one class (fm_decode_backend's
     * row_granule; 1 by default: every size its own). */
    int granule;
} fm_width_model;

/* Forgets everything; the granule becomes 1. */
void fm_width_reset(fm_width_model *m);
/* Sets the row granule (values below 1 mean 1); the timings are kept. */
void fm_width_set_granule(fm_width_model *m, int granule);
/* A round verified K drafts and accepted `accepted` of them in draft_ms + verify_ms (draft_ms < 0: not a
 * representative draft time, e.g. it included catch-up work). */
void fm_width_observe_round(fm_width_model *m, int K, int accepted, double draft_ms, double verify_ms);
/* A plain step: a one-row block. */
void fm_width_observe_step(fm_width_model *m, double step_ms);

/* P(slot i accepted | slots 1..i-1 accepted), i >= 1. */
double fm_width_slot_rate(const fm_width_model *m, int i);
/* Expected tokens of a round verifying K drafts. */
double fm_width_expected_tokens(const fm_width_model *m, int K);
/* Verify time of a T-row block from the timed sizes: in T's own class, the line through its nearest two
 * timed sizes (between them, else the nearest two's line outside), or the cost of its one timed size; else a
 * line in the class index through the nearest two classes with timed sizes (each taken at its timed size
 * facing T); with only one such class, the line through the nearest two timed sizes. NaN when fewer than two
 * sizes were timed. With a granule of 1 all three are the line through the nearest two timed sizes (between
 * them, else the nearest two's line outside). */
double fm_width_cost_ms(const fm_width_model *m, int T);
/* Draft time of a round asking for K drafts: the level plus the fitted slope (never negative) times K's
 * distance from the average K; NaN before any round was timed. */
double fm_width_draft_ms(const fm_width_model *m, int K);
/* The best K in 1..k_max. Until two block sizes and a draft have been timed: `otherwise`, or half of it when
 * `otherwise`'s block is the one size timed (so that a second size gets timed). */
int fm_width_choose(const fm_width_model *m, int k_max, int otherwise);

#endif
