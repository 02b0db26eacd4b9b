/* serve_stop.h: stop strings over text that grows at its end. A stream may only hand out text that can no
 * longer become part of a stop string: serve_stop_holdback says how much of the end to keep back. */
#ifndef FM_TOOLS_SERVE_STOP_H
#define FM_TOOLS_SERVE_STOP_H

#include <stddef.h>

/* The earliest start of any of the n stop strings in text[0, len) among the matches that end after byte
 * `checked` (text before it was searched already); -1 when none. */
long serve_stop_find(char *const *stop, int n, const char *text, size_t len, size_t checked);

/* The length of the longest end of text that is a proper prefix of a stop string (0 when none). */
size_t serve_stop_holdback(char *const *stop, int n, const char *text, size_t len);

#endif
