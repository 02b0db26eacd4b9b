/* byte_map.h: the GPT-2 byte-to-unicode map that byte-level BPE vocabularies (GPT-2, Qwen) use to spell
 * every byte as a printable code point: printable Latin-1 bytes map to themselves, the other 68 bytes to
 * U+0100..U+0143 in byte order. Every mapped code point is below U+0800, so it takes at most 2 UTF-8 bytes.
 */
#ifndef FM_TOKENIZER_BYTE_MAP_H
#define FM_TOKENIZER_BYTE_MAP_H

#include <stddef.h>
#include <stdint.h>

/* The code point that spells byte b. */
uint32_t fm_byte_to_cp(uint8_t b);
/* The byte a code point spells, or -1 when cp is not in the map. */
int fm_cp_to_byte(uint32_t cp);
/* Spells n bytes as UTF-8 into out (room for 2*n bytes, no NUL added); returns the length written. */
size_t fm_bytes_to_gpt2(const uint8_t *in, size_t n, char *out);
/* Inverse of fm_bytes_to_gpt2: out has room for n bytes; returns the byte count, or -1 when s is not
 * valid UTF-8 made only of mapped code points. */
long fm_gpt2_to_bytes(const char *s, size_t n, uint8_t *out);

#endif
