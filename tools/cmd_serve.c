/* cmd_serve.c: `flashmap serve`: an OpenAI-compatible HTTP server (GET /health, GET /v1/models,
 * POST /v1/completions, POST /v1/chat/completions, streaming or not) over one engine.
 *
 * Start-up order: the port is bound before the model loads, so a port in use fails at once; requests that
 * arrive while the model loads wait in the listen queue. SIGINT / SIGTERM (through a self-pipe, so the
 * handler only writes a byte) stop the worker (cancelling the running generation and failing queued ones
 * with 503), then the HTTP server, then free the engine; a second signal ends the process at once. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cli_common.h"
#include "flashmap.h"
#include "io/model_cache.h"
#include "serve_http.h"

#define CMD "serve"
#define MAX_BODY (2u << 20) /* request bodies: 2 MiB */

typedef struct {
    const char *model, *drafter, *host;
    int port, threads, n_ctx, draft_weights, keep_mmap, spec, verify, fallback;
    int device; /* fm_device */
} serve_opts;

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: flashmap serve [-m TARGET.gguf] [-d DRAFTER] [--host ADDR] [--port N] [-t THREADS]\n"
        "                      [--ctx N] [--no-spec] [--verify adaptive|K] [--no-fallback]\n"
        "                      [--device cpu|cuda|auto] [--draft-weights auto|q8_0|stored] [--mmap]\n\n"
        "An OpenAI-compatible HTTP server: GET /health, GET /v1/models, POST /v1/completions and\n"
        "POST /v1/chat/completions (\"stream\": true for Server-Sent Events). Decoding is greedy and\n"
        "lossless; requests run one at a time in arrival order. See docs/SERVER.md.\n\n"
        "  -m PATH           target model (Qwen3 dense GGUF); default: the cached pinned Qwen3-4B\n"
        "  -d PATH           FlashMap drafter (.safetensors or a folder); default with neither -m nor -d:\n"
        "                    the cached pinned drafter\n"
        "  --host ADDR       address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)\n"
        "  --port N          TCP port (default 8080; 0: any free port, printed at start)\n"
        "  -t N              threads (default: all cores)\n"
        "  --ctx N           KV cache size in tokens (default 4096): prompt + reply per request\n"
        "  --no-spec         plain decoding even with a drafter\n"
        "  --verify MODE     drafts verified per round: adaptive (default) or a fixed K\n"
        "  --no-fallback     never fall back to plain steps when drafting loses\n"
        "  --device D        cpu, cuda or auto (default)\n"
        "  --draft-weights W the drafter's matrices on the CPU: auto/q8_0 (a Q8_0 copy) or stored\n"
        "  --mmap            CPU: read the weights from the file mapping instead of huge pages\n");
}

static int parse(int argc, char **argv, serve_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->spec = 1;
    o->fallback = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long n;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        }
#define VALUE()                                                                                              \
    if (!(v = cli_value(CMD, argc, argv, &i))) return -1
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            VALUE();
            o->model = v;
        } else if (!strcmp(a, "-d") || !strcmp(a, "--drafter")) {
            VALUE();
            o->drafter = v;
        } else if (!strcmp(a, "--host")) {
            VALUE();
            o->host = v;
        } else if (!strcmp(a, "--port")) {
            VALUE();
            if (cli_parse_int(CMD, a, v, 0, 65535, &n)) return -1;
            o->port = (int)n;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            VALUE();
            if (cli_parse_int(CMD, a, v, 1, 1024, &n)) return -1;
            o->threads = (int)n;
        } else if (!strcmp(a, "--ctx")) {
            VALUE();
            if (cli_parse_int(CMD, a, v, 16, 1 << 20, &n)) return -1;
            o->n_ctx = (int)n;
        } else if (!strcmp(a, "--verify")) {
            VALUE();
            if (cli_parse_verify(CMD, a, v, FM_MAX_BLOCK, &o->verify)) return -1;
        } else if (!strcmp(a, "--device")) {
            VALUE();
            if (cli_parse_device(CMD, a, v, &o->device)) return -1;
        } else if (!strcmp(a, "--draft-weights")) {
            VALUE();
            if (cli_parse_draft_weights(CMD, a, v, &o->draft_weights)) return -1;
        } else if (!strcmp(a, "--no-spec")) {
            o->spec = 0;
        } else if (!strcmp(a, "--no-fallback")) {
            o->fallback = 0;
        } else if (!strcmp(a, "--mmap")) {
            o->keep_mmap = 1;
        } else {
            fprintf(stderr, "flashmap %s: unknown option '%s' (see --help)\n", CMD, a);
            return -1;
        }
#undef VALUE
    }
    return 0;
}

static int sig_pipe[2] = {-1, -1};

static void on_signal(int sig) {
    const int saved = errno;
    const unsigned char b = (unsigned char)sig;
    if (write(sig_pipe[1], &b, 1) < 0) { /* the pipe is full: a signal is pending already */
    }
    errno = saved;
}

static void set_handler(int sig, void (*fn)(int)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, NULL);
}

/* Blocks until SIGINT or SIGTERM; returns the signal. */
static int wait_for_signal(void) {
    unsigned char b = 0;
    while (read(sig_pipe[0], &b, 1) < 0 && errno == EINTR) {
    }
    return b;
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

int cmd_serve(int argc, char **argv) {
    serve_opts o;
    if (parse(argc, argv, &o)) return 2;
    char err[FM_ERRBUF_SIZE], model_path[4096], drafter_path[4096];
    if (!o.model) {
        /* No -m: the cached pinned target, and its pinned drafter unless --no-spec or -d says otherwise. */
        if (fm_cache_resolve_default(FM_CACHE_TARGET, model_path, sizeof model_path, err, sizeof err)) {
            fprintf(stderr, "flashmap %s: no -m given and %s\n", CMD, err);
            return 1;
        }
        o.model = model_path;
        if (!o.drafter && o.spec &&
            fm_cache_resolve_default(FM_CACHE_DRAFTER, drafter_path, sizeof drafter_path, err, sizeof err) ==
                0)
            o.drafter = drafter_path;
    }
    int port = o.port;
    int fd = serve_http_listen(o.host, o.port, &port, err, sizeof err);
    if (fd < 0) {
        fprintf(stderr, "flashmap %s: %s\n", CMD, err);
        return 1;
    }
    fm_engine_params ep;
    fm_engine_params_init(&ep);
    ep.model_path = o.model;
    ep.drafter_path = o.spec ? o.drafter : NULL;
    ep.n_threads = o.threads;
    ep.n_ctx = o.n_ctx;
    ep.device = o.device;
    ep.drafter_weights = (fm_draft_weights)o.draft_weights;
    ep.keep_mmap = o.keep_mmap;
    fm_engine *e = NULL;
    if (fm_engine_load(&ep, &e, err, sizeof err)) {
        fprintf(stderr, "flashmap %s: %s\n", CMD, err);
        close(fd);
        return 1;
    }
    fm_engine_info info;
    fm_engine_get_info(e, &info);
    const serve_worker_params wp = {
        .speculative = o.spec && info.has_drafter, .verify = o.verify, .fallback = o.fallback};
    const serve_http_config cfg = {.model = base_name(o.model),
                                   .created = (long)time(NULL),
                                   .n_ctx = info.n_ctx,
                                   .max_body = MAX_BODY,
                                   .worker = serve_worker_start(e, &wp, err, sizeof err)};
    serve_http *http = NULL;
    if (!cfg.worker || !(http = serve_http_start(fd, &cfg, err, sizeof err))) {
        fprintf(stderr, "flashmap %s: %s\n", CMD, err);
        if (!cfg.worker) close(fd);
        serve_worker_stop(cfg.worker);
        serve_worker_free(cfg.worker);
        fm_engine_free(e);
        return 1;
    }
    set_handler(SIGPIPE, SIG_IGN);
    int rc = 0;
    if (pipe(sig_pipe)) {
        fprintf(stderr, "flashmap %s: cannot create a pipe: %s\n", CMD, strerror(errno));
        rc = 1;
    } else {
        set_handler(SIGINT, on_signal);
        set_handler(SIGTERM, on_signal);
        const int v6 = strchr(o.host, ':') != NULL;
        fprintf(stderr,
                "flashmap %s: listening on http://%s%s%s:%d (model %s, %s, context %d, %s) - Ctrl-C stops\n",
                CMD, v6 ? "[" : "", o.host, v6 ? "]" : "", port, cfg.model,
                wp.speculative ? "speculative" : "plain decoding", info.n_ctx, info.device);
        const int sig = wait_for_signal();
        set_handler(SIGINT, SIG_DFL); /* a second signal ends the process at once */
        set_handler(SIGTERM, SIG_DFL);
        fprintf(stderr, "flashmap %s: %s: shutting down\n", CMD, sig == SIGINT ? "SIGINT" : "SIGTERM");
    }
    serve_worker_stop(cfg.worker);
    serve_http_drain(http, 2000);
    serve_http_stop(http); /* after the worker: no connection waits for a job any more */
    serve_worker_free(cfg.worker);
    fm_engine_free(e);
    if (sig_pipe[0] >= 0) {
        close(sig_pipe[0]);
        close(sig_pipe[1]);
    }
    if (rc == 0) fprintf(stderr, "flashmap %s: stopped\n", CMD);
    return rc;
}
