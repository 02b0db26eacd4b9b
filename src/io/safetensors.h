/* safetensors.h: a read-only safetensors reader over mmap, and a writer for synthetic files.
 * Layout: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}, ...,
 * "__metadata__": {...}}, then the data section; data_offsets are [begin, end) relative to it.
 * Everything is validated when the file is opened (length bounds, JSON, dtype names, rank <= 4, element
 * counts without overflow, offsets inside the data section, size == dtype x shape, no overlaps, no
 * duplicate names); afterwards the accessors are plain lookups. Tensor data points into the mapping. */
#ifndef FM_IO_SAFETENSORS_H
#define FM_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

#define ST_MAX_DIMS 4
/* Headers larger than this are refused (the real drafter's is ~20 KB). */
#define ST_MAX_HEADER_BYTES (100u * 1000u * 1000u)

typedef struct {
    const char *name;           /* NUL-terminated, owned by the file handle */
    char dtype_name[12];        /* as written in the header: "BF16", "F32", "I64", ... */
    int supported;              /* 1 when dtype is one of F32 / F16 / BF16 */
    fm_dtype dtype;             /* valid when supported */
    int n_dims;                 /* 0 .. ST_MAX_DIMS */
    int64_t shape[ST_MAX_DIMS]; /* shape[0] outermost (row-major, as torch) */
    int64_t n_elems;
    uint64_t offset;  /* begin, relative to the data section */
    uint64_t size;    /* bytes */
    const void *data; /* into the mapping; aligned only as well as the file is */
} st_tensor;

typedef struct st_file st_file;

/* Opens and validates the whole file; NULL and one line naming the file on failure. */
st_file *st_open(const char *path, char *err, size_t errlen);
/* Validates an in-memory image (fuzzing, tests); the buffer must outlive the handle. */
st_file *st_open_memory(const void *data, size_t size, const char *name, char *err, size_t errlen);
void st_close(st_file *f);

const char *st_path(const st_file *f);
/* Tensors in name order. */
int64_t st_n_tensors(const st_file *f);
const st_tensor *st_tensor_at(const st_file *f, int64_t i);
const st_tensor *st_find(const st_file *f, const char *name); /* NULL when absent */

/* ---- Writing (synthetic drafters, tests) ---- */
typedef struct st_writer st_writer;
/* Produces `size` bytes of a tensor at write time. */
typedef void (*st_fill_fn)(void *ctx, void *dst, size_t size);

st_writer *st_writer_create(void);
void st_writer_free(st_writer *w);
/* Tensors are laid out in the order they are added. data is NOT copied: it must stay valid until
 * st_writer_write returns. Shapes are outermost first. */
int st_writer_add(st_writer *w, const char *name, fm_dtype dtype, int n_dims, const int64_t *shape,
                  const void *data, char *err, size_t errlen);
int st_writer_add_fn(st_writer *w, const char *name, fm_dtype dtype, int n_dims, const int64_t *shape,
                     st_fill_fn fill, void *ctx, char *err, size_t errlen);
/* Writes via a temporary file and rename; the header is padded with spaces to a multiple of 8 bytes so
 * every tensor is aligned to its element size. */
int st_writer_write(st_writer *w, const char *path, char *err, size_t errlen);

/* "BF16" / "F16" / "F32" for a float dtype (NULL for others). */
const char *st_dtype_name(fm_dtype t);

#endif
