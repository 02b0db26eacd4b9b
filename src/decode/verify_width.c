/* verify_width.c: see verify_width.h. */
#include "decode/verify_width.h"

#include <math.h>

/* Counts decay per round (a window of ~10 rounds: acceptance drifts with the text); timings are running
 * averages. PRIOR_RATE stands in for slot 1 before any round, PRIOR_WEIGHT is how many rounds a neighbour's
 * estimate is worth. */
static const double DECAY = 0.9, TIME_KEEP = 0.6, SLOPE_KEEP = 0.9, PRIOR_RATE = 0.7, PRIOR_WEIGHT = 1.0;

void fm_width_reset(fm_width_model *m) {
    for (int i = 0; i <= FM_MAX_BLOCK; i++) m->tested[i] = m->passed[i] = 0;
    for (int t = 0; t <= FM_MAX_BLOCK + 1; t++) m->cost_ms[t] = NAN;
    m->draft_ms = m->draft_k = NAN;
    m->s1 = m->sk = m->skk = m->sy = m->sky = 0;
    m->granule = 1;
}

void fm_width_set_granule(fm_width_model *m, int granule) {
    m->granule = granule > 1 ? granule : 1;
}

static void running(double *avg, double x) {
    *avg = isnan(*avg) ? x : TIME_KEEP * *avg + (1 - TIME_KEEP) * x;
}

void fm_width_observe_round(fm_width_model *m, int K, int accepted, double draft_ms, double verify_ms) {
    if (K < 1 || K > FM_MAX_BLOCK) return;
    for (int i = 1; i <= FM_MAX_BLOCK; i++) {
        m->tested[i] *= DECAY;
        m->passed[i] *= DECAY;
    }
    /* Slots 1..accepted passed; slot accepted+1 (if verified) failed; later slots were never compared. */
    for (int i = 1; i <= K && i <= accepted + 1; i++) {
        m->tested[i] += 1;
        m->passed[i] += i <= accepted;
    }
    running(&m->cost_ms[K + 1], verify_ms);
    if (draft_ms >= 0) {
        running(&m->draft_ms, draft_ms);
        running(&m->draft_k, K);
        m->s1 = SLOPE_KEEP * m->s1 + 1;
        m->sk = SLOPE_KEEP * m->sk + K;
        m->skk = SLOPE_KEEP * m->skk + (double)K * K;
        m->sy = SLOPE_KEEP * m->sy + draft_ms;
        m->sky = SLOPE_KEEP * m->sky + K * draft_ms;
    }
}

void fm_width_observe_step(fm_width_model *m, double step_ms) {
    running(&m->cost_ms[1], step_ms);
}

/* Slot i's rate from its own counts, shrunk towards the previous slot's rate. */
static double shrunk_rate(const fm_width_model *m, int i, double previous) {
    return (m->passed[i] + PRIOR_WEIGHT * previous) / (m->tested[i] + PRIOR_WEIGHT);
}

double fm_width_slot_rate(const fm_width_model *m, int i) {
    double rate = PRIOR_RATE;
    for (int j = 1; j <= i && j <= FM_MAX_BLOCK; j++) rate = shrunk_rate(m, j, rate);
    return rate;
}

double fm_width_expected_tokens(const fm_width_model *m, int K) {
    double all = 1, tokens = 1, rate = PRIOR_RATE;
    for (int i = 1; i <= K && i <= FM_MAX_BLOCK; i++) {
        rate = shrunk_rate(m, i, rate);
        all *= rate;
        tokens += all;
    }
    return tokens;
}

/* c at T on the line through (a, ca) and (b, cb), a != b, never sloping down: a noisy pair where a larger
 * block timed cheaper must not make a still larger one look cheaper still. */
static double on_line(int a, double ca, int b, double cb, int T) {
    double slope = (cb - ca) / (b - a);
    if (slope < 0) slope = 0;
    const double c = ca + slope * (T - a);
    return c > 0 ? c : ca;
}

/* The timed sizes nearest T in [from, to], at or below T (*lo, then *lo2) and above it (*hi, *hi2); -1 where
 * there is none. */
static void nearest_timed(const double *cost, int T, int from, int to, int *lo, int *lo2, int *hi, int *hi2) {
    *lo = *lo2 = *hi = *hi2 = -1;
    for (int t = T < to ? T : to; t >= from && *lo2 < 0; t--)
        if (!isnan(cost[t])) *(*lo < 0 ? lo : lo2) = t;
    for (int t = T + 1 > from ? T + 1 : from; t <= to && *hi2 < 0; t++)
        if (!isnan(cost[t])) *(*hi < 0 ? hi : hi2) = t;
}

/* The line through the nearest two timed sizes of [from, to]: between them, else the nearest two outside. */
static double size_line(const double *cost, int T, int from, int to) {
    int lo, lo2, hi, hi2;
    nearest_timed(cost, T, from, to, &lo, &lo2, &hi, &hi2);
    if (lo == T) return cost[T];
    if (lo >= 0 && hi >= 0) return on_line(lo, cost[lo], hi, cost[hi], T);
    if (lo2 >= 0) return on_line(lo2, cost[lo2], lo, cost[lo], T);
    if (hi2 >= 0) return on_line(hi, cost[hi], hi2, cost[hi2], T);
    return NAN;
}

/* The largest (top) or smallest timed size of class j (sizes j g + 1 .. j g + g, up to n_max), or -1. */
static int class_edge(const double *cost, int j, int g, int n_max, int top) {
    const int first = j * g + 1, last = first + g - 1 < n_max ? first + g - 1 : n_max;
    for (int i = 0; i <= last - first; i++) {
        const int t = top ? last - i : first + i;
        if (!isnan(cost[t])) return t;
    }
    return -1;
}

double fm_width_cost_ms(const fm_width_model *m, int T) {
    const double *cost = m->cost_ms;
    const int n_max = FM_MAX_BLOCK + 1, g = m->granule > 1 ? m->granule : 1;
    if (T < 1 || T > n_max) return NAN;
    if (!isnan(cost[T])) return cost[T];
    if (g == 1) return size_line(cost, T, 1, n_max);
    /* T's own class: the line through its timed sizes (nearest two), or the one's cost */
    const int k = (T - 1) / g, first = k * g + 1, last = first + g - 1 < n_max ? first + g - 1 : n_max;
    const double in_class = size_line(cost, T, first, last);
    if (!isnan(in_class)) return in_class;
    const int one = class_edge(cost, k, g, n_max, 0);
    if (one >= 0) return cost[one];
    /* Other classes, each taken at its timed size facing T (the largest of a class below, the smallest of one
     * above): the nearest two classes' line in the class index. below / above: [nearest, next] sizes. */
    int below[2] = {-1, -1}, above[2] = {-1, -1};
    for (int j = k - 1, n = 0; j >= 0 && n < 2; j--)
        if ((below[n] = class_edge(cost, j, g, n_max, 1)) >= 0) n++;
    for (int j = k + 1, n = 0; j * g + 1 <= n_max && n < 2; j++)
        if ((above[n] = class_edge(cost, j, g, n_max, 0)) >= 0) n++;
    const int *p = NULL, *q = NULL; /* the two sizes of the line, p's class before q's */
    if (below[0] >= 0 && above[0] >= 0)
        p = &below[0], q = &above[0];
    else if (below[1] >= 0)
        p = &below[1], q = &below[0];
    else if (above[1] >= 0)
        p = &above[0], q = &above[1];
    if (p) return on_line((*p - 1) / g, cost[*p], (*q - 1) / g, cost[*q], k);
    return size_line(cost, T, 1, n_max); /* one class timed: its sizes' line, which explores beyond it */
}

double fm_width_draft_ms(const fm_width_model *m, int K) {
    if (isnan(m->draft_ms)) return NAN;
    /* Weighted least squares over the decayed sums. The slope needs widths that still differ in the window
     * (weighted variance of K >= 1/2): a lone old round at another width (a slow first draft) would
     * otherwise keep tilting the line long after it stopped meaning anything. */
    const double spread = m->s1 * m->skk - m->sk * m->sk;
    double slope = spread >= 0.5 * m->s1 * m->s1 ? (m->s1 * m->sky - m->sk * m->sy) / spread : 0;
    if (slope < 0) slope = 0;
    const double ms = m->draft_ms + slope * (K - m->draft_k);
    return ms > 0 ? ms : 0;
}

int fm_width_choose(const fm_width_model *m, int k_max, int otherwise) {
    if (k_max < 1) return otherwise;
    int timed = 0, only = 0;
    for (int t = 1; t <= FM_MAX_BLOCK + 1; t++)
        if (!isnan(m->cost_ms[t])) timed++, only = t;
    /* Explore: the caller's width first, then half of it, so that there are two sizes to draw a line through.
     */
    if (timed == 1 && only == otherwise + 1) return otherwise / 2 > 0 ? otherwise / 2 : 1;
    if (timed < 2 || isnan(fm_width_draft_ms(m, 1))) return otherwise;
    int best = 1;
    double best_rate = -1;
    for (int K = 1; K <= k_max; K++) {
        const double rate =
            fm_width_expected_tokens(m, K) / (fm_width_draft_ms(m, K) + fm_width_cost_ms(m, K + 1));
        if (rate > best_rate) {
            best_rate = rate;
            best = K;
        }
    }
    return best;
}
