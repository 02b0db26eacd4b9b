/* byte_map.c: GPT-2 bytes_to_unicode. The tables are built once on first use (thread-safe via
 * pthread_once); they are tiny and immutable afterwards. */
#include "tokenizer/byte_map.h"

#include <pthread.h>

static uint16_t byte_cp[256];  /* byte -> code point */
static int16_t cp_byte[0x144]; /* code point (< 0x144) -> byte, or -1 */
static pthread_once_t map_once = PTHREAD_ONCE_INIT;

static int byte_is_printable(int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

static void map_init(void) {
    int next = 256;
    for (int i = 0; i < 0x144; i++) cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        byte_cp[b] = (uint16_t)(byte_is_printable(b) ? b : next++);
        cp_byte[byte_cp[b]] = (int16_t)b;
    }
}

uint32_t fm_byte_to_cp(uint8_t b) {
    pthread_once(&map_once, map_init);
    return byte_cp[b];
}

int fm_cp_to_byte(uint32_t cp) {
    pthread_once(&map_once, map_init);
    return cp < 0x144 ? cp_byte[cp] : -1;
}

size_t fm_bytes_to_gpt2(const uint8_t *in, size_t n, char *out) {
    pthread_once(&map_once, map_init);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = byte_cp[in[i]];
        if (cp < 0x80) {
            out[o++] = (char)cp;
        } else {
            out[o++] = (char)(0xC0 | (cp >> 6));
            out[o++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    return o;
}

long fm_gpt2_to_bytes(const char *s, size_t n, uint8_t *out) {
    pthread_once(&map_once, map_init);
    const uint8_t *p = (const uint8_t *)s;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        if (p[i] < 0x80) {
            cp = p[i++];
        } else if ((p[i] & 0xE0) == 0xC0 && i + 1 < n && (p[i + 1] & 0xC0) == 0x80) {
            cp = ((uint32_t)(p[i] & 0x1F) << 6) | (p[i + 1] & 0x3F);
            i += 2;
        } else {
            return -1; /* every mapped code point is 1 or 2 UTF-8 bytes */
        }
        int b = cp < 0x144 ? cp_byte[cp] : -1;
        if (b < 0) return -1;
        out[o++] = (uint8_t)b;
    }
    return (long)o;
}
