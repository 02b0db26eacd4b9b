/* sampler.c: greedy choice and seeded draws from a row of logits (sampler.h). The filters follow Hugging
 * Face's logits warpers in their order (temperature, top-k, top-p, min-p), computed in double in a fixed
 * order of the candidates (by id; by logit, ties by id, where top-p needs it); the draw is the Gumbel-max of
 * what they keep (sample_noise.h). So one row always gives one token, on any thread count and whatever order
 * the candidates came in. Also the penalties' lists, which every backend applies. */
#include "decode/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "cpu/ops.h"

int fm_sampling_check(const fm_sampling *s, char *err, size_t errlen) {
    if (!(s->temperature >= 0) || s->temperature > 100)
        return fm_set_error(err, errlen, "temperature must be in [0, 100], got %g", (double)s->temperature);
    if (s->top_k < 0)
        return fm_set_error(err, errlen, "top-k must be 0 (no limit) or more, got %d", s->top_k);
    if (!(s->top_p >= 0) || s->top_p > 1)
        return fm_set_error(err, errlen, "top-p must be in [0, 1] (0 or 1: no limit), got %g",
                            (double)s->top_p);
    if (!(s->min_p >= 0) || s->min_p >= 1)
        return fm_set_error(err, errlen, "min-p must be in [0, 1), got %g", (double)s->min_p);
    if (!(fabsf(s->presence_penalty) <= 2))
        return fm_set_error(err, errlen, "presence penalty must be in [-2, 2], got %g",
                            (double)s->presence_penalty);
    if (!(fabsf(s->frequency_penalty) <= 2))
        return fm_set_error(err, errlen, "frequency penalty must be in [-2, 2], got %g",
                            (double)s->frequency_penalty);
    if (!(s->repetition_penalty >= 0 && s->repetition_penalty <= 10) ||
        (s->repetition_penalty > 0 && s->repetition_penalty < 1e-3f))
        return fm_set_error(err, errlen, "repetition penalty must be in (0, 10] (1: off), got %g",
                            (double)s->repetition_penalty);
    if (s->repeat_last_n < 0)
        return fm_set_error(err, errlen, "repeat-last-n must be >= 0 (0: the whole sequence), got %d",
                            s->repeat_last_n);
    return 0;
}

int fm_sample_gather(const float *row, int vocab, float temperature, fm_candidate *out) {
    const float cut = row[fm_argmax(row, vocab)] - FM_SAMPLE_RANGE * temperature;
    int n = 0;
    for (int i = 0; i < vocab; i++)
        if (row[i] >= cut) out[n++] = (fm_candidate){row[i], i, 0};
    return n;
}

/* Larger logit first, then the lower id. */
static int by_logit_desc(const void *pa, const void *pb) {
    const fm_candidate *a = pa, *b = pb;
    if (a->logit != b->logit) return a->logit > b->logit ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

/* The k-th largest logit of c[0..n) (1 <= k <= n), by a min-heap of the k largest seen. */
static float kth_largest(const fm_candidate *c, int n, int k, float *heap) {
    int h = 0;
    for (int i = 0; i < n; i++) {
        const float v = c[i].logit;
        if (h < k) {
            int j = h++;
            while (j > 0 && heap[(j - 1) / 2] > v) heap[j] = heap[(j - 1) / 2], j = (j - 1) / 2;
            heap[j] = v;
        } else if (v > heap[0]) {
            int j = 0;
            for (;;) {
                int m = 2 * j + 1;
                if (m >= k) break;
                if (m + 1 < k && heap[m + 1] < heap[m]) m++;
                if (heap[m] >= v) break;
                heap[j] = heap[m];
                j = m;
            }
            heap[j] = v;
        }
    }
    return heap[0];
}

static int by_id(const void *pa, const void *pb) {
    const fm_candidate *a = pa, *b = pb;
    return (a->id > b->id) - (a->id < b->id);
}

enum { TIERS = 256 };

static int tier_of(const fm_candidate *c, float m, double width) {
    const int t = (int)(((double)m - c->logit) / width * TIERS);
    return t < TIERS ? t : TIERS - 1;
}

/* Top-p over c[0..n) (id order, w set): tokens by descending logit while the mass before each is under
 * limit. The candidates fall in TIERS slices of logit; the tiers wholly before the crossing one are kept
 * as they are (id order), and only the crossing tier is sorted (by logit, ties by id) and cut, so a flat row
 * of 150k candidates does not sort them all. The kept run is moved to the front; returns its length. */
static int nucleus(fm_candidate *c, int n, float m, double width, double limit) {
    double mass[TIERS] = {0};
    for (int i = 0; i < n; i++) mass[tier_of(&c[i], m, width)] += c[i].w;
    int cross = TIERS - 1;
    double before = 0;
    for (int t = 0; t < TIERS; t++) {
        if (before + mass[t] >= limit) {
            cross = t;
            break;
        }
        before += mass[t];
    }
    int whole = 0; /* tiers before the crossing one, then the crossing tier after them */
    for (int i = 0; i < n; i++)
        if (tier_of(&c[i], m, width) < cross) {
            const fm_candidate x = c[i];
            c[i] = c[whole], c[whole++] = x;
        }
    int g = whole;
    for (int i = whole; i < n; i++)
        if (tier_of(&c[i], m, width) == cross) c[g++] = c[i];
    qsort(c + whole, (size_t)(g - whole), sizeof *c, by_logit_desc);
    for (int i = whole; i < g; i++) {
        if (i > 0 && before >= limit) return i;
        before += c[i].w;
    }
    return g;
}

static float max_logit(const fm_candidate *c, int n) {
    float m = c[0].logit;
    for (int i = 1; i < n; i++)
        if (c[i].logit > m) m = c[i].logit;
    return m;
}

/* Applies the filters to c[0..n) (largest logit m); returns how many remain at its front, their w set when
 * top-p is on or with_w (the draw needs none). Candidates may come in any order (the GPU gathers them in
 * any): every sum runs in id order, or by descending logit within top-p's crossing tier, so the kept set
 * depends on the candidate set alone. */
static int filter(fm_candidate *c, int n, const fm_sampling *s, float m, int with_w) {
    const double t = s->temperature;
    int kept = 0;
    for (int i = 0; i < n; i++)
        if (((double)c[i].logit - m) / t >= -(double)FM_SAMPLE_RANGE) c[kept++] = c[i];
    if (kept == 0) { /* every logit -inf: the first stays, alone */
        c[0].w = 1;
        return 1;
    }
    n = kept;
    for (int i = 1; i < n; i++)
        if (c[i - 1].id > c[i].id) {
            qsort(c, (size_t)n, sizeof *c, by_id);
            break;
        }
    if (s->top_k > 0 && n > s->top_k) {
        /* Hugging Face keeps every token tied with the k-th largest logit. */
        float *heap = malloc((size_t)s->top_k * sizeof *heap);
        float vk;
        if (heap) {
            vk = kth_largest(c, n, s->top_k, heap);
            free(heap);
        } else { /* no room for the heap: sort, read the k-th, restore the id order */
            qsort(c, (size_t)n, sizeof *c, by_logit_desc);
            vk = c[s->top_k - 1].logit;
            qsort(c, (size_t)n, sizeof *c, by_id);
        }
        kept = 0;
        for (int i = 0; i < n; i++)
            if (c[i].logit >= vk) c[kept++] = c[i];
        n = kept;
    }
    if (fm_sampling_top_p_on(s) || with_w) {
        double sum = 0;
        for (int i = 0; i < n; i++) sum += c[i].w = exp(((double)c[i].logit - m) / t);
        /* Top-p keeps a token while the mass of those before it is under top_p (HF: its ascending
         * cumulative probability, itself included, exceeds 1 - top_p); the first always stays. */
        if (fm_sampling_top_p_on(s)) n = nucleus(c, n, m, (FM_SAMPLE_RANGE + 1) * t, (double)s->top_p * sum);
    }
    if (s->min_p > 0) {
        /* w >= min_p x the most likely token's exp(0) = 1, as a comparison of logits (what a GPU kernel
         * computes bit for bit; it never drops the most likely token). */
        const double floor_d = log((double)s->min_p);
        kept = 0;
        for (int i = 0; i < n; i++)
            if (((double)c[i].logit - m) / t >= floor_d) c[kept++] = c[i];
        n = kept;
    }
    return n;
}

int32_t fm_sample_pick(fm_candidate *c, int n, const fm_sampling *s, uint64_t key) {
    const float m = max_logit(c, n);
    n = filter(c, n, s, m, 0);
    /* Gumbel-max over the kept tokens (sample_noise.h). */
    int32_t best = c[0].id;
    float best_score = fm_sample_score(c[0].logit, m, s->temperature, key, c[0].id);
    for (int i = 1; i < n; i++) {
        const float sc = fm_sample_score(c[i].logit, m, s->temperature, key, c[i].id);
        if (sc > best_score || (sc == best_score && c[i].id < best)) best = c[i].id, best_score = sc;
    }
    return best;
}

int fm_sample_distribution(fm_candidate *c, int n, const fm_sampling *s, int32_t *ids, double *p,
                           int *n_out) {
    n = filter(c, n, s, max_logit(c, n), 1);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += c[i].w;
    for (int i = 0; i < n; i++) ids[i] = c[i].id, p[i] = c[i].w / sum;
    *n_out = n;
    return 0;
}

/* counts[] of the penalty lists: a token's count among the generated tokens, with this flag beside it when
 * the token is in the repetition window (above any count). */
enum { IN_WINDOW = 1 << 30 };

/* Presence or frequency on: the generated tokens are counted. */
static int counts_generated(const fm_sampling *s) {
    return s->presence_penalty != 0 || s->frequency_penalty != 0;
}

int fm_penalty_list(const fm_sampling *s, const int32_t *seq, int n_seq, int n_gen, const int32_t *extra,
                    int n_extra, int *counts, fm_penalty *out) {
    const int total = n_seq + n_extra, g0 = n_seq - n_gen;
    int w0 = total; /* the repetition window: history positions [w0, total) */
    if (fm_sampling_repeats(s))
        w0 = s->repeat_last_n > 0 && s->repeat_last_n < total ? total - s->repeat_last_n : 0;
    const int add = counts_generated(s);
#define AT(i) ((i) < n_seq ? seq[i] : extra[(i)-n_seq])
    if (add)
        for (int i = g0; i < total; i++) counts[AT(i)]++;
    for (int i = w0; i < total; i++) counts[AT(i)] |= IN_WINDOW;
    /* Each distinct token once: its count is zeroed as it is listed. */
    int k = 0;
    for (int i = add && g0 < w0 ? g0 : w0; i < total; i++) {
        const int32_t id = AT(i);
        const int c = counts[id];
        if (!c) continue;
        const int n = c & (IN_WINDOW - 1);
        out[k++] =
            (fm_penalty){id, n ? fm_penalty_delta(s, n) : 0.0f, c & IN_WINDOW ? s->repetition_penalty : 1.0f};
        counts[id] = 0;
    }
#undef AT
    return k;
}

int fm_penalty_rows(const fm_sampling *s, const int32_t *seq, int n_seq, int n_gen, const int32_t *extra,
                    int rows, int *counts, fm_penalty *out, int *offsets) {
    const int rep = fm_sampling_repeats(s), add = counts_generated(s);
    const int shifting = rep && s->repeat_last_n > 0 && s->repeat_last_n < n_seq + rows - 1;
    int *base_n = rows > 1 && !shifting ? malloc(sizeof(int) * (size_t)(n_seq > 0 ? n_seq : 1)) : NULL;
    if (!base_n) { /* one row, a window that moves with the row (or no memory): each row on its own */
        int k = 0;
        for (int r = 0; r < rows; r++) {
            offsets[r] = k;
            k += fm_penalty_list(s, seq, n_seq, n_gen, extra, extra ? r : 0, counts, out + k);
        }
        offsets[rows] = k;
        return k;
    }
    /* Row 0: the history's list (fm_penalty_list's entries in its order), each entry's generated count kept
     * and counts[id] = -(its index + 1), so that a row's drafts find their entries. */
    const int g0 = n_seq - n_gen, start = rep ? 0 : g0;
    if (add)
        for (int i = g0; i < n_seq; i++) counts[seq[i]]++;
    if (rep)
        for (int i = 0; i < n_seq; i++) counts[seq[i]] |= IN_WINDOW;
    int k0 = 0;
    for (int i = start; i < n_seq; i++) {
        const int c = counts[seq[i]];
        if (c <= 0) continue; /* none, or already listed (an index, stored negated) */
        const int n = c & (IN_WINDOW - 1);
        out[k0] = (fm_penalty){seq[i], n ? fm_penalty_delta(s, n) : 0.0f,
                               c & IN_WINDOW ? s->repetition_penalty : 1.0f};
        base_n[k0] = n;
        counts[seq[i]] = -(++k0);
    }
    offsets[0] = 0, offsets[1] = k0;
    /* Row r: row 0's entries with the drafts extra[0..r) counted in (as generated tokens, in the window),
     * then the drafts that are not in the history, in order of first appearance (fm_penalty_list's order). */
    for (int r = 1; r < rows; r++) {
        fm_penalty *row = out + offsets[r];
        memcpy(row, out, sizeof *out * (size_t)k0);
        int k = k0;
        for (int j = 0; extra && j < r; j++) {
            const int32_t x = extra[j];
            int m = 0, first = 1;
            for (int q = 0; q < r; q++) {
                m += extra[q] == x;
                if (q < j && extra[q] == x) first = 0;
            }
            if (!first) continue;
            const int idx = counts[x] < 0 ? -counts[x] - 1 : -1;
            if (idx >= 0) {
                if (add) row[idx].delta = fm_penalty_delta(s, base_n[idx] + m);
            } else if (add || rep) {
                row[k++] =
                    (fm_penalty){x, add ? fm_penalty_delta(s, m) : 0.0f, rep ? s->repetition_penalty : 1.0f};
            }
        }
        offsets[r + 1] = offsets[r] + k;
    }
    for (int i = 0; i < k0; i++) counts[out[i].id] = 0;
    free(base_n);
    return offsets[rows];
}

void fm_sample_penalize(float *row, const fm_sampling *s, const int32_t *seq, int n_seq, int n_gen,
                        const int32_t *extra, int n_extra, int *counts, fm_penalty *out) {
    const int k = fm_penalty_list(s, seq, n_seq, n_gen, extra, n_extra, counts, out);
    for (int i = 0; i < k; i++) row[out[i].id] = fm_penalty_apply(row[out[i].id], out[i]);
}

int32_t fm_sample_row(const float *row, int vocab, const fm_sampling *s, int pos, fm_candidate *scratch) {
    if (fm_sampling_greedy(s)) return (int32_t)fm_argmax(row, vocab);
    const int n = fm_sample_gather(row, vocab, s->temperature, scratch);
    if (n == 0) return (int32_t)fm_argmax(row, vocab); /* a row of NaN */
    return fm_sample_pick(scratch, n, s, fm_sample_row_key(s->seed, pos));
}
