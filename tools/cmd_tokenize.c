/* cmd_tokenize.c: `flashmap tokenize -m MODEL.gguf (-p TEXT | -f FILE) [--no-special] [--json]` prints the
 * token ids of a text, space-separated (or {"ids":[...]}). Only the GGUF's tokenizer metadata is read, so any
 * GGUF with a Qwen2/Qwen3 tokenizer works, weights or not. Invalid UTF-8 in the text is tokenized as its
 * U+FFFD-replaced form (see src/tokenizer/tokenizer.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core/error.h"
#include "io/gguf.h"
#include "tokenizer/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f, "usage: flashmap tokenize -m MODEL.gguf (-p TEXT | -f FILE) [--no-special] [--json]\n\n"
               "  -m PATH       GGUF whose tokenizer is used (only its metadata is read)\n"
               "  -p TEXT       the text\n"
               "  -f FILE       read the text from FILE (\"-\" for stdin), byte for byte\n"
               "  --no-special  treat control tokens such as <|im_start|> written in the text as plain text\n"
               "  --json        print {\"ids\":[...]} instead of space-separated ids\n");
}

static char *read_stream(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        char *g = realloc(buf, cap * 2);
        if (!g) {
            free(buf);
            return NULL;
        }
        buf = g;
        cap *= 2;
    }
    if (buf && ferror(f)) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *file = NULL;
    int parse_special = 1, json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "-p") || !strcmp(a, "-f")) && i + 1 < argc) {
            const char **dst = a[1] == 'm' ? &model : a[1] == 'p' ? &text : &file;
            *dst = argv[++i];
        } else if (!strcmp(a, "--no-special")) {
            parse_special = 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else {
            fprintf(stderr, "flashmap tokenize: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!model || (!text) == (!file)) {
        fprintf(stderr, "flashmap tokenize: need -m MODEL.gguf and exactly one of -p TEXT, -f FILE\n");
        usage(stderr);
        return 2;
    }
    char *owned = NULL;
    size_t len = 0;
    if (file) {
        FILE *f = strcmp(file, "-") ? fopen(file, "rb") : stdin;
        if (!f) {
            fprintf(stderr, "flashmap tokenize: %s: cannot open\n", file);
            return 1;
        }
        owned = read_stream(f, &len);
        if (f != stdin) fclose(f);
        if (!owned) {
            fprintf(stderr, "flashmap tokenize: %s: cannot read\n", file);
            return 1;
        }
        text = owned;
    } else {
        len = strlen(text);
    }

    char err[FM_ERROR_LEN];
    gguf_file *g = gguf_open(model, err, sizeof err);
    fm_tokenizer *tok = NULL;
    if (!g || fm_tokenizer_load_gguf(g, &tok, err, sizeof err) != 0) {
        fprintf(stderr, "flashmap tokenize: %s\n", err);
        gguf_close(g);
        free(owned);
        return 1;
    }
    gguf_close(g);
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = fm_tokenizer_encode(tok, text, len, parse_special, &ids, &n, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "flashmap tokenize: %s\n", err);
    } else {
        fputs(json ? "{\"ids\":[" : "", stdout);
        for (size_t i = 0; i < n; i++) printf(i ? (json ? ",%d" : " %d") : "%d", (int)ids[i]);
        fputs(json ? "]}\n" : "\n", stdout);
    }
    free(ids);
    fm_tokenizer_free(tok);
    free(owned);
    return rc ? 1 : 0;
}
