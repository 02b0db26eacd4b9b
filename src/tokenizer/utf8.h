/* utf8.h: UTF-8 validation with the "maximal subpart" rule that Rust's String::from_utf8_lossy and
 * Python's bytes.decode("utf-8", "replace") both follow: each maximal invalid subsequence becomes one
 * U+FFFD. The tokenizer maps invalid input through it, so invalid bytes tokenize exactly like the
 * lossy-decoded string does in Hugging Face tokenizers. */
#ifndef FM_TOKENIZER_UTF8_H
#define FM_TOKENIZER_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* At s[0..n): returns k > 0 when a valid sequence of k bytes starts there; otherwise -k where k >= 1 is the
 * length of the maximal subpart (bytes that are a valid prefix, or 1). Sets *incomplete when the invalidity
 * is only that the input ends inside a valid prefix. n must be >= 1. */
int fm_utf8_next(const uint8_t *s, size_t n, int *incomplete);
/* 1 when s[0..n) is entirely valid UTF-8. */
int fm_utf8_valid(const uint8_t *s, size_t n);
/* Lossy conversion of s[0..n) into out, which has room for 3*n bytes; returns the length written. */
size_t fm_utf8_lossy(const uint8_t *s, size_t n, char *out);
/* Number of trailing bytes (0..3) of s[0..n) that form an incomplete but so-far valid sequence. */
size_t fm_utf8_incomplete_tail(const uint8_t *s, size_t n);

#endif
