/* cuda_drafter.cu: the FlashMap drafter on the GPU (cuda_backend.cu's other half): its matrices uploaded as
 * BF16 or as the host's Q8_0 copy, its context cache extended from the target's features, and a draft as one
 * fixed kernel sequence (graph-capturable: the anchor and its position are read from device memory), with
 * penalised drafts drawn slot by slot as the CPU backend draws them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "cuda/cuda_backend_state.h"

static int upload_dmat(fm_cuda_backend *b, dmat_t *dst, const fm_matrix *const *parts, int n,
                       const char *what, char *err, size_t errlen) {
    dst->is_q8 = parts[0]->dtype == FM_DTYPE_Q8_0;
    for (int i = 1; i < n; i++)
        if ((parts[i]->dtype == FM_DTYPE_Q8_0) != dst->is_q8) {
            snprintf(err, errlen, "cuda: drafter %s: parts of different types", what);
            return -1;
        }
    if (!dst->is_q8) return upload_bf16(b, &dst->h, parts, n, what, err, errlen);
    if (upload_q8(b, &dst->q, parts, n, 0, what, err, errlen)) return -1;
    /* FMC_Q8_DRAFT_PLAN=per_sm,below: the split planned with other limits (experiments). More blocks a group
     * did not pay even with the merge in a cluster (H200, one call: a draft 0.933 ms at the default 2,4,
     * 0.937 at 4,4 (kc 4 for fc2), 1.041 at 8,4 (kc 8 for fc2, 2 for fc1)). */
    const char *e = getenv("FMC_Q8_DRAFT_PLAN");
    int per_sm = 2, below = 4;
    if (e && sscanf(e, "%d,%d", &per_sm, &below) == 2 && per_sm > 0 && below > 0)
        fmc_q8_plan(&dst->q, per_sm, below);
    return 0;
}

static int upload_opt(fm_cuda_backend *b, float **dst, const float *src, size_t n, char *err, size_t errlen) {
    *dst = NULL;
    return src ? upload_f32(b, dst, src, n, err, errlen) : 0;
}

static_assert(FM_DRAFTER_MAX_BLOCK <= FMC_DR_MAX_SLOTS, "fmc_dr_self_attention takes every block size");

int create_drafter(fm_cuda_backend *b, const fm_drafter *d, char *err, size_t errlen) {
    const fm_drafter_hparams *hp = &d->hp;
    const int D = hp->dim, F = hp->ffn, H = hp->target_dim, K = hp->block, hd = hp->head_dim;
    if (H != b->dim || hp->feat_width != b->fw)
        return fail(err, errlen, "cuda: drafter widths do not match the target's captured features");
    if (H % 32) return fail(err, errlen, "cuda: drafter target_dim must be a multiple of 32");

    if (!fmc_attn_head_dim_ok(hd))
        return fail(err, errlen, "cuda: drafter head_dim must be 16, 32, 64, 128 or 256");
    if (hp->n_layers > FMC_DR_MAX_LAYERS)
        return fail(err, errlen, "cuda: drafter has more than 16 layers; the CUDA backend runs up to 16");
    b->has_drafter = 1;
    b->dhp = *hp;
    b->dmax_ctx = d->max_ctx;
    const fm_matrix *p1[3];
    p1[0] = &d->fc;
    if (upload_dmat(b, &b->fc, p1, 1, "fc", err, errlen)) return -1;
    p1[0] = &d->anchor_proj;
    if (upload_dmat(b, &b->anchor_proj, p1, 1, "anchor_proj", err, errlen)) return -1;
    p1[0] = &d->head;
    if (upload_dmat(b, &b->head, p1, 1, "head", err, errlen)) return -1;
    if (upload_opt(b, &b->anchor_b, d->anchor_proj_b, D, err, errlen) ||
        upload_opt(b, &b->head_b, d->head_b, H, err, errlen) ||
        upload_f32(b, &b->hidden_norm, d->hidden_norm, D, err, errlen) ||
        upload_f32(b, &b->anchor_norm, d->anchor_norm, D, err, errlen) ||
        upload_f32(b, &b->mods, d->mods, (size_t)(hp->n_layers * 3 + 1) * 3 * D, err, errlen) ||
        upload_f32(b, &b->slot_input, d->slot_input, D, err, errlen) ||
        upload_f32(b, &b->inv_freq, d->inv_freq, hd / 2, err, errlen))
        return -1;
    b->DL = (ddlayer_t *)calloc(hp->n_layers, sizeof(ddlayer_t));
    if (!b->DL) return fail(err, errlen, "out of memory");
    for (int l = 0; l < hp->n_layers; l++) {
        const fmd_layer *S = &d->layers[l];
        ddlayer_t *o = &b->DL[l];
        const fm_matrix *sqkv[3] = {&S->self.q, &S->self.k, &S->self.v};
        const fm_matrix *so[1] = {&S->self.o}, *cq[1] = {&S->cross.q}, *co[1] = {&S->cross.o};
        const fm_matrix *f1[1] = {&S->fc1}, *f2[1] = {&S->fc2};
        if (upload_dmat(b, &o->sqkv, sqkv, 3, "self q/k/v", err, errlen) ||
            upload_dmat(b, &o->so, so, 1, "self o", err, errlen) ||
            upload_dmat(b, &o->cq, cq, 1, "cross q", err, errlen) ||
            upload_dmat(b, &o->co, co, 1, "cross o", err, errlen) ||
            upload_dmat(b, &o->fc1, f1, 1, "fc1", err, errlen) ||
            upload_dmat(b, &o->fc2, f2, 1, "fc2", err, errlen) ||
            upload_opt(b, &o->fc1_b, S->fc1_b, F, err, errlen) ||
            upload_opt(b, &o->fc2_b, S->fc2_b, D, err, errlen) ||
            upload_f32(b, &o->sq_norm, S->self.q_norm, hd, err, errlen) ||
            upload_f32(b, &o->sk_norm, S->self.k_norm, hd, err, errlen) ||
            upload_f32(b, &o->cq_norm, S->cross.q_norm, hd, err, errlen) ||
            upload_f32(b, &o->ck_norm, S->cross.k_norm, hd, err, errlen))
            return -1;
        DALLOC(o->kc, (size_t)b->dmax_ctx * D * 2);
        DALLOC(o->vc, (size_t)b->dmax_ctx * D * 2);
        b->dkv_layers.w[l] = o->ck_norm, b->dkv_layers.kc[l] = o->kc, b->dkv_layers.vc[l] = o->vc;
    }
    {
        std::vector<const fm_matrix *> kv;
        for (int l = 0; l < hp->n_layers; l++)
            kv.push_back(&d->layers[l].cross.k), kv.push_back(&d->layers[l].cross.v);
        if (upload_dmat(b, &b->ckv, kv.data(), (int)kv.size(), "cross k/v", err, errlen)) return -1;
    }
    const int R = std::max((int)DRAFT_ROWS, K);
    DALLOC(b->dkv, (size_t)R * hp->n_layers * 2 * D * 4);
    DALLOC(b->dx, (size_t)R * D * 4);
    DALLOC(b->dh, (size_t)R * D * 4);
    DALLOC(b->dqkv, (size_t)R * 3 * D * 4);
    DALLOC(b->datt, (size_t)R * D * 4);
    DALLOC(b->drope, (size_t)K * (hd / 2) * sizeof(float2));
    DALLOC(b->du, (size_t)K * F * 4);
    DALLOC(b->dtmp, (size_t)H * 4);
    DALLOC(b->dhead, (size_t)K * H * 4);
    DALLOC(b->dlogits, (size_t)K * b->vocab * 4);
    const int maxK = std::max(std::max(b->fw, std::max(D, F)), H), R8 = (R + 7) / 8 * 8;
    DALLOC(b->dxq, (size_t)R8 * maxK);
    DALLOC(b->dxd, (size_t)R8 * (maxK / 32) * 4);
    DALLOC(b->dsx, (size_t)R * D * 4);
    DALLOC(b->dsh, (size_t)R * D * 4);
    DALLOC(b->dsxq, (size_t)R8 * maxK);
    DALLOC(b->dsxd, (size_t)R8 * (maxK / 32) * 4);
    if (cudaStreamCreateWithFlags(&b->st2, cudaStreamNonBlocking) != cudaSuccess)
        return fail(err, errlen, "cuda: stream creation failed");
    for (cudaEvent_t *e : {&b->ev_main, &b->ev_ctx, &b->ev_fork, &b->ev_join})
        if (cudaEventCreateWithFlags(e, cudaEventDisableTiming) != cudaSuccess)
            return fail(err, errlen, "cuda: event creation failed");
    /* recorded once, so that a draft before any context rows waits on an event that has been recorded */
    if (cudaEventRecord(b->ev_ctx, b->st2) != cudaSuccess)
        return fail(err, errlen, "cuda: event record failed");
    DALLOC(b->dam, (size_t)K * 8);
    DALLOC(b->d_anchor, 4);
    DALLOC(b->d_dpos, 4);
    b->dsplits = (b->dmax_ctx + FMC_ATT_SPLIT - 1) / FMC_ATT_SPLIT;
    DALLOC(b->dpart, (size_t)K * hp->n_heads * b->dsplits * (hd + 2) * 4);
    b->pend_cap = b->max_eval + DRAFT_ROWS;
    DALLOC(b->pending, (size_t)b->pend_cap * b->fw * 4);
    DALLOC(b->spec_feat, (size_t)(K + 1) * b->fw * 4);
    DALLOC(b->spec_am, (size_t)(K + 1) * sizeof *b->spec_am);
    DALLOC(b->spec_emb, (size_t)(K + 1) * H * 4);
    const char *er = getenv("FMC_EARLY_ROWS"), *ea = getenv("FMC_EARLY_ANCHOR");
    b->early_rows = !(er && er[0] == '0');
    b->early_anchor = ea && ea[0] == '1'; /* off: no gain shown yet (bench/RESULTS.md) */
    return 0;
}

/* y = epilogue(W x + bias) on the product of the matrix's type (mode: FMC_BF16_STORE, _GELU, _GATE_ADD); a
 * Q8_0 matrix first quantises x into dxq / dxd as the CPU's Q8_0 drafter does, or, with x == NULL, takes
 * them as ln_mod left them. */
static void dmm_on(cudaStream_t s, int8_t *xq, float *xd, const dmat_t *w, const float *x, int ldx, int T,
                   float *y, int ldy, const float *bias, int mode, const float *gate, int pdl) {
    if (w->is_q8) {
        const fmc_q8_in in = {xq, xd, x, ldx, NULL, 0.f};
        fmc_q8_dmatmul(&w->q, &in, T, y, ldy, bias, mode, gate, pdl, s);
    } else
        fmc_bf16_matmul(&w->h, x, ldx, T, y, ldy, bias, mode, gate, pdl, s);
}

void dmm(fm_cuda_backend *b, const dmat_t *w, const float *x, int ldx, int T, float *y, int ldy,
         const float *bias, int mode, const float *gate, int pdl) {
    dmm_on(b->st, b->dxq, b->dxd, w, x, ldx, T, y, ldy, bias, mode, gate, pdl);
}
/* The same on the side stream, with its buffers. */
static void dmm_side(fm_cuda_backend *b, const dmat_t *w, const float *x, int ldx, int T, float *y, int ldy,
                     const float *bias, int pdl) {
    dmm_on(b->st2, b->dsxq, b->dsxd, w, x, ldx, T, y, ldy, bias, FMC_BF16_STORE, NULL, pdl);
}

void free_side(fm_cuda_backend *b) {
    if (b->st2) cudaStreamSynchronize(b->st2), cudaStreamDestroy(b->st2);
    for (cudaEvent_t e : {b->ev_main, b->ev_ctx, b->ev_fork, b->ev_join})
        if (e) cudaEventDestroy(e);
}

/* AdaLN(dx rows) with modulation m, as the input of product w; returns what dmm takes as x: dh, or NULL for
 * a Q8_0 matrix (its activations quantised in the same kernel, dh not written) whose row fits that kernel. */
static const float *ln_mod(fm_cuda_backend *b, const dmat_t *w, const float *m, int T, int pdl) {
    const int D = b->dhp.dim;
    if (!w->is_q8 || D > FMC_LN_MOD_MAX_N) {
        fmc_ln_mod_rows(b->dx, m, m + D, T, D, b->dhp.ln_eps, b->dh, pdl, b->st);
        return b->dh;
    }
    fmc_ln_mod_quant(b->dx, m, m + D, T, D, b->dhp.ln_eps, b->dxq, b->dxd, pdl, b->st);
    return NULL;
}

static const float *mod_at(const fm_cuda_backend *b, int idx) {
    return b->mods + (size_t)idx * 3 * b->dhp.dim;
}

/* The anchor slots of tokens am [A] (packed argmaxes) into rows A .. 2A-1 of dsh, on the side stream: the
 * draft's own chain up to its cross K/V product, which the context rows' product then takes with its rows. */
static void anchor_rows_side(fm_cuda_backend *b, const unsigned long long *am, int A) {
    const fm_drafter_hparams *hp = &b->dhp;
    const int D = hp->dim, H = hp->target_dim, pdl = b->use_pdl;
    fmc_embed_q8_argmax(&b->tok, am, A, b->spec_emb, b->st2);
    dmm_side(b, &b->anchor_proj, b->spec_emb, H, A, b->dsx + (size_t)A * D, D, b->anchor_b, pdl);
    fmc_rmsnorm_rows(b->dsx + (size_t)A * D, b->anchor_norm, A, D, hp->rms_eps, b->dsh + (size_t)A * D, pdl,
                     b->st2);
}

/* Context rows start .. start+n-1 from device feature rows src [n][fw], on the side stream after the main
 * stream's work so far; ev_ctx marks their end, which the main stream does not wait for (join: it does).
 * am: with them, the anchor slots of these n argmaxes (anchor_rows_side; n <= DRAFT_ROWS / 2), left in dkv
 * rows n .. 2n-1. */
static int extend_side(fm_cuda_backend *b, const float *src, int n, int start, bool join,
                       const unsigned long long *am, char *err, size_t errlen) {
    const fm_drafter_hparams *hp = &b->dhp;
    const int D = hp->dim;
    if (start < 0 || start > b->dlength || start + n > b->dmax_ctx) {
        snprintf(err, errlen, "drafter: context rows [%d, %d) do not fit: %d rows held, room for %d", start,
                 start + n, b->dlength, b->dmax_ctx);
        return -1;
    }
    cudaStream_t s = b->st2;
    CK(cudaEventRecord(b->ev_main, b->st));
    CK(cudaStreamWaitEvent(s, b->ev_main, 0));
    const int A = am && 2 * n <= DRAFT_ROWS ? n : 0; /* one chunk */
    b->anc_start = start, b->anc_rows = A;           /* dkv is written again; anc_tok: cu_eval */
    if (A) anchor_rows_side(b, am, A);
    for (int c = 0; c < n; c += DRAFT_ROWS) {
        const int T = std::min((int)DRAFT_ROWS, n - c), p0 = start + c, TA = T + A;
        /* after fc (a full wait: the anchor rows are done too), each kernel reads the one before it: PDL as
         * in a forward of up to 32 rows */
        const int pdl = b->use_pdl && TA <= GRAPH_MAX_T;
        dmm_side(b, &b->fc, src + (size_t)c * b->fw, b->fw, T, b->dsx, D, NULL, 0);
        fmc_rmsnorm_rows(b->dsx, b->hidden_norm, T, D, hp->rms_eps, b->dsh, pdl, s);
        const int KW = 2 * D * hp->n_layers;
        dmm_side(b, &b->ckv, b->dsh, D, TA, b->dkv, KW, NULL, pdl);
        fmc_dr_kv_rows(b->dkv, KW, T, hp->n_heads, hp->head_dim, hp->n_layers, 2 * (size_t)D, D,
                       &b->dkv_layers, hp->qk_eps, NULL, p0, b->inv_freq, pdl, s);
    }
    CK(cudaEventRecord(b->ev_ctx, s));
    if (join) CK(cudaStreamWaitEvent(b->st, b->ev_ctx, 0));
    CK(cudaGetLastError());
    b->dlength = start + n;
    return 0;
}

int drafter_extend(fm_cuda_backend *b, const float *src, int n, int start, char *err, size_t errlen) {
    return extend_side(b, src, n, start, true, NULL, err, errlen);
}

/* join 0: a draft's, whose graph waits for the rows where it first reads them (draft_forward). */
static int flush_rows(fm_cuda_backend *b, bool join, char *err, size_t errlen) {
    if (b->pend_rows && extend_side(b, b->pending, b->pend_rows, b->pend_start, join, NULL, err, errlen))
        return -1;
    b->pend_rows = 0;
    return 0;
}

int flush_pending(fm_cuda_backend *b, char *err, size_t errlen) {
    return flush_rows(b, true, err, errlen);
}

/* Why early: at commit time the rows' chain (fc, norm, the cross K/V product of every layer, the rows'
 * norm and RoPE) ran on the side stream ahead of the draft's anchor slot, behind the host's round trip
 * and the eager launches, and the draft's first cross-attention waited for both. Launched with the verify
 * block instead, it runs while the host reads the block's ids back (H100, one round: the drafter's part of a
 * round at simulated 6.5, 0.886 -> 0.863 ms; bench/RESULTS.md, forty-fifth session). The rows the loop does
 * not keep are written past the context it keeps: a draft reads positions up to its anchor only, and every
 * position below an anchor is committed before that draft. The draft's anchor slot (the embedding,
 * anchor_proj, a norm and the cross K/V product of every layer: ~55 MB of weights at the 4B's shapes) ran
 * after these rows on the same stream; when the loop decodes greedily its anchor is one of the block's
 * argmaxes, so their slots go through the rows' products here, for a few more rows of the same reads, and
 * the draft only norms, rotates and stores the one it takes. */
int drafter_verify_rows(fm_cuda_backend *b, int n, char *err, size_t errlen) {
    if (!b->has_drafter || !b->early_rows || n < 2 || n > b->dhp.block + 1 || b->pend_rows ||
        b->pos > b->dlength || b->pos + n > b->dmax_ctx)
        return 0;
    /* the side stream's last reads of spec_feat / spec_am are done (a draft joined them, or this waits) */
    CK(cudaStreamWaitEvent(b->st, b->ev_ctx, 0));
    CK(cudaMemcpyAsync(b->spec_feat, b->feat, (size_t)n * b->fw * 4, cudaMemcpyDeviceToDevice, b->st));
    /* The anchor slots too where the block's argmaxes are its tokens (greedy, no penalties: cu_eval keeps
     * them as it reads them back) and the rows and the anchors take one narrow product. */
    const bool anchors = b->early_anchor && fm_sampling_greedy(&b->sampling) &&
                         !fm_sampling_penalized(&b->sampling) && 2 * n <= GRAPH_MAX_T;
    if (anchors)
        CK(cudaMemcpyAsync(b->spec_am, b->d_am, (size_t)n * sizeof *b->spec_am, cudaMemcpyDeviceToDevice,
                           b->st));
    if (extend_side(b, b->spec_feat, n, b->pos, false, anchors ? b->spec_am : NULL, err, errlen)) return -1;
    b->dlength = b->pos; /* held once committed */
    b->spec_start = b->pos, b->spec_rows = n;
    return 0;
}

void drafter_verify_tokens(fm_cuda_backend *b, const int32_t *ids, int n) {
    if (b->anc_rows == n)
        memcpy(b->anc_tok, ids, sizeof(int32_t) * (size_t)n);
    else
        b->anc_rows = 0;
}

int cu_commit_features(void *ctx, int n, int start, char *err, size_t errlen) {
    fm_cuda_backend *b = (fm_cuda_backend *)ctx;
    if (!b->has_drafter || n <= 0) return 0;
    if (n > b->last_rows)
        return fail(err, errlen, "cuda: commit of more feature rows than the last eval made");
    /* the rows of the verify block just run, extended early: keep the first n */
    const int kept = b->spec_rows && start == b->spec_start && start == b->dlength && n <= b->spec_rows;
    b->spec_rows = 0;
    if (kept) {
        b->dlength = start + n;
        return 0;
    }
    if (b->pend_rows && (b->pend_start + b->pend_rows != start || b->pend_rows + n > b->pend_cap) &&
        flush_pending(b, err, errlen))
        return -1;
    if (b->pend_rows == 0) b->pend_start = start;
    CK(cudaMemcpyAsync(b->pending + (size_t)b->pend_rows * b->fw, b->feat, (size_t)n * b->fw * 4,
                       cudaMemcpyDeviceToDevice, b->st));
    b->pend_rows += n;
    return 0;
}

/* The draft from the anchor (*d_anchor) at position *d_dpos: a fixed kernel sequence (graph-capturable); the
 * final AdaLN, head, lm_head and argmax for the first b->d_rows slots only. A product whose input was
 * written by the kernel just before it may use PDL. */
static void draft_forward(fm_cuda_backend *b, int unused_T, int unused_mode) {
    (void)unused_T, (void)unused_mode;
    const int rows = b->d_rows;
    const fm_drafter_hparams *hp = &b->dhp;
    const int K = hp->block, D = hp->dim, H = hp->target_dim, nh = hp->n_heads, hd = hp->head_dim;
    const int pdl = b->use_pdl;
    cudaStream_t s = b->st;
    cudaMemsetAsync(b->dam, 0, (size_t)rows * 8, s);
    /* 1. The anchor's context slot at pos, on a branch of the side stream after the context rows of this
     * draft (ev_ctx, recorded before the graph's launch: an external event in the graph), beside the main
     * stream's work up to the first cross-attention, which reads the context. Both ran before the layers:
     * the draft alone 0.830 -> 0.812 ms on an H100 (bench/RESULTS.md, forty-third session). */
    cudaStream_t s2 = b->st2;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaStreamIsCapturing(s, &cs);
    cudaEventRecord(b->ev_fork, s);
    cudaStreamWaitEvent(s2, b->ev_fork, 0);
    cudaStreamWaitEvent(s2, b->ev_ctx, cs == cudaStreamCaptureStatusActive ? cudaEventWaitExternal : 0);
    const int KW = 2 * D * hp->n_layers;
    if (!b->d_anc) {
        fmc_embed_q8(&b->tok, b->d_anchor, 1, b->dtmp, s2);
        dmm_side(b, &b->anchor_proj, b->dtmp, H, 1, b->dsx, D, b->anchor_b, pdl);
        fmc_rmsnorm_rows(b->dsx, b->anchor_norm, 1, D, hp->rms_eps, b->dsh, pdl, s2);
        dmm_side(b, &b->ckv, b->dsh, D, 1, b->dkv, KW, NULL, pdl);
    } /* else cu_draft put a verify row's product into dkv row 0 */
    fmc_dr_kv_rows(b->dkv, KW, 1, nh, hd, hp->n_layers, 2 * (size_t)D, D, &b->dkv_layers, hp->qk_eps,
                   b->d_dpos, 0, b->inv_freq, b->d_anc ? 0 : pdl, s2);
    cudaEventRecord(b->ev_join, s2);
    /* 2. Slots at pos+1 .. pos+K from slot_input, and their rotations (the main stream's first kernel: no
     * kernel before it to overlap). 3. The layers. */
    fmc_dr_slots(b->slot_input, K, D, b->dx, b->d_dpos, 1, b->inv_freq, hd / 2, b->drope, 0, s);
    for (int l = 0; l < hp->n_layers; l++) {
        const ddlayer_t *L = &b->DL[l];
        const float *m = mod_at(b, l * 3 + 0);
        const float *in = ln_mod(b, &L->sqkv, m, K, pdl);
        dmm(b, &L->sqkv, in, D, K, b->dqkv, 3 * D, NULL, FMC_BF16_STORE, NULL, pdl);
        /* the queries' and keys' norms and RoPE inside the attention; a Q8_0 product's input leaves it
         * quantised (the bits its quantiser would give) */
        const bool so_q = L->so.is_q8 && hd % 32 == 0;
        fmc_dr_self_attention(b->dqkv, 3 * D, K, nh, hd, L->sq_norm, L->sk_norm, hp->qk_eps, b->drope,
                              b->datt, so_q ? b->dxq : NULL, b->dxd, pdl, s);
        dmm(b, &L->so, so_q ? NULL : b->datt, D, K, b->dx, D, NULL, FMC_BF16_GATE_ADD, m + 2 * D, pdl);

        m = mod_at(b, l * 3 + 1);
        in = ln_mod(b, &L->cq, m, K, pdl);
        dmm(b, &L->cq, in, D, K, b->dqkv, D, NULL, FMC_BF16_STORE, NULL, pdl);
        fmc_dr_norm_rope(b->dqkv, D, K, nh, hd, L->cq_norm, hp->qk_eps, b->drope, pdl, s);
        /* the merge quantises a row's 32-blocks by warps: heads of a multiple of 32 dimensions; the first
         * cross-attention reads the context the side branch wrote (a join, so no PDL there) */
        const bool co_q = L->co.is_q8 && hd % 32 == 0;
        if (l == 0) cudaStreamWaitEvent(s, b->ev_join, 0);
        const int apdl = l ? pdl : 0;
        if (co_q)
            fmc_attention_q8(b->dqkv, K, nh, nh, hd, L->kc, L->vc, b->d_dpos, 0, b->dsplits, b->dpart, b->dxq,
                             b->dxd, b->att_form, apdl, s);
        else
            fmc_attention_f32(b->dqkv, K, nh, nh, hd, L->kc, L->vc, b->d_dpos, 0, b->dsplits, b->dpart,
                              b->datt, b->att_form, apdl, s);
        dmm(b, &L->co, co_q ? NULL : b->datt, D, K, b->dx, D, NULL, FMC_BF16_GATE_ADD, m + 2 * D, pdl);

        m = mod_at(b, l * 3 + 2);
        in = ln_mod(b, &L->fc1, m, K, pdl);
        dmm(b, &L->fc1, in, D, K, b->du, hp->ffn, L->fc1_b, FMC_BF16_GELU, NULL, pdl);
        dmm(b, &L->fc2, b->du, hp->ffn, K, b->dx, D, L->fc2_b, FMC_BF16_GATE_ADD, m + 2 * D, pdl);
    }
    /* 4. Final AdaLN -> head -> the target's lm_head (Q8_0, activations quantised as the CPU does) -> argmax.
     */
    const float *fm = mod_at(b, hp->n_layers * 3);
    const float *in = ln_mod(b, &b->head, fm, rows, pdl);
    dmm(b, &b->head, in, D, rows, b->dhead, H, b->head_b, FMC_BF16_STORE, NULL, pdl);
    const fmc_q8_in head_in = {b->xq0, b->xd0, b->dhead, H, NULL, 0.f};
    fmc_q8_matmul(&b->out, &head_in, rows, b->dlogits, b->vocab, 0, NULL, 0, pdl, s);
    fmc_argmax(b->dlogits, rows, b->vocab, b->dam, pdl, s);
}

/* Draft shape g (0: the head, lm_head and argmax for 8 slots; 1: for the whole block) set up for the next
 * draft_forward, with the anchor form b->d_anc and the attention form b->att_form, and with `graph` its
 * graph captured if it is not yet. */
int draft_shape(fm_cuda_backend *b, int g, int graph, char *err, size_t errlen) {
    b->d_rows = g ? b->dhp.block : 8;
    cudaGraphExec_t *e = &b->draft_exec[g][b->att_form][b->d_anc];
    return graph && !*e && capture(b, draft_forward, 0, 0, e, err, errlen);
}

/* Penalties: slot j is checked against the verify row that counts the drafts before it, so it is penalised
 * the same way (the history and slots 0..j-1), then drawn, as the CPU backend does. A slot's list needs the
 * draws before it; instead of a round trip a slot, each pass penalises every slot not yet final, from its
 * unpenalised logits, with a guess of the slots before it (first the unpenalised argmaxes, then the previous
 * pass's draws), and draws them all. The first open slot becomes final, and so does each next one while the
 * guesses before it were right: a pass whose guesses hold ends the draft, and every pass ends one slot at
 * least. */
static int draft_penalized(fm_cuda_backend *b, int pos, int n_out, int32_t *out, char *err, size_t errlen) {
    const size_t row = (size_t)b->vocab;
    if (!b->d_draft_raw) DALLOC(b->d_draft_raw, (size_t)b->dhp.block * row * sizeof(float));
    if (b->n_seq + n_out > b->hist_cap) {
        int32_t *h = (int32_t *)realloc(b->h_hist, sizeof(int32_t) * (size_t)(b->n_seq + n_out));
        if (!h) return fail(err, errlen, "out of memory for the penalties");
        b->h_hist = h, b->hist_cap = b->n_seq + n_out;
    }
    memcpy(b->h_hist, b->seq, sizeof(int32_t) * (size_t)b->n_seq);
    CK(cudaMemcpyAsync(b->d_draft_raw, b->dlogits, (size_t)n_out * row * sizeof(float),
                       cudaMemcpyDeviceToDevice, b->st));
    CK(cudaMemcpyAsync(b->h_am, b->dam, (size_t)n_out * 8, cudaMemcpyDeviceToHost, b->st));
    CK(cudaStreamSynchronize(b->st));
    int32_t guess[FM_DRAFTER_MAX_BLOCK], drawn[FM_DRAFTER_MAX_BLOCK];
    for (int j = 0; j < n_out; j++) guess[j] = fmc_argmax_index(b->h_am[j]);
    for (int f = 0; f < n_out;) { /* slots 0..f-1 final, in out and after the history in h_hist */
        const int rows = n_out - f;
        float *logits = b->dlogits + f * row;
        unsigned long long *am = b->dam + f;
        if (f)
            CK(cudaMemcpyAsync(logits, b->d_draft_raw + f * row, (size_t)rows * row * sizeof(float),
                               cudaMemcpyDeviceToDevice, b->st));
        memcpy(b->h_hist + b->n_seq, out, sizeof(int32_t) * (size_t)f);
        if (reserve_penalties(b, rows * (b->n_seq + f + rows), err, errlen)) return -1;
        const int k = fm_penalty_rows(&b->sampling, b->h_hist, b->n_seq + f, b->n_gen + f, guess + f, rows,
                                      b->pen_counts, b->h_pen, b->h_pen_off);
        if (apply_penalties(b, logits, am, rows, k, err, errlen)) return -1;
        if (!fm_sampling_greedy(&b->sampling)) {
            if (sample_rows(b, logits, am, rows, pos + f, drawn, err, errlen)) return -1;
        } else {
            CK(cudaMemcpyAsync(b->h_am, am, (size_t)rows * 8, cudaMemcpyDeviceToHost, b->st));
            CK(cudaStreamSynchronize(b->st));
            for (int i = 0; i < rows; i++) drawn[i] = fmc_argmax_index(b->h_am[i]);
        }
        int i = 0;
        do out[f + i] = drawn[i];
        while (++i < rows && guess[f + i - 1] == drawn[i - 1]);
        memcpy(guess + f, drawn, sizeof(int32_t) * (size_t)rows);
        f += i;
    }
    return 0;
}

/* Runs the whole block of slots (they attend to each other); the head, lm_head and argmax run for the first
 * 8 slots when n_out <= 8 (the lm_head streams its 0.4 GB once per 8 rows), else for all: two graphs. */
int cu_draft(void *ctx, int32_t anchor, int pos, int n_out, int32_t *out, char *err, size_t errlen) {
    fm_cuda_backend *b = (fm_cuda_backend *)ctx;
    if (!b->has_drafter) return fail(err, errlen, "no drafter loaded");
    const int K = b->dhp.block;
    if (n_out < 1 || n_out > K) {
        snprintf(err, errlen, "drafter: %d draft tokens asked for, expected 1..%d", n_out, K);
        return -1;
    }
    if (anchor < 0 || anchor >= b->vocab) {
        snprintf(err, errlen, "drafter: anchor token %d outside the vocabulary of %d", (int)anchor, b->vocab);
        return -1;
    }
    /* the context rows held once the pending ones are in */
    const int held = b->pend_rows ? b->pend_start + b->pend_rows : b->dlength;
    if (pos < 0 || pos > held || pos >= b->dmax_ctx) {
        snprintf(err, errlen, "drafter: anchor position %d, expected 0..%d (context rows held) and < %d", pos,
                 held, b->dmax_ctx);
        return -1;
    }
    cudaStream_t s = b->st;
    const int g = n_out > 8 || K <= 8;
    b->att_form = att_form_at(pos + 1);
    /* the anchor's slot made with the verify block's rows: its row is the one before the anchor's position
     * (nothing pending, whose rows would overwrite it) */
    const int j = pos - 1 - b->anc_start;
    b->d_anc = !b->pend_rows && b->anc_rows && j >= 0 && j < b->anc_rows && b->anc_tok[j] == anchor;
    if (draft_shape(b, g, b->use_graphs, err, errlen)) return -1;
    /* Nothing fails past here but the device: the context rows go to the side stream unjoined, as the
     * draft's graph waits for them itself (they read the pending features, which the next commit
     * overwrites only after the draft has been read back). */
    if (flush_rows(b, false, err, errlen)) return -1;
    if (b->d_anc) { /* into dkv row 0, where the draft's own chain would put it; ev_ctx after the copy */
        const size_t KW = 2 * (size_t)b->dhp.dim * b->dhp.n_layers;
        CK(cudaMemcpyAsync(b->dkv, b->dkv + (size_t)(b->anc_rows + j) * KW, KW * 4, cudaMemcpyDeviceToDevice,
                           b->st2));
        CK(cudaEventRecord(b->ev_ctx, b->st2));
        b->anc_hits++;
    }
    b->anc_rows = 0; /* this draft's anchor slot writes dkv */
    b->h_ids[0] = anchor;
    *b->h_pos = pos;
    CK(cudaMemcpyAsync(b->d_anchor, b->h_ids, 4, cudaMemcpyHostToDevice, s));
    CK(cudaMemcpyAsync(b->d_dpos, b->h_pos, 4, cudaMemcpyHostToDevice, s));
    if (b->use_graphs)
        CK(cudaGraphLaunch(b->draft_exec[g][b->att_form][b->d_anc], s));
    else
        draft_forward(b, 0, 0);
    CK(cudaGetLastError());
    if (fm_sampling_penalized(&b->sampling) && b->seq)
        return draft_penalized(b, pos, n_out, out, err, errlen);
    /* Sampling: each slot drawn as the target will draw the row it is checked against (coupled drafts). */
    if (!fm_sampling_greedy(&b->sampling))
        return sample_rows(b, b->dlogits, b->dam, n_out, pos, out, err, errlen);
    CK(cudaMemcpyAsync(b->h_am, b->dam, (size_t)b->d_rows * 8, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    for (int k = 0; k < n_out; k++) out[k] = fmc_argmax_index(b->h_am[k]);
    return 0;
}
