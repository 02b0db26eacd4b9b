/* engine_text.c: the text side of flashmap.h (tokenize, detokenize, stop tokens, chat), over the tokenizer
 * stored in the target GGUF. A GGUF without a usable tokenizer still runs on ids; text calls then say why. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "engine_internal.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

struct fm_text_stream {
    const fm_engine *e;
    fm_detok d;
};

void fm_engine_load_tokenizer(fm_engine *e) {
    if (fm_tokenizer_load_gguf(e->model->gguf, &e->tok, e->tok_error, sizeof e->tok_error)) e->tok = NULL;
}

void fm_engine_free_tokenizer(fm_engine *e) {
    fm_tokenizer_free(e->tok);
}

static int need_tokenizer(const fm_engine *e, char *err, size_t errlen) {
    if (e->tok) return 0;
    return fm_set_error(err, errlen, "no usable tokenizer in the model (%s); use --prompt-ids", e->tok_error);
}

int fm_tokenize(const fm_engine *e, const char *text, size_t len, int parse_special, int32_t **ids,
                size_t *n_ids, char *err, size_t errlen) {
    if (need_tokenizer(e, err, errlen)) return -1;
    return fm_tokenizer_encode(e->tok, text, len, parse_special, ids, n_ids, err, errlen);
}

const char *fm_token_bytes(const fm_engine *e, int32_t id, size_t *len) {
    return e->tok ? fm_tokenizer_token_bytes(e->tok, id, len) : NULL;
}

int fm_token_is_stop(const fm_engine *e, int32_t id) {
    return e->tok ? fm_tokenizer_is_stop(e->tok, id) : 0;
}

/* Through the streaming decoder, so the text is valid UTF-8 (invalid bytes become U+FFFD, as HF decodes). */
int fm_detokenize(const fm_engine *e, const int32_t *ids, size_t n, char **out, size_t *len, char *err,
                  size_t errlen) {
    if (need_tokenizer(e, err, errlen)) return -1;
    fm_detok d;
    fm_detok_init(&d);
    size_t cap = 64, used = 0;
    char *text = malloc(cap);
    for (size_t i = 0; text && i <= n; i++) {
        size_t piece_len = 0;
        const char *piece =
            i < n ? fm_detok_push(&d, e->tok, ids[i], &piece_len) : fm_detok_flush(&d, &piece_len);
        if (!piece) {
            free(text);
            fm_detok_free(&d);
            return fm_set_error(err, errlen, "token id %d is out of range", i < n ? (int)ids[i] : -1);
        }
        if (used + piece_len + 1 > cap) {
            while (used + piece_len + 1 > cap) cap *= 2;
            char *grown = realloc(text, cap);
            if (!grown) free(text);
            text = grown;
            if (!text) break;
        }
        memcpy(text + used, piece, piece_len);
        used += piece_len;
    }
    fm_detok_free(&d);
    if (!text) return fm_set_error(err, errlen, "out of memory");
    text[used] = 0;
    *out = text;
    if (len) *len = used;
    return 0;
}

int fm_format_chat(const fm_message *msgs, int n, int enable_thinking, char **out, char *err, size_t errlen) {
    if (n < 1) return fm_set_error(err, errlen, "a chat needs at least one message");
    fm_chat_message *m = calloc((size_t)n, sizeof *m);
    if (!m) return fm_set_error(err, errlen, "out of memory");
    for (int i = 0; i < n; i++) {
        m[i].role = msgs[i].role;
        m[i].content = msgs[i].content;
    }
    int rc = fm_chat_render(m, n, 1, enable_thinking, out, err, errlen);
    free(m);
    return rc;
}

fm_text_stream *fm_text_stream_create(const fm_engine *e) {
    fm_text_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->e = e;
    fm_detok_init(&s->d);
    return s;
}

void fm_text_stream_free(fm_text_stream *s) {
    if (!s) return;
    fm_detok_free(&s->d);
    free(s);
}

const char *fm_text_stream_push(fm_text_stream *s, int32_t id, size_t *len) {
    if (!s->e->tok) return NULL;
    return fm_detok_push(&s->d, s->e->tok, id, len);
}

const char *fm_text_stream_flush(fm_text_stream *s, size_t *len) {
    return fm_detok_flush(&s->d, len);
}
