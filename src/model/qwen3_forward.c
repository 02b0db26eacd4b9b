/* qwen3_forward.c: the Qwen3 dense forward pass on the CPU for T tokens at once.
 *
 * Per layer (rows t = 0..T-1 at positions pos+t):
 *   h = rmsnorm(x) ; q,k,v = Wq h, Wk h, Wv h ; per-head rmsnorm on q and k ; NEOX RoPE (pairs i, i+hd/2)
 *   K/V rows -> f16 cache ; o = causal GQA attention ; x += Wo o
 *   h = rmsnorm(x) ; x += Wdown (silu(Wgate h) * Wup h)
 *   captured layers copy x (the layer's output, before the final norm) into the feature rows.
 * Then logits = output . rmsnorm(x) for the rows the caller asked for.
 * Invariant: the KV cache holds exactly positions 0 .. pos-1; rewinding only lowers pos, since every forward
 * overwrites the rows it attends to before reading them. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "cpu/attention.h"
#include "cpu/ops.h"
#include "model/qwen3.h"

struct qwen3_state {
    int n_ctx, max_batch, pos;
    int n_capture, *capture_layer_slot; /* [n_layers]: capture slot of a layer, or -1 */
    int kv_dim, feature_dim;            /* feature_dim: the model's dim */
    /* [n_layers][n_kv_heads][n_ctx][head_dim] f16: each KV head's rows one contiguous stream, which the
     * attention reads faster than rows of all heads side by side (16k positions: 7.4-8.2 -> 6.8 ms a layer)
     */
    uint16_t *k_cache, *v_cache;
    float *rope; /* [n_ctx][head_dim/2][2] (cos, sin) */
    /* activations for up to max_batch rows */
    float *x;      /* [B][dim] residual stream */
    float *h;      /* [B][dim] normed input */
    float *q;      /* [B][n_heads*head_dim] */
    float *k, *v;  /* [B][kv_dim] */
    float *att;    /* [B][n_heads*head_dim] */
    float *gate;   /* [B][ffn] */
    float *up;     /* [B][ffn] */
    float *scores; /* attention scratch: fm_attention_scratch_floats(scores_threads) */
    int scores_threads;
    float *features; /* [B][n_capture*dim] */
    float *logits;   /* [logits_rows][vocab], grown on demand */
    int logits_rows;
    int32_t *argmax; /* [B] */
};

static void *alloc_f32(size_t n) {
    return calloc(n ? n : 1, sizeof(float));
}

int qwen3_state_create(const qwen3_model *m, const qwen3_state_params *p, qwen3_state **out, char *err,
                       size_t errlen) {
    const qwen3_hparams *hp = &m->hp;
    *out = NULL;
    if (p->n_ctx < 1 || p->n_ctx > (1 << 20))
        return fm_set_error(err, errlen, "context size %d is out of range (1 .. 1048576)", p->n_ctx);
    if (p->max_batch < 1 || p->max_batch > 8192)
        return fm_set_error(err, errlen, "batch size %d is out of range (1 .. 8192)", p->max_batch);
    for (int i = 0; i < p->n_capture; i++)
        if (p->capture_layers[i] < 0 || p->capture_layers[i] >= hp->n_layers)
            return fm_set_error(err, errlen, "capture layer %d does not exist (the model has layers 0 .. %d)",
                                p->capture_layers[i], hp->n_layers - 1);
    qwen3_state *s = calloc(1, sizeof *s);
    if (!s) return fm_set_error(err, errlen, "out of memory");
    const int B = p->max_batch, q_dim = hp->n_heads * hp->head_dim;
    s->n_ctx = p->n_ctx;
    s->max_batch = B;
    s->kv_dim = hp->n_kv_heads * hp->head_dim;
    s->n_capture = p->n_capture;
    s->feature_dim = hp->dim;
    s->capture_layer_slot = malloc((size_t)hp->n_layers * sizeof(int));
    const size_t kv_elems = (size_t)hp->n_layers * (size_t)p->n_ctx * (size_t)s->kv_dim;
    s->k_cache = malloc(kv_elems * sizeof(uint16_t));
    s->v_cache = malloc(kv_elems * sizeof(uint16_t));
    s->rope = alloc_f32((size_t)p->n_ctx * (size_t)hp->head_dim);
    s->x = alloc_f32((size_t)B * hp->dim);
    s->h = alloc_f32((size_t)B * hp->dim);
    s->q = alloc_f32((size_t)B * q_dim);
    s->k = alloc_f32((size_t)B * s->kv_dim);
    s->v = alloc_f32((size_t)B * s->kv_dim);
    s->att = alloc_f32((size_t)B * q_dim);
    s->gate = alloc_f32((size_t)B * hp->ffn);
    s->up = alloc_f32((size_t)B * hp->ffn);
    s->features = alloc_f32((size_t)B * (size_t)(p->n_capture ? p->n_capture : 1) * hp->dim);
    s->argmax = calloc((size_t)B, sizeof(int32_t));
    if (!s->capture_layer_slot || !s->k_cache || !s->v_cache || !s->rope || !s->x || !s->h || !s->q ||
        !s->k || !s->v || !s->att || !s->gate || !s->up || !s->features || !s->argmax) {
        qwen3_state_free(s);
        return fm_set_error(err, errlen, "out of memory for a %d-position KV cache (%.1f GiB); lower --ctx",
                            p->n_ctx, 2.0 * (double)kv_elems * 2 / (1 << 30));
    }
    for (int l = 0; l < hp->n_layers; l++) s->capture_layer_slot[l] = -1;
    for (int i = 0; i < p->n_capture; i++) s->capture_layer_slot[p->capture_layers[i]] = i;
    /* RoPE table in double, rounded once: position p, pair i turns by p * theta^(-2i/hd). */
    const int half = hp->head_dim / 2;
    for (int pos = 0; pos < p->n_ctx; pos++)
        for (int i = 0; i < half; i++) {
            double ang = pos * pow((double)hp->rope_theta, -2.0 * i / hp->head_dim);
            s->rope[((size_t)pos * half + i) * 2] = (float)cos(ang);
            s->rope[((size_t)pos * half + i) * 2 + 1] = (float)sin(ang);
        }
    *out = s;
    return 0;
}

void qwen3_state_free(qwen3_state *s) {
    if (!s) return;
    free(s->capture_layer_slot);
    free(s->k_cache);
    free(s->v_cache);
    free(s->rope);
    free(s->x);
    free(s->h);
    free(s->q);
    free(s->k);
    free(s->v);
    free(s->att);
    free(s->gate);
    free(s->up);
    free(s->scores);
    free(s->features);
    free(s->logits);
    free(s->argmax);
    free(s);
}

int qwen3_state_pos(const qwen3_state *s) {
    return s->pos;
}
int qwen3_state_n_ctx(const qwen3_state *s) {
    return s->n_ctx;
}
void qwen3_state_rewind(qwen3_state *s, int pos) {
    if (pos >= 0 && pos < s->pos) s->pos = pos;
}
const float *qwen3_state_logits(const qwen3_state *s) {
    return s->logits;
}
const int32_t *qwen3_state_argmax(const qwen3_state *s) {
    return s->argmax;
}
const float *qwen3_state_features(const qwen3_state *s) {
    return s->features;
}
int qwen3_state_feature_width(const qwen3_state *s) {
    return s->n_capture * s->feature_dim;
}

/* Per-head RMSNorm then NEOX rotation of the pairs (i, i + hd/2), for n_heads heads of one row at `pos`. */
static void head_norm_rope(float *row, int n_heads, int hd, const float *w, float eps,
                           const float *rope_row) {
    const int half = hd / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = row + (int64_t)h * hd;
        fm_rmsnorm(v, v, w, hd, eps);
        for (int i = 0; i < half; i++) {
            const float c = rope_row[2 * i], sn = rope_row[2 * i + 1], a = v[i], b = v[i + half];
            v[i] = a * c - b * sn;
            v[i + half] = b * c + a * sn;
        }
    }
}

/* Row work spread over the pool, a row a work item: RMSNorm (a sequential double sum, ~4 us a 2560-wide row)
 * and a row's q/k norms, RoPE and KV-cache write together take ~0.3 ms a layer for an 18-row verify block on
 * one core; row by row, so the same bits however the rows are split. */
typedef struct {
    float *out;
    const float *x, *w;
    int64_t stride;
    int n;
    float eps;
} norm_rows_job;

static void norm_rows_range(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const norm_rows_job *j = ctx;
    for (int64_t t = begin; t < end; t++)
        fm_rmsnorm(j->out + t * j->n, j->x + t * j->stride, j->w, j->n, j->eps);
}

/* out[t] = RMSNorm(x[t]) * w for rows t < T (x rows `stride` apart, out rows packed). */
static void norm_rows(fm_pool *pool, float *out, const float *x, int64_t stride, const float *w, int n,
                      float eps, int T) {
    norm_rows_job j = {out, x, w, stride, n, eps};
    fm_pool_for(pool, T, 2, norm_rows_range, &j);
}

typedef struct {
    const qwen3_model *m;
    const qwen3_layer *L;
    qwen3_state *s;
    uint16_t *kc, *vc;
    int64_t head_stride; /* of the caches */
} qk_rows_job;

static void qk_rows_range(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const qk_rows_job *j = ctx;
    const qwen3_hparams *hp = &j->m->hp;
    qwen3_state *s = j->s;
    const int hd = hp->head_dim, q_dim = hp->n_heads * hd, kv_dim = s->kv_dim;
    for (int64_t t = begin; t < end; t++) {
        const int pos = s->pos + (int)t;
        const float *rope_row = s->rope + (size_t)pos * hd;
        head_norm_rope(s->q + t * q_dim, hp->n_heads, hd, j->L->q_norm, hp->rms_eps, rope_row);
        float *k = s->k + t * kv_dim, *v = s->v + t * kv_dim;
        head_norm_rope(k, hp->n_kv_heads, hd, j->L->k_norm, hp->rms_eps, rope_row);
        fm_attention_store_kv(j->kc, j->vc, j->head_stride, pos, k, v, hp->n_kv_heads, hd);
    }
}

static void layer_attention(const qwen3_model *m, const qwen3_layer *L, qwen3_state *s, fm_pool *pool, int l,
                            int T) {
    const qwen3_hparams *hp = &m->hp;
    const int dim = hp->dim, hd = hp->head_dim, kv_dim = s->kv_dim;
    norm_rows(pool, s->h, s->x, dim, L->attn_norm, dim, hp->rms_eps, T);
    /* One pool job for q, k and v: x quantised once, no idle workers between the three. */
    const fm_matrix *qkv[3] = {&L->wq, &L->wk, &L->wv};
    float *const qkv_out[3] = {s->q, s->k, s->v};
    fm_matmul_multi(pool, qkv, 3, s->h, T, qkv_out);
    const size_t head_stride = (size_t)s->n_ctx * hd;
    uint16_t *kc = s->k_cache + (size_t)l * s->n_ctx * kv_dim,
             *vc = s->v_cache + (size_t)l * s->n_ctx * kv_dim;
    qk_rows_job qj = {m, L, s, kc, vc, (int64_t)head_stride};
    fm_pool_for(pool, T, 2, qk_rows_range, &qj);
    fm_attention_args a = {
        .n_heads = hp->n_heads,
        .n_kv_heads = hp->n_kv_heads,
        .head_dim = hd,
        .k_cache = kc,
        .v_cache = vc,
        .pos0 = s->pos,
        .T = T,
        .q = s->q,
        .out = s->att,
        .scratch = s->scores,
        .row_stride = hd,
        .head_stride = (int64_t)head_stride,
    };
    fm_attention(pool, &a);
    fm_matmul(pool, &L->wo, s->att, T, s->h, NULL); /* h reused as the projection output */
    for (int64_t i = 0; i < (int64_t)T * dim; i++) s->x[i] += s->h[i];
}

typedef struct {
    float *gate;
    const float *up;
} silu_job;

static void silu_range(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const silu_job *j = ctx;
    fm_silu_mul(j->gate + begin, j->up + begin, end - begin);
}

static void layer_mlp(const qwen3_model *m, const qwen3_layer *L, qwen3_state *s, fm_pool *pool, int T) {
    const qwen3_hparams *hp = &m->hp;
    const int dim = hp->dim;
    norm_rows(pool, s->h, s->x, dim, L->ffn_norm, dim, hp->rms_eps, T);
    const fm_matrix *gate_up[2] = {&L->w_gate, &L->w_up};
    float *const gate_up_out[2] = {s->gate, s->up};
    fm_matmul_multi(pool, gate_up, 2, s->h, T, gate_up_out);
    /* Over the pool: expf costs ~4 ns a value, 0.72 ms a layer for an 18-row verify block on one core
     * (26 ms of the block) with the others idle; element-wise, so the same bits however it is split. */
    silu_job sj = {s->gate, s->up};
    fm_pool_for(pool, (int64_t)T * hp->ffn, 8192, silu_range, &sj);
    fm_matmul(pool, &L->w_down, s->gate, T, s->h, NULL);
    for (int64_t i = 0; i < (int64_t)T * dim; i++) s->x[i] += s->h[i];
}

static int ensure_scratch(qwen3_state *s, fm_pool *pool, int rows, int vocab, char *err, size_t errlen) {
    const int threads = fm_pool_size(pool);
    if (s->scores_threads < threads) {
        free(s->scores);
        s->scores = alloc_f32(fm_attention_scratch_floats(threads));
        s->scores_threads = s->scores ? threads : 0;
        if (!s->scores) return fm_set_error(err, errlen, "out of memory for attention scores");
    }
    if (rows > s->logits_rows) {
        free(s->logits);
        s->logits = alloc_f32((size_t)rows * vocab);
        s->logits_rows = s->logits ? rows : 0;
        if (!s->logits) return fm_set_error(err, errlen, "out of memory for %d rows of logits", rows);
    }
    return 0;
}

int qwen3_forward(const qwen3_model *m, qwen3_state *s, fm_pool *pool, const int32_t *tokens, int T,
                  qwen3_out out, char *err, size_t errlen) {
    const qwen3_hparams *hp = &m->hp;
    const int dim = hp->dim;
    if (T < 1 || T > s->max_batch)
        return fm_set_error(err, errlen, "a forward of %d tokens exceeds the batch size %d", T, s->max_batch);
    if (s->pos + T > s->n_ctx)
        return fm_set_error(err, errlen, "context is full: %d positions held + %d new > --ctx %d", s->pos, T,
                            s->n_ctx);
    for (int t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= hp->vocab)
            return fm_set_error(err, errlen, "token id %d is out of range (vocabulary %d)", tokens[t],
                                hp->vocab);
    const int logit_rows = out == QWEN3_OUT_NONE ? 0 : out == QWEN3_OUT_LAST_LOGITS ? 1 : T;
    if (ensure_scratch(s, pool, logit_rows, hp->vocab, err, errlen)) return -1;

    for (int t = 0; t < T; t++) fm_matrix_row_f32(&m->tok_embd, tokens[t], s->x + (int64_t)t * dim);
    const int fw = s->n_capture * dim;
    for (int l = 0; l < hp->n_layers; l++) {
        layer_attention(m, &m->layers[l], s, pool, l, T);
        layer_mlp(m, &m->layers[l], s, pool, T);
        const int slot = s->capture_layer_slot[l];
        if (slot >= 0)
            for (int t = 0; t < T; t++)
                memcpy(s->features + (int64_t)t * fw + (int64_t)slot * dim, s->x + (int64_t)t * dim,
                       (size_t)dim * sizeof(float));
    }
    s->pos += T;
    if (out == QWEN3_OUT_NONE) return 0;
    const int first = out == QWEN3_OUT_LAST_LOGITS ? T - 1 : 0;
    norm_rows(pool, s->h, s->x + (int64_t)first * dim, dim, m->output_norm, dim, hp->rms_eps, T - first);
    fm_matmul(pool, &m->output, s->h, logit_rows, s->logits, NULL);
    for (int r = 0; r < logit_rows; r++)
        s->argmax[r] = (int32_t)fm_argmax(s->logits + (int64_t)r * hp->vocab, hp->vocab);
    return 0;
}
