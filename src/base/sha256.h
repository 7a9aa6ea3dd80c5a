/* sha256.h — SHA-256 (FIPS 180-4), for checksums that tests compare with
 * Python's hashlib (bit-exact round trips, 10 MB tokenizer outputs).
 * defines: struct sha256, sha256_init(), sha256_update(), sha256_final_hex() */
#ifndef MOESERVE_BASE_SHA256_H
#define MOESERVE_BASE_SHA256_H

#include <stddef.h>
#include <stdint.h>

struct sha256 {
    uint32_t h[8];
    uint64_t n_bytes;
    unsigned char buf[64];
    size_t n_buf;
};

void sha256_init(struct sha256 *s);
void sha256_update(struct sha256 *s, const void *data, size_t n);
/* Writes 64 hex digits + NUL into hex[65]. */
void sha256_final_hex(struct sha256 *s, char hex[65]);

#endif
