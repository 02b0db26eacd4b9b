/* drafter_load.c: binds a FlashMap drafter's safetensors tensors, derives every dimension from their shapes,
 * checks that the drafter fits its target, and computes the load-time constants: the AdaLN modulations of
 * the jump s = 0 -> t = 1 and every slot's input x_embed(state_norm(mean row of the target's token table)).
 * Tensor names follow the authors' modeling_flashmap.py (FlashMapDraftModel). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "drafter/drafter_config.h"
#include "drafter/drafter_internal.h"

typedef struct {
    const st_file *st;
    char *err;
    size_t errlen;
} binder;

/* The tensor `name` as a matrix [rows][cols]; rows/cols < 0 accept any size. NULL-safe name formatting. */
static int bind_matrix(binder *b, const char *name, int64_t rows, int64_t cols, fm_matrix *m) {
    const st_tensor *t = st_find(b->st, name);
    if (!t) return fm_set_error(b->err, b->errlen, "%s: missing tensor '%s'", st_path(b->st), name);
    if (!t->supported)
        return fm_set_error(b->err, b->errlen, "%s: tensor '%s' has dtype %s, expected BF16, F16 or F32",
                            st_path(b->st), name, t->dtype_name);
    if (t->n_dims != 2 || (rows >= 0 && t->shape[0] != rows) || (cols >= 0 && t->shape[1] != cols))
        return fm_set_error(
            b->err, b->errlen, "%s: tensor '%s' has shape [%lld, %lld] (rank %d), expected [%lld, %lld]",
            st_path(b->st), name, (long long)(t->n_dims > 0 ? t->shape[0] : 0),
            (long long)(t->n_dims > 1 ? t->shape[1] : 0), t->n_dims, (long long)rows, (long long)cols);
    if ((uintptr_t)t->data % (uintptr_t)fm_dtype_block_bytes(t->dtype))
        return fm_set_error(b->err, b->errlen, "%s: tensor '%s' data is not aligned to its element size",
                            st_path(b->st), name);
    *m = (fm_matrix){t->dtype, t->shape[0], t->shape[1], t->data, NULL, FM_LAYOUT_ROWS};
    return 0;
}

/* An f32 copy of the vector `name` of length n (n < 0: any; the length is returned in *len). A rank-0 or
 * rank-1 tensor. optional: absent gives *out = NULL and success. */
static int bind_vector(binder *b, const char *name, int64_t n, int optional, float **out, int64_t *len) {
    *out = NULL;
    const st_tensor *t = st_find(b->st, name);
    if (!t)
        return optional ? 0
                        : fm_set_error(b->err, b->errlen, "%s: missing tensor '%s'", st_path(b->st), name);
    if (!t->supported)
        return fm_set_error(b->err, b->errlen, "%s: tensor '%s' has dtype %s, expected BF16, F16 or F32",
                            st_path(b->st), name, t->dtype_name);
    if (t->n_dims > 1 || (n >= 0 && t->n_elems != n))
        return fm_set_error(b->err, b->errlen,
                            "%s: tensor '%s' has %lld elements (rank %d), expected a vector of %lld",
                            st_path(b->st), name, (long long)t->n_elems, t->n_dims, (long long)n);
    float *v = malloc((size_t)(t->n_elems ? t->n_elems : 1) * sizeof *v);
    if (!v) return fm_set_error(b->err, b->errlen, "%s: out of memory", st_path(b->st));
    const uint8_t *p = t->data;
    for (int64_t i = 0; i < t->n_elems; i++) {
        uint16_t h;
        switch (t->dtype) {
        case FM_DTYPE_F32:
            memcpy(&v[i], p + 4 * i, 4);
            break;
        case FM_DTYPE_F16:
            memcpy(&h, p + 2 * i, 2);
            v[i] = fm_f16_to_f32(h);
            break;
        default:
            memcpy(&h, p + 2 * i, 2);
            v[i] = fm_bf16_to_f32(h);
            break;
        }
    }
    *out = v;
    if (len) *len = t->n_elems;
    return 0;
}

static int bind_attn(binder *b, int l, const char *kind, const fm_drafter_hparams *hp, fmd_attn *a) {
    char n[96];
    const char *proj[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    fm_matrix *m[4] = {&a->q, &a->k, &a->v, &a->o};
    for (int i = 0; i < 4; i++) {
        snprintf(n, sizeof n, "layers.%d.%s.%s.weight", l, kind, proj[i]);
        if (bind_matrix(b, n, hp->dim, hp->dim, m[i])) return -1;
    }
    snprintf(n, sizeof n, "layers.%d.%s.q_norm.weight", l, kind);
    if (bind_vector(b, n, hp->head_dim, 0, &a->q_norm, NULL)) return -1;
    snprintf(n, sizeof n, "layers.%d.%s.k_norm.weight", l, kind);
    return bind_vector(b, n, hp->head_dim, 0, &a->k_norm, NULL);
}

/* Shapes -> hp (dims only). */
static int read_shapes(binder *b, fm_drafter_hparams *hp) {
    fm_matrix m;
    if (bind_matrix(b, "fc.weight", -1, -1, &m)) return -1;
    hp->dim = (int)m.rows;
    hp->feat_width = (int)m.cols;
    if (bind_matrix(b, "anchor_proj.weight", hp->dim, -1, &m)) return -1;
    hp->target_dim = (int)m.cols;
    if (bind_matrix(b, "layers.0.mlp.fc1.weight", -1, hp->dim, &m)) return -1;
    hp->ffn = (int)m.rows;
    if (bind_matrix(b, "time_embed.linear_1.weight", -1, -1, &m)) return -1;
    hp->cond_dim = (int)m.rows;
    hp->time_dim = (int)m.cols;
    const st_tensor *t = st_find(b->st, "layers.0.self_attn.q_norm.weight");
    if (!t)
        return fm_set_error(b->err, b->errlen, "%s: missing tensor 'layers.0.self_attn.q_norm.weight'",
                            st_path(b->st));
    hp->head_dim = (int)t->n_elems;
    hp->n_layers = 0;
    for (int64_t i = 0; i < st_n_tensors(b->st); i++) {
        int l;
        if (sscanf(st_tensor_at(b->st, i)->name, "layers.%d.", &l) == 1 && l >= 0 && l < 4096 &&
            l + 1 > hp->n_layers)
            hp->n_layers = l + 1;
    }
    if (hp->dim < 1 || hp->head_dim < 2 || hp->head_dim % 2 || hp->dim % hp->head_dim || hp->time_dim % 2 ||
        hp->time_dim < 2 || hp->n_layers < 1 || hp->target_dim < 1)
        return fm_set_error(b->err, b->errlen,
                            "%s: inconsistent shapes: dim %d, head_dim %d (q_norm), time_dim %d, %d layers",
                            st_path(b->st), hp->dim, hp->head_dim, hp->time_dim, hp->n_layers);
    hp->n_heads = hp->dim / hp->head_dim;
    if (hp->feat_width % hp->target_dim)
        return fm_set_error(
            b->err, b->errlen,
            "%s: fc.weight takes %d features, not a multiple of the target dim %d (anchor_proj)",
            st_path(b->st), hp->feat_width, hp->target_dim);
    hp->n_capture = hp->feat_width / hp->target_dim;
    if (hp->n_capture > FM_DRAFTER_MAX_CAPTURE)
        return fm_set_error(b->err, b->errlen, "%s: %d captured layers, at most %d supported", st_path(b->st),
                            hp->n_capture, FM_DRAFTER_MAX_CAPTURE);
    return 0;
}

/* out[n] = linear(name)(x[1][cols]) with bias when present. */
static int small_linear(binder *b, fm_pool *pool, const char *name, int64_t rows, int64_t cols,
                        const float *x, float *out) {
    char n[96];
    fm_matrix m;
    float *bias;
    snprintf(n, sizeof n, "%s.weight", name);
    if (bind_matrix(b, n, rows, cols, &m)) return -1;
    snprintf(n, sizeof n, "%s.bias", name);
    if (bind_vector(b, n, m.rows, 1, &bias, NULL)) return -1;
    fm_matmul(pool, &m, x, 1, out, bias);
    free(bias);
    return 0;
}

/* The time MLP of `prefix` at time `time`: [cos | sin] sinusoid -> linear_1 -> SiLU -> linear_2; out[cond].
 */
static int time_embed(binder *b, fm_pool *pool, const fm_drafter_hparams *hp, const char *prefix, float time,
                      float *out) {
    int half = hp->time_dim / 2;
    float *e = malloc(sizeof(float) * (size_t)(hp->time_dim + hp->cond_dim));
    if (!e) return fm_set_error(b->err, b->errlen, "drafter: out of memory");
    float *hid = e + hp->time_dim;
    float ts = time * hp->time_scale;
    for (int i = 0; i < half; i++) {
        float f = (float)exp(-log(10000.0) * i / half), a = ts * f;
        e[i] = (float)cos((double)a);
        e[half + i] = (float)sin((double)a);
    }
    char n[96];
    snprintf(n, sizeof n, "%s.linear_1", prefix);
    int rc = small_linear(b, pool, n, hp->cond_dim, hp->time_dim, e, hid);
    if (!rc) fmd_silu(hid, hp->cond_dim);
    snprintf(n, sizeof n, "%s.linear_2", prefix);
    if (!rc) rc = small_linear(b, pool, n, hp->cond_dim, hp->cond_dim, hid, out);
    free(e);
    return rc;
}

/* cond = SiLU(time_embed(0) + jump_embed(1)); every *_adaln.linear(cond) -> [scale | shift | gate]. */
static int time_conditioning(fm_drafter *d, binder *b, fm_pool *pool) {
    const fm_drafter_hparams *hp = &d->hp;
    int D = hp->dim, C = hp->cond_dim, n_mod = hp->n_layers * 3 + 1;
    float *ts = malloc(sizeof(float) * 2 * (size_t)C);
    d->mods = calloc((size_t)n_mod * 3 * (size_t)D, sizeof(float));
    d->layer_mods = calloc((size_t)hp->n_layers * 3, sizeof(fmd_mod));
    if (!ts || !d->mods || !d->layer_mods) {
        free(ts);
        return fm_set_error(b->err, b->errlen, "drafter: out of memory");
    }
    float *tj = ts + C;
    int rc = time_embed(b, pool, hp, "time_embed", 0.0f, ts);
    if (!rc) rc = time_embed(b, pool, hp, "jump_embed", 1.0f, tj);
    if (!rc) {
        for (int i = 0; i < C; i++) ts[i] += tj[i];
        fmd_silu(ts, C);
    }
    static const char *norms[3] = {"self_attn_adaln", "cross_attn_adaln", "mlp_adaln"};
    char n[96];
    for (int l = 0; l < hp->n_layers && !rc; l++)
        for (int k = 0; k < 3 && !rc; k++) {
            float *m = d->mods + (size_t)(l * 3 + k) * 3 * D;
            snprintf(n, sizeof n, "layers.%d.%s.linear", l, norms[k]);
            rc = small_linear(b, pool, n, 3 * (int64_t)D, C, ts, m);
            d->layer_mods[l * 3 + k] = (fmd_mod){m, m + D, m + 2 * D};
        }
    /* final_adaln: [scale | shift | gate] in the authors' code; a 2-chunk [scale | shift] is accepted too. */
    if (!rc) {
        float *m = d->mods + (size_t)(n_mod - 1) * 3 * D;
        const st_tensor *t = st_find(d->st, "final_adaln.linear.weight");
        int64_t rows = t && t->n_dims == 2 && t->shape[0] == 2 * (int64_t)D ? 2 * (int64_t)D : 3 * (int64_t)D;
        rc = small_linear(b, pool, "final_adaln.linear", rows, C, ts, m);
        d->final_mod = (fmd_mod){m, m + D, NULL};
    }
    free(ts);
    return rc;
}

typedef struct {
    const fm_matrix *e;
    int64_t cols;
    double *partial; /* [threads][cols] */
    float *row;      /* [threads][cols] */
} colmean_ctx;

static void colmean_task(void *p, int64_t begin, int64_t end, int thread) {
    colmean_ctx *c = p;
    double *acc = c->partial + (size_t)thread * c->cols;
    float *row = c->row + (size_t)thread * c->cols;
    for (int64_t r = begin; r < end; r++) {
        fm_matrix_row_f32(c->e, r, row);
        for (int64_t i = 0; i < c->cols; i++) acc[i] += row[i];
    }
}

/* Every slot's input at zero noise: x_embed(state_norm(uniform_embeds)), uniform_embeds = mean row of the
 * target's token table (any weight type, dequantised). */
static int slot_input(fm_drafter *d, binder *b, fm_pool *pool) {
    const fm_matrix *e = &d->target->tok_embd;
    int H = d->hp.target_dim, nt = pool ? fm_pool_size(pool) : 1;
    colmean_ctx c = {e, H, calloc((size_t)nt * H, sizeof(double)), malloc((size_t)nt * H * sizeof(float))};
    float *u = malloc(sizeof(float) * (size_t)H), *w = NULL;
    d->slot_input = malloc(sizeof(float) * (size_t)d->hp.dim);
    int rc = 0;
    if (!c.partial || !c.row || !u || !d->slot_input)
        rc = fm_set_error(b->err, b->errlen, "drafter: out of memory");
    if (!rc) {
        fm_pool_for(pool, e->rows, 256, colmean_task, &c);
        for (int i = 0; i < H; i++) {
            double s = 0;
            for (int t = 0; t < nt; t++) s += c.partial[(size_t)t * H + i];
            u[i] = (float)(s / (double)e->rows);
        }
        rc = bind_vector(b, "state_norm.weight", H, 0, &w, NULL);
    }
    if (!rc) {
        fmd_rmsnorm_rows(u, w, 1, H, d->hp.rms_eps, u);
        rc = small_linear(b, pool, "x_embed", d->hp.dim, H, u, d->slot_input);
    }
    free(c.partial);
    free(c.row);
    free(u);
    free(w);
    return rc;
}

/* The drafter fits the target: dims, captured layers, vocabulary. */
static int check_target(const fm_drafter *d, const char *path, char *err, size_t errlen) {
    const fm_drafter_hparams *hp = &d->hp;
    const qwen3_model *t = d->target;
    if (t->hp.dim != hp->target_dim)
        return fm_set_error(err, errlen,
                            "%s: drafter is for a target of dim %d (anchor_proj), the target has dim %d",
                            path, hp->target_dim, t->hp.dim);
    if (hp->feat_width != hp->n_capture * t->hp.dim)
        return fm_set_error(err, errlen, "%s: fc.weight takes %d features, expected %d captures x %d", path,
                            hp->feat_width, hp->n_capture, t->hp.dim);
    for (int i = 0; i < hp->n_capture; i++)
        if (hp->target_layers[i] == -1)
            return fm_set_error(err, errlen,
                                "%s: no default target layers for %d captures of a %d-layer target; give "
                                "target_layer_ids in config.json or --target-layers",
                                path, hp->n_capture, t->hp.n_layers);
        else if (hp->target_layers[i] < 0 || hp->target_layers[i] >= t->hp.n_layers)
            return fm_set_error(err, errlen,
                                "%s: target layer id %d (capture %d) is outside the target's %d layers", path,
                                hp->target_layers[i], i, t->hp.n_layers);
    if (t->tok_embd.rows != t->hp.vocab || t->tok_embd.cols != t->hp.dim || t->output.rows != t->hp.vocab ||
        t->output.cols != t->hp.dim || t->hp.vocab < 1)
        return fm_set_error(err, errlen,
                            "%s: the target's token table [%lld x %lld] / lm_head [%lld x %lld] do not "
                            "match its vocab %d x dim %d",
                            path, (long long)t->tok_embd.rows, (long long)t->tok_embd.cols,
                            (long long)t->output.rows, (long long)t->output.cols, t->hp.vocab, t->hp.dim);
    return 0;
}

static int bind_weights(fm_drafter *d, binder *b) {
    const fm_drafter_hparams *hp = &d->hp;
    int D = hp->dim, H = hp->target_dim;
    if (bind_matrix(b, "fc.weight", D, hp->feat_width, &d->fc) ||
        bind_vector(b, "hidden_norm.weight", D, 0, &d->hidden_norm, NULL) ||
        bind_matrix(b, "anchor_proj.weight", D, H, &d->anchor_proj) ||
        bind_vector(b, "anchor_proj.bias", D, 1, &d->anchor_proj_b, NULL) ||
        bind_vector(b, "anchor_norm.weight", D, 0, &d->anchor_norm, NULL) ||
        bind_matrix(b, "head.weight", H, D, &d->head) || bind_vector(b, "head.bias", H, 1, &d->head_b, NULL))
        return -1;
    d->layers = calloc((size_t)hp->n_layers, sizeof *d->layers);
    if (!d->layers) return fm_set_error(b->err, b->errlen, "drafter: out of memory");
    char n[96];
    for (int l = 0; l < hp->n_layers; l++) {
        fmd_layer *L = &d->layers[l];
        if (bind_attn(b, l, "self_attn", hp, &L->self) || bind_attn(b, l, "cross_attn", hp, &L->cross))
            return -1;
        snprintf(n, sizeof n, "layers.%d.mlp.fc1.weight", l);
        if (bind_matrix(b, n, hp->ffn, D, &L->fc1)) return -1;
        snprintf(n, sizeof n, "layers.%d.mlp.fc2.weight", l);
        if (bind_matrix(b, n, D, hp->ffn, &L->fc2)) return -1;
        snprintf(n, sizeof n, "layers.%d.mlp.fc1.bias", l);
        if (bind_vector(b, n, hp->ffn, 1, &L->fc1_b, NULL)) return -1;
        snprintf(n, sizeof n, "layers.%d.mlp.fc2.bias", l);
        if (bind_vector(b, n, D, 1, &L->fc2_b, NULL)) return -1;
        L->k_cache = malloc((size_t)d->max_ctx * D * sizeof(uint16_t));
        L->v_cache = malloc((size_t)d->max_ctx * D * sizeof(uint16_t));
        if (!L->k_cache || !L->v_cache)
            return fm_set_error(b->err, b->errlen, "drafter: out of memory for a %d-position context cache",
                                d->max_ctx);
    }
    return 0;
}

static int alloc_scratch(fm_drafter *d, char *err, size_t errlen) {
    const fm_drafter_hparams *hp = &d->hp;
    size_t R = (size_t)(d->scratch_rows = hp->block > 64 ? hp->block : 64), D = (size_t)hp->dim;
    float **bufs[7] = {&d->x, &d->h, &d->q, &d->k, &d->v, &d->att, &d->y};
    for (int i = 0; i < 7; i++)
        if (!(*bufs[i] = malloc(R * D * sizeof(float))))
            return fm_set_error(err, errlen, "drafter: out of memory");
    int half = hp->head_dim / 2;
    d->u = malloc((size_t)hp->block * hp->ffn * sizeof(float));
    d->tmp_feat = malloc((size_t)hp->target_dim * sizeof(float));
    d->head_out = calloc((size_t)hp->block * hp->target_dim, sizeof(float));
    d->logits = malloc((size_t)hp->block * d->target->hp.vocab * sizeof(float));
    d->rope_cos = malloc(R * half * sizeof(float));
    d->rope_sin = malloc(R * half * sizeof(float));
    d->inv_freq = malloc((size_t)half * sizeof(float));
    if (!d->u || !d->tmp_feat || !d->head_out || !d->logits || !d->rope_cos || !d->rope_sin || !d->inv_freq)
        return fm_set_error(err, errlen, "drafter: out of memory");
    /* inv_freq[i] = 1 / theta^(2i / head_dim), in f32 as the reference. */
    for (int i = 0; i < half; i++)
        d->inv_freq[i] = 1.0f / powf(hp->rope_theta, (float)(2 * i) / hp->head_dim);
    return 0;
}

int fm_drafter_load(const char *path, const qwen3_model *target, const fm_drafter_overrides *ov, int max_ctx,
                    fm_drafter **out, char *err, size_t errlen) {
    *out = NULL;
    if (max_ctx < 1) return fm_set_error(err, errlen, "drafter: max_ctx %d, expected >= 1", max_ctx);
    /* A folder holds model.safetensors; config.json sits beside the weights either way. */
    char file[4096], cfg[4096];
    struct stat sb;
    int is_dir = stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
    if (is_dir)
        snprintf(file, sizeof file, "%s/model.safetensors", path);
    else
        snprintf(file, sizeof file, "%s", path);
    const char *slash = strrchr(file, '/');
    if (slash)
        snprintf(cfg, sizeof cfg, "%.*s/config.json", (int)(slash - file), file);
    else
        snprintf(cfg, sizeof cfg, "config.json");

    fm_drafter *d = calloc(1, sizeof *d);
    if (!d) return fm_set_error(err, errlen, "drafter: out of memory");
    d->target = target;
    d->max_ctx = max_ctx;
    if (!(d->st = st_open(file, err, errlen))) {
        free(d);
        return -1;
    }
    binder b = {d->st, err, errlen};
    fm_drafter_hparams *hp = &d->hp;
    hp->block = 16;
    hp->rope_theta = 10000.0f;
    hp->time_scale = 1000.0f;
    hp->rms_eps = 1e-6f;
    hp->qk_eps = 1e-5f;
    hp->ln_eps = 1e-6f;
    int rc = read_shapes(&b, hp);
    if (!rc)
        rc = fm_drafter_default_layers(target->hp.n_layers, hp->n_capture, hp->target_layers, err, errlen);
    /* A default that cannot be derived only matters when neither config.json nor the caller gives the ids
     * (check_target then reports the -1 placeholders as outside the target). */
    if (rc && hp->n_capture >= 1 && hp->n_capture <= FM_DRAFTER_MAX_CAPTURE) {
        for (int i = 0; i < hp->n_capture; i++) hp->target_layers[i] = -1;
        rc = 0;
    }
    if (!rc) rc = fmd_config_read(cfg, hp, target->hp.vocab, err, errlen);
    if (!rc) rc = fmd_config_apply_overrides(hp, ov, err, errlen);
    if (!rc) rc = check_target(d, file, err, errlen);
    if (!rc) rc = bind_weights(d, &b);
    if (!rc) rc = alloc_scratch(d, err, errlen);
    fm_pool *pool = NULL; /* load-time constants are small; computed on the caller's thread */
    if (!rc) rc = time_conditioning(d, &b, pool);
    if (!rc) rc = slot_input(d, &b, pool);
    if (rc) {
        fm_drafter_free(d);
        return -1;
    }
    *out = d;
    return 0;
}

void fm_drafter_free(fm_drafter *d) {
    if (!d) return;
    for (int l = 0; d->layers && l < d->hp.n_layers; l++) {
        fmd_layer *L = &d->layers[l];
        void *p[] = {L->self.q_norm, L->self.k_norm, L->cross.q_norm, L->cross.k_norm,
                     L->fc1_b,       L->fc2_b,       L->k_cache,      L->v_cache};
        for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
    }
    void *p[] = {d->layers,      d->hidden_norm, d->anchor_proj_b,
                 d->anchor_norm, d->head_b,      d->mods,
                 d->layer_mods,  d->slot_input,  d->x,
                 d->h,           d->q,           d->k,
                 d->v,           d->att,         d->y,
                 d->u,           d->tmp_feat,    d->head_out,
                 d->logits,      d->rope_cos,    d->rope_sin,
                 d->inv_freq,    d->scores,      d->q8_data,
                 d->q8_packed};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
    st_close(d->st);
    free(d);
}

const fm_drafter_hparams *fm_drafter_hp(const fm_drafter *d) {
    return &d->hp;
}
const int *fm_drafter_target_layers(const fm_drafter *d, int *n) {
    *n = d->hp.n_capture;
    return d->hp.target_layers;
}
int fm_drafter_block(const fm_drafter *d) {
    return d->hp.block;
}
int fm_drafter_max_ctx(const fm_drafter *d) {
    return d->max_ctx;
}
int fm_drafter_length(const fm_drafter *d) {
    return d->length;
}
void fm_drafter_reset(fm_drafter *d) {
    d->length = 0;
}
const float *fm_drafter_last_head(const fm_drafter *d) {
    return d->head_out;
}
const float *fm_drafter_last_logits(const fm_drafter *d) {
    return d->logits;
}
