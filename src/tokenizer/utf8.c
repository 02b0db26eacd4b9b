/* utf8.c: see utf8.h. The valid ranges are those of Unicode Table 3-7 (no overlongs, no surrogates,
 * nothing above U+10FFFF). */
#include "tokenizer/utf8.h"

#include <string.h>

int fm_utf8_next(const uint8_t *s, size_t n, int *incomplete) {
    uint8_t b = s[0];
    int need;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (incomplete) *incomplete = 0;
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) {
        need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 2;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 3;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    } else {
        return -1;
    }
    for (int k = 1; k <= need; k++) {
        if ((size_t)k >= n) {
            if (incomplete) *incomplete = 1;
            return -k;
        }
        uint8_t c = s[k];
        uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (c < l || c > h) return -k;
    }
    return need + 1;
}

int fm_utf8_valid(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int k = fm_utf8_next(s + i, n - i, NULL);
        if (k < 0) return 0;
        i += (size_t)k;
    }
    return 1;
}

size_t fm_utf8_lossy(const uint8_t *s, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        int k = fm_utf8_next(s + i, n - i, NULL);
        if (k > 0) {
            memcpy(out + o, s + i, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += (size_t)-k;
        }
    }
    return o;
}

size_t fm_utf8_incomplete_tail(const uint8_t *s, size_t n) {
    /* A sequence is at most 4 bytes: only a lead byte among the last 3 can start an incomplete one. */
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        uint8_t b = s[n - back];
        if (b >= 0x80 && b < 0xC0) continue; /* continuation byte: look further back */
        if (b < 0x80) return 0;
        int inc;
        int k = fm_utf8_next(s + n - back, back, &inc);
        return (k < 0 && inc && (size_t)-k == back) ? back : 0;
    }
    return 0;
}
