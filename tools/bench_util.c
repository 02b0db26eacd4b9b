/* bench_util.c: clock and medians for `flashmap bench` (see bench_util.h). */
#include "bench_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double bench_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void bench_samples_add(bench_samples *s, double x) {
    if (s->n < BENCH_MAX_SAMPLES) s->v[s->n++] = x;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(const bench_samples *s) {
    if (s->n == 0) return NAN;
    double v[BENCH_MAX_SAMPLES];
    memcpy(v, s->v, (size_t)s->n * sizeof *v);
    qsort(v, (size_t)s->n, sizeof *v, cmp_double);
    return s->n % 2 ? v[s->n / 2] : 0.5 * (v[s->n / 2 - 1] + v[s->n / 2]);
}

double bench_max(const bench_samples *s) {
    if (s->n == 0) return NAN;
    double m = s->v[0];
    for (int i = 1; i < s->n; i++)
        if (s->v[i] > m) m = s->v[i];
    return m;
}
