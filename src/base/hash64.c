/* xxHash64 (see hash64.h): four lanes of 8-byte rounds over 32-byte stripes, then the tail and the
 * avalanche, exactly as the reference algorithm (so values can be checked with any xxh64 tool). */
#include "base/hash64.h"

#include <string.h>

static const uint64_t P1 = 0x9E3779B185EBCA87ULL;
static const uint64_t P2 = 0xC2B2AE3D27D4EB4FULL;
static const uint64_t P3 = 0x165667B19E3779F9ULL;
static const uint64_t P4 = 0x85EBCA77C2B2AE63ULL;
static const uint64_t P5 = 0x27D4EB2F165667C5ULL;

static uint64_t rotl(uint64_t x, int r) {
  return (x << r) | (x >> (64 - r));
}

static uint64_t read64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; /* little-endian on every host */
  return v;
}

static uint32_t read32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t round64(uint64_t acc, uint64_t input) {
  acc += input * P2;
  acc = rotl(acc, 31);
  return acc * P1;
}

static uint64_t merge(uint64_t acc, uint64_t v) {
  acc ^= round64(0, v);
  return acc * P1 + P4;
}

void ci_hash64_init(ci_hash64_state *s, uint64_t seed) {
  memset(s, 0, sizeof *s);
  s->seed = seed;
  s->v[0] = seed + P1 + P2;
  s->v[1] = seed + P2;
  s->v[2] = seed;
  s->v[3] = seed - P1;
}

static void stripe(ci_hash64_state *s, const uint8_t *p) {
  for (int i = 0; i < 4; i++) s->v[i] = round64(s->v[i], read64(p + 8 * i));
}

void ci_hash64_update(ci_hash64_state *s, const void *data, size_t n) {
  const uint8_t *p = data;
  s->total += n;
  if (n == 0) return;
  if (s->n_buf) {
    const size_t take = n < 32 - s->n_buf ? n : 32 - s->n_buf;
    memcpy(s->buf + s->n_buf, p, take);
    s->n_buf += take;
    p += take;
    n -= take;
    if (s->n_buf < 32) return;
    stripe(s, s->buf);
    s->n_buf = 0;
  }
  for (; n >= 32; p += 32, n -= 32) stripe(s, p);
  if (n) memcpy(s->buf, p, n);
  s->n_buf = n;
}

uint64_t ci_hash64_digest(const ci_hash64_state *s) {
  uint64_t h;
  if (s->total >= 32) {
    h = rotl(s->v[0], 1) + rotl(s->v[1], 7) + rotl(s->v[2], 12) + rotl(s->v[3], 18);
    for (int i = 0; i < 4; i++) h = merge(h, s->v[i]);
  } else {
    h = s->seed + P5;
  }
  h += s->total;
  const uint8_t *p = s->buf;
  size_t n = s->n_buf;
  for (; n >= 8; p += 8, n -= 8) h = rotl(h ^ round64(0, read64(p)), 27) * P1 + P4;
  if (n >= 4) {
    h = rotl(h ^ (uint64_t)read32(p) * P1, 23) * P2 + P3;
    p += 4;
    n -= 4;
  }
  for (; n > 0; p++, n--) h = rotl(h ^ (uint64_t)*p * P5, 11) * P1;
  h ^= h >> 33;
  h *= P2;
  h ^= h >> 29;
  h *= P3;
  h ^= h >> 32;
  return h;
}

uint64_t ci_hash64(const void *data, size_t n, uint64_t seed) {
  ci_hash64_state s;
  ci_hash64_init(&s, seed);
  ci_hash64_update(&s, data, n);
  return ci_hash64_digest(&s);
}
