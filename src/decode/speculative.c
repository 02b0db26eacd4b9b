/* speculative.c: the decoding loop (see speculative.h for what a round is).
 *
 * State between steps: `next` is the last produced token; it is NOT in the KV cache yet (it is the anchor of
 * the next round, or the input of the next plain step). The KV cache holds exactly the prompt and every
 * produced token but `next`. The drafter's context holds the target's features for positions
 * 0 .. drafter_len-1, plus pending rows (plain steps) that are flushed before the next draft.
 *
 * Verify width: adaptive (7 drafts while the average acceptance is under 5, else the whole block) or fixed,
 * and never more than the tokens still wanted minus one, so a round can never overshoot max_new_tokens.
 * Fallback: when rounds yield fewer tokens per second than plain steps (average tokens per round x step time
 * under 0.85 x round time, over at least 4 rounds), decode plainly for 16 tokens, then probe again. */
#include "decode/speculative.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "drafter/flashmap_drafter.h"

enum { ADAPTIVE_SMALL_K = 7, FALLBACK_MIN_ROUNDS = 4, FALLBACK_PLAIN_STRETCH = 16 };
static const double FALLBACK_MARGIN = 0.85, ADAPTIVE_THRESHOLD = 5.0;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Output buffer and the stop/limit bookkeeping shared by plain steps and rounds. */
typedef struct {
    int32_t *ids;
    int n, cap, limit;
    fm_stop_reason stop;
} out_buf;

static int out_push(out_buf *o, const int32_t *ids, int n) {
    if (o->n + n > o->cap) {
        int cap = o->cap ? o->cap : 64;
        while (cap < o->n + n) cap *= 2;
        int32_t *p = realloc(o->ids, (size_t)cap * sizeof *p);
        if (!p) return -1;
        o->ids = p;
        o->cap = cap;
    }
    memcpy(o->ids + o->n, ids, (size_t)n * sizeof *ids);
    o->n += n;
    return 0;
}

/* Feature rows of plain forwards wait here until the next draft needs them. */
static int pending_add(fm_decoder *d, const float *rows, int n, int start, char *err, size_t errlen) {
    if (!d->drafter) return 0;
    const int fw = qwen3_state_feature_width(d->state);
    if (d->pending_rows == 0) d->pending_start = start;
    if (d->pending_rows + n > d->pending_cap) {
        int cap = d->pending_cap ? d->pending_cap : 32;
        while (cap < d->pending_rows + n) cap *= 2;
        float *p = realloc(d->pending, (size_t)cap * fw * sizeof *p);
        if (!p) return fm_set_error(err, errlen, "out of memory for drafter context rows");
        d->pending = p;
        d->pending_cap = cap;
    }
    memcpy(d->pending + (size_t)d->pending_rows * fw, rows, (size_t)n * fw * sizeof *rows);
    d->pending_rows += n;
    return 0;
}

static int pending_flush(fm_decoder *d, double *draft_s, char *err, size_t errlen) {
    if (!d->drafter || d->pending_rows == 0) return 0;
    const double t0 = now_s();
    const int max_rows = d->prefill_chunk;
    for (int r = 0; r < d->pending_rows; r += max_rows) {
        const int n = d->pending_rows - r < max_rows ? d->pending_rows - r : max_rows;
        const int fw = qwen3_state_feature_width(d->state);
        if (fm_drafter_extend_context(d->drafter, d->pool, d->pending + (size_t)r * fw, n, d->pending_start + r,
                                      err, errlen))
            return -1;
    }
    d->drafter_len = d->pending_start + d->pending_rows;
    d->pending_rows = 0;
    *draft_s += now_s() - t0;
    return 0;
}

/* Prefill in chunks; every chunk's features go to the drafter. Returns the argmax of the last row. */
static int prefill(fm_decoder *d, const int32_t *ids, int n, int32_t *first, fm_generate_stats *st, char *err,
                   size_t errlen) {
    for (int i = 0; i < n; i += d->prefill_chunk) {
        const int len = n - i < d->prefill_chunk ? n - i : d->prefill_chunk;
        const int last = i + len >= n, start = qwen3_state_pos(d->state);
        if (qwen3_forward(d->model, d->state, d->pool, ids + i, len, last ? QWEN3_OUT_LAST_LOGITS : QWEN3_OUT_NONE,
                          err, errlen))
            return -1;
        if (pending_add(d, qwen3_state_features(d->state), len, start, err, errlen) ||
            pending_flush(d, &st->draft_s, err, errlen))
            return -1;
    }
    *first = qwen3_state_argmax(d->state)[0];
    return 0;
}

/* Binomial(n, p) from a splitmix64 stream: reproducible simulated acceptance. */
static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int binomial(uint64_t *rng, int n, double p) {
    int k = 0;
    for (int i = 0; i < n; i++) k += (double)(splitmix64(rng) >> 11) * 0x1.0p-53 < p;
    return k;
}

/* Replaces drafts by the known greedy future for the first k and a wrong token after (simulated acceptance). */
static void simulate_drafts(const fm_generate_params *p, uint64_t *rng, int block, int produced, int vocab,
                            int32_t *drafts) {
    const double prob = p->sim_mean <= 0 ? 0 : p->sim_mean >= block ? 1 : p->sim_mean / block;
    const int k = binomial(rng, block, prob);
    for (int i = 0; i < block && i <= k; i++) {
        const int at = produced + i;
        if (at >= p->sim_future_len) break;
        drafts[i] = i < k ? p->sim_future[at] : (p->sim_future[at] + 1) % vocab;
    }
}

/* A stop: the model's own stop tokens (unless ignored) or one of the caller's extra ids. */
static int stops_at(const fm_generate_params *p, int (*is_stop)(const void *, int32_t), const void *ctx, int32_t id) {
    for (int i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] == id) return 1;
    return !p->ignore_stop && is_stop(ctx, id);
}

int fm_decode_run(fm_decoder *d, const int32_t *ids, int n_ids, const fm_generate_params *p,
                  int (*is_stop)(const void *ctx, int32_t id), const void *stop_ctx, int32_t **out, int *n_out,
                  fm_generate_stats *st, char *err, size_t errlen) {
    memset(st, 0, sizeof *st);
    if (out) *out = NULL;
    if (n_out) *n_out = 0;
    if (n_ids < 1) return fm_set_error(err, errlen, "nothing to decode: the prompt is empty");
    if (p->speculative && !d->drafter) return fm_set_error(err, errlen, "speculative decoding needs a drafter (-d)");
    const int n_ctx = qwen3_state_n_ctx(d->state), vocab = d->model->hp.vocab;
    if (qwen3_state_pos(d->state) + n_ids >= n_ctx)
        return fm_set_error(err, errlen, "the prompt (%d tokens at position %d) does not fit the context (--ctx %d)",
                            n_ids, qwen3_state_pos(d->state), n_ctx);
    const int block = d->drafter ? fm_drafter_block(d->drafter) : 0;
    const int drafter_ctx = d->drafter ? fm_drafter_max_ctx(d->drafter) : 0;
    out_buf o = {.limit = p->max_new_tokens > 0 ? p->max_new_tokens : n_ctx};
    uint64_t rng = p->sim_seed ^ 0x5eedull;
    int32_t drafts[FM_MAX_BLOCK + 1], block_ids[FM_MAX_BLOCK + 1];
    int plain_left = 0, n_trace = 0, rc = -1;
    st->simulated = p->sim_future != NULL;

    const double t_start = now_s();
    st->n_prompt = n_ids;
    int32_t next;
    if (prefill(d, ids, n_ids, &next, st, err, errlen)) goto done;
    st->prefill_s = now_s() - t_start;
    const double t_decode = now_s();
    if (out_push(&o, &next, 1)) goto oom;
    if (p->on_tokens && p->on_tokens(p->user, &next, 1)) goto finish;
    if (stops_at(p, is_stop, stop_ctx, next)) {
        o.stop = FM_STOP_TOKEN;
        goto finish;
    }
    while (o.n < o.limit) {
        const int pos = qwen3_state_pos(d->state), remaining = o.limit - o.n;
        if (pos + 1 > n_ctx) {
            o.stop = FM_STOP_CONTEXT;
            break;
        }
        int K = 0;
        if (p->speculative && plain_left == 0) {
            K = p->verify > 0 ? p->verify : d->ema_accept >= ADAPTIVE_THRESHOLD ? block : ADAPTIVE_SMALL_K;
            if (K > block) K = block;
            if (K > remaining - 1) K = remaining - 1;         /* a round yields at most K + 1 tokens */
            if (pos + K + 1 > n_ctx) K = n_ctx - pos - 1;      /* the verify block must fit the cache */
            if (pos + block + 1 > drafter_ctx) K = 0;          /* near the drafter's limit: plain steps */
        }
        if (K <= 0) {
            /* A plain step on `next`; its features wait for the next draft. */
            const double t0 = now_s();
            if (qwen3_forward(d->model, d->state, d->pool, &next, 1, QWEN3_OUT_LAST_LOGITS, err, errlen)) goto done;
            const double ms = 1e3 * (now_s() - t0);
            d->step_ms = isnan(d->step_ms) ? ms : 0.7 * d->step_ms + 0.3 * ms;
            if (pending_add(d, qwen3_state_features(d->state), 1, pos, err, errlen)) goto done;
            next = qwen3_state_argmax(d->state)[0];
            st->plain_steps++;
            if (plain_left > 0) plain_left--;
            if (out_push(&o, &next, 1)) goto oom;
            if (p->on_tokens && p->on_tokens(p->user, &next, 1)) break;
            if (stops_at(p, is_stop, stop_ctx, next)) {
                o.stop = FM_STOP_TOKEN;
                break;
            }
            continue;
        }

        /* A round: draft, verify [anchor, d1..dK] in one block, accept the longest matching prefix. */
        const double t0 = now_s();
        const int catch_up = d->pending_rows > 0; /* context work of a plain stretch: keep out of round time */
        if (pending_flush(d, &st->draft_s, err, errlen)) goto done;
        const double t_draft = now_s();
        if (fm_drafter_draft(d->drafter, d->pool, next, pos, drafts, err, errlen)) goto done;
        if (p->sim_future) simulate_drafts(p, &rng, block, o.n, vocab, drafts);
        const double t1 = now_s();
        block_ids[0] = next;
        memcpy(block_ids + 1, drafts, (size_t)K * sizeof *drafts);
        if (qwen3_forward(d->model, d->state, d->pool, block_ids, K + 1, QWEN3_OUT_ALL_ARGMAX, err, errlen))
            goto done;
        const double t2 = now_s();
        const int32_t *rows = qwen3_state_argmax(d->state);
        int acc = 0;
        while (acc < K && drafts[acc] == rows[acc]) acc++;
        int32_t fresh[FM_MAX_BLOCK + 1];
        int n_fresh = 0, hit_stop = 0;
        for (int i = 0; i <= acc; i++) {
            fresh[n_fresh++] = i < acc ? drafts[i] : rows[acc];
            if (stops_at(p, is_stop, stop_ctx, fresh[n_fresh - 1])) {
                hit_stop = 1;
                break;
            }
        }
        /* The cache keeps the anchor and every new token but the last; the drafter's context at
         * pos .. pos+n_fresh-1 is overwritten with the target's features of those rows. */
        qwen3_state_rewind(d->state, pos + n_fresh);
        if (fm_drafter_extend_context(d->drafter, d->pool, qwen3_state_features(d->state), n_fresh, pos, err,
                                      errlen))
            goto done;
        d->drafter_len = pos + n_fresh;
        const double t3 = now_s();
        st->draft_s += (t1 - t_draft) + (t3 - t2);
        st->verify_s += t2 - t1;
        st->rounds++;
        st->accepted += acc;
        if (p->trace && n_trace < p->trace_cap) {
            fm_round_trace *tr = &p->trace[n_trace++];
            tr->pos = pos;
            tr->anchor = next;
            tr->n_drafted = block;
            memcpy(tr->drafted, drafts, (size_t)block * sizeof *drafts);
            tr->verified = K;
            tr->accepted = acc;
        }
        d->ema_accept = 0.6 * d->ema_accept + 0.4 * acc;
        d->ema_tokens = 0.75 * d->ema_tokens + 0.25 * (acc + 1);
        const double round_ms = 1e3 * (t3 - t0), verify_ms = 1e3 * (t2 - t1);
        if (!catch_up) d->round_ms = isnan(d->round_ms) ? round_ms : 0.6 * d->round_ms + 0.4 * round_ms;
        d->verify_ms = isnan(d->verify_ms) ? verify_ms : 0.6 * d->verify_ms + 0.4 * verify_ms;
        d->n_rounds_total++;
        next = fresh[n_fresh - 1];
        if (out_push(&o, fresh, n_fresh)) goto oom;
        if (p->on_tokens && p->on_tokens(p->user, fresh, n_fresh)) break;
        if (hit_stop) {
            o.stop = FM_STOP_TOKEN;
            break;
        }
        /* Until a plain step was timed, a step is assumed to cost what a verify block costs (optimistic for
         * drafting, so only clearly losing rounds fall back; the plain stretch then measures the real cost). */
        const double step_ms = isnan(d->step_ms) ? d->verify_ms : d->step_ms;
        if (p->fallback && d->n_rounds_total >= FALLBACK_MIN_ROUNDS && !isnan(d->round_ms) &&
            d->ema_tokens * step_ms < FALLBACK_MARGIN * d->round_ms)
            plain_left = FALLBACK_PLAIN_STRETCH;
    }
    if (o.n >= o.limit && o.stop == FM_STOP_NONE) o.stop = FM_STOP_LENGTH;
finish:
    st->decode_s = now_s() - t_decode;
    st->n_generated = o.n;
    st->stop = o.stop;
    if (p->n_trace) *p->n_trace = n_trace;
    if (out) {
        *out = o.ids;
        o.ids = NULL;
    }
    if (n_out) *n_out = o.n;
    /* `next` (the last token) is not in the cache: the session prefills it before its next input. */
    rc = 0;
    goto done;
oom:
    fm_set_error(err, errlen, "out of memory for the generated tokens");
done:
    free(o.ids);
    return rc;
}
