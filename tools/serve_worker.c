/* serve_worker.c: the job queue and the thread that runs generations (see serve_worker.h).
 *
 * Locking: the worker's mutex guards the queue, `current` and `stopping`; each job's mutex guards its state,
 * cancel flag, reference count and output. The worker never holds a job's mutex while generating, and takes
 * the worker's mutex before a job's, never the other way round.
 *
 * Text: tokens become text through the engine's streaming decoder (never half a UTF-8 character); the model's
 * stop token ends the output but is not part of its text. A stop string cuts the text where it starts. A
 * stream hands out only text that can no longer turn into a stop string (serve_stop_holdback). */
#include "serve_worker.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli_engine.h"
#include "serve_stop.h"

struct serve_job {
    serve_request req;
    serve_reply_head head;
    double t_queued;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    serve_job_state state;
    int cancelled, refs;
    int status; /* the response once DONE (non-streaming, or refused before RUNNING) */
    char *body;
    char *sse; /* [sse_len] events not yet read from sse_read on */
    size_t sse_len, sse_cap, sse_read;
    int sse_oom;
    serve_job *next; /* queue link (worker's mutex) */
};

struct serve_worker {
    fm_engine *e;
    fm_session *s;
    /* The prompt cache: the tokens the session holds (the last request's prompt and reply). A request keeps
     * the longest common prefix and prefills only the rest; the reply is the same bits as from scratch. */
    int32_t *held;
    int n_held, held_cap;
    serve_worker_params p;
    int n_ctx;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    serve_job *head, *tail, *current;
    int stopping;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void cond_init_monotonic(pthread_cond_t *cv) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

static void cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(cv, mu, &ts);
}

/* ---- jobs ---- */

static void make_id(char *out, size_t n, const char *prefix) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static uint64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    pthread_mutex_lock(&mu);
    uint64_t x = (uint64_t)ts.tv_sec * 1000000007ull + (uint64_t)ts.tv_nsec + (++counter << 40);
    pthread_mutex_unlock(&mu);
    x += 0x9e3779b97f4a7c15ull; /* splitmix64: ids look random, are unique per (time, counter) */
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    snprintf(out, n, "%s-%016llx", prefix, (unsigned long long)(x ^ (x >> 31)));
}

serve_job *serve_job_create(serve_request *req, const char *model) {
    serve_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->req = *req;
    memset(req, 0, sizeof *req);
    j->head.kind = j->req.kind;
    make_id(j->head.id, sizeof j->head.id, j->req.kind == SERVE_CHAT ? "chatcmpl" : "cmpl");
    j->head.created = (long)time(NULL);
    j->head.model = model;
    pthread_mutex_init(&j->mu, NULL);
    cond_init_monotonic(&j->cv);
    j->refs = 1;
    return j;
}

void serve_job_release(serve_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    const int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (!last) return;
    serve_request_free(&j->req);
    free(j->body);
    free(j->sse);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

void serve_job_cancel(serve_job *j) {
    pthread_mutex_lock(&j->mu);
    j->cancelled = 1;
    pthread_mutex_unlock(&j->mu);
}

static int job_cancelled(serve_job *j) {
    pthread_mutex_lock(&j->mu);
    const int c = j->cancelled;
    pthread_mutex_unlock(&j->mu);
    return c;
}

int serve_job_is_stream(const serve_job *j) {
    return j->req.stream;
}

serve_job_state serve_job_wait(serve_job *j, serve_job_state until, int ms) {
    pthread_mutex_lock(&j->mu);
    if (j->state < until) cond_wait_ms(&j->cv, &j->mu, ms);
    const serve_job_state st = j->state;
    pthread_mutex_unlock(&j->mu);
    return st;
}

int serve_job_response(serve_job *j, const char **body) {
    pthread_mutex_lock(&j->mu);
    const int status = j->status;
    *body = j->body;
    pthread_mutex_unlock(&j->mu);
    return status;
}

long serve_job_read(serve_job *j, char *buf, size_t max, int ms) {
    pthread_mutex_lock(&j->mu);
    if (j->sse_read == j->sse_len && j->state != SERVE_JOB_DONE) cond_wait_ms(&j->cv, &j->mu, ms);
    long n = 0;
    if (j->sse_read < j->sse_len) {
        n = (long)(j->sse_len - j->sse_read < max ? j->sse_len - j->sse_read : max);
        memcpy(buf, j->sse + j->sse_read, (size_t)n);
        j->sse_read += (size_t)n;
        if (j->sse_read == j->sse_len) j->sse_read = j->sse_len = 0;
    } else if (j->state == SERVE_JOB_DONE) {
        n = -1;
    }
    pthread_mutex_unlock(&j->mu);
    return n;
}

/* Appends one event (taking ev) to the stream. */
static void job_emit(serve_job *j, char *ev) {
    pthread_mutex_lock(&j->mu);
    const size_t n = ev ? strlen(ev) : 0;
    if (!ev) j->sse_oom = 1;
    if (ev && j->sse_len + n > j->sse_cap) {
        size_t cap = j->sse_cap ? j->sse_cap : 4096;
        while (cap < j->sse_len + n) cap *= 2;
        char *g = realloc(j->sse, cap);
        if (g) {
            j->sse = g;
            j->sse_cap = cap;
        } else {
            j->sse_oom = 1;
        }
    }
    if (ev && j->sse_len + n <= j->sse_cap) {
        memcpy(j->sse + j->sse_len, ev, n);
        j->sse_len += n;
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    free(ev);
}

static void job_set_state(serve_job *j, serve_job_state st) {
    pthread_mutex_lock(&j->mu);
    j->state = st;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* Ends a job with an error: as the response, or (once streaming) as a last event before [DONE]. */
static void job_fail(serve_job *j, const serve_error *e) {
    pthread_mutex_lock(&j->mu);
    const int streaming = j->state == SERVE_JOB_RUNNING && j->req.stream;
    pthread_mutex_unlock(&j->mu);
    if (streaming) {
        job_emit(j, serve_openai_error_chunk(e));
        job_emit(j, strdup("data: [DONE]\n\n"));
    } else {
        char *body = serve_openai_error(e);
        pthread_mutex_lock(&j->mu);
        j->status = e->status;
        j->body = body;
        pthread_mutex_unlock(&j->mu);
    }
    job_set_state(j, SERVE_JOB_DONE);
}

/* ---- one generation ---- */

typedef struct {
    serve_worker *w;
    serve_job *j;
    fm_text_stream *ts;
    char *text; /* [len] the reply so far, cut at a stop string */
    size_t len, cap, emitted;
    int stop_hit, role_sent, oom;
} gen_ctx;

static void text_add(gen_ctx *g, const char *s, size_t n) {
    if (g->len + n + 1 > g->cap) {
        size_t cap = g->cap ? g->cap : 1024;
        while (cap < g->len + n + 1) cap *= 2;
        char *t = realloc(g->text, cap);
        if (!t) {
            g->oom = 1;
            return;
        }
        g->text = t;
        g->cap = cap;
    }
    memcpy(g->text + g->len, s, n);
    g->len += n;
    g->text[g->len] = 0;
}

/* Cuts the text at the first stop string that ends after byte `checked`. */
static void find_stop(gen_ctx *g, size_t checked) {
    const serve_request *r = &g->j->req;
    long at = serve_stop_find(r->stop, r->n_stop, g->text, g->len, checked);
    if (at >= 0) {
        g->len = (size_t)at;
        g->stop_hit = 1;
    }
}

/* Streams the text that can no longer become a stop string (all of it when final). */
static void stream_text(gen_ctx *g, int final) {
    const serve_request *r = &g->j->req;
    if (!r->stream) return;
    size_t upto = g->len;
    if (!final && !g->stop_hit) upto -= serve_stop_holdback(r->stop, r->n_stop, g->text, g->len);
    if (upto <= g->emitted) return;
    job_emit(g->j, serve_openai_chunk(&g->j->head, g->text + g->emitted, upto - g->emitted, 0, NULL));
    g->emitted = upto;
}

static int on_tokens(void *user, const int32_t *ids, int n) {
    gen_ctx *g = user;
    const size_t before = g->len;
    for (int i = 0; i < n; i++) {
        if (fm_token_is_stop(g->w->e, ids[i])) continue; /* ends the output, is not part of its text */
        size_t len = 0;
        const char *piece = fm_text_stream_push(g->ts, ids[i], &len);
        if (piece) text_add(g, piece, len);
    }
    find_stop(g, before);
    stream_text(g, 0);
    return g->stop_hit || g->oom || job_cancelled(g->j);
}

static const char *stop_detail(const fm_generate_stats *st, int stop_hit) {
    if (stop_hit) return "stop string";
    switch (st->stop) {
    case FM_STOP_TOKEN:
        return "stop token";
    case FM_STOP_CONTEXT:
        return "context full";
    default:
        return "length";
    }
}

static void log_job(const serve_job *j, const serve_reply_end *end) {
    const fm_generate_stats *st = &end->st;
    char sampled[48] = "";
    if (end->sampling.temperature > 0)
        snprintf(sampled, sizeof sampled, " | sampled, seed %llu", (unsigned long long)end->sampling.seed);
    fprintf(stderr,
            "flashmap serve: %s: prompt %d tok (%d cached), %d new tok (%s) | decode %.1f tok/s | rounds %d, "
            "mean accepted %.2f, plain steps %d%s | queued %.2f s\n",
            j->head.id, end->prompt_tokens, end->cached_tokens, st->n_generated, end->stop,
            cli_decode_tok_s(st), st->rounds, st->rounds ? (double)st->accepted / st->rounds : 0,
            st->plain_steps, sampled, end->queue_s);
}

/* Tokenizes the prompt and checks it fits; fills err (400) otherwise. */
static int prompt_ids(serve_worker *w, serve_job *j, int32_t **ids, int *n, serve_error *err) {
    char msg[FM_ERRBUF_SIZE];
    size_t n_ids = 0;
    if (fm_tokenize(w->e, j->req.prompt, strlen(j->req.prompt), 1, ids, &n_ids, msg, sizeof msg))
        return serve_error_set(err, 500, "server_error", NULL, "%s", msg);
    *n = (int)n_ids;
    if (n_ids == 0)
        return serve_error_set(err, 400, "invalid_request_error", NULL, "the prompt has no tokens");
    if (n_ids >= (size_t)w->n_ctx) {
        serve_error_set(
            err, 400, "invalid_request_error", j->req.kind == SERVE_CHAT ? "messages" : "prompt",
            "the prompt has %zu tokens but the context holds %d (serve --ctx), one of them for the "
            "first new token",
            n_ids, w->n_ctx);
        err->code = "context_length_exceeded";
        return -1;
    }
    return 0;
}

/* Cuts the session back to its longest common prefix with ids (at most n - 1 tokens: the last prompt token
 * must be fed to give the first new one) and returns that length. */
static int keep_prefix(serve_worker *w, const int32_t *ids, int n) {
    int c = 0;
    while (c < w->n_held && c < n - 1 && w->held[c] == ids[c]) c++;
    if (fm_session_pos(w->s) != w->n_held || fm_session_truncate(w->s, c, NULL, 0)) {
        fm_session_reset(w->s); /* never expected: start over rather than trust the cache */
        c = 0;
    }
    w->n_held = c;
    return c;
}

/* After a generation: the session holds prompt + reply, or, after a failure, nothing we can vouch for. */
static void remember(serve_worker *w, int rc, const int32_t *ids, int n, const int32_t *gen, int n_gen) {
    const int total = n + n_gen;
    if (rc == 0 && total > w->held_cap) {
        int32_t *h = realloc(w->held, (size_t)total * sizeof *h);
        if (h) {
            w->held = h;
            w->held_cap = total;
        }
    }
    if (rc || total > w->held_cap || fm_session_pos(w->s) != total) {
        fm_session_reset(w->s);
        w->n_held = 0;
        return;
    }
    memcpy(w->held, ids, (size_t)n * sizeof *ids);
    if (n_gen) memcpy(w->held + n, gen, (size_t)n_gen * sizeof *gen);
    w->n_held = total;
}

static void run_job(serve_worker *w, serve_job *j) {
    const double t_start = now_s();
    serve_error err = {0};
    int32_t *ids = NULL;
    int n_ids = 0;
    gen_ctx g = {.w = w, .j = j};
    if (prompt_ids(w, j, &ids, &n_ids, &err)) {
        fprintf(stderr, "flashmap serve: %s: refused: %s\n", j->head.id, err.message);
        job_fail(j, &err);
        free(ids);
        return;
    }
    job_set_state(j, SERVE_JOB_RUNNING);
    if (j->req.stream && j->req.kind == SERVE_CHAT) job_emit(j, serve_openai_chunk(&j->head, "", 0, 1, NULL));
    g.ts = fm_text_stream_create(w->e);
    fm_generate_params gp;
    fm_generate_params_init(&gp);
    gp.max_new_tokens = j->req.max_tokens;
    gp.ignore_stop = j->req.ignore_eos;
    gp.speculative = w->p.speculative;
    gp.verify = w->p.verify;
    gp.fallback = w->p.fallback;
    gp.sampling = j->req.sampling; /* draws depend on (seed, position) only: the prompt cache is unaffected */
    gp.on_tokens = on_tokens;
    gp.user = &g;
    fm_generate_stats st;
    char msg[FM_ERRBUF_SIZE];
    const int cached = keep_prefix(w, ids, n_ids);
    int32_t *gen = NULL;
    int n_gen = 0;
    int rc = g.ts ? fm_session_generate(w->s, ids + cached, n_ids - cached, &gp, &gen, &n_gen, &st, msg,
                                        sizeof msg)
                  : -1;
    if (!g.ts) snprintf(msg, sizeof msg, "out of memory");
    remember(w, rc, ids, n_ids, gen, n_gen);
    free(gen);
    free(ids);
    size_t tail_len = 0;
    const char *tail = rc == 0 ? fm_text_stream_flush(g.ts, &tail_len) : NULL;
    if (tail && !g.stop_hit) {
        const size_t before = g.len;
        text_add(&g, tail, tail_len);
        find_stop(&g, before);
    }
    fm_text_stream_free(g.ts);
    pthread_mutex_lock(&w->mu);
    const int stopping = w->stopping;
    pthread_mutex_unlock(&w->mu);
    if (rc || g.oom || j->sse_oom) {
        serve_error_set(&err, 500, "server_error", NULL, "generation failed: %s", rc ? msg : "out of memory");
        fprintf(stderr, "flashmap serve: %s: %s\n", j->head.id, err.message);
        job_fail(j, &err);
    } else if (job_cancelled(j) && !g.stop_hit) {
        fprintf(stderr, "flashmap serve: %s: cancelled after %d new tokens (%s)\n", j->head.id,
                st.n_generated, stopping ? "shutting down" : "the client went away");
        serve_error_set(&err, 503, "server_error", NULL, "the server is shutting down");
        job_fail(j, &err);
    } else {
        serve_reply_end end = {.stop = stop_detail(&st, g.stop_hit),
                               .speculative = w->p.speculative,
                               .queue_s = t_start - j->t_queued,
                               .prompt_tokens = n_ids,
                               .cached_tokens = cached,
                               .sampling = j->req.sampling,
                               .st = st};
        end.finish_reason = g.stop_hit || st.stop == FM_STOP_TOKEN ? "stop" : "length";
        log_job(j, &end);
        if (j->req.stream) {
            stream_text(&g, 1);
            job_emit(j, serve_openai_chunk(&j->head, "", 0, 0, &end));
            if (j->req.include_usage) job_emit(j, serve_openai_usage_chunk(&j->head, &end));
            job_emit(j, strdup("data: [DONE]\n\n"));
        } else {
            char *body = serve_openai_reply(&j->head, g.text, g.len, &end);
            pthread_mutex_lock(&j->mu);
            j->status = body ? 200 : 500;
            j->body = body;
            pthread_mutex_unlock(&j->mu);
        }
        job_set_state(j, SERVE_JOB_DONE);
    }
    free(g.text);
}

/* ---- the worker ---- */

static void *worker_main(void *arg) {
    serve_worker *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->head && !w->stopping) pthread_cond_wait(&w->cv, &w->mu);
        if (w->stopping) break;
        serve_job *j = w->head;
        w->head = j->next;
        if (!w->head) w->tail = NULL;
        w->current = j;
        pthread_mutex_unlock(&w->mu);
        if (job_cancelled(j)) { /* its client left while it waited */
            fprintf(stderr, "flashmap serve: %s: dropped: the client went away while it was queued\n",
                    j->head.id);
            job_set_state(j, SERVE_JOB_DONE);
        } else {
            run_job(w, j);
        }
        pthread_mutex_lock(&w->mu);
        w->current = NULL;
        pthread_mutex_unlock(&w->mu);
        serve_job_release(j);
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

serve_worker *serve_worker_start(fm_engine *e, const serve_worker_params *p, char *err, size_t errlen) {
    serve_worker *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    w->e = e;
    w->p = *p;
    fm_engine_info info;
    fm_engine_get_info(e, &info);
    w->n_ctx = info.n_ctx;
    if (fm_session_create(e, &w->s, err, errlen)) {
        free(w);
        return NULL;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, worker_main, w)) {
        snprintf(err, errlen, "cannot start the worker thread");
        fm_session_free(w->s);
        free(w);
        return NULL;
    }
    return w;
}

int serve_worker_submit(serve_worker *w, serve_job *j, serve_error *err) {
    pthread_mutex_lock(&w->mu);
    if (w->stopping) {
        pthread_mutex_unlock(&w->mu);
        return serve_error_set(err, 503, "server_error", NULL, "the server is shutting down");
    }
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
    j->t_queued = now_s();
    j->next = NULL;
    if (w->tail)
        w->tail->next = j;
    else
        w->head = j;
    w->tail = j;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return 0;
}

void serve_worker_stop(serve_worker *w) {
    if (!w || w->stopping) return;
    serve_error err;
    serve_error_set(&err, 503, "server_error", NULL, "the server is shutting down");
    pthread_mutex_lock(&w->mu);
    w->stopping = 1;
    if (w->current) serve_job_cancel(w->current);
    serve_job *queued = w->head;
    w->head = w->tail = NULL;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    while (queued) {
        serve_job *next = queued->next;
        job_fail(queued, &err);
        serve_job_release(queued);
        queued = next;
    }
    pthread_join(w->thread, NULL);
}

void serve_worker_free(serve_worker *w) {
    if (!w) return;
    fm_session_free(w->s);
    free(w->held);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}
