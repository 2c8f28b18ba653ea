/* A fast, well-mixed 64-bit hash of a byte string (the xxHash64 algorithm): content checksums of
 * persisted KV blocks, model identities and prompt-cache keys. Not cryptographic: it detects
 * corruption and tells contents apart, it does not resist a forger. */
#ifndef CI_BASE_HASH64_H
#define CI_BASE_HASH64_H

#include <stddef.h>
#include <stdint.h>

/* The 64-bit hash of data[0..n) under `seed` (xxHash64 of the bytes). */
uint64_t ci_hash64(const void *data, size_t n, uint64_t seed);

/* Streaming form: init, update with the bytes in any pieces, digest (equals ci_hash64 of the
 * concatenation). */
typedef struct {
  uint64_t v[4];
  uint64_t total;
  uint64_t seed;
  uint8_t buf[32];
  size_t n_buf;
} ci_hash64_state;

void ci_hash64_init(ci_hash64_state *s, uint64_t seed);
void ci_hash64_update(ci_hash64_state *s, const void *data, size_t n);
uint64_t ci_hash64_digest(const ci_hash64_state *s);

#endif
