/* gguf_writer.c: writes GGUF v3 files (synthetic models, test fixtures).
 * Layout: header, metadata in insertion order, tensor infos in insertion order, padding, then each tensor's
 * data at the next multiple of the alignment (32, or general.alignment when that is set to a power-of-two
 * uint32; any other general.alignment value is written as given but the layout stays at 32, which lets tests
 * produce files a reader must refuse).
 * Output streams through a buffered FILE* into "<path>.tmp.XXXXXX" in the same directory, then fsync and
 * rename, so a crash never leaves a half-written model under the final name. Tensors given by a fill callback
 * are produced one at a time into one reused buffer as large as the largest such tensor.
 * Setters return nothing: an allocation failure is remembered and reported by gguf_writer_write. */
#include "io/gguf.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

#define WRITER_ALIGNMENT 32

typedef struct {
    char *key;
    gguf_type type;
    uint8_t scalar[8];  /* scalar value bytes */
    char *str;          /* STRING (NUL-terminated copy) */
    gguf_type arr_type; /* ARRAY */
    uint64_t n;         /* ARRAY element count */
    void *arr;          /* numeric ARRAY: [n * type size] bytes */
    char **strs;        /* STRING ARRAY: [n] copies */
} wkv;

typedef struct {
    char *name;
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    fm_dtype dtype;
    uint64_t size;
    const void *data; /* or fill */
    gguf_fill_fn fill;
    void *ctx;
    uint64_t offset; /* in the data section, set at write time */
} wtensor;

struct gguf_writer {
    wkv *kv; /* [n_kv] */
    size_t n_kv, cap_kv;
    wtensor *t; /* [n_t] */
    size_t n_t, cap_t;
    int oom; /* a setter could not allocate */
};

gguf_writer *gguf_writer_create(void) {
    return calloc(1, sizeof(gguf_writer));
}

static void kv_clear(wkv *kv) {
    free(kv->str);
    free(kv->arr);
    if (kv->strs)
        for (uint64_t i = 0; i < kv->n; i++) free(kv->strs[i]);
    free(kv->strs);
    kv->str = NULL;
    kv->arr = NULL;
    kv->strs = NULL;
    kv->n = 0;
}

void gguf_writer_free(gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        kv_clear(&w->kv[i]);
        free(w->kv[i].key);
    }
    for (size_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->kv);
    free(w->t);
    free(w);
}

/* The entry for key, emptied for a new value (setting a key twice keeps its first position). */
static wkv *kv_slot(gguf_writer *w, const char *key) {
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kv[i].key, key) == 0) {
            kv_clear(&w->kv[i]);
            return &w->kv[i];
        }
    }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? w->cap_kv * 2 : 32;
        wkv *kv = realloc(w->kv, cap * sizeof *kv);
        if (!kv) return NULL;
        w->kv = kv;
        w->cap_kv = cap;
    }
    wkv *kv = &w->kv[w->n_kv];
    memset(kv, 0, sizeof *kv);
    kv->key = strdup(key);
    if (!kv->key) return NULL;
    w->n_kv++;
    return kv;
}

static void set_scalar(gguf_writer *w, const char *key, gguf_type t, const void *v) {
    wkv *kv = kv_slot(w, key);
    if (!kv) {
        w->oom = 1;
        return;
    }
    kv->type = t;
    memcpy(kv->scalar, v, gguf_type_size(t));
}

void gguf_writer_set_val(gguf_writer *w, const char *key, gguf_type type, const void *v) {
    if (gguf_type_size(type) == 0) { /* STRING, ARRAY or not a type: reported at write time */
        w->oom = 1;
        return;
    }
    set_scalar(w, key, type, v);
}

void gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v) {
    set_scalar(w, key, GGUF_TYPE_UINT32, &v);
}
void gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v) {
    set_scalar(w, key, GGUF_TYPE_INT32, &v);
}
void gguf_writer_set_f32(gguf_writer *w, const char *key, float v) {
    set_scalar(w, key, GGUF_TYPE_FLOAT32, &v);
}

void gguf_writer_set_bool(gguf_writer *w, const char *key, int v) {
    uint8_t b = v != 0;
    set_scalar(w, key, GGUF_TYPE_BOOL, &b);
}

void gguf_writer_set_str(gguf_writer *w, const char *key, const char *v) {
    wkv *kv = kv_slot(w, key);
    if (!kv || !(kv->str = strdup(v))) {
        w->oom = 1;
        return;
    }
    kv->type = GGUF_TYPE_STRING;
}

void gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *v, uint64_t n) {
    wkv *kv = kv_slot(w, key);
    if (!kv || !(kv->strs = calloc(n ? n : 1, sizeof *kv->strs))) {
        w->oom = 1;
        return;
    }
    kv->type = GGUF_TYPE_ARRAY;
    kv->arr_type = GGUF_TYPE_STRING;
    kv->n = n;
    for (uint64_t i = 0; i < n; i++)
        if (!(kv->strs[i] = strdup(v[i]))) w->oom = 1;
}

void gguf_writer_set_arr_data(gguf_writer *w, const char *key, gguf_type elem_type, const void *v,
                              uint64_t n) {
    size_t es = gguf_type_size(elem_type), bytes;
    wkv *kv = kv_slot(w, key);
    if (!kv || es == 0 || __builtin_mul_overflow((size_t)n, es, &bytes) ||
        !(kv->arr = malloc(bytes ? bytes : 1))) {
        w->oom = 1; /* es == 0: not a numeric type; reported as a failure at write time */
        return;
    }
    kv->type = GGUF_TYPE_ARRAY;
    kv->arr_type = elem_type;
    kv->n = n;
    if (bytes) memcpy(kv->arr, v, bytes);
}

static int add_tensor(gguf_writer *w, const char *name, uint32_t n_dims, const int64_t *ne, fm_dtype dtype,
                      const void *data, int check_size, size_t size, gguf_fill_fn fill, void *ctx, char *err,
                      size_t errlen) {
    if (!name || !*name) return fm_set_error(err, errlen, "gguf writer: tensor with an empty name");
    if ((unsigned)dtype >= FM_DTYPE_COUNT)
        return fm_set_error(err, errlen, "gguf writer: tensor %s: invalid dtype %d", name, (int)dtype);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return fm_set_error(err, errlen, "gguf writer: tensor %s: n_dims %u is out of range (1..%d)", name,
                            n_dims, GGUF_MAX_DIMS);
    uint64_t nelem = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] < 1)
            return fm_set_error(err, errlen,
                                "gguf writer: tensor %s: dimension %u is %" PRId64 " (must be >= 1)", name, d,
                                ne[d]);
        if (__builtin_mul_overflow(nelem, (uint64_t)ne[d], &nelem))
            return fm_set_error(err, errlen, "gguf writer: tensor %s: element count overflows", name);
    }
    int be = fm_dtype_block_elems(dtype);
    if (ne[0] % be)
        return fm_set_error(err, errlen,
                            "gguf writer: tensor %s: first dimension %" PRId64
                            " is not a multiple of the %s block size %d",
                            name, ne[0], fm_dtype_name(dtype), be);
    uint64_t bytes;
    if (__builtin_mul_overflow(nelem / (uint64_t)be, (uint64_t)fm_dtype_block_bytes(dtype), &bytes) ||
        bytes > SIZE_MAX)
        return fm_set_error(err, errlen, "gguf writer: tensor %s: byte size overflows", name);
    if (check_size && bytes != size)
        return fm_set_error(err, errlen,
                            "gguf writer: tensor %s: %zu bytes given, its shape and type need %" PRIu64, name,
                            size, bytes);
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return fm_set_error(err, errlen, "gguf writer: duplicate tensor name %s", name);
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? w->cap_t * 2 : 64;
        wtensor *t = realloc(w->t, cap * sizeof *t);
        if (!t) return fm_set_error(err, errlen, "gguf writer: out of memory");
        w->t = t;
        w->cap_t = cap;
    }
    wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return fm_set_error(err, errlen, "gguf writer: out of memory");
    t->n_dims = n_dims;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->dtype = dtype;
    t->size = bytes;
    t->data = data;
    t->fill = fill;
    t->ctx = ctx;
    w->n_t++;
    return 0;
}

int gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t n_dims, const int64_t *ne,
                           fm_dtype dtype, const void *data, size_t size, char *err, size_t errlen) {
    return add_tensor(w, name, n_dims, ne, dtype, data, 1, size, NULL, NULL, err, errlen);
}

int gguf_writer_add_tensor_fn(gguf_writer *w, const char *name, uint32_t n_dims, const int64_t *ne,
                              fm_dtype dtype, gguf_fill_fn fill, void *ctx, char *err, size_t errlen) {
    if (!fill)
        return fm_set_error(err, errlen, "gguf writer: tensor %s: no fill function", name ? name : "?");
    return add_tensor(w, name, n_dims, ne, dtype, NULL, 0, 0, fill, ctx, err, errlen);
}

/* ---- serialisation ---- */

typedef struct {
    FILE *fp;
    uint64_t pos; /* bytes written so far */
    int failed;
} sink;

static void put(sink *s, const void *p, size_t n) {
    if (s->failed || n == 0) return;
    if (fwrite(p, 1, n, s->fp) != n) s->failed = 1;
    s->pos += n;
}

static void put_u32(sink *s, uint32_t v) {
    put(s, &v, 4);
}
static void put_u64(sink *s, uint64_t v) {
    put(s, &v, 8);
}

static void put_str(sink *s, const char *str) {
    size_t n = strlen(str);
    put_u64(s, n);
    put(s, str, n);
}

static void put_pad(sink *s, uint64_t align) {
    static const uint8_t zeros[256];
    uint64_t pad = (align - s->pos % align) % align;
    while (pad) {
        size_t n = pad < sizeof zeros ? (size_t)pad : sizeof zeros;
        put(s, zeros, n);
        pad -= n;
    }
}

static void put_kv(sink *s, const wkv *kv) {
    put_str(s, kv->key);
    put_u32(s, (uint32_t)kv->type);
    if (kv->type == GGUF_TYPE_STRING) {
        put_str(s, kv->str);
    } else if (kv->type == GGUF_TYPE_ARRAY) {
        put_u32(s, (uint32_t)kv->arr_type);
        put_u64(s, kv->n);
        if (kv->arr_type == GGUF_TYPE_STRING) {
            for (uint64_t i = 0; i < kv->n; i++) put_str(s, kv->strs[i]);
        } else {
            put(s, kv->arr, (size_t)kv->n * gguf_type_size(kv->arr_type));
        }
    } else {
        put(s, kv->scalar, gguf_type_size(kv->type));
    }
}

static uint64_t layout_alignment(const gguf_writer *w) {
    for (size_t i = 0; i < w->n_kv; i++) {
        const wkv *kv = &w->kv[i];
        if (strcmp(kv->key, "general.alignment") == 0 && kv->type == GGUF_TYPE_UINT32) {
            uint32_t a;
            memcpy(&a, kv->scalar, 4);
            if (a && !(a & (a - 1))) return a;
        }
    }
    return WRITER_ALIGNMENT;
}

static int write_all(gguf_writer *w, FILE *fp, const char *path, char *err, size_t errlen) {
    sink s = {fp, 0, 0};
    uint64_t align = layout_alignment(w), off = 0, max_fill = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        wtensor *t = &w->t[i];
        off = (off + align - 1) / align * align;
        t->offset = off;
        off += t->size;
        if (t->fill && t->size > max_fill) max_fill = t->size;
    }
    put(&s, "GGUF", 4);
    put_u32(&s, 3);
    put_u64(&s, w->n_t);
    put_u64(&s, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) put_kv(&s, &w->kv[i]);
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        put_str(&s, t->name);
        put_u32(&s, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) put_u64(&s, (uint64_t)t->ne[d]);
        put_u32(&s, fm_dtype_to_ggml(t->dtype));
        put_u64(&s, t->offset);
    }
    put_pad(&s, align);
    uint64_t data_start = s.pos;
    void *buf = NULL;
    if (max_fill && !(buf = malloc((size_t)max_fill)))
        return fm_set_error(err, errlen, "%s: out of memory for a %" PRIu64 "-byte tensor buffer", path,
                            max_fill);
    for (size_t i = 0; i < w->n_t && !s.failed; i++) {
        const wtensor *t = &w->t[i];
        put_pad(&s, align);
        if (s.pos - data_start != t->offset) { /* cannot happen: the layout above is the same arithmetic */
            free(buf);
            return fm_set_error(err, errlen, "%s: internal error: tensor %s lands at the wrong offset", path,
                                t->name);
        }
        if (t->fill) {
            t->fill(t->ctx, buf, (size_t)t->size);
            put(&s, buf, (size_t)t->size);
        } else {
            put(&s, t->data, (size_t)t->size);
        }
    }
    free(buf);
    if (s.failed || fflush(fp) != 0)
        return fm_set_error(err, errlen, "%s: write failed: %s", path, strerror(errno));
    return 0;
}

int gguf_writer_write(gguf_writer *w, const char *path, char *err, size_t errlen) {
    if (w->oom)
        return fm_set_error(err, errlen,
                            "%s: a metadata value could not be stored (out of memory, or a setter "
                            "was given a type it does not take)",
                            path);
    size_t n = strlen(path);
    char *tmp = malloc(n + 16);
    if (!tmp) return fm_set_error(err, errlen, "%s: out of memory", path);
    snprintf(tmp, n + 16, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        int e = errno;
        free(tmp);
        return fm_set_error(err, errlen, "%s: cannot create a temporary file beside it: %s", path,
                            strerror(e));
    }
    (void)fchmod(fd, 0644); /* mkstemp makes 0600; a model file is meant to be shared */
    FILE *fp = fdopen(fd, "wb");
    if (!fp) {
        int e = errno;
        close(fd);
        unlink(tmp);
        free(tmp);
        return fm_set_error(err, errlen, "%s: cannot open a stream: %s", path, strerror(e));
    }
    setvbuf(fp, NULL, _IOFBF, 1 << 20);
    int rc = write_all(w, fp, path, err, errlen);
    if (rc == 0 && fsync(fileno(fp)) != 0)
        rc = fm_set_error(err, errlen, "%s: fsync failed: %s", path, strerror(errno));
    if (fclose(fp) != 0 && rc == 0)
        rc = fm_set_error(err, errlen, "%s: close failed: %s", path, strerror(errno));
    if (rc == 0 && rename(tmp, path) != 0)
        rc = fm_set_error(err, errlen, "%s: cannot rename the temporary file into place: %s", path,
                          strerror(errno));
    if (rc != 0) unlink(tmp);
    free(tmp);
    return rc;
}
