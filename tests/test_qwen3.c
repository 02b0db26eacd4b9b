/* test_qwen3.c: properties of the Qwen3 target that speculative decoding relies on, for every weight type
 * (F32, F16, BF16, Q8_0), on tiny random-weight models written here with the GGUF writer (so that broken
 * variants - another architecture, a missing tensor, a wrong shape - come from the same code):
 *   - a verify block (T = 8 and 17, ALL_LOGITS and ALL_ARGMAX) gives, row by row, exactly the logits, argmax
 *     and captured features of step-by-step decoding (bitwise: speculative decoding is lossless only when a
 *     row's result does not depend on how many rows ran with it);
 *   - rewind then re-decode reproduces the same ids and logits;
 *   - a prefill in chunks of 1, 7 and all-at-once gives the same last logits, bitwise (every op is row-local
 *     and each row's reductions run in an order that depends on neither T nor the chunk boundaries; attention
 *     reads the f16 cache, which holds the same bits whichever chunk wrote them); also with 1 and 2 threads;
 *   - the block and chunk properties hold at every kernel level this CPU runs (scalar, AVX2, AVX-512): a
 *     failure names the level and the weight type, i.e. the kernel whose row results depend on T;
 *   - a full cache, a too-large batch and bad token ids are clear errors that leave the state usable;
 *   - loading refuses another architecture by name, and names a missing tensor and a wrongly shaped one. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "cpu/cpu_features.h"
#include "cpu/matmul.h"
#include "io/gguf.h"
#include "model/qwen3.h"
#include "test_util.h"

enum { N_LAYERS = 3, DIM = 128, N_HEADS = 4, N_KV = 2, HEAD_DIM = 64, FFN = 256, VOCAB = 300 };

typedef enum { MUT_NONE, MUT_ARCH, MUT_MISSING, MUT_SHAPE } mutation;

typedef struct {
    uint64_t s;
} rng;

static float rng_uniform(rng *r) { /* splitmix64 -> [-1, 1) */
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Tensor bytes kept alive until the writer has written them. */
typedef struct {
    void *bufs[64];
    int n;
} keep;

static void add_tensor(gguf_writer *w, keep *k, rng *r, const char *name, int64_t rows, int64_t cols,
                       fm_dtype type, float scale, float offset) {
    char err[FM_ERROR_LEN];
    const int64_t n = rows * cols;
    float *f = malloc((size_t)n * sizeof *f);
    for (int64_t i = 0; i < n; i++) f[i] = offset + scale * rng_uniform(r);
    void *data = f;
    size_t size = (size_t)n * sizeof(float);
    if (rows == 1) type = FM_DTYPE_F32; /* norm vectors stay f32, as llama.cpp's converter writes them */
    if (type == FM_DTYPE_F16 || type == FM_DTYPE_BF16) {
        uint16_t *h = malloc((size_t)n * 2);
        for (int64_t i = 0; i < n; i++)
            h[i] = type == FM_DTYPE_F16 ? fm_f32_to_f16(f[i]) : fm_f32_to_bf16(f[i]);
        free(f);
        data = h, size = (size_t)n * 2;
    } else if (type == FM_DTYPE_Q8_0) {
        fm_block_q8_0 *q = malloc((size_t)(n / FM_QK8_0) * sizeof *q);
        fm_quantize_row_q8_0_reference(f, q, n);
        free(f);
        data = q, size = (size_t)(n / FM_QK8_0) * sizeof *q;
    }
    const int64_t ne[2] = {cols, rows};
    if (gguf_writer_add_tensor(w, name, rows == 1 ? 1 : 2, ne, type, data, size, err, sizeof err))
        fprintf(stderr, "add_tensor %s: %s\n", name, err);
    k->bufs[k->n++] = data;
}

/* Writes a tiny Qwen3 GGUF of weight type `type` (tied when `tied`), or a broken variant of it. */
static int write_model(const char *path, fm_dtype type, int tied, mutation mut) {
    char err[FM_ERROR_LEN];
    gguf_writer *w = gguf_writer_create();
    keep k = {{0}, 0};
    rng r = {1234 + (uint64_t)type};
    const char *arch = mut == MUT_ARCH ? "llama" : "qwen3";
    char key[96], name[96];
    gguf_writer_set_str(w, "general.architecture", arch);
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, arch), key)
    gguf_writer_set_u32(w, KEY("block_count"), N_LAYERS);
    gguf_writer_set_u32(w, KEY("embedding_length"), DIM);
    gguf_writer_set_u32(w, KEY("attention.head_count"), N_HEADS);
    gguf_writer_set_u32(w, KEY("attention.head_count_kv"), N_KV);
    gguf_writer_set_u32(w, KEY("attention.key_length"), HEAD_DIM);
    gguf_writer_set_u32(w, KEY("attention.value_length"), HEAD_DIM);
    gguf_writer_set_u32(w, KEY("feed_forward_length"), FFN);
    gguf_writer_set_u32(w, KEY("context_length"), 4096);
    gguf_writer_set_f32(w, KEY("rope.freq_base"), 1e6f);
    gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-6f);
#undef KEY
    const float s_dim = sqrtf(3.0f / DIM), s_q = sqrtf(3.0f / (N_HEADS * HEAD_DIM)),
                s_ffn = sqrtf(3.0f / FFN);
    add_tensor(w, &k, &r, "token_embd.weight", VOCAB, DIM, type, 1.0f, 0);
    add_tensor(w, &k, &r, "output_norm.weight", 1, DIM, type, 0.1f, 1);
    if (!tied) add_tensor(w, &k, &r, "output.weight", VOCAB, DIM, type, s_dim, 0);
    for (int l = 0; l < N_LAYERS; l++) {
#define T(suffix, rows, cols, sc, off)                                                                       \
    (snprintf(name, sizeof name, "blk.%d." suffix, l), add_tensor(w, &k, &r, name, rows, cols, type, sc, off))
        T("attn_norm.weight", 1, DIM, 0.1f, 1);
        T("attn_q.weight", N_HEADS * HEAD_DIM, DIM, s_dim, 0);
        /* MUT_SHAPE: attn_k of layer 0 with half its rows. */
        T("attn_k.weight", (mut == MUT_SHAPE && l == 0) ? N_KV * HEAD_DIM / 2 : N_KV * HEAD_DIM, DIM, s_dim,
          0);
        T("attn_v.weight", N_KV * HEAD_DIM, DIM, s_dim, 0);
        T("attn_output.weight", DIM, N_HEADS * HEAD_DIM, s_q, 0);
        T("attn_q_norm.weight", 1, HEAD_DIM, 0.1f, 1);
        T("attn_k_norm.weight", 1, HEAD_DIM, 0.1f, 1);
        T("ffn_norm.weight", 1, DIM, 0.1f, 1);
        T("ffn_gate.weight", FFN, DIM, s_dim, 0);
        if (!(mut == MUT_MISSING && l == 1)) T("ffn_up.weight", FFN, DIM, s_dim, 0);
        T("ffn_down.weight", DIM, FFN, s_ffn, 0);
#undef T
    }
    int rc = gguf_writer_write(w, path, err, sizeof err);
    if (rc) fprintf(stderr, "write %s: %s\n", path, err);
    gguf_writer_free(w);
    for (int i = 0; i < k.n; i++) free(k.bufs[i]);
    return rc;
}

static const int CAPS[2] = {0, N_LAYERS - 1};

static qwen3_state *new_state(const qwen3_model *m, int n_ctx, int max_batch) {
    char err[FM_ERROR_LEN];
    qwen3_state_params p = {.n_ctx = n_ctx, .max_batch = max_batch, .capture_layers = CAPS, .n_capture = 2};
    qwen3_state *s = NULL;
    if (qwen3_state_create(m, &p, &s, err, sizeof err)) fprintf(stderr, "state: %s\n", err);
    return s;
}

static int fwd(const qwen3_model *m, qwen3_state *s, fm_pool *pool, const int32_t *t, int T, qwen3_out out) {
    char err[FM_ERROR_LEN];
    int rc = qwen3_forward(m, s, pool, t, T, out, err, sizeof err);
    if (rc) fprintf(stderr, "forward: %s\n", err);
    return rc;
}

enum { PROMPT = 5, BLOCK = 17 };

/* Verify blocks, rewind, features: everything against one step-by-step run. */
static void test_verify_block(const char *tn, const qwen3_model *m, fm_pool *pool) {
    const int V = m->hp.vocab, FW = 2 * DIM;
    int32_t prompt[PROMPT] = {3, 141, 59, 265, 35}, toks[BLOCK];
    for (int i = 0; i < BLOCK; i++) toks[i] = (int32_t)((i * 97 + 13) % VOCAB);
    float *step_logits = malloc((size_t)BLOCK * V * sizeof(float));
    float *step_feat = malloc((size_t)BLOCK * FW * sizeof(float));
    int32_t step_ids[BLOCK];

    qwen3_state *a = new_state(m, 64, BLOCK);
    CHECK(a && qwen3_state_feature_width(a) == FW);
    CHECK(fwd(m, a, pool, prompt, PROMPT, QWEN3_OUT_NONE) == 0);
    for (int i = 0; i < BLOCK; i++) {
        CHECK(fwd(m, a, pool, &toks[i], 1, QWEN3_OUT_LAST_LOGITS) == 0);
        memcpy(step_logits + (size_t)i * V, qwen3_state_logits(a), (size_t)V * sizeof(float));
        memcpy(step_feat + (size_t)i * FW, qwen3_state_features(a), (size_t)FW * sizeof(float));
        step_ids[i] = qwen3_state_argmax(a)[0];
    }
    CHECK(qwen3_state_pos(a) == PROMPT + BLOCK);

    const int widths[2] = {8, BLOCK};
    for (int wi = 0; wi < 2; wi++) {
        const int T = widths[wi];
        /* ALL_LOGITS block after a rewind to the end of the prompt. */
        qwen3_state_rewind(a, PROMPT);
        CHECK(qwen3_state_pos(a) == PROMPT);
        CHECK(fwd(m, a, pool, toks, T, QWEN3_OUT_ALL_LOGITS) == 0);
        const float *lg = qwen3_state_logits(a), *ft = qwen3_state_features(a);
        for (int t = 0; t < T; t++) {
            CHECK_MSG(
                memcmp(lg + (size_t)t * V, step_logits + (size_t)t * V, (size_t)V * sizeof(float)) == 0,
                "%s: T=%d ALL_LOGITS row %d differs from step-by-step (a kernel whose result depends on T)",
                tn, T, t);
            CHECK_MSG(qwen3_state_argmax(a)[t] == step_ids[t], "%s: T=%d row %d argmax", tn, T, t);
            CHECK_MSG(memcmp(ft + (size_t)t * FW, step_feat + (size_t)t * FW, (size_t)FW * sizeof(float)) ==
                          0,
                      "%s: T=%d features of row %d differ from step-by-step", tn, T, t);
        }
        /* ALL_ARGMAX block. */
        qwen3_state_rewind(a, PROMPT);
        CHECK(fwd(m, a, pool, toks, T, QWEN3_OUT_ALL_ARGMAX) == 0);
        for (int t = 0; t < T; t++)
            CHECK_MSG(qwen3_state_argmax(a)[t] == step_ids[t], "%s: T=%d ALL_ARGMAX row %d: %d vs step %d",
                      tn, T, t, qwen3_state_argmax(a)[t], step_ids[t]);
        CHECK(qwen3_state_pos(a) == PROMPT + T);
    }
    /* Rewind into the middle of a block, then decode step by step again: same logits as the first time. */
    qwen3_state_rewind(a, PROMPT + 3);
    for (int i = 3; i < BLOCK; i++) {
        CHECK(fwd(m, a, pool, &toks[i], 1, QWEN3_OUT_LAST_LOGITS) == 0);
        CHECK_MSG(memcmp(qwen3_state_logits(a), step_logits + (size_t)i * V, (size_t)V * sizeof(float)) == 0,
                  "%s: re-decoded step %d after rewind differs", tn, i);
        CHECK(qwen3_state_argmax(a)[0] == step_ids[i]);
    }
    /* Greedy: feed the model its own ids, rewind, do it again; the ids and logits repeat. */
    int32_t g1[12], g2[12];
    float l1[12];
    for (int pass = 0; pass < 2; pass++) {
        qwen3_state_rewind(a, PROMPT);
        int32_t tok = toks[0];
        for (int i = 0; i < 12; i++) {
            CHECK(fwd(m, a, pool, &tok, 1, QWEN3_OUT_LAST_LOGITS) == 0);
            tok = qwen3_state_argmax(a)[0];
            (pass ? g2 : g1)[i] = tok;
            if (pass == 0)
                l1[i] = qwen3_state_logits(a)[tok];
            else
                CHECK_MSG(qwen3_state_logits(a)[tok] == l1[i], "%s: greedy logit at step %d after rewind", tn,
                          i);
        }
    }
    CHECK_MSG(memcmp(g1, g2, sizeof g1) == 0, "%s: greedy ids differ after rewind", tn);
    qwen3_state_free(a);
    free(step_logits);
    free(step_feat);
}

/* Prefill in chunks of 1, 7 and 40 (and with the serial "pool" NULL): the same last logits, bitwise. */
static void test_chunked_prefill(const char *tn, const qwen3_model *m, fm_pool *pool) {
    enum { N = 40 };
    const int V = m->hp.vocab;
    int32_t prompt[N];
    for (int i = 0; i < N; i++) prompt[i] = (int32_t)((i * 31 + 7) % VOCAB);
    float *ref = malloc((size_t)V * sizeof(float));
    const int chunks[4] = {N, 7, 1, N};
    for (int ci = 0; ci < 4; ci++) {
        fm_pool *p = ci == 3 ? NULL : pool;
        qwen3_state *s = new_state(m, N, N);
        for (int at = 0; at < N; at += chunks[ci]) {
            const int T = at + chunks[ci] > N ? N - at : chunks[ci];
            CHECK(fwd(m, s, p, prompt + at, T, at + T == N ? QWEN3_OUT_LAST_LOGITS : QWEN3_OUT_NONE) == 0);
        }
        if (ci == 0)
            memcpy(ref, qwen3_state_logits(s), (size_t)V * sizeof(float));
        else
            CHECK_MSG(memcmp(ref, qwen3_state_logits(s), (size_t)V * sizeof(float)) == 0,
                      "%s: prefill in chunks of %d%s differs from one chunk", tn, chunks[ci],
                      p ? "" : " (serial)");
        qwen3_state_free(s);
    }
    free(ref);
}

/* Errors that must leave the state as it was. */
static void test_errors(const char *tn, const qwen3_model *m, fm_pool *pool) {
    char err[FM_ERROR_LEN];
    const int V = m->hp.vocab;
    int32_t toks[12];
    for (int i = 0; i < 12; i++) toks[i] = (int32_t)(i * 11 + 1);
    qwen3_state *s = new_state(m, 10, 8), *fresh = new_state(m, 10, 8);
    CHECK(fwd(m, s, pool, toks, 8, QWEN3_OUT_NONE) == 0);
    err[0] = 0;
    CHECK(qwen3_forward(m, s, pool, toks + 8, 3, QWEN3_OUT_LAST_LOGITS, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "context is full") != NULL, "%s: full-cache error: '%s'", tn, err);
    CHECK(qwen3_state_pos(s) == 8);
    err[0] = 0;
    CHECK(qwen3_forward(m, s, pool, toks, 9, QWEN3_OUT_LAST_LOGITS, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "batch size") != NULL, "%s: batch error: '%s'", tn, err);
    const int32_t bad[3][2] = {{5, -1}, {VOCAB, 5}, {INT32_MAX, 0}};
    for (int i = 0; i < 3; i++) {
        err[0] = 0;
        CHECK(qwen3_forward(m, s, pool, bad[i], 2, QWEN3_OUT_LAST_LOGITS, err, sizeof err) == -1);
        CHECK_MSG(strstr(err, "out of range") != NULL, "%s: bad token error: '%s'", tn, err);
    }
    CHECK(qwen3_state_pos(s) == 8);
    /* Still usable: the two positions that fit give the logits a fresh state computes. */
    CHECK(fwd(m, s, pool, toks + 8, 2, QWEN3_OUT_LAST_LOGITS) == 0);
    CHECK(qwen3_forward(m, fresh, pool, toks, 10, QWEN3_OUT_LAST_LOGITS, err, sizeof err) ==
          -1); /* > batch */
    CHECK(fwd(m, fresh, pool, toks, 8, QWEN3_OUT_NONE) == 0);
    CHECK(fwd(m, fresh, pool, toks + 8, 2, QWEN3_OUT_LAST_LOGITS) == 0);
    CHECK_MSG(memcmp(qwen3_state_logits(s), qwen3_state_logits(fresh), (size_t)V * sizeof(float)) == 0,
              "%s: state after errors differs from a fresh one", tn);
    CHECK(qwen3_state_pos(s) == 10);
    qwen3_state_free(s);
    qwen3_state_free(fresh);
}

static void expect_load_error(const char *tn, const char *path, const char *n1, const char *n2) {
    char err[FM_ERROR_LEN] = "";
    qwen3_model *m = (qwen3_model *)1;
    CHECK(qwen3_model_load(path, &m, err, sizeof err) == -1);
    CHECK(m == NULL);
    CHECK_MSG(strstr(err, n1) && strstr(err, n2), "%s: load error '%s' lacks '%s' / '%s'", tn, err, n1, n2);
}

int main(void) {
    const fm_dtype types[4] = {FM_DTYPE_F32, FM_DTYPE_F16, FM_DTYPE_BF16, FM_DTYPE_Q8_0};
    fm_pool *pool = fm_pool_create(2);
    char path[1200], err[FM_ERROR_LEN];
    for (int ti = 0; ti < 4; ti++) {
        for (int tied = 0; tied < 2; tied++) {
            char tn[48];
            snprintf(tn, sizeof tn, "%s%s", fm_dtype_name(types[ti]), tied ? "/tied" : "");
            snprintf(path, sizeof path, "%s/qwen3_%s_%d.gguf", fm_test_tmpdir(), fm_dtype_name(types[ti]),
                     tied);
            CHECK(write_model(path, types[ti], tied, MUT_NONE) == 0);
            qwen3_model *m = NULL;
            int rc = qwen3_model_load(path, &m, err, sizeof err);
            CHECK_MSG(rc == 0, "%s: %s", tn, err);
            if (rc) continue;
            CHECK(m->hp.tied == tied && m->hp.vocab == VOCAB && m->hp.head_dim == HEAD_DIM);
            CHECK(m->layers[0].wq.dtype == types[ti]);
            for (int isa = FM_ISA_SCALAR; isa <= (int)fm_cpu_isa_best(); isa++) {
                CHECK(fm_cpu_set_isa((fm_isa)isa) == 0);
                snprintf(tn, sizeof tn, "%s%s/%s", fm_dtype_name(types[ti]), tied ? "/tied" : "",
                         fm_isa_name((fm_isa)isa));
                test_verify_block(tn, m, pool);
                if (!tied) test_chunked_prefill(tn, m, pool); /* once per type and level */
            }
            fm_cpu_set_isa(fm_cpu_isa_best());
            if (!tied) test_errors(tn, m, pool);
            qwen3_model_free(m);
            remove(path);
        }
        const char *tn = fm_dtype_name(types[ti]);
        snprintf(path, sizeof path, "%s/qwen3_bad_%s.gguf", fm_test_tmpdir(), tn);
        CHECK(write_model(path, types[ti], 0, MUT_ARCH) == 0);
        expect_load_error(tn, path, "architecture", "llama");
        CHECK(write_model(path, types[ti], 0, MUT_MISSING) == 0);
        expect_load_error(tn, path, "blk.1.ffn_up.weight", "missing");
        CHECK(write_model(path, types[ti], 0, MUT_SHAPE) == 0);
        expect_load_error(tn, path, "blk.0.attn_k.weight", "shape");
        remove(path);
    }
    char err2[FM_ERROR_LEN] = "";
    qwen3_model *m = NULL;
    CHECK(qwen3_model_load("/nonexistent/model.gguf", &m, err2, sizeof err2) == -1 && err2[0]);
    fm_pool_free(pool);
    return fm_test_report("test_qwen3");
}
