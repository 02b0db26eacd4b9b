/* error.h: library errors are an int return (0 ok, -1 failed) plus a caller-owned message buffer.
 * Only tools/ may print and exit; library code formats one line naming what is wrong and returns -1. */
#ifndef FM_CORE_ERROR_H
#define FM_CORE_ERROR_H

#include <stddef.h>

#define FM_ERROR_LEN 512

/* Writes the formatted message into err (when err is not NULL and errlen > 0) and returns -1, so that
 * `return fm_set_error(err, errlen, "...")` reads naturally. */
int fm_set_error(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
