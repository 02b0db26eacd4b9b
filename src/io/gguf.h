/* gguf.h: a read-only GGUF (v2, v3) reader over mmap. Every count, length, offset, dimension and type is
 * checked against the file size with overflow-safe arithmetic when the file is opened; afterwards all
 * accessors are plain lookups that cannot read out of bounds. Nothing is copied: strings and tensor data
 * point into the mapping, which lives until gguf_close. */
#ifndef FM_IO_GGUF_H
#define FM_IO_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/threadpool.h"

typedef enum {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT,
} gguf_type;

#define GGUF_MAX_DIMS 4

typedef struct {
    const char *ptr; /* not NUL-terminated */
    uint64_t len;
} gguf_str;

typedef struct {
    gguf_str name;
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the innermost (contiguous) dimension, as in ggml */
    uint32_t ggml_type;
    fm_dtype dtype;   /* valid when supported != 0 */
    int supported;    /* 1 when ggml_type is one of fm_dtype */
    uint64_t offset;  /* relative to the data section */
    uint64_t size;    /* bytes */
    const void *data; /* into the mapping */
} gguf_tensor;

typedef struct gguf_file gguf_file;

/* Opens and validates the whole file. On failure returns NULL and writes one line naming the file. */
gguf_file *gguf_open(const char *path, char *err, size_t errlen);
/* Validates an in-memory image (fuzzing, tests); the buffer must outlive the returned handle. */
gguf_file *gguf_open_memory(const void *data, size_t size, const char *name, char *err, size_t errlen);
void gguf_close(gguf_file *f);
/* Moves an opened file's image into anonymous huge pages at the same addresses (fm_mmap_make_resident);
 * 1 when done, 0 when it stays mapped from the file (always for gguf_open_memory). */
int gguf_make_resident(gguf_file *f, fm_pool *pool);
/* fm_mmap_set_writable on a resident image: 0, or -1 when it is not resident. */
int gguf_set_writable(gguf_file *f, int writable);

const char *gguf_path(const gguf_file *f);
uint32_t gguf_version(const gguf_file *f);
uint64_t gguf_alignment(const gguf_file *f);

/* Metadata. gguf_find_key returns the index or -1. */
int64_t gguf_n_kv(const gguf_file *f);
int64_t gguf_find_key(const gguf_file *f, const char *key);
gguf_str gguf_kv_key(const gguf_file *f, int64_t i);
gguf_type gguf_kv_type(const gguf_file *f, int64_t i);
/* For arrays: the element type and count (arrays of arrays are accepted by the reader and reported as
 * GGUF_TYPE_ARRAY; their elements cannot be read through these accessors). */
gguf_type gguf_kv_array_type(const gguf_file *f, int64_t i);
uint64_t gguf_kv_array_len(const gguf_file *f, int64_t i);

/* Typed getters by key. They return 0 on success, and -1 with one clear line (file, key, expected type vs
 * found) when the key is missing or has another type. The integer getters accept any integer type whose value
 * fits; the float getter accepts FLOAT32 and FLOAT64. */
int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, char *err, size_t errlen);
int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out, char *err, size_t errlen);
int gguf_get_f32(const gguf_file *f, const char *key, float *out, char *err, size_t errlen);
int gguf_get_bool(const gguf_file *f, const char *key, int *out, char *err, size_t errlen);
int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out, char *err, size_t errlen);

/* Array elements by key: element i of a STRING array; or a numeric array as a typed pointer into the file
 * (element type must match exactly; the pointer may be unaligned: read with memcpy). */
int gguf_get_arr_str(const gguf_file *f, const char *key, uint64_t i, gguf_str *out, char *err,
                     size_t errlen);
int gguf_get_arr_data(const gguf_file *f, const char *key, gguf_type elem_type, const void **data,
                      uint64_t *n, char *err, size_t errlen);
/* Number of elements of an array of any type; -1 and an error when key is missing or not an array. */
int gguf_get_arr_len(const gguf_file *f, const char *key, uint64_t *n, char *err, size_t errlen);

/* Tensors. */
int64_t gguf_n_tensors(const gguf_file *f);
const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name); /* NULL when absent */

/* 1 when s equals the C string c. */
int gguf_str_eq(gguf_str s, const char *c);

/* Names and sizes, for messages and tools: "uint32", "string", "array"...; "?" for an unknown type.
 * gguf_type_size is the byte size of a scalar type (0 for STRING, ARRAY and unknown types). */
const char *gguf_type_name(gguf_type t);
size_t gguf_type_size(gguf_type t);
/* ggml tensor type name ("f32", "q8_0", "q4_K", ...; "unknown" when the id is not a ggml type), so that a
 * loader can say which unsupported type a tensor has. */
const char *gguf_ggml_type_name(uint32_t ggml_type);

/* ---- Writing (synthetic models, tests) ---- */
typedef struct gguf_writer gguf_writer;

gguf_writer *gguf_writer_create(void);
void gguf_writer_free(gguf_writer *w);
void gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v);
void gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v);
void gguf_writer_set_f32(gguf_writer *w, const char *key, float v);
void gguf_writer_set_bool(gguf_writer *w, const char *key, int v);
void gguf_writer_set_str(gguf_writer *w, const char *key, const char *v);
/* Any scalar type (not STRING or ARRAY): v points at one value of that type. */
void gguf_writer_set_val(gguf_writer *w, const char *key, gguf_type type, const void *v);
/* Arrays are copied. */
void gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *v, uint64_t n);
void gguf_writer_set_arr_data(gguf_writer *w, const char *key, gguf_type elem_type, const void *v,
                              uint64_t n);
/* ne[0] innermost. data (size bytes, must equal the size the type and shape imply) is NOT copied: it must
 * stay valid until gguf_writer_write returns. */
int gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t n_dims, const int64_t *ne,
                           fm_dtype dtype, const void *data, size_t size, char *err, size_t errlen);
/* The same, with the bytes produced at write time by fill(ctx, dst, size) (multi-GB synthetic models are
 * generated tensor by tensor instead of held in memory at once). */
typedef void (*gguf_fill_fn)(void *ctx, void *dst, size_t size);
int gguf_writer_add_tensor_fn(gguf_writer *w, const char *name, uint32_t n_dims, const int64_t *ne,
                              fm_dtype dtype, gguf_fill_fn fill, void *ctx, char *err, size_t errlen);
/* Writes GGUF v3 with alignment 32 to path via a temporary file and rename, so no half-written model is
 * ever left under the final name. */
int gguf_writer_write(gguf_writer *w, const char *path, char *err, size_t errlen);

#endif
