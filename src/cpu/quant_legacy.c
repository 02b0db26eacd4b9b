/* quant_legacy.c: Q4_0 / Q5_0 block decoding, block sums and the synth quantiser (see quant_legacy.h). */
#include "cpu/quant_legacy.h"

#include <math.h>
#include <string.h>

static void unpack_q4_0(const fm_block_q4_0 *w, int8_t q[32]) {
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)((w->qs[j] & 0xF) - 8);
        q[j + 16] = (int8_t)((w->qs[j] >> 4) - 8);
    }
}

static void unpack_q5_0(const fm_block_q5_0 *w, int8_t q[32]) {
    const uint32_t qh =
        (uint32_t)w->qh[0] | (uint32_t)w->qh[1] << 8 | (uint32_t)w->qh[2] << 16 | (uint32_t)w->qh[3] << 24;
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)(((w->qs[j] & 0xF) | (((qh >> j) & 1u) << 4)) - 16);
        q[j + 16] = (int8_t)(((w->qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - 16);
    }
}

float fm_legacy_unpack(fm_dtype t, const void *block, int8_t q[32]) {
    if (t == FM_DTYPE_Q5_0) {
        const fm_block_q5_0 *w = block;
        unpack_q5_0(w, q);
        return fm_f16_to_f32(w->d);
    }
    const fm_block_q4_0 *w = block;
    unpack_q4_0(w, q);
    return fm_f16_to_f32(w->d);
}

void fm_dequant_row_legacy(fm_dtype t, const void *blocks, float *out, int64_t n) {
    int8_t q[32];
    const size_t bb = (size_t)fm_dtype_block_bytes(t);
    for (int64_t b = 0; b < n / 32; b++) {
        const float d = fm_legacy_unpack(t, (const char *)blocks + (size_t)b * bb, q);
        for (int j = 0; j < 32; j++) out[32 * b + j] = d * (float)q[j];
    }
}

int32_t fm_legacy_isum(fm_dtype t, const void *w, const fm_block_q8_0 *x, float *dw) {
    int8_t q[32];
    *dw = fm_legacy_unpack(t, w, q);
    int32_t isum = 0;
    for (int j = 0; j < 32; j++) isum += (int32_t)q[j] * (int32_t)x->qs[j];
    return isum;
}

void fm_quant_legacy_rtn(fm_dtype t, const float *x, void *y, int64_t n) {
    const int five = t == FM_DTYPE_Q5_0, hi = five ? 15 : 7, lo = -hi - 1;
    for (int64_t b = 0; b < n / 32; b++, x += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        uint16_t dh = fm_f32_to_f16(amax / (float)hi);
        /* Among f16 subnormals (tiny blocks) the rounding can lose so much that the largest weight falls
         * outside the last step (amax > (hi + 1/2) d); the next f16 up is then the scale. */
        if (fm_f16_to_f32(dh) * ((float)hi + 0.5f) < amax) dh++;
        const float d = fm_f16_to_f32(dh), inv = d > 0.0f ? 1.0f / d : 0.0f;
        uint8_t u[32];
        for (int j = 0; j < 32; j++) {
            const float v = roundf(x[j] * inv);
            const int q = v < (float)lo ? lo : v > (float)hi ? hi : (int)v;
            u[j] = (uint8_t)(q - lo); /* 0..15 or 0..31 */
        }
        uint8_t qs[16];
        for (int j = 0; j < 16; j++) qs[j] = (uint8_t)((u[j] & 0xF) | (u[j + 16] & 0xF) << 4);
        if (five) {
            fm_block_q5_0 *o = (fm_block_q5_0 *)y + b;
            uint32_t qh = 0;
            for (int j = 0; j < 32; j++) qh |= (uint32_t)(u[j] >> 4) << j;
            o->d = dh;
            for (int i = 0; i < 4; i++) o->qh[i] = (uint8_t)(qh >> (8 * i));
            memcpy(o->qs, qs, sizeof qs);
        } else {
            fm_block_q4_0 *o = (fm_block_q4_0 *)y + b;
            o->d = dh;
            memcpy(o->qs, qs, sizeof qs);
        }
    }
}
