/* matmul_scalar.c: the scalar reference kernel of every weight type, and the reference Q8_0 activation
 * quantiser. Plain loops in the order the math is written: the SIMD kernels are tested against these.
 * f32 accumulation throughout; Q8_0 sums each block's int8 products exactly in int32, then adds
 * isum * (d_w * d_x) in f32, block by block, as ggml's vec_dot_q8_0_q8_0 does. The K-quants sum each
 * super-block exactly in integers (quant_k.h) and add its value in f32, block by block. Q4_0 / Q5_0 sum
 * their signed weights against the Q8_0 activations as Q8_0 does (quant_legacy.h). */
#include <math.h>

#include "cpu/matmul_kernels.h"
#include "cpu/quant_k.h"
#include "cpu/quant_legacy.h"

static float out_bias(const float *bias, int64_t r) {
    return bias ? bias[r] : 0.0f;
}

void fm_mm_f32_scalar(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                      int64_t r1, void *tls) {
    (void)tls;
    const int64_t K = w->cols;
    for (int64_t r = r0; r < r1; r++) {
        const float *wr = (const float *)w->data + r * K;
        for (int t = 0; t < a->T; t++) {
            const float *xt = a->x + (int64_t)t * K;
            float s = 0;
            for (int64_t k = 0; k < K; k++) s += wr[k] * xt[k];
            y[(int64_t)t * w->rows + r] = s + out_bias(bias, r);
        }
    }
}

void fm_mm_f16_scalar(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                      int64_t r1, void *tls) {
    (void)tls;
    const int64_t K = w->cols;
    for (int64_t r = r0; r < r1; r++) {
        const uint16_t *wr = (const uint16_t *)w->data + r * K;
        for (int t = 0; t < a->T; t++) {
            const float *xt = a->x + (int64_t)t * K;
            float s = 0;
            for (int64_t k = 0; k < K; k++) s += fm_f16_to_f32(wr[k]) * xt[k];
            y[(int64_t)t * w->rows + r] = s + out_bias(bias, r);
        }
    }
}

void fm_mm_bf16_scalar(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                       int64_t r1, void *tls) {
    (void)tls;
    const int64_t K = w->cols;
    for (int64_t r = r0; r < r1; r++) {
        const uint16_t *wr = (const uint16_t *)w->data + r * K;
        for (int t = 0; t < a->T; t++) {
            const float *xt = a->x + (int64_t)t * K;
            float s = 0;
            for (int64_t k = 0; k < K; k++) s += fm_bf16_to_f32(wr[k]) * xt[k];
            y[(int64_t)t * w->rows + r] = s + out_bias(bias, r);
        }
    }
}

void fm_mm_q8_0_scalar(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                       int64_t r1, void *tls) {
    (void)tls;
    const int64_t nb = w->cols / FM_QK8_0;
    for (int64_t r = r0; r < r1; r++) {
        const fm_block_q8_0 *wr = (const fm_block_q8_0 *)w->data + r * nb;
        for (int t = 0; t < a->T; t++) {
            float s = 0;
            for (int64_t b = 0; b < nb; b++) {
                const fm_block_q8_0 *xb = a->xq + b * a->T + t;
                int32_t isum = 0;
                for (int j = 0; j < FM_QK8_0; j++) isum += (int32_t)wr[b].qs[j] * (int32_t)xb->qs[j];
                s += (float)isum * (fm_f16_to_f32(wr[b].d) * fm_f16_to_f32(xb->d));
            }
            y[(int64_t)t * w->rows + r] = s + out_bias(bias, r);
        }
    }
}

/* Q4_0 / Q5_0 weights x block-major Q8_0 activations. Tokens go in tiles of 8 so that a block's weights are
 * unpacked once per tile; each (row, token) still adds its blocks in order with the Q8_0 kernel's f32 step,
 * so the tiling does not change any result. */
void fm_mm_legacy_scalar(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                         int64_t r1, void *tls) {
    (void)tls;
    enum { TILE = 8 };
    const int64_t nb = w->cols / FM_QK8_0;
    const size_t row_bytes = fm_dtype_row_bytes(w->dtype, w->cols),
                 bb = (size_t)fm_dtype_block_bytes(w->dtype);
    for (int64_t r = r0; r < r1; r++) {
        const char *wr = (const char *)w->data + (size_t)r * row_bytes;
        for (int t0 = 0; t0 < a->T; t0 += TILE) {
            const int nt = a->T - t0 < TILE ? a->T - t0 : TILE;
            float s[TILE] = {0};
            for (int64_t b = 0; b < nb; b++) {
                int8_t q[FM_QK8_0];
                const float dw = fm_legacy_unpack(w->dtype, wr + (size_t)b * bb, q);
                for (int i = 0; i < nt; i++) {
                    const fm_block_q8_0 *xb = a->xq + b * a->T + t0 + i;
                    int32_t isum = 0;
                    for (int j = 0; j < FM_QK8_0; j++) isum += (int32_t)q[j] * (int32_t)xb->qs[j];
                    s[i] += (float)isum * (dw * fm_f16_to_f32(xb->d));
                }
            }
            for (int i = 0; i < nt; i++) y[(int64_t)(t0 + i) * w->rows + r] = s[i] + out_bias(bias, r);
        }
    }
}

/* ggml's quantize_row_q8_0_ref, formula for formula. */
void fm_quant_q8_0_scalar(const float *x, fm_block_q8_0 *y, float *d, int64_t n, int64_t stride) {
    const int64_t nb = n / FM_QK8_0;
    for (int64_t i = 0; i < nb; i++) {
        const int64_t b = i * stride;
        const float *xb = x + i * FM_QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < FM_QK8_0; j++) {
            const float v = fabsf(xb[j]);
            amax = amax > v ? amax : v;
        }
        const float db = amax / 127.0f;
        const float id = db != 0.0f ? 1.0f / db : 0.0f;
        y[b].d = fm_f32_to_f16(db);
        for (int j = 0; j < FM_QK8_0; j++) y[b].qs[j] = (int8_t)roundf(xb[j] * id);
        if (d) d[b] = fm_f16_to_f32(y[b].d);
    }
}

/* The K-quant kernel (Q4_K, Q5_K, Q6_K alike): each super-block's term from quant_k.c (fm_k_block_dot). */
void fm_mm_k_scalar(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                    int64_t r1, void *tls) {
    (void)tls;
    const int64_t nb = w->cols / FM_QK_K;
    const size_t bb = (size_t)fm_dtype_block_bytes(w->dtype);
    for (int64_t r = r0; r < r1; r++) {
        const char *wr = (const char *)w->data + (size_t)r * (size_t)nb * bb;
        for (int t = 0; t < a->T; t++) {
            const fm_block_q8_K *xt = a->xk + (int64_t)t * nb;
            float s = 0;
            for (int64_t b = 0; b < nb; b++) s += fm_k_block_dot(w->dtype, wr + (size_t)b * bb, &xt[b]);
            y[(int64_t)t * w->rows + r] = s + out_bias(bias, r);
        }
    }
}
