/* drafter_forward.c: the drafter's two passes as recipes of named steps (NOTES.md, "Drafter math").
 *   extend_context: feature rows -> fc -> RMSNorm(hidden_norm) -> per layer cross k (k_norm + RoPE) / v ->
 * f16. draft: anchor slot at pos (token row -> anchor_proj -> anchor_norm -> the same k/v path), then the
 * jump 0 -> 1 over `block` slots at positions pos+1.., each starting from slot_input; per layer gated
 *     self-attention, cross-attention over context 0..pos, MLP; final AdaLN -> head -> target lm_head ->
 * argmax. D = dim, H = target_dim, K = block, R = scratch rows. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "cpu/attention.h"
#include "cpu/ops.h"
#include "drafter/drafter_internal.h"

/* Attention scratch: fm_attention's for the context, [threads][block] scores for the slots' self-attention;
 * grown on demand for the pool the caller passes. */
static int ensure_scores(fm_drafter *d, fm_pool *pool, char *err, size_t errlen) {
    int nt = pool ? fm_pool_size(pool) : 1;
    if (nt <= d->score_threads) return 0;
    const size_t ctx = fm_attention_scratch_floats(nt), self = (size_t)nt * (size_t)d->hp.block;
    float *s = realloc(d->scores, (ctx > self ? ctx : self) * sizeof(float));
    if (!s) return fm_set_error(err, errlen, "drafter: out of memory for attention scores");
    d->scores = s;
    d->score_threads = nt;
    return 0;
}

/* ctx[T][D] (normed context rows at positions pos0..) -> layer l's cross K/V cache rows pos0... */
static void write_cross_kv(fm_drafter *d, fm_pool *pool, int l, const float *ctx, int T, int pos0) {
    const fm_drafter_hparams *hp = &d->hp;
    fmd_layer *L = &d->layers[l];
    int D = hp->dim;
    const fm_matrix *kv[2] = {&L->cross.k, &L->cross.v};
    float *const kv_out[2] = {d->k, d->v}; /* [T][D] each */
    fm_matmul_multi(pool, kv, 2, ctx, T, kv_out);
    fmd_head_norm_rope(pool, d->k, L->cross.k_norm, T, hp->n_heads, hp->head_dim, hp->qk_eps, d->rope_cos,
                       d->rope_sin);
    for (int t = 0; t < T; t++)
        fm_attention_store_kv(L->k_cache, L->v_cache, (int64_t)d->max_ctx * hp->head_dim, pos0 + t,
                              d->k + (size_t)t * D, d->v + (size_t)t * D, hp->n_heads, hp->head_dim);
}

int fm_drafter_extend_context(fm_drafter *d, fm_pool *pool, const float *features, int n, int start,
                              char *err, size_t errlen) {
    const fm_drafter_hparams *hp = &d->hp;
    if (n < 0 || start < 0 || start > d->length || start + n > d->max_ctx)
        return fm_set_error(
            err, errlen,
            "drafter: context rows [%d, %d) do not fit: %d rows held, room for %d (no gaps allowed)", start,
            start + n, d->length, d->max_ctx);
    int half = hp->head_dim / 2;
    for (int c = 0; c < n; c += d->scratch_rows) {
        int T = n - c < d->scratch_rows ? n - c : d->scratch_rows, p0 = start + c;
        const float *f = features + (size_t)c * hp->feat_width;
        fm_matmul(pool, &d->fc, f, T, d->x, NULL);                             /* [T][D], no bias */
        fmd_rmsnorm_rows(d->x, d->hidden_norm, T, hp->dim, hp->rms_eps, d->h); /* [T][D] */
        fmd_rope_rows(d->inv_freq, half, p0, T, d->rope_cos, d->rope_sin);
        for (int l = 0; l < hp->n_layers; l++) write_cross_kv(d, pool, l, d->h, T, p0);
    }
    d->length = start + n;
    return 0;
}

/* x[K][D] += gate * SelfAttn(LN(x)(1+scale)+shift) over the K slots, no mask. */
static void self_attention(fm_drafter *d, fm_pool *pool, const fmd_layer *L, const fmd_mod *m) {
    const fm_drafter_hparams *hp = &d->hp;
    int K = hp->block;
    fmd_ln_mod_rows(pool, d->x, m, K, hp->dim, hp->ln_eps, d->h);
    const fm_matrix *qkv[3] = {&L->self.q, &L->self.k, &L->self.v};
    float *const qkv_out[3] = {d->q, d->k, d->v};
    fm_matmul_multi(pool, qkv, 3, d->h, K, qkv_out);
    fmd_head_norm_rope(pool, d->q, L->self.q_norm, K, hp->n_heads, hp->head_dim, hp->qk_eps, d->rope_cos,
                       d->rope_sin);
    fmd_head_norm_rope(pool, d->k, L->self.k_norm, K, hp->n_heads, hp->head_dim, hp->qk_eps, d->rope_cos,
                       d->rope_sin);
    fmd_attention(pool, d->q, K, d->k, d->v, NULL, NULL, 0, K, hp->n_heads, hp->head_dim, d->att, d->scores);
    fm_matmul(pool, &L->self.o, d->att, K, d->y, NULL);
    fmd_gate_add(d->x, d->y, m->gate, K, hp->dim);
}

/* x[K][D] += gate * CrossAttn(...) over the cached context rows 0..ctx_len-1 (f16 K/V). */
static void cross_attention(fm_drafter *d, fm_pool *pool, const fmd_layer *L, const fmd_mod *m, int ctx_len) {
    const fm_drafter_hparams *hp = &d->hp;
    int K = hp->block;
    fmd_ln_mod_rows(pool, d->x, m, K, hp->dim, hp->ln_eps, d->h);
    fm_matmul(pool, &L->cross.q, d->h, K, d->q, NULL);
    fmd_head_norm_rope(pool, d->q, L->cross.q_norm, K, hp->n_heads, hp->head_dim, hp->qk_eps, d->rope_cos,
                       d->rope_sin);
    fmd_attention(pool, d->q, K, NULL, NULL, L->k_cache, L->v_cache, d->max_ctx, ctx_len, hp->n_heads,
                  hp->head_dim, d->att, d->scores);
    fm_matmul(pool, &L->cross.o, d->att, K, d->y, NULL);
    fmd_gate_add(d->x, d->y, m->gate, K, hp->dim);
}

/* x[K][D] += gate * fc2(GELU(fc1(...))). */
static void mlp(fm_drafter *d, fm_pool *pool, const fmd_layer *L, const fmd_mod *m) {
    const fm_drafter_hparams *hp = &d->hp;
    int K = hp->block;
    fmd_ln_mod_rows(pool, d->x, m, K, hp->dim, hp->ln_eps, d->h);
    fm_matmul(pool, &L->fc1, d->h, K, d->u, L->fc1_b); /* [K][F] */
    fmd_gelu(pool, d->u, (int64_t)K * hp->ffn);
    fm_matmul(pool, &L->fc2, d->u, K, d->y, L->fc2_b); /* [K][D] */
    fmd_gate_add(d->x, d->y, m->gate, K, hp->dim);
}

int fm_drafter_draft(fm_drafter *d, fm_pool *pool, int32_t anchor, int pos, int n_out, int32_t *out,
                     char *err, size_t errlen) {
    const fm_drafter_hparams *hp = &d->hp;
    const qwen3_model *t = d->target;
    int K = hp->block, D = hp->dim, half = hp->head_dim / 2;
    if (anchor < 0 || anchor >= t->hp.vocab)
        return fm_set_error(err, errlen, "drafter: anchor token %d outside the vocabulary of %d", (int)anchor,
                            t->hp.vocab);
    if (pos < 0 || pos > d->length || pos >= d->max_ctx)
        return fm_set_error(err, errlen,
                            "drafter: anchor position %d, expected 0..%d (context rows held) and < %d", pos,
                            d->length, d->max_ctx);
    if (n_out < 1 || n_out > K)
        return fm_set_error(err, errlen, "drafter: %d draft tokens asked for, expected 1..%d", n_out, K);
    if (ensure_scores(d, pool, err, errlen)) return -1;

    /* 1. The anchor's context slot at pos: E[anchor] -> anchor_proj -> anchor_norm -> cross k/v. */
    fm_matrix_row_f32(&t->tok_embd, anchor, d->tmp_feat);                     /* [1][H] */
    fm_matmul(pool, &d->anchor_proj, d->tmp_feat, 1, d->x, d->anchor_proj_b); /* [1][D] */
    fmd_rmsnorm_rows(d->x, d->anchor_norm, 1, D, hp->rms_eps, d->h);
    fmd_rope_rows(d->inv_freq, half, pos, 1, d->rope_cos, d->rope_sin);
    for (int l = 0; l < hp->n_layers; l++) write_cross_kv(d, pool, l, d->h, 1, pos);

    /* 2. Every slot starts from the same input (zero noise); slots sit at positions pos+1 .. pos+K. */
    for (int k = 0; k < K; k++) memcpy(d->x + (size_t)k * D, d->slot_input, sizeof(float) * D); /* [K][D] */
    fmd_rope_rows(d->inv_freq, half, pos + 1, K, d->rope_cos, d->rope_sin);

    /* 3. The DiT layers. */
    for (int l = 0; l < hp->n_layers; l++) {
        const fmd_layer *L = &d->layers[l];
        self_attention(d, pool, L, &d->layer_mods[l * 3 + 0]);
        cross_attention(d, pool, L, &d->layer_mods[l * 3 + 1], pos + 1);
        mlp(d, pool, L, &d->layer_mods[l * 3 + 2]);
    }

    /* 4. Output of the first n_out slots: final AdaLN -> head -> the target's lm_head -> argmax per slot. */
    fmd_ln_mod_rows(pool, d->x, &d->final_mod, n_out, D, hp->ln_eps, d->h);
    fm_matmul(pool, &d->head, d->h, n_out, d->head_out, d->head_b);   /* [n_out][H] */
    fm_matmul(pool, &t->output, d->head_out, n_out, d->logits, NULL); /* [n_out][vocab] */
    for (int k = 0; k < n_out; k++)
        out[k] = (int32_t)fm_argmax(d->logits + (size_t)k * t->hp.vocab, t->hp.vocab);
    return 0;
}
