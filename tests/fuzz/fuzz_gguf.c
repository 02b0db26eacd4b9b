/* fuzz_gguf.c: libFuzzer entry for the GGUF reader. Any input must either be refused with one non-empty line
 * naming the input, or open into a handle whose every accessor stays inside the input: each key is read back
 * through the typed getter of its type (string-array elements and numeric-array bytes included) and each
 * tensor's data range is checked and touched. Seeds: the .gguf files under tests/fixtures. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint8_t sink;

static void touch(const void *p, uint64_t n, const uint8_t *data, size_t size) {
    const uint8_t *q = p;
    if (n == 0) return;
    if (q < data || q + n > data + size) abort();
    sink ^= q[0] ^ q[n - 1];
}

/* A NUL-terminated copy of s (NULL when it holds a NUL, which no C-string lookup can name). */
static char *cstr(gguf_str s) {
    if (memchr(s.ptr, 0, (size_t)s.len)) return NULL;
    char *c = malloc((size_t)s.len + 1);
    if (!c) abort();
    memcpy(c, s.ptr, (size_t)s.len);
    c[s.len] = 0;
    return c;
}

static void check_kv(const gguf_file *f, int64_t i, const uint8_t *data, size_t size) {
    char err[FM_ERROR_LEN];
    gguf_str k = gguf_kv_key(f, i);
    touch(k.ptr, k.len, data, size);
    char *key = cstr(k);
    if (!key) return;
    if (gguf_find_key(f, key) != i) abort(); /* keys are unique */
    uint32_t u;
    int64_t v;
    float fl;
    int b;
    gguf_str s;
    uint64_t n;
    const void *d;
    switch (gguf_kv_type(f, i)) {
    case GGUF_TYPE_FLOAT32:
    case GGUF_TYPE_FLOAT64:
        if (gguf_get_f32(f, key, &fl, err, sizeof err)) abort();
        break;
    case GGUF_TYPE_BOOL:
        if (gguf_get_bool(f, key, &b, err, sizeof err)) abort();
        break;
    case GGUF_TYPE_STRING:
        if (gguf_get_str(f, key, &s, err, sizeof err)) abort();
        touch(s.ptr, s.len, data, size);
        break;
    case GGUF_TYPE_ARRAY: {
        gguf_type et = gguf_kv_array_type(f, i);
        if (gguf_get_arr_len(f, key, &n, err, sizeof err) || n != gguf_kv_array_len(f, i)) abort();
        if (et == GGUF_TYPE_STRING) {
            for (uint64_t j = 0; j < n; j++) {
                if (gguf_get_arr_str(f, key, j, &s, err, sizeof err)) abort();
                touch(s.ptr, s.len, data, size);
            }
            if (gguf_get_arr_str(f, key, n, &s, err, sizeof err) == 0) abort();
        } else if (et != GGUF_TYPE_ARRAY) {
            if (gguf_get_arr_data(f, key, et, &d, &n, err, sizeof err)) abort();
            touch(d, n * gguf_type_size(et), data, size);
        } else if (gguf_get_arr_data(f, key, et, &d, &n, err, sizeof err) == 0) {
            abort(); /* nested arrays have no typed data */
        }
        break;
    }
    default: /* integers: both getters either succeed or explain */
        err[0] = 0;
        if (gguf_get_u32(f, key, &u, err, sizeof err) && !err[0]) abort();
        err[0] = 0;
        if (gguf_get_i64(f, key, &v, err, sizeof err) && !err[0]) abort();
        break;
    }
    free(key);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[FM_ERROR_LEN];
    err[0] = 0;
    gguf_file *f = gguf_open_memory(data, size, "fuzz.gguf", err, sizeof err);
    if (!f) {
        if (!err[0] || strchr(err, '\n') || !strstr(err, "fuzz.gguf")) abort();
        return 0;
    }
    uint64_t a = gguf_alignment(f);
    if (a == 0 || (a & (a - 1)) || (gguf_version(f) != 2 && gguf_version(f) != 3)) abort();
    for (int64_t i = 0; i < gguf_n_kv(f); i++) check_kv(f, i, data, size);
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS || t->offset % a) abort();
        for (int d = 0; d < GGUF_MAX_DIMS; d++)
            if (t->ne[d] < 1) abort();
        touch(t->name.ptr, t->name.len, data, size);
        touch(t->data, t->size, data, size);
        (void)gguf_ggml_type_name(t->ggml_type);
        if (t->supported && fm_dtype_row_bytes(t->dtype, t->ne[0]) == 0) abort();
        char *name = cstr(t->name);
        if (name && gguf_find_tensor(f, name) != t) abort();
        free(name);
    }
    (void)gguf_find_key(f, "general.architecture");
    (void)gguf_find_tensor(f, "token_embd.weight");
    gguf_close(f);
    return 0;
}
