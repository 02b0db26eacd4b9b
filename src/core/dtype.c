#include "core/dtype.h"

#include <ctype.h>
#include <math.h>

int fm_dtype_from_ggml(uint32_t ggml_type, fm_dtype *out) {
    switch (ggml_type) {
    case FM_GGML_TYPE_F32:
        *out = FM_DTYPE_F32;
        return 0;
    case FM_GGML_TYPE_F16:
        *out = FM_DTYPE_F16;
        return 0;
    case FM_GGML_TYPE_BF16:
        *out = FM_DTYPE_BF16;
        return 0;
    case FM_GGML_TYPE_Q8_0:
        *out = FM_DTYPE_Q8_0;
        return 0;
    case FM_GGML_TYPE_Q4_K:
        *out = FM_DTYPE_Q4_K;
        return 0;
    case FM_GGML_TYPE_Q5_K:
        *out = FM_DTYPE_Q5_K;
        return 0;
    case FM_GGML_TYPE_Q6_K:
        *out = FM_DTYPE_Q6_K;
        return 0;
    case FM_GGML_TYPE_Q4_0:
        *out = FM_DTYPE_Q4_0;
        return 0;
    case FM_GGML_TYPE_Q5_0:
        *out = FM_DTYPE_Q5_0;
        return 0;
    default:
        return -1;
    }
}

uint32_t fm_dtype_to_ggml(fm_dtype t) {
    static const uint32_t ids[FM_DTYPE_COUNT] = {
        [FM_DTYPE_F32] = FM_GGML_TYPE_F32,   [FM_DTYPE_F16] = FM_GGML_TYPE_F16,
        [FM_DTYPE_BF16] = FM_GGML_TYPE_BF16, [FM_DTYPE_Q8_0] = FM_GGML_TYPE_Q8_0,
        [FM_DTYPE_Q4_K] = FM_GGML_TYPE_Q4_K, [FM_DTYPE_Q5_K] = FM_GGML_TYPE_Q5_K,
        [FM_DTYPE_Q6_K] = FM_GGML_TYPE_Q6_K, [FM_DTYPE_Q4_0] = FM_GGML_TYPE_Q4_0,
        [FM_DTYPE_Q5_0] = FM_GGML_TYPE_Q5_0,
    };
    return ids[t];
}

const char *fm_dtype_name(fm_dtype t) {
    static const char *names[FM_DTYPE_COUNT] = {
        [FM_DTYPE_F32] = "f32",   [FM_DTYPE_F16] = "f16",   [FM_DTYPE_BF16] = "bf16",
        [FM_DTYPE_Q8_0] = "q8_0", [FM_DTYPE_Q4_K] = "q4_k", [FM_DTYPE_Q5_K] = "q5_k",
        [FM_DTYPE_Q6_K] = "q6_k", [FM_DTYPE_Q4_0] = "q4_0", [FM_DTYPE_Q5_0] = "q5_0"};
    return (unsigned)t < FM_DTYPE_COUNT ? names[t] : "?";
}

int fm_dtype_parse(const char *name, fm_dtype *out) {
    for (int t = 0; t < FM_DTYPE_COUNT; t++) {
        const char *a = fm_dtype_name((fm_dtype)t), *b = name;
        while (*a && *b && tolower((unsigned char)*b) == *a) a++, b++;
        if (!*a && !*b) {
            *out = (fm_dtype)t;
            return 0;
        }
    }
    return -1;
}

int fm_dtype_block_elems(fm_dtype t) {
    if (t == FM_DTYPE_Q8_0 || fm_dtype_is_legacy_quant(t)) return FM_QK8_0;
    return fm_dtype_is_k_quant(t) ? FM_QK_K : 1;
}

int fm_dtype_block_bytes(fm_dtype t) {
    static const int bytes[FM_DTYPE_COUNT] = {
        [FM_DTYPE_F32] = 4,
        [FM_DTYPE_F16] = 2,
        [FM_DTYPE_BF16] = 2,
        [FM_DTYPE_Q8_0] = sizeof(fm_block_q8_0),
        [FM_DTYPE_Q4_K] = sizeof(fm_block_q4_K),
        [FM_DTYPE_Q5_K] = sizeof(fm_block_q5_K),
        [FM_DTYPE_Q6_K] = sizeof(fm_block_q6_K),
        [FM_DTYPE_Q4_0] = sizeof(fm_block_q4_0),
        [FM_DTYPE_Q5_0] = sizeof(fm_block_q5_0),
    };
    return bytes[t];
}

size_t fm_dtype_row_bytes(fm_dtype t, int64_t n) {
    int be = fm_dtype_block_elems(t);
    if (n < 0 || n % be) return 0;
    return (size_t)(n / be) * (size_t)fm_dtype_block_bytes(t);
}

/* IEEE half <-> single by bit manipulation, so results do not depend on F16C being present. */
float fm_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: renormalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400u));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t fm_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    int32_t exp = (int32_t)((u >> 23) & 0xffu) - 127 + 15;
    uint32_t man = u & 0x7fffffu;
    if (((u >> 23) & 0xffu) == 0xffu) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)exp << 10) | (man >> 13), rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) half++; /* may carry into the exponent: correct */
    return (uint16_t)half;
}
