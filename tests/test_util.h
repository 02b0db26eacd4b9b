/* test_util.h: the tiny harness every tests/test_*.c uses. CHECK records a failure and goes on; each test
 * file ends main() with `return fm_test_report("name")`, which prints "N passed, M failed" and sets the exit.
 */
#ifndef FM_TEST_UTIL_H
#define FM_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "io/sha256.h"

static int fm_test_passed, fm_test_failed;

#define CHECK(cond)                                                                                          \
    do {                                                                                                     \
        if (cond) {                                                                                          \
            fm_test_passed++;                                                                                \
        } else {                                                                                             \
            fm_test_failed++;                                                                                \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                         \
        }                                                                                                    \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                                 \
    do {                                                                                                     \
        if (cond) {                                                                                          \
            fm_test_passed++;                                                                                \
        } else {                                                                                             \
            fm_test_failed++;                                                                                \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);                         \
            fprintf(stderr, __VA_ARGS__);                                                                    \
            fputc('\n', stderr);                                                                             \
        }                                                                                                    \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                                                \
    CHECK_MSG(fabs((double)(a) - (double)(b)) <= (tol), "%g vs %g (tol %g)", (double)(a), (double)(b),       \
              (double)(tol))

/* A directory the test may write to (the build dir's tmp), created on demand. */
static inline const char *fm_test_tmpdir(void) {
    static char dir[1024];
    if (!dir[0]) {
        const char *b = getenv("FM_BINARY_DIR");
        snprintf(dir, sizeof dir, "%s/test-tmp", b ? b : "/tmp");
        char cmd[1100];
        snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
        if (system(cmd) != 0) fprintf(stderr, "cannot create %s\n", dir);
    }
    return dir;
}

/* Whole file, NUL-terminated (malloc'd; NULL when unreadable); *len gets its size when len != NULL. */
static inline char *fm_test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[n] = 0;
    if (b && len) *len = (size_t)n;
    return b;
}

/* sha256 of a file as 64 hex digits; -1 when it cannot be read. */
static inline int fm_test_sha256_file(const char *path, char hex[65]) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fm_sha256 s;
    fm_sha256_init(&s);
    unsigned char buf[1 << 14];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) fm_sha256_update(&s, buf, n);
    const int bad = ferror(f);
    fclose(f);
    uint8_t d[32];
    fm_sha256_final(&s, d);
    fm_sha256_hex(d, hex);
    return bad ? -1 : 0;
}

static inline int fm_test_report(const char *name) {
    printf("%s: %d passed, %d failed\n", name, fm_test_passed, fm_test_failed);
    if (fm_test_passed == 0 && fm_test_failed == 0) {
        fprintf(stderr, "%s: no checks ran\n", name);
        return 1;
    }
    return fm_test_failed ? 1 : 0;
}

#endif
