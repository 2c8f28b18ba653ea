/* Philox4x32-10 and the per-output-index keys of docs/generation.md §4.4 (see rng.h). */
#include "sample/rng.h"

#include "base/error.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

enum { PHILOX_ROUNDS = 10 };

static const uint32_t philox_mul0 = 0xD2511F53u;
static const uint32_t philox_mul1 = 0xCD9E8D57u;
static const uint32_t philox_weyl0 = 0x9E3779B9u;
static const uint32_t philox_weyl1 = 0xBB67AE85u;

void ci_rng_init(ci_rng *rng, uint64_t seed) {
  rng->seed = seed;
}

int ci_rng_init_os(ci_rng *rng) {
  uint64_t seed = 0;
  size_t got = 0;
  while (got < sizeof seed) {
    ssize_t n = getrandom((unsigned char *)&seed + got, sizeof seed - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ci_fail("getrandom failed: %s", strerror(errno));
    got += (size_t)n;
  }
  rng->seed = seed;
  return CI_OK;
}

uint64_t ci_rng_key(const ci_rng *rng, uint64_t s) {
  return rng->seed ^ ((s + 1) * 0x9E3779B97F4A7C15ull);
}

void ci_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < PHILOX_ROUNDS; round++) {
    uint64_t p0 = (uint64_t)philox_mul0 * c0;
    uint64_t p1 = (uint64_t)philox_mul1 * c2;
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += philox_weyl0;
    k1 += philox_weyl1;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

uint32_t ci_rng_word(uint64_t key, uint32_t stream, uint64_t i) {
  const uint32_t k[2] = {(uint32_t)key, (uint32_t)(key >> 32)};
  const uint32_t ctr[4] = {(uint32_t)i, (uint32_t)(i >> 32), stream, 0};
  uint32_t w[4];
  ci_philox4x32_10(ctr, k, w);
  return w[0];
}

void ci_rng_words_batch(uint64_t key, uint32_t stream, const uint32_t i[CI_RNG_BATCH],
                        uint32_t w0[CI_RNG_BATCH]) {
  uint32_t c0[CI_RNG_BATCH], c1[CI_RNG_BATCH], c2[CI_RNG_BATCH], c3[CI_RNG_BATCH];
  for (int j = 0; j < CI_RNG_BATCH; j++) {
    c0[j] = i[j];
    c1[j] = 0;
    c2[j] = stream;
    c3[j] = 0;
  }
  uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
  for (int round = 0; round < PHILOX_ROUNDS; round++) {
    for (int j = 0; j < CI_RNG_BATCH; j++) {
      const uint64_t p0 = (uint64_t)philox_mul0 * c0[j];
      const uint64_t p1 = (uint64_t)philox_mul1 * c2[j];
      const uint32_t next0 = (uint32_t)(p1 >> 32) ^ c1[j] ^ k0;
      const uint32_t next2 = (uint32_t)(p0 >> 32) ^ c3[j] ^ k1;
      c1[j] = (uint32_t)p1;
      c3[j] = (uint32_t)p0;
      c0[j] = next0;
      c2[j] = next2;
    }
    k0 += philox_weyl0;
    k1 += philox_weyl1;
  }
  for (int j = 0; j < CI_RNG_BATCH; j++) w0[j] = c0[j];
}

double ci_rng_word_to_uniform(uint32_t w0) {
  return (double)(w0 >> 8) * 0x1p-24 + 0x1p-25;
}

double ci_rng_uniform(uint64_t key, uint32_t stream, uint64_t i) {
  return ci_rng_word_to_uniform(ci_rng_word(key, stream, i));
}
