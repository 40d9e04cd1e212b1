/* SHA-256 (FIPS 180-4) for the observers' digests of payload bytes.
 *
 * Own code, no libcrypto: an LD_PRELOAD library must not drag a crypto
 * library into the engine.  Uses the x86 SHA extensions when the CPU has
 * them (about 2 GB/s), else portable C (about 300 MB/s). */
#ifndef ORBITE_SHA256_H
#define ORBITE_SHA256_H

#include <stddef.h>
#include <stdint.h>

struct obs_sha256 {
	uint32_t h[8];
	uint64_t total; /* bytes hashed so far */
	uint8_t buf[64];
	size_t used;    /* bytes waiting in buf */
};

void obs_sha256_init(struct obs_sha256 *s);
void obs_sha256_update(struct obs_sha256 *s, const void *data, size_t len);
void obs_sha256_final(struct obs_sha256 *s, uint8_t out[32]);
/* One-shot digest of [data, data + len). */
void obs_sha256(const void *data, size_t len, uint8_t out[32]);
/* A digest as 64 lowercase hex digits and a NUL. */
void obs_sha256_hex(const uint8_t d[32], char out[65]);
/* Which compression function runs: 1 = SHA extensions, 0 = portable C.
 * obs_sha256_force_portable(1) selects portable C (the tests compare both). */
int obs_sha256_accelerated(void);
void obs_sha256_force_portable(int on);

#endif
