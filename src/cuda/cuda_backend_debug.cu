/* cuda_backend_debug.cu: the CUDA backend's diagnostics (cuda_debug.h) for tests and benchmarks: its last
 * logits and features, switches for its launch forms and kernels (graphs, PDL, the persistent kernel and
 * its phase clock), and timings of its kernels on its weights and of the persistent-product probe (the
 * device-level checks without a backend are in cuda_debug.cu). */
#include <stdio.h>

#include <vector>

#include "cuda/cuda_backend_state.h"
#include "cuda/cuda_debug.h"

extern "C" int fm_cuda_debug_logits(fm_cuda_backend *b, float *out, int rows) {
    if (rows > b->last_logit_rows) return -1;
    return cudaMemcpy(out, b->logits, (size_t)rows * b->vocab * 4, cudaMemcpyDeviceToHost) == cudaSuccess
               ? 0
               : -1;
}

extern "C" int fm_cuda_debug_features(fm_cuda_backend *b, float *out, int rows) {
    if (rows > b->last_rows || !b->fw) return -1;
    return cudaMemcpy(out, b->feat, (size_t)rows * b->fw * 4, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
}

extern "C" int fm_cuda_debug_draft_head(fm_cuda_backend *b, float *out) {
    if (!b->has_drafter) return -1;
    return cudaMemcpy(out, b->dhead, (size_t)b->dhp.block * b->dhp.target_dim * 4, cudaMemcpyDeviceToHost) ==
                   cudaSuccess
               ? 0
               : -1;
}

extern "C" int fm_cuda_debug_draft_logits(fm_cuda_backend *b, float *out, int rows) {
    if (!b->has_drafter || rows < 1 || rows > b->d_rows) return -1;
    return cudaMemcpy(out, b->dlogits, (size_t)rows * b->vocab * 4, cudaMemcpyDeviceToHost) == cudaSuccess
               ? 0
               : -1;
}

extern "C" int fm_cuda_debug_drafter_context(fm_cuda_backend *b, const float *feat, int n, int start) {
    char err[256];
    if (!b->has_drafter || n < 1 || n > b->pend_cap || flush_pending(b, err, sizeof err) ||
        cudaStreamSynchronize(b->st) != cudaSuccess ||
        cudaMemcpy(b->pending, feat, (size_t)n * b->fw * 4, cudaMemcpyHostToDevice) != cudaSuccess ||
        drafter_extend(b, b->pending, n, start, err, sizeof err))
        return -1;
    return cudaStreamSynchronize(b->st) == cudaSuccess ? 0 : -1;
}

extern "C" void fm_cuda_debug_set_graphs(fm_cuda_backend *b, int on) {
    b->use_graphs = on;
}

extern "C" void fm_cuda_debug_set_early_rows(fm_cuda_backend *b, int rows, int anchors) {
    b->early_rows = rows, b->early_anchor = anchors;
    b->spec_rows = 0, b->anc_rows = 0;
}

extern "C" long fm_cuda_debug_anchor_hits(const fm_cuda_backend *b) {
    return b->anc_hits;
}

extern "C" double fm_cuda_debug_warm_ms(const fm_cuda_backend *b) {
    return b->warm_ms;
}

extern "C" void fm_cuda_debug_set_pdl(fm_cuda_backend *b, int on) {
    drop_graphs(b);
    b->use_pdl = on;
}

extern "C" void fm_cuda_debug_set_q8_reg_all(fm_cuda_backend *b, int on) {
    drop_graphs(b);
    fmc_q8_set_reg_all(on);
}

extern "C" void fm_cuda_debug_set_q8_rows_all(fm_cuda_backend *b, int on) {
    drop_graphs(b);
    fmc_q8_set_rows_all(on);
}

extern "C" int fm_cuda_debug_set_mega(fm_cuda_backend *b, int mode) {
    if (mode < 0) return b->use_mk;
    drop_graphs(b);
    b->use_mk = b->mk && mode <= MK_SHORT ? mode : MK_OFF;
    return b->use_mk;
}

/* The instance the trace reads: the verify blocks' after fm_cuda_debug_mega_trace(b, 2, NULL). */
static fmc_mk *traced_mk(const fm_cuda_backend *b) {
    return b->trace_verify ? b->mkv : b->mk;
}

extern "C" int fm_cuda_debug_mega_trace(fm_cuda_backend *b, int on, double *us) {
    if (!us) {
        if (b->mk) fmc_mk_trace(b->mk, 0);
        if (b->mkv) fmc_mk_trace(b->mkv, 0);
        b->trace_verify = on == 2;
        drop_graphs(b);
        return traced_mk(b) ? fmc_mk_trace(traced_mk(b), on != 0) : -1;
    }
    if (!traced_mk(b)) return -1;
    cudaStreamSynchronize(b->st);
    return fmc_mk_trace_read(traced_mk(b), us);
}

extern "C" int fm_cuda_debug_mega_blocks(fm_cuda_backend *b, double *us, int *info, int max_blocks) {
    if (!traced_mk(b)) return -1;
    cudaStreamSynchronize(b->st);
    return fmc_mk_trace_blocks(traced_mk(b), us, info, max_blocks);
}

extern "C" const char *fm_cuda_debug_mega(const fm_cuda_backend *b, int *stages, int *warps) {
    *stages = b->mk ? fmc_mk_stages(b->mk) : 0;
    *warps = b->mk ? fmc_mk_warps(b->mk) : 0;
    if (!b->mk) return b->mk_why;
    const int coop = fmc_mk_cooperative(b->mk);
    static const char *const state[3][2] = {{"off, plain launch", "off, cooperative launch"},
                                            {"on, plain launch", "on, cooperative launch"},
                                            {"on in the short attention form, plain launch",
                                             "on in the short attention form, cooperative launch"}};
    return state[b->use_mk][coop != 0];
}

extern "C" const char *fm_cuda_debug_mega_verify(const fm_cuda_backend *b, int *max_T) {
    *max_T = b->mkv && b->use_mkv ? fmc_mk_max_tokens(b->mkv) : 0;
    return !b->mkv ? b->mkv_why : b->use_mkv ? "on with the step's" : "off (FMC_MEGA_VERIFY=0)";
}

extern "C" void fm_cuda_debug_set_q8_gemv(fm_cuda_backend *b, int rd) {
    drop_graphs(b);
    fmc_q8_set_gemv(rd);
}

static uint64_t q8_bytes(const fmc_q8 *w) {
    return (uint64_t)w->N * w->K + (uint64_t)w->N * (w->K / 32) * 2;
}

extern "C" uint64_t fm_cuda_debug_step_bytes(const fm_cuda_backend *b) {
    uint64_t s = q8_bytes(&b->out);
    for (int l = 0; l < b->n_layers; l++)
        s += q8_bytes(&b->L[l].qkv) + q8_bytes(&b->L[l].wo) + q8_bytes(&b->L[l].gu) + q8_bytes(&b->L[l].down);
    return s;
}

/* One launch of kernel group `which` for layer l (or the lm_head) on T rows, as the forward issues it. */
static void time_one(fm_cuda_backend *b, int which, int l, int T, int pdl) {
    cudaStream_t s = b->st;
    const dlayer_t *L = &b->L[l];
    const fmc_q8_in xq_in = {b->xq1, b->xd1, NULL, 0, NULL, 0.f};
    const fmc_q8_in x_in = {b->xq0, b->xd0, b->x, b->dim, L->attn_norm, b->eps};
    __half *kc = b->kc + (size_t)l * b->n_ctx * b->kv_dim, *vc = b->vc + (size_t)l * b->n_ctx * b->kv_dim;
    switch (which) {
    case 0:
        fmc_q8_matmul(&L->qkv, &x_in, T, b->qkv, b->q_dim + 2 * b->kv_dim, 0, NULL, 0, pdl, s);
        break;
    case 1:
        fmc_q8_matmul(&L->wo, &xq_in, T, b->qkv, b->dim, 0, NULL, 0, pdl, s);
        break;
    case 2:
        fmc_q8_glu(&L->gu, &x_in, T, b->xq1, b->xd1, pdl, s);
        break;
    case 3:
        fmc_q8_matmul(&L->down, &xq_in, T, b->qkv, b->dim, 0, NULL, 0, pdl, s);
        break;
    case 4:
        fmc_q8_matmul(&b->out, &x_in, T, b->logits, b->vocab, 0, NULL, 0, pdl, s);
        break;
    case 6:
        dmm(b, &b->DL[l % b->dhp.n_layers].fc1, b->dh, b->dhp.dim, T, b->du, b->dhp.ffn,
            b->DL[l % b->dhp.n_layers].fc1_b, FMC_BF16_GELU, NULL, pdl);
        break;
    case 7:
        dmm(b, &b->DL[l % b->dhp.n_layers].fc2, b->du, b->dhp.ffn, T, b->dx, b->dhp.dim,
            b->DL[l % b->dhp.n_layers].fc2_b, FMC_BF16_GATE_ADD, b->mods, pdl);
        break;
    default:
        fmc_attention_q8(b->q, T, b->n_heads, b->n_kv, b->hd, kc, vc, b->d_pos, 1, b->max_splits, b->part,
                         b->xq1, b->xd1, b->att_form, pdl, s);
    }
}

/* Median milliseconds of `reps` replays (after 2) of the graph that record() captures on the backend's
 * stream, or < 0 on error. */
template <class F> static double time_captured(fm_cuda_backend *b, F &&record, int reps) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    if (cudaStreamBeginCapture(b->st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return -1;
    record();
    if (cudaStreamEndCapture(b->st, &g) != cudaSuccess) return -1;
    const cudaError_t e = cudaGraphInstantiate(&ge, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) return -1;
    const double ms = fmc_median_ms([&] { cudaGraphLaunch(ge, b->st); }, b->st, 2, reps);
    cudaGraphExecDestroy(ge);
    return cudaGetLastError() != cudaSuccess ? -1 : ms;
}

extern "C" double fm_cuda_debug_time_kernel(fm_cuda_backend *b, int which, int T, int pdl, uint64_t *bytes) {
    if (which >= 6 && (!b->has_drafter || T > b->dhp.block)) return -1;
    const int reps = which == 4 ? 4 : which >= 6 ? b->dhp.n_layers : b->n_layers;
    const fmc_q8 *w = which == 0   ? &b->L[0].qkv
                      : which == 1 ? &b->L[0].wo
                      : which == 2 ? &b->L[0].gu
                      : which == 3 ? &b->L[0].down
                                   : &b->out;
    const dmat_t *dm = which == 6 ? &b->DL[0].fc1 : which == 7 ? &b->DL[0].fc2 : NULL;
    *bytes = which <= 4 ? q8_bytes(w)
             : dm       ? (dm->is_q8 ? q8_bytes(&dm->q) : (uint64_t)b->dhp.dim * b->dhp.ffn * 2)
                        : 0;
    *b->h_pos = b->pos > 0 ? b->pos - 1 : 0;
    cudaMemcpy(b->d_pos, b->h_pos, 4, cudaMemcpyHostToDevice);
    const double ms = time_captured(
        b,
        [&] {
            for (int i = 0; i < reps; i++) time_one(b, which, i % b->n_layers, T, pdl);
        },
        10);
    return ms < 0 ? -1 : ms * 1e3 / reps;
}

/* ---- the persistent-launch experiment (cuda_q8_persist.cu) ---- */

/* The step's 145 one-token products in the order a step runs them, on the step's activation buffers (their
 * contents are whatever the last eval left: timing, and the bit-for-bit check, need no meaning). */
static int persist_products(fm_cuda_backend *b, fmc_persist_product *pr) {
    int n = 0;
    for (int l = 0; l < b->n_layers; l++) {
        const dlayer_t *L = &b->L[l];
        pr[n++] = {&L->qkv, b->xq0, b->xd0, FMC_PERSIST_STORE, b->qkv, b->q_dim + 2 * b->kv_dim};
        pr[n++] = {&L->wo, b->xq1, b->xd1, FMC_PERSIST_ADD, b->x, b->dim};
        pr[n++] = {&L->gu, b->xq0, b->xd0, FMC_PERSIST_GLU, NULL, 0};
        pr[n++] = {&L->down, b->xq1, b->xd1, FMC_PERSIST_ADD, b->x, b->dim};
    }
    pr[n++] = {&b->out, b->xq0, b->xd0, FMC_PERSIST_STORE, b->logits, b->vocab};
    return n;
}

/* One product as the engine launches it (no quantiser: its activations are in place). */
static void launch_product(fm_cuda_backend *b, const fmc_persist_product *p, int pdl) {
    const fmc_q8_in in = {(int8_t *)p->xq, (float *)p->xd, NULL, 0, NULL, 0.f};
    if (p->mode == FMC_PERSIST_GLU)
        fmc_q8_glu(p->w, &in, 1, b->xq1, b->xd1, pdl, b->st);
    else
        fmc_q8_matmul(p->w, &in, 1, p->y, p->ldy, p->mode == FMC_PERSIST_ADD, NULL, 0, pdl, b->st);
}

/* One product by the engine's launch (form < 0, pdl off) or by a persistent form; its output copied to host.
 */
static int persist_one(fm_cuda_backend *b, const fmc_persist_product *p, int form, unsigned *done,
                       std::vector<unsigned char> &out) {
    const int glu = p->mode == FMC_PERSIST_GLU;
    void *o = glu ? (void *)b->xq1 : (void *)p->y;
    const size_t bytes = glu ? (size_t)p->w->N / 2 / 32 * 256 : (size_t)p->w->N * 4; /* token 0's rows */
    int grid = 0, smem = 0;
    out.resize(bytes);
    cudaMemset(o, 0, bytes);
    if (form < 0)
        launch_product(b, p, 0);
    else {
        if (fmc_q8_persist_prepare(p, 1, b->xq1, b->xd1, form, &grid, &smem)) return -1;
        fmc_q8_persist_launch(form, done, 1, 1, grid, smem, b->st);
    }
    return cudaStreamSynchronize(b->st) != cudaSuccess ||
                   cudaMemcpy(out.data(), o, bytes, cudaMemcpyDeviceToHost) != cudaSuccess
               ? -1
               : 0;
}

extern "C" double fm_cuda_debug_persist(fm_cuda_backend *b, int form, int waits) {
    fmc_persist_product pr[4 * 40 + 1];
    if (b->n_layers > 40 || form >= FMC_PERSIST_FORMS) return -1;
    const int n = persist_products(b, pr);
    static unsigned *done = NULL;
    if (!done && cudaMalloc(&done, sizeof(unsigned) * n) != cudaSuccess) return -1;
    if (waits < 0) { /* the form against the engine, bit for bit: each kind of product, and the lm_head */
        const int pick[] = {0, 1, 2, 3, n - 1};
        int differ = 0;
        for (int k : pick) {
            std::vector<unsigned char> A, B;
            if (persist_one(b, &pr[k], -1, done, A) || persist_one(b, &pr[k], form, done, B)) return -1;
            differ += A != B;
        }
        return differ;
    }
    int grid = 0, smem = 0;
    if (form >= 0 && fmc_q8_persist_prepare(pr, n, b->xq1, b->xd1, form, &grid, &smem)) return -1;
    return time_captured(
        b,
        [&] {
            if (form >= 0)
                fmc_q8_persist_launch(form, done, n, waits, grid, smem, b->st);
            else
                for (int i = 0; i < n; i++) launch_product(b, &pr[i], waits);
        },
        20);
}
