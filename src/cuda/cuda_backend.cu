/* cuda_backend.cu: fm_decode_backend on an NVIDIA GPU: the Qwen3 target (Q8_0) and the FlashMap drafter
 * (its stored BF16 matrices, or the host's Q8_0 copy of them: each matrix runs on the product of its type),
 * with weights, KV caches, features and the drafter's context cache all in device memory. This file: the
 * backend's creation, the target's forward, graphs, sampling and penalties, and its ops; the drafter's half
 * (its weights, context extension and draft) is cuda_drafter.cu.
 *
 * A call copies in the token ids (and the position) and copies out only argmax ids. The target's forward for
 * T rows is one fixed sequence of kernels that read the position from device memory, so an eval of T rows is
 * captured once as a CUDA graph per (T, output mode) and replayed at any position; the draft likewise (its
 * anchor and position in device memory). Kernels of a forward of up to 32 rows are chained with
 * programmatic dependent launch (cuda_device.cuh), so a matrix product streams its first weights while the
 * kernel before it finishes. The context extension of the drafter is launched directly (its row count
 * changes), chained the same way.
 * Invariants: the KV cache holds positions 0 .. pos-1; feature rows of the last eval wait in `pending`
 * (device) until the next draft extends the drafter's context with them, as the CPU backend does, but for a
 * verify block's, which go there as the block is launched (drafter_verify_rows). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "cuda/cuda_backend_state.h"

int upload_f32(fm_cuda_backend *b, float **dst, const float *src, size_t n, char *err, size_t errlen) {
    DALLOC(*dst, n * sizeof(float));
    CK(cudaMemcpy(*dst, src, n * sizeof(float), cudaMemcpyHostToDevice));
    return 0;
}

/* Copies the stacked rows of parts[0..n) (GGUF bytes, row_bytes each) into device staging; returns the
 * staging buffer (freed by the caller) or NULL. */
static void *stage_parts(const fm_matrix *const *parts, int n, size_t row_bytes, int64_t *N_out, char *err,
                         size_t errlen) {
    int64_t N = 0;
    for (int i = 0; i < n; i++) N += parts[i]->rows;
    void *stage = NULL;
    if (cudaMalloc(&stage, (size_t)N * row_bytes) != cudaSuccess) {
        snprintf(err, errlen, "cuda: out of device memory staging %zu bytes", (size_t)N * row_bytes);
        return NULL;
    }
    int64_t r0 = 0;
    for (int i = 0; i < n; i++) {
        if (cudaMemcpy((uint8_t *)stage + (size_t)r0 * row_bytes, parts[i]->data,
                       (size_t)parts[i]->rows * row_bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
            snprintf(err, errlen, "cuda: upload of weights failed");
            cudaFree(stage);
            return NULL;
        }
        r0 += parts[i]->rows;
    }
    *N_out = N;
    return stage;
}

/* Uploads the Q8_0 matrices parts[0..n) stacked by rows into one tiled matrix (glu: [gate; up] of
 * fmc_q8_glu). */
int upload_q8(fm_cuda_backend *b, fmc_q8 *dst, const fm_matrix *const *parts, int n, int glu,
              const char *what, char *err, size_t errlen) {
    const int64_t K = parts[0]->cols;
    for (int i = 0; i < n; i++) {
        if (parts[i]->dtype != FM_DTYPE_Q8_0) {
            snprintf(err, errlen, "cuda: %s is %s; the CUDA backend runs Q8_0 targets only", what,
                     parts[i]->dtype == FM_DTYPE_F32   ? "f32"
                     : parts[i]->dtype == FM_DTYPE_F16 ? "f16"
                                                       : "bf16");
            return -1;
        }
        if (parts[i]->cols != K || K % 32) return fail(err, errlen, "cuda: Q8_0 parts of different widths");
    }
    int64_t N = 0;
    void *stage = stage_parts(parts, n, (size_t)(K / 32) * 34, &N, err, errlen);
    if (!stage) return -1;
    size_t qb, sb;
    fmc_q8_bytes((int)N, (int)K, &qb, &sb);
    int4 *qs;
    uint32_t *sc;
    if (dalloc(b, (void **)&qs, qb, err, errlen) || dalloc(b, (void **)&sc, sb, err, errlen)) {
        cudaFree(stage);
        return -1;
    }
    fmc_q8_repack(stage, (int)N, (int)K, glu, qs, sc, dst, 0);
    const cudaError_t e = cudaDeviceSynchronize();
    cudaFree(stage);
    CK(e);
    CK(cudaGetLastError());
    return 0;
}

int upload_bf16(fm_cuda_backend *b, fmc_bf16 *dst, const fm_matrix *const *parts, int n, const char *what,
                char *err, size_t errlen) {
    const int64_t K = parts[0]->cols;
    for (int i = 0; i < n; i++) {
        if (parts[i]->dtype != FM_DTYPE_BF16) {
            snprintf(err, errlen,
                     "cuda: drafter %s is neither bf16 nor Q8_0; the CUDA backend runs those two only", what);
            return -1;
        }
        if (parts[i]->cols != K || K % 16)
            return fail(err, errlen, "cuda: drafter matrix width not a multiple of 16");
    }
    int64_t N = 0;
    void *stage = stage_parts(parts, n, (size_t)K * 2, &N, err, errlen);
    if (!stage) return -1;
    size_t bytes;
    fmc_bf16_bytes((int)N, (int)K, &bytes);
    uint4 *w;
    if (dalloc(b, (void **)&w, bytes, err, errlen)) {
        cudaFree(stage);
        return -1;
    }
    fmc_bf16_repack(stage, (int)N, (int)K, w, dst, 0);
    const cudaError_t e = cudaDeviceSynchronize();
    cudaFree(stage);
    CK(e);
    CK(cudaGetLastError());
    return 0;
}

/* The parts of one drafter matrix, uploaded in their (common) type. */
/* The kernels use the int8 / bf16 tensor-core shapes of compute capability 8.0 and later. */
extern "C" int fm_cuda_available(void) {
    int n = 0, major = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0 &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess && major >= 8;
}

static int create_target(fm_cuda_backend *b, const qwen3_model *m, int n_ctx, int max_eval,
                         const int *capture, int n_capture, char *err, size_t errlen) {
    const qwen3_hparams *hp = &m->hp;
    b->n_layers = hp->n_layers, b->dim = hp->dim, b->n_heads = hp->n_heads, b->n_kv = hp->n_kv_heads;
    b->hd = hp->head_dim, b->ffn = hp->ffn, b->vocab = hp->vocab, b->eps = hp->rms_eps;
    b->q_dim = b->n_heads * b->hd, b->kv_dim = b->n_kv * b->hd;
    b->n_ctx = n_ctx, b->max_eval = max_eval, b->n_capture = n_capture, b->fw = n_capture * b->dim;
    if (b->hd < 32 || !fmc_attn_head_dim_ok(b->hd))
        return fail(err, errlen, "cuda: head_dim must be 32, 64, 128 or 256");
    if (b->dim % 32 || b->q_dim % 32 || b->ffn % 32)
        return fail(err, errlen, "cuda: dim, heads*head_dim and ffn must be multiples of 32");
    if (b->n_kv < 1 || b->n_heads % b->n_kv || b->n_heads / b->n_kv > FMC_ATT_MAX_GROUP)
        return fail(err, errlen,
                    "cuda: query heads must be a multiple of the KV heads, at most 128 per KV head");
    b->cap_slot = (int *)malloc(sizeof(int) * b->n_layers);
    if (!b->cap_slot) return fail(err, errlen, "out of memory");
    for (int l = 0; l < b->n_layers; l++) b->cap_slot[l] = -1;
    for (int i = 0; i < n_capture; i++) {
        if (capture[i] < 0 || capture[i] >= b->n_layers)
            return fail(err, errlen, "cuda: a capture layer does not exist in the target");
        b->cap_slot[capture[i]] = i;
    }
    int rc = 0;
    const fm_matrix *p[3];
    p[0] = &m->tok_embd;
    rc = upload_q8(b, &b->tok, p, 1, 0, "token_embd.weight", err, errlen);
    if (!rc && m->output.data != m->tok_embd.data) {
        p[0] = &m->output;
        rc = upload_q8(b, &b->out, p, 1, 0, "output.weight", err, errlen);
    } else if (!rc)
        b->out = b->tok;
    b->L = (dlayer_t *)calloc(b->n_layers, sizeof(dlayer_t));
    if (!b->L) rc = fail(err, errlen, "out of memory");
    for (int l = 0; l < b->n_layers && !rc; l++) {
        const qwen3_layer *S = &m->layers[l];
        dlayer_t *o = &b->L[l];
        const fm_matrix *qkv[3] = {&S->wq, &S->wk, &S->wv}, *wo[1] = {&S->wo},
                        *gu[2] = {&S->w_gate, &S->w_up}, *dn[1] = {&S->w_down};
        rc = upload_q8(b, &o->qkv, qkv, 3, 0, "attn_q/k/v", err, errlen) ||
             upload_q8(b, &o->wo, wo, 1, 0, "attn_output", err, errlen) ||
             upload_q8(b, &o->gu, gu, 2, 1, "ffn_gate/up", err, errlen) ||
             upload_q8(b, &o->down, dn, 1, 0, "ffn_down", err, errlen) ||
             upload_f32(b, &o->attn_norm, S->attn_norm, b->dim, err, errlen) ||
             upload_f32(b, &o->q_norm, S->q_norm, b->hd, err, errlen) ||
             upload_f32(b, &o->k_norm, S->k_norm, b->hd, err, errlen) ||
             upload_f32(b, &o->ffn_norm, S->ffn_norm, b->dim, err, errlen);
        if (!rc) fmc_q8_widen(&o->wo), fmc_q8_widen(&o->down);
    }
    if (rc) return -1;
    if (upload_f32(b, &b->out_norm, m->output_norm, b->dim, err, errlen)) return -1;
    /* RoPE table as the CPU builds it: double angle, rounded once. */
    const int half = b->hd / 2;
    float *rope = (float *)malloc(sizeof(float) * (size_t)n_ctx * b->hd);
    if (!rope) return fail(err, errlen, "out of memory");
    for (int ps = 0; ps < n_ctx; ps++)
        for (int i = 0; i < half; i++) {
            const double ang = ps * pow((double)hp->rope_theta, -2.0 * i / b->hd);
            rope[((size_t)ps * half + i) * 2] = (float)cos(ang);
            rope[((size_t)ps * half + i) * 2 + 1] = (float)sin(ang);
        }
    rc = upload_f32(b, &b->rope, rope, (size_t)n_ctx * b->hd, err, errlen);
    free(rope);
    if (rc) return -1;
    const size_t kv = (size_t)b->n_layers * n_ctx * b->kv_dim;
    DALLOC(b->kc, kv * 2);
    DALLOC(b->vc, kv * 2);
    const int R = b->rows_cap;
    b->maxK = std::max(std::max(b->dim, b->q_dim), b->ffn);
    b->max_splits = (n_ctx + FMC_ATT_SPLIT - 1) / FMC_ATT_SPLIT;
    DALLOC(b->x, (size_t)R * b->dim * 4);
    DALLOC(b->qkv, (size_t)R * (b->q_dim + 2 * b->kv_dim) * 4);
    DALLOC(b->q, (size_t)R * b->q_dim * 4);
    DALLOC(b->feat, (size_t)R * (b->fw ? b->fw : 1) * 4);
    DALLOC(b->logits, (size_t)R * b->vocab * 4);
    /* Attention scratch: the split kernel's partial results for up to FMC_ATT_SPLIT_MAX_T rows (longer
     * launches take the one-pass kernel, whose f32 output [T][q_dim] goes here before its quantisation),
     * or for every row when the one-pass kernel does not take these heads. */
    const size_t split_rows =
        fmc_attn_prefill_fits(b->n_heads, b->n_kv, b->hd) ? std::min(R, (int)FMC_ATT_SPLIT_MAX_T) : R;
    DALLOC(b->part,
           std::max(split_rows * b->n_heads * b->max_splits * (b->hd + 2), (size_t)R * b->q_dim) * 4);
    const size_t R8 = (size_t)(R + 7) / 8 * 8; /* quantised activations come in groups of 8 tokens */
    DALLOC(b->xq0, R8 * b->maxK);
    DALLOC(b->xd0, R8 * (b->maxK / 32) * 4);
    DALLOC(b->xq1, R8 * b->maxK);
    DALLOC(b->xd1, R8 * (b->maxK / 32) * 4);
    DALLOC(b->d_ids, (size_t)R * 4);
    DALLOC(b->d_am, (size_t)R * 8);
    DALLOC(b->d_pos, 4);
    CK(cudaMallocHost(&b->h_ids, (size_t)R * 4));
    CK(cudaMallocHost(&b->h_am, (size_t)R * 8));
    CK(cudaMallocHost(&b->h_pos, 4));
    return 0;
}

extern "C" void fm_cuda_backend_free(fm_cuda_backend *b) {
    if (!b) return;
    if (b->st) cudaStreamSynchronize(b->st);
    free_side(b);
    for (int i = 0; i < b->n_graphs; i++) cudaGraphExecDestroy(b->graphs[i].exec);
    for (auto &shape : b->draft_exec)
        for (auto &form : shape)
            for (cudaGraphExec_t &e : form)
                if (e) cudaGraphExecDestroy(e);
    fmc_mk_free(b->mk);
    fmc_mk_free(b->mkv);
    if (b->allocs)
        for (void *p : *b->allocs) cudaFree(p);
    delete b->allocs;
    if (b->h_ids) cudaFreeHost(b->h_ids);
    if (b->h_am) cudaFreeHost(b->h_am);
    if (b->h_pos) cudaFreeHost(b->h_pos);
    if (b->h_res) cudaFreeHost(b->h_res);
    if (b->h_pen) cudaFreeHost(b->h_pen);
    if (b->d_pen) cudaFree(b->d_pen);
    if (b->h_pen_off) cudaFreeHost(b->h_pen_off);
    free(b->pen_counts);
    free(b->h_hist);
    free(b->cand);
    free(b->h_row);
    if (b->st) cudaStreamDestroy(b->st);
    free(b->cap_slot);
    free(b->L);
    free(b->DL);
    free(b);
}

static fmc_split *dmat_split(dmat_t *m) {
    return m->is_q8 ? &m->q.sp : &m->h.sp;
}
static int dmat_rows(const dmat_t *m) {
    return m->is_q8 ? m->q.N : m->h.N;
}

/* A product's split list and rows; side: it runs on the drafter's side stream (fc, anchor_proj and the cross
 * K/V: context rows and a draft's anchor slot, beside the main stream's products). */
struct split_ref {
    fmc_split *sp;
    int N;
    bool side;
};

/* Every product's, for the split-K scratch. */
static std::vector<split_ref> splits(fm_cuda_backend *b) {
    std::vector<split_ref> v;
    v.push_back({&b->out.sp, b->out.N, false});
    for (int l = 0; l < b->n_layers; l++)
        for (fmc_q8 *w : {&b->L[l].qkv, &b->L[l].wo, &b->L[l].gu, &b->L[l].down})
            v.push_back({&w->sp, w->N, false});
    if (!b->has_drafter) return v;
    for (dmat_t *m : {&b->fc, &b->anchor_proj, &b->ckv}) v.push_back({dmat_split(m), dmat_rows(m), true});
    v.push_back({dmat_split(&b->head), dmat_rows(&b->head), false});
    for (int l = 0; l < b->dhp.n_layers; l++) {
        ddlayer_t *L = &b->DL[l];
        for (dmat_t *m : {&L->sqkv, &L->so, &L->cq, &L->co, &L->fc1, &L->fc2})
            v.push_back({dmat_split(m), dmat_rows(m), false});
    }
    return v;
}

/* One split-K scratch and one set of arrival counters (zero) for the products of one stream (side or not),
 * which run one at a time. */
static int share_scratch(fm_cuda_backend *b, const std::vector<split_ref> &v, bool side, char *err,
                         size_t errlen) {
    size_t part = 1;
    int cnt = 1, any = 0;
    for (const split_ref &r : v) {
        if (r.side != side) continue;
        size_t p;
        int c;
        fmc_split_scratch(r.sp, r.N, &p, &c);
        part = std::max(part, p);
        cnt = std::max(cnt, c);
        any = 1;
    }
    if (!any) return 0;
    float *dpart;
    unsigned *dcnt;
    DALLOC(dpart, part * 4);
    DALLOC(dcnt, (size_t)cnt * 4);
    CK(cudaMemset(dcnt, 0, (size_t)cnt * 4));
    for (const split_ref &r : v)
        if (r.side == side) r.sp->part = dpart, r.sp->cnt = dcnt;
    return 0;
}

/* One scratch for the main stream's products, one for the side stream's. */
static int attach_scratch(fm_cuda_backend *b, char *err, size_t errlen) {
    const std::vector<split_ref> v = splits(b);
    return share_scratch(b, v, false, err, errlen) || share_scratch(b, v, true, err, errlen) ? -1 : 0;
}

static int warm_graphs(fm_cuda_backend *b, char *err, size_t errlen);
static int create_megakernel(fm_cuda_backend *b, char *err, size_t errlen);

extern "C" int fm_cuda_backend_create(const qwen3_model *m, const fm_drafter *d, int n_ctx, int max_eval,
                                      const int *capture, int n_capture, fm_cuda_backend **out, char *err,
                                      size_t errlen) {
    *out = NULL;
    if (!fm_cuda_available()) return fail(err, errlen, "cuda: no usable CUDA device");
    if (fmc_init()) return fail(err, errlen, "cuda: kernel setup failed (shared-memory limits)");
    if (n_ctx < 1 || n_ctx > (1 << 20))
        return fail(err, errlen, "cuda: context size out of range (1 .. 1048576)");
    if (max_eval < 1 || max_eval > 8192)
        return fail(err, errlen, "cuda: batch size out of range (1 .. 8192)");
    if (d && n_capture < 1) return fail(err, errlen, "cuda: a drafter needs captured target layers");
    fm_cuda_backend *b = (fm_cuda_backend *)calloc(1, sizeof *b);
    if (!b) return fail(err, errlen, "out of memory");
    b->allocs = new std::vector<void *>();
    b->use_graphs = 1;
    b->use_pdl = 1;
    b->rows_cap = std::max(max_eval, d ? d->hp.block : 1);
    if (cudaStreamCreateWithFlags(&b->st, cudaStreamNonBlocking) != cudaSuccess ||
        create_target(b, m, n_ctx, max_eval, capture, n_capture, err, errlen) ||
        (d && create_drafter(b, d, err, errlen))) {
        if (!err[0]) snprintf(err, errlen, "cuda: stream creation failed");
        fm_cuda_backend_free(b);
        return -1;
    }
    if (attach_scratch(b, err, errlen) || create_megakernel(b, err, errlen) || warm_graphs(b, err, errlen)) {
        fm_cuda_backend_free(b);
        return -1;
    }
    *out = b;
    return 0;
}

static int graph_form(const fm_cuda_backend *b, int T);

/* Whether a step runs as one persistent launch (use_mk is MK_OFF where the backend has none). By default
 * (MK_SHORT) while the attention takes the short form: past it the persistent step's attention, one (KV head,
 * 64-key split) unit a block at a time, is slower than the kernels' (H100, 12 warps: 3.3 % faster at 512
 * positions, 3.5 % slower at 4096, 33 % at 16k; bench/RESULTS.md). Both give the same bits. */
static int mk_step(const fm_cuda_backend *b) {
    return b->use_mk == MK_ALWAYS || (b->use_mk == MK_SHORT && graph_form(b, 1) == FMC_ATT_SHORT);
}
/* Whether a forward of T rows runs as one persistent launch: a step, or a verify block by the same rule
 * where the verify instance takes T rows. */
static int mk_forward(const fm_cuda_backend *b, int T) {
    if (T == 1) return mk_step(b);
    if (!b->mkv || !b->use_mkv || T > fmc_mk_max_tokens(b->mkv)) return 0;
    return b->use_mk == MK_ALWAYS || (b->use_mk == MK_SHORT && graph_form(b, T) == FMC_ATT_SHORT);
}

/* ---- the target forward: a fixed kernel sequence for T rows (graph-capturable) ---- */

/* Per layer: [RMSNorm + quantise] -> [qkv] -> [q/k norm, RoPE, KV write] -> [attention splits] -> [merge +
 * quantise] -> [wo, += x] -> [RMSNorm + quantise] -> [gate/up + SiLU * up + quantise] -> [down, += x (and
 * the captured copy)]: 9 kernels (a prompt chunk's attention: one pass, then a quantiser). */
static void target_forward(fm_cuda_backend *b, int T, int mode) {
    cudaStream_t s = b->st;
    const int dim = b->dim, qkvw = b->q_dim + 2 * b->kv_dim, pdl = b->use_pdl && T <= 32;
    const int first = mode == MODE_LAST ? T - 1 : 0, rows = T - first;
    if (mode != MODE_NONE) cudaMemsetAsync(b->d_am, 0, (size_t)rows * 8, s);
    fmc_embed_q8(&b->tok, b->d_ids, T, b->x, s);
    const fmc_q8_in xq_in = {b->xq1, b->xd1, NULL, 0, NULL, 0.f};
    const int persistent = mk_forward(b, T);
    if (persistent) fmc_mk_launch(T == 1 ? b->mk : b->mkv, T, s);
    for (int l = 0; l < b->n_layers && !persistent; l++) {
        const dlayer_t *L = &b->L[l];
        __half *kc = b->kc + (size_t)l * b->n_ctx * b->kv_dim, *vc = b->vc + (size_t)l * b->n_ctx * b->kv_dim;
        const fmc_q8_in attn_in = {b->xq0, b->xd0, b->x, dim, L->attn_norm, b->eps};
        fmc_q8_matmul(&L->qkv, &attn_in, T, b->qkv, qkvw, 0, NULL, 0, pdl, s);
        fmc_qk_norm_rope_kv(b->qkv, T, b->n_heads, b->n_kv, b->hd, L->q_norm, L->k_norm, b->eps, b->rope,
                            b->d_pos, b->q, kc, vc, pdl, s);
        fmc_attention_q8(b->q, T, b->n_heads, b->n_kv, b->hd, kc, vc, b->d_pos, 1, b->max_splits, b->part,
                         b->xq1, b->xd1, b->att_form, pdl, s);
        fmc_q8_matmul(&L->wo, &xq_in, T, b->x, dim, 1, NULL, 0, pdl, s);
        const fmc_q8_in ffn_in = {b->xq0, b->xd0, b->x, dim, L->ffn_norm, b->eps};
        fmc_q8_glu(&L->gu, &ffn_in, T, b->xq1, b->xd1, pdl, s);
        float *cap = b->cap_slot[l] >= 0 ? b->feat + (size_t)b->cap_slot[l] * dim : NULL;
        fmc_q8_matmul(&L->down, &xq_in, T, b->x, dim, 1, cap, b->fw, pdl, s);
    }
    if (mode == MODE_NONE) return;
    const fmc_q8_in out_in = {b->xq0, b->xd0, b->x + (size_t)first * dim, dim, b->out_norm, b->eps};
    fmc_q8_matmul(&b->out, &out_in, rows, b->logits, b->vocab, 0, NULL, 0, pdl, s);
    fmc_argmax(b->logits, rows, b->vocab, b->d_am, pdl, s);
}

void drop_graphs(fm_cuda_backend *b) {
    cudaStreamSynchronize(b->st);
    for (int i = 0; i < b->n_graphs; i++) cudaGraphExecDestroy(b->graphs[i].exec);
    b->n_graphs = 0;
    for (auto &shape : b->draft_exec)
        for (auto &form : shape)
            for (cudaGraphExec_t &e : form) {
                if (e) cudaGraphExecDestroy(e);
                e = NULL;
            }
}

/* Captures fn(b, T, mode) into an executable graph. */
int capture(fm_cuda_backend *b, void (*fn)(fm_cuda_backend *, int, int), int T, int mode,
            cudaGraphExec_t *out, char *err, size_t errlen) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(b->st, cudaStreamCaptureModeThreadLocal));
    fn(b, T, mode);
    CK(cudaStreamEndCapture(b->st, &g));
    const cudaError_t e = cudaGraphInstantiate(out, g, 0);
    cudaGraphDestroy(g);
    CK(e);
    return 0;
}

/* The attention form of a forward of T rows at the current b->att_form: only launches of up to 64 rows x
 * heads of a group have two (fmc_attn_long_form), so only those get a graph of each. */
static int graph_form(const fm_cuda_backend *b, int T) {
    return fmc_attn_long_form(T, b->n_heads, b->n_kv) ? b->att_form : FMC_ATT_SHORT;
}

static const graph_t *find_graph(const fm_cuda_backend *b, int T, int mode) {
    const int form = graph_form(b, T);
    for (int i = 0; i < b->n_graphs; i++)
        if (b->graphs[i].T == T && b->graphs[i].mode == mode && b->graphs[i].form == form)
            return &b->graphs[i];
    return NULL;
}

static int run_forward(fm_cuda_backend *b, int T, int mode, char *err, size_t errlen) {
    if (!b->use_graphs || T > GRAPH_MAX_T) {
        target_forward(b, T, mode);
        CK(cudaGetLastError());
        return 0;
    }
    const graph_t *g = find_graph(b, T, mode);
    if (g) {
        CK(cudaGraphLaunch(g->exec, b->st));
        return 0;
    }
    cudaGraphExec_t ge;
    if (capture(b, target_forward, T, mode, &ge, err, errlen)) return -1;
    if (b->n_graphs < MAX_GRAPHS) b->graphs[b->n_graphs++] = (graph_t){T, mode, graph_form(b, T), ge};
    CK(cudaGraphLaunch(ge, b->st));
    if (b->n_graphs == MAX_GRAPHS && b->graphs[MAX_GRAPHS - 1].exec != ge) {
        CK(cudaStreamSynchronize(b->st));
        cudaGraphExecDestroy(ge);
    }
    return 0;
}

static int cu_pos(void *ctx) {
    return ((fm_cuda_backend *)ctx)->pos;
}

/* The drawn tokens of rows 0..rows-1 of logits (positions pos0 .., am their packed argmax): the target's
 * rows, or the drafter's slots (coupled drafts). With top-k the GPU returns a superset of what the filters
 * keep (one more temperature of range, whole tiers) and the host draws from it with the CPU's code; a row
 * with more candidates than SAMPLE_CAP is read whole. Otherwise the GPU draws (the host's very scores) and
 * only the token comes back, unless top-p's cut was beyond its reach (then the row is read whole). */
int sample_rows(fm_cuda_backend *b, const float *logits, const unsigned long long *am, int rows, int pos0,
                int32_t *out, char *err, size_t errlen) {
    const fm_sampling *sp = &b->sampling;
    const int draw = sp->top_k == 0; /* temperature alone, or with top-p and / or min-p: the GPU draws */
    const fmc_sample_args a = {sp->temperature,
                               (FM_SAMPLE_RANGE + 1) * sp->temperature,
                               sp->top_k,
                               fm_sampling_top_p_on(sp) ? sp->top_p : 1,
                               sp->min_p > 0 ? fmax(log((double)sp->min_p), -(double)FM_SAMPLE_RANGE)
                                             : -(double)FM_SAMPLE_RANGE,
                               sp->seed,
                               pos0};
    fmc_sample_rows(logits, rows, b->vocab, am, &a, &b->sscr, SAMPLE_CAP, b->d_cnt, b->d_cand, b->d_pick,
                    b->st);
    CK(cudaGetLastError());
    const size_t bytes = draw ? (size_t)((char *)b->d_cand - (char *)b->d_res)
                              : (size_t)((char *)(b->d_cand + (size_t)rows * SAMPLE_CAP) - (char *)b->d_res);
    CK(cudaMemcpyAsync(b->h_res, b->d_res, bytes, cudaMemcpyDeviceToHost, b->st));
    CK(cudaStreamSynchronize(b->st));
    for (int r = 0; r < rows; r++) {
        if (draw && b->h_cnt[r] >= 0) {
            out[r] = fmc_argmax_index(b->h_pick[r]); /* 0 for a row of NaN */
            continue;
        }
        const fmc_candidate *c = b->h_cand + (size_t)r * SAMPLE_CAP;
        const int nc = b->h_cnt[r];
        if (nc > SAMPLE_CAP ||
            nc < 0) { /* more candidates than came back; top-p's cut beyond the GPU's reach */
            CK(cudaMemcpy(b->h_row, logits + (size_t)r * b->vocab, (size_t)b->vocab * 4,
                          cudaMemcpyDeviceToHost));
            out[r] = fm_sample_row(b->h_row, b->vocab, sp, pos0 + r, b->cand);
            continue;
        }
        for (int i = 0; i < nc; i++) b->cand[i] = fm_candidate{c[i].logit, c[i].id, 0};
        out[r] = nc > 0 ? fm_sample_pick(b->cand, nc, sp, fm_sample_row_key(sp->seed, pos0 + r))
                        : 0; /* a row of NaN */
    }
    return 0;
}

static void cu_set_history(void *ctx, const int32_t *seq, int n, int n_gen) {
    fm_cuda_backend *b = (fm_cuda_backend *)ctx;
    b->seq = seq, b->n_seq = n, b->n_gen = n_gen;
}

/* Room for n penalty entries, on the host and on the GPU. */
int reserve_penalties(fm_cuda_backend *b, int n, char *err, size_t errlen) {
    if (n <= b->pen_cap) return 0;
    if (b->h_pen) cudaFreeHost(b->h_pen);
    if (b->d_pen) cudaFree(b->d_pen);
    b->h_pen = NULL, b->d_pen = NULL, b->pen_cap = 0;
    CK(cudaMallocHost(&b->h_pen, (size_t)n * sizeof *b->h_pen));
    CK(cudaMalloc(&b->d_pen, (size_t)n * sizeof *b->d_pen));
    b->pen_cap = n;
    return 0;
}

/* Applies the lists at h_pen (k entries, row r's from h_pen_off[r]) to rows 0..rows-1 of logits in place
 * and recomputes their argmax into am. */
int apply_penalties(fm_cuda_backend *b, float *logits, unsigned long long *am, int rows, int k, char *err,
                    size_t errlen) {
    CK(cudaMemcpyAsync(b->d_pen_off, b->h_pen_off, (size_t)(rows + 1) * sizeof(int), cudaMemcpyHostToDevice,
                       b->st));
    CK(cudaMemcpyAsync(b->d_pen, b->h_pen, (size_t)(k ? k : 1) * sizeof *b->d_pen, cudaMemcpyHostToDevice,
                       b->st));
    fmc_penalize(logits, rows, b->vocab, b->d_pen_off, b->d_pen, b->st);
    CK(cudaMemsetAsync(am, 0, (size_t)rows * 8, b->st));
    fmc_argmax(logits, rows, b->vocab, am, 0, b->st);
    CK(cudaGetLastError());
    return 0;
}

/* Penalises the forward's logit rows 0..rows-1 in place (row r of an all-rows forward also counts the drafts
 * ids[1..r]) and recomputes their argmax. The lists are fm_penalty_list's, built by fm_penalty_rows.
 */
static int penalize_rows(fm_cuda_backend *b, int rows, const int32_t *extra, char *err, size_t errlen) {
    if (reserve_penalties(b, rows * (b->n_seq + rows), err, errlen)) return -1;
    /* (rows > 1 only for all-rows forwards, where extra is set) */
    const int k = fm_penalty_rows(&b->sampling, b->seq, b->n_seq, b->n_gen, extra, rows, b->pen_counts,
                                  b->h_pen, b->h_pen_off);
    return apply_penalties(b, b->logits, b->d_am, rows, k, err, errlen);
}

static int cu_set_sampling(void *ctx, const fm_sampling *s, char *err, size_t errlen) {
    fm_cuda_backend *b = (fm_cuda_backend *)ctx;
    if (!fm_sampling_greedy(s) && !b->cand) {
        const int R = b->rows_cap;
        const size_t cnt_bytes = ((size_t)R * sizeof(int) + 15) / 16 * 16, u64_bytes = (size_t)R * 8,
                     res_bytes = cnt_bytes + u64_bytes + (size_t)R * SAMPLE_CAP * sizeof(fmc_candidate);
        DALLOC(b->d_res, res_bytes);
        CK(cudaMallocHost(&b->h_res, res_bytes));
        char *d = (char *)b->d_res, *h = (char *)b->h_res;
        b->d_cnt = (int *)d, b->h_cnt = (int *)h;
        b->d_pick = (unsigned long long *)(d + cnt_bytes), b->h_pick = (unsigned long long *)(h + cnt_bytes);
        b->d_cand = (fmc_candidate *)(d + cnt_bytes + u64_bytes);
        b->h_cand = (fmc_candidate *)(h + cnt_bytes + u64_bytes);
        DALLOC(b->sscr.tier_n, (size_t)R * FMC_SAMPLE_TIERS * sizeof *b->sscr.tier_n);
        DALLOC(b->sscr.tier_w, (size_t)R * FMC_SAMPLE_TIERS * sizeof *b->sscr.tier_w);
        DALLOC(b->sscr.cut, (size_t)R * sizeof *b->sscr.cut);
        b->h_row = (float *)malloc((size_t)b->vocab * sizeof *b->h_row);
        b->cand = (fm_candidate *)malloc((size_t)b->vocab * sizeof *b->cand);
        if (!b->h_row || !b->cand) {
            snprintf(err, errlen, "out of memory for the sampler");
            return -1;
        }
    }
    if (fm_sampling_penalized(s) && !b->pen_counts) {
        const int R = b->rows_cap;
        DALLOC(b->d_pen_off, (size_t)(R + 1) * sizeof(int));
        CK(cudaMallocHost(&b->h_pen_off, (size_t)(R + 1) * sizeof(int)));
        b->pen_counts = (int *)calloc((size_t)b->vocab, sizeof(int));
        if (!b->pen_counts) {
            snprintf(err, errlen, "out of memory for the penalties");
            return -1;
        }
    }
    b->sampling = *s;
    return 0;
}

static int cu_eval(void *ctx, const int32_t *ids, int n, int all_rows, int32_t *argmax, char *err,
                   size_t errlen) {
    fm_cuda_backend *b = (fm_cuda_backend *)ctx;
    if (n < 1 || n > b->max_eval) {
        snprintf(err, errlen, "cuda: a forward of %d tokens exceeds the batch size %d", n, b->max_eval);
        return -1;
    }
    if (b->pos + n > b->n_ctx) {
        snprintf(err, errlen, "context is full: %d positions held + %d new > --ctx %d", b->pos, n, b->n_ctx);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= b->vocab) {
            snprintf(err, errlen, "token id %d is out of range (vocabulary %d)", ids[i], b->vocab);
            return -1;
        }
    memcpy(b->h_ids, ids, (size_t)n * 4);
    *b->h_pos = b->pos;
    CK(cudaMemcpyAsync(b->d_ids, b->h_ids, (size_t)n * 4, cudaMemcpyHostToDevice, b->st));
    CK(cudaMemcpyAsync(b->d_pos, b->h_pos, 4, cudaMemcpyHostToDevice, b->st));
    const int mode = !argmax ? MODE_NONE : all_rows ? MODE_ALL : MODE_LAST, rows = mode == MODE_ALL ? n : 1;
    b->att_form = att_form_at(b->pos + n);
    b->spec_rows = 0, b->anc_rows = 0; /* this forward overwrites the features and d_am */
    if (run_forward(b, n, mode, err, errlen)) return -1;
    if (mode == MODE_ALL && drafter_verify_rows(b, n, err, errlen)) return -1;
    if (argmax && fm_sampling_penalized(&b->sampling) &&
        penalize_rows(b, rows, mode == MODE_ALL ? ids + 1 : NULL, err, errlen))
        return -1;
    if (argmax && !fm_sampling_greedy(&b->sampling)) {
        if (sample_rows(b, b->logits, b->d_am, rows, b->pos + n - rows, argmax, err, errlen)) return -1;
    } else {
        if (argmax) CK(cudaMemcpyAsync(b->h_am, b->d_am, (size_t)rows * 8, cudaMemcpyDeviceToHost, b->st));
        CK(cudaStreamSynchronize(b->st));
        if (argmax)
            for (int i = 0; i < rows; i++) argmax[i] = fmc_argmax_index(b->h_am[i]);
        if (b->anc_rows) drafter_verify_tokens(b, argmax, rows);
    }
    b->pos += n;
    b->last_rows = n;
    b->last_logit_rows = argmax ? rows : 0;
    return 0;
}

static void cu_rewind(void *ctx, int pos) {
    fm_cuda_backend *b = (fm_cuda_backend *)ctx;
    if (pos >= 0 && pos < b->pos) b->pos = pos;
    if (b->pend_rows && b->pend_start + b->pend_rows > pos)
        b->pend_rows = pos > b->pend_start ? pos - b->pend_start : 0;
}

/* The graphs a decode uses, captured up front as vLLM does at start-up: a step, every verify block size (a
 * speculative decode with the adaptive width tries several) and the draft's shapes. Each capture costs a few
 * milliseconds that a first generation would otherwise pay inside its timed rounds. Captures record and
 * run nothing. */
static int warm_graphs(fm_cuda_backend *b, char *err, size_t errlen) {
    const auto t0 = std::chrono::steady_clock::now();
    const int K = b->has_drafter ? b->dhp.block : 0,
              top = std::min(std::min(K + 1, b->max_eval), (int)GRAPH_MAX_T);
    const int forms = b->n_ctx > ATT_LONG_FROM ? 2 : 1;
    for (int f = 0; f < forms; f++) {
        b->att_form = f;
        for (int T = 1; T <= top; T++) {
            const int mode = T == 1 ? MODE_LAST : MODE_ALL;
            if (find_graph(b, T, mode) || b->n_graphs >= MAX_GRAPHS) continue;
            cudaGraphExec_t ge;
            if (capture(b, target_forward, T, mode, &ge, err, errlen)) return -1;
            b->graphs[b->n_graphs++] = (graph_t){T, mode, graph_form(b, T), ge};
        }
        for (int g = K <= 8; K && g < 2; g++) /* the draft shapes cu_draft uses, in its anchor forms */
            for (b->d_anc = 0; b->d_anc <= (b->early_rows && b->early_anchor); b->d_anc++)
                if (draft_shape(b, g, 1, err, errlen)) return -1;
        b->d_anc = 0;
    }
    b->att_form = FMC_ATT_SHORT;
    b->warm_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return 0;
}

/* An instance of the persistent forward for up to `tokens` rows into *out, where the device and the model
 * take it and a graph of it can be captured (cooperative launches in graphs): a graph of T rows with it,
 * never launched here, as a cooperative launch or else a plain one. 0 with *out NULL and why set where it
 * cannot; -1 on an error. */
static int mk_instance(fm_cuda_backend *b, const fmc_mk_desc *d, fmc_mk **out, char *why, size_t whylen,
                       char *err, size_t errlen) {
    const int rc = fmc_mk_create(d, out, why, whylen);
    if (rc < 0) return fail(err, errlen, why);
    if (rc > 0) return 0;
    const int T = std::min(fmc_mk_max_tokens(*out), b->max_eval);
    if (d->tokens > 1 && T < 2) {
        snprintf(why, whylen, "verify blocks of one row");
        fmc_mk_free(*out);
        *out = NULL;
        return 0;
    }
    cudaGraphExec_t ge;
    char e2[256];
    int ok = 0;
    for (int coop = 1; coop >= 0 && !ok; coop--) {
        fmc_mk_set_cooperative(*out, coop);
        ok = !capture(b, target_forward, T, T == 1 ? MODE_LAST : MODE_ALL, &ge, e2, sizeof e2);
        if (ok) cudaGraphExecDestroy(ge);
        cudaGetLastError();
    }
    if (!ok) {
        snprintf(why, whylen, "not capturable in a graph: %.120s", e2);
        fmc_mk_free(*out);
        *out = NULL;
    }
    return 0;
}

/* The persistent forward for steps and for verify blocks: FMC_MEGA=1 turns it on for every one, 0 off (else
 * in the short attention form); FMC_MEGA_VERIFY=0 keeps verify blocks on the kernels (fm_cuda_debug_set_mega
 * for tests). */
static int create_megakernel(fm_cuda_backend *b, char *err, size_t errlen) {
    std::vector<fmc_mk_layer> L(b->n_layers);
    for (int l = 0; l < b->n_layers; l++) {
        const dlayer_t *S = &b->L[l];
        L[l] = {&S->qkv,
                &S->wo,
                &S->gu,
                &S->down,
                S->attn_norm,
                S->q_norm,
                S->k_norm,
                S->ffn_norm,
                b->kc + (size_t)l * b->n_ctx * b->kv_dim,
                b->vc + (size_t)l * b->n_ctx * b->kv_dim,
                b->cap_slot[l] >= 0 ? b->feat + (size_t)b->cap_slot[l] * b->dim : NULL};
    }
    fmc_mk_desc d = {b->n_layers, b->dim,   b->n_heads, b->n_kv, b->hd,    b->ffn, b->max_splits,
                     b->eps,      L.data(), b->x,       b->qkv,  b->part,  b->q,   b->xq1,
                     b->xd1,      b->xq0,   b->xd0,     b->rope, b->d_pos, 1,      b->fw};
    b->use_mk = MK_ALWAYS, b->use_mkv = 1; /* (the graphs mk_instance captures take them) */
    if (mk_instance(b, &d, &b->mk, b->mk_why, sizeof b->mk_why, err, errlen)) return -1;
    d.tokens = 8;
    if (b->mk && mk_instance(b, &d, &b->mkv, b->mkv_why, sizeof b->mkv_why, err, errlen)) return -1;
    if (!b->mk) snprintf(b->mkv_why, sizeof b->mkv_why, "no persistent step");
    const char *e = getenv("FMC_MEGA"), *ev = getenv("FMC_MEGA_VERIFY");
    b->use_mk = !b->mk ? MK_OFF : e && !strcmp(e, "0") ? MK_OFF : e && !strcmp(e, "1") ? MK_ALWAYS : MK_SHORT;
    b->use_mkv = !(ev && !strcmp(ev, "0"));
    return 0;
}

static void cu_reset(void *ctx) {
    fm_cuda_backend *b = (fm_cuda_backend *)ctx;
    b->pos = 0;
    b->pend_rows = 0;
    b->dlength = 0;
    b->spec_rows = 0;
    b->anc_rows = 0;
}

extern "C" fm_decode_backend fm_cuda_backend_ops(fm_cuda_backend *b) {
    fm_decode_backend ops;
    memset(&ops, 0, sizeof ops);
    ops.ctx = b;
    ops.n_ctx = b->n_ctx;
    ops.vocab = b->vocab;
    ops.max_eval = b->max_eval;
    ops.block = b->has_drafter ? b->dhp.block : 0;
    ops.drafter_ctx = b->has_drafter ? b->dmax_ctx : 0;
    /* The narrow Q8_0 product takes tokens in n-tiles of 8 (one mma column group each): on the H200
     * verify(8) / (9) / (16) / (17) cost 1.08 / 1.34 / 1.36 / 1.61 steps. */
    ops.row_granule = 8;
    ops.pos = cu_pos;
    ops.eval = cu_eval;
    ops.set_sampling = cu_set_sampling;
    ops.set_history = cu_set_history;
    ops.rewind = cu_rewind;
    ops.commit_features = cu_commit_features;
    ops.draft = cu_draft;
    ops.reset = cu_reset;
    return ops;
}
