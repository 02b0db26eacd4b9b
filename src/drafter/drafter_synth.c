/* drafter_synth.c: random FlashMap drafters with the authors' tensor names and shapes (FlashMapDraftModel in
 * modeling_flashmap.py), for tests and benchmarks. Every tensor draws from its own splitmix64 stream seeded
 * by (seed, tensor name), so the file is a pure function of the parameters and tensors can be generated one
 * at a time while writing. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/rng.h"
#include "drafter/flashmap_drafter.h"
#include "io/safetensors.h"

/* How a tensor's values are drawn: center + uniform(-spread, spread); for adaln linears' biases the three
 * chunks [scale | shift | gate] get centers 0, 0, gate_center. */
typedef struct {
    uint64_t stream;
    fm_dtype dtype;
    float center, spread;
    int64_t chunk; /* > 0: adaln bias with chunks of this length */
    float gate_center;
} synth_fill;

static uint64_t name_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

static void synth_fill_fn(void *ctx, void *dst, size_t size) {
    const synth_fill *f = ctx;
    uint64_t s = f->stream;
    size_t es = (size_t)fm_dtype_block_bytes(f->dtype), n = size / es;
    for (size_t i = 0; i < n; i++) {
        float u = (float)((fm_splitmix64(&s) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; /* [-1, 1) */
        float c = f->center;
        if (f->chunk > 0 && (int64_t)i / f->chunk == 2) c = f->gate_center;
        float v = c + f->spread * u;
        uint16_t h;
        switch (f->dtype) {
        case FM_DTYPE_F32:
            memcpy((uint8_t *)dst + 4 * i, &v, 4);
            break;
        case FM_DTYPE_F16:
            h = fm_f32_to_f16(v);
            memcpy((uint8_t *)dst + 2 * i, &h, 2);
            break;
        default:
            h = fm_f32_to_bf16(v);
            memcpy((uint8_t *)dst + 2 * i, &h, 2);
            break;
        }
    }
}

typedef struct {
    st_writer *w;
    synth_fill *fills;
    int n, cap;
    uint64_t seed;
    fm_dtype dtype;
    char *err;
    size_t errlen;
} synth;

static int add(synth *s, const char *name, int n_dims, int64_t d0, int64_t d1, float center, float spread,
               int64_t chunk, float gate_center) {
    if (s->n == s->cap) return fm_set_error(s->err, s->errlen, "drafter synth: too many tensors");
    synth_fill *f = &s->fills[s->n++];
    *f = (synth_fill){s->seed ^ name_hash(name), s->dtype, center, spread, chunk, gate_center};
    int64_t shape[2] = {d0, d1};
    return st_writer_add_fn(s->w, name, s->dtype, n_dims, shape, synth_fill_fn, f, s->err, s->errlen);
}

/* A linear [rows][cols]: weights uniform with variance gain^2 / cols (activations stay O(1)). */
static int linear(synth *s, const char *name, int64_t rows, int64_t cols, float gain, int bias) {
    char n[96];
    snprintf(n, sizeof n, "%s.weight", name);
    if (add(s, n, 2, rows, cols, 0.0f, gain * sqrtf(3.0f / (float)cols), 0, 0)) return -1;
    snprintf(n, sizeof n, "%s.bias", name);
    return bias ? add(s, n, 1, rows, 0, 0.0f, 0.1f, 0, 0) : 0;
}

static int norm(synth *s, const char *name, int64_t n, float center, float spread) {
    return add(s, name, 1, n, 0, center, spread, 0, 0);
}

/* AdaLN: linear(cond -> 3D), small weights, bias chunks scale ~0, shift ~0, gate ~1 (cross-attention ~2). */
static int adaln(synth *s, const char *name, int64_t D, int64_t C) {
    char n[96];
    snprintf(n, sizeof n, "%s.linear.weight", name);
    if (add(s, n, 2, 3 * D, C, 0.0f, 0.2f * sqrtf(3.0f / (float)C), 0, 0)) return -1;
    snprintf(n, sizeof n, "%s.linear.bias", name);
    /* Cross-attention gates ~2: the slots differ from each other mainly through what they attend to. */
    float gate = strstr(name, "cross_attn") ? 2.0f : 1.0f;
    return add(s, n, 1, 3 * D, 0, 0.0f, 0.1f, D, gate);
}

static int attn(synth *s, int l, const char *kind, int64_t D, int64_t hd) {
    char n[96];
    const char *proj[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    for (int i = 0; i < 4; i++) {
        snprintf(n, sizeof n, "layers.%d.%s.%s", l, kind, proj[i]);
        if (linear(s, n, D, D, 1.0f, 0)) return -1;
    }
    /* q/k norm weights around 2: scores of std ~4, so attention depends on the RoPE positions. */
    snprintf(n, sizeof n, "layers.%d.%s.q_norm.weight", l, kind);
    if (norm(s, n, hd, 2.0f, 0.5f)) return -1;
    snprintf(n, sizeof n, "layers.%d.%s.k_norm.weight", l, kind);
    return norm(s, n, hd, 2.0f, 0.5f);
}

static int write_config(const fm_drafter_synth_params *p, const int *ids, int n_ids, int target_dim,
                        int target_vocab, const char *path, char *err, size_t errlen) {
    char cfg[4096], tmp[4200];
    const char *slash = strrchr(path, '/');
    if (slash)
        snprintf(cfg, sizeof cfg, "%.*s/config.json", (int)(slash - path), path);
    else
        snprintf(cfg, sizeof cfg, "config.json");
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "model_type", "flashmap");
    cJSON_AddItemToObject(r, "architectures",
                          cJSON_CreateStringArray((const char *[]){"FlashMapDraftModel"}, 1));
    cJSON_AddNumberToObject(r, "target_hidden_size", target_dim);
    if (target_vocab > 0) cJSON_AddNumberToObject(r, "vocab_size", target_vocab);
    cJSON_AddItemToObject(r, "target_layer_ids", cJSON_CreateIntArray(ids, n_ids));
    cJSON_AddNumberToObject(r, "block_size", p->block);
    cJSON_AddNumberToObject(r, "hidden_size", p->dim);
    cJSON_AddNumberToObject(r, "num_hidden_layers", p->n_layers);
    cJSON_AddNumberToObject(r, "num_attention_heads", p->n_heads);
    cJSON_AddNumberToObject(r, "intermediate_size", p->ffn);
    cJSON_AddNumberToObject(r, "cond_dim", p->cond_dim);
    cJSON_AddNumberToObject(r, "time_embed_dim", p->time_dim);
    cJSON_AddNumberToObject(r, "time_scale", 1000.0);
    cJSON_AddNumberToObject(r, "rope_theta", 10000.0);
    cJSON_AddNumberToObject(r, "rms_norm_eps", 1e-6);
    cJSON_AddNumberToObject(r, "qk_norm_eps", 1e-5);
    cJSON_AddNumberToObject(r, "layer_norm_eps", 1e-6);
    cJSON_AddStringToObject(r, "noise_gate", "jump");
    cJSON_AddNumberToObject(r, "num_steps", 1);
    cJSON_AddStringToObject(r, "torch_dtype",
                            p->dtype == FM_DTYPE_F32   ? "float32"
                            : p->dtype == FM_DTYPE_F16 ? "float16"
                                                       : "bfloat16");
    char *text = cJSON_Print(r);
    cJSON_Delete(r);
    if (!text) return fm_set_error(err, errlen, "%s: out of memory", cfg);
    snprintf(tmp, sizeof tmp, "%s.tmp%d", cfg, (int)getpid());
    FILE *fp = fopen(tmp, "w");
    int rc = 0;
    if (!fp || fputs(text, fp) < 0 || fputc('\n', fp) < 0) rc = -1;
    if (fp && fclose(fp)) rc = -1;
    if (!rc && rename(tmp, cfg)) rc = -1;
    if (rc) {
        fm_set_error(err, errlen, "%s: cannot write: %s", cfg, strerror(errno));
        remove(tmp);
    }
    free(text);
    return rc;
}

void fm_drafter_synth_flashmap_4b(fm_drafter_synth_params *p) {
    *p = (fm_drafter_synth_params){.dim = 2048,
                                   .n_layers = 6,
                                   .n_heads = 16,
                                   .head_dim = 128,
                                   .ffn = 8192,
                                   .block = 16,
                                   .cond_dim = 256,
                                   .time_dim = 256,
                                   .n_capture = 5,
                                   .seed = 1,
                                   .dtype = FM_DTYPE_BF16};
}

int fm_drafter_synth(const fm_drafter_synth_params *p, int target_dim, int target_layers, int target_vocab,
                     const char *path, char *err, size_t errlen) {
    int64_t D = p->dim, H = target_dim, F = p->ffn, C = p->cond_dim, TD = p->time_dim, hd = p->head_dim;
    if (D < 1 || H < 1 || F < 1 || C < 1 || TD < 2 || TD % 2 || hd < 2 || hd % 2 || p->n_heads < 1 ||
        p->n_heads * hd != D || p->n_layers < 1 || p->block < 1 || p->block > FM_DRAFTER_MAX_BLOCK)
        return fm_set_error(
            err, errlen,
            "drafter synth: bad shape: dim %d must be heads %d x head_dim %d (even), ffn %d, layers "
            "%d, block %d (1..%d), cond %d, time %d (even)",
            p->dim, p->n_heads, p->head_dim, p->ffn, p->n_layers, p->block, FM_DRAFTER_MAX_BLOCK, p->cond_dim,
            p->time_dim);
    if (p->dtype != FM_DTYPE_BF16 && p->dtype != FM_DTYPE_F16 && p->dtype != FM_DTYPE_F32)
        return fm_set_error(err, errlen, "drafter synth: type %s, expected bf16, f16 or f32",
                            fm_dtype_name(p->dtype));
    int ids[FM_DRAFTER_MAX_CAPTURE], n_ids = p->n_target_layers;
    if (n_ids > 0) {
        if (n_ids > FM_DRAFTER_MAX_CAPTURE)
            return fm_set_error(err, errlen, "drafter synth: %d target layers, at most %d", n_ids,
                                FM_DRAFTER_MAX_CAPTURE);
        memcpy(ids, p->target_layers, sizeof(int) * (size_t)n_ids);
    } else {
        n_ids = p->n_capture;
        if (fm_drafter_default_layers(target_layers, n_ids, ids, err, errlen)) return -1;
    }
    for (int i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= target_layers)
            return fm_set_error(err, errlen, "drafter synth: target layer %d outside the target's %d layers",
                                ids[i], target_layers);

    synth s = {st_writer_create(), NULL, 0, 32 + 40 * p->n_layers, p->seed, p->dtype, err, errlen};
    s.fills = calloc((size_t)s.cap, sizeof *s.fills);
    int rc = (!s.w || !s.fills) ? fm_set_error(err, errlen, "drafter synth: out of memory") : 0;
    /* Context and anchor. */
    if (!rc) rc = linear(&s, "fc", D, n_ids * H, 1.0f, 0);
    if (!rc) rc = norm(&s, "hidden_norm.weight", D, 1.0f, 0.1f);
    if (!rc) rc = linear(&s, "anchor_proj", D, H, 1.0f, 1);
    if (!rc) rc = norm(&s, "anchor_norm.weight", D, 1.0f, 0.1f);
    /* State featurisation (noise_norm / noise_gate are unused at zero noise but part of the format). */
    if (!rc) rc = norm(&s, "state_norm.weight", H, 1.0f, 0.1f);
    if (!rc) rc = norm(&s, "noise_norm.weight", H, 1.0f, 0.1f);
    if (!rc) rc = add(&s, "noise_gate", 1, 1, 0, 1.0f, 0.0f, 0, 0);
    /* A small x_embed gain: every slot starts from this same row, so it should not drown the slots'
     * differences. */
    if (!rc) rc = linear(&s, "x_embed", D, H, 0.3f, 1);
    /* Time conditioning. */
    if (!rc) rc = linear(&s, "time_embed.linear_1", C, TD, 1.0f, 1);
    if (!rc) rc = linear(&s, "time_embed.linear_2", C, C, 1.0f, 1);
    if (!rc) rc = linear(&s, "jump_embed.linear_1", C, TD, 1.0f, 1);
    if (!rc) rc = linear(&s, "jump_embed.linear_2", C, C, 1.0f, 1);
    char n[96];
    for (int l = 0; l < p->n_layers && !rc; l++) {
        snprintf(n, sizeof n, "layers.%d.self_attn_adaln", l);
        rc = adaln(&s, n, D, C);
        if (!rc) rc = attn(&s, l, "self_attn", D, hd);
        snprintf(n, sizeof n, "layers.%d.cross_attn_adaln", l);
        if (!rc) rc = adaln(&s, n, D, C);
        if (!rc) rc = attn(&s, l, "cross_attn", D, hd);
        snprintf(n, sizeof n, "layers.%d.mlp_adaln", l);
        if (!rc) rc = adaln(&s, n, D, C);
        snprintf(n, sizeof n, "layers.%d.mlp.fc1", l);
        if (!rc) rc = linear(&s, n, F, D, 1.0f, 1);
        snprintf(n, sizeof n, "layers.%d.mlp.fc2", l);
        if (!rc) rc = linear(&s, n, D, F, 1.0f, 1);
    }
    if (!rc) rc = adaln(&s, "final_adaln", D, C);
    if (!rc) rc = linear(&s, "head", H, D, 1.0f, 1);
    if (!rc) rc = st_writer_write(s.w, path, err, errlen);
    if (!rc) rc = write_config(p, ids, n_ids, target_dim, target_vocab, path, err, errlen);
    st_writer_free(s.w);
    free(s.fills);
    return rc;
}
