/* sha256.h: SHA-256 (FIPS 180-4) for verifying downloaded model files against the hub's sha256.
 * Streaming: init, update any number of times, final. Pure computation: no I/O, no allocation.
 * A small implementation of our own because libcrypto is not linked into libflashmap; it is checked
 * against the FIPS 180-4 example vectors in tests/test_model_cache.c and against Python's hashlib in
 * tests/test_pull.py. */
#ifndef FM_IO_SHA256_H
#define FM_IO_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct fm_sha256 {
    uint32_t state[8]; /* running hash H0..H7 */
    uint64_t nbytes;   /* message length so far, in bytes */
    uint8_t block[64]; /* pending partial block */
    size_t nblock;     /* bytes used in block, < 64 */
} fm_sha256;

void fm_sha256_init(fm_sha256 *s);
void fm_sha256_update(fm_sha256 *s, const void *data, size_t n);
void fm_sha256_final(fm_sha256 *s, uint8_t out[32]);

/* Writes the 64 lowercase hex digits of a digest plus a NUL into hex[65]. */
void fm_sha256_hex(const uint8_t digest[32], char hex[65]);

#endif
