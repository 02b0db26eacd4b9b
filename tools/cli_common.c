#include "cli_common.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_parse_int(const char *cmd, const char *opt, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "flashmap %s: %s expects a whole number from %ld to %ld, got '%s'\n", cmd, opt, lo,
                hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_double(const char *cmd, const char *opt, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "flashmap %s: %s expects a number from %g to %g, got '%s'\n", cmd, opt, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_id_list(const char *cmd, const char *opt, const char *s, int32_t **ids, int *n) {
    size_t cap = 1;
    for (const char *c = s; *c; c++) cap += *c == ',';
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return -1;
    int k = 0;
    const char *c = s;
    while (*c) {
        char *end;
        errno = 0;
        long x = strtol(c, &end, 10);
        if (errno || end == c || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "flashmap %s: %s expects comma-separated token ids, bad entry in '%s'\n", cmd,
                    opt, s);
            free(v);
            return -1;
        }
        v[k++] = (int32_t)x;
        c = *end ? end + 1 : end;
    }
    if (k == 0) {
        fprintf(stderr, "flashmap %s: %s is empty\n", cmd, opt);
        free(v);
        return -1;
    }
    *ids = v;
    *n = k;
    return 0;
}

int cli_read_file(const char *cmd, const char *path, char **data, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "flashmap %s: cannot open %s: %s\n", cmd, path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *b = realloc(buf, cap * 2 + 1);
            if (!b) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = b;
            cap *= 2;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        fprintf(stderr, "flashmap %s: cannot read %s\n", cmd, path);
        free(buf);
        return -1;
    }
    buf[n] = 0;
    *data = buf;
    *len = n;
    return 0;
}

const char *cli_value(const char *cmd, int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "flashmap %s: %s needs a value\n", cmd, argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

/* A JSON string literal (quotes included) of n bytes, escaping quotes, backslashes and control bytes. */
static char *json_string(const char *s, size_t n) {
    char *out = malloc(6 * n + 3), *o = out;
    if (!out) return NULL;
    *o++ = '"';
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            *o++ = '\\';
            *o++ = (char)c;
        } else if (c == '\n') {
            *o++ = '\\';
            *o++ = 'n';
        } else if (c < 0x20) {
            o += sprintf(o, "\\u%04x", c);
        } else {
            *o++ = (char)c;
        }
    }
    *o++ = '"';
    *o = 0;
    return out;
}

int cli_json_add_text(cJSON *obj, const char *name, const char *text, size_t n) {
    char *lit = json_string(text ? text : "", text ? n : 0);
    cJSON *item = lit ? cJSON_AddRawToObject(obj, name, lit) : NULL;
    free(lit);
    return item ? 0 : -1;
}
