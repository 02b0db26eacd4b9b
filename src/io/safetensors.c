/* safetensors.c: validating safetensors reader (mmap + cJSON) and a writer with temp file + rename.
 * Invariant after st_open: every tensor's [offset, offset + size) lies inside the data section, size equals
 * the dtype's element size times the element count, no two tensors overlap, and names are unique. */
#include "io/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

struct st_file {
    char *path;
    void *map; /* the mmap, or NULL for a memory image */
    size_t map_size;
    int64_t n;
    st_tensor *t; /* [n], sorted by name */
};

/* Element sizes of the dtypes the format defines; only F32/F16/BF16 can be used by the engine. */
static const struct {
    const char *name;
    int bytes;
    int fm; /* fm_dtype or -1 */
} st_dtypes[] = {
    {"F32", 4, FM_DTYPE_F32},
    {"F16", 2, FM_DTYPE_F16},
    {"BF16", 2, FM_DTYPE_BF16},
    {"F64", 8, -1},
    {"I64", 8, -1},
    {"I32", 4, -1},
    {"I16", 2, -1},
    {"I8", 1, -1},
    {"U64", 8, -1},
    {"U32", 4, -1},
    {"U16", 2, -1},
    {"U8", 1, -1},
    {"BOOL", 1, -1},
    {"F8_E4M3", 1, -1},
    {"F8_E5M2", 1, -1},
};

const char *st_dtype_name(fm_dtype t) {
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (st_dtypes[i].fm == (int)t) return st_dtypes[i].name;
    return NULL;
}

void st_close(st_file *f) {
    if (!f) return;
    for (int64_t i = 0; i < f->n; i++) free((char *)f->t[i].name);
    free(f->t);
    if (f->map) munmap(f->map, f->map_size);
    free(f->path);
    free(f);
}

const char *st_path(const st_file *f) {
    return f->path;
}
int64_t st_n_tensors(const st_file *f) {
    return f->n;
}
const st_tensor *st_tensor_at(const st_file *f, int64_t i) {
    return i >= 0 && i < f->n ? &f->t[i] : NULL;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

static int cmp_offset(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

const st_tensor *st_find(const st_file *f, const char *name) {
    st_tensor key = {.name = name};
    return bsearch(&key, f->t, (size_t)f->n, sizeof *f->t, cmp_name);
}

/* A JSON number that is a non-negative integer exactly representable as a double (< 2^53). */
static int json_u53(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0 && d < 9007199254740992.0) || d != floor(d)) return -1;
    *out = (uint64_t)d;
    return 0;
}

/* Parses one header entry into t (name not yet set). */
static int parse_entry(const char *path, const char *name, const cJSON *e, uint64_t data_size, st_tensor *t,
                       char *err, size_t errlen) {
    if (!cJSON_IsObject(e))
        return fm_set_error(err, errlen, "%s: tensor '%s': expected a JSON object", path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt))
        return fm_set_error(err, errlen, "%s: tensor '%s': missing string 'dtype'", path, name);
    int bytes = 0;
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++) {
        if (!strcmp(dt->valuestring, st_dtypes[i].name)) {
            bytes = st_dtypes[i].bytes;
            t->supported = st_dtypes[i].fm >= 0;
            if (t->supported) t->dtype = (fm_dtype)st_dtypes[i].fm;
            snprintf(t->dtype_name, sizeof t->dtype_name, "%s", st_dtypes[i].name);
        }
    }
    if (!bytes)
        return fm_set_error(err, errlen, "%s: tensor '%s': unknown dtype '%.20s'", path, name,
                            dt->valuestring);
    if (!cJSON_IsArray(sh))
        return fm_set_error(err, errlen, "%s: tensor '%s': missing array 'shape'", path, name);
    int rank = cJSON_GetArraySize(sh);
    if (rank > ST_MAX_DIMS)
        return fm_set_error(err, errlen, "%s: tensor '%s': rank %d, expected at most %d", path, name, rank,
                            ST_MAX_DIMS);
    t->n_dims = rank;
    /* Element count, overflow-checked against the data section (no tensor can exceed it). */
    uint64_t count = 1;
    int i = 0;
    for (const cJSON *d = sh->child; d; d = d->next, i++) {
        uint64_t v;
        if (json_u53(d, &v))
            return fm_set_error(err, errlen, "%s: tensor '%s': shape[%d] is not a non-negative integer", path,
                                name, i);
        t->shape[i] = (int64_t)v;
        if (v && count > data_size / v)
            count = UINT64_MAX; /* too big for the file: caught below */
        else
            count *= v;
    }
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2)
        return fm_set_error(err, errlen, "%s: tensor '%s': 'data_offsets' must be [begin, end]", path, name);
    uint64_t b, en;
    if (json_u53(off->child, &b) || json_u53(off->child->next, &en))
        return fm_set_error(err, errlen, "%s: tensor '%s': data_offsets are not non-negative integers", path,
                            name);
    if (b > en)
        return fm_set_error(err, errlen, "%s: tensor '%s': data_offsets begin %llu > end %llu", path, name,
                            (unsigned long long)b, (unsigned long long)en);
    if (en > data_size)
        return fm_set_error(err, errlen,
                            "%s: tensor '%s': data ends at %llu, past the data section (%llu bytes)", path,
                            name, (unsigned long long)en, (unsigned long long)data_size);
    if (count == UINT64_MAX || count * (uint64_t)bytes != en - b)
        return fm_set_error(err, errlen,
                            "%s: tensor '%s': %s shape needs %s%llu bytes, data_offsets give %llu", path,
                            name, t->dtype_name, count == UINT64_MAX ? "more than " : "",
                            (unsigned long long)(count == UINT64_MAX ? data_size : count * (uint64_t)bytes),
                            (unsigned long long)(en - b));
    t->n_elems = (int64_t)count;
    t->offset = b;
    t->size = en - b;
    return 0;
}

/* Validates the image and fills f->t. */
static int st_parse(st_file *f, const uint8_t *img, size_t size, char *err, size_t errlen) {
    const char *path = f->path;
    if (size < 8)
        return fm_set_error(err, errlen, "%s: %zu bytes, too short for a safetensors header", path, size);
    /* A GGUF given where safetensors are expected (the target as -d) would otherwise read as a header length
     * of ~14 GB */
    if (!memcmp(img, "GGUF", 4)) return fm_set_error(err, errlen, "%s: a GGUF file, not safetensors", path);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | img[i];
    if (hlen > ST_MAX_HEADER_BYTES)
        return fm_set_error(
            err, errlen,
            "%s: not a safetensors file (its first 8 bytes give a header length of %llu, more "
            "than the %u allowed)",
            path, (unsigned long long)hlen, ST_MAX_HEADER_BYTES);
    if (hlen > size - 8)
        return fm_set_error(err, errlen,
                            "%s: header length %llu exceeds the file (%zu bytes after the length)", path,
                            (unsigned long long)hlen, size - 8);
    if (hlen < 2)
        return fm_set_error(err, errlen, "%s: header length %llu, expected a JSON object", path,
                            (unsigned long long)hlen);
    const uint8_t *data = img + 8 + hlen;
    uint64_t data_size = size - 8 - hlen;
    const char *json = (const char *)img + 8, *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, (size_t)hlen, &end, 0);
    /* Writers pad the header with spaces; anything else after the object is corruption. */
    for (const char *p = end; root && p < json + hlen; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(root);
            return fm_set_error(err, errlen, "%s: header has bytes after its JSON object at offset %ld", path,
                                (long)(p - json));
        }
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return fm_set_error(err, errlen, "%s: header is not a JSON object", path);
    }
    int n = 0;
    for (const cJSON *e = root->child; e; e = e->next) n++;
    f->t = calloc(n ? (size_t)n : 1, sizeof *f->t);
    if (!f->t) {
        cJSON_Delete(root);
        return fm_set_error(err, errlen, "%s: out of memory for %d tensors", path, n);
    }
    int rc = 0;
    for (const cJSON *e = root->child; e && !rc; e = e->next) {
        const char *name = e->string ? e->string : "";
        if (!strcmp(name, "__metadata__")) continue; /* free-form; ignored */
        st_tensor *t = &f->t[f->n];
        rc = parse_entry(path, name, e, data_size, t, err, errlen);
        if (rc) break;
        t->name = strdup(name);
        if (!t->name) rc = fm_set_error(err, errlen, "%s: out of memory", path);
        t->data = data + t->offset;
        f->n++;
    }
    cJSON_Delete(root);
    if (rc) return rc;
    qsort(f->t, (size_t)f->n, sizeof *f->t, cmp_name);
    for (int64_t i = 1; i < f->n; i++)
        if (!strcmp(f->t[i].name, f->t[i - 1].name))
            return fm_set_error(err, errlen, "%s: tensor '%s' appears twice in the header", path,
                                f->t[i].name);
    /* Overlaps: sort views by offset; each must begin at or after the previous end (empty tensors never
     * overlap anything). */
    const st_tensor **by = malloc((f->n ? (size_t)f->n : 1) * sizeof *by);
    if (!by) return fm_set_error(err, errlen, "%s: out of memory", path);
    int64_t m = 0;
    for (int64_t i = 0; i < f->n; i++)
        if (f->t[i].size) by[m++] = &f->t[i];
    qsort(by, (size_t)m, sizeof *by, cmp_offset);
    for (int64_t i = 1; i < m && !rc; i++)
        if (by[i]->offset < by[i - 1]->offset + by[i - 1]->size)
            rc = fm_set_error(err, errlen, "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap",
                              path, by[i - 1]->name, (unsigned long long)by[i - 1]->offset,
                              (unsigned long long)(by[i - 1]->offset + by[i - 1]->size), by[i]->name,
                              (unsigned long long)by[i]->offset,
                              (unsigned long long)(by[i]->offset + by[i]->size));
    free(by);
    return rc;
}

st_file *st_open_memory(const void *data, size_t size, const char *name, char *err, size_t errlen) {
    st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(name ? name : "<memory>"))) {
        free(f);
        fm_set_error(err, errlen, "%s: out of memory", name ? name : "<memory>");
        return NULL;
    }
    if (st_parse(f, data, size, err, errlen)) {
        st_close(f);
        return NULL;
    }
    return f;
}

st_file *st_open(const char *path, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fm_set_error(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat sb;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
        close(fd);
        fm_set_error(err, errlen, "%s: not a regular file", path);
        return NULL;
    }
    size_t size = (size_t)sb.st_size;
    void *map = size ? mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (size && map == MAP_FAILED) {
        fm_set_error(err, errlen, "%s: mmap failed: %s", path, strerror(errno));
        return NULL;
    }
    static const uint8_t empty[1];
    st_file *f = st_open_memory(size ? map : empty, size, path, err, errlen);
    if (!f) {
        if (size) munmap(map, size);
        return NULL;
    }
    f->map = size ? map : NULL;
    f->map_size = size;
    return f;
}

/* ---- writer ---- */

typedef struct {
    char *name;
    fm_dtype dtype;
    int n_dims;
    int64_t shape[ST_MAX_DIMS];
    uint64_t size;
    const void *data;
    st_fill_fn fill;
    void *ctx;
} st_wtensor;

struct st_writer {
    st_wtensor *t;
    int n, cap;
};

st_writer *st_writer_create(void) {
    return calloc(1, sizeof(st_writer));
}

void st_writer_free(st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) free(w->t[i].name);
    free(w->t);
    free(w);
}

static int writer_push(st_writer *w, const char *name, fm_dtype dtype, int n_dims, const int64_t *shape,
                       const void *data, st_fill_fn fill, void *ctx, char *err, size_t errlen) {
    if (!st_dtype_name(dtype))
        return fm_set_error(err, errlen, "safetensors writer: tensor '%s': dtype %s cannot be stored", name,
                            fm_dtype_name(dtype));
    if (n_dims < 0 || n_dims > ST_MAX_DIMS)
        return fm_set_error(err, errlen, "safetensors writer: tensor '%s': rank %d, expected 0..%d", name,
                            n_dims, ST_MAX_DIMS);
    uint64_t count = 1;
    for (int i = 0; i < n_dims; i++) {
        if (shape[i] < 0 || (shape[i] && count > (UINT64_MAX >> 4) / (uint64_t)shape[i]))
            return fm_set_error(err, errlen, "safetensors writer: tensor '%s': bad shape[%d] = %lld", name, i,
                                (long long)shape[i]);
        count *= (uint64_t)shape[i];
    }
    for (int i = 0; i < w->n; i++)
        if (!strcmp(w->t[i].name, name))
            return fm_set_error(err, errlen, "safetensors writer: tensor '%s' added twice", name);
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 64;
        st_wtensor *t = realloc(w->t, (size_t)cap * sizeof *t);
        if (!t) return fm_set_error(err, errlen, "safetensors writer: out of memory");
        w->t = t;
        w->cap = cap;
    }
    st_wtensor *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return fm_set_error(err, errlen, "safetensors writer: out of memory");
    t->dtype = dtype;
    t->n_dims = n_dims;
    for (int i = 0; i < n_dims; i++) t->shape[i] = shape[i];
    t->size = count * (uint64_t)fm_dtype_block_bytes(dtype);
    t->data = data;
    t->fill = fill;
    t->ctx = ctx;
    w->n++;
    return 0;
}

int st_writer_add(st_writer *w, const char *name, fm_dtype dtype, int n_dims, const int64_t *shape,
                  const void *data, char *err, size_t errlen) {
    return writer_push(w, name, dtype, n_dims, shape, data, NULL, NULL, err, errlen);
}

int st_writer_add_fn(st_writer *w, const char *name, fm_dtype dtype, int n_dims, const int64_t *shape,
                     st_fill_fn fill, void *ctx, char *err, size_t errlen) {
    return writer_push(w, name, dtype, n_dims, shape, NULL, fill, ctx, err, errlen);
}

/* The JSON header, padded with spaces to a multiple of 8 bytes; NULL when out of memory. */
static char *writer_header(const st_writer *w, uint64_t *len) {
    cJSON *root = cJSON_CreateObject();
    uint64_t off = 0;
    for (int i = 0; root && i < w->n; i++) {
        const st_wtensor *t = &w->t[i];
        cJSON *e = cJSON_AddObjectToObject(root, t->name);
        cJSON *sh = e ? cJSON_AddArrayToObject(e, "shape") : NULL;
        cJSON *of = e ? cJSON_AddArrayToObject(e, "data_offsets") : NULL;
        if (!of || !cJSON_AddStringToObject(e, "dtype", st_dtype_name(t->dtype))) {
            cJSON_Delete(root);
            return NULL;
        }
        for (int d = 0; d < t->n_dims; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d]));
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)(off + t->size)));
        off += t->size;
    }
    char *s = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!s) return NULL;
    size_t n = strlen(s), padded = (n + 7) / 8 * 8;
    char *h = realloc(s, padded + 1);
    if (!h) {
        free(s);
        return NULL;
    }
    memset(h + n, ' ', padded - n);
    h[padded] = 0;
    *len = padded;
    return h;
}

int st_writer_write(st_writer *w, const char *path, char *err, size_t errlen) {
    uint64_t hlen = 0;
    char *header = writer_header(w, &hlen);
    if (!header) return fm_set_error(err, errlen, "%s: out of memory building the header", path);
    size_t plen = strlen(path) + 16;
    char *tmp = malloc(plen);
    if (!tmp) {
        free(header);
        return fm_set_error(err, errlen, "%s: out of memory", path);
    }
    snprintf(tmp, plen, "%s.tmp%d", path, (int)getpid());
    FILE *fp = fopen(tmp, "wb");
    int rc = 0, io_err = 0;
    if (!fp) {
        rc = fm_set_error(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
        goto done;
    }
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)(hlen >> (8 * i));
    if (fwrite(le, 1, 8, fp) != 8 || fwrite(header, 1, hlen, fp) != hlen) rc = io_err = -1;
    void *buf = NULL;
    size_t buf_size = 0;
    for (int i = 0; i < w->n && !rc; i++) {
        const st_wtensor *t = &w->t[i];
        const void *src = t->data;
        if (t->fill) {
            if (t->size > buf_size) {
                void *nb = realloc(buf, t->size ? t->size : 1);
                if (!nb) {
                    rc = fm_set_error(err, errlen, "%s: out of memory for tensor '%s'", path, t->name);
                    break;
                }
                buf = nb;
                buf_size = t->size;
            }
            t->fill(t->ctx, buf, t->size);
            src = buf;
        }
        if (t->size && fwrite(src, 1, t->size, fp) != t->size) rc = io_err = -1;
    }
    free(buf);
    if (fclose(fp) && !rc) rc = io_err = -1;
    if (io_err) fm_set_error(err, errlen, "%s: write failed: %s", tmp, strerror(errno));
    if (!rc && rename(tmp, path))
        rc = fm_set_error(err, errlen, "%s: rename failed: %s", path, strerror(errno));
    if (rc) remove(tmp);
done:
    free(tmp);
    free(header);
    return rc;
}
