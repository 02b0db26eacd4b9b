/* cuda_backend_state.h: the CUDA backend's state (struct fm_cuda_backend) and the few functions of
 * cuda_backend.cu that its diagnostics (cuda_backend_debug.cu: the hooks of cuda_debug.h for tests and
 * benchmarks) call. Private to those two files. */
#ifndef FM_CUDA_BACKEND_STATE_H
#define FM_CUDA_BACKEND_STATE_H

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
    int *cap_slot;    /* [n_layers] */
    float *gemm_part; /* split-K scratch shared by every product (fmc_split) */
    unsigned *gemm_cnt;
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
    cudaGraphExec_t draft_exec[2][2]; /* [heads of 8 rows, of the whole block][attention form] */
    int att_form; /* the attention form of the forward or draft being captured / launched */
    /* drafter (has_drafter == 0: none) */
    int has_drafter;
    fm_drafter_hparams dhp;
    int dmax_ctx, dlength;
    dmat_t fc, anchor_proj, head;
    dmat_t ckv; /* every layer's cross K/V [k0; v0; k1; v1; ...]: all read the same context rows */
    float *dkv; /* [DRAFT_ROWS][n_layers][2 dim] */
    int d_rows; /* rows of the head, lm_head and argmax in the draft being captured / launched */
    float *anchor_b, *head_b, *hidden_norm, *anchor_norm, *mods, *slot_input, *inv_freq;
    ddlayer_t *DL;
    float *dx, *dh, *dqkv, *datt, *du, *dtmp, *dhead, *dlogits;
    float2 *drope; /* [block][head_dim / 2] (cos, sin) of the draft's slots (fmc_dr_slots) */
    int8_t *dxq;   /* the Q8_0 matrices' quantised activations (fragment order), DRAFT_ROWS rows */
    float *dxd;
    unsigned long long *dam;
    int32_t *d_anchor;
    int *d_dpos;
    int dsplits;                 /* FMC_ATT_SPLIT-key splits of the drafter's context */
    fmc_dr_kv_layers dkv_layers; /* every layer's cross key norm and K/V caches, for fmc_dr_kv_rows */
    float *dpart;                /* [block][n_heads][dsplits][head_dim + 2] */
    float *pending;              /* [pend_cap][fw] */
    int pend_rows, pend_start, pend_cap;
};

/* How steps use the persistent kernel (use_mk): never, always, while the attention takes its short form. */
enum { MK_OFF, MK_ALWAYS, MK_SHORT };

/* Waits for the stream, then destroys every captured graph (a setting they depend on changed). */
void drop_graphs(fm_cuda_backend *b);
/* y = w x (+ bias, epilogue mode) for T rows of a drafter matrix, on the matrix's product. */
void dmm(fm_cuda_backend *b, const dmat_t *w, const float *x, int ldx, int T, float *y, int ldy,
         const float *bias, int mode, const float *gate, int pdl);
/* The pending feature rows into the drafter's context (drafter_extend), if any. */
int flush_pending(fm_cuda_backend *b, char *err, size_t errlen);
/* n feature rows of src (rows of fw) into the drafter's context cache at start. */
int drafter_extend(fm_cuda_backend *b, const float *src, int n, int start, char *err, size_t errlen);

#endif
