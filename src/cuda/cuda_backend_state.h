/* cuda_backend_state.h: the CUDA backend's state (struct fm_cuda_backend) and the functions that its files
 * share: cuda_backend.cu (the target, graphs, sampling, the backend's ops), cuda_drafter.cu (the drafter) and
 * cuda_backend_debug.cu (the hooks of cuda_debug.h for tests and benchmarks). Private to those files. */
#ifndef FM_CUDA_BACKEND_STATE_H
#define FM_CUDA_BACKEND_STATE_H

#include <stdio.h>

#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_kernels.cuh"
#include "cuda/cuda_sample.cuh"
#include "decode/sampler.h"
#include "drafter/drafter_internal.h"

enum { MODE_NONE = 0, MODE_LAST = 1, MODE_ALL = 2, MAX_GRAPHS = 96, GRAPH_MAX_T = 32, DRAFT_ROWS = 64 };
/* Sampling candidates a row brings back from the GPU; a row with more is read whole. */
enum { SAMPLE_CAP = 2048 };

typedef struct {
    fmc_q8 qkv, wo, gu, down; /* gu: [gate; up] */
    float *attn_norm, *q_norm, *k_norm, *ffn_norm;
} dlayer_t;

/* A drafter matrix: BF16 (h) or Q8_0 (q, when is_q8). */
typedef struct {
    int is_q8;
    fmc_q8 q;
    fmc_bf16 h;
} dmat_t;

typedef struct {
    dmat_t sqkv, so, cq, co, fc1, fc2;
    float *fc1_b, *fc2_b, *sq_norm, *sk_norm, *cq_norm, *ck_norm;
    __half *kc, *vc; /* [max_ctx][D] */
} ddlayer_t;

typedef struct {
    int T, mode, form; /* form: the attention's (FMC_ATT_SHORT / _LONG) */
    cudaGraphExec_t exec;
} graph_t;

struct fm_cuda_backend {
    /* target shape */
    int n_layers, dim, n_heads, n_kv, hd, ffn, vocab, q_dim, kv_dim;
    float eps;
    int n_ctx, max_eval, n_capture, fw, max_splits, rows_cap, maxK;
    int *cap_slot; /* [n_layers] */
    int pos;
    cudaStream_t st;
    std::vector<void *> *allocs;
    /* target weights */
    fmc_q8 tok, out;
    float *out_norm, *rope;
    dlayer_t *L;
    __half *kc, *vc; /* [n_layers][n_ctx][kv_dim] */
    /* activations, [rows_cap] rows; quantised ones in fragment order, two sets: xq0 holds the normalised
     * input of qkv / gate-up / lm_head, xq1 the attention output and the SiLU-gate output */
    float *x, *qkv, *q, *feat, *logits, *part, *xd0, *xd1;
    int8_t *xq0, *xq1;
    int32_t *d_ids;
    unsigned long long *d_am; /* packed argmax (fmc_argmax) */
    int *d_pos;
    int32_t *h_ids; /* pinned */
    unsigned long long *h_am;
    int *h_pos;
    int last_logit_rows, last_rows;
    /* sampling (decode/sampler.h, cuda_sample.cuh): greedy until set_sampling says otherwise; only each
     * row's candidates or its draw come back, and the host draws from candidates with the CPU's code */
    fm_sampling sampling;
    void *d_res, *h_res; /* what comes back, one copy: the three arrays below, on the device and pinned */
    int *d_cnt, *h_cnt;  /* [rows_cap] */
    unsigned long long *d_pick, *h_pick; /* [rows_cap] */
    fmc_candidate *d_cand, *h_cand;      /* [rows_cap][SAMPLE_CAP] */
    fmc_sample_scratch sscr;
    fm_candidate *cand; /* [vocab] */
    float *h_row;       /* [vocab]: a row with more than SAMPLE_CAP candidates */
    /* penalties: the sequence so far (set_history; its last n_gen generated), each row's (id, delta, scale)
     * list built on the host */
    const int32_t *seq;
    int n_seq, n_gen, pen_cap;
    int *pen_counts;            /* [vocab] zeroed */
    int *h_pen_off, *d_pen_off; /* [rows_cap + 1] */
    fm_penalty *h_pen, *d_pen;  /* [pen_cap] */
    float *d_draft_raw;         /* [block][vocab]: a draft's unpenalised logits (draft_penalized) */
    int32_t *h_hist;            /* [hist_cap]: the history and the final draft slots */
    int hist_cap;
    /* the one-token forward in one persistent launch (cuda_megakernel.cu; NULL where the device or the
     * model cannot take it, mk_why says why), used for steps by use_mk (MK_OFF, MK_ALWAYS, MK_SHORT); and
     * its instance for verify blocks of 2 .. fmc_mk_max_tokens rows (mkv, mkv_why), by the same rule
     * unless use_mkv is 0 (FMC_MEGA_VERIFY=0) */
    fmc_mk *mk, *mkv;
    int use_mk, use_mkv, trace_verify; /* trace_verify: the phase clock is the verify instance's */
    char mk_why[160], mkv_why[160];
    /* graphs, programmatic dependent launch */
    int use_graphs, use_pdl, n_graphs;
    double warm_ms; /* the graphs captured at creation (warm_graphs) took this long */
    graph_t graphs[MAX_GRAPHS];
    /* [heads of 8 rows, of the whole block][attention form][anchor slot: its own chain, a verify row's] */
    cudaGraphExec_t draft_exec[2][2][2];
    int att_form; /* the attention form of the forward or draft being captured / launched */
    /* drafter (has_drafter == 0: none) */
    int has_drafter;
    fm_drafter_hparams dhp;
    int dmax_ctx, dlength;
    dmat_t fc, anchor_proj, head;
    dmat_t ckv; /* every layer's cross K/V [k0; v0; k1; v1; ...]: all read the same context rows */
    float *dkv; /* [DRAFT_ROWS][n_layers][2 dim] */
    int d_rows; /* rows of the head, lm_head and argmax in the draft being captured / launched */
    int d_anc;  /* 1: that draft's anchor slot K/V was made with a verify block's rows (anc_*) */
    float *anchor_b, *head_b, *hidden_norm, *anchor_norm, *mods, *slot_input, *inv_freq;
    ddlayer_t *DL;
    float *dx, *dh, *dqkv, *datt, *du, *dtmp, *dhead, *dlogits;
    float2 *drope; /* [block][head_dim / 2] (cos, sin) of the draft's slots (fmc_dr_slots) */
    int8_t *dxq;   /* the Q8_0 matrices' quantised activations (fragment order), DRAFT_ROWS rows */
    float *dxd;
    /* The side stream: context rows (drafter_extend) and a draft's anchor slot run there, beside the main
     * stream's first layer up to its cross-attention, with buffers of their own (rows of fc / anchor_proj,
     * their norm, their products' quantised activations). ev_main: the main stream's work so far (the side
     * stream's start); ev_ctx: the last context rows written; ev_fork / ev_join: a draft's side branch. */
    cudaStream_t st2;
    cudaEvent_t ev_main, ev_ctx, ev_fork, ev_join;
    float *dsx, *dsh;
    int8_t *dsxq;
    float *dsxd;
    unsigned long long *dam;
    int32_t *d_anchor;
    int *d_dpos;
    int dsplits;                 /* FMC_ATT_SPLIT-key splits of the drafter's context */
    fmc_dr_kv_layers dkv_layers; /* every layer's cross key norm and K/V caches, for fmc_dr_kv_rows */
    float *dpart;                /* [block][n_heads][dsplits][head_dim + 2] */
    float *pending;              /* [pend_cap][fw] */
    int pend_rows, pend_start, pend_cap;
    /* A verify block's rows, extended into the drafter's context on the side stream as soon as the block
     * is launched (drafter_verify_rows), before the loop knows how many it keeps: the commit that follows
     * keeps a prefix of them and copies nothing. spec_feat [block + 1][fw] holds the block's features (the
     * next forward overwrites feat while the side stream may still read them). early_rows: 0 turns it
     * off (FMC_EARLY_ROWS=0, fm_cuda_debug_set_early_rows). */
    float *spec_feat;
    int spec_start, spec_rows, early_rows;
    /* The anchor slot of every row's token, made with the block's rows: where the loop decodes greedily,
     * the next anchor is the argmax of the row after the drafts it keeps. Its slot's K/V (embedding,
     * anchor_proj, norm, cross K/V product; not yet normed or rotated) for each of the block's argmaxes
     * (spec_am, a copy of d_am) go through the same products as the rows: dkv rows anc_rows + i, i <
     * anc_rows (after the block's own rows), hold token anc_tok[i]'s, until the side stream's next chain
     * writes dkv. spec_emb [block + 1][target_dim]: their embeddings. early_anchor: 1 turns it on
     * (FMC_EARLY_ANCHOR=1, fm_cuda_debug_set_early_rows; off by default: no gain shown yet); anc_hits counts
     * the drafts that took one (the tests' evidence). */
    unsigned long long *spec_am;
    float *spec_emb;
    int anc_start, anc_rows, early_anchor;
    int32_t anc_tok[FM_DRAFTER_MAX_BLOCK + 1];
    long anc_hits;
};

/* How steps use the persistent kernel (use_mk): never, always, while the attention takes its short form. */
enum { MK_OFF, MK_ALWAYS, MK_SHORT };

/* ---- what cuda_backend.cu and cuda_drafter.cu share ---- */

/* Functions that take (char *err, size_t errlen): a failed CUDA call writes its message and returns -1. */
#define CK(call)                                                                                             \
    do {                                                                                                     \
        cudaError_t e_ = (call);                                                                             \
        if (e_ != cudaSuccess) {                                                                             \
            snprintf(err, errlen, "cuda: %s failed: %s (%s:%d)", #call, cudaGetErrorString(e_), __FILE__,    \
                     __LINE__);                                                                              \
            return -1;                                                                                       \
        }                                                                                                    \
    } while (0)

static inline int fail(char *err, size_t errlen, const char *msg) {
    snprintf(err, errlen, "%s", msg);
    return -1;
}

static inline int dalloc(fm_cuda_backend *b, void **p, size_t bytes, char *err, size_t errlen) {
    *p = NULL;
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "cuda: out of device memory for %zu bytes (%s)", bytes, cudaGetErrorString(e));
        return -1;
    }
    b->allocs->push_back(*p);
    return 0;
}
#define DALLOC(ptr, bytes)                                                                                   \
    do {                                                                                                     \
        void *p_;                                                                                            \
        if (dalloc(b, &p_, (bytes), err, errlen)) return -1;                                                 \
        ptr = (decltype(ptr))p_;                                                                             \
    } while (0)

/* The attention form for a forward or draft whose longest row attends to n positions: the long-context
 * form past ATT_LONG_FROM (fmc_attention_q8). On the H200 (plain steps, both forms in one device call, three
 * rounds) the short form was 2.2 % faster at 640 and 768 positions, equal at 896, 1.8 % slower at 1024 and
 * 3.5 % at 1536, 21 % at 16k. Both forms give the same bits, so where a decode switches changes no token. */
enum { ATT_LONG_FROM = 960 };
static inline int att_form_at(int n) {
    return n > ATT_LONG_FROM ? FMC_ATT_LONG : FMC_ATT_SHORT;
}

int upload_f32(fm_cuda_backend *b, float **dst, const float *src, size_t n, char *err, size_t errlen);
/* Uploads the Q8_0 matrices parts[0..n) stacked by rows into one tiled matrix (glu: [gate; up] of
 * fmc_q8_glu); upload_bf16 the same for BF16. */
int upload_q8(fm_cuda_backend *b, fmc_q8 *dst, const fm_matrix *const *parts, int n, int glu,
              const char *what, char *err, size_t errlen);
int upload_bf16(fm_cuda_backend *b, fmc_bf16 *dst, const fm_matrix *const *parts, int n, const char *what,
                char *err, size_t errlen);
/* Captures fn(b, T, mode) into an executable graph. */
int capture(fm_cuda_backend *b, void (*fn)(fm_cuda_backend *, int, int), int T, int mode,
            cudaGraphExec_t *out, char *err, size_t errlen);
/* Draws rows 0..rows-1 of logits (row r at position pos0 + r; am: their argmax) with the backend's sampling
 * into out. */
int sample_rows(fm_cuda_backend *b, const float *logits, const unsigned long long *am, int rows, int pos0,
                int32_t *out, char *err, size_t errlen);
/* Room for n penalty entries, on the host and on the GPU. */
int reserve_penalties(fm_cuda_backend *b, int n, char *err, size_t errlen);
/* Applies the lists at h_pen (k entries, row r's from h_pen_off[r]) to rows 0..rows-1 of logits in place
 * and recomputes their argmax into am. */
int apply_penalties(fm_cuda_backend *b, float *logits, unsigned long long *am, int rows, int k, char *err,
                    size_t errlen);

/* cuda_drafter.cu: the drafter's weights and buffers; the draft graph's shape g (0: the head for 8 slots, 1:
 * for the whole block), captured with `graph` if it is not yet; the backend's commit_features and draft. */
int create_drafter(fm_cuda_backend *b, const fm_drafter *d, char *err, size_t errlen);
int draft_shape(fm_cuda_backend *b, int g, int graph, char *err, size_t errlen);
int cu_commit_features(void *ctx, int n, int start, char *err, size_t errlen);
int cu_draft(void *ctx, int32_t anchor, int pos, int n_out, int32_t *out, char *err, size_t errlen);

/* Waits for the stream, then destroys every captured graph (a setting they depend on changed). */
void drop_graphs(fm_cuda_backend *b);
/* y = w x (+ bias, epilogue mode) for T rows of a drafter matrix, on the matrix's product. */
void dmm(fm_cuda_backend *b, const dmat_t *w, const float *x, int ldx, int T, float *y, int ldy,
         const float *bias, int mode, const float *gate, int pdl);
/* The pending feature rows into the drafter's context (drafter_extend), if any. */
int flush_pending(fm_cuda_backend *b, char *err, size_t errlen);
/* n feature rows of src (rows of fw) into the drafter's context cache at start: on the side stream, after
 * the main stream's work so far; the main stream's later work waits for it. */
int drafter_extend(fm_cuda_backend *b, const float *src, int n, int start, char *err, size_t errlen);
/* After a verify block of n rows at b->pos was launched (cu_eval, which clears spec_rows before each
 * forward): its rows into the drafter's context early (see spec_feat), where nothing is pending and they
 * fit; otherwise nothing. */
int drafter_verify_rows(fm_cuda_backend *b, int n, char *err, size_t errlen);
/* The block's tokens ids [n] as cu_eval read them back: the anchor slots drafter_verify_rows made are
 * those of these tokens (anc_tok); without them (n other than its rows) none are kept. */
void drafter_verify_tokens(fm_cuda_backend *b, const int32_t *ids, int n);
/* The side stream and its events and buffers (create_drafter; fm_cuda_backend_free releases them). */
void free_side(fm_cuda_backend *b);

#endif
