/* test_quant_k.c: the K-quant bytes flashmap writes, and the K-quant format as a whole, decode through our
 * fm_dequant_row_k (Q4_0 / Q5_0: fm_dequant_row_legacy) to the same float32 values as through the gguf Python
 * package (llama.cpp's gguf-py: gguf.quants.dequantize, code nobody here wrote), from
 * tests/fixtures/quant_k/gguf_py_dequant.json (written by tests/fixtures/make_quant_k_fixture.py; its
 * docstring says what it holds).
 *   1. models: `$FM_CLI synth target <synth_args>` writes the fixture's small Q4_K_M / Q5_K_M (and Q4_0 /
 *      Q5_0) models again;
 *      the file's sha256 must be the fixture's (else the synthesizer changed: regenerate the fixture), each
 *      K-quant tensor's bytes must hash as the fixture's, and their decoding must hash as gguf-py's;
 *   2. random_blocks: blocks of random bytes (all scale and sign patterns) decode to gguf-py's floats.
 * No tolerance: every product in the decoding is exact in float32 (f16 scales times 6- or 8-bit scales times
 * quants of at most 6 bits) and only the final subtraction of Q4_K / Q5_K rounds, so any evaluation order
 * gives the same bits (the fixture script explains it). On a mismatch the sampled values show how far off. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "cpu/quant_k.h"
#include "cpu/quant_legacy.h"
#include "io/gguf.h"
#include "test_util.h"

static const cJSON *get(const cJSON *o, const char *k) {
    return cJSON_GetObjectItemCaseSensitive(o, k);
}

static const char *str(const cJSON *o, const char *k) {
    const cJSON *v = get(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static void sha_hex(const void *p, size_t n, char hex[65]) {
    fm_sha256 s;
    fm_sha256_init(&s);
    fm_sha256_update(&s, p, n);
    uint8_t d[32];
    fm_sha256_final(&s, d);
    fm_sha256_hex(d, hex);
}

/* Our floats (little-endian float32, as the fixture hashes them: this is an x86-64 / little-endian test)
 * against gguf-py's hash and sampled values; returns 1 when they agree. */
static int compare_floats(const char *what, const float *w, int64_t n, const char *want_sha, const cJSON *idx,
                          const cJSON *vals) {
    char hex[65];
    sha_hex(w, (size_t)n * sizeof *w, hex);
    int n_s = cJSON_GetArraySize(vals), bad = 0;
    double worst = 0;
    for (int i = 0; i < n_s; i++) {
        const int64_t at = idx ? (int64_t)cJSON_GetArrayItem(idx, i)->valuedouble : i;
        const float want = (float)cJSON_GetArrayItem(vals, i)->valuedouble;
        if (at < 0 || at >= n) {
            bad++;
            continue;
        }
        if (w[at] != want) {
            if (bad++ < 3)
                fprintf(stderr, "%s: value %lld: ours %.9g, gguf-py %.9g\n", what, (long long)at, w[at],
                        want);
            worst = fmax(worst, fabs((double)w[at] - want));
        }
    }
    CHECK_MSG(bad == 0, "%s: %d of %d sampled values differ from gguf-py's (worst by %.3g)", what, bad, n_s,
              worst);
    CHECK_MSG(strcmp(hex, want_sha) == 0, "%s: floats sha256 %s, gguf-py's %s", what, hex, want_sha);
    return bad == 0 && strcmp(hex, want_sha) == 0;
}

static int parse_type(const char *name, fm_dtype *t) {
    return fm_dtype_parse(name, t) == 0 && (fm_dtype_is_k_quant(*t) || fm_dtype_is_legacy_quant(*t)) ? 0 : -1;
}

/* n weights of type t (a K-quant, Q4_0 or Q5_0) from their blocks. */
static void dequant(fm_dtype t, const void *blocks, float *out, int64_t n) {
    if (fm_dtype_is_legacy_quant(t))
        fm_dequant_row_legacy(t, blocks, out, n);
    else
        fm_dequant_row_k(t, blocks, out, n);
}

static void check_model(const cJSON *m, const char *cli) {
    char path[1200], cmd[4096], hex[65], err[FM_ERROR_LEN];
    const char *name = str(m, "name");
    snprintf(path, sizeof path, "%s/quant_k_%s.gguf", fm_test_tmpdir(), name);
    int n = snprintf(cmd, sizeof cmd, "'%s' synth target -q -o '%s'", cli, path);
    const cJSON *a;
    cJSON_ArrayForEach(a, get(m, "synth_args")) {
        if (cJSON_IsString(a) && n < (int)sizeof cmd - 64)
            n += snprintf(cmd + n, sizeof cmd - (size_t)n, " '%s'", a->valuestring);
    }
    int rc = system(cmd);
    CHECK_MSG(rc == 0, "%s: `%s` failed (%d)", name, cmd, rc);
    if (rc) return;
    CHECK_MSG(fm_test_sha256_file(path, hex) == 0 && strcmp(hex, str(m, "sha256")) == 0,
              "%s: synth output changed (sha256 %s, fixture %s): regenerate tests/fixtures/quant_k with "
              "make_quant_k_fixture.py",
              name, hex, str(m, "sha256"));
    gguf_file *f = gguf_open(path, err, sizeof err);
    CHECK_MSG(f != NULL, "%s: %s", name, err);
    if (!f) return;
    int n_ok = 0, n_t = 0, by_type[FM_DTYPE_COUNT] = {0};
    const cJSON *ft;
    cJSON_ArrayForEach(ft, get(m, "tensors")) {
        char what[160];
        snprintf(what, sizeof what, "%s: %s", name, str(ft, "name"));
        n_t++;
        const gguf_tensor *t = gguf_find_tensor(f, str(ft, "name"));
        fm_dtype want_t;
        CHECK_MSG(t && parse_type(str(ft, "type"), &want_t) == 0 && t->supported && t->dtype == want_t &&
                      t->n_dims == 2 && t->ne[0] == cJSON_GetArrayItem(get(ft, "ne"), 0)->valueint &&
                      t->ne[1] == cJSON_GetArrayItem(get(ft, "ne"), 1)->valueint,
                  "%s: missing, or not the fixture's type and shape", what);
        if (!t || !t->supported || t->dtype != want_t) continue;
        sha_hex(t->data, t->size, hex);
        CHECK_MSG(strcmp(hex, str(ft, "bytes_sha256")) == 0, "%s: bytes differ from the fixture's", what);
        if (strcmp(hex, str(ft, "bytes_sha256")) != 0) continue;
        const int64_t count = t->ne[0] * t->ne[1];
        float *w = malloc((size_t)count * sizeof *w);
        if (!w) continue;
        const size_t rb = fm_dtype_row_bytes(t->dtype, t->ne[0]);
        for (int64_t r = 0; r < t->ne[1]; r++)
            dequant(t->dtype, (const uint8_t *)t->data + (size_t)r * rb, w + r * t->ne[0], t->ne[0]);
        if (compare_floats(what, w, count, str(ft, "floats_sha256"), get(ft, "sample_index"),
                           get(ft, "sample_value")))
            n_ok++, by_type[t->dtype]++;
        free(w);
    }
    printf("%s: %d/%d quantised tensors decode to gguf-py's floats (q4_k %d, q5_k %d, q6_k %d, q4_0 %d, q5_0 "
           "%d)\n",
           name, n_ok, n_t, by_type[FM_DTYPE_Q4_K], by_type[FM_DTYPE_Q5_K], by_type[FM_DTYPE_Q6_K],
           by_type[FM_DTYPE_Q4_0], by_type[FM_DTYPE_Q5_0]);
    CHECK(n_t > 10);
    gguf_close(f);
    remove(path);
}

static int hex_nibble(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static void check_random_blocks(const cJSON *rb) {
    fm_dtype t;
    const char *type = str(rb, "type"), *hx = str(rb, "hex");
    const int nb = get(rb, "n_blocks") ? get(rb, "n_blocks")->valueint : 0;
    CHECK_MSG(parse_type(type, &t) == 0 && nb > 0, "random_blocks: bad entry '%s'", type);
    if (parse_type(type, &t) || nb <= 0) return;
    const size_t bytes = (size_t)nb * (size_t)fm_dtype_block_bytes(t);
    CHECK_MSG(strlen(hx) == 2 * bytes, "random_blocks %s: %zu hex digits for %zu bytes", type, strlen(hx),
              bytes);
    if (strlen(hx) != 2 * bytes) return;
    uint8_t *blk = malloc(bytes);
    const int64_t n = (int64_t)nb * fm_dtype_block_elems(t);
    float *w = malloc((size_t)n * sizeof *w);
    if (blk && w) {
        for (size_t i = 0; i < bytes; i++)
            blk[i] = (uint8_t)(hex_nibble(hx[2 * i]) << 4 | hex_nibble(hx[2 * i + 1]));
        dequant(t, blk, w, n);
        char what[64];
        snprintf(what, sizeof what, "random %s blocks", type);
        if (compare_floats(what, w, n, str(rb, "floats_sha256"), NULL, get(rb, "first")))
            printf("%s: %d blocks decode to gguf-py's floats\n", what, nb);
    }
    free(blk);
    free(w);
}

int main(void) {
    const char *src = getenv("FM_SOURCE_DIR"), *cli = getenv("FM_CLI");
    char path[1200];
    snprintf(path, sizeof path, "%s/tests/fixtures/quant_k/gguf_py_dequant.json", src ? src : ".");
    char *text = fm_test_read_file(path, NULL);
    CHECK_MSG(text != NULL, "cannot read %s (set FM_SOURCE_DIR)", path);
    if (!text) return fm_test_report("test_quant_k");
    cJSON *doc = cJSON_Parse(text);
    CHECK_MSG(doc != NULL, "%s is not valid JSON", path);
    const cJSON *e;
    int n_random = 0, n_models = 0;
    cJSON_ArrayForEach(e, get(doc, "random_blocks")) check_random_blocks(e), n_random++;
    CHECK(n_random == 5); /* q4_k, q5_k, q6_k, q4_0, q5_0 */
    CHECK_MSG(cli != NULL, "FM_CLI is not set (ctest sets it to the flashmap CLI)");
    if (cli) cJSON_ArrayForEach(e, get(doc, "models")) check_model(e, cli), n_models++;
    CHECK(n_models >= 4);
    cJSON_Delete(doc);
    free(text);
    return fm_test_report("test_quant_k");
}
