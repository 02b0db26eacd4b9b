/* test_qwen3_synth.c: the random-weight Qwen3 writer.
 *   - tensor names, shapes, types and metadata exactly as llama.cpp's Qwen3 GGUFs (tied and untied);
 *   - stored values equal the generator (f32), and Q8_0 blocks equal the generator quantised; the quantiser
 *     equals a plain transcription of ggml's quantize_row_q8_0_ref (roundf, MAX) on awkward inputs;
 *   - K-quants: the quantisers' output decodes (fm_dequant_row_k) to within half a step of every weight, a
 *     step at most one scale unit above the sub-block's range / levels, with round-to-nearest's RMS error;
 *     the Q4_K_M / Q5_K_M mixes give llama.cpp's per-tensor types (written out by hand below) and file
 *     types, and the stored blocks are the generator's rows quantised;
 *   - determinism: same seed -> same bytes whatever the thread count, another seed -> other weights;
 *   - scale: matrix std near its target, norm weights near 1, token rows of distinct norms;
 *   - validation errors and the default vocabulary rule.
 * (tests/test_synth_gguf_py.py checks the same files with gguf-py and a numpy forward pass;
 * tests/test_quant_k.c checks that gguf-py decodes our K-quant blocks to the same floats as
 * fm_dequant_row_k.) */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "cpu/quant_k.h"
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
    const fm_dtype f32 = FM_DTYPE_F32;
    expect_tensor(f, "token_embd.weight", d, vocab, qwen3_synth_tensor_dtype(p, "token_embd.weight"));
    expect_tensor(f, "output_norm.weight", d, 0, f32);
    if (p->tied)
        CHECK(gguf_find_tensor(f, "output.weight") == NULL);
    else
        expect_tensor(f, "output.weight", d, vocab, qwen3_synth_tensor_dtype(p, "output.weight"));
    expect_u32(f, "general.file_type", qwen3_synth_file_type(p));
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
            expect_tensor(f, name, mats[i].ne0, mats[i].ne1, qwen3_synth_tensor_dtype(p, name));
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

/* ---- K-quants ---- */

static uint64_t lcg_state = 99;
static float lcg_uniform(void) { /* [-1, 1) */
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((int64_t)(lcg_state >> 11) - (1ll << 52)) / (float)(1ll << 52);
}

/* Blocks of 256 that test the quantisers' corners, then ordinary random rows (sums of 4 uniforms). */
#define KQ_BLOCKS 16
static void k_inputs(float *x) {
    for (int b = 0; b < KQ_BLOCKS; b++) {
        float *v = x + 256 * b;
        for (int i = 0; i < 256; i++) {
            const float u = lcg_uniform();
            switch (b) {
            case 0:
                v[i] = 0.0f;
                break; /* all zero: d = dmin = 0 */
            case 1:
                v[i] = 3.0f * u;
                break; /* plain uniform */
            case 2:
                v[i] = 1.0f + 0.5f * u;
                break; /* all positive: mins 0 */
            case 3:
                v[i] = -1.0f + 0.5f * u;
                break; /* all negative */
            case 4:
                v[i] = (float)(i / 16 % 5) * 0.25f - 0.5f;
                break; /* constant sub-blocks */
            case 5:
                v[i] = u * powf(10.0f, -(float)(i / 32) * 0.5f);
                break; /* sub-blocks 1 .. 3e-4 */
            case 6:
                v[i] = 1e-6f * u;
                break; /* f16-subnormal scales */
            case 7:
                v[i] = i == 77 ? 100.0f : 0.01f * u;
                break; /* one outlier */
            case 8:
                v[i] = 1000.0f * u;
                break; /* large */
            case 9:
                v[i] = (float)(i % 7) - 3.0f;
                break; /* exact levels, ties */
            default: {
                const float g = u + lcg_uniform() + lcg_uniform() + lcg_uniform(); /* ~ normal, std 1.15 */
                v[i] = 0.02f * g;
            }
            }
        }
    }
}

/* For sub-block j of a decoded block: its step (d * sc), the super-block's scale units. */
typedef struct {
    float step[16], unit, min_unit;
    int n_sub;
} k_steps;

static k_steps block_steps(fm_dtype t, const void *blk) {
    k_steps s = {{0}, 0, 0, 0};
    if (t == FM_DTYPE_Q6_K) {
        const fm_block_q6_K *b = blk;
        s.unit = fm_f16_to_f32(b->d), s.n_sub = 16;
        for (int j = 0; j < 16; j++) s.step[j] = s.unit * b->scales[j];
    } else {
        const fm_block_q4_K *b4 = blk;
        const fm_block_q5_K *b5 = blk;
        const uint16_t d = t == FM_DTYPE_Q4_K ? b4->d : b5->d, dm = t == FM_DTYPE_Q4_K ? b4->dmin : b5->dmin;
        const uint8_t *sc = t == FM_DTYPE_Q4_K ? b4->scales : b5->scales;
        s.unit = fm_f16_to_f32(d), s.min_unit = fm_f16_to_f32(dm), s.n_sub = 8;
        for (int j = 0; j < 8; j++) {
            uint8_t a, m;
            fm_k_scale_min(j, sc, &a, &m);
            s.step[j] = s.unit * a;
        }
    }
    return s;
}

/* The f16 rounding of a scale, upwards: at most one f16 ulp (2^-10 relative, 2^-24 among subnormals). */
static int f16_up_ok(float got, float want) {
    return got >= want * (1.0f - 1e-7f) && got <= want * (1.0f + 1.0f / 1024) + 6e-8f;
}

static void test_quantizer_k(void) {
    enum { N = 256 * KQ_BLOCKS };
    static float x[N], y[N];
    static uint8_t q[N / 256 * sizeof(fm_block_q6_K)]; /* the largest K block */
    k_inputs(x);
    const fm_dtype types[] = {FM_DTYPE_Q4_K, FM_DTYPE_Q5_K, FM_DTYPE_Q6_K};
    const double rms_bound[] = {0.09, 0.045, 0.022}; /* relative RMS error on the random rows */
    for (int ti = 0; ti < 3; ti++) {
        const fm_dtype t = types[ti];
        const int bb = fm_dtype_block_bytes(t), nmax = t == FM_DTYPE_Q4_K ? 15 : 31;
        memset(q, 0xAA, sizeof q);
        qwen3_synth_quantize_k(t, x, q, N);
        fm_dequant_row_k(t, q, y, N);
        int bad_err = 0, bad_step = 0, bad_unit = 0;
        double e2 = 0, x2 = 0, e2_all = 0, step2_all = 0;
        for (int b = 0; b < KQ_BLOCKS; b++) {
            const k_steps st = block_steps(t, q + (size_t)b * bb);
            const int sub = 256 / st.n_sub;
            float need_max = 0, off_max = 0, lo[16], hi[16];
            for (int j = 0; j < st.n_sub; j++) { /* the sub-block's range, from the input alone */
                lo[j] = t == FM_DTYPE_Q6_K ? 0 : fminf(0.0f, x[256 * b + sub * j]), hi[j] = lo[j];
                for (int k = 0; k < sub; k++) {
                    const float v = x[256 * b + sub * j + k];
                    lo[j] = t == FM_DTYPE_Q6_K ? fmaxf(lo[j], fabsf(v)) : fminf(lo[j], v);
                    hi[j] = fmaxf(hi[j], v);
                }
                off_max = fmaxf(off_max, -lo[j]);
            }
            /* the super-block scales: the smallest f16s whose 63 (127) units cover the largest need */
            if (t != FM_DTYPE_Q6_K) bad_unit += !f16_up_ok(st.min_unit, off_max / 63);
            for (int j = 0; j < st.n_sub; j++) {
                const float range = t == FM_DTYPE_Q6_K ? 2 * lo[j] : hi[j] - lo[j] + st.min_unit;
                const float ideal = range / (t == FM_DTYPE_Q6_K ? 62 : nmax);
                if (t != FM_DTYPE_Q6_K) {
                    /* what the writer needed: max + its rounded-up offset, over nmax */
                    uint8_t a, m;
                    fm_k_scale_min(j, ((const fm_block_q4_K *)(q + (size_t)b * bb))->scales, &a, &m);
                    need_max = fmaxf(need_max, fmaxf(0.0f, hi[j] + st.min_unit * m) / nmax);
                } else {
                    need_max = fmaxf(need_max, lo[j] / 31);
                }
                bad_step += !(st.step[j] <= (ideal + st.unit) * (1 + 1e-6f));
                for (int k = 0; k < sub; k++) {
                    const int i = 256 * b + sub * j + k;
                    const float slack =
                        1e-6f * (fabsf(x[i]) + (t == FM_DTYPE_Q6_K ? 0 : -lo[j] + st.min_unit));
                    const float e = fabsf(x[i] - y[i]);
                    if (!(e <= 0.5f * st.step[j] + slack)) {
                        if (bad_err++ < 5)
                            fprintf(stderr, "%s block %d weight %d: %.9g -> %.9g, step %.9g\n",
                                    fm_dtype_name(t), b, sub * j + k, x[i], y[i], st.step[j]);
                    }
                    if (b >= 10) e2 += (double)e * e, x2 += (double)x[i] * x[i];
                    if (b >= 10) e2_all += (double)e * e, step2_all += (double)st.step[j] * st.step[j];
                }
            }
            bad_unit += !f16_up_ok(st.unit, need_max / (t == FM_DTYPE_Q6_K ? 127 : 63));
        }
        CHECK_MSG(bad_err == 0, "%s: %d weights off by more than half their step", fm_dtype_name(t), bad_err);
        CHECK_MSG(bad_step == 0, "%s: %d steps above range / levels + one unit", fm_dtype_name(t), bad_step);
        CHECK_MSG(bad_unit == 0, "%s: %d super-block scales not the f16 at or just above the need",
                  fm_dtype_name(t), bad_unit);
        /* round to nearest: errors spread uniformly over +-step/2 have RMS step / sqrt(12) = 0.289 step
         * (truncation would give 0.577); and the absolute RMS error of 4-, 5- and 6-bit levels */
        const double rel = sqrt(e2 / x2), per_step = sqrt(e2_all / step2_all);
        printf("%s: relative RMS error %.4f, RMS error / RMS step %.3f\n", fm_dtype_name(t), rel, per_step);
        CHECK_MSG(per_step > 0.25 && per_step < 0.32, "%s: RMS error / step %.3f", fm_dtype_name(t),
                  per_step);
        CHECK_MSG(rel < rms_bound[ti], "%s: relative RMS error %.4f", fm_dtype_name(t), rel);
        int zeros = 1;
        for (int i = 0; i < 256; i++) zeros &= y[i] == 0.0f;
        CHECK_MSG(zeros, "%s: the zero block does not decode to zeros", fm_dtype_name(t));
    }
}

/* llama.cpp's Q4_K_M / Q5_K_M types, written out by hand for 8 and 36 layers (see qwen3_synth.c). */
static void test_mix_rule(void) {
    qwen3_synth_params p;
    qwen3_synth_preset("qwen3-4b", &p);
    CHECK(qwen3_synth_parse_type("Q4_K_M", &p) == 0 && p.wtype == FM_DTYPE_Q4_K && p.mix == QWEN3_SYNTH_K_M);
    CHECK(qwen3_synth_file_type(&p) == 15 && !strcmp(qwen3_synth_type_name(&p), "q4_k_m"));
    char err[FM_ERROR_LEN];
    CHECK_MSG(qwen3_synth_validate(&p, err, sizeof err) == 0, "%s", err); /* Qwen3-4B's dims: 256 k */
    static const int q6_36[] = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 31, 32, 33, 34, 35};
    char name[64];
    for (int l = 0, k = 0; l < 36; l++) {
        const int six = k < (int)(sizeof q6_36 / sizeof q6_36[0]) && q6_36[k] == l;
        k += six;
        snprintf(name, sizeof name, "blk.%d.attn_v.weight", l);
        CHECK_MSG(qwen3_synth_tensor_dtype(&p, name) == (six ? FM_DTYPE_Q6_K : FM_DTYPE_Q4_K), "%s", name);
        snprintf(name, sizeof name, "blk.%d.ffn_down.weight", l);
        CHECK_MSG(qwen3_synth_tensor_dtype(&p, name) == (six ? FM_DTYPE_Q6_K : FM_DTYPE_Q4_K), "%s", name);
        static const char *const base[] = {"attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"};
        for (int i = 0; i < 5; i++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, base[i]);
            CHECK_MSG(qwen3_synth_tensor_dtype(&p, name) == FM_DTYPE_Q4_K, "%s", name);
        }
        snprintf(name, sizeof name, "blk.%d.attn_q_norm.weight", l);
        CHECK(qwen3_synth_tensor_dtype(&p, name) == FM_DTYPE_F32);
    }
    CHECK(qwen3_synth_tensor_dtype(&p, "token_embd.weight") == FM_DTYPE_Q6_K); /* tied: it is the lm_head */
    CHECK(qwen3_synth_tensor_dtype(&p, "output_norm.weight") == FM_DTYPE_F32);
    p.tied = 0;
    CHECK(qwen3_synth_tensor_dtype(&p, "token_embd.weight") == FM_DTYPE_Q4_K);
    CHECK(qwen3_synth_tensor_dtype(&p, "output.weight") == FM_DTYPE_Q6_K);
    p.n_layers = 8; /* n / 8 = 1, 7 n / 8 = 7: layers 0, 7 and (i - 1) % 3 == 2 */
    CHECK(qwen3_synth_parse_type("q5_k_m", &p) == 0 && qwen3_synth_file_type(&p) == 17);
    for (int l = 0; l < 8; l++) {
        snprintf(name, sizeof name, "blk.%d.ffn_down.weight", l);
        const int six = l == 0 || l == 3 || l == 6 || l == 7;
        CHECK_MSG(qwen3_synth_tensor_dtype(&p, name) == (six ? FM_DTYPE_Q6_K : FM_DTYPE_Q5_K), "%s", name);
    }
    static const struct {
        const char *name;
        uint32_t ftype;
        fm_dtype all;
    } pure[] = {{"q4_k", 14, FM_DTYPE_Q4_K}, {"q5_k", 16, FM_DTYPE_Q5_K}, {"q6_k", 18, FM_DTYPE_Q6_K},
                {"q8_0", 7, FM_DTYPE_Q8_0},  {"bf16", 32, FM_DTYPE_BF16}, {"f16", 1, FM_DTYPE_F16},
                {"f32", 0, FM_DTYPE_F32}};
    for (int i = 0; i < 7; i++) {
        CHECK(qwen3_synth_parse_type(pure[i].name, &p) == 0 && p.mix == QWEN3_SYNTH_PURE);
        CHECK(qwen3_synth_file_type(&p) == pure[i].ftype && !strcmp(qwen3_synth_type_name(&p), pure[i].name));
        CHECK(qwen3_synth_tensor_dtype(&p, "output.weight") == pure[i].all &&
              qwen3_synth_tensor_dtype(&p, "blk.0.attn_v.weight") == pure[i].all);
    }
    CHECK(qwen3_synth_parse_type("q4_k_mm", &p) == -1 && qwen3_synth_parse_type("q6_k_m", &p) == -1);
    CHECK(p.wtype == FM_DTYPE_F32); /* unchanged by a failed parse */
}

/* A small K-quant model: the layout and types, and every matrix's blocks == its generator rows quantised. */
static void test_k_model(const char *type, int tied) {
    char err[FM_ERROR_LEN], path[64];
    qwen3_synth_params p;
    qwen3_synth_preset("tiny", &p);
    p.n_layers = 8, p.dim = 256, p.n_heads = 2, p.n_kv_heads = 1, p.head_dim = 128, p.ffn = 512;
    p.tied = tied, p.seed = 5, p.n_threads = 2;
    CHECK(qwen3_synth_parse_type(type, &p) == 0);
    snprintf(path, sizeof path, "synth_%s_%d.gguf", type, tied);
    const char *fp = tmp_path(path);
    CHECK_MSG(qwen3_synth_write(&p, fp, err, sizeof err) == 0, "%s", err);
    gguf_file *f = gguf_open(fp, err, sizeof err);
    CHECK_MSG(f != NULL, "%s", err);
    if (!f) return;
    int n_tok = 0;
    qwen3_synth_tokenizer_size(NULL, &n_tok, err, sizeof err);
    check_layout(f, &p, qwen3_synth_default_vocab(n_tok));
    int n_bad = 0, n_rows = 0, n_q6 = 0;
    static float row[512];
    static uint8_t want[2 * sizeof(fm_block_q6_K)];
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if (t->n_dims != 2) continue;
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        const size_t rb = fm_dtype_row_bytes(t->dtype, t->ne[0]);
        n_q6 += t->dtype == FM_DTYPE_Q6_K;
        for (int64_t r = 0; r < t->ne[1]; r++, n_rows++) {
            n_bad += qwen3_synth_row(&p, name, r, row) != t->ne[0];
            qwen3_synth_quantize_k(t->dtype, row, want, t->ne[0]);
            n_bad += memcmp((const uint8_t *)t->data + (size_t)r * rb, want, rb) != 0;
        }
    }
    CHECK_MSG(n_bad == 0 && n_rows > 100, "%s: %d of %d rows differ from the generator quantised", type,
              n_bad, n_rows);
    CHECK(n_q6 == (!strcmp(type, "q6_k") ? 58 - tied
                   : strstr(type, "_m")  ? 9
                                         : 0)); /* 4 layers x 2 + lm_head */
    gguf_close(f);
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
    CHECK(isnan(qwen3_synth_value(&p, "blk.0.attn_v.weight", 0, 64))); /* [64, 32]: col 64 is outside */
    float r[64];
    CHECK(qwen3_synth_row(&p, "no.such.tensor", 0, r) == 0);
    CHECK(qwen3_synth_row(&p, "blk.0.attn_v.weight", 3, r) == 64 &&
          r[5] == qwen3_synth_value(&p, "blk.0.attn_v.weight", 3, 5));
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
    qwen3_synth_preset("tiny", &p); /* dim 64 */
    CHECK(qwen3_synth_parse_type("q4_k_m", &p) == 0);
    CHECK(qwen3_synth_validate(&p, err, sizeof err) == -1 && strstr(err, "dim = 64") && strstr(err, "256") &&
          strstr(err, "q4_k_m"));
    p.dim = 256, p.n_heads = 2, p.head_dim = 64; /* heads * head-dim = 128 */
    CHECK(qwen3_synth_validate(&p, err, sizeof err) == -1 && strstr(err, "heads * head-dim = 128"));
    p.head_dim = 128, p.ffn = 384;
    CHECK(qwen3_synth_validate(&p, err, sizeof err) == -1 && strstr(err, "ffn = 384"));
    p.ffn = 512;
    CHECK_MSG(qwen3_synth_validate(&p, err, sizeof err) == 0, "%s", err);
    p.wtype = FM_DTYPE_Q8_0; /* a K_M mix of a non-K type */
    CHECK(qwen3_synth_validate(&p, err, sizeof err) == -1 && strstr(err, "weight type"));
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
    test_quantizer_k();
    test_mix_rule();
    test_k_model("q4_k_m", 0);
    test_k_model("q5_k_m", 1);
    test_k_model("q4_k", 1);
    test_k_model("q6_k", 0);
    test_tiny();
    test_determinism();
    test_validation();
    return fm_test_report("test_qwen3_synth");
}
