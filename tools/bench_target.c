/* bench_target.c: see bench_target.h. This tool reaches into the engine (engine_internal.h) for its loaded
 * model, drafter, thread pool and capture layers, so the timings use exactly what generation uses.
 *
 * Invariant between calls: the bench state's KV cache holds prompt[0 .. prompt_len); the drafter's context is
 * restored from a saved copy of the prompt's feature rows whenever something else (a session) reset it. */
#include "bench_target.h"

#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "core/error.h"
#include "engine_internal.h"

struct bench_target {
    fm_engine *e;
    qwen3_state *state;
    int32_t *prompt; /* [prefill_len] */
    int prompt_len, prefill_len, chunk;
    int32_t anchor;  /* the target's greedy token after the prompt */
    float *features; /* [prompt_len][feature width]: the prompt's captured rows, for the drafter's context */
    int feat_width;
};

enum { BENCH_MAX_T = 17 };

void bench_target_free(bench_target *b) {
    if (!b) return;
    qwen3_state_free(b->state);
    free(b->prompt);
    free(b->features);
    free(b);
}

/* Brings the KV cache back to exactly the prompt (its rows are never changed, only later ones dropped). */
static void restore_prompt(bench_target *b) {
    qwen3_state_rewind(b->state, b->prompt_len);
}

int bench_target_create(fm_engine *e, const int32_t *prompt, int prompt_len, int prefill_len,
                        bench_target **out, char *err, size_t errlen) {
    *out = NULL;
    if (prompt_len < 1 || prompt_len > prefill_len)
        return fm_set_error(err, errlen, "bench: prompt length %d must be in 1 .. %d", prompt_len,
                            prefill_len);
    if (prompt_len > e->prefill_chunk)
        return fm_set_error(err, errlen, "bench: prompt length %d exceeds the prefill chunk %d", prompt_len,
                            e->prefill_chunk);
    bench_target *b = calloc(1, sizeof *b);
    if (!b) return fm_set_error(err, errlen, "out of memory");
    b->e = e;
    b->prompt_len = prompt_len;
    b->prefill_len = prefill_len;
    b->chunk = e->prefill_chunk;
    b->prompt = malloc((size_t)prefill_len * sizeof *b->prompt);
    if (!b->prompt) goto oom;
    memcpy(b->prompt, prompt, (size_t)prefill_len * sizeof *prompt);
    qwen3_state_params sp = {
        .n_ctx = prefill_len + BENCH_MAX_T + 1,
        .max_batch = b->chunk > BENCH_MAX_T ? b->chunk : BENCH_MAX_T,
        .capture_layers = e->capture,
        .n_capture = e->n_capture,
    };
    if (qwen3_state_create(e->model, &sp, &b->state, err, errlen)) goto fail;
    if (qwen3_forward(e->model, b->state, e->pool, b->prompt, prompt_len, QWEN3_OUT_ALL_ARGMAX, err, errlen))
        goto fail;
    b->anchor = qwen3_state_argmax(b->state)[prompt_len - 1];
    if (e->drafter) {
        b->feat_width = qwen3_state_feature_width(b->state);
        b->features = malloc((size_t)prompt_len * b->feat_width * sizeof *b->features);
        if (!b->features) goto oom;
        memcpy(b->features, qwen3_state_features(b->state),
               (size_t)prompt_len * b->feat_width * sizeof(float));
    }
    *out = b;
    return 0;
oom:
    fm_set_error(err, errlen, "out of memory");
fail:
    bench_target_free(b);
    return -1;
}

int bench_target_warm(bench_target *b, char *err, size_t errlen) {
    double ms;
    return bench_target_forward_ms(b, 1, &ms, err, errlen);
}

int bench_target_forward_ms(bench_target *b, int T, double *ms, char *err, size_t errlen) {
    if (T < 1 || T > BENCH_MAX_T) return fm_set_error(err, errlen, "bench: block of %d tokens (1 .. 17)", T);
    /* [anchor, then arbitrary tokens]: a verify block's cost does not depend on its ids. */
    int32_t ids[BENCH_MAX_T];
    ids[0] = b->anchor;
    for (int i = 1; i < T; i++) ids[i] = b->prompt[i % b->prompt_len];
    restore_prompt(b);
    const double t0 = bench_now_s();
    const int rc =
        qwen3_forward(b->e->model, b->state, b->e->pool, ids, T, QWEN3_OUT_ALL_ARGMAX, err, errlen);
    *ms = 1e3 * (bench_now_s() - t0);
    restore_prompt(b);
    return rc;
}

int bench_target_draft_ms(bench_target *b, double *ms, char *err, size_t errlen) {
    fm_drafter *d = b->e->drafter;
    if (!d) return fm_set_error(err, errlen, "bench: no drafter loaded (-d)");
    /* A session run resets the shared drafter: put the prompt's context back (untimed). */
    if (fm_drafter_length(d) != b->prompt_len &&
        fm_drafter_extend_context(d, b->e->pool, b->features, b->prompt_len, 0, err, errlen))
        return -1;
    int32_t out[FM_DRAFTER_MAX_BLOCK];
    const double t0 = bench_now_s();
    const int rc =
        fm_drafter_draft(d, b->e->pool, b->anchor, b->prompt_len, fm_drafter_block(d), out, err, errlen);
    *ms = 1e3 * (bench_now_s() - t0);
    return rc;
}

int bench_target_prefill_tps(bench_target *b, double *tok_s, char *err, size_t errlen) {
    qwen3_state_rewind(b->state, 0);
    const double t0 = bench_now_s();
    for (int i = 0; i < b->prefill_len; i += b->chunk) {
        const int len = b->prefill_len - i < b->chunk ? b->prefill_len - i : b->chunk;
        const qwen3_out out = i + len >= b->prefill_len ? QWEN3_OUT_LAST_LOGITS : QWEN3_OUT_NONE;
        if (qwen3_forward(b->e->model, b->state, b->e->pool, b->prompt + i, len, out, err, errlen)) {
            qwen3_state_rewind(b->state, 0);
            return -1;
        }
    }
    *tok_s = b->prefill_len / (bench_now_s() - t0);
    /* The prompt is the prefix of the prefill tokens, so the cache now holds it plus more: drop the rest. */
    restore_prompt(b);
    return 0;
}
