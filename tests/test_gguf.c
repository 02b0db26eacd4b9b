/* test_gguf.c: the GGUF reader and writer.
 *   1. round trip: every scalar type, strings, arrays (numeric, string, empty) and tensors of every dtype
 *      (direct and fill-callback data) through gguf_writer -> gguf_open;
 *   2. a file written by gguf-py (llama.cpp's writer; tests/fixtures/make_gguf_py_fixture.py) reads back;
 *   3. a malformed-file suite built from a small hand-laid file whose field offsets are recorded: truncation
 *      at every byte, huge counts, bad types and lengths, bad dims, overflow, misaligned / overlapping /
 *      out-of-file tensors, duplicates, bad alignment, nested arrays, and single-byte corruption of the whole
 *      header. Every refusal must give one non-empty line naming the file. Each case is opened from an
 *      exact-size heap copy, so an over-read shows under ASan. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/gguf.h"
#include "test_util.h"

/* ---- helpers ---- */

static int msg_ok(const char *err, const char *name) {
    return err[0] != 0 && strchr(err, '\n') == NULL && strstr(err, name) != NULL;
}

/* Opens an exact-size heap copy of data[0..n) and exercises every accessor when it opens. Returns 1 when it
 * opened. Checks the error-message rules when it did not. */
static int open_copy(const uint8_t *data, size_t n, const char *name, char *err, size_t errlen) {
    uint8_t *copy = malloc(n ? n : 1);
    memcpy(copy, data, n);
    err[0] = 0;
    gguf_file *f = gguf_open_memory(copy, n, name, err, errlen);
    int ok = f != NULL;
    if (f) {
        char e2[FM_ERROR_LEN];
        for (int64_t i = 0; i < gguf_n_kv(f); i++) {
            gguf_str k = gguf_kv_key(f, i);
            CHECK(k.len > 0);
            (void)gguf_kv_type(f, i);
            (void)gguf_kv_array_type(f, i);
            (void)gguf_kv_array_len(f, i);
        }
        for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
            const gguf_tensor *t = gguf_tensor_at(f, i);
            volatile uint8_t sink = 0;
            if (t->size) sink ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->size - 1];
            (void)sink;
        }
        uint64_t na;
        if (gguf_get_arr_len(f, "test.strings", &na, e2, sizeof e2) == 0) {
            for (uint64_t i = 0; i < na; i++) {
                gguf_str s;
                CHECK(gguf_get_arr_str(f, "test.strings", i, &s, e2, sizeof e2) == 0);
            }
        }
        gguf_close(f);
    } else {
        CHECK_MSG(msg_ok(err, name), "bad message for %s: [%s]", name, err);
    }
    free(copy);
    return ok;
}

/* Expects the image to be refused with a message containing `want`. */
static void expect_fail(const uint8_t *data, size_t n, const char *name, const char *want) {
    char err[FM_ERROR_LEN];
    int ok = open_copy(data, n, name, err, sizeof err);
    if (getenv("FM_TEST_VERBOSE")) printf("  %s\n", err); /* to read the messages */
    CHECK_MSG(!ok, "%s: opened but should have failed", name);
    if (!ok && want) CHECK_MSG(strstr(err, want) != NULL, "%s: message [%s] lacks [%s]", name, err, want);
}

/* ---- a byte builder for hand-laid files ---- */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} bytes;

static size_t b_put(bytes *b, const void *v, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    size_t at = b->n;
    memcpy(b->p + b->n, v, n);
    b->n += n;
    return at;
}
static size_t b_u32(bytes *b, uint32_t v) {
    return b_put(b, &v, 4);
}
static size_t b_u64(bytes *b, uint64_t v) {
    return b_put(b, &v, 8);
}
static size_t b_str(bytes *b, const char *s) {
    size_t at = b_u64(b, strlen(s));
    b_put(b, s, strlen(s));
    return at;
}
static void b_pad(bytes *b, size_t align) {
    while (b->n % align) b_put(b, "", 1);
}
static void p_u32(uint8_t *p, size_t at, uint32_t v) {
    memcpy(p + at, &v, 4);
}
static void p_u64(uint8_t *p, size_t at, uint64_t v) {
    memcpy(p + at, &v, 8);
}

/* Offsets of the fields of the base file that the malformed cases patch. */
typedef struct {
    size_t version, n_tensors, n_kv;
    size_t k_arch_len, k_arch_type, v_arch_len;
    size_t k_u32_name, k_u32_type;
    size_t strs_elem_type, strs_count, strs_first_len;
    size_t k_arr_name, ints_count;
    size_t align_type, align_val;
    size_t t_name[3], t_ndims[3], t_ne[3], t_type[3], t_off[3];
    size_t table_end, data_start, total;
} layout;

/* A valid v3 file: 5 metadata entries and 3 tensors (f32 [32,2] at 0, q8_0 [64] at 256, f16 [2,3,4] at 352).
 */
static bytes base_file(layout *L) {
    bytes b = {0};
    b_put(&b, "GGUF", 4);
    L->version = b_u32(&b, 3);
    L->n_tensors = b_u64(&b, 3);
    L->n_kv = b_u64(&b, 5);
    L->k_arch_len = b_str(&b, "general.architecture");
    L->k_arch_type = b_u32(&b, GGUF_TYPE_STRING);
    L->v_arch_len = b_str(&b, "test");
    L->k_u32_name = b_str(&b, "test.u32") + 8;
    L->k_u32_type = b_u32(&b, GGUF_TYPE_UINT32);
    b_u32(&b, 7);
    b_str(&b, "test.strings");
    b_u32(&b, GGUF_TYPE_ARRAY);
    L->strs_elem_type = b_u32(&b, GGUF_TYPE_STRING);
    L->strs_count = b_u64(&b, 3);
    L->strs_first_len = b_str(&b, "a");
    b_str(&b, "bc");
    b_str(&b, "");
    L->k_arr_name = b_str(&b, "test.arr") + 8; /* same length as "test.u32", for the duplicate-key case */
    b_u32(&b, GGUF_TYPE_ARRAY);
    b_u32(&b, GGUF_TYPE_INT32);
    L->ints_count = b_u64(&b, 4);
    for (int32_t i = 1; i <= 4; i++) b_put(&b, &i, 4);
    b_str(&b, "general.alignment");
    L->align_type = b_u32(&b, GGUF_TYPE_UINT32);
    L->align_val = b_u32(&b, 32);
    static const char *names[3] = {"t.a", "t.b", "t.c"};
    static const uint32_t ndims[3] = {2, 1, 3}, types[3] = {0, 8, 1};
    static const uint64_t ne[3][3] = {{32, 2}, {64}, {2, 3, 4}}, offs[3] = {0, 256, 352};
    for (int t = 0; t < 3; t++) {
        L->t_name[t] = b_str(&b, names[t]);
        L->t_ndims[t] = b_u32(&b, ndims[t]);
        L->t_ne[t] = b.n;
        for (uint32_t d = 0; d < ndims[t]; d++) b_u64(&b, ne[t][d]);
        L->t_type[t] = b_u32(&b, types[t]);
        L->t_off[t] = b_u64(&b, offs[t]);
    }
    L->table_end = b.n;
    b_pad(&b, 32);
    L->data_start = b.n;
    for (int i = 0; i < 400; i++) {
        uint8_t v = (uint8_t)(i * 7);
        b_put(&b, &v, 1);
    }
    L->total = b.n;
    return b;
}

/* ---- 1. round trip ---- */

typedef struct {
    uint8_t seed;
} fill_ctx;

static void fill_pattern(void *ctx, void *dst, size_t size) {
    uint8_t s = ((fill_ctx *)ctx)->seed;
    for (size_t i = 0; i < size; i++) ((uint8_t *)dst)[i] = (uint8_t)(s + i * 13);
}

static void test_round_trip(void) {
    char err[FM_ERROR_LEN];
    char path[1200];
    snprintf(path, sizeof path, "%s/gguf_rt.gguf", fm_test_tmpdir());
    gguf_writer *w = gguf_writer_create();
    uint8_t u8 = 250;
    int8_t i8 = -120;
    uint16_t u16 = 65000;
    int16_t i16 = -32000;
    uint64_t u64 = 0xfedcba9876543210ull;
    int64_t i64 = INT64_MIN;
    double f64 = -2.25e300;
    gguf_writer_set_val(w, "v.u8", GGUF_TYPE_UINT8, &u8);
    gguf_writer_set_val(w, "v.i8", GGUF_TYPE_INT8, &i8);
    gguf_writer_set_val(w, "v.u16", GGUF_TYPE_UINT16, &u16);
    gguf_writer_set_val(w, "v.i16", GGUF_TYPE_INT16, &i16);
    gguf_writer_set_u32(w, "v.u32", 4000000000u);
    gguf_writer_set_i32(w, "v.i32", -7);
    gguf_writer_set_f32(w, "v.f32", 3.25f);
    gguf_writer_set_bool(w, "v.bool", 1);
    gguf_writer_set_str(w, "v.str", "hello \xe4\xb8\x96\xe7\x95\x8c");
    gguf_writer_set_val(w, "v.u64", GGUF_TYPE_UINT64, &u64);
    gguf_writer_set_val(w, "v.i64", GGUF_TYPE_INT64, &i64);
    gguf_writer_set_val(w, "v.f64", GGUF_TYPE_FLOAT64, &f64);
    gguf_writer_set_u32(w, "v.replaced", 1);
    gguf_writer_set_u32(w, "v.replaced", 2); /* a second set replaces the value */
    const char *strs[] = {"", "a", "\xf0\x9f\x98\x80", "the end"};
    gguf_writer_set_arr_str(w, "v.arr_str", strs, 4);
    gguf_writer_set_arr_str(w, "v.arr_empty", strs, 0);
    /* one numeric array per element type, values distinct per type */
    uint8_t raw[GGUF_TYPE_COUNT][24];
    char key[GGUF_TYPE_COUNT][32];
    for (int t = 0; t < GGUF_TYPE_COUNT; t++) {
        if (t == GGUF_TYPE_STRING || t == GGUF_TYPE_ARRAY) continue;
        for (int i = 0; i < 24; i++) raw[t][i] = (uint8_t)(t * 31 + i * 5 + 1);
        if (t == GGUF_TYPE_BOOL)
            for (int i = 0; i < 24; i++) raw[t][i] &= 1;
        snprintf(key[t], sizeof key[t], "v.arr_%s", gguf_type_name((gguf_type)t));
        gguf_writer_set_arr_data(w, key[t], (gguf_type)t, raw[t], 24 / gguf_type_size((gguf_type)t));
    }
    /* tensors: every dtype, direct and fill data, 1..4 dims */
    float f32d[3 * 5];
    for (int i = 0; i < 15; i++) f32d[i] = (float)i - 7.5f;
    uint16_t f16d[8], bf16d[2 * 3 * 4];
    for (int i = 0; i < 8; i++) f16d[i] = fm_f32_to_f16((float)i * 0.25f);
    for (int i = 0; i < 24; i++) bf16d[i] = fm_f32_to_bf16((float)i);
    fill_ctx c1 = {3}, c2 = {77};
    int64_t ne_a[2] = {5, 3}, ne_b[1] = {8}, ne_c[3] = {2, 3, 4}, ne_q[4] = {64, 2, 1, 3},
            ne_big[2] = {96, 7};
    CHECK(gguf_writer_add_tensor(w, "a", 2, ne_a, FM_DTYPE_F32, f32d, sizeof f32d, err, sizeof err) == 0);
    CHECK(gguf_writer_add_tensor(w, "b", 1, ne_b, FM_DTYPE_F16, f16d, sizeof f16d, err, sizeof err) == 0);
    CHECK(gguf_writer_add_tensor(w, "c", 3, ne_c, FM_DTYPE_BF16, bf16d, sizeof bf16d, err, sizeof err) == 0);
    CHECK(gguf_writer_add_tensor_fn(w, "q", 4, ne_q, FM_DTYPE_Q8_0, fill_pattern, &c1, err, sizeof err) == 0);
    CHECK(gguf_writer_add_tensor_fn(w, "big", 2, ne_big, FM_DTYPE_F32, fill_pattern, &c2, err, sizeof err) ==
          0);
    /* refused tensors */
    int64_t ne0[4] = {33, 1, 1, 1}, nez[2] = {4, 0};
    CHECK(gguf_writer_add_tensor(w, "x", 2, ne_a, FM_DTYPE_F32, f32d, sizeof f32d - 4, err, sizeof err) ==
          -1);
    CHECK(strstr(err, "x") && strstr(err, "bytes"));
    CHECK(gguf_writer_add_tensor(w, "x", 0, ne_a, FM_DTYPE_F32, f32d, 0, err, sizeof err) == -1);
    CHECK(gguf_writer_add_tensor(w, "x", 5, ne_a, FM_DTYPE_F32, f32d, 0, err, sizeof err) == -1);
    CHECK(gguf_writer_add_tensor_fn(w, "x", 1, ne0, FM_DTYPE_Q8_0, fill_pattern, &c1, err, sizeof err) == -1);
    CHECK(strstr(err, "block size 32") != NULL);
    CHECK(gguf_writer_add_tensor_fn(w, "x", 2, nez, FM_DTYPE_F32, fill_pattern, &c1, err, sizeof err) == -1);
    CHECK(gguf_writer_add_tensor(w, "a", 2, ne_a, FM_DTYPE_F32, f32d, sizeof f32d, err, sizeof err) == -1);
    CHECK(strstr(err, "duplicate") != NULL);

    CHECK_MSG(gguf_writer_write(w, path, err, sizeof err) == 0, "%s", err);
    gguf_writer_free(w);

    /* no temporary file is left beside it */
    DIR *dir = opendir(fm_test_tmpdir());
    int leftovers = 0;
    for (struct dirent *de; dir && (de = readdir(dir));)
        leftovers += strstr(de->d_name, "gguf_rt.gguf.tmp") != NULL;
    if (dir) closedir(dir);
    CHECK(leftovers == 0);

    gguf_file *f = gguf_open(path, err, sizeof err);
    CHECK_MSG(f != NULL, "%s", err);
    if (!f) return;
    CHECK(gguf_version(f) == 3);
    CHECK(gguf_alignment(f) == 32);
    CHECK(strcmp(gguf_path(f), path) == 0);
    uint32_t u;
    int64_t v;
    float fl;
    int bl;
    gguf_str s;
    CHECK(gguf_get_u32(f, "v.u8", &u, err, sizeof err) == 0 && u == 250);
    CHECK(gguf_get_i64(f, "v.i8", &v, err, sizeof err) == 0 && v == -120);
    CHECK(gguf_get_u32(f, "v.u16", &u, err, sizeof err) == 0 && u == 65000);
    CHECK(gguf_get_i64(f, "v.i16", &v, err, sizeof err) == 0 && v == -32000);
    CHECK(gguf_get_u32(f, "v.u32", &u, err, sizeof err) == 0 && u == 4000000000u);
    CHECK(gguf_get_i64(f, "v.i32", &v, err, sizeof err) == 0 && v == -7);
    CHECK(gguf_get_f32(f, "v.f32", &fl, err, sizeof err) == 0 && fl == 3.25f);
    CHECK(gguf_get_bool(f, "v.bool", &bl, err, sizeof err) == 0 && bl == 1);
    CHECK(gguf_get_str(f, "v.str", &s, err, sizeof err) == 0 &&
          gguf_str_eq(s, "hello \xe4\xb8\x96\xe7\x95\x8c"));
    CHECK(gguf_get_i64(f, "v.i64", &v, err, sizeof err) == 0 && v == INT64_MIN);
    CHECK(gguf_get_f32(f, "v.f64", &fl, err, sizeof err) == 0 && fl == (float)-2.25e300);
    CHECK(gguf_get_u32(f, "v.replaced", &u, err, sizeof err) == 0 && u == 2);
    int64_t ki = gguf_find_key(f, "v.u64");
    CHECK(ki >= 0 && gguf_kv_type(f, ki) == GGUF_TYPE_UINT64 && gguf_str_eq(gguf_kv_key(f, ki), "v.u64"));
    CHECK(gguf_find_key(f, "v.nope") == -1);
    CHECK(gguf_find_key(f, "v.u6") == -1);
    /* types are exact for each key */
    static const struct {
        const char *k;
        gguf_type t;
    } types[] = {{"v.u8", GGUF_TYPE_UINT8},     {"v.i8", GGUF_TYPE_INT8},    {"v.u16", GGUF_TYPE_UINT16},
                 {"v.i16", GGUF_TYPE_INT16},    {"v.u32", GGUF_TYPE_UINT32}, {"v.i32", GGUF_TYPE_INT32},
                 {"v.f32", GGUF_TYPE_FLOAT32},  {"v.bool", GGUF_TYPE_BOOL},  {"v.str", GGUF_TYPE_STRING},
                 {"v.u64", GGUF_TYPE_UINT64},   {"v.i64", GGUF_TYPE_INT64},  {"v.f64", GGUF_TYPE_FLOAT64},
                 {"v.arr_str", GGUF_TYPE_ARRAY}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        CHECK_MSG(gguf_kv_type(f, gguf_find_key(f, types[i].k)) == types[i].t, "%s", types[i].k);
    /* integer range and type errors */
    CHECK(gguf_get_u32(f, "v.i32", &u, err, sizeof err) == -1 && strstr(err, "v.i32") &&
          strstr(err, "uint32"));
    CHECK(gguf_get_u32(f, "v.u64", &u, err, sizeof err) == -1 && msg_ok(err, path));
    CHECK(gguf_get_i64(f, "v.u64", &v, err, sizeof err) == -1 && strstr(err, "int64"));
    CHECK(gguf_get_u32(f, "v.f32", &u, err, sizeof err) == -1 && strstr(err, "float32"));
    CHECK(gguf_get_f32(f, "v.u32", &fl, err, sizeof err) == -1 && strstr(err, "uint32"));
    CHECK(gguf_get_str(f, "v.u32", &s, err, sizeof err) == -1 && strstr(err, "expected string"));
    CHECK(gguf_get_bool(f, "v.u8", &bl, err, sizeof err) == -1 && strstr(err, "expected bool"));
    CHECK(gguf_get_u32(f, "missing.key", &u, err, sizeof err) == -1 && strstr(err, "missing.key") &&
          strstr(err, "missing") && msg_ok(err, path));
    /* arrays */
    uint64_t n;
    CHECK(gguf_get_arr_len(f, "v.arr_str", &n, err, sizeof err) == 0 && n == 4);
    for (uint64_t i = 0; i < 4; i++)
        CHECK(gguf_get_arr_str(f, "v.arr_str", i, &s, err, sizeof err) == 0 && gguf_str_eq(s, strs[i]));
    CHECK(gguf_get_arr_str(f, "v.arr_str", 4, &s, err, sizeof err) == -1 && strstr(err, "index 4"));
    CHECK(gguf_get_arr_len(f, "v.arr_empty", &n, err, sizeof err) == 0 && n == 0);
    CHECK(gguf_get_arr_str(f, "v.arr_empty", 0, &s, err, sizeof err) == -1);
    CHECK(gguf_get_arr_len(f, "v.u32", &n, err, sizeof err) == -1 && strstr(err, "array"));
    ki = gguf_find_key(f, "v.arr_str");
    CHECK(gguf_kv_array_type(f, ki) == GGUF_TYPE_STRING && gguf_kv_array_len(f, ki) == 4);
    for (int t = 0; t < GGUF_TYPE_COUNT; t++) {
        if (t == GGUF_TYPE_STRING || t == GGUF_TYPE_ARRAY) continue;
        const void *d;
        CHECK_MSG(gguf_get_arr_data(f, key[t], (gguf_type)t, &d, &n, err, sizeof err) == 0, "%s", err);
        CHECK(n == 24 / gguf_type_size((gguf_type)t) && memcmp(d, raw[t], 24) == 0);
        gguf_type other = t == GGUF_TYPE_UINT8 ? GGUF_TYPE_INT8 : GGUF_TYPE_UINT8;
        CHECK(gguf_get_arr_data(f, key[t], other, &d, &n, err, sizeof err) == -1 && strstr(err, key[t]));
    }
    const void *d;
    CHECK(gguf_get_arr_data(f, "v.arr_str", GGUF_TYPE_STRING, &d, &n, err, sizeof err) == -1);
    /* out-of-range accessor indexes are harmless */
    CHECK(gguf_kv_key(f, -1).len == 0 && gguf_kv_key(f, gguf_n_kv(f)).len == 0);
    CHECK(gguf_kv_type(f, 9999) == GGUF_TYPE_COUNT);
    CHECK(gguf_tensor_at(f, -1) == NULL && gguf_tensor_at(f, gguf_n_tensors(f)) == NULL);
    /* tensors */
    CHECK(gguf_n_tensors(f) == 5);
    const gguf_tensor *ta = gguf_find_tensor(f, "a"), *tb = gguf_find_tensor(f, "b"),
                      *tc = gguf_find_tensor(f, "c"), *tq = gguf_find_tensor(f, "q"),
                      *tg = gguf_find_tensor(f, "big");
    CHECK(ta && tb && tc && tq && tg && gguf_find_tensor(f, "x") == NULL);
    if (ta && tb && tc && tq && tg) {
        CHECK(ta->n_dims == 2 && ta->ne[0] == 5 && ta->ne[1] == 3 && ta->ne[2] == 1 &&
              ta->dtype == FM_DTYPE_F32);
        CHECK(ta->supported && ta->ggml_type == 0 && ta->size == sizeof f32d &&
              !memcmp(ta->data, f32d, sizeof f32d));
        CHECK(tb->dtype == FM_DTYPE_F16 && tb->ggml_type == 1 && !memcmp(tb->data, f16d, sizeof f16d));
        CHECK(tc->dtype == FM_DTYPE_BF16 && tc->ggml_type == 30 && tc->n_dims == 3 && tc->ne[2] == 4 &&
              !memcmp(tc->data, bf16d, sizeof bf16d));
        CHECK(tq->dtype == FM_DTYPE_Q8_0 && tq->ggml_type == 8 && tq->n_dims == 4 && tq->ne[3] == 3);
        CHECK(tq->size == 2 * 2 * 3 * 34);
        uint8_t *want = malloc(tg->size > tq->size ? tg->size : tq->size);
        fill_pattern(&c1, want, tq->size);
        CHECK(memcmp(tq->data, want, tq->size) == 0);
        fill_pattern(&c2, want, tg->size);
        CHECK(tg->size == 96 * 7 * 4 && memcmp(tg->data, want, tg->size) == 0);
        free(want);
        for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
            const gguf_tensor *t = gguf_tensor_at(f, i);
            CHECK(t->offset % 32 == 0 && ((uintptr_t)t->data - (uintptr_t)ta->data) % 32 == 0);
        }
    }
    gguf_close(f);

    /* a setter given a non-scalar type makes the write fail clearly instead of writing garbage */
    w = gguf_writer_create();
    uint32_t dummy = 0;
    gguf_writer_set_val(w, "bad", GGUF_TYPE_STRING, &dummy);
    CHECK(gguf_writer_write(w, path, err, sizeof err) == -1 && msg_ok(err, path));
    gguf_writer_free(w);
    /* writing into a missing directory fails with the path named */
    w = gguf_writer_create();
    char bad[1300];
    snprintf(bad, sizeof bad, "%s/no/such/dir/x.gguf", fm_test_tmpdir());
    CHECK(gguf_writer_write(w, bad, err, sizeof err) == -1 && msg_ok(err, bad));
    gguf_writer_free(w);
}

/* ---- 2. a file written by gguf-py ---- */

static void test_gguf_py_fixture(void) {
    char path[1200], err[FM_ERROR_LEN];
    const char *src = getenv("FM_SOURCE_DIR");
    snprintf(path, sizeof path, "%s/tests/fixtures/gguf_py_small.gguf", src ? src : ".");
    gguf_file *f = gguf_open(path, err, sizeof err);
    CHECK_MSG(f != NULL, "%s", err);
    if (!f) return;
    uint32_t u;
    int64_t v;
    float fl;
    int b;
    gguf_str s;
    uint64_t n;
    const void *d;
    CHECK(gguf_get_str(f, "general.architecture", &s, err, sizeof err) == 0 && gguf_str_eq(s, "qwen3"));
    CHECK(gguf_get_u32(f, "t.u8", &u, err, sizeof err) == 0 && u == 200);
    CHECK(gguf_get_i64(f, "t.i8", &v, err, sizeof err) == 0 && v == -100);
    CHECK(gguf_get_u32(f, "t.u16", &u, err, sizeof err) == 0 && u == 60000);
    CHECK(gguf_get_i64(f, "t.i16", &v, err, sizeof err) == 0 && v == -30000);
    CHECK(gguf_get_u32(f, "t.u32", &u, err, sizeof err) == 0 && u == 4000000000u);
    CHECK(gguf_get_i64(f, "t.i32", &v, err, sizeof err) == 0 && v == -2000000000);
    CHECK(gguf_get_f32(f, "t.f32", &fl, err, sizeof err) == 0 && fl == 1.5f);
    CHECK(gguf_get_bool(f, "t.bool", &b, err, sizeof err) == 0 && b == 1);
    CHECK(gguf_get_str(f, "t.str", &s, err, sizeof err) == 0 && gguf_str_eq(s, "h\xc3\xa9llo"));
    CHECK(gguf_get_i64(f, "t.u64", &v, err, sizeof err) == 0 && v == (int64_t)1 << 40);
    CHECK(gguf_get_i64(f, "t.i64", &v, err, sizeof err) == 0 && v == -((int64_t)1 << 40));
    CHECK(gguf_get_f32(f, "t.f64", &fl, err, sizeof err) == 0 && fl == 0.1f);
    CHECK(gguf_get_arr_len(f, "t.arr_str", &n, err, sizeof err) == 0 && n == 3);
    CHECK(gguf_get_arr_str(f, "t.arr_str", 2, &s, err, sizeof err) == 0 &&
          gguf_str_eq(s, "\xc3\xbcn\xc3\xaf"));
    CHECK(gguf_get_arr_str(f, "t.arr_str", 1, &s, err, sizeof err) == 0 && s.len == 0);
    CHECK(gguf_get_arr_data(f, "t.arr_i32", GGUF_TYPE_INT32, &d, &n, err, sizeof err) == 0 && n == 3);
    if (n == 3) {
        int32_t iv[3];
        memcpy(iv, d, sizeof iv);
        CHECK(iv[0] == 1 && iv[1] == -2 && iv[2] == 3);
    }
    CHECK(gguf_n_tensors(f) == 3);
    const gguf_tensor *a = gguf_find_tensor(f, "a.f32"), *h = gguf_find_tensor(f, "b.f16"),
                      *q = gguf_find_tensor(f, "c.q8_0");
    CHECK(a && h && q);
    if (a && h && q) {
        CHECK(a->n_dims == 2 && a->ne[0] == 16 && a->ne[1] == 4 && a->dtype == FM_DTYPE_F32 &&
              a->size == 256);
        CHECK(h->ne[0] == 32 && h->ne[1] == 2 && h->dtype == FM_DTYPE_F16);
        CHECK(q->ne[0] == 32 && q->ne[1] == 2 && q->dtype == FM_DTYPE_Q8_0 && q->size == 68);
        for (int i = 0; i < 64; i++) {
            float x, want = ((float)i - 32) / 8;
            memcpy(&x, (const uint8_t *)a->data + 4 * i, 4);
            CHECK(x == want);
            uint16_t hv;
            memcpy(&hv, (const uint8_t *)h->data + 2 * i, 2);
            CHECK(fm_f16_to_f32(hv) == want);
        }
        /* Q8_0 block 0 holds -4 .. -0.125: d = 4/127, q[0] = -127 */
        fm_block_q8_0 blk;
        memcpy(&blk, q->data, sizeof blk);
        CHECK(blk.qs[0] == -127);
        CHECK_NEAR(fm_f16_to_f32(blk.d), 4.0 / 127, 1e-5);
    }
    gguf_close(f);
}

/* ---- 3. malformed files ---- */

static void test_base_valid(const bytes *b, const layout *L) {
    char err[FM_ERROR_LEN];
    gguf_file *f = gguf_open_memory(b->p, b->n, "base.gguf", err, sizeof err);
    CHECK_MSG(f != NULL, "%s", err);
    if (!f) return;
    CHECK(gguf_n_kv(f) == 5 && gguf_n_tensors(f) == 3);
    const gguf_tensor *t = gguf_find_tensor(f, "t.c");
    CHECK(t && t->size == 48 && t->data == b->p + L->data_start + 352);
    gguf_close(f);
    /* v2 has the same layout */
    uint8_t *c = malloc(b->n);
    memcpy(c, b->p, b->n);
    p_u32(c, L->version, 2);
    f = gguf_open_memory(c, b->n, "v2.gguf", err, sizeof err);
    CHECK_MSG(f && gguf_version(f) == 2, "%s", err);
    gguf_close(f);
    free(c);
}

static void test_truncation(const bytes *b, const layout *L) {
    char err[FM_ERROR_LEN], name[64];
    /* every prefix up to the end of the table and through the data: all needed bytes are the whole file */
    for (size_t n = 0; n < L->total; n++) {
        snprintf(name, sizeof name, "trunc%zu.gguf", n);
        int ok = open_copy(b->p, n, name, err, sizeof err);
        CHECK_MSG(!ok, "truncated at %zu of %zu opened", n, L->total);
    }
    CHECK(open_copy(b->p, L->total, "full.gguf", err, sizeof err) == 1);
    /* at the end of the table the message speaks of the data of the first tensor */
    open_copy(b->p, L->table_end + 5, "cut.gguf", err, sizeof err);
    CHECK_MSG(strstr(err, "tensor t.a: data ends at byte") && strstr(err, "past the end of the file"), "%s",
              err);
    /* trailing bytes after the last tensor are fine */
    bytes longer = {0};
    b_put(&longer, b->p, b->n);
    b_put(&longer, "extra", 5);
    CHECK(open_copy(longer.p, longer.n, "longer.gguf", err, sizeof err) == 1);
    free(longer.p);
}

typedef void (*patch_fn)(uint8_t *p, const layout *L);

static void run_case(const bytes *b, const layout *L, const char *name, patch_fn patch, const char *want) {
    uint8_t *c = malloc(b->n);
    memcpy(c, b->p, b->n);
    patch(c, L);
    expect_fail(c, b->n, name, want);
    free(c);
}

#define PATCH(fn, body)                                                                                      \
    static void fn(uint8_t *p, const layout *L) {                                                            \
        (void)L;                                                                                             \
        body;                                                                                                \
    }
PATCH(pt_magic, memcpy(p, "GGUX", 4))
PATCH(pt_v1, p_u32(p, L->version, 1))
PATCH(pt_v4, p_u32(p, L->version, 4))
PATCH(pt_bigendian, p_u32(p, L->version, 0x03000000u))
PATCH(pt_nkv_huge, p_u64(p, L->n_kv, 1ull << 60))
PATCH(pt_nkv_max, p_u64(p, L->n_kv, UINT64_MAX))
PATCH(pt_nkv_plus1, p_u64(p, L->n_kv, 6))
PATCH(pt_nt_huge, p_u64(p, L->n_tensors, 1ull << 60))
PATCH(pt_nt_plus1, p_u64(p, L->n_tensors, 4))
PATCH(pt_key_len_huge, p_u64(p, L->k_arch_len, 1ull << 63))
PATCH(pt_key_len_zero, p_u64(p, L->k_arch_len, 0))
PATCH(pt_type13, p_u32(p, L->k_arch_type, 13))
PATCH(pt_type255, p_u32(p, L->k_arch_type, 255))
PATCH(pt_str_len_huge, p_u64(p, L->v_arch_len, UINT64_MAX))
PATCH(pt_str_len_past, p_u64(p, L->v_arch_len, L->total - L->v_arch_len - 8 + 1))
PATCH(pt_arr_type13, p_u32(p, L->strs_elem_type, 13))
PATCH(pt_arr_strs_huge, p_u64(p, L->strs_count, 1ull << 60))
PATCH(pt_arr_str_len_huge, p_u64(p, L->strs_first_len, 1ull << 62))
PATCH(pt_arr_ints_huge, p_u64(p, L->ints_count, 1ull << 62)) /* count * 4 overflows 64 bits */
PATCH(pt_arr_ints_big, p_u64(p, L->ints_count, 1ull << 40))
PATCH(pt_dup_key, memcpy(p + L->k_arr_name, "test.u32", 8))
PATCH(pt_align0, p_u32(p, L->align_val, 0))
PATCH(pt_align3, p_u32(p, L->align_val, 3))
PATCH(pt_align_type, p_u32(p, L->align_type, GGUF_TYPE_INT32))
PATCH(pt_align64, p_u32(p, L->align_val, 64)) /* t.c at 352 is then misaligned */
PATCH(pt_ndims0, p_u32(p, L->t_ndims[0], 0))
PATCH(pt_ndims5, p_u32(p, L->t_ndims[0], 5))
PATCH(pt_dim_zero, p_u64(p, L->t_ne[0] + 8, 0))
PATCH(pt_dim_huge, p_u64(p, L->t_ne[0] + 8, UINT64_MAX))
PATCH(pt_dim_overflow, p_u64(p, L->t_ne[2], 1ull << 40); p_u64(p, L->t_ne[2] + 8, 1ull << 40))
PATCH(pt_size_past, p_u64(p, L->t_ne[1], 1ull << 40))
PATCH(pt_size_overflow, p_u64(p, L->t_ne[1], 1ull << 62)) /* 2^57 blocks * 34 bytes: past any file */
PATCH(pt_type_unknown, p_u32(p, L->t_type[0], 1000))
PATCH(pt_type_retired, p_u32(p, L->t_type[0], 4))
PATCH(pt_q4k_block, p_u32(p, L->t_type[0], 12)) /* q4_K needs ne[0] % 256 == 0 */
PATCH(pt_q8_block, p_u32(p, L->t_type[2], 8))   /* q8_0 with ne[0] = 2 */
PATCH(pt_misaligned, p_u64(p, L->t_off[1], 257))
PATCH(pt_overlap, p_u64(p, L->t_off[1], 224))
PATCH(pt_overlap_same, p_u64(p, L->t_off[2], 256))
PATCH(pt_past_eof, p_u64(p, L->t_off[2], 384))
PATCH(pt_off_overflow, p_u64(p, L->t_off[2], UINT64_MAX - 31))
PATCH(pt_dup_tensor, memcpy(p + L->t_name[2] + 8, "t.a", 3))
PATCH(pt_name_len_huge, p_u64(p, L->t_name[1], 1ull << 61))
PATCH(pt_name_empty, p_u64(p, L->t_name[0], 0))

static void test_malformed(const bytes *b, const layout *L) {
    static const struct {
        const char *name;
        patch_fn fn;
        const char *want;
    } cases[] = {
        {"magic.gguf", pt_magic, "not a GGUF file"},
        {"v1.gguf", pt_v1, "version 1 is not supported"},
        {"v4.gguf", pt_v4, "version 4"},
        {"be.gguf", pt_bigendian, "big-endian"},
        {"nkv_huge.gguf", pt_nkv_huge, "metadata entries"},
        {"nkv_max.gguf", pt_nkv_max, "metadata entries"},
        {"nkv_plus1.gguf", pt_nkv_plus1, NULL},
        {"nt_huge.gguf", pt_nt_huge, "tensors"},
        {"nt_plus1.gguf", pt_nt_plus1, NULL},
        {"keylen_huge.gguf", pt_key_len_huge, "string length"},
        {"keylen_zero.gguf", pt_key_len_zero, NULL},
        {"type13.gguf", pt_type13, "value type 13"},
        {"type255.gguf", pt_type255, "value type 255"},
        {"strlen_huge.gguf", pt_str_len_huge, "general.architecture: string length"},
        {"strlen_past.gguf", pt_str_len_past, "runs past the end"},
        {"arrtype13.gguf", pt_arr_type13, "element type 13"},
        {"arr_strs_huge.gguf", pt_arr_strs_huge, "test.strings"},
        {"arr_strlen.gguf", pt_arr_str_len_huge, "test.strings"},
        {"arr_ints_huge.gguf", pt_arr_ints_huge, "test.arr"},
        {"arr_ints_big.gguf", pt_arr_ints_big, "test.arr"},
        {"dup_key.gguf", pt_dup_key, "duplicate metadata key test.u32"},
        {"align0.gguf", pt_align0, "general.alignment = 0 is not a power of two"},
        {"align3.gguf", pt_align3, "general.alignment = 3 is not a power of two"},
        {"align_type.gguf", pt_align_type, "general.alignment has type int32"},
        {"align64.gguf", pt_align64, "alignment 64"},
        {"ndims0.gguf", pt_ndims0, "tensor t.a: n_dims 0"},
        {"ndims5.gguf", pt_ndims5, "tensor t.a: n_dims 5"},
        {"dim0.gguf", pt_dim_zero, "tensor t.a: dimension 1 is 0"},
        {"dimhuge.gguf", pt_dim_huge, "tensor t.a: dimension 1 is 18446744073709551615"},
        {"dimoverflow.gguf", pt_dim_overflow, "tensor t.c: element count overflows"},
        {"size_past.gguf", pt_size_past, "tensor t.b: data ends at byte"},
        {"size_overflow.gguf", pt_size_overflow, "tensor t.b"},
        {"type_unknown.gguf", pt_type_unknown, "tensor t.a: ggml type 1000 is unknown"},
        {"type_retired.gguf", pt_type_retired, "ggml type 4 is unknown"},
        {"q4k_block.gguf", pt_q4k_block, "q4_K block size 256"},
        {"q8_block.gguf", pt_q8_block, "q8_0 block size 32"},
        {"misaligned.gguf", pt_misaligned,
         "tensor t.b: data offset 257 is not a multiple of the alignment 32"},
        {"overlap.gguf", pt_overlap, "tensors t.a and t.b overlap"},
        {"overlap_same.gguf", pt_overlap_same, "overlap"},
        {"past_eof.gguf", pt_past_eof, "tensor t.c: data ends at byte"},
        {"off_overflow.gguf", pt_off_overflow, "tensor t.c"},
        {"dup_tensor.gguf", pt_dup_tensor, "duplicate tensor name t.a"},
        {"namelen_huge.gguf", pt_name_len_huge, "tensor info 1 name"},
        {"name_empty.gguf", pt_name_empty, "empty name"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_case(b, L, cases[i].name, cases[i].fn, cases[i].want);
}

/* An unsupported-but-known ggml type is accepted in the table, marked unsupported and named. */
static void test_unsupported_type(const bytes *b, const layout *L) {
    uint8_t *c = malloc(b->n);
    memcpy(c, b->p, b->n);
    p_u64(c, L->t_ne[0],
          256); /* t.a: q4_K [256, 2] = 2 blocks of 144 bytes = 288, exactly the 0..288 range */
    p_u32(c, L->t_type[0], 12);
    p_u64(c, L->t_off[1], 288); /* t.b: q8_0 [64] = 68 bytes, 288..356 */
    p_u64(c, L->t_off[2], 384); /* t.c: f16 [1,1,4] = 8 bytes, 384..392, inside the 400 data bytes */
    p_u64(c, L->t_ne[2], 1);
    p_u64(c, L->t_ne[2] + 8, 1);
    char err[FM_ERROR_LEN];
    gguf_file *f = gguf_open_memory(c, b->n, "q4k.gguf", err, sizeof err);
    CHECK_MSG(f != NULL, "%s", err);
    if (f) {
        const gguf_tensor *t = gguf_find_tensor(f, "t.a");
        CHECK(t && t->supported && t->dtype == FM_DTYPE_Q4_K && t->ggml_type == 12 && t->size == 288);
        CHECK(t && strcmp(gguf_ggml_type_name(t->ggml_type), "q4_K") == 0);
        CHECK(gguf_find_tensor(f, "t.b")->supported == 1);
        gguf_close(f);
    }
    CHECK(strcmp(gguf_ggml_type_name(30), "bf16") == 0 && strcmp(gguf_ggml_type_name(999), "unknown") == 0);
    free(c);
}

/* Nested arrays are accepted structurally; too deep nesting is refused. */
static void test_nested_arrays(void) {
    char err[FM_ERROR_LEN];
    for (int depth = 1; depth <= 10; depth++) {
        bytes b = {0};
        b_put(&b, "GGUF", 4);
        b_u32(&b, 3);
        b_u64(&b, 0);
        b_u64(&b, 2);
        b_str(&b, "nested");
        b_u32(&b, GGUF_TYPE_ARRAY);
        for (int i = 0; i < depth; i++) { /* depth levels of [x], innermost two int32 */
            b_u32(&b, GGUF_TYPE_ARRAY);
            b_u64(&b, 1);
        }
        b_u32(&b, GGUF_TYPE_INT32);
        b_u64(&b, 2);
        b_u64(&b, 0x0000000200000001ull);
        b_str(&b, "after");
        b_u32(&b, GGUF_TYPE_STRING);
        b_str(&b, "ok");
        char name[32];
        snprintf(name, sizeof name, "nested%d.gguf", depth);
        uint8_t *c = malloc(b.n);
        memcpy(c, b.p, b.n);
        gguf_file *f = gguf_open_memory(c, b.n, name, err, sizeof err);
        if (depth <= 7) {
            CHECK_MSG(f != NULL, "depth %d: %s", depth, err);
            if (f) {
                int64_t i = gguf_find_key(f, "nested");
                CHECK(gguf_kv_array_type(f, i) == GGUF_TYPE_ARRAY && gguf_kv_array_len(f, i) == 1);
                const void *d;
                uint64_t n;
                CHECK(gguf_get_arr_data(f, "nested", GGUF_TYPE_ARRAY, &d, &n, err, sizeof err) == -1);
                gguf_str s;
                CHECK(gguf_get_str(f, "after", &s, err, sizeof err) == 0 && gguf_str_eq(s, "ok"));
            }
        } else {
            CHECK_MSG(f == NULL && strstr(err, "nested more than"), "depth %d", depth);
            CHECK(msg_ok(err, name));
        }
        gguf_close(f);
        free(c);
        free(b.p);
    }
    /* an array of arrays with a huge inner count */
    bytes b = {0};
    b_put(&b, "GGUF", 4);
    b_u32(&b, 3);
    b_u64(&b, 0);
    b_u64(&b, 1);
    b_str(&b, "nested");
    b_u32(&b, GGUF_TYPE_ARRAY);
    b_u32(&b, GGUF_TYPE_ARRAY);
    b_u64(&b, 1);
    b_u32(&b, GGUF_TYPE_STRING);
    b_u64(&b, 1ull << 59);
    expect_fail(b.p, b.n, "nested_huge.gguf", "nested");
    free(b.p);
}

/* Every byte of the header and table replaced by a few values: no crash (ASan), clean message or success. */
static void test_byte_corruption(const bytes *b, const layout *L) {
    static const uint8_t vals[] = {0x00, 0x01, 0x20, 0x7f, 0x80, 0xff};
    char err[FM_ERROR_LEN];
    uint8_t *c = malloc(b->n);
    int opened = 0, refused = 0;
    for (size_t i = 0; i < L->table_end; i++) {
        for (size_t k = 0; k < sizeof vals; k++) {
            memcpy(c, b->p, b->n);
            if (c[i] == vals[k]) continue;
            c[i] = vals[k];
            if (open_copy(c, b->n, "flip.gguf", err, sizeof err))
                opened++;
            else
                refused++;
        }
    }
    CHECK(refused > 0 && opened > 0); /* e.g. a changed string byte is fine, a changed count is not */
    free(c);
}

static void test_files(void) {
    char err[FM_ERROR_LEN], path[1200];
    snprintf(path, sizeof path, "%s/does-not-exist.gguf", fm_test_tmpdir());
    CHECK(gguf_open(path, err, sizeof err) == NULL && msg_ok(err, path) && strstr(err, "cannot open"));
    CHECK(gguf_open(fm_test_tmpdir(), err, sizeof err) == NULL && strstr(err, "not a regular file"));
    snprintf(path, sizeof path, "%s/empty.gguf", fm_test_tmpdir());
    FILE *fp = fopen(path, "wb");
    if (fp) fclose(fp);
    CHECK(gguf_open(path, err, sizeof err) == NULL && msg_ok(err, path) && strstr(err, "not a GGUF file"));
    snprintf(path, sizeof path, "%s/text.gguf", fm_test_tmpdir());
    fp = fopen(path, "wb");
    if (fp) {
        fputs("{\"this\": \"is json\"}\n", fp);
        fclose(fp);
    }
    CHECK(gguf_open(path, err, sizeof err) == NULL && msg_ok(err, path) && strstr(err, "not a GGUF file"));
    CHECK(gguf_open_memory(NULL, 0, NULL, err, sizeof err) == NULL && err[0]);
}

/* gguf_make_resident keeps every pointer and byte: a 5 MiB tensor (spanning huge pages) read back at the same
 * address after the move, whether or not this kernel grants huge pages (then the mapping stays). */
static void test_make_resident(void) {
    char err[FM_ERROR_LEN], path[1200];
    snprintf(path, sizeof path, "%s/gguf_resident.gguf", fm_test_tmpdir());
    gguf_writer *w = gguf_writer_create();
    fill_ctx c = {11};
    int64_t ne[2] = {1024, 1280}; /* 5 MiB of f32 */
    CHECK(gguf_writer_add_tensor_fn(w, "w", 2, ne, FM_DTYPE_F32, fill_pattern, &c, err, sizeof err) == 0);
    CHECK_MSG(gguf_writer_write(w, path, err, sizeof err) == 0, "%s", err);
    gguf_writer_free(w);
    gguf_file *f = gguf_open(path, err, sizeof err);
    CHECK_MSG(f != NULL, "%s", err);
    if (!f) return;
    const gguf_tensor *t = gguf_find_tensor(f, "w");
    CHECK(t != NULL && t->size == (uint64_t)(4 * 1024 * 1280));
    if (!t) {
        gguf_close(f);
        return;
    }
    const void *before = t->data;
    fm_pool *pool = fm_pool_create(2);
    const int moved = gguf_make_resident(f, pool);
    CHECK(moved == 0 || moved == 1);
    CHECK(gguf_make_resident(f, pool) == 0); /* a second call has nothing to do */
    t = gguf_find_tensor(f, "w");
    CHECK(t->data == before);
    size_t bad = 0;
    for (size_t i = 0; i < t->size; i++) bad += ((const uint8_t *)t->data)[i] != (uint8_t)(11 + i * 13);
    CHECK_MSG(bad == 0, "%zu of %llu bytes differ after gguf_make_resident (moved %d)", bad,
              (unsigned long long)t->size, moved);
    CHECK(gguf_version(f) == 3 && strcmp(gguf_path(f), path) == 0); /* the header, in the same image */
    printf("test_gguf: make_resident %s\n",
           moved ? "moved the image into huge pages" : "kept the file mapping");
    fm_pool_free(pool);
    gguf_close(f);
}

int main(void) {
    test_make_resident();
    test_round_trip();
    test_gguf_py_fixture();
    layout L;
    bytes b = base_file(&L);
    test_base_valid(&b, &L);
    test_truncation(&b, &L);
    test_malformed(&b, &L);
    test_unsupported_type(&b, &L);
    test_nested_arrays();
    test_byte_corruption(&b, &L);
    test_files();
    free(b.p);
    return fm_test_report("test_gguf");
}
