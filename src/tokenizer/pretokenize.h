/* pretokenize.h: the text side of Qwen2/Qwen3 tokenization before BPE: NFC normalisation (utf8proc) and the
 * Qwen2 split regex (PCRE2, UTF + UCP, JIT-compiled), "Isolated" behaviour: every match is one piece and so
 * is any text between matches (the pattern matches every character, so in practice there is none).
 *
 * The regex is tokenizer.json's, with one change: Hugging Face runs it with Oniguruma, whose Unicode \s is
 * the White_Space property, while PCRE2's \s under UCP is the Z category plus \t\n\v\f\r and its \h list;
 * they differ in U+0085 (White_Space, not Z) and U+180E (in PCRE2's \h, no longer White_Space). So \s is
 * spelled out as the 25 White_Space code points. A compiled pattern is shared by all threads; the match data
 * of a call is private to it. */
#ifndef FM_TOKENIZER_PRETOKENIZE_H
#define FM_TOKENIZER_PRETOKENIZE_H

#include <stddef.h>

typedef struct fm_pretok fm_pretok;

fm_pretok *fm_pretok_create(char *err, size_t errlen);
void fm_pretok_free(fm_pretok *p);

/* Called for each piece s[start, end). A non-zero return stops the split and is returned by it. */
typedef int (*fm_pretok_piece_fn)(void *ctx, const char *s, size_t start, size_t end);

/* Splits s[0..n) (valid UTF-8) into pieces. Returns 0, the callback's non-zero value, or -1 with err when the
 * regex engine fails (it reports errors such as a resource limit rather than crashing). */
int fm_pretok_split(const fm_pretok *p, const char *s, size_t n, fm_pretok_piece_fn fn, void *ctx, char *err,
                    size_t errlen);

/* NFC of s[0..n) (valid UTF-8) into a malloc'ed buffer (*out, *out_len; NUL-terminated). Returns 0 or -1. */
int fm_nfc(const char *s, size_t n, char **out, size_t *out_len, char *err, size_t errlen);

#endif
