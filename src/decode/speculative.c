/* speculative.c: the decoding loop (see speculative.h for what a round is).
 *
 * State between steps: `next` is the last produced token; it is NOT in the KV cache yet (it is the anchor of
 * the next round, or the input of the next plain step). The KV cache holds exactly the prompt and every
 * produced token but `next`. Every row the target keeps has its features committed to the drafter's context
 * (the backend decides when to do that work), so a draft at pos sees the target's features of 0 .. pos-1.
 *
 * Verify width: fixed, or adaptive: the width with the most expected tokens per millisecond given the
 * acceptance and verify costs measured so far (verify_width.h); before those are known, 7 drafts while the
 * average acceptance is under 5, else the whole block. Never more than the tokens still wanted minus one, so
 * a round can never overshoot max_new_tokens. Fallback: when rounds yield fewer tokens per second than plain
 * steps (average tokens per round x step time under 0.85 x round time, over at least 4 rounds), decode
 * plainly for 16 tokens, then probe again. */
#include "decode/speculative.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "core/id_list.h"
#include "core/rng.h"
#include "decode/sampler.h"

/* A fallback runs FALLBACK_PLAIN_STRETCH plain steps, then one round probes the drafts again; each probe that
 * still loses doubles the stretch, up to FALLBACK_MAX_STRETCH (drafts that never win cost a round per 129
 * tokens instead of one per 17; drafts that start winning again are back within that many tokens). */
enum {
    ADAPTIVE_SMALL_K = 7,
    FALLBACK_MIN_ROUNDS = 4,
    FALLBACK_PLAIN_STRETCH = 16,
    FALLBACK_MAX_STRETCH = 128
};
static const double FALLBACK_MARGIN = 0.85, ADAPTIVE_THRESHOLD = 5.0;

static double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The clock of the loop's timings and decisions (decode_backend.h). */
static double clock_s(const fm_decode_backend *b) {
    return b->clock ? b->clock(b->ctx) : wall_s();
}

/* Output buffer and the stop/limit bookkeeping shared by plain steps and rounds. */
typedef struct {
    int32_t *ids;
    int n, cap, limit;
    fm_stop_reason stop;
} out_buf;

static int out_push(out_buf *o, const int32_t *ids, int n) {
    return fm_ids_append(&o->ids, &o->n, &o->cap, ids, n);
}

/* New tokens into the output and, when the penalties read it (seq->ids set), into the sequence too. */
static int push_tokens(out_buf *o, out_buf *seq, const int32_t *ids, int n) {
    return out_push(o, ids, n) || (seq->ids && out_push(seq, ids, n));
}

void fm_decode_averages_reset(fm_decode_averages *a) {
    /* Where the spec starts them; timings are unknown until measured. */
    a->ema_accept = 4;
    a->ema_tokens = 5;
    a->round_ms = a->step_ms = a->verify_ms = NAN;
    a->n_rounds = 0;
    a->plain_stretch = FALLBACK_PLAIN_STRETCH;
    fm_width_reset(&a->width);
}

/* Prefill in chunks; every chunk's features go to the drafter. Returns the last row's token. */
static int prefill(const fm_decode_backend *b, const int32_t *ids, int n, int32_t *first, char *err,
                   size_t errlen) {
    for (int i = 0; i < n; i += b->max_eval) {
        const int len = n - i < b->max_eval ? n - i : b->max_eval, start = b->pos(b->ctx);
        if (b->eval(b->ctx, ids + i, len, 0, i + len >= n ? first : NULL, err, errlen) ||
            b->commit_features(b->ctx, len, start, err, errlen))
            return -1;
    }
    return 0;
}

/* Binomial(n, p) from a splitmix64 stream: reproducible simulated acceptance. */
static int binomial(uint64_t *rng, int n, double p) {
    int k = 0;
    for (int i = 0; i < n; i++) k += fm_rng_uniform(rng) < p;
    return k;
}

/* Replaces drafts by the known greedy future for the first k and a wrong token after (simulated acceptance).
 */
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
static int stops_at(const fm_generate_params *p, int (*is_stop)(const void *, int32_t), const void *ctx,
                    int32_t id) {
    for (int i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] == id) return 1;
    return !p->ignore_stop && is_stop(ctx, id);
}

int fm_decode_run(const fm_decode_backend *b, fm_decode_averages *avg, const int32_t *before, int n_before,
                  const int32_t *ids, int n_ids, const fm_generate_params *p,
                  int (*is_stop)(const void *ctx, int32_t id), const void *stop_ctx, int32_t **out,
                  int *n_out, fm_generate_stats *st, char *err, size_t errlen) {
    memset(st, 0, sizeof *st);
    if (out) *out = NULL;
    if (n_out) *n_out = 0;
    if (n_ids < 1) return fm_set_error(err, errlen, "nothing to decode: the prompt is empty");
    if (p->speculative && !b->block)
        return fm_set_error(err, errlen, "speculative decoding needs a drafter (-d)");
    if (fm_sampling_check(&p->sampling, err, errlen)) return -1;
    if (!b->set_sampling && !fm_sampling_greedy(&p->sampling))
        return fm_set_error(err, errlen, "this backend decodes greedily only");
    const int penalized = fm_sampling_penalized(&p->sampling);
    if (penalized && (!b->set_sampling || !b->set_history))
        return fm_set_error(err, errlen, "this backend has no penalties");
    if (b->set_sampling && b->set_sampling(b->ctx, &p->sampling, err, errlen)) return -1;
    const int n_ctx = b->n_ctx, vocab = b->vocab, block = b->block, drafter_ctx = b->drafter_ctx;
    if (b->pos(b->ctx) + n_ids >= n_ctx)
        return fm_set_error(err, errlen,
                            "the prompt (%d tokens at position %d) does not fit the context (--ctx %d)",
                            n_ids, b->pos(b->ctx), n_ctx);
    out_buf o = {.limit = p->max_new_tokens > 0 ? p->max_new_tokens : n_ctx};
    /* What the penalties read: the sequence before each row (earlier tokens, this prompt, the new tokens). */
    out_buf seq = {0};
    if (penalized && (out_push(&seq, before, n_before) || out_push(&seq, ids, n_ids))) {
        free(seq.ids);
        return fm_set_error(err, errlen, "out of memory for the penalties' history");
    }
    uint64_t rng = p->sim_seed ^ 0x5eedull;
    int32_t drafts[FM_MAX_BLOCK + 1], block_ids[FM_MAX_BLOCK + 1];
    /* The prefill's feature rows, like a plain stretch's, reach the drafter in the first draft: that round's
     * draft time is not a draft's. */
    int plain_left = 0, n_trace = 0, rc = -1, plain_since_round = 1;
    st->simulated = p->sim_future != NULL;

    const double t_start = clock_s(b);
    st->n_prompt = n_ids;
    int32_t next;
    if (penalized) b->set_history(b->ctx, seq.ids, seq.n, 0); /* the prompt's last row: nothing generated */
    if (prefill(b, ids, n_ids, &next, err, errlen)) goto done;
    st->prefill_s = clock_s(b) - t_start;
    const double t_decode = clock_s(b);
    if (push_tokens(&o, &seq, &next, 1)) goto oom;
    if (p->on_tokens && p->on_tokens(p->user, &next, 1)) goto finish;
    if (stops_at(p, is_stop, stop_ctx, next)) {
        o.stop = FM_STOP_TOKEN;
        goto finish;
    }
    fm_width_set_granule(&avg->width, b->row_granule);
    /* The fallback compares rounds with plain steps: time one step first, so that losing rounds are seen
     * as such after FALLBACK_MIN_ROUNDS (a verify block's time, the stand-in until then, is several steps on
     * a CPU). */
    if (p->speculative && p->fallback && isnan(avg->step_ms)) plain_left = 1;
    while (o.n < o.limit) {
        const int pos = b->pos(b->ctx), remaining = o.limit - o.n;
        if (pos + 1 > n_ctx) {
            o.stop = FM_STOP_CONTEXT;
            break;
        }
        int K = 0;
        if (p->speculative && plain_left == 0) {
            const int rule = avg->ema_accept >= ADAPTIVE_THRESHOLD ? block : ADAPTIVE_SMALL_K;
            K = p->verify > 0 ? p->verify : fm_width_choose(&avg->width, block, rule);
            if (K > block) K = block;
            if (K > remaining - 1) K = remaining - 1;     /* a round yields at most K + 1 tokens */
            if (pos + K + 1 > n_ctx) K = n_ctx - pos - 1; /* the verify block must fit the cache */
            if (pos + block + 1 > drafter_ctx) K = 0;     /* near the drafter's limit: plain steps */
        }
        if (K <= 0) {
            /* A plain step on `next`; its features wait for the next draft. */
            const double t0 = clock_s(b);
            const int32_t in = next;
            if (penalized) b->set_history(b->ctx, seq.ids, seq.n, o.n);
            if (b->eval(b->ctx, &in, 1, 0, &next, err, errlen)) goto done;
            const double ms = 1e3 * (clock_s(b) - t0);
            avg->step_ms = isnan(avg->step_ms) ? ms : 0.7 * avg->step_ms + 0.3 * ms;
            fm_width_observe_step(&avg->width, ms);
            if (b->commit_features(b->ctx, 1, pos, err, errlen)) goto done;
            plain_since_round = 1;
            st->plain_steps++;
            if (plain_left > 0) plain_left--;
            if (push_tokens(&o, &seq, &next, 1)) goto oom;
            if (p->on_tokens && p->on_tokens(p->user, &next, 1)) break;
            if (stops_at(p, is_stop, stop_ctx, next)) {
                o.stop = FM_STOP_TOKEN;
                break;
            }
            continue;
        }

        /* A round: draft, verify [anchor, d1..dK] in one block, accept the longest matching prefix. */
        const double t0 = clock_s(b);
        /* The first round after a plain stretch also does that stretch's context work: keep it out of the
         * round-time average. */
        const int catch_up = plain_since_round;
        plain_since_round = 0;
        if (penalized) b->set_history(b->ctx, seq.ids, seq.n, o.n); /* for the draft and the verify block */
        if (b->draft(b->ctx, next, pos, K, drafts, err, errlen)) goto done;
        if (p->sim_future) simulate_drafts(p, &rng, block, o.n, vocab, drafts);
        const double t1 = clock_s(b);
        block_ids[0] = next;
        memcpy(block_ids + 1, drafts, (size_t)K * sizeof *drafts);
        int32_t rows[FM_MAX_BLOCK + 1];
        if (b->eval(b->ctx, block_ids, K + 1, 1, rows, err, errlen)) goto done;
        const double t2 = clock_s(b);
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
        b->rewind(b->ctx, pos + n_fresh);
        if (b->commit_features(b->ctx, n_fresh, pos, err, errlen)) goto done;
        const double t3 = clock_s(b);
        st->draft_s += (t1 - t0) + (t3 - t2);
        st->verify_s += t2 - t1;
        st->rounds++;
        st->accepted += acc;
        if (p->trace && n_trace < p->trace_cap) {
            fm_round_trace *tr = &p->trace[n_trace++];
            tr->pos = pos;
            tr->anchor = next;
            tr->n_drafted = K;
            memcpy(tr->drafted, drafts, (size_t)K * sizeof *drafts);
            tr->verified = K;
            tr->accepted = acc;
        }
        avg->ema_accept = 0.6 * avg->ema_accept + 0.4 * acc;
        avg->ema_tokens = 0.75 * avg->ema_tokens + 0.25 * (acc + 1);
        const double round_ms = 1e3 * (t3 - t0), verify_ms = 1e3 * (t2 - t1);
        if (!catch_up) avg->round_ms = isnan(avg->round_ms) ? round_ms : 0.6 * avg->round_ms + 0.4 * round_ms;
        avg->verify_ms = isnan(avg->verify_ms) ? verify_ms : 0.6 * avg->verify_ms + 0.4 * verify_ms;
        fm_width_observe_round(&avg->width, K, acc, catch_up ? -1 : 1e3 * ((t1 - t0) + (t3 - t2)), verify_ms);
        avg->n_rounds++;
        next = fresh[n_fresh - 1];
        if (push_tokens(&o, &seq, fresh, n_fresh)) goto oom;
        if (p->on_tokens && p->on_tokens(p->user, fresh, n_fresh)) break;
        if (hit_stop) {
            o.stop = FM_STOP_TOKEN;
            break;
        }
        /* A plain step costs at most what a verify block does (the same weights for one row), so its time is
         * capped by the verify blocks': a first step made slow by something of its own (a CUDA graph
         * captured, cold caches) would otherwise keep the loop drafting for good, as no plain step follows
         * to correct it (seen on the H200: 253 losing rounds in 256 tokens). Were no plain step timed yet,
         * the verify block stands in (optimistic for drafting). */
        const double step_ms = isnan(avg->step_ms) ? avg->verify_ms : fmin(avg->step_ms, avg->verify_ms);
        if (p->fallback && avg->n_rounds >= FALLBACK_MIN_ROUNDS && !isnan(avg->round_ms)) {
            if (avg->ema_tokens * step_ms < FALLBACK_MARGIN * avg->round_ms) {
                plain_left = avg->plain_stretch;
                avg->plain_stretch = avg->plain_stretch * 2 < FALLBACK_MAX_STRETCH ? avg->plain_stretch * 2
                                                                                   : FALLBACK_MAX_STRETCH;
            } else {
                avg->plain_stretch = FALLBACK_PLAIN_STRETCH; /* drafting pays again */
            }
        }
    }
    if (o.n >= o.limit && o.stop == FM_STOP_NONE) o.stop = FM_STOP_LENGTH;
finish:
    st->decode_s = clock_s(b) - t_decode;
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
    if (penalized) b->set_history(b->ctx, NULL, 0, 0); /* seq is freed next */
    free(o.ids);
    free(seq.ids);
    return rc;
}
