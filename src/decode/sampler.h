/* sampler.h: the token a row of logits chooses under fm_sampling (flashmap.h): the argmax, or a draw whose
 * random numbers depend only on the seed, the row's position and the token (sample_noise.h). Both backends
 * call it on rows that are the same bits whether a plain step or a verify block computed them, so a round's
 * rows choose what plain steps would have chosen, and speculative output stays plain output. The drafters
 * draw their slots the same way (coupled drafts).
 *
 * A draw works on candidates: (logit, id) pairs holding at least every token within FM_SAMPLE_RANGE x
 * temperature of the row's largest logit (a backend may gather them on its own device); the rest are never
 * drawn (each is less likely than e^-30 times the most likely token). */
#ifndef FM_DECODE_SAMPLER_H
#define FM_DECODE_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "decode/sample_noise.h"
#include "flashmap.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FM_SAMPLE_RANGE 30.0f

typedef struct {
    float logit;
    int32_t id;
    double w; /* scratch: the candidate's unnormalised probability */
} fm_candidate;

static inline int fm_sampling_greedy(const fm_sampling *s) {
    return !s || !(s->temperature > 0);
}

/* top_p 0 (a zeroed struct) and 1 both mean no limit. */
static inline int fm_sampling_top_p_on(const fm_sampling *s) {
    return s->top_p > 0 && s->top_p < 1;
}

static inline int fm_sampling_repeats(const fm_sampling *s) {
    return s && s->repetition_penalty != 0 && s->repetition_penalty != 1;
}

static inline int fm_sampling_penalized(const fm_sampling *s) {
    return s && (s->presence_penalty != 0 || s->frequency_penalty != 0 || fm_sampling_repeats(s));
}

/* What a token that appeared c > 0 times loses (one function for every backend: the same bits). */
static inline float fm_penalty_delta(const fm_sampling *s, int c) {
    return (float)((double)s->presence_penalty + (double)s->frequency_penalty * c);
}

/* A row's penalties. Its history: seq[0..n_seq), the sequence before it (whose last n_gen tokens were
 * generated), then extra[0..n_extra) (a verify block's drafts ahead of the row, generated too). Each distinct
 * token that a penalty touches, once: scale = repetition_penalty if it is in the repetition window (the
 * history's last repeat_last_n tokens, or all of it), else 1; delta = what presence and frequency take for
 * its count among the generated tokens, else 0. Room: n_seq + n_extra entries. counts: vocab zeroed ints,
 * left zeroed. Every backend builds its penalties here and applies them with fm_penalty_apply's arithmetic.
 */
typedef struct {
    int32_t id;
    float delta, scale;
} fm_penalty;
int fm_penalty_list(const fm_sampling *s, const int32_t *seq, int n_seq, int n_gen, const int32_t *extra,
                    int n_extra, int *counts, fm_penalty *out);

/* The lists of rows 0..rows-1 of one eval, whose row r also counts extra[0..r) (a verify block's drafts;
 * extra NULL: none):
 * row r's entries at out[offsets[r] .. offsets[r + 1]), the entries fm_penalty_list gives that row, with the
 * history read once instead of once a row (with the repetition penalty a row's list read the whole
 * sequence: 41 us a row at 4,800 tokens). Room: rows x (n_seq + rows) entries; offsets: rows + 1. Returns
 * the entries in all. counts as fm_penalty_list's. */
int fm_penalty_rows(const fm_sampling *s, const int32_t *seq, int n_seq, int n_gen, const int32_t *extra,
                    int rows, int *counts, fm_penalty *out, int *offsets);

/* A penalised logit, as Hugging Face's RepetitionPenaltyLogitsProcessor and then vLLM's presence / frequency
 * subtraction compute it in float (a scale of 1 and a delta of 0 leave v as it is, bit for bit). */
static inline float fm_penalty_apply(float v, fm_penalty p) {
    const float r = v > 0 ? v / p.scale : v * p.scale;
    return r - p.delta;
}

/* Lists and applies them to a row of logits (out: scratch as fm_penalty_list's). */
void fm_sample_penalize(float *row, const fm_sampling *s, const int32_t *seq, int n_seq, int n_gen,
                        const int32_t *extra, int n_extra, int *counts, fm_penalty *out);

/* 0, or -1 with one line naming the setting that is out of range. */
int fm_sampling_check(const fm_sampling *s, char *err, size_t errlen);

/* The candidates of a row (see above) into out[] (room for vocab); returns how many. */
int fm_sample_gather(const float *row, int vocab, float temperature, fm_candidate *out);

/* The token drawn from n >= 1 candidates (reordered in place) with the row's key (fm_sample_row_key). */
int32_t fm_sample_pick(fm_candidate *c, int n, const fm_sampling *s, uint64_t key);

/* The token of a row at position pos: argmax (ties to the lowest id) when greedy, else a draw; scratch
 * has room for vocab candidates (unused when greedy). */
int32_t fm_sample_row(const float *row, int vocab, const fm_sampling *s, int pos, fm_candidate *scratch);

/* The probabilities the draw uses, for tests: after fm_sample_pick's filters, ids[0..*n) with p[0..*n)
 * summing to 1. Returns 0. */
int fm_sample_distribution(fm_candidate *c, int n, const fm_sampling *s, int32_t *ids, double *p, int *n_out);

#ifdef __cplusplus
}
#endif

#endif
