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
    FM_DTYPE_COUNT,
} fm_dtype;

/* ggml type ids as stored in GGUF tensor infos. */
enum {
    FM_GGML_TYPE_F32 = 0,
    FM_GGML_TYPE_F16 = 1,
    FM_GGML_TYPE_Q8_0 = 8,
    FM_GGML_TYPE_BF16 = 30,
};

#define FM_QK8_0 32
/* Q8_0: 32 weights = f16 scale d + 32 int8 q; w = d * q. */
typedef struct {
    uint16_t d;
    int8_t qs[FM_QK8_0];
} fm_block_q8_0;
static_assert(sizeof(fm_block_q8_0) == 34, "Q8_0 block must be 34 bytes, as in GGUF");

/* Maps a ggml type id to our dtype; returns -1 for types we do not support. */
int fm_dtype_from_ggml(uint32_t ggml_type, fm_dtype *out);
uint32_t fm_dtype_to_ggml(fm_dtype t);
const char *fm_dtype_name(fm_dtype t);
/* Parses "f32", "f16", "bf16", "q8_0" (case-insensitive); -1 when unknown. */
int fm_dtype_parse(const char *name, fm_dtype *out);
/* Elements per block (1 for float types, 32 for Q8_0) and bytes per block. */
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
