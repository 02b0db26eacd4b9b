/* qwen3_load.c: binds a Qwen3 dense GGUF to a qwen3_model. Every hyper-parameter comes from the qwen3.*
 * metadata, every tensor is checked for presence, shape and type before use, and weights stay in the file
 * mapping in their GGUF type (norm vectors are copied to f32 since they are tiny and read every row). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/qwen3.h"

static int get_u32_key(const gguf_file *f, const char *key, int *out, int required, char *err,
                       size_t errlen) {
    if (gguf_find_key(f, key) < 0 && !required) return 0;
    uint32_t v;
    if (gguf_get_u32(f, key, &v, err, errlen)) return -1;
    if (v == 0 || v > (1u << 30))
        return fm_set_error(err, errlen, "%s: %s = %u is out of range", gguf_path(f), key, v);
    *out = (int)v;
    return 0;
}

/* Finds a 2-D weight [rows][cols] (GGUF ne = {cols, rows}) and checks its shape and type. */
static int bind_matrix(const gguf_file *f, const char *name, int64_t rows, int64_t cols, fm_matrix *m,
                       char *err, size_t errlen) {
    const gguf_tensor *t = gguf_find_tensor(f, name);
    if (!t) return fm_set_error(err, errlen, "%s: tensor %s is missing", gguf_path(f), name);
    if (t->n_dims != 2 || t->ne[0] != cols || t->ne[1] != rows)
        return fm_set_error(err, errlen,
                            "%s: tensor %s: expected shape [%lld, %lld], found [%lld, %lld] (%u dims)",
                            gguf_path(f), name, (long long)cols, (long long)rows, (long long)t->ne[0],
                            t->n_dims > 1 ? (long long)t->ne[1] : 1LL, t->n_dims);
    if (!t->supported)
        return fm_set_error(err, errlen,
                            "%s: tensor %s: weight type %u is not supported (f32, f16, bf16, q8_0, q4_k, "
                            "q5_k, q6_k, q4_0, q5_0)",
                            gguf_path(f), name, t->ggml_type);
    m->dtype = t->dtype;
    m->rows = rows;
    m->cols = cols;
    m->data = t->data;
    return 0;
}

/* Copies a 1-D norm weight of length n to f32. */
static int bind_vector(const gguf_file *f, const char *name, int64_t n, float **out, char *err,
                       size_t errlen) {
    const gguf_tensor *t = gguf_find_tensor(f, name);
    if (!t) return fm_set_error(err, errlen, "%s: tensor %s is missing", gguf_path(f), name);
    if (t->n_dims != 1 || t->ne[0] != n)
        return fm_set_error(err, errlen, "%s: tensor %s: expected shape [%lld], found [%lld] (%u dims)",
                            gguf_path(f), name, (long long)n, (long long)t->ne[0], t->n_dims);
    if (!t->supported || fm_dtype_block_elems(t->dtype) != 1)
        return fm_set_error(err, errlen,
                            "%s: tensor %s: type %u is not supported for a norm (f32, f16, bf16)",
                            gguf_path(f), name, t->ggml_type);
    float *v = malloc((size_t)n * sizeof *v);
    if (!v) return fm_set_error(err, errlen, "out of memory");
    fm_matrix m = {t->dtype, 1, n, t->data, NULL, FM_LAYOUT_ROWS};
    fm_matrix_row_f32(&m, 0, v);
    *out = v;
    return 0;
}

static int read_hparams(const gguf_file *f, qwen3_hparams *hp, char *err, size_t errlen) {
    gguf_str arch;
    if (gguf_get_str(f, "general.architecture", &arch, err, errlen)) return -1;
    if (!gguf_str_eq(arch, "qwen3"))
        return fm_set_error(err, errlen, "%s: architecture '%.*s' is not supported (only qwen3 dense models)",
                            gguf_path(f), (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);
    memset(hp, 0, sizeof *hp);
    if (get_u32_key(f, "qwen3.block_count", &hp->n_layers, 1, err, errlen) ||
        get_u32_key(f, "qwen3.embedding_length", &hp->dim, 1, err, errlen) ||
        get_u32_key(f, "qwen3.attention.head_count", &hp->n_heads, 1, err, errlen) ||
        get_u32_key(f, "qwen3.feed_forward_length", &hp->ffn, 1, err, errlen))
        return -1;
    hp->n_kv_heads = hp->n_heads;
    hp->head_dim = hp->dim / hp->n_heads;
    hp->ctx_train = 40960;
    if (get_u32_key(f, "qwen3.attention.head_count_kv", &hp->n_kv_heads, 0, err, errlen) ||
        get_u32_key(f, "qwen3.attention.key_length", &hp->head_dim, 0, err, errlen) ||
        get_u32_key(f, "qwen3.context_length", &hp->ctx_train, 0, err, errlen))
        return -1;
    int v_len = hp->head_dim;
    if (get_u32_key(f, "qwen3.attention.value_length", &v_len, 0, err, errlen)) return -1;
    if (v_len != hp->head_dim)
        return fm_set_error(err, errlen, "%s: qwen3.attention.value_length %d differs from key_length %d",
                            gguf_path(f), v_len, hp->head_dim);
    if (hp->n_heads % hp->n_kv_heads)
        return fm_set_error(err, errlen, "%s: head_count %d is not a multiple of head_count_kv %d",
                            gguf_path(f), hp->n_heads, hp->n_kv_heads);
    if (hp->head_dim % 2)
        return fm_set_error(err, errlen, "%s: head dimension %d is odd (RoPE needs pairs)", gguf_path(f),
                            hp->head_dim);
    hp->rope_theta = 1e6f;
    hp->rms_eps = 1e-6f;
    if (gguf_find_key(f, "qwen3.rope.freq_base") >= 0 &&
        gguf_get_f32(f, "qwen3.rope.freq_base", &hp->rope_theta, err, errlen))
        return -1;
    if (gguf_find_key(f, "qwen3.attention.layer_norm_rms_epsilon") >= 0 &&
        gguf_get_f32(f, "qwen3.attention.layer_norm_rms_epsilon", &hp->rms_eps, err, errlen))
        return -1;
    if (!(hp->rope_theta > 0) || !(hp->rms_eps > 0))
        return fm_set_error(err, errlen, "%s: rope.freq_base and layer_norm_rms_epsilon must be positive",
                            gguf_path(f));
    const gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
    if (!emb) return fm_set_error(err, errlen, "%s: tensor token_embd.weight is missing", gguf_path(f));
    if (emb->n_dims != 2 || emb->ne[1] < 1 || emb->ne[1] > (1 << 24))
        return fm_set_error(err, errlen, "%s: tensor token_embd.weight: expected [%d, vocab]", gguf_path(f),
                            hp->dim);
    hp->vocab = (int)emb->ne[1];
    hp->tied = gguf_find_tensor(f, "output.weight") == NULL;
    return 0;
}

int qwen3_model_load(const char *path, qwen3_model **out, char *err, size_t errlen) {
    *out = NULL;
    gguf_file *f = gguf_open(path, err, errlen);
    if (!f) return -1;
    qwen3_model *m = calloc(1, sizeof *m);
    if (!m) {
        gguf_close(f);
        return fm_set_error(err, errlen, "out of memory");
    }
    m->gguf = f;
    qwen3_hparams *hp = &m->hp;
    if (read_hparams(f, hp, err, errlen)) goto fail;
    const int64_t q_dim = (int64_t)hp->n_heads * hp->head_dim,
                  kv_dim = (int64_t)hp->n_kv_heads * hp->head_dim;
    if (bind_matrix(f, "token_embd.weight", hp->vocab, hp->dim, &m->tok_embd, err, errlen)) goto fail;
    if (hp->tied)
        m->output = m->tok_embd;
    else if (bind_matrix(f, "output.weight", hp->vocab, hp->dim, &m->output, err, errlen))
        goto fail;
    if (bind_vector(f, "output_norm.weight", hp->dim, &m->output_norm, err, errlen)) goto fail;
    m->layers = calloc((size_t)hp->n_layers, sizeof *m->layers);
    if (!m->layers) {
        fm_set_error(err, errlen, "out of memory");
        goto fail;
    }
    for (int l = 0; l < hp->n_layers; l++) {
        qwen3_layer *L = &m->layers[l];
        char name[96];
#define NAME(suffix) (snprintf(name, sizeof name, "blk.%d." suffix, l), name)
        if (bind_vector(f, NAME("attn_norm.weight"), hp->dim, &L->attn_norm, err, errlen) ||
            bind_matrix(f, NAME("attn_q.weight"), q_dim, hp->dim, &L->wq, err, errlen) ||
            bind_matrix(f, NAME("attn_k.weight"), kv_dim, hp->dim, &L->wk, err, errlen) ||
            bind_matrix(f, NAME("attn_v.weight"), kv_dim, hp->dim, &L->wv, err, errlen) ||
            bind_matrix(f, NAME("attn_output.weight"), hp->dim, q_dim, &L->wo, err, errlen) ||
            bind_vector(f, NAME("attn_q_norm.weight"), hp->head_dim, &L->q_norm, err, errlen) ||
            bind_vector(f, NAME("attn_k_norm.weight"), hp->head_dim, &L->k_norm, err, errlen) ||
            bind_vector(f, NAME("ffn_norm.weight"), hp->dim, &L->ffn_norm, err, errlen) ||
            bind_matrix(f, NAME("ffn_gate.weight"), hp->ffn, hp->dim, &L->w_gate, err, errlen) ||
            bind_matrix(f, NAME("ffn_up.weight"), hp->ffn, hp->dim, &L->w_up, err, errlen) ||
            bind_matrix(f, NAME("ffn_down.weight"), hp->dim, hp->ffn, &L->w_down, err, errlen))
            goto fail;
#undef NAME
    }
    *out = m;
    return 0;
fail:
    qwen3_model_free(m);
    return -1;
}

void qwen3_model_free(qwen3_model *m) {
    if (!m) return;
    if (m->layers) {
        for (int l = 0; l < m->hp.n_layers; l++) {
            free(m->layers[l].attn_norm);
            free(m->layers[l].q_norm);
            free(m->layers[l].k_norm);
            free(m->layers[l].ffn_norm);
        }
        free(m->layers);
    }
    free(m->output_norm);
    gguf_close(m->gguf);
    free(m);
}

static uint64_t matrix_bytes(const fm_matrix *w) {
    return (uint64_t)w->rows * fm_dtype_row_bytes(w->dtype, w->cols);
}

uint64_t qwen3_model_weight_bytes(const qwen3_model *m) {
    uint64_t b = matrix_bytes(&m->output);
    for (int l = 0; l < m->hp.n_layers; l++) {
        const qwen3_layer *L = &m->layers[l];
        b += matrix_bytes(&L->wq) + matrix_bytes(&L->wk) + matrix_bytes(&L->wv) + matrix_bytes(&L->wo) +
             matrix_bytes(&L->w_gate) + matrix_bytes(&L->w_up) + matrix_bytes(&L->w_down);
    }
    return b;
}

/* bytes[t]: the bytes of the model's matrices of type t (the token table, the lm_head when untied, every
 * layer's). */
static void bytes_by_type(const qwen3_model *m, uint64_t bytes[FM_DTYPE_COUNT]) {
    memset(bytes, 0, FM_DTYPE_COUNT * sizeof bytes[0]);
    bytes[m->tok_embd.dtype] += matrix_bytes(&m->tok_embd);
    if (!m->hp.tied) bytes[m->output.dtype] += matrix_bytes(&m->output);
    for (int l = 0; l < m->hp.n_layers; l++) {
        const qwen3_layer *L = &m->layers[l];
        const fm_matrix *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) bytes[ws[i]->dtype] += matrix_bytes(ws[i]);
    }
}

void qwen3_model_weight_types(const qwen3_model *m, char *buf, size_t len) {
    uint64_t bytes[FM_DTYPE_COUNT];
    bytes_by_type(m, bytes);
    size_t at = 0;
    if (len) buf[0] = 0;
    for (;;) {
        int best = -1;
        for (int t = 0; t < FM_DTYPE_COUNT; t++)
            if (bytes[t] && (best < 0 || bytes[t] > bytes[best])) best = t;
        if (best < 0) break;
        bytes[best] = 0;
        int n =
            snprintf(buf + at, len > at ? len - at : 0, "%s%s", at ? "+" : "", fm_dtype_name((fm_dtype)best));
        if (n < 0 || (size_t)n >= (len > at ? len - at : 0)) break;
        at += (size_t)n;
    }
}

int qwen3_model_all_matrices(const qwen3_model *m, fm_dtype t) {
    uint64_t bytes[FM_DTYPE_COUNT];
    bytes_by_type(m, bytes);
    for (int i = 0; i < FM_DTYPE_COUNT; i++)
        if (i != (int)t && bytes[i]) return 0;
    return 1;
}

/* The matrices of layer l (l < n_layers), or the token table and the untied lm_head (l == n_layers), into
 * list; their count. */
static int layer_matrices(qwen3_model *m, int l, fm_matrix *list[7]) {
    if (l == (int)m->hp.n_layers) {
        list[0] = &m->tok_embd;
        list[1] = &m->output;
        return m->output.data == m->tok_embd.data ? 1 : 2;
    }
    qwen3_layer *L = &m->layers[l];
    fm_matrix *per[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    memcpy(list, per, sizeof per);
    return 7;
}

/* The resident copy's Q8_0 matrices into the VNNI kernel's layout (qwen3.h). The tied lm_head is the token
 * table's struct copied: it shares the bytes, so it takes the table's layout instead of a second pass. */
static void repack_for_cpu(qwen3_model *m, fm_pool *pool) {
    fm_matrix *list[7];
    int want = 0;
    for (int l = 0; l <= (int)m->hp.n_layers && !want; l++)
        for (int i = 0, n = layer_matrices(m, l, list); i < n; i++) want |= fm_matrix_wants_vnni4(list[i]);
    if (!want || gguf_set_writable(m->gguf, 1) != 0) return;
    for (int l = 0; l <= (int)m->hp.n_layers; l++)
        for (int i = 0, n = layer_matrices(m, l, list); i < n; i++)
            if (fm_matrix_wants_vnni4(list[i]) &&
                fm_matrix_repack_vnni4(pool, list[i], (void *)list[i]->data) == 0)
                m->n_repacked++;
    if (m->output.data == m->tok_embd.data) m->output.layout = m->tok_embd.layout;
    gguf_set_writable(m->gguf, 0);
}

int qwen3_model_make_resident(qwen3_model *m, fm_pool *pool) {
    if (!gguf_make_resident(m->gguf, pool)) return 0;
    repack_for_cpu(m, pool);
    return 1;
}

int qwen3_model_repacked(const qwen3_model *m) {
    return m->n_repacked;
}
