/* gguf.c: the GGUF (v2, v3) reader. gguf_open maps the file read-only; gguf_open_memory takes a caller's
 * buffer. Both run one validating pass over the whole header:
 *   magic, version, counts -> metadata (key, type, value; arrays, nested arrays) -> tensor infos -> data.
 * Invariants once a handle exists: every key, string, array and tensor range lies inside the image; no two
 * keys and no two tensor names are equal; tensors have 1..4 dims >= 1, sizes that fit in 64 bits, aligned
 * offsets and do not overlap. So the accessors below are plain lookups.
 * Every count read from the file is checked against the bytes left BEFORE anything is allocated for it
 * (a metadata entry takes >= 12 bytes, a tensor info >= 32, a string >= 8), so allocations are bounded by a
 * small multiple of the file size, whatever the header claims. */
#include "io/gguf.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/mmap_file.h"

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_ARRAY_DEPTH 8
#define GGUF_KV_MIN_BYTES 12     /* key length (8) + value type (4) */
#define GGUF_TENSOR_MIN_BYTES 32 /* name length 8 + n_dims 4 + one dim 8 + type 4 + offset 8 */

typedef struct {
    gguf_str key;
    gguf_type type;
    const uint8_t *val; /* scalar: its bytes; STRING: the length field; ARRAY: the first element */
    gguf_str str;       /* STRING */
    gguf_type arr_type; /* ARRAY: element type */
    uint64_t arr_len;   /* ARRAY: element count */
    uint64_t *str_offs; /* ARRAY of STRING: [arr_len] offsets of each element's length field from val */
} gguf_kv;

/* Open-addressing hash index over names (keys or tensor names): slot holds index + 1, 0 is empty. */
typedef struct {
    int64_t *slots; /* [cap] */
    uint64_t cap;   /* power of two, >= 2 * entries */
} name_index;

struct gguf_file {
    char *name;       /* the path or the caller's name, for messages */
    fm_mmap_file map; /* when opened from a path */
    const uint8_t *base;
    size_t size;
    uint32_t version;
    uint64_t alignment;
    int64_t n_kv;
    gguf_kv *kv; /* [n_kv] */
    int64_t n_tensors;
    gguf_tensor *tensors; /* [n_tensors] */
    uint64_t data_start;  /* absolute offset of the tensor data section */
    name_index kv_index, tensor_index;
};

/* ---- type tables ---- */

static const char *const type_names[GGUF_TYPE_COUNT] = {
    [GGUF_TYPE_UINT8] = "uint8",     [GGUF_TYPE_INT8] = "int8",     [GGUF_TYPE_UINT16] = "uint16",
    [GGUF_TYPE_INT16] = "int16",     [GGUF_TYPE_UINT32] = "uint32", [GGUF_TYPE_INT32] = "int32",
    [GGUF_TYPE_FLOAT32] = "float32", [GGUF_TYPE_BOOL] = "bool",     [GGUF_TYPE_STRING] = "string",
    [GGUF_TYPE_ARRAY] = "array",     [GGUF_TYPE_UINT64] = "uint64", [GGUF_TYPE_INT64] = "int64",
    [GGUF_TYPE_FLOAT64] = "float64",
};

static const uint8_t type_sizes[GGUF_TYPE_COUNT] = {
    [GGUF_TYPE_UINT8] = 1,  [GGUF_TYPE_INT8] = 1,  [GGUF_TYPE_UINT16] = 2,  [GGUF_TYPE_INT16] = 2,
    [GGUF_TYPE_UINT32] = 4, [GGUF_TYPE_INT32] = 4, [GGUF_TYPE_FLOAT32] = 4, [GGUF_TYPE_BOOL] = 1,
    [GGUF_TYPE_UINT64] = 8, [GGUF_TYPE_INT64] = 8, [GGUF_TYPE_FLOAT64] = 8,
};

const char *gguf_type_name(gguf_type t) {
    return (unsigned)t < GGUF_TYPE_COUNT ? type_names[t] : "?";
}
size_t gguf_type_size(gguf_type t) {
    return (unsigned)t < GGUF_TYPE_COUNT ? type_sizes[t] : 0;
}

/* ggml tensor types: elements per block and bytes per block (as ggml's type traits; ids 4, 5 and 31-33
 * are retired and unknown here). blck == 0 marks an unknown id. */
typedef struct {
    const char *name;
    uint16_t blck;
    uint16_t bytes;
} ggml_type_info;

static const ggml_type_info ggml_types[] = {
    [0] = {"f32", 1, 4},         [1] = {"f16", 1, 2},         [2] = {"q4_0", 32, 18},
    [3] = {"q4_1", 32, 20},      [6] = {"q5_0", 32, 22},      [7] = {"q5_1", 32, 24},
    [8] = {"q8_0", 32, 34},      [9] = {"q8_1", 32, 36},      [10] = {"q2_K", 256, 84},
    [11] = {"q3_K", 256, 110},   [12] = {"q4_K", 256, 144},   [13] = {"q5_K", 256, 176},
    [14] = {"q6_K", 256, 210},   [15] = {"q8_K", 256, 292},   [16] = {"iq2_xxs", 256, 66},
    [17] = {"iq2_xs", 256, 74},  [18] = {"iq3_xxs", 256, 98}, [19] = {"iq1_s", 256, 50},
    [20] = {"iq4_nl", 32, 18},   [21] = {"iq3_s", 256, 110},  [22] = {"iq2_s", 256, 82},
    [23] = {"iq4_xs", 256, 136}, [24] = {"i8", 1, 1},         [25] = {"i16", 1, 2},
    [26] = {"i32", 1, 4},        [27] = {"i64", 1, 8},        [28] = {"f64", 1, 8},
    [29] = {"iq1_m", 256, 56},   [30] = {"bf16", 1, 2},       [34] = {"tq1_0", 256, 54},
    [35] = {"tq2_0", 256, 66},   [39] = {"mxfp4", 32, 17},
};

static const ggml_type_info *ggml_type_lookup(uint32_t t) {
    if (t >= sizeof ggml_types / sizeof ggml_types[0] || ggml_types[t].blck == 0) return NULL;
    return &ggml_types[t];
}

const char *gguf_ggml_type_name(uint32_t ggml_type) {
    const ggml_type_info *ti = ggml_type_lookup(ggml_type);
    return ti ? ti->name : "unknown";
}

/* ---- small helpers ---- */

int gguf_str_eq(gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.ptr, c, n) == 0);
}

/* A name from the file made safe for a one-line message: control bytes become '?', long names are cut. */
static const char *printable(gguf_str s, char *buf, size_t cap) {
    size_t n = s.len < cap - 4 ? (size_t)s.len : cap - 4, j = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s.ptr[i];
        buf[j++] = (ch < 0x20 || ch == 0x7f) ? '?' : (char)ch;
    }
    if (n < s.len) buf[j++] = '.', buf[j++] = '.', buf[j++] = '.';
    buf[j] = 0;
    return buf;
}

static uint64_t hash_bytes(const char *p, uint64_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (uint64_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h;
}

static int str_equal(gguf_str a, gguf_str b) {
    return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, (size_t)a.len) == 0);
}

/* Builds the index; returns the index of an earlier equal name on a duplicate, -1 when all are distinct,
 * -2 when out of memory. name_at(ctx, i) yields entry i. */
static int64_t index_build(name_index *ix, int64_t n, gguf_str (*name_at)(const void *, int64_t),
                           const void *ctx, int64_t *dup_second) {
    uint64_t cap = 16;
    while (cap < (uint64_t)n * 2) cap <<= 1;
    ix->slots = calloc(cap, sizeof *ix->slots);
    if (!ix->slots) return -2;
    ix->cap = cap;
    for (int64_t i = 0; i < n; i++) {
        gguf_str s = name_at(ctx, i);
        uint64_t h = hash_bytes(s.ptr, s.len) & (cap - 1);
        while (ix->slots[h]) {
            int64_t j = ix->slots[h] - 1;
            if (str_equal(name_at(ctx, j), s)) {
                *dup_second = i;
                return j;
            }
            h = (h + 1) & (cap - 1);
        }
        ix->slots[h] = i + 1;
    }
    return -1;
}

static int64_t index_find(const name_index *ix, const char *name, gguf_str (*name_at)(const void *, int64_t),
                          const void *ctx) {
    if (!ix->slots || !name) return -1;
    size_t n = strlen(name);
    gguf_str s = {name, n};
    uint64_t h = hash_bytes(name, n) & (ix->cap - 1);
    while (ix->slots[h]) {
        int64_t j = ix->slots[h] - 1;
        if (str_equal(name_at(ctx, j), s)) return j;
        h = (h + 1) & (ix->cap - 1);
    }
    return -1;
}

static gguf_str kv_name_at(const void *ctx, int64_t i) {
    return ((const gguf_file *)ctx)->kv[i].key;
}
static gguf_str tensor_name_at(const void *ctx, int64_t i) {
    return ((const gguf_file *)ctx)->tensors[i].name;
}

/* ---- the validating parser ---- */

typedef struct {
    gguf_file *f;
    size_t pos; /* next byte to read */
    char *err;
    size_t errlen;
} parser;

static size_t left(const parser *p) {
    return p->f->size - p->pos;
}

static uint32_t load_u32(const uint8_t *q) {
    uint32_t v;
    memcpy(&v, q, 4);
    return v;
}

static uint64_t load_u64(const uint8_t *q) {
    uint64_t v;
    memcpy(&v, q, 8);
    return v;
}

/* Reads n bytes of a fixed-size field; `what` names it for the truncation message. */
static int need(parser *p, size_t n, const char *what) {
    if (left(p) >= n) return 0;
    return fm_set_error(p->err, p->errlen,
                        "%s: file ends at byte %zu inside %s (needs %zu bytes at offset %zu)", p->f->name,
                        p->f->size, what, n, p->pos);
}

static int read_u32(parser *p, uint32_t *v, const char *what) {
    if (need(p, 4, what)) return -1;
    *v = load_u32(p->f->base + p->pos);
    p->pos += 4;
    return 0;
}

static int read_u64(parser *p, uint64_t *v, const char *what) {
    if (need(p, 8, what)) return -1;
    *v = load_u64(p->f->base + p->pos);
    p->pos += 8;
    return 0;
}

/* A GGUF string: u64 length + bytes. */
static int read_str(parser *p, gguf_str *s, const char *what) {
    uint64_t len;
    if (read_u64(p, &len, what)) return -1;
    if (len > left(p))
        return fm_set_error(p->err, p->errlen,
                            "%s: %s: string length %" PRIu64
                            " runs past the end of the file (%zu bytes left)",
                            p->f->name, what, len, left(p));
    s->ptr = (const char *)p->f->base + p->pos;
    s->len = len;
    p->pos += (size_t)len;
    return 0;
}

/* Skips (validates) one array whose header (type, count) is at the cursor; used for nested arrays, whose
 * elements are not exposed. `what` names the key. */
static int skip_array(parser *p, const char *what, int depth) {
    uint32_t t;
    uint64_t n;
    if (read_u32(p, &t, what) || read_u64(p, &n, what)) return -1;
    if (depth >= GGUF_MAX_ARRAY_DEPTH)
        return fm_set_error(p->err, p->errlen, "%s: %s: arrays nested more than %d deep", p->f->name, what,
                            GGUF_MAX_ARRAY_DEPTH);
    if (t >= GGUF_TYPE_COUNT)
        return fm_set_error(p->err, p->errlen,
                            "%s: %s: nested array element type %u is not a GGUF type (0..%d)", p->f->name,
                            what, t, GGUF_TYPE_COUNT - 1);
    if (t == GGUF_TYPE_STRING || t == GGUF_TYPE_ARRAY) {
        uint64_t min = t == GGUF_TYPE_STRING ? 8 : 12;
        if (n > left(p) / min)
            return fm_set_error(p->err, p->errlen,
                                "%s: %s: nested array of %" PRIu64 " %ss cannot fit in the %zu bytes left",
                                p->f->name, what, n, gguf_type_name((gguf_type)t), left(p));
        for (uint64_t i = 0; i < n; i++) {
            gguf_str s;
            if (t == GGUF_TYPE_STRING ? read_str(p, &s, what) : skip_array(p, what, depth + 1)) return -1;
        }
        return 0;
    }
    uint64_t bytes;
    if (__builtin_mul_overflow(n, (uint64_t)type_sizes[t], &bytes) || bytes > left(p))
        return fm_set_error(p->err, p->errlen,
                            "%s: %s: nested array of %" PRIu64
                            " %s values runs past the end of the file (%zu "
                            "bytes left)",
                            p->f->name, what, n, gguf_type_name((gguf_type)t), left(p));
    p->pos += (size_t)bytes;
    return 0;
}

static int parse_kv(parser *p, int64_t i) {
    gguf_file *f = p->f;
    gguf_kv *kv = &f->kv[i];
    char what[160], nb[96];
    snprintf(what, sizeof what, "metadata entry %" PRId64 " key", i);
    if (read_str(p, &kv->key, what)) return -1;
    if (kv->key.len == 0)
        return fm_set_error(p->err, p->errlen, "%s: metadata entry %" PRId64 " has an empty key", f->name, i);
    snprintf(what, sizeof what, "metadata key %s", printable(kv->key, nb, sizeof nb));
    uint32_t t;
    if (read_u32(p, &t, what)) return -1;
    if (t >= GGUF_TYPE_COUNT)
        return fm_set_error(p->err, p->errlen, "%s: %s: value type %u is not a GGUF type (0..%d)", f->name,
                            what, t, GGUF_TYPE_COUNT - 1);
    kv->type = (gguf_type)t;
    kv->val = f->base + p->pos;
    if (t == GGUF_TYPE_STRING) return read_str(p, &kv->str, what);
    if (t != GGUF_TYPE_ARRAY) {
        if (need(p, type_sizes[t], what)) return -1;
        p->pos += type_sizes[t];
        return 0;
    }
    uint32_t et;
    uint64_t n;
    if (read_u32(p, &et, what) || read_u64(p, &n, what)) return -1;
    if (et >= GGUF_TYPE_COUNT)
        return fm_set_error(p->err, p->errlen, "%s: %s: array element type %u is not a GGUF type (0..%d)",
                            f->name, what, et, GGUF_TYPE_COUNT - 1);
    kv->arr_type = (gguf_type)et;
    kv->arr_len = n;
    kv->val = f->base + p->pos;
    if (et == GGUF_TYPE_ARRAY) {
        if (n > left(p) / 12)
            return fm_set_error(p->err, p->errlen,
                                "%s: %s: array of %" PRIu64 " arrays cannot fit in the %zu bytes left",
                                f->name, what, n, left(p));
        for (uint64_t k = 0; k < n; k++)
            if (skip_array(p, what, 1)) return -1;
        return 0;
    }
    if (et == GGUF_TYPE_STRING) {
        if (n > left(p) / 8) /* each string takes at least its 8-byte length */
            return fm_set_error(p->err, p->errlen,
                                "%s: %s: array of %" PRIu64 " strings cannot fit in the %zu bytes left",
                                f->name, what, n, left(p));
        kv->str_offs = malloc((size_t)(n ? n : 1) * sizeof *kv->str_offs);
        if (!kv->str_offs) return fm_set_error(p->err, p->errlen, "%s: %s: out of memory", f->name, what);
        size_t start = p->pos;
        for (uint64_t k = 0; k < n; k++) {
            gguf_str s;
            kv->str_offs[k] = p->pos - start;
            if (read_str(p, &s, what)) return -1;
        }
        return 0;
    }
    uint64_t bytes;
    if (__builtin_mul_overflow(n, (uint64_t)type_sizes[et], &bytes) || bytes > left(p))
        return fm_set_error(p->err, p->errlen,
                            "%s: %s: array of %" PRIu64
                            " %s values runs past the end of the file (%zu bytes left)",
                            f->name, what, n, gguf_type_name((gguf_type)et), left(p));
    p->pos += (size_t)bytes;
    return 0;
}

static int parse_alignment(parser *p) {
    gguf_file *f = p->f;
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t i = gguf_find_key(f, "general.alignment");
    if (i < 0) return 0;
    const gguf_kv *kv = &f->kv[i];
    if (kv->type != GGUF_TYPE_UINT32)
        return fm_set_error(p->err, p->errlen, "%s: general.alignment has type %s, expected uint32", f->name,
                            gguf_type_name(kv->type));
    uint32_t a = load_u32(kv->val);
    if (a == 0 || (a & (a - 1)) != 0)
        return fm_set_error(p->err, p->errlen, "%s: general.alignment = %u is not a power of two", f->name,
                            a);
    f->alignment = a;
    return 0;
}

static int parse_tensor_info(parser *p, int64_t i) {
    gguf_file *f = p->f;
    gguf_tensor *t = &f->tensors[i];
    char what[160], nb[96];
    snprintf(what, sizeof what, "tensor info %" PRId64 " name", i);
    if (read_str(p, &t->name, what)) return -1;
    const char *tn = printable(t->name, nb, sizeof nb);
    if (t->name.len == 0)
        return fm_set_error(p->err, p->errlen, "%s: tensor info %" PRId64 " has an empty name", f->name, i);
    snprintf(what, sizeof what, "tensor %s", tn);
    if (read_u32(p, &t->n_dims, what)) return -1;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return fm_set_error(p->err, p->errlen, "%s: tensor %s: n_dims %u is out of range (1..%d)", f->name,
                            tn, t->n_dims, GGUF_MAX_DIMS);
    uint64_t nelem = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t ne;
        if (read_u64(p, &ne, what)) return -1;
        if (ne == 0 || ne > (uint64_t)INT64_MAX)
            return fm_set_error(p->err, p->errlen,
                                "%s: tensor %s: dimension %u is %" PRIu64 " (must be 1..2^63-1)", f->name, tn,
                                d, ne);
        t->ne[d] = (int64_t)ne;
        if (__builtin_mul_overflow(nelem, ne, &nelem) || nelem > (uint64_t)INT64_MAX)
            return fm_set_error(p->err, p->errlen, "%s: tensor %s: element count overflows 64 bits", f->name,
                                tn);
    }
    uint64_t off;
    if (read_u32(p, &t->ggml_type, what) || read_u64(p, &off, what)) return -1;
    t->offset = off;
    const ggml_type_info *ti = ggml_type_lookup(t->ggml_type);
    if (!ti)
        return fm_set_error(p->err, p->errlen, "%s: tensor %s: ggml type %u is unknown", f->name, tn,
                            t->ggml_type);
    if ((uint64_t)t->ne[0] % ti->blck)
        return fm_set_error(p->err, p->errlen,
                            "%s: tensor %s: first dimension %" PRId64
                            " is not a multiple of the %s block size %u",
                            f->name, tn, t->ne[0], ti->name, ti->blck);
    if (__builtin_mul_overflow(nelem / ti->blck, (uint64_t)ti->bytes, &t->size))
        return fm_set_error(p->err, p->errlen, "%s: tensor %s: byte size overflows 64 bits", f->name, tn);
    t->supported = fm_dtype_from_ggml(t->ggml_type, &t->dtype) == 0;
    if (!t->supported) t->dtype = FM_DTYPE_COUNT;
    return 0;
}

static int cmp_offset(const void *a, const void *b) {
    const gguf_tensor *x = *(const gguf_tensor *const *)a, *y = *(const gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Places the tensors in the data section: aligned, inside the file, pairwise disjoint. */
static int check_tensor_data(parser *p) {
    gguf_file *f = p->f;
    char nb[96], nb2[96];
    uint64_t a = f->alignment, start;
    if (__builtin_add_overflow((uint64_t)p->pos, a - 1, &start))
        return fm_set_error(p->err, p->errlen, "%s: data section offset overflows", f->name);
    f->data_start = start / a * a;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        const char *tn = printable(t->name, nb, sizeof nb);
        if (t->offset % a)
            return fm_set_error(p->err, p->errlen,
                                "%s: tensor %s: data offset %" PRIu64
                                " is not a multiple of the alignment %" PRIu64,
                                f->name, tn, t->offset, a);
        uint64_t begin, end;
        if (__builtin_add_overflow(f->data_start, t->offset, &begin) ||
            __builtin_add_overflow(begin, t->size, &end))
            return fm_set_error(p->err, p->errlen, "%s: tensor %s: data range overflows 64 bits", f->name,
                                tn);
        if (end > f->size)
            return fm_set_error(p->err, p->errlen,
                                "%s: tensor %s: data ends at byte %" PRIu64
                                ", past the end of the file (%zu)",
                                f->name, tn, end, f->size);
        t->data = f->base + begin;
    }
    if (f->n_tensors < 2) return 0;
    gguf_tensor **order = malloc((size_t)f->n_tensors * sizeof *order);
    if (!order) return fm_set_error(p->err, p->errlen, "%s: out of memory", f->name);
    for (int64_t i = 0; i < f->n_tensors; i++) order[i] = &f->tensors[i];
    qsort(order, (size_t)f->n_tensors, sizeof *order, cmp_offset);
    int rc = 0;
    for (int64_t i = 0; i + 1 < f->n_tensors; i++) {
        const gguf_tensor *x = order[i], *y = order[i + 1];
        if (x->offset + x->size > y->offset) { /* no overflow: both ranges were checked above */
            rc = fm_set_error(p->err, p->errlen,
                              "%s: tensors %s and %s overlap (data offsets %" PRIu64 "+%" PRIu64
                              " and %" PRIu64 ")",
                              f->name, printable(x->name, nb, sizeof nb), printable(y->name, nb2, sizeof nb2),
                              x->offset, x->size, y->offset);
            break;
        }
    }
    free(order);
    return rc;
}

static int parse(parser *p) {
    gguf_file *f = p->f;
    if (f->size < 4)
        return fm_set_error(p->err, p->errlen, "%s: not a GGUF file (only %zu bytes, no magic)", f->name,
                            f->size);
    if (memcmp(f->base, "GGUF", 4) != 0) {
        char m[4 * 4 + 1];
        size_t n = 0;
        for (int i = 0; i < 4; i++) { /* printable bytes as is, others as \xNN */
            unsigned char ch = f->base[i];
            if (ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\')
                m[n++] = (char)ch;
            else
                n += (size_t)snprintf(m + n, sizeof m - n, "\\x%02x", ch);
        }
        m[n] = 0;
        return fm_set_error(p->err, p->errlen, "%s: not a GGUF file (magic \"%s\", expected \"GGUF\")",
                            f->name, m);
    }
    p->pos = 4;
    if (read_u32(p, &f->version, "the header version")) return -1;
    if (f->version == 1)
        return fm_set_error(p->err, p->errlen, "%s: GGUF version 1 is not supported (only v2 and v3)",
                            f->name);
    if (f->version != 2 && f->version != 3) {
        if ((f->version & 0xffff) == 0 && (f->version >> 24) <= 3)
            return fm_set_error(p->err, p->errlen, "%s: big-endian GGUF is not supported", f->name);
        return fm_set_error(p->err, p->errlen, "%s: GGUF version %u is not supported (only v2 and v3)",
                            f->name, f->version);
    }
    uint64_t n_tensors, n_kv;
    if (read_u64(p, &n_tensors, "the header tensor count") || read_u64(p, &n_kv, "the header metadata count"))
        return -1;
    /* Bound both counts by the bytes that remain before allocating anything for them. */
    if (n_kv > left(p) / GGUF_KV_MIN_BYTES)
        return fm_set_error(p->err, p->errlen,
                            "%s: header claims %" PRIu64
                            " metadata entries but only %zu bytes follow (>= %d each)",
                            f->name, n_kv, left(p), GGUF_KV_MIN_BYTES);
    if (n_tensors > left(p) / GGUF_TENSOR_MIN_BYTES)
        return fm_set_error(p->err, p->errlen,
                            "%s: header claims %" PRIu64 " tensors but only %zu bytes follow (>= %d each)",
                            f->name, n_tensors, left(p), GGUF_TENSOR_MIN_BYTES);
    f->kv = calloc(n_kv ? n_kv : 1, sizeof *f->kv);
    if (!f->kv) return fm_set_error(p->err, p->errlen, "%s: out of memory", f->name);
    for (uint64_t i = 0; i < n_kv; i++) {
        f->n_kv = (int64_t)i + 1; /* so gguf_close frees what this entry allocated */
        if (parse_kv(p, (int64_t)i)) return -1;
    }
    int64_t dup2 = -1, dup = index_build(&f->kv_index, f->n_kv, kv_name_at, f, &dup2);
    if (dup == -2) return fm_set_error(p->err, p->errlen, "%s: out of memory", f->name);
    if (dup >= 0) {
        char nb[96];
        return fm_set_error(p->err, p->errlen,
                            "%s: duplicate metadata key %s (entries %" PRId64 " and %" PRId64 ")", f->name,
                            printable(f->kv[dup].key, nb, sizeof nb), dup, dup2);
    }
    if (parse_alignment(p)) return -1;
    /* Re-check against what is left now: the metadata may have used most of the file. */
    if (n_tensors > left(p) / GGUF_TENSOR_MIN_BYTES)
        return fm_set_error(p->err, p->errlen,
                            "%s: header claims %" PRIu64
                            " tensors but only %zu bytes follow the metadata (>= %d each)",
                            f->name, n_tensors, left(p), GGUF_TENSOR_MIN_BYTES);
    f->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *f->tensors);
    if (!f->tensors) return fm_set_error(p->err, p->errlen, "%s: out of memory", f->name);
    f->n_tensors = (int64_t)n_tensors;
    for (int64_t i = 0; i < f->n_tensors; i++)
        if (parse_tensor_info(p, i)) return -1;
    dup = index_build(&f->tensor_index, f->n_tensors, tensor_name_at, f, &dup2);
    if (dup == -2) return fm_set_error(p->err, p->errlen, "%s: out of memory", f->name);
    if (dup >= 0) {
        char nb[96];
        return fm_set_error(p->err, p->errlen,
                            "%s: duplicate tensor name %s (tensor infos %" PRId64 " and %" PRId64 ")",
                            f->name, printable(f->tensors[dup].name, nb, sizeof nb), dup, dup2);
    }
    return check_tensor_data(p);
}

static gguf_file *open_image(gguf_file *f, char *err, size_t errlen) {
    parser p = {f, 0, err, errlen};
    if (parse(&p)) {
        gguf_close(f);
        return NULL;
    }
    return f;
}

static gguf_file *file_new(const char *name, char *err, size_t errlen) {
    gguf_file *f = calloc(1, sizeof *f);
    if (f) f->name = strdup(name ? name : "(memory)");
    if (!f || !f->name) {
        free(f);
        fm_set_error(err, errlen, "%s: out of memory", name ? name : "(memory)");
        return NULL;
    }
    return f;
}

gguf_file *gguf_open(const char *path, char *err, size_t errlen) {
    gguf_file *f = file_new(path, err, errlen);
    if (!f) return NULL;
    if (fm_mmap_open(path, 1, &f->map, err, errlen)) {
        gguf_close(f);
        return NULL;
    }
    f->base = f->map.data;
    f->size = f->map.size;
    return open_image(f, err, errlen);
}

gguf_file *gguf_open_memory(const void *data, size_t size, const char *name, char *err, size_t errlen) {
    gguf_file *f = file_new(name, err, errlen);
    if (!f) return NULL;
    f->base = data;
    f->size = data ? size : 0;
    return open_image(f, err, errlen);
}

int gguf_make_resident(gguf_file *f, fm_pool *pool) {
    return fm_mmap_make_resident(&f->map, pool);
}

int gguf_set_writable(gguf_file *f, int writable) {
    return fm_mmap_set_writable(&f->map, writable);
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    for (int64_t i = 0; i < f->n_kv; i++) free(f->kv[i].str_offs);
    free(f->kv);
    free(f->tensors);
    free(f->kv_index.slots);
    free(f->tensor_index.slots);
    fm_mmap_close(&f->map);
    free(f->name);
    free(f);
}

/* ---- accessors ---- */

const char *gguf_path(const gguf_file *f) {
    return f->name;
}
uint32_t gguf_version(const gguf_file *f) {
    return f->version;
}
uint64_t gguf_alignment(const gguf_file *f) {
    return f->alignment;
}
int64_t gguf_n_kv(const gguf_file *f) {
    return f->n_kv;
}

int64_t gguf_find_key(const gguf_file *f, const char *key) {
    return index_find(&f->kv_index, key, kv_name_at, f);
}

static const gguf_kv *kv_at(const gguf_file *f, int64_t i) {
    return i >= 0 && i < f->n_kv ? &f->kv[i] : NULL;
}

gguf_str gguf_kv_key(const gguf_file *f, int64_t i) {
    const gguf_kv *kv = kv_at(f, i);
    return kv ? kv->key : (gguf_str){"", 0};
}

gguf_type gguf_kv_type(const gguf_file *f, int64_t i) {
    const gguf_kv *kv = kv_at(f, i);
    return kv ? kv->type : GGUF_TYPE_COUNT;
}

gguf_type gguf_kv_array_type(const gguf_file *f, int64_t i) {
    const gguf_kv *kv = kv_at(f, i);
    return kv && kv->type == GGUF_TYPE_ARRAY ? kv->arr_type : GGUF_TYPE_COUNT;
}

uint64_t gguf_kv_array_len(const gguf_file *f, int64_t i) {
    const gguf_kv *kv = kv_at(f, i);
    return kv && kv->type == GGUF_TYPE_ARRAY ? kv->arr_len : 0;
}

/* The entry for key with the given type (GGUF_TYPE_COUNT: any), or NULL and a message. */
static const gguf_kv *kv_get(const gguf_file *f, const char *key, gguf_type want, const char *want_name,
                             char *err, size_t errlen) {
    int64_t i = gguf_find_key(f, key);
    if (i < 0) {
        fm_set_error(err, errlen, "%s: metadata key %s is missing (expected %s)", f->name, key, want_name);
        return NULL;
    }
    const gguf_kv *kv = &f->kv[i];
    if (want != GGUF_TYPE_COUNT && kv->type != want) {
        fm_set_error(err, errlen, "%s: metadata key %s has type %s, expected %s", f->name, key,
                     gguf_type_name(kv->type), want_name);
        return NULL;
    }
    return kv;
}

/* Reads an integer entry as sign + magnitude; -1 when the entry is not an integer type. */
static int kv_integer(const gguf_kv *kv, int *neg, uint64_t *mag) {
    const uint8_t *v = kv->val;
    int64_t s;
    *neg = 0;
    switch (kv->type) {
    case GGUF_TYPE_UINT8:
        *mag = v[0];
        return 0;
    case GGUF_TYPE_UINT16: {
        uint16_t x;
        memcpy(&x, v, 2);
        *mag = x;
        return 0;
    }
    case GGUF_TYPE_UINT32:
        *mag = load_u32(v);
        return 0;
    case GGUF_TYPE_UINT64:
        *mag = load_u64(v);
        return 0;
    case GGUF_TYPE_INT8:
        s = (int8_t)v[0];
        break;
    case GGUF_TYPE_INT16: {
        int16_t x;
        memcpy(&x, v, 2);
        s = x;
        break;
    }
    case GGUF_TYPE_INT32:
        s = (int32_t)load_u32(v);
        break;
    case GGUF_TYPE_INT64:
        s = (int64_t)load_u64(v);
        break;
    default:
        return -1;
    }
    *neg = s < 0;
    *mag = s < 0 ? (uint64_t)0 - (uint64_t)s : (uint64_t)s;
    return 0;
}

int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, char *err, size_t errlen) {
    const gguf_kv *kv = kv_get(f, key, GGUF_TYPE_COUNT, "an integer", err, errlen);
    if (!kv) return -1;
    int neg;
    uint64_t mag;
    if (kv_integer(kv, &neg, &mag))
        return fm_set_error(err, errlen, "%s: metadata key %s has type %s, expected an integer", f->name, key,
                            gguf_type_name(kv->type));
    if (neg || mag > UINT32_MAX)
        return fm_set_error(err, errlen, "%s: metadata key %s = %s%" PRIu64 " does not fit in uint32",
                            f->name, key, neg ? "-" : "", mag);
    *out = (uint32_t)mag;
    return 0;
}

int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out, char *err, size_t errlen) {
    const gguf_kv *kv = kv_get(f, key, GGUF_TYPE_COUNT, "an integer", err, errlen);
    if (!kv) return -1;
    int neg;
    uint64_t mag;
    if (kv_integer(kv, &neg, &mag))
        return fm_set_error(err, errlen, "%s: metadata key %s has type %s, expected an integer", f->name, key,
                            gguf_type_name(kv->type));
    if (!neg && mag > (uint64_t)INT64_MAX)
        return fm_set_error(err, errlen, "%s: metadata key %s = %" PRIu64 " does not fit in int64", f->name,
                            key, mag);
    *out = neg ? (int64_t)(0 - mag) : (int64_t)mag; /* mag <= 2^63 when neg: the conversion is exact */
    return 0;
}

int gguf_get_f32(const gguf_file *f, const char *key, float *out, char *err, size_t errlen) {
    const gguf_kv *kv = kv_get(f, key, GGUF_TYPE_COUNT, "float32", err, errlen);
    if (!kv) return -1;
    if (kv->type == GGUF_TYPE_FLOAT32) {
        memcpy(out, kv->val, 4);
    } else if (kv->type == GGUF_TYPE_FLOAT64) {
        double d;
        memcpy(&d, kv->val, 8);
        *out = (float)d;
    } else {
        return fm_set_error(err, errlen, "%s: metadata key %s has type %s, expected float32", f->name, key,
                            gguf_type_name(kv->type));
    }
    return 0;
}

int gguf_get_bool(const gguf_file *f, const char *key, int *out, char *err, size_t errlen) {
    const gguf_kv *kv = kv_get(f, key, GGUF_TYPE_BOOL, "bool", err, errlen);
    if (!kv) return -1;
    *out = kv->val[0] != 0;
    return 0;
}

int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out, char *err, size_t errlen) {
    const gguf_kv *kv = kv_get(f, key, GGUF_TYPE_STRING, "string", err, errlen);
    if (!kv) return -1;
    *out = kv->str;
    return 0;
}

static const gguf_kv *arr_get(const gguf_file *f, const char *key, gguf_type elem, const char *want,
                              char *err, size_t errlen) {
    const gguf_kv *kv = kv_get(f, key, GGUF_TYPE_ARRAY, want, err, errlen);
    if (!kv) return NULL;
    if (elem != GGUF_TYPE_COUNT && kv->arr_type != elem) {
        fm_set_error(err, errlen, "%s: metadata key %s is an array of %s, expected %s", f->name, key,
                     gguf_type_name(kv->arr_type), want);
        return NULL;
    }
    return kv;
}

int gguf_get_arr_str(const gguf_file *f, const char *key, uint64_t i, gguf_str *out, char *err,
                     size_t errlen) {
    const gguf_kv *kv = arr_get(f, key, GGUF_TYPE_STRING, "an array of string", err, errlen);
    if (!kv) return -1;
    if (i >= kv->arr_len)
        return fm_set_error(err, errlen,
                            "%s: metadata key %s: index %" PRIu64 " is past the array's %" PRIu64 " elements",
                            f->name, key, i, kv->arr_len);
    const uint8_t *q = kv->val + kv->str_offs[i];
    out->len = load_u64(q);
    out->ptr = (const char *)q + 8;
    return 0;
}

int gguf_get_arr_data(const gguf_file *f, const char *key, gguf_type elem_type, const void **data,
                      uint64_t *n, char *err, size_t errlen) {
    char want[40];
    snprintf(want, sizeof want, "an array of %s", gguf_type_name(elem_type));
    if ((unsigned)elem_type >= GGUF_TYPE_COUNT || elem_type == GGUF_TYPE_STRING ||
        elem_type == GGUF_TYPE_ARRAY)
        return fm_set_error(err, errlen, "%s: metadata key %s: %s has no typed data pointer", f->name, key,
                            want);
    const gguf_kv *kv = arr_get(f, key, elem_type, want, err, errlen);
    if (!kv) return -1;
    *data = kv->val;
    *n = kv->arr_len;
    return 0;
}

int gguf_get_arr_len(const gguf_file *f, const char *key, uint64_t *n, char *err, size_t errlen) {
    const gguf_kv *kv = arr_get(f, key, GGUF_TYPE_COUNT, "an array", err, errlen);
    if (!kv) return -1;
    *n = kv->arr_len;
    return 0;
}

int64_t gguf_n_tensors(const gguf_file *f) {
    return f->n_tensors;
}

const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i) {
    return i >= 0 && i < f->n_tensors ? &f->tensors[i] : NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    int64_t i = index_find(&f->tensor_index, name, tensor_name_at, f);
    return i >= 0 ? &f->tensors[i] : NULL;
}
