/* test_qwen3_synth.c: the random-weight Qwen3 writer.
 *   - tensor names, shapes, types and metadata exactly as llama.cpp's Qwen3 GGUFs (tied and untied);
 *   - stored values equal the generator (f32), and Q8_0 blocks equal the generator quantised; the quantiser
 *     equals a plain transcription of ggml's quantize_row_q8_0_ref (roundf, MAX) on awkward inputs;
 *   - determinism: same seed -> same bytes whatever the thread count, another seed -> other weights;
 *   - scale: matrix std near its target, norm weights near 1, token rows of distinct norms;
 *   - validation errors and the default vocabulary rule.
 * (tests/test_synth_gguf_py.py checks the same files with gguf-py and a numpy forward pass.) */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "io/gguf.h"
#include "model/qwen3_synth.h"
#include "test_util.h"

static char *tmp_path(const char *name) {
    static char buf[8][1200];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, 1200, "%s/%s", fm_test_tmpdir(), name);
    return p;
}

static void expect_u32(gguf_file *f, const char *key, uint32_t want) {
    char err[FM_ERROR_LEN];
    uint32_t v = 0;
    CHECK_MSG(gguf_get_u32(f, key, &v, err, sizeof err) == 0 && v == want, "%s = %u, want %u (%s)", key, v,
              want, err);
}

/* Shape and type check of one tensor. */
static const gguf_tensor *expect_tensor(gguf_file *f, const char *name, int64_t ne0, int64_t ne1,
                                        fm_dtype dt) {
    const gguf_tensor *t = gguf_find_tensor(f, name);
    CHECK_MSG(t != NULL, "missing %s", name);
    if (!t) return NULL;
    uint32_t nd = ne1 ? 2 : 1;
    CHECK_MSG(t->n_dims == nd && t->ne[0] == ne0 && (nd == 1 || t->ne[1] == ne1) && t->supported &&
                  t->dtype == dt,
              "%s: n_dims %u ne [%lld, %lld] %s", name, t->n_dims, (long long)t->ne[0], (long long)t->ne[1],
              fm_dtype_name(t->dtype));
    return t;
}

static void check_layout(gguf_file *f, const qwen3_synth_params *p, int vocab) {
    char err[FM_ERROR_LEN], name[64];
    gguf_str s;
    CHECK(gguf_get_str(f, "general.architecture", &s, err, sizeof err) == 0 && gguf_str_eq(s, "qwen3"));
    expect_u32(f, "qwen3.block_count", (uint32_t)p->n_layers);
    expect_u32(f, "qwen3.context_length", (uint32_t)p->context_length);
    expect_u32(f, "qwen3.embedding_length", (uint32_t)p->dim);
    expect_u32(f, "qwen3.feed_forward_length", (uint32_t)p->ffn);
    expect_u32(f, "qwen3.attention.head_count", (uint32_t)p->n_heads);
    expect_u32(f, "qwen3.attention.head_count_kv", (uint32_t)p->n_kv_heads);
    expect_u32(f, "qwen3.attention.key_length", (uint32_t)p->head_dim);
    expect_u32(f, "qwen3.attention.value_length", (uint32_t)p->head_dim);
    float fv;
    CHECK(gguf_get_f32(f, "qwen3.rope.freq_base", &fv, err, sizeof err) == 0 && fv == p->rope_theta);
    CHECK(gguf_get_f32(f, "qwen3.attention.layer_norm_rms_epsilon", &fv, err, sizeof err) == 0 &&
          fv == p->rms_eps);
    uint64_t n;
    CHECK(gguf_get_arr_len(f, "tokenizer.ggml.tokens", &n, err, sizeof err) == 0 && n == (uint64_t)vocab);
    const int64_t d = p->dim, q = (int64_t)p->n_heads * p->head_dim,
                  kv = (int64_t)p->n_kv_heads * p->head_dim;
    const fm_dtype w = p->wtype, f32 = FM_DTYPE_F32;
    expect_tensor(f, "token_embd.weight", d, vocab, w);
    expect_tensor(f, "output_norm.weight", d, 0, f32);
    if (p->tied)
        CHECK(gguf_find_tensor(f, "output.weight") == NULL);
    else
        expect_tensor(f, "output.weight", d, vocab, w);
    static const char *const norms[] = {"attn_norm", "attn_q_norm", "attn_k_norm", "ffn_norm"};
    for (int l = 0; l < p->n_layers; l++) {
        for (int i = 0; i < 4; i++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, norms[i]);
            expect_tensor(f, name, (i == 1 || i == 2) ? p->head_dim : d, 0, f32);
        }
        const struct {
            const char *n;
            int64_t ne0, ne1;
        } mats[] = {{"attn_q", d, q},       {"attn_k", d, kv},       {"attn_v", d, kv},
                    {"attn_output", q, d},  {"ffn_gate", d, p->ffn}, {"ffn_up", d, p->ffn},
                    {"ffn_down", p->ffn, d}};
        for (int i = 0; i < 7; i++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, mats[i].n);
            expect_tensor(f, name, mats[i].ne0, mats[i].ne1, w);
        }
    }
    CHECK(gguf_n_tensors(f) == 11 * p->n_layers + 2 + !p->tied);
}

static float load_f32(const gguf_tensor *t, int64_t i) {
    float v;
    memcpy(&v, (const uint8_t *)t->data + 4 * i, 4);
    return v;
}

/* ggml's quantize_row_q8_0_ref as written there: roundf, MAX. */
static void ref_q8_0(const float *x, fm_block_q8_0 *y, int64_t k) {
    for (int64_t i = 0; i < k / 32; i++) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) {
            const float v = x[i * 32 + j];
            amax = amax > fabsf(v) ? amax : fabsf(v);
        }
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = fm_f32_to_f16(d);
        for (int j = 0; j < 32; ++j) y[i].qs[j] = (int8_t)roundf(x[i * 32 + j] * id);
    }
}

static void test_quantizer(void) {
    enum { N = 32 * 64 };
    static float x[N];
    static fm_block_q8_0 a[N / 32], b[N / 32];
    uint64_t s = 99;
    for (int i = 0; i < N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((int64_t)(s >> 11) - (1ll << 52)) / (float)(1ll << 52) * 3.0f;
    }
    for (int j = 0; j < 32; j++) x[j] = 0.0f;                                   /* an all-zero block: d = 0 */
    for (int j = 0; j < 32; j++) x[32 + j] = (float)j - 12.5f;                  /* halves */
    for (int j = 0; j < 32; j++) x[64 + j] = (j % 2 ? 127.0f : -63.5f) * 1e-3f; /* exact .5 after scaling */
    for (int j = 0; j < 32; j++) x[96 + j] = (float)(j - 16) * 1e-30f;          /* tiny */
    qwen3_synth_quantize_q8_0(x, a, N);
    ref_q8_0(x, b, N);
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(a[0].d == 0 && a[0].qs[5] == 0);
}

static void test_tiny(void) {
    char err[FM_ERROR_LEN];
    qwen3_synth_params p;
    CHECK(qwen3_synth_preset("tiny", &p) == 0);
    p.seed = 7;
    const char *path = tmp_path("synth_tiny_f32.gguf");
    CHECK_MSG(qwen3_synth_write(&p, path, err, sizeof err) == 0, "%s", err);
    gguf_file *f = gguf_open(path, err, sizeof err);
    CHECK_MSG(f != NULL, "%s", err);
    if (!f) return;
    int n_tok = 0;
    CHECK(qwen3_synth_tokenizer_size(NULL, &n_tok, err, sizeof err) == 0 && n_tok > 256);
    int vocab = qwen3_synth_default_vocab(n_tok);
    CHECK(vocab >= n_tok && vocab % 128 == 0);
    check_layout(f, &p, vocab);

    /* every value of the small tensors, samples of the token table */
    static const char *const names[] = {"blk.0.attn_q.weight", "blk.1.ffn_down.weight",
                                        "blk.0.attn_k_norm.weight", "output_norm.weight", "output.weight"};
    for (int i = 0; i < 5; i++) {
        const gguf_tensor *t = gguf_find_tensor(f, names[i]);
        if (!t) continue;
        int64_t rows = t->n_dims == 2 ? t->ne[1] : 1, bad = 0;
        for (int64_t r = 0; r < rows; r += (rows > 100 ? 37 : 1))
            for (int64_t c = 0; c < t->ne[0]; c++)
                bad += load_f32(t, r * t->ne[0] + c) != qwen3_synth_value(&p, names[i], r, c);
        CHECK_MSG(bad == 0, "%s: %lld values differ from the generator", names[i], (long long)bad);
    }
    /* scales: q reads the stream (std 1/sqrt(dim)); attn_output writes it (/ sqrt(2 L)); norms near 1 */
    const gguf_tensor *tq = gguf_find_tensor(f, "blk.0.attn_q.weight"),
                      *to = gguf_find_tensor(f, "blk.0.attn_output.weight"),
                      *tn = gguf_find_tensor(f, "blk.0.attn_norm.weight"),
                      *te = gguf_find_tensor(f, "token_embd.weight");
    if (tq && to && tn && te) {
        double sq = 0, so = 0;
        for (int64_t i = 0; i < 64 * 64; i++)
            sq += load_f32(tq, i) * load_f32(tq, i), so += load_f32(to, i) * load_f32(to, i);
        CHECK_NEAR(sqrt(sq / 4096), 1.0 / 8, 0.01);
        CHECK_NEAR(sqrt(so / 4096), 1.0 / 8 / 2, 0.01);
        for (int i = 0; i < 64; i++) CHECK(fabsf(load_f32(tn, i) - 1.0f) < 0.2f);
        const gguf_tensor *tqn = gguf_find_tensor(f, "blk.1.attn_q_norm.weight"),
                          *ton = gguf_find_tensor(f, "output_norm.weight");
        for (int i = 0; tqn && i < 16; i++) CHECK(fabsf(load_f32(tqn, i) - 3.0f) < 0.6f);
        for (int i = 0; ton && i < 64; i++) CHECK(fabsf(load_f32(ton, i) - 4.0f) < 0.8f);
        /* row norms of the token table differ: their spread (log std) is near 0.5 */
        double sl = 0, sl2 = 0;
        for (int64_t r = 0; r < te->ne[1]; r++) {
            double n2 = 0;
            for (int c = 0; c < 64; c++) n2 += (double)load_f32(te, r * 64 + c) * load_f32(te, r * 64 + c);
            double l = 0.5 * log(n2);
            sl += l, sl2 += l * l;
        }
        double m = sl / (double)te->ne[1], sd = sqrt(sl2 / (double)te->ne[1] - m * m);
        CHECK_MSG(sd > 0.4 && sd < 0.6, "token row log-norm std %g", sd);
    }
    gguf_close(f);

    /* the same model in Q8_0, tied: blocks are the generator's values quantised */
    p.wtype = FM_DTYPE_Q8_0;
    p.tied = 1;
    path = tmp_path("synth_tiny_q8.gguf");
    CHECK_MSG(qwen3_synth_write(&p, path, err, sizeof err) == 0, "%s", err);
    f = gguf_open(path, err, sizeof err);
    CHECK_MSG(f != NULL, "%s", err);
    if (!f) return;
    check_layout(f, &p, vocab);
    const gguf_tensor *t = gguf_find_tensor(f, "blk.1.ffn_down.weight"); /* [128, 64] */
    if (t) {
        float row[128];
        fm_block_q8_0 want[4];
        int bad = 0;
        for (int64_t r = 0; r < 64; r++) {
            for (int c = 0; c < 128; c++) row[c] = qwen3_synth_value(&p, "blk.1.ffn_down.weight", r, c);
            ref_q8_0(row, want, 128);
            bad += memcmp((const uint8_t *)t->data + r * sizeof want, want, sizeof want) != 0;
        }
        CHECK_MSG(bad == 0, "%d q8_0 rows differ", bad);
    }
    gguf_close(f);
}

static int files_equal(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int eq = fa && fb;
    while (eq) {
        int x = fgetc(fa), y = fgetc(fb);
        if (x != y) eq = 0;
        if (x == EOF || y == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return eq;
}

static void test_determinism(void) {
    char err[FM_ERROR_LEN];
    qwen3_synth_params p;
    qwen3_synth_preset("tiny", &p);
    p.wtype = FM_DTYPE_BF16;
    p.n_threads = 1;
    const char *a = tmp_path("synth_det_a.gguf"), *b = tmp_path("synth_det_b.gguf"),
               *c = tmp_path("synth_det_c.gguf");
    CHECK(qwen3_synth_write(&p, a, err, sizeof err) == 0);
    p.n_threads = 3;
    CHECK(qwen3_synth_write(&p, b, err, sizeof err) == 0);
    CHECK(files_equal(a, b));
    p.seed++;
    CHECK(qwen3_synth_write(&p, c, err, sizeof err) == 0);
    CHECK(!files_equal(a, c));
    CHECK(qwen3_synth_value(&p, "blk.0.attn_v.weight", 3, 5) !=
          qwen3_synth_value(&p, "blk.0.attn_k.weight", 3, 5));
    CHECK(isnan(qwen3_synth_value(&p, "no.such.tensor", 0, 0)));
}

static void test_validation(void) {
    char err[FM_ERROR_LEN];
    qwen3_synth_params p;
    CHECK(qwen3_synth_preset("nope", &p) == -1);
    qwen3_synth_preset("qwen3-4b", &p);
    CHECK(qwen3_synth_validate(&p, err, sizeof err) == 0);
    CHECK(p.n_layers == 36 && p.dim == 2560 && p.head_dim == 128 && p.vocab == 151936 && p.tied &&
          p.wtype == FM_DTYPE_Q8_0);
    qwen3_synth_preset("tiny", &p);
    p.n_kv_heads = 3;
    CHECK(qwen3_synth_validate(&p, err, sizeof err) == -1 && strstr(err, "kv-heads"));
    qwen3_synth_preset("tiny", &p);
    p.head_dim = 15;
    CHECK(qwen3_synth_validate(&p, err, sizeof err) == -1 && strstr(err, "even"));
    qwen3_synth_preset("tiny", &p);
    p.wtype = FM_DTYPE_Q8_0;
    p.ffn = 100;
    CHECK(qwen3_synth_validate(&p, err, sizeof err) == -1 && strstr(err, "ffn = 100") && strstr(err, "32"));
    qwen3_synth_preset("tiny", &p);
    p.n_layers = 0;
    CHECK(qwen3_synth_validate(&p, err, sizeof err) == -1 && strstr(err, "layers"));
    qwen3_synth_preset("tiny", &p);
    p.vocab = 10;
    CHECK(qwen3_synth_write(&p, tmp_path("synth_bad.gguf"), err, sizeof err) == -1 &&
          strstr(err, "vocab 10"));
    p.vocab = 0;
    p.tokenizer_json = tmp_path("no-such-tokenizer.json");
    CHECK(qwen3_synth_write(&p, tmp_path("synth_bad.gguf"), err, sizeof err) == -1 &&
          strstr(err, "no-such-tokenizer.json"));
    CHECK(qwen3_synth_default_vocab(151669) == 151936); /* Qwen3's tokenizer -> Qwen3's embedding rows */
    CHECK(qwen3_synth_default_vocab(151643) == 151936);
    CHECK(qwen3_synth_default_vocab(446) == 512);
    CHECK(qwen3_synth_default_vocab(512) == 512);
}

int main(void) {
    test_quantizer();
    test_tiny();
    test_determinism();
    test_validation();
    return fm_test_report("test_qwen3_synth");
}
