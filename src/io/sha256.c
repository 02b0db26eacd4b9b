#include "io/sha256.h"

#include <openssl/evp.h>
#include <string.h>

void fm_sha256_init(fm_sha256 *s) {
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(c);
        c = NULL;
    }
    s->ctx = c;
}

void fm_sha256_update(fm_sha256 *s, const void *data, size_t n) {
    if (s->ctx && EVP_DigestUpdate(s->ctx, data, n) != 1) {
        EVP_MD_CTX_free(s->ctx);
        s->ctx = NULL;
    }
}

void fm_sha256_final(fm_sha256 *s, uint8_t out[32]) {
    unsigned int len = 0;
    memset(out, 0, 32); /* a failed context gives an all-zero digest, which never matches a real one */
    if (s->ctx) EVP_DigestFinal_ex(s->ctx, out, &len);
    EVP_MD_CTX_free(s->ctx);
    s->ctx = NULL;
}

void fm_sha256_hex(const uint8_t digest[32], char hex[65]) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[digest[i] >> 4];
        hex[2 * i + 1] = digits[digest[i] & 15];
    }
    hex[64] = 0;
}
