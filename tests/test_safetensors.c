/* test_safetensors.c: the safetensors reader on files written by the writer, and on hand-built corrupt
 * images of every kind (truncation, bad JSON, overlaps, bad dtype, huge header length, bad shapes). */
#include <stdint.h>
#include <string.h>

#include "core/error.h"
#include "io/safetensors.h"
#include "test_util.h"

/* An image: u64 length + header + `data_bytes` zero bytes of data. */
static size_t make_image(uint8_t *buf, size_t cap, const char *header, size_t data_bytes) {
    size_t n = strlen(header);
    if (8 + n + data_bytes > cap) return 0;
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, header, n);
    memset(buf + 8 + n, 0, data_bytes);
    return 8 + n + data_bytes;
}

/* Opens an image expecting failure with `needle` in the message. */
static void expect_fail(const char *header, size_t data_bytes, const char *needle) {
    static uint8_t buf[4096];
    char err[FM_ERROR_LEN] = "";
    size_t n = make_image(buf, sizeof buf, header, data_bytes);
    st_file *f = st_open_memory(buf, n, "bad.safetensors", err, sizeof err);
    CHECK_MSG(f == NULL, "accepted: %s", header);
    CHECK_MSG(strstr(err, needle) != NULL && strstr(err, "bad.safetensors") != NULL, "error '%s' lacks '%s'",
              err, needle);
    st_close(f);
}

static void test_roundtrip(void) {
    char err[FM_ERROR_LEN] = "", path[1200];
    snprintf(path, sizeof path, "%s/st_roundtrip.safetensors", fm_test_tmpdir());
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[3] = {fm_f32_to_bf16(1.5f), fm_f32_to_bf16(-2.0f), fm_f32_to_bf16(0.25f)};
    uint16_t c[1] = {fm_f32_to_f16(3.0f)};
    st_writer *w = st_writer_create();
    int64_t sa[2] = {2, 3}, sb[1] = {3};
    CHECK(st_writer_add(w, "b.weight", FM_DTYPE_F32, 2, sa, a, err, sizeof err) == 0);
    CHECK(st_writer_add(w, "a.bias", FM_DTYPE_BF16, 1, sb, b, err, sizeof err) == 0);
    CHECK(st_writer_add(w, "scalar", FM_DTYPE_F16, 0, NULL, c, err, sizeof err) == 0);
    CHECK(st_writer_add(w, "a.bias", FM_DTYPE_BF16, 1, sb, b, err, sizeof err) != 0); /* duplicate */
    CHECK(strstr(err, "twice") != NULL);
    CHECK(st_writer_write(w, path, err, sizeof err) == 0);
    st_writer_free(w);

    st_file *f = st_open(path, err, sizeof err);
    CHECK_MSG(f != NULL, "%s", err);
    if (!f) return;
    CHECK(st_n_tensors(f) == 3);
    CHECK(!strcmp(st_tensor_at(f, 0)->name, "a.bias")); /* name order */
    const st_tensor *t = st_find(f, "b.weight");
    CHECK(t && t->supported && t->dtype == FM_DTYPE_F32 && t->n_dims == 2 && t->shape[0] == 2 &&
          t->shape[1] == 3);
    CHECK(t && !memcmp(t->data, a, sizeof a) && ((uintptr_t)t->data % 4) == 0);
    t = st_find(f, "a.bias");
    CHECK(t && t->dtype == FM_DTYPE_BF16 && fm_bf16_to_f32(((const uint16_t *)t->data)[1]) == -2.0f);
    t = st_find(f, "scalar");
    CHECK(t && t->n_dims == 0 && t->n_elems == 1 && fm_f16_to_f32(*(const uint16_t *)t->data) == 3.0f);
    CHECK(st_find(f, "missing") == NULL);
    st_close(f);

    /* A file that does not exist, and a truncated copy of the good one. */
    f = st_open("/nonexistent/x.safetensors", err, sizeof err);
    CHECK(f == NULL && strstr(err, "/nonexistent/x.safetensors") != NULL);
    FILE *fp = fopen(path, "rb");
    static uint8_t img[4096];
    size_t n = fp ? fread(img, 1, sizeof img, fp) : 0;
    if (fp) fclose(fp);
    for (size_t cut = 0; cut < n; cut += (cut < 16 ? 1 : 7)) {
        f = st_open_memory(img, cut, "cut.safetensors", err, sizeof err);
        CHECK_MSG(f == NULL, "truncated at %zu of %zu accepted", cut, n);
        st_close(f);
    }
    f = st_open_memory(img, n, "whole.safetensors", err, sizeof err);
    CHECK_MSG(f != NULL, "%s", err);
    st_close(f);
}

static void test_valid_variants(void) {
    static uint8_t buf[1024];
    char err[FM_ERROR_LEN] = "";
    /* __metadata__ is ignored; an unused non-float dtype is listed and marked unsupported; empty tensors. */
    const char *h =
        "{\"__metadata__\":{\"format\":\"pt\"},\"x\":{\"dtype\":\"I64\",\"shape\":[2],"
        "\"data_offsets\":[0,16]},\"e\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[16,16]}}";
    size_t n = make_image(buf, sizeof buf, h, 16);
    st_file *f = st_open_memory(buf, n, "ok.safetensors", err, sizeof err);
    CHECK_MSG(f != NULL, "%s", err);
    if (f) {
        CHECK(st_n_tensors(f) == 2);
        const st_tensor *t = st_find(f, "x");
        CHECK(t && !t->supported && !strcmp(t->dtype_name, "I64"));
        CHECK(st_find(f, "__metadata__") == NULL);
        st_close(f);
    }
    /* Empty header object. */
    n = make_image(buf, sizeof buf, "{}", 0);
    f = st_open_memory(buf, n, "empty.safetensors", err, sizeof err);
    CHECK(f != NULL && st_n_tensors(f) == 0);
    st_close(f);
}

static void test_corrupt(void) {
    static uint8_t buf[64];
    char err[FM_ERROR_LEN] = "";
    /* Huge and too-long header lengths. */
    memset(buf, 0, sizeof buf);
    buf[7] = 0x7f;
    st_file *f = st_open_memory(buf, sizeof buf, "huge.safetensors", err, sizeof err);
    CHECK(f == NULL && strstr(err, "not a safetensors file") && strstr(err, "huge.safetensors"));
    memset(buf, 0, sizeof buf);
    buf[0] = 200;
    f = st_open_memory(buf, sizeof buf, "long.safetensors", err, sizeof err);
    CHECK(f == NULL && strstr(err, "exceeds the file"));
    f = st_open_memory(buf, 5, "short.safetensors", err, sizeof err);
    CHECK(f == NULL && strstr(err, "too short"));
    memcpy(buf, "GGUF\3\0\0\0", 8); /* a GGUF where safetensors are expected */
    f = st_open_memory(buf, sizeof buf, "model.gguf", err, sizeof err);
    CHECK(f == NULL && strstr(err, "model.gguf: a GGUF file, not safetensors"));

    expect_fail("{\"a\":", 0, "not a JSON object");
    expect_fail("[1,2]", 0, "not a JSON object");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}} trailing", 8, "JSON");
    expect_fail("{\"a\":3}", 0, "expected a JSON object");
    expect_fail("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "dtype");
    expect_fail("{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "unknown dtype 'Q4'");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "shape");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,2],\"data_offsets\":[0,8]}}", 8, "rank 5");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "shape[0]");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8, "shape[0]");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8, "shape[0]");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, "[begin, end]");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, "begin 8 > end 0");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4,
                "past the data section");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "needs 12 bytes");
    expect_fail("{\"a\":{\"dtype\":\"BF16\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8,
                "needs more than");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                12, "overlap");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
                16, "appears twice");
}

int main(void) {
    test_roundtrip();
    test_valid_variants();
    test_corrupt();
    return fm_test_report("test_safetensors");
}
