/* bench_util.h: small helpers of `flashmap bench`: a monotonic clock, sample lists and their medians. */
#ifndef FM_TOOLS_BENCH_UTIL_H
#define FM_TOOLS_BENCH_UTIL_H

#include <stddef.h>

#define BENCH_MAX_SAMPLES 64

/* Repetitions of one measurement; the table shows their median. */
typedef struct {
    double v[BENCH_MAX_SAMPLES];
    int n;
} bench_samples;

double bench_now_s(void);
/* Adds x when there is room (extra samples beyond BENCH_MAX_SAMPLES are dropped). */
void bench_samples_add(bench_samples *s, double x);
/* Median of the samples (mean of the middle two for an even count); NaN when there are none. */
double bench_median(const bench_samples *s);
double bench_max(const bench_samples *s);

#endif
