/* bench_tokenizer.c: encoding throughput of the tokenizer on one text file, single thread.
 *   bench_tokenizer TOKENIZER_JSON|builtin TEXT_FILE [REPEAT] [IDS_OUT]
 * Builds a tokenizer-only GGUF in /tmp from the tokenizer.json, loads it, encodes the whole file REPEAT times
 * (default 3; the best time counts) and prints one JSON line: bytes, ids, best seconds, MB/s (1 MB = 1e6 B),
 * load seconds. IDS_OUT gets the ids, one per line, so a script can compare them with a reference. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "io/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_meta.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_tokenizer TOKENIZER_JSON|builtin TEXT_FILE [REPEAT] [IDS_OUT]\n");
        return 2;
    }
    const char *json = strcmp(argv[1], "builtin") ? argv[1] : NULL;
    int repeat = argc > 3 ? atoi(argv[3]) : 3;
    char err[512], path[64];
    snprintf(path, sizeof path, "/tmp/bench_tokenizer_%d.gguf", (int)getpid());
    gguf_writer *w = gguf_writer_create();
    int vocab = json ? 151936 : fm_tokenizer_builtin_n_tokens();
    if (fm_tokenizer_write_gguf_metadata(w, json, vocab, err, sizeof err) != 0 ||
        gguf_writer_write(w, path, err, sizeof err) != 0) {
        fprintf(stderr, "bench_tokenizer: %s\n", err);
        return 1;
    }
    gguf_writer_free(w);
    double t0 = now();
    gguf_file *g = gguf_open(path, err, sizeof err);
    fm_tokenizer *tok = NULL;
    if (!g || fm_tokenizer_load_gguf(g, &tok, err, sizeof err) != 0) {
        fprintf(stderr, "bench_tokenizer: %s\n", err);
        return 1;
    }
    gguf_close(g);
    double t_load = now() - t0;
    remove(path);

    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        fprintf(stderr, "bench_tokenizer: %s: cannot open\n", argv[2]);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    if (!text || fread(text, 1, (size_t)n, f) != (size_t)n) return 1;
    fclose(f);

    double best = 1e30;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    for (int r = 0; r < repeat; r++) {
        free(ids);
        double t = now();
        if (fm_tokenizer_encode(tok, text, (size_t)n, 1, &ids, &n_ids, err, sizeof err) != 0) {
            fprintf(stderr, "bench_tokenizer: %s\n", err);
            return 1;
        }
        t = now() - t;
        if (t < best) best = t;
    }
    if (argc > 4) {
        FILE *o = fopen(argv[4], "w");
        for (size_t i = 0; o && i < n_ids; i++) fprintf(o, "%d\n", (int)ids[i]);
        if (o) fclose(o);
    }
    printf("{\"bytes\":%ld,\"ids\":%zu,\"seconds\":%.4f,\"mb_per_s\":%.2f,\"load_seconds\":%.3f}\n", n, n_ids,
           best, (double)n / best / 1e6, t_load);
    free(ids);
    free(text);
    fm_tokenizer_free(tok);
    return 0;
}
