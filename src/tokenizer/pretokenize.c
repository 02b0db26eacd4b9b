/* pretokenize.c: see pretokenize.h. */
#include "tokenizer/pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/error.h"

/* tokenizer.json's Qwen2 pattern with \s spelled out as Oniguruma's (Unicode White_Space, see pretokenize.h).
 */
#define WS                                                                                                   \
    "\\t\\n\\x{0b}\\f\\r "                                                                                   \
    "\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"
static const char qwen2_pattern[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
                                    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+"
                                    "|\\p{N}"
                                    "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*"
                                    "|[" WS "]*[\\r\\n]+"
                                    "|[" WS "]+(?![^" WS "])"
                                    "|[" WS "]+";
#undef WS

struct fm_pretok {
    pcre2_code *code;
    int jit; /* 1 when JIT compilation succeeded */
};

fm_pretok *fm_pretok_create(char *err, size_t errlen) {
    fm_pretok *p = calloc(1, sizeof *p);
    if (!p) {
        fm_set_error(err, errlen, "pre-tokenizer: out of memory");
        return NULL;
    }
    int ec;
    PCRE2_SIZE eo;
    p->code = pcre2_compile((PCRE2_SPTR)qwen2_pattern, PCRE2_ZERO_TERMINATED,
                            PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &ec, &eo, NULL);
    if (!p->code) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        fm_set_error(err, errlen, "pre-tokenizer: PCRE2 cannot compile the Qwen2 pattern at %zu: %s",
                     (size_t)eo, (const char *)msg);
        free(p);
        return NULL;
    }
    p->jit = pcre2_jit_compile(p->code, PCRE2_JIT_COMPLETE) == 0;
    return p;
}

void fm_pretok_free(fm_pretok *p) {
    if (!p) return;
    pcre2_code_free(p->code);
    free(p);
}

/* One match from pos; on a JIT stack overflow (deep backtracking on long whitespace runs) retries with a
 * large JIT stack, created only then, so that ordinary calls map no memory. */
static int pretok_match(const fm_pretok *p, const char *s, size_t n, size_t pos, pcre2_match_data *md,
                        pcre2_match_context *mc, pcre2_jit_stack **js) {
    if (!p->jit) return pcre2_match(p->code, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, mc);
    int m = pcre2_jit_match(p->code, (PCRE2_SPTR)s, n, pos, 0, md, *js ? mc : NULL);
    if (m == PCRE2_ERROR_JIT_STACKLIMIT && !*js) {
        *js = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
        if (!*js) return m;
        pcre2_jit_stack_assign(mc, NULL, *js);
        m = pcre2_jit_match(p->code, (PCRE2_SPTR)s, n, pos, 0, md, mc);
    }
    return m;
}

int fm_pretok_split(const fm_pretok *p, const char *s, size_t n, fm_pretok_piece_fn fn, void *ctx, char *err,
                    size_t errlen) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(p->code, NULL);
    pcre2_match_context *mc = pcre2_match_context_create(NULL);
    pcre2_jit_stack *js = NULL;
    int rc = 0;
    if (!md || !mc) {
        rc = fm_set_error(err, errlen, "pre-tokenizer: out of memory");
        goto done;
    }
    size_t pos = 0, last = 0;
    while (pos < n) {
        int m = pretok_match(p, s, n, pos, md, mc, &js);
        if (m == PCRE2_ERROR_NOMATCH) break;
        if (m < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(m, msg, sizeof msg);
            rc = fm_set_error(err, errlen, "pre-tokenizer: PCRE2 match failed at byte %zu: %s", pos,
                              (const char *)msg);
            goto done;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms > last && (rc = fn(ctx, s, last, ms)) != 0) goto done;
        if (me > ms && (rc = fn(ctx, s, ms, me)) != 0) goto done;
        last = me;
        if (me > pos) {
            pos = me;
        } else { /* an empty match (the pattern has none, but be safe): step one character */
            pos++;
            while (pos < n && ((unsigned char)s[pos] & 0xC0) == 0x80) pos++;
        }
    }
    if (last < n) rc = fn(ctx, s, last, n);
done:
    pcre2_jit_stack_free(js);
    pcre2_match_context_free(mc);
    pcre2_match_data_free(md);
    return rc;
}

int fm_nfc(const char *s, size_t n, char **out, size_t *out_len, char *err, size_t errlen) {
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (r < 0) return fm_set_error(err, errlen, "NFC normalisation failed: %s", utf8proc_errmsg(r));
    *out = (char *)dst;
    *out_len = (size_t)r;
    return 0;
}
