/* KV rollback of speculative rounds through real forward passes (docs/kv-cache.md §6): rounds of
 * [x, drafts...] whose wrong drafts are rolled back leave the cache as if they had never been
 * written, on every codec (bf16, affine, turbo, turbo-v), on sliding-window layers (which keep
 * window + reserve), across the delayed-conversion threshold (converted exactly at the start,
 * never inside a round) and over prefix-shared blocks (never written). Each case compares the
 * logits of every kept position with a run that never speculated. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backend/cpu/cpu_backend.h"
#include "base/error.h"
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BLOCK = 4, RESERVE = 5 };

static ci_model *load(ci_backend *be, const char *name) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/%s", CI_FIXTURE_DIR, name);
  ci_model *m = ci_model_load(dir, be);
  if (!m) fprintf(stderr, "%s: %s\n", dir, ci_last_error());
  assert_non_null(m);
  return m;
}

static int32_t *make_ids(int n, int vocab, uint32_t seed) {
  int32_t *ids = malloc((size_t)n * sizeof *ids);
  for (int i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    ids[i] = (int32_t)((seed >> 8) % (uint32_t)vocab);
  }
  return ids;
}

typedef struct {
  float *logits; /* [n, vocab]: logits of every position */
  int converted;
  int64_t offset;
  int64_t base_used; /* blocks left in the base pools */
  int64_t max_sliding_blocks;
} run_result;

/* The blocks sliding groups hold right now. */
static int64_t sliding_blocks(const ci_kv_seq *seq) {
  int64_t held = 0;
  for (int g = 0; g < seq->cache->n_groups; g++) {
    if (seq->cache->groups[g].window == 0) continue;
    const ci_kv_block_table *t = &seq->tables[g];
    for (int64_t i = 0; i < t->n_entries; i++) held += t->entries[i] >= 0;
  }
  return held;
}

/* Feeds ids[0..n) to a sequence: a prefill of `prompt` tokens (split at a pending conversion),
 * then, when `speculate`, rounds of [x, d_1 .. d_k] where the first `good` drafts are the true
 * next ids and the rest are wrong (seeded by wrong_seed), rolled back to the good ones; without
 * `speculate`, one token per step. `attach` (optional) is a donor sequence whose first
 * attach_blocks blocks the sequence starts from. */
static run_result run(ci_model *m, ci_kv_cache *cache, const int32_t *ids, int n, int prompt,
                      const ci_kv_format *target, int64_t start, int speculate, uint32_t wrong_seed,
                      const ci_kv_seq *donor, int64_t donor_blocks) {
  ci_kv_seq *seq = ci_kv_seq_create(cache);
  assert_non_null(seq);
  if (target) assert_int_equal(ci_kv_seq_set_plan(seq, target, start), CI_OK);
  if (speculate) ci_kv_seq_set_rollback_reserve(seq, RESERVE);
  const int vocab = m->spec.vocab;
  run_result r = {0};
  r.logits = calloc((size_t)n * vocab, sizeof(float));
  int done = 0;
  if (donor) {
    ci_kv_block_ref *refs = malloc((size_t)(donor_blocks * cache->n_groups) * sizeof *refs);
    for (int64_t i = 0; i < donor_blocks; i++)
      for (int g = 0; g < cache->n_groups; g++)
        refs[i * cache->n_groups + g] = ci_kv_seq_block(donor, g, i);
    assert_int_equal(ci_kv_seq_attach(seq, donor_blocks, refs, 0, 0), CI_OK);
    free(refs);
    done = (int)(donor_blocks * BLOCK);
  }
  if (prompt > done) {
    assert_int_equal(ci_model_forward(m, seq, ids + done, prompt - done,
                                      r.logits + (int64_t)done * vocab, prompt - done),
                     CI_OK);
    done = prompt;
  }
  static const int gammas[] = {3, 1, 5, 2, 4, 5, 0, 3};
  static const int goods[] = {1, 0, 5, 2, 0, 3, 0, 3};
  uint32_t wrong = wrong_seed;
  int32_t rows[RESERVE + 1];
  float *out = malloc((size_t)(RESERVE + 1) * vocab * sizeof(float));
  for (int round = 0; done < n; round++) {
    int k = speculate ? gammas[round % 8] : 0, good = goods[round % 8];
    if (k > n - done - 1) k = n - done - 1;
    const int64_t limit = ci_kv_seq_chunk_limit(seq);
    if (limit != INT64_MAX && k > limit - 1) k = (int)(limit - 1);
    if (good > k) good = k;
    rows[0] = ids[done];
    for (int j = 1; j <= k; j++) {
      wrong = wrong * 1664525u + 1013904223u;
      const int32_t other = (int32_t)((ids[done + j] + 1 + (wrong >> 8) % (vocab - 1)) % vocab);
      rows[j] = j <= good ? ids[done + j] : other;
    }
    const int64_t n0 = seq->n;
    if (k > 0) assert_int_equal(ci_kv_seq_round_open(seq, k + 1), CI_OK);
    assert_int_equal(ci_model_forward(m, seq, rows, k + 1, out, k + 1), CI_OK);
    if (k > 0) {
      /* no conversion inside the round, whatever n reached */
      assert_true(!seq->has_plan || seq->converted || seq->n <= start);
      const int64_t held = sliding_blocks(seq);
      if (held > r.max_sliding_blocks) r.max_sliding_blocks = held;
      assert_int_equal(ci_kv_seq_round_close(seq, n0 + 1 + good), CI_OK);
    }
    memcpy(r.logits + (int64_t)done * vocab, out, (size_t)(good + 1) * vocab * sizeof(float));
    done += good + 1;
    assert_int_equal(seq->n, done);
  }
  free(out);
  r.converted = seq->converted;
  r.offset = seq->conversion_offset;
  for (int g = 0; g < cache->n_groups; g++) /* groups that converted left no base block */
    if (seq->tables[g].pool != cache->groups[g].pools[0])
      r.base_used += cache->groups[g].pools[0]->n_used;
  ci_kv_seq_free(seq);
  return r;
}

static ci_kv_cache *make_cache(ci_model *m) {
  ci_kv_cache *cache = ci_model_kv_cache_create(m, CI_KV_BF16, BLOCK, 0);
  assert_non_null(cache);
  return cache;
}

/* One fixture and plan: speculative runs with two different wrong-draft streams equal each
 * other and the one-token-at-a-time run at every position, bit for bit. */
static void check(const char *fixture, const ci_kv_format *target, int64_t start, int n,
                  int prompt) {
  ci_backend *be = ci_cpu_backend_create(2);
  ci_model *m = load(be, fixture);
  const int vocab = m->spec.vocab;
  int32_t *ids = make_ids(n, vocab, 11);
  ci_kv_cache *cache = make_cache(m);
  run_result plain = run(m, cache, ids, n, prompt, target, start, 0, 0, NULL, 0);
  run_result a = run(m, cache, ids, n, prompt, target, start, 1, 1, NULL, 0);
  run_result b = run(m, cache, ids, n, prompt, target, start, 1, 2, NULL, 0);
  assert_int_equal(ci_kv_cache_blocks_used(cache), 0);
  for (int p = 0; p < n; p++) {
    if (memcmp(a.logits + (int64_t)p * vocab, plain.logits + (int64_t)p * vocab,
               (size_t)vocab * sizeof(float)))
      fprintf(stderr, "%s: position %d differs from the run without speculation\n", fixture, p);
    assert_memory_equal(a.logits + (int64_t)p * vocab, plain.logits + (int64_t)p * vocab,
                        (size_t)vocab * sizeof(float));
    assert_memory_equal(b.logits + (int64_t)p * vocab, plain.logits + (int64_t)p * vocab,
                        (size_t)vocab * sizeof(float));
  }
  assert_int_equal(a.converted, plain.converted);
  if (target && start > 0 && start < n) {
    assert_true(a.converted);
    assert_int_equal(a.offset, start); /* exactly at the start, never early */
    assert_int_equal(plain.offset, start);
  }
  assert_int_equal(a.base_used, 0);
  for (int g = 0; g < cache->n_groups; g++) {
    const int window = cache->groups[g].window;
    if (window == 0) continue;
    /* a sliding group holds the window + reserve + one round, plus block alignment */
    const int64_t bound = (window - 1 + RESERVE + RESERVE + 1 + BLOCK - 1) / BLOCK + 1;
    assert_true(a.max_sliding_blocks <= bound * cache->n_groups);
  }
  free(plain.logits);
  free(a.logits);
  free(b.logits);
  ci_kv_cache_free(cache);
  free(ids);
  ci_model_free(m);
  be->ops->destroy(be);
}

static const ci_kv_format affine4 = {CI_KV_AFFINE, 4, 4, 32};
static const ci_kv_format affine8 = {CI_KV_AFFINE, 8, 8, 32};
static const ci_kv_format turbo = {CI_KV_TURBO, 4, 4, 0};
static const ci_kv_format turbo_v = {CI_KV_TURBO_V, 8, 3, 32};

static void test_bf16(void **state) {
  (void)state;
  check("qwen3", NULL, 0, 60, 7);
  check("llama", NULL, 0, 40, 5);
}

/* Converted from the first chunk on (start 0): every round runs on quantized blocks. */
static void test_codecs_converted(void **state) {
  (void)state;
  check("qwen3", &affine4, 0, 48, 6);
  check("qwen3", &affine8, 0, 48, 6);
  check("qwen3", &turbo, 0, 48, 6);
  check("qwen3", &turbo_v, 0, 48, 6);
}

/* The conversion start lies among the rounds: rounds shrink so that none reaches past it, the
 * conversion happens exactly at the start and the logits stay equal throughout. */
static void test_across_conversion(void **state) {
  (void)state;
  check("qwen3", &affine4, 21, 48, 6);
  check("qwen3", &turbo, 17, 48, 5);
  check("qwen3", &turbo_v, 30, 48, 6);
}

/* Sliding-window layers (gemma2, gemma3: W 8) far past the window, bf16 and quantized. */
static void test_sliding(void **state) {
  (void)state;
  check("gemma2", NULL, 0, 64, 5);
  check("gemma3", NULL, 0, 64, 5);
  static const ci_kv_format turbo44 = {CI_KV_TURBO, 4, 4, 0};
  check("gemma3", &turbo44, 13, 64, 5);
}

/* Rounds over blocks shared with a prefix donor: the donor's blocks are never written, so its
 * own next steps are unchanged; the speculating sequence equals its plain run. */
static void test_shared_blocks(void **state) {
  (void)state;
  ci_backend *be = ci_cpu_backend_create(2);
  ci_model *m = load(be, "qwen3");
  const int vocab = m->spec.vocab, n = 40;
  int32_t *ids = make_ids(n, vocab, 5);
  ci_kv_cache *cache = make_cache(m);
  ci_kv_seq *donor = ci_kv_seq_create(cache);
  assert_int_equal(ci_model_forward(m, donor, ids, 10, NULL, 0), CI_OK);
  run_result plain = run(m, cache, ids, n, 10, NULL, 0, 0, 0, donor, 2);
  run_result a = run(m, cache, ids, n, 10, NULL, 0, 1, 3, donor, 2);
  assert_memory_equal(a.logits + 8 * vocab, plain.logits + 8 * vocab,
                      (size_t)(n - 8) * vocab * sizeof(float));
  for (int g = 0; g < cache->n_groups; g++)
    for (int64_t i = 0; i < 3; i++) {
      const ci_kv_block_ref ref = ci_kv_seq_block(donor, g, i);
      assert_int_equal(ci_kv_pool_refcount(ref.pool, ref.id), 1);
    }
  /* the donor continues as a fresh sequence fed the same 11 tokens would */
  float *next = malloc((size_t)vocab * sizeof(float));
  float *fresh = malloc((size_t)vocab * sizeof(float));
  assert_int_equal(ci_model_forward(m, donor, ids + 10, 1, next, 1), CI_OK);
  ci_kv_seq *other = ci_kv_seq_create(cache);
  assert_int_equal(ci_model_forward(m, other, ids, 10, NULL, 0), CI_OK);
  assert_int_equal(ci_model_forward(m, other, ids + 10, 1, fresh, 1), CI_OK);
  assert_memory_equal(next, fresh, (size_t)vocab * sizeof(float));
  ci_kv_seq_free(other);
  ci_kv_seq_free(donor);
  assert_int_equal(ci_kv_cache_blocks_used(cache), 0);
  free(next);
  free(fresh);
  free(plain.logits);
  free(a.logits);
  ci_kv_cache_free(cache);
  free(ids);
  ci_model_free(m);
  be->ops->destroy(be);
}

/* The round rules refuse what would break exactness, naming the problem. */
static void test_round_rules(void **state) {
  (void)state;
  ci_backend *be = ci_cpu_backend_create(1);
  ci_model *m = load(be, "qwen3");
  ci_kv_cache *cache = make_cache(m);
  ci_kv_seq *seq = ci_kv_seq_create(cache);
  assert_int_equal(ci_kv_seq_set_plan(seq, &turbo, 10), CI_OK);
  ci_kv_seq_set_rollback_reserve(seq, 3);
  const int32_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  assert_int_equal(ci_model_forward(m, seq, ids, 6, NULL, 0), CI_OK);
  /* 6 + 5 rows would pass the start 10 */
  assert_int_equal(ci_kv_seq_round_open(seq, 5), CI_ERR);
  assert_non_null(strstr(ci_last_error(), "conversion start"));
  assert_int_equal(ci_kv_seq_round_close(seq, 6), CI_ERR);
  assert_non_null(strstr(ci_last_error(), "no speculative round"));
  /* 4 rows reach the start: the conversion waits for the round to close */
  assert_int_equal(ci_kv_seq_round_open(seq, 4), CI_OK);
  assert_int_equal(ci_kv_seq_round_open(seq, 1), CI_ERR);
  assert_int_equal(ci_model_forward(m, seq, ids, 4, NULL, 0), CI_OK);
  assert_int_equal(seq->n, 10);
  assert_false(seq->converted);
  assert_int_equal(ci_kv_seq_round_close(seq, 5), CI_ERR); /* below the round's start */
  assert_int_equal(ci_kv_seq_round_close(seq, 6), CI_ERR); /* past the reserve of 3 */
  assert_int_equal(ci_kv_seq_round_close(seq, 9), CI_OK);
  assert_false(seq->converted);
  assert_int_equal(ci_kv_seq_round_open(seq, 1), CI_OK);
  assert_int_equal(ci_model_forward(m, seq, ids, 1, NULL, 0), CI_OK);
  assert_int_equal(ci_kv_seq_round_close(seq, 10), CI_OK);
  assert_true(seq->converted);
  assert_int_equal(seq->conversion_offset, 10);
  ci_kv_seq_free(seq);
  ci_kv_cache_free(cache);
  ci_model_free(m);
  be->ops->destroy(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bf16),
      cmocka_unit_test(test_codecs_converted),
      cmocka_unit_test(test_across_conversion),
      cmocka_unit_test(test_sliding),
      cmocka_unit_test(test_shared_blocks),
      cmocka_unit_test(test_round_rules),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
