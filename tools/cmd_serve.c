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
#include "cli_engine.h"
#include "flashmap.h"
#include "io/model_cache.h"
#include "serve_http.h"

#define CMD "serve"
#define MAX_BODY (2u << 20) /* request bodies: 2 MiB */

typedef struct {
    cli_engine_opts eng;
    const char *host;
    int port;
} serve_opts;

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: flashmap serve [-m TARGET.gguf] [-d DRAFTER] [--host ADDR] [--port N] [-t THREADS]\n"
        "                      [--ctx N] [--no-spec] [--verify adaptive|K] [--no-fallback]\n"
        "                      [--device cpu|cuda|auto] [--draft-weights auto|q8_0|stored] [--mmap]\n"
        "                      [--temp T] [--top-k N] [--top-p P] [--min-p P] [--seed N]\n\n"
        "An OpenAI-compatible HTTP server: GET /health, GET /v1/models, POST /v1/completions and\n"
        "POST /v1/chat/completions (\"stream\": true for Server-Sent Events). Decoding is lossless:\n"
        "speculative output is exactly plain output, greedy or sampled with a seed. Requests run one at\n"
        "a time in arrival order. See docs/SERVER.md.\n\n"
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
        "  --draft-weights W the drafter's matrices (CPU and CUDA): auto/q8_0 (a Q8_0 copy) or stored\n"
        "  --mmap            CPU: read the weights from the file mapping instead of huge pages\n"
        "\nSampling: the defaults for requests that leave temperature, top_k, top_p, min_p or seed out\n"
        "(without --temp, greedy; unlike OpenAI, whose default temperature is 1):\n" CLI_SAMPLING_HELP
        "                    (serve: a fresh one per sampled request, in the reply's flashmap.seed;\n"
        "                    with --seed N, N for every request that gives none)\n");
}

static int parse(int argc, char **argv, serve_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    cli_engine_opts_init(&o->eng);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long n;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        }
        const int engine = cli_engine_opt(CMD, argc, argv, &i, 0, &o->eng);
        if (engine < 0) return -1;
        if (engine) continue;
#define VALUE()                                                                                              \
    if (!(v = cli_value(CMD, argc, argv, &i))) return -1
        if (!strcmp(a, "--host")) {
            VALUE();
            o->host = v;
        } else if (!strcmp(a, "--port")) {
            VALUE();
            if (cli_parse_int(CMD, a, v, 0, 65535, &n)) return -1;
            o->port = (int)n;
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
    char err[FM_ERRBUF_SIZE];
    if (cli_engine_resolve_defaults(CMD, &o.eng)) return 1;
    int port = o.port;
    int fd = serve_http_listen(o.host, o.port, &port, err, sizeof err);
    if (fd < 0) {
        fprintf(stderr, "flashmap %s: %s\n", CMD, err);
        return 1;
    }
    fm_engine_params ep;
    cli_engine_params(&o.eng, &ep);
    fm_engine *e = NULL;
    if (fm_engine_load(&ep, &e, err, sizeof err)) {
        fprintf(stderr, "flashmap %s: %s\n", CMD, err);
        close(fd);
        return 1;
    }
    cli_print_device_note(CMD, e);
    fm_engine_info info;
    fm_engine_get_info(e, &info);
    const serve_worker_params wp = {
        .speculative = o.eng.spec && info.has_drafter, .verify = o.eng.verify, .fallback = o.eng.fallback};
    const serve_http_config cfg = {.model = base_name(o.eng.model),
                                   .created = (long)time(NULL),
                                   .n_ctx = info.n_ctx,
                                   .max_body = MAX_BODY,
                                   .sampling = {o.eng.sampling, o.eng.seed_given},
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
        char sampled[64] = "";
        if (o.eng.sampling.temperature > 0)
            snprintf(sampled, sizeof sampled, ", temperature %g by default",
                     (double)o.eng.sampling.temperature);
        fprintf(
            stderr,
            "flashmap %s: listening on http://%s%s%s:%d (model %s, %s%s, context %d, %s) - Ctrl-C stops\n",
            CMD, v6 ? "[" : "", o.host, v6 ? "]" : "", port, cfg.model,
            wp.speculative ? "speculative" : "plain decoding", sampled, info.n_ctx, info.device);
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
