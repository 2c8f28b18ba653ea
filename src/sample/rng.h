/* Counter-based random numbers for sampling (docs/generation.md §4.4): Philox4x32-10 keyed by the
 * request seed and the output index, so the token at index s depends only on (seed, s, lp,
 * parameters) — never on batch composition, thread count or call order. There is no hidden
 * generator state: a ci_rng is just the request's 64-bit seed, owned by whoever holds it. */
#ifndef CI_SAMPLE_RNG_H
#define CI_SAMPLE_RNG_H

#include <stdint.h>

/* Streams of docs/generation.md §4.4; the counter i each one uses is in the comment. */
enum {
  CI_RNG_STREAM_DRAW = 0,         /* Gumbel draw, i = token id */
  CI_RNG_STREAM_XTC = 1,          /* XTC coin, i = 0 */
  CI_RNG_STREAM_SPEC_ACCEPT = 2,  /* speculative accept test, i = 0 */
  CI_RNG_STREAM_SPEC_RESIDUAL = 3 /* speculative residual draw, i = token id */
};

typedef struct {
  uint64_t seed;
} ci_rng;

/* A generator for an explicit request seed (int64 seeds are taken as their 64-bit pattern). */
void ci_rng_init(ci_rng *rng, uint64_t seed);

/* A generator seeded from the OS random source (getrandom), for requests without a seed; never
 * derived from the clock. Returns CI_OK, or CI_ERR with ci_last_error if the OS refuses. */
int ci_rng_init_os(ci_rng *rng);

/* Key of output index s: K_s = seed XOR ((s + 1) * 0x9E3779B97F4A7C15 mod 2^64). */
uint64_t ci_rng_key(const ci_rng *rng, uint64_t s);

/* Philox4x32-10 (Random123): 10 rounds over counter ctr with key (k0, k1); out may alias ctr. */
void ci_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* uniform(K, stream, i) in (0, 1): Philox with key (K mod 2^32, K >> 32) and counter
 * (i mod 2^32, i >> 32, stream, 0); u = (w0 >> 8) * 2^-24 + 2^-25 from output word 0. */
double ci_rng_uniform(uint64_t key, uint32_t stream, uint64_t i);

/* The two halves of ci_rng_uniform: output word w0, and u from it (monotone in w0), so a
 * caller can bound u from the top bits of w0 before converting. */
uint32_t ci_rng_word(uint64_t key, uint32_t stream, uint64_t i);

/* Output word w0 for eight counters i[0..8) < 2^32 at once (vectorizable lanes); equal to
 * ci_rng_word(key, stream, i[j]) for each j. */
enum { CI_RNG_BATCH = 8 };
void ci_rng_words_batch(uint64_t key, uint32_t stream, const uint32_t i[CI_RNG_BATCH],
                        uint32_t w0[CI_RNG_BATCH]);
double ci_rng_word_to_uniform(uint32_t w0);

#endif
