/* fuzz_tokenizer.c: libFuzzer target for the tokenizer. Arbitrary bytes are encoded with and without
 * special-token parsing (with the builtin vocabulary: every code path of the real one, a small table), then
 * decoded back whole and through the streaming decoder. Invariants checked: encode never fails on any input,
 * ids are in range, decode(encode(s)) equals the lossy-UTF-8 form of s whenever that form is already NFC
 * (checked by comparing with utf8proc), and the streamed text is valid UTF-8. The first byte also picks a
 * chat rendering over the input split into messages. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "io/gguf.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_meta.h"
#include "tokenizer/utf8.h"

static fm_tokenizer *tok;

static void fuzz_setup(void) {
    char err[512], path[] = "/tmp/fuzz_tokenizer_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) abort();
    gguf_writer *w = gguf_writer_create();
    int n = fm_tokenizer_builtin_n_tokens();
    if (fm_tokenizer_write_gguf_metadata(w, NULL, n, err, sizeof err) != 0 ||
        gguf_writer_write(w, path, err, sizeof err))
        abort();
    gguf_writer_free(w);
    gguf_file *g = gguf_open(path, err, sizeof err);
    if (!g || fm_tokenizer_load_gguf(g, &tok, err, sizeof err) != 0) abort();
    gguf_close(g);
    remove(path);
}

static void check_roundtrip(const uint8_t *data, size_t size, const int32_t *ids, size_t n,
                            int parse_special) {
    char *back = NULL, err[256];
    size_t blen = 0;
    if (fm_tokenizer_decode(tok, ids, n, &back, &blen, err, sizeof err) != 0) abort();
    char *lossy = malloc(3 * size + 1);
    size_t llen = fm_utf8_lossy(data, size, lossy);
    lossy[llen] = 0;
    /* Only when the text is already NFC (and has no NUL, which utf8proc's NUL-terminated path would stop at).
     */
    utf8proc_uint8_t *nfc = NULL;
    int has_nul = memchr(lossy, 0, llen) != NULL;
    utf8proc_ssize_t r = has_nul ? -1
                                 : utf8proc_map((const utf8proc_uint8_t *)lossy, (utf8proc_ssize_t)llen, &nfc,
                                                UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (r >= 0 && (size_t)r == llen && memcmp(nfc, lossy, llen) == 0) {
        if (blen != llen || memcmp(back, lossy, llen) != 0) abort();
    }
    (void)parse_special;
    free(nfc);
    free(lossy);
    free(back);
}

static void check_stream(const int32_t *ids, size_t n) {
    fm_detok d;
    fm_detok_init(&d);
    for (size_t i = 0; i <= n; i++) {
        size_t len;
        const char *s = i < n ? fm_detok_push(&d, tok, ids[i], &len) : fm_detok_flush(&d, &len);
        if (!s || !fm_utf8_valid((const uint8_t *)s, len)) abort();
    }
    fm_detok_free(&d);
}

static void check_chat(const uint8_t *data, size_t size) {
    /* Messages are the NUL-separated parts of the input (after a lossy fix), roles cycling by the first byte.
     */
    static const char *const roles[] = {"system", "user", "assistant", "tool", "other"};
    char *text = malloc(3 * size + 1);
    size_t len = fm_utf8_lossy(data, size, text);
    text[len] = 0;
    fm_chat_message m[8];
    int n = 0;
    unsigned sel = size ? data[0] : 0;
    for (char *p = text; n < 8;) {
        m[n].role = roles[(sel + (unsigned)n * 7) % 5];
        m[n].content = p;
        m[n].reasoning_content = (sel & 0x80) && n == 2 ? "r" : NULL;
        n++;
        char *z = memchr(p, 0, (size_t)(text + len - p));
        if (!z || z >= text + len) break;
        p = z + 1;
    }
    char *out = NULL, err[128];
    if (fm_chat_render(m, n, sel & 1, (sel >> 1) & 1, &out, err, sizeof err) != 0) abort();
    free(out);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!tok) fuzz_setup();
    for (int ps = 0; ps < 2; ps++) {
        int32_t *ids = NULL;
        size_t n = 0;
        char err[256];
        if (fm_tokenizer_encode(tok, (const char *)data, size, ps, &ids, &n, err, sizeof err) != 0) abort();
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= fm_tokenizer_n_tokens(tok)) abort();
        check_roundtrip(data, size, ids, n, ps);
        check_stream(ids, n);
        free(ids);
    }
    check_chat(data, size);
    return 0;
}
