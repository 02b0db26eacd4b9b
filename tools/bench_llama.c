/* bench_llama.c: llama-bench as a subprocess (see bench_llama.h). The child runs without a shell (argv as
 * given, so any model path works); its stdout (the JSON report) is read through a pipe and its stderr (model
 * loading logs) goes to a temporary file that is only shown, as its last line, when the run fails. */
#include "bench_llama.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/error.h"

/* Last non-empty line of a file, for error messages. */
static void last_line(int fd, char *out, size_t outlen) {
    char buf[4096];
    out[0] = 0;
    off_t end = lseek(fd, 0, SEEK_END);
    if (end <= 0) return;
    off_t start = end > (off_t)sizeof buf - 1 ? end - (off_t)sizeof buf + 1 : 0;
    ssize_t n = pread(fd, buf, (size_t)(end - start), start);
    if (n <= 0) return;
    buf[n] = 0;
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) buf[--n] = 0;
    const char *nl = strrchr(buf, '\n'), *line = nl ? nl + 1 : buf;
    size_t len = strlen(line);
    if (len >= outlen) len = outlen - 1; /* keep the start: it names what went wrong */
    memcpy(out, line, len);
    out[len] = 0;
}

/* Runs argv, returns its stdout (malloc'd, NUL-terminated) or NULL with err set. */
static char *run_capture(char *const argv[], char *err, size_t errlen) {
    char tmpl[] = "/tmp/flashmap-llama-bench-XXXXXX";
    int errfd = mkstemp(tmpl);
    if (errfd < 0) {
        fm_set_error(err, errlen, "cannot create a temporary file for llama-bench's log: %s",
                     strerror(errno));
        return NULL;
    }
    unlink(tmpl);
    int fds[2];
    if (pipe(fds)) {
        close(errfd);
        fm_set_error(err, errlen, "pipe: %s", strerror(errno));
        return NULL;
    }
    pid_t pid = fork();
    if (pid < 0) {
        close(errfd);
        close(fds[0]);
        close(fds[1]);
        fm_set_error(err, errlen, "fork: %s", strerror(errno));
        return NULL;
    }
    if (pid == 0) {
        dup2(fds[1], 1);
        dup2(errfd, 2);
        close(fds[0]);
        close(fds[1]);
        close(errfd);
        execv(argv[0], argv);
        fprintf(stderr, "%s: cannot run: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    size_t cap = 1 << 16, len = 0;
    char *out = malloc(cap);
    for (;;) {
        if (out && len + 4096 + 1 > cap) {
            char *p = realloc(out, cap * 2);
            if (!p) {
                free(out);
                out = NULL;
            } else {
                out = p;
                cap *= 2;
            }
        }
        char sink[4096];
        ssize_t n = out ? read(fds[0], out + len, 4096) : read(fds[0], sink, sizeof sink);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        if (out) len += (size_t)n;
    }
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!out) {
        close(errfd);
        fm_set_error(err, errlen, "out of memory reading llama-bench's output");
        return NULL;
    }
    out[len] = 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char line[512];
        last_line(errfd, line, sizeof line);
        close(errfd);
        free(out);
        if (WIFEXITED(status))
            fm_set_error(err, errlen, "%s exited with status %d: %s", argv[0], WEXITSTATUS(status), line);
        else
            fm_set_error(err, errlen, "%s was killed by signal %d: %s", argv[0],
                         WIFSIGNALED(status) ? WTERMSIG(status) : 0, line);
        return NULL;
    }
    close(errfd);
    return out;
}

static void copy_string(const cJSON *obj, const char *key, char *dst, size_t dstlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (cJSON_IsString(v) && dst[0] == 0) snprintf(dst, dstlen, "%s", v->valuestring);
}

const bench_samples *bench_llama_pp_samples(const bench_llama *b, int n_prompt) {
    for (int i = 0; i < b->n_pp; i++)
        if (b->pp[i].n_prompt == n_prompt) return &b->pp[i].ts;
    return NULL;
}

static bench_samples *pp_slot(bench_llama *b, int n_prompt) {
    for (int i = 0; i < b->n_pp; i++)
        if (b->pp[i].n_prompt == n_prompt) return &b->pp[i].ts;
    if (b->n_pp == BENCH_LLAMA_MAX_PP) return NULL;
    b->pp[b->n_pp].n_prompt = n_prompt;
    return &b->pp[b->n_pp++].ts;
}

int bench_llama_run(bench_llama *b, const char *llama_bench, const char *model, int threads,
                    const char *prompts, int n_gen, int reps, char *err, size_t errlen) {
    char t[16], n[16], r[16];
    snprintf(t, sizeof t, "%d", threads);
    snprintf(n, sizeof n, "%d", n_gen);
    snprintf(r, sizeof r, "%d", reps);
    /* -lm none: weights read into memory, not mapped. flashmap's CPU engine copies its weights into memory
     * too, and mapped pages can be dropped between runs (llama.cpp's step was 10x slower with its default
     * mmap on this shared machine). */
    char *argv[] = {(char *)llama_bench,
                    "-m",
                    (char *)model,
                    "-t",
                    t,
                    "-p",
                    (char *)prompts,
                    "-n",
                    n,
                    "-r",
                    r,
                    "-lm",
                    "none",
                    "-o",
                    "json",
                    NULL};
    if (access(llama_bench, X_OK))
        return fm_set_error(err, errlen, "%s: not an executable llama-bench (%s)", llama_bench,
                            strerror(errno));
    char *json = run_capture(argv, err, errlen);
    if (!json) return -1;
    cJSON *root = cJSON_Parse(json);
    free(json);
    if (!cJSON_IsArray(root)) {
        cJSON_Delete(root);
        return fm_set_error(err, errlen, "%s: output is not a JSON array (expected -o json output)",
                            llama_bench);
    }
    int found = 0;
    const cJSON *test;
    cJSON_ArrayForEach(test, root) {
        const cJSON *np = cJSON_GetObjectItemCaseSensitive(test, "n_prompt");
        const cJSON *ng = cJSON_GetObjectItemCaseSensitive(test, "n_gen");
        const cJSON *samples = cJSON_GetObjectItemCaseSensitive(test, "samples_ts");
        if (!cJSON_IsNumber(np) || !cJSON_IsNumber(ng) || !cJSON_IsArray(samples)) continue;
        bench_samples *dst = np->valueint > 0 && ng->valueint == 0   ? pp_slot(b, np->valueint)
                             : ng->valueint > 0 && np->valueint == 0 ? &b->tg_ts
                                                                     : NULL;
        if (!dst) continue;
        const cJSON *s;
        cJSON_ArrayForEach(s, samples) {
            if (cJSON_IsNumber(s)) bench_samples_add(dst, s->valuedouble);
        }
        copy_string(test, "build_commit", b->build_commit, sizeof b->build_commit);
        copy_string(test, "cpu_info", b->cpu_info, sizeof b->cpu_info);
        found++;
    }
    cJSON_Delete(root);
    if (!found)
        return fm_set_error(err, errlen, "%s: the JSON report holds no pp/tg test with samples_ts",
                            llama_bench);
    b->runs++;
    return 0;
}
