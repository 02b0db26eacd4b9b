/* sha256.h: SHA-256 for verifying downloaded model files against the hub's sha256, over OpenSSL's libcrypto
 * (EVP). Streaming: init, update any number of times, final. Checked against the FIPS 180-4 example vectors
 * in tests/test_model_cache.c and against Python's hashlib in tests/test_pull.py. */
#ifndef FM_IO_SHA256_H
#define FM_IO_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct fm_sha256 {
    void *ctx; /* EVP_MD_CTX; NULL after final or when allocation failed (final then yields zeros) */
} fm_sha256;

void fm_sha256_init(fm_sha256 *s);
void fm_sha256_update(fm_sha256 *s, const void *data, size_t n);
/* Writes the digest and releases the context. */
void fm_sha256_final(fm_sha256 *s, uint8_t out[32]);

/* Writes the 64 lowercase hex digits of a digest plus a NUL into hex[65]. */
void fm_sha256_hex(const uint8_t digest[32], char hex[65]);

#endif
