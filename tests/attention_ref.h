/* attention_ref.h: the attention reference the CPU and CUDA tests compare with: double precision over the
 * same f16 keys and values. q [T][n_heads * hd], k / v [keys][n_kv * hd]; row t attends to keys
 * 0 .. len - 1, len = n_keys > 0 ? n_keys : pos0 + t + 1 (causal); ref [T][n_heads * hd]. */
#ifndef FM_TEST_ATTENTION_REF_H
#define FM_TEST_ATTENTION_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/dtype.h"

static void attention_ref(const float *q, int T, int n_heads, int n_kv, int hd, const uint16_t *k,
                          const uint16_t *v, int pos0, int n_keys, float *ref) {
    const int W = n_heads * hd, KW = n_kv * hd, G = n_heads / n_kv;
    const int most = n_keys > 0 ? n_keys : pos0 + T;
    double *sc = malloc(sizeof(double) * (size_t)(most > 0 ? most : 1));
    for (int t = 0; t < T; t++)
        for (int h = 0; h < n_heads; h++) {
            const int len = n_keys > 0 ? n_keys : pos0 + t + 1, g = h / G;
            const float *qr = q + (size_t)t * W + h * hd;
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < len; j++) {
                double d = 0;
                for (int i = 0; i < hd; i++)
                    d += (double)qr[i] * fm_f16_to_f32(k[(size_t)j * KW + g * hd + i]);
                sc[j] = d / sqrt((double)hd);
                mx = fmax(mx, sc[j]);
            }
            for (int j = 0; j < len; j++) sum += sc[j] = exp(sc[j] - mx);
            for (int i = 0; i < hd; i++) {
                double o = 0;
                for (int j = 0; j < len; j++) o += sc[j] * fm_f16_to_f32(v[(size_t)j * KW + g * hd + i]);
                ref[(size_t)t * W + h * hd + i] = (float)(o / sum);
            }
        }
    free(sc);
}

#endif
