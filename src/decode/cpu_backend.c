/* cpu_backend.c: fm_decode_backend on the CPU. Feature rows of plain steps and prefill chunks wait in
 * `pending` until the next draft needs them, so a stretch of plain steps costs the drafter one batched
 * context update instead of one per token (its fc matrix alone is 12800 x 2048). */
#include "decode/cpu_backend.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "decode/sampler.h"

struct fm_cpu_backend {
    const qwen3_model *model;
    qwen3_state *state;
    fm_drafter *drafter;
    fm_pool *pool;
    int max_eval;
    float *pending; /* [pending_cap][feature width]: rows not yet in the drafter's context */
    int pending_rows, pending_start, pending_cap;
    fm_sampling sampling;
    fm_candidate *candidates; /* [pool workers][vocab], once sampling is on */
    int *counts;              /* [pool workers][vocab] zeroed, once penalties are on */
    const int32_t *seq;       /* set_history: the sequence so far, of which the last n_gen were generated */
    int n_seq, n_gen;
    fm_penalty *pen; /* [pool workers][pen_cap]: a row's penalty list */
    int pen_cap;
};

typedef struct {
    const fm_cpu_backend *b;
    float *logits;
    int pos0;
    const int32_t *extra; /* penalties: row r also counts extra[0..r) (a verify block's drafts); or NULL */
    int penalize;
    int32_t *out;
} sample_job;

static void sample_task(void *ctx, int64_t begin, int64_t end, int thread) {
    const sample_job *j = ctx;
    const fm_cpu_backend *b = j->b;
    const int vocab = b->model->hp.vocab;
    /* No candidates when greedy with penalties (fm_sample_row then reads none). */
    fm_candidate *scratch = b->candidates ? b->candidates + (size_t)thread * vocab : NULL;
    for (int64_t r = begin; r < end; r++) {
        float *row = j->logits + r * vocab;
        if (j->penalize)
            fm_sample_penalize(row, &b->sampling, b->seq, b->n_seq, b->n_gen, j->extra, j->extra ? (int)r : 0,
                               b->counts + (size_t)thread * vocab, b->pen + (size_t)thread * b->pen_cap);
        j->out[r] = fm_sample_row(row, vocab, &b->sampling, j->pos0 + (int)r, scratch);
    }
}

/* The tokens of rows 0..rows-1 of logits (positions pos0 ..), the rows spread over the pool's workers; with
 * penalties the rows are penalised in place first (extra as in sample_job). */
static void sample_rows(fm_cpu_backend *b, float *logits, int rows, int pos0, const int32_t *extra,
                        int penalize, int32_t *out) {
    sample_job j = {b, logits, pos0, extra, penalize, out};
    fm_pool_for(b->pool, rows, 1, sample_task, &j);
}

int fm_cpu_backend_create(const qwen3_model *m, fm_drafter *drafter, fm_pool *pool, int n_ctx, int max_eval,
                          const int *capture, int n_capture, fm_cpu_backend **out, char *err, size_t errlen) {
    *out = NULL;
    fm_cpu_backend *b = calloc(1, sizeof *b);
    if (!b) return fm_set_error(err, errlen, "out of memory");
    qwen3_state_params sp = {
        .n_ctx = n_ctx, .max_batch = max_eval, .capture_layers = capture, .n_capture = n_capture};
    if (qwen3_state_create(m, &sp, &b->state, err, errlen)) {
        free(b);
        return -1;
    }
    b->model = m;
    b->drafter = drafter;
    b->pool = pool;
    b->max_eval = max_eval;
    *out = b;
    return 0;
}

void fm_cpu_backend_free(fm_cpu_backend *b) {
    if (!b) return;
    qwen3_state_free(b->state);
    free(b->pending);
    free(b->candidates);
    free(b->counts);
    free(b->pen);
    free(b);
}

static int cpu_pos(void *ctx) {
    return qwen3_state_pos(((fm_cpu_backend *)ctx)->state);
}

/* Room for a row's penalty list: the history and a verify block's drafts. */
static int reserve_penalties(fm_cpu_backend *b, char *err, size_t errlen) {
    const int need = b->n_seq + b->max_eval;
    if (need <= b->pen_cap) return 0;
    const size_t workers = b->pool ? (size_t)fm_pool_size(b->pool) : 1;
    fm_penalty *p = realloc(b->pen, workers * (size_t)need * 2 * sizeof *p);
    if (!p) return fm_set_error(err, errlen, "out of memory for the penalties");
    b->pen = p, b->pen_cap = need * 2;
    return 0;
}

static int cpu_eval(void *ctx, const int32_t *ids, int n, int all_rows, int32_t *argmax, char *err,
                    size_t errlen) {
    fm_cpu_backend *b = ctx;
    const int pos = qwen3_state_pos(b->state), rows = all_rows ? n : 1;
    const qwen3_out out = !argmax ? QWEN3_OUT_NONE : all_rows ? QWEN3_OUT_ALL_ARGMAX : QWEN3_OUT_LAST_LOGITS;
    if (qwen3_forward(b->model, b->state, b->pool, ids, n, out, err, errlen)) return -1;
    if (!argmax) return 0;
    const int penalize = fm_sampling_penalized(&b->sampling);
    if (penalize && reserve_penalties(b, err, errlen)) return -1;
    if (fm_sampling_greedy(&b->sampling) && !penalize) {
        memcpy(argmax, qwen3_state_argmax(b->state), (size_t)rows * sizeof *argmax);
        return 0;
    }
    /* The state's logits are this eval's own: penalties may change them in place. */
    sample_rows(b, (float *)qwen3_state_logits(b->state), rows, pos + n - rows, all_rows ? ids + 1 : NULL,
                penalize, argmax);
    return 0;
}

static void cpu_set_history(void *ctx, const int32_t *seq, int n, int n_gen) {
    fm_cpu_backend *b = ctx;
    b->seq = seq, b->n_seq = n, b->n_gen = n_gen;
}

static int cpu_set_sampling(void *ctx, const fm_sampling *s, char *err, size_t errlen) {
    fm_cpu_backend *b = ctx;
    const size_t workers = b->pool ? (size_t)fm_pool_size(b->pool) : 1, vocab = b->model->hp.vocab;
    if (!fm_sampling_greedy(s) && !b->candidates) {
        b->candidates = malloc(workers * vocab * sizeof *b->candidates);
        if (!b->candidates) return fm_set_error(err, errlen, "out of memory for the sampler");
    }
    if (fm_sampling_penalized(s) && !b->counts) {
        b->counts = calloc(workers * vocab, sizeof *b->counts);
        if (!b->counts) return fm_set_error(err, errlen, "out of memory for the penalties");
    }
    b->sampling = *s;
    return 0;
}

static void cpu_rewind(void *ctx, int pos) {
    fm_cpu_backend *b = ctx;
    qwen3_state_rewind(b->state, pos);
    /* Pending rows past the new end describe tokens that are gone. */
    if (b->pending_rows && b->pending_start + b->pending_rows > pos)
        b->pending_rows = pos > b->pending_start ? pos - b->pending_start : 0;
}

static int flush(fm_cpu_backend *b, char *err, size_t errlen) {
    const int fw = qwen3_state_feature_width(b->state);
    for (int r = 0; r < b->pending_rows; r += b->max_eval) {
        const int n = b->pending_rows - r < b->max_eval ? b->pending_rows - r : b->max_eval;
        if (fm_drafter_extend_context(b->drafter, b->pool, b->pending + (size_t)r * fw, n,
                                      b->pending_start + r, err, errlen))
            return -1;
    }
    b->pending_rows = 0;
    return 0;
}

static int cpu_commit_features(void *ctx, int n, int start, char *err, size_t errlen) {
    fm_cpu_backend *b = ctx;
    if (!b->drafter || n <= 0) return 0;
    const int fw = qwen3_state_feature_width(b->state);
    /* Rows must follow the pending ones; anything else (a round's overwrite) flushes first. */
    if (b->pending_rows && b->pending_start + b->pending_rows != start && flush(b, err, errlen)) return -1;
    if (b->pending_rows == 0) b->pending_start = start;
    if (b->pending_rows + n > b->pending_cap) {
        int cap = b->pending_cap ? b->pending_cap : 64;
        while (cap < b->pending_rows + n) cap *= 2;
        float *p = realloc(b->pending, (size_t)cap * fw * sizeof *p);
        if (!p) return fm_set_error(err, errlen, "out of memory for drafter context rows");
        b->pending = p;
        b->pending_cap = cap;
    }
    memcpy(b->pending + (size_t)b->pending_rows * fw, qwen3_state_features(b->state),
           (size_t)n * fw * sizeof(float));
    b->pending_rows += n;
    return 0;
}

static int cpu_draft(void *ctx, int32_t anchor, int pos, int n_out, int32_t *out, char *err, size_t errlen) {
    fm_cpu_backend *b = ctx;
    if (!b->drafter) return fm_set_error(err, errlen, "no drafter loaded");
    if (flush(b, err, errlen) || fm_drafter_draft(b->drafter, b->pool, anchor, pos, n_out, out, err, errlen))
        return -1;
    float *rows = (float *)fm_drafter_last_logits(b->drafter);
    if (fm_sampling_penalized(&b->sampling) && b->seq) {
        /* Slot j is checked against the verify row that counts the drafts before it: penalised the same
         * way, one slot after the other, it proposes what that row will choose when the drafter's row
         * agrees with the target's (drafts that ignore a penalty the target applies are rejected). */
        if (reserve_penalties(b, err, errlen)) return -1;
        const int vocab = b->model->hp.vocab;
        for (int j = 0; j < n_out; j++) {
            float *row = rows + (size_t)j * vocab;
            fm_sample_penalize(row, &b->sampling, b->seq, b->n_seq, b->n_gen, out, j, b->counts, b->pen);
            out[j] = fm_sample_row(row, vocab, &b->sampling, pos + j, b->candidates);
        }
    } else if (!fm_sampling_greedy(&b->sampling)) {
        /* Each slot drawn as the target will draw the row it is checked against (coupled drafts). */
        sample_rows(b, rows, n_out, pos, NULL, 0, out);
    }
    return 0;
}

static void cpu_reset(void *ctx) {
    fm_cpu_backend *b = ctx;
    qwen3_state_rewind(b->state, 0);
    b->pending_rows = 0;
    if (b->drafter) fm_drafter_reset(b->drafter);
}

fm_decode_backend fm_cpu_backend_ops(fm_cpu_backend *b) {
    fm_decode_backend ops = {
        .ctx = b,
        .n_ctx = qwen3_state_n_ctx(b->state),
        .vocab = b->model->hp.vocab,
        .max_eval = b->max_eval,
        .block = b->drafter ? fm_drafter_block(b->drafter) : 0,
        .drafter_ctx = b->drafter ? fm_drafter_max_ctx(b->drafter) : 0,
        .row_granule = fm_matrix_batch_granule(&b->model->layers[0].w_gate),
        .pos = cpu_pos,
        .eval = cpu_eval,
        .set_sampling = cpu_set_sampling,
        .set_history = cpu_set_history,
        .rewind = cpu_rewind,
        .commit_features = cpu_commit_features,
        .draft = cpu_draft,
        .reset = cpu_reset,
    };
    return ops;
}
