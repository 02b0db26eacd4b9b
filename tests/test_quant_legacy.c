/* test_quant_legacy.c: Q4_0 / Q5_0 end to end on our side (gguf-py's decoding of the same bytes is checked in
 * test_quant_k.c, the products in test_matmul.c):
 *   1. the synth quantiser (fm_quant_legacy_rtn): d = f16(max|x| / 7 or / 15), every weight decoded within
 *      half a step of its value, all-zero blocks decode to zeros;
 *   2. `--type q4_0 / q5_0`: names, general.file_type (MOSTLY_Q4_0 2, MOSTLY_Q5_0 8), every matrix in the
 *      type and norms f32, each row's blocks == the generator's row quantised;
 *   3. the loader takes such a model and its forward gives logits close to the same model written in f32. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/threadpool.h"
#include "cpu/quant_legacy.h"
#include "io/gguf.h"
#include "model/qwen3.h"
#include "model/qwen3_synth.h"
#include "test_util.h"

static char *tmp_path(const char *name) {
    static char buf[4][1200];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 1200, "%s/%s", fm_test_tmpdir(), name);
    return p;
}

static uint32_t lcg(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

static void test_quantizer(void) {
    enum { NB = 64, N = 32 * NB };
    static float x[N], w[N];
    static uint8_t q[NB * sizeof(fm_block_q5_0)];
    uint32_t s = 7;
    for (int b = 0; b < NB; b++) {
        const float scale = b == 0 ? 0.0f : b == 1 ? 1e-6f : powf(10.0f, (float)(b % 7) - 4.0f);
        for (int j = 0; j < 32; j++) x[32 * b + j] = scale * ((float)(lcg(&s) % 20001) / 10000.0f - 1.0f);
        if (b == 2) x[32 * b + 5] = -3.0f * scale; /* a lone negative extreme */
        if (b == 3) x[32 * b + 31] = 5.0f * scale; /* a lone positive one */
    }
    const fm_dtype types[] = {FM_DTYPE_Q4_0, FM_DTYPE_Q5_0};
    for (int ti = 0; ti < 2; ti++) {
        const fm_dtype t = types[ti];
        const int hi = t == FM_DTYPE_Q4_0 ? 7 : 15, bb = fm_dtype_block_bytes(t);
        memset(q, 0xAA, sizeof q);
        fm_quant_legacy_rtn(t, x, q, N);
        fm_dequant_row_legacy(t, q, w, N);
        int bad_d = 0, bad_w = 0;
        double err2 = 0, ref2 = 0;
        for (int b = 0; b < NB; b++) {
            float amax = 0;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[32 * b + j]));
            uint16_t dh;
            memcpy(&dh, q + (size_t)b * (size_t)bb, 2); /* d first in both layouts */
            const float d = fm_f16_to_f32(dh);
            const uint16_t near = fm_f32_to_f16(amax / (float)hi); /* or the next one up, for subnormals */
            bad_d += dh != near && !(dh == near + 1 && fm_f16_to_f32(near) * ((float)hi + 0.5f) < amax);
            for (int j = 0; j < 32; j++) {
                const float e = fabsf(w[32 * b + j] - x[32 * b + j]);
                bad_w += !(e <= 0.5f * d * (1.0f + 1e-6f) + 1e-30f);
                if (b > 1) err2 += (double)e * e, ref2 += (double)x[32 * b + j] * x[32 * b + j];
            }
        }
        for (int j = 0; j < 32; j++) bad_w += w[j] != 0.0f; /* the all-zero block */
        const double rel = sqrt(err2 / ref2);
        printf("%s quantiser: relative RMS error %.4f on uniform blocks\n", fm_dtype_name(t), rel);
        CHECK_MSG(bad_d == 0, "%s: %d block scales are not f16(max|x| / %d)", fm_dtype_name(t), bad_d, hi);
        CHECK_MSG(bad_w == 0, "%s: %d weights off by more than half a step", fm_dtype_name(t), bad_w);
        /* uniform inputs: error about step / sqrt(12) with step = amax / hi, against an RMS of amax / sqrt(3)
         */
        CHECK(rel < 0.6 / hi);
    }
}

static void test_types(void) {
    qwen3_synth_params p;
    qwen3_synth_preset("tiny", &p);
    CHECK(qwen3_synth_parse_type("Q4_0", &p) == 0 && p.wtype == FM_DTYPE_Q4_0 && p.mix == QWEN3_SYNTH_PURE);
    CHECK(qwen3_synth_file_type(&p) == 2 && !strcmp(qwen3_synth_type_name(&p), "q4_0"));
    CHECK(qwen3_synth_tensor_dtype(&p, "output.weight") == FM_DTYPE_Q4_0 &&
          qwen3_synth_tensor_dtype(&p, "blk.0.ffn_down.weight") == FM_DTYPE_Q4_0 &&
          qwen3_synth_tensor_dtype(&p, "blk.0.attn_norm.weight") == FM_DTYPE_F32);
    CHECK(qwen3_synth_parse_type("q5_0", &p) == 0 && p.wtype == FM_DTYPE_Q5_0);
    CHECK(qwen3_synth_file_type(&p) == 8 && !strcmp(qwen3_synth_type_name(&p), "q5_0"));
    CHECK(qwen3_synth_parse_type("q4_0_m", &p) == -1 && p.wtype == FM_DTYPE_Q5_0);
}

static void small_params(qwen3_synth_params *p, const char *type) {
    qwen3_synth_preset("tiny", p);
    p->n_layers = 2, p->dim = 256, p->n_heads = 2, p->n_kv_heads = 1, p->head_dim = 128, p->ffn = 512;
    p->tied = 0, p->seed = 11, p->n_threads = 2;
    CHECK(qwen3_synth_parse_type(type, p) == 0);
}

/* Logits of 5 tokens (all rows) of the model at path into out [5][vocab]; returns vocab, 0 on failure. */
static int logits_of(const char *path, fm_pool *pool, float **out) {
    char err[FM_ERROR_LEN];
    qwen3_model *m = NULL;
    CHECK_MSG(qwen3_model_load(path, &m, err, sizeof err) == 0, "%s", err);
    if (!m) return 0;
    qwen3_state *s = NULL;
    qwen3_state_params sp = {.n_ctx = 16, .max_batch = 8};
    CHECK_MSG(qwen3_state_create(m, &sp, &s, err, sizeof err) == 0, "%s", err);
    int vocab = 0;
    const int32_t toks[5] = {1, 17, 250, 3, 99};
    if (s && qwen3_forward(m, s, pool, toks, 5, QWEN3_OUT_ALL_LOGITS, err, sizeof err) == 0) {
        vocab = m->hp.vocab;
        *out = malloc(sizeof(float) * 5 * (size_t)vocab);
        memcpy(*out, qwen3_state_logits(s), sizeof(float) * 5 * (size_t)vocab);
    } else {
        CHECK_MSG(0, "forward: %s", err);
    }
    qwen3_state_free(s);
    qwen3_model_free(m);
    return vocab;
}

static void test_model(const char *type, fm_pool *pool) {
    char err[FM_ERROR_LEN], name[64];
    qwen3_synth_params p;
    small_params(&p, type);
    snprintf(name, sizeof name, "legacy_%s.gguf", type);
    const char *path = tmp_path(name);
    CHECK_MSG(qwen3_synth_write(&p, path, err, sizeof err) == 0, "%s", err);
    gguf_file *f = gguf_open(path, err, sizeof err);
    CHECK_MSG(f != NULL, "%s", err);
    if (!f) return;
    uint32_t ft = 0;
    CHECK(gguf_get_u32(f, "general.file_type", &ft, err, sizeof err) == 0 && ft == qwen3_synth_file_type(&p));
    int n_bad = 0, n_rows = 0, n_mat = 0;
    static float row[1024];
    static uint8_t want[1024];
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if (t->n_dims != 2) {
            n_bad += t->dtype != FM_DTYPE_F32;
            continue;
        }
        n_mat++;
        n_bad += t->dtype != p.wtype;
        char tn[64];
        snprintf(tn, sizeof tn, "%.*s", (int)t->name.len, t->name.ptr);
        const size_t rb = fm_dtype_row_bytes(t->dtype, t->ne[0]);
        for (int64_t r = 0; r < t->ne[1]; r++, n_rows++) {
            n_bad += qwen3_synth_row(&p, tn, r, row) != t->ne[0];
            fm_quant_legacy_rtn(t->dtype, row, want, t->ne[0]);
            n_bad += memcmp((const uint8_t *)t->data + (size_t)r * rb, want, rb) != 0;
        }
    }
    CHECK_MSG(n_bad == 0 && n_mat == 16 && n_rows > 100, "%s: %d bad tensors or rows of %d (%d matrices)",
              type, n_bad, n_rows, n_mat);
    gguf_close(f);

    /* The same model in f32, and in the K type of as many bits (Q4_K / Q5_K, the yardstick) */
    qwen3_synth_params pf = p, pk = p;
    pf.wtype = FM_DTYPE_F32;
    CHECK(qwen3_synth_parse_type(p.wtype == FM_DTYPE_Q4_0 ? "q4_k" : "q5_k", &pk) == 0);
    snprintf(name, sizeof name, "legacy_%s_f32.gguf", type);
    const char *path_f = tmp_path(name);
    CHECK_MSG(qwen3_synth_write(&pf, path_f, err, sizeof err) == 0, "%s", err);
    snprintf(name, sizeof name, "legacy_%s_k.gguf", type);
    const char *path_k = tmp_path(name);
    CHECK_MSG(qwen3_synth_write(&pk, path_k, err, sizeof err) == 0, "%s", err);
    float *lq = NULL, *lf = NULL, *lk = NULL;
    const int vq = logits_of(path, pool, &lq), vf = logits_of(path_f, pool, &lf),
              vk = logits_of(path_k, pool, &lk);
    CHECK(vq > 0 && vq == vf && vq == vk);
    if (vq > 0 && vq == vf && vq == vk) {
        double dq = 0, dk = 0, r2 = 0;
        int finite = 1;
        for (int64_t i = 0; i < 5 * (int64_t)vq; i++) {
            finite &= isfinite(lq[i]);
            dq += ((double)lq[i] - lf[i]) * ((double)lq[i] - lf[i]);
            dk += ((double)lk[i] - lf[i]) * ((double)lk[i] - lf[i]);
            r2 += (double)lf[i] * lf[i];
        }
        const double rq = sqrt(dq / r2), rk = sqrt(dk / r2);
        printf("%s model: logits vs the f32 model's, relative RMS difference %.4f (%s: %.4f)\n", type, rq,
               qwen3_synth_type_name(&pk), rk);
        CHECK(finite);
        /* Per block of 32 Q4_0 / Q5_0 spend about one step more of range than Q4_K / Q5_K (a symmetric range
         * instead of a min and a scale): comparable noise, not more than twice the K type's. */
        CHECK_MSG(rq < 2 * rk, "%s: logits off the f32 model's by %.4f, %s's by %.4f", type, rq,
                  qwen3_synth_type_name(&pk), rk);
    }
    free(lq);
    free(lf);
    free(lk);
    remove(path_k);
    remove(path);
    remove(path_f);
}

int main(void) {
    test_quantizer();
    test_types();
    fm_pool *pool = fm_pool_create(2);
    test_model("q4_0", pool);
    test_model("q5_0", pool);
    fm_pool_free(pool);
    return fm_test_report("test_quant_legacy");
}
