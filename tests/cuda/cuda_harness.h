/* cuda_harness.h: shared helpers of the device test and the device benchmark (synthetic models, a plain
 * generate-params init, timing). Header-only; included by one translation unit each. */
#ifndef FM_TESTS_CUDA_HARNESS_H
#define FM_TESTS_CUDA_HARNESS_H

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "flashmap.h"

static inline double hx_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* What fm_generate_params_init sets (engine.c is not linked into the device harness). */
static inline void hx_params(fm_generate_params *p, int max_new) {
    memset(p, 0, sizeof *p);
    p->max_new_tokens = max_new;
    p->ignore_stop = 1;
}

/* max |a-b| / max |b| over n values. */
static inline double hx_rel_err(const float *a, const float *b, size_t n) {
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= md)) md = d; /* NaN propagates */
        if (fabs(b[i]) > mb) mb = fabs(b[i]);
    }
    return mb > 0 ? md / mb : md;
}

#endif
