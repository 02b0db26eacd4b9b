/* quant_k.c: K-quant dequantisation, the Q8_K activation quantiser and the scalar block sums (quant_k.h).
 * Written from the block layouts in core/dtype.h, in the order the math reads; the SIMD kernels and the
 * fixtures made with the gguf package's dequantiser are checked against these. */
#include "cpu/quant_k.h"

#include <math.h>
#include <string.h>

/* Round half to even for |v| < 2^22, by adding 1.5 * 2^23 (ggml's nearest_int; no libm call). */
static int nearest_int(float v) {
    float f = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &f, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

void fm_quant_q8_K_ref(const float *x, fm_block_q8_K *y, int64_t n) {
    for (int64_t b = 0; b < n / FM_QK_K; b++, x += FM_QK_K) {
        fm_block_q8_K *o = &y[b];
        float max = 0.0f, amax = 0.0f;
        for (int j = 0; j < FM_QK_K; j++) {
            const float a = fabsf(x[j]);
            if (a > amax) amax = a, max = x[j];
        }
        if (amax == 0.0f) {
            memset(o, 0, sizeof *o);
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < FM_QK_K; j++) {
            const int v = nearest_int(iscale * x[j]);
            o->qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < FM_QK_K / 16; j++) {
            int s = 0;
            for (int k = 0; k < 16; k++) s += o->qs[16 * j + k];
            o->bsums[j] = (int16_t)s;
        }
        o->d = 1.0f / iscale;
    }
}

/* The 256 weights of a Q4_K / Q5_K block as integers 0..15 / 0..31, in order. */
static void unpack_q4_K(const fm_block_q4_K *w, uint8_t q[FM_QK_K]) {
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            q[64 * c + l] = w->qs[32 * c + l] & 0xF;
            q[64 * c + 32 + l] = w->qs[32 * c + l] >> 4;
        }
}

static void unpack_q5_K(const fm_block_q5_K *w, uint8_t q[FM_QK_K]) {
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            const uint8_t hi_lo = (w->qh[l] >> (2 * c)) & 1, hi_hi = (w->qh[l] >> (2 * c + 1)) & 1;
            q[64 * c + l] = (uint8_t)((w->qs[32 * c + l] & 0xF) | (hi_lo << 4));
            q[64 * c + 32 + l] = (uint8_t)((w->qs[32 * c + l] >> 4) | (hi_hi << 4));
        }
}

/* Q6_K: each half of 128 weights takes 64 bytes of ql and 32 of qh; weight 32i + l of the half (i < 4) has
 * its low nibble in ql[l + 32 (i & 1)] (low nibble for i < 2, high for i >= 2) and bits 2i, 2i+1 of qh[l]. */
static void unpack_q6_K(const fm_block_q6_K *w, int8_t q[FM_QK_K]) {
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = w->ql + 64 * h, *qh = w->qh + 32 * h;
        for (int i = 0; i < 4; i++)
            for (int l = 0; l < 32; l++) {
                const uint8_t lo = i < 2 ? ql[l + 32 * i] & 0xF : ql[l + 32 * (i - 2)] >> 4;
                const uint8_t hi = (qh[l] >> (2 * i)) & 3;
                q[128 * h + 32 * i + l] = (int8_t)((lo | (hi << 4)) - 32);
            }
    }
}

static void dequant_qx_K(const uint8_t *q, uint16_t d16, uint16_t dmin16, const uint8_t *scales, float *out) {
    const float d = fm_f16_to_f32(d16), dmin = fm_f16_to_f32(dmin16);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        fm_k_scale_min(j, scales, &sc, &m);
        const float dl = d * sc, ml = dmin * m;
        for (int k = 0; k < 32; k++) out[32 * j + k] = dl * q[32 * j + k] - ml;
    }
}

void fm_dequant_row_k(fm_dtype t, const void *blocks, float *out, int64_t n) {
    for (int64_t b = 0; b < n / FM_QK_K; b++, out += FM_QK_K) {
        if (t == FM_DTYPE_Q4_K) {
            const fm_block_q4_K *w = (const fm_block_q4_K *)blocks + b;
            uint8_t q[FM_QK_K];
            unpack_q4_K(w, q);
            dequant_qx_K(q, w->d, w->dmin, w->scales, out);
        } else if (t == FM_DTYPE_Q5_K) {
            const fm_block_q5_K *w = (const fm_block_q5_K *)blocks + b;
            uint8_t q[FM_QK_K];
            unpack_q5_K(w, q);
            dequant_qx_K(q, w->d, w->dmin, w->scales, out);
        } else {
            const fm_block_q6_K *w = (const fm_block_q6_K *)blocks + b;
            int8_t q[FM_QK_K];
            unpack_q6_K(w, q);
            const float d = fm_f16_to_f32(w->d);
            for (int j = 0; j < 16; j++)
                for (int k = 0; k < 16; k++) out[16 * j + k] = d * w->scales[j] * q[16 * j + k];
        }
    }
}

static fm_k_sums sums_qx_K(const uint8_t *q, const uint8_t *scales, const fm_block_q8_K *x) {
    fm_k_sums s = {0, 0};
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        fm_k_scale_min(j, scales, &sc, &m);
        int32_t dot = 0;
        for (int k = 0; k < 32; k++) dot += (int32_t)q[32 * j + k] * x->qs[32 * j + k];
        s.isum += sc * dot;
        s.msum += m * (x->bsums[2 * j] + x->bsums[2 * j + 1]);
    }
    return s;
}

fm_k_sums fm_k_sums_q4_K(const fm_block_q4_K *w, const fm_block_q8_K *x) {
    uint8_t q[FM_QK_K];
    unpack_q4_K(w, q);
    return sums_qx_K(q, w->scales, x);
}

fm_k_sums fm_k_sums_q5_K(const fm_block_q5_K *w, const fm_block_q8_K *x) {
    uint8_t q[FM_QK_K];
    unpack_q5_K(w, q);
    return sums_qx_K(q, w->scales, x);
}

fm_k_sums fm_k_sums_q6_K(const fm_block_q6_K *w, const fm_block_q8_K *x) {
    int8_t q[FM_QK_K];
    unpack_q6_K(w, q);
    fm_k_sums s = {0, 0};
    for (int j = 0; j < 16; j++) {
        int32_t dot = 0;
        for (int k = 0; k < 16; k++) dot += (int32_t)q[16 * j + k] * x->qs[16 * j + k];
        s.isum += w->scales[j] * dot;
    }
    return s;
}

float fm_k_block_dot(fm_dtype t, const void *w, const fm_block_q8_K *x) {
    if (t == FM_DTYPE_Q6_K) {
        const fm_block_q6_K *q = w;
        return fm_k_block_value(fm_f16_to_f32(q->d), 0.0f, x->d, fm_k_sums_q6_K(q, x));
    }
    if (t == FM_DTYPE_Q5_K) {
        const fm_block_q5_K *q = w;
        return fm_k_block_value(fm_f16_to_f32(q->d), fm_f16_to_f32(q->dmin), x->d, fm_k_sums_q5_K(q, x));
    }
    const fm_block_q4_K *q = w;
    return fm_k_block_value(fm_f16_to_f32(q->d), fm_f16_to_f32(q->dmin), x->d, fm_k_sums_q4_K(q, x));
}
