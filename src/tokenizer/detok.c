/* detok.c: the streaming detokenizer (see tokenizer.h). Invariant: held[0..n_held) is a valid but incomplete
 * UTF-8 prefix (at most 3 bytes); everything before it has been handed out. Holding back exactly the
 * incomplete tail keeps the output equal to a lossy decode of the whole stream: a prefix that later turns out
 * invalid is one maximal subpart, hence one U+FFFD, in both. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

void fm_detok_init(fm_detok *d) {
    memset(d, 0, sizeof *d);
}

void fm_detok_free(fm_detok *d) {
    free(d->buf);
    memset(d, 0, sizeof *d);
}

const char *fm_detok_push_bytes(fm_detok *d, const uint8_t *bytes, size_t n, size_t *len) {
    size_t total = d->n_held + n;
    /* Worst case: every byte becomes a 3-byte U+FFFD; scratch copy of held + new bytes sits after that. */
    size_t need = 3 * total + total + 1;
    if (d->cap < need) {
        char *b = realloc(d->buf, need);
        if (!b) return NULL;
        d->buf = b;
        d->cap = need;
    }
    uint8_t *in = (uint8_t *)d->buf + 3 * total + 1;
    memcpy(in, d->held, d->n_held);
    if (n) memcpy(in + d->n_held, bytes, n);
    size_t tail = fm_utf8_incomplete_tail(in, total);
    size_t o = fm_utf8_lossy(in, total - tail, d->buf);
    memcpy(d->held, in + total - tail, tail);
    d->n_held = tail;
    d->buf[o] = 0;
    *len = o;
    return d->buf;
}

const char *fm_detok_push(fm_detok *d, const fm_tokenizer *tok, int32_t id, size_t *len) {
    size_t n;
    const char *b = fm_tokenizer_token_bytes(tok, id, &n);
    if (!b) return NULL;
    return fm_detok_push_bytes(d, (const uint8_t *)b, n, len);
}

const char *fm_detok_flush(fm_detok *d, size_t *len) {
    size_t need = 3 * d->n_held + 1;
    if (d->cap < need) {
        char *b = realloc(d->buf, need);
        if (!b) return NULL;
        d->buf = b;
        d->cap = need;
    }
    size_t o = fm_utf8_lossy(d->held, d->n_held, d->buf);
    d->n_held = 0;
    d->buf[o] = 0;
    *len = o;
    return d->buf;
}
