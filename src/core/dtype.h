/* dtype.h: the weight types the engine reads, their GGUF ids, their row sizes, and scalar conversions.
 * Block layouts are shared by the CPU and CUDA code (plain C, no intrinsics here). */
#ifndef FM_CORE_DTYPE_H
#define FM_CORE_DTYPE_H

#include <assert.h>
#include <stdint.h>
#include <string.h>

typedef enum {
    FM_DTYPE_F32 = 0,
    FM_DTYPE_F16,
    FM_DTYPE_BF16,
    FM_DTYPE_Q8_0,
    FM_DTYPE_Q4_K,
    FM_DTYPE_Q5_K,
    FM_DTYPE_Q6_K,
    FM_DTYPE_Q4_0, /* after the others, so that no older value moves */
    FM_DTYPE_Q5_0,
    FM_DTYPE_COUNT,
} fm_dtype;

/* ggml type ids as stored in GGUF tensor infos. */
enum {
    FM_GGML_TYPE_F32 = 0,
    FM_GGML_TYPE_F16 = 1,
    FM_GGML_TYPE_Q4_0 = 2,
    FM_GGML_TYPE_Q5_0 = 6,
    FM_GGML_TYPE_Q8_0 = 8,
    FM_GGML_TYPE_Q4_K = 12,
    FM_GGML_TYPE_Q5_K = 13,
    FM_GGML_TYPE_Q6_K = 14,
    FM_GGML_TYPE_BF16 = 30,
};

#define FM_QK8_0 32
/* Q8_0: 32 weights = f16 scale d + 32 int8 q; w = d * q. */
typedef struct {
    uint16_t d;
    int8_t qs[FM_QK8_0];
} fm_block_q8_0;
static_assert(sizeof(fm_block_q8_0) == 34, "Q8_0 block must be 34 bytes, as in GGUF");

/* The legacy 4- and 5-bit types (llama.cpp's Q4_0 / Q5_0 files), blocks of 32 like Q8_0. Q4_0: f16 d and
 * 16 bytes of nibbles, weight j < 16 in the low nibble of qs[j], weight j + 16 in its high nibble;
 * w = d * (q - 8). Q5_0: the same plus a fifth bit per weight (bit j of qh, read as a little-endian uint32,
 * for weight j); w = d * (q - 16) with q in 0..31. Their products read Q8_0 activations (cpu/quant_legacy.h).
 */
#define FM_QK4_0 32
typedef struct {
    uint16_t d;
    uint8_t qs[FM_QK4_0 / 2];
} fm_block_q4_0;
static_assert(sizeof(fm_block_q4_0) == 18, "Q4_0 block must be 18 bytes, as in GGUF");

typedef struct {
    uint16_t d;
    uint8_t qh[4]; /* the fifth bits, little-endian */
    uint8_t qs[FM_QK4_0 / 2];
} fm_block_q5_0;
static_assert(sizeof(fm_block_q5_0) == 22, "Q5_0 block must be 22 bytes, as in GGUF");

/* Whether t is Q4_0 or Q5_0 (32-weight blocks, Q8_0 activations). */
static inline int fm_dtype_is_legacy_quant(int t) {
    return t == FM_DTYPE_Q4_0 || t == FM_DTYPE_Q5_0;
}

/* The K-quants (llama.cpp's Q4_K_M / Q5_K_M / Q6_K files): super-blocks of 256 weights. Q4_K and Q5_K keep
 * 8 sub-blocks of 32 with a 6-bit scale and a 6-bit min each (packed in 12 bytes, see fm_k_scale_min), so
 * w = d * sc * q - dmin * m with q in 0..15 (Q4_K) or 0..31 (Q5_K: a fifth bit in qh). Q6_K keeps 16
 * sub-blocks of 16 with an int8 scale each: w = d * sc * (q - 32), q in 0..63 (4 bits in ql, 2 in qh). */
#define FM_QK_K 256
typedef struct {
    uint16_t d, dmin;        /* f16 super-block scales of the scales and of the mins */
    uint8_t scales[12];      /* 8 scales + 8 mins, 6 bits each */
    uint8_t qs[FM_QK_K / 2]; /* 4-bit q: chunk c of 64 weights in qs[32c..32c+31], low nibbles first */
} fm_block_q4_K;
static_assert(sizeof(fm_block_q4_K) == 144, "Q4_K block must be 144 bytes, as in GGUF");

typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[FM_QK_K / 8]; /* the fifth bit: bit 2c (low nibbles) and 2c+1 (high) of byte l, for chunk c */
    uint8_t qs[FM_QK_K / 2]; /* the low 4 bits, as in Q4_K */
} fm_block_q5_K;
static_assert(sizeof(fm_block_q5_K) == 176, "Q5_K block must be 176 bytes, as in GGUF");

typedef struct {
    uint8_t ql[FM_QK_K / 2]; /* low 4 bits */
    uint8_t qh[FM_QK_K / 4]; /* high 2 bits */
    int8_t scales[FM_QK_K / 16];
    uint16_t d;
} fm_block_q6_K;
static_assert(sizeof(fm_block_q6_K) == 210, "Q6_K block must be 210 bytes, as in GGUF");

/* The activations K-quant products read (ggml's Q8_K): 256 int8 values, their f32 scale, and the sums of
 * each 16 values (what the mins and Q6_K's offset of 32 multiply). */
typedef struct {
    float d;
    int8_t qs[FM_QK_K];
    int16_t bsums[FM_QK_K / 16];
} fm_block_q8_K;
static_assert(sizeof(fm_block_q8_K) == 292, "Q8_K block must be 292 bytes, as in ggml");

/* Scale and min of sub-block j (0..7) of a Q4_K / Q5_K super-block: j < 4 in the low 6 bits of bytes j and
 * j + 4; j >= 4 in the nibbles of byte j + 4 with their top 2 bits in the top bits of bytes j - 4 and j. */
static inline void fm_k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Whether t is one of the K-quants (256-weight blocks, Q8_K activations). */
static inline int fm_dtype_is_k_quant(int t) {
    return t == FM_DTYPE_Q4_K || t == FM_DTYPE_Q5_K || t == FM_DTYPE_Q6_K;
}

/* Maps a ggml type id to our dtype; returns -1 for types we do not support. */
int fm_dtype_from_ggml(uint32_t ggml_type, fm_dtype *out);
uint32_t fm_dtype_to_ggml(fm_dtype t);
const char *fm_dtype_name(fm_dtype t);
/* Parses "f32", "f16", "bf16", "q8_0", "q4_k", "q5_k", "q6_k", "q4_0", "q5_0" (case-insensitive); -1 when
 * unknown. */
int fm_dtype_parse(const char *name, fm_dtype *out);
/* Elements per block (1 for float types, 32 for Q8_0 / Q4_0 / Q5_0, 256 for the K-quants) and bytes per
 * block. */
int fm_dtype_block_elems(fm_dtype t);
int fm_dtype_block_bytes(fm_dtype t);
/* Bytes of a row of n elements; 0 when n is not a multiple of the block size. */
size_t fm_dtype_row_bytes(fm_dtype t, int64_t n);

static inline float fm_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, NaN kept quiet (as torch and ggml do). */
static inline uint16_t fm_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float fm_f16_to_f32(uint16_t h);
uint16_t fm_f32_to_f16(float f);

#endif
