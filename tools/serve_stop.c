/* serve_stop.c: stop-string search and hold-back (see serve_stop.h). Stop strings are short (the request
 * parser allows 256 bytes), so plain scans are enough. */
#include "serve_stop.h"

#include <string.h>

long serve_stop_find(char *const *stop, int n, const char *text, size_t len, size_t checked) {
    long best = -1;
    for (int i = 0; i < n; i++) {
        const size_t k = strlen(stop[i]);
        if (k == 0 || k > len) continue;
        /* A new match ends after `checked`, so it starts at checked - k + 1 or later. */
        size_t from = checked + 1 > k ? checked + 1 - k : 0;
        const char *hit = from < len ? memmem(text + from, len - from, stop[i], k) : NULL;
        if (hit && (best < 0 || hit - text < best)) best = hit - text;
    }
    return best;
}

size_t serve_stop_holdback(char *const *stop, int n, const char *text, size_t len) {
    size_t keep = 0;
    for (int i = 0; i < n; i++) {
        const size_t k = strlen(stop[i]);
        if (k == 0) continue;
        for (size_t j = k - 1 < len ? k - 1 : len; j > keep; j--)
            if (memcmp(text + len - j, stop[i], j) == 0) {
                keep = j;
                break;
            }
    }
    return keep;
}
