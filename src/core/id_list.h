/* id_list.h: appending token ids to a growable array (the decoding loop's output and history, a session's
 * conversation). */
#ifndef FM_CORE_ID_LIST_H
#define FM_CORE_ID_LIST_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Appends src[0..count) to *ids (n used of cap, doubling from 64); 0, or -1 (nothing changed) when out of
 * memory. */
static inline int fm_ids_append(int32_t **ids, int *n, int *cap, const int32_t *src, int count) {
    if (count <= 0) return 0;
    if (*n + count > *cap) {
        int c = *cap ? *cap : 64;
        while (c < *n + count) c *= 2;
        int32_t *p = realloc(*ids, (size_t)c * sizeof *p);
        if (!p) return -1;
        *ids = p, *cap = c;
    }
    memcpy(*ids + *n, src, (size_t)count * sizeof *src);
    *n += count;
    return 0;
}

#endif
