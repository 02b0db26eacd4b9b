/* cmd_pull.c: `flashmap pull` downloads the pinned default models (or any REPO FILE) into the model cache.
 * The library (src/io/model_cache.c) does the work; this file parses options, draws progress on stderr
 * (a throttled bar on a terminal, a line per 10% otherwise), turns SIGINT into a clean stop that keeps the
 * partial download (exit 130), and prints where the files are on stdout. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "core/error.h"
#include "io/model_cache.h"

static volatile sig_atomic_t pull_cancel;

static void on_sigint(int sig) {
    (void)sig;
    pull_cancel = 1;
}

/* Progress display state for the file being pulled. */
typedef struct pull_ui {
    int tty;            /* stderr is a terminal: redraw one line */
    const char *name;   /* file name shown */
    double t0;          /* when the current phase started */
    double t_last;      /* last redraw */
    int64_t have0;      /* bytes present when the phase started (resume offset) */
    int64_t have;       /* bytes now */
    int last_decile;    /* last 10% step printed (non-tty) */
    int drawn;          /* a bar is on the current line */
    int64_t drawn_have; /* bytes shown by the last redraw */
} pull_ui;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void human_bytes(double b, char *out, size_t n) {
    const char *u[] = {"B", "kB", "MB", "GB", "TB"};
    int i = 0;
    while (b >= 1000 && i < 4) b /= 1000, i++;
    snprintf(out, n, i ? "%.2f %s" : "%.0f %s", b, u[i]);
}

static void ui_phase(pull_ui *ui) {
    ui->t0 = ui->t_last = now_s();
    ui->have0 = -1;
    ui->last_decile = -1;
}

static void ui_endline(pull_ui *ui) {
    if (ui->drawn) fputc('\n', stderr);
    ui->drawn = 0;
}

static void ui_notice(void *ctx, const char *msg) {
    pull_ui *ui = ctx;
    ui_endline(ui);
    fprintf(stderr, "flashmap: %s\n", msg);
    ui_phase(ui);
}

static void ui_progress(void *ctx, int64_t have, int64_t total) {
    pull_ui *ui = ctx;
    double t = now_s();
    if (ui->have0 < 0) ui->have0 = have;
    ui->have = have;
    int done = total >= 0 && have >= total;
    if (!ui->tty) {
        if (total <= 0) return;
        int decile = (int)(10 * (double)have / (double)total);
        if (decile > ui->last_decile) {
            if (ui->last_decile >= 0 || decile > 0) {
                char h[32], tt[32];
                human_bytes((double)have, h, sizeof h);
                human_bytes((double)total, tt, sizeof tt);
                fprintf(stderr, "flashmap: %s %d%% (%s of %s)\n", ui->name, decile * 10, h, tt);
            }
            ui->last_decile = decile;
        }
        return;
    }
    if (!done && t - ui->t_last < 0.1) return; /* redraw at most 10 times a second */
    if (done && ui->drawn && ui->drawn_have == have) return;
    ui->t_last = t;
    double rate = t > ui->t0 ? (double)(have - ui->have0) / (t - ui->t0) : 0;
    char h[32], tt[32], r[32], eta[32] = "";
    human_bytes((double)have, h, sizeof h);
    human_bytes(rate, r, sizeof r);
    if (total > 0) {
        human_bytes((double)total, tt, sizeof tt);
        double frac = (double)have / (double)total;
        char bar[31];
        int fill = (int)(frac * 30);
        for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
        bar[30] = '\0';
        if (rate > 0 && !done) {
            double s = (double)(total - have) / rate;
            snprintf(eta, sizeof eta, " ETA %dm%02ds", (int)(s / 60), (int)s % 60);
        }
        fprintf(stderr, "\r%s [%s] %5.1f%% %s/%s %s/s%s\033[K", ui->name, bar, 100 * frac, h, tt, r, eta);
    } else {
        fprintf(stderr, "\r%s %s %s/s\033[K", ui->name, h, r);
    }
    ui->drawn = 1;
    ui->drawn_have = have;
}

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: flashmap pull [--target] [--drafter] [--timeout S]\n"
        "       flashmap pull REPO FILE [--revision R] [--size N] [--sha256 HEX] [--timeout S]\n"
        "\n"
        "Downloads model files into the cache and prints where they are (stdout).\n"
        "  (no REPO)        the pinned defaults: --target (Qwen/Qwen3-4B-GGUF Qwen3-4B-Q8_0.gguf) and\n"
        "                   --drafter (j-shen/FlashMap-Qwen3-4B model.safetensors + config.json); both if "
        "neither\n"
        "  REPO FILE        any file of a Hugging Face repository (OWNER/NAME)\n"
        "  --revision R     commit or branch (default main; a branch is not pinned: the resolved commit is\n"
        "                   recorded in the file's marker)\n"
        "  --size N         expected size in bytes (checked before and after the download)\n"
        "  --sha256 HEX     expected sha256 (otherwise the hub's X-Linked-Etag is used when it sends one)\n"
        "  --timeout S      give up when no data arrives for S seconds (default 60); also the connect "
        "timeout\n"
        "\n"
        "A pull interrupted by Ctrl-C, a lost connection or a full disk keeps its partial file; running the\n"
        "same pull again resumes it. Environment: FLASHMAP_CACHE (else $XDG_CACHE_HOME/flashmap, else\n"
        "~/.cache/flashmap), HF_ENDPOINT (default https://huggingface.co), HF_TOKEN (gated repositories).\n");
}

/* Pulls one source, with the progress lines; returns 0, 1 (failed) or 130 (interrupted). */
static int pull_one(const fm_cache_source *src, fm_pull_opts *po, pull_ui *ui, fm_pull_result *res) {
    char err[FM_ERROR_LEN];
    ui->name = src->file;
    ui->drawn = 0;
    ui_phase(ui);
    fprintf(stderr, "flashmap: pulling %s %s at %s\n", src->repo, src->file, src->revision);
    double t0 = now_s();
    int rc = fm_cache_pull(src, po, res, err, sizeof err);
    ui_endline(ui);
    if (rc != 0) {
        if (res->interrupted) {
            fprintf(stderr, "flashmap: interrupted: %s; run the same `flashmap pull` again to resume\n", err);
            return 130;
        }
        fprintf(stderr, "flashmap: %s\n", err);
        return 1;
    }
    if (res->already_complete) {
        fprintf(stderr, "flashmap: %s is already complete in the cache\n", src->file);
    } else {
        double dt = now_s() - t0;
        char b[32], r[32];
        human_bytes((double)res->received, b, sizeof b);
        human_bytes(dt > 0 ? res->received / dt : 0, r, sizeof r);
        fprintf(stderr, "flashmap: done %s: %lld bytes%s%s, downloaded %s in %.1f s (%s/s)\n", src->file,
                (long long)res->size, res->sha256[0] ? ", sha256 " : ", sha256 not checked (none known)",
                res->sha256, b, dt, r);
    }
    if (src->sha256 == NULL && src->size < 0 && strlen(src->revision) != 40)
        fprintf(stderr, "flashmap: note: revision '%s' is not pinned%s%s\n", src->revision,
                res->commit[0] ? "; it resolved to commit " : "", res->commit);
    return 0;
}

int cmd_pull(int argc, char **argv) {
    int want_target = 0, want_drafter = 0;
    const char *pos[2] = {NULL, NULL};
    int npos = 0;
    const char *revision = NULL, *sha = NULL;
    int64_t size = -1;
    double timeout = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--target")) {
            want_target = 1;
        } else if (!strcmp(a, "--drafter")) {
            want_drafter = 1;
        } else if (!strcmp(a, "--revision") || !strcmp(a, "--size") || !strcmp(a, "--sha256") ||
                   !strcmp(a, "--timeout")) {
            if (!next) {
                fprintf(stderr, "flashmap pull: %s needs a value\n", a);
                return 2;
            }
            char *end;
            if (!strcmp(a, "--revision")) {
                revision = next;
            } else if (!strcmp(a, "--sha256")) {
                sha = next;
            } else if (!strcmp(a, "--size")) {
                long long v = strtoll(next, &end, 10);
                if (*end || end == next || v < 0) {
                    fprintf(stderr, "flashmap pull: --size expects a byte count, got '%s'\n", next);
                    return 2;
                }
                size = v;
            } else {
                timeout = strtod(next, &end);
                if (*end || end == next || !(timeout > 0)) {
                    fprintf(stderr, "flashmap pull: --timeout expects seconds > 0, got '%s'\n", next);
                    return 2;
                }
            }
            i++;
        } else if (a[0] == '-') {
            fprintf(stderr, "flashmap pull: unknown option '%s' (try flashmap pull --help)\n", a);
            return 2;
        } else if (npos < 2) {
            pos[npos++] = a;
        } else {
            fprintf(stderr, "flashmap pull: unexpected argument '%s' (expected REPO FILE)\n", a);
            return 2;
        }
    }
    if (npos == 1) {
        fprintf(stderr, "flashmap pull: missing FILE after REPO '%s'\n", pos[0]);
        return 2;
    }
    if (npos == 2 && (want_target || want_drafter)) {
        fprintf(stderr, "flashmap pull: --target/--drafter take no REPO FILE\n");
        return 2;
    }
    if (npos == 0 && (revision || sha || size >= 0)) {
        fprintf(stderr, "flashmap pull: --revision/--size/--sha256 apply to `pull REPO FILE` only\n");
        return 2;
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint; /* no SA_RESTART: a blocking lock wait returns EINTR and sees the flag */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);

    char auth[2048] = "";
    const char *token = getenv("HF_TOKEN");
    if (token && token[0]) snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
    pull_ui ui = {.tty = isatty(STDERR_FILENO)};
    fm_pull_opts po = {.auth_header = auth[0] ? auth : NULL,
                       .connect_timeout_s = timeout,
                       .stall_timeout_s = timeout,
                       .cancel = &pull_cancel,
                       .progress = ui_progress,
                       .notice = ui_notice,
                       .cb_ctx = &ui};
    fm_pull_result res;

    if (npos == 2) {
        fm_cache_source src = {.repo = pos[0],
                               .revision = revision ? revision : "main",
                               .file = pos[1],
                               .size = size,
                               .sha256 = sha};
        int rc = pull_one(&src, &po, &ui, &res);
        if (rc == 0) printf("%s\n", res.path);
        return rc;
    }
    if (!want_target && !want_drafter) want_target = want_drafter = 1;
    for (int k = 0; k < 2; k++) {
        fm_cache_kind kind = k == 0 ? FM_CACHE_TARGET : FM_CACHE_DRAFTER;
        if ((kind == FM_CACHE_TARGET && !want_target) || (kind == FM_CACHE_DRAFTER && !want_drafter))
            continue;
        const fm_cache_source *srcs;
        size_t n = fm_cache_default_sources(kind, &srcs);
        for (size_t i = 0; i < n; i++) {
            int rc = pull_one(&srcs[i], &po, &ui, &res);
            if (rc != 0) return rc;
        }
        char path[4096], err[FM_ERROR_LEN];
        if (fm_cache_resolve_default(kind, path, sizeof path, err, sizeof err) != 0) {
            fprintf(stderr, "flashmap: %s\n", err);
            return 1;
        }
        printf("%s %s\n", kind == FM_CACHE_TARGET ? "target" : "drafter", path);
        fflush(stdout);
    }
    return 0;
}
