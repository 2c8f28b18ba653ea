/* KV memory of sliding-window and KV-sharing layers: run the Gemma fixtures (real forward passes)
 * over 4096 tokens and check that only full-attention layer groups grow with the context, that
 * sliding groups stay within W - 1 + L + 2(T - 1) positions (docs/kv-cache.md §4), and that
 * KV-sharing layers own no cache. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backend/cpu/cpu_backend.h"
#include "base/error.h"
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>

enum { TOKENS = 4096, CHUNK = 64, BLOCK = 16 };

/* Bytes held by group g of the cache (K and V of every layer in the group). */
static int64_t group_bytes(const ci_kv_cache *cache, int g) {
  return ci_kv_group_bytes_used(cache, g);
}

/* Positions a group's blocks cover. */
static int64_t group_positions(const ci_kv_cache *cache, int g) {
  return (int64_t)cache->groups[g].pools[0]->n_used * cache->block_tokens;
}

static ci_model *load_fixture(ci_backend *be, const char *name) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/%s", CI_FIXTURE_DIR, name);
  ci_model *model = ci_model_load(dir, be);
  if (!model) fprintf(stderr, "load %s: %s\n", dir, ci_last_error());
  assert_non_null(model);
  return model;
}

/* Feeds TOKENS pseudo-random ids in chunks and checks every group after every chunk. */
static void check_growth(const char *fixture, int chunk) {
  ci_backend *be = ci_cpu_backend_create(2);
  assert_non_null(be);
  ci_model *model = load_fixture(be, fixture);
  const ci_model_spec *s = &model->spec;
  ci_kv_cache *cache = ci_model_kv_cache_create(model, CI_KV_BF16, BLOCK, 0);
  assert_non_null(cache);
  ci_kv_seq *seq = ci_kv_seq_create(cache);
  assert_non_null(seq);
  int32_t ids[CHUNK];
  uint32_t state = 12345;
  int64_t last_full_bytes = 0;
  for (int done = 0; done < TOKENS; done += chunk) {
    for (int i = 0; i < chunk; i++) {
      state = state * 1664525u + 1013904223u;
      ids[i] = (int32_t)((state >> 8) % (uint32_t)s->vocab);
    }
    assert_int_equal(ci_model_forward(model, seq, ids, chunk, NULL, 0), CI_OK);
    int64_t full_bytes = 0;
    for (int g = 0; g < cache->n_groups; g++) {
      const int window = cache->groups[g].window;
      if (window > 0) {
        /* Held during the step: W - 1 + L positions, plus block alignment at both ends. */
        assert_true(group_positions(cache, g) <= window - 1 + chunk + 2 * (BLOCK - 1));
      } else {
        assert_true(group_positions(cache, g) >= seq->n);
        full_bytes += group_bytes(cache, g);
      }
    }
    assert_true(full_bytes > last_full_bytes || done == 0 || chunk < BLOCK);
    last_full_bytes = full_bytes;
  }
  /* After 4096 tokens the sliding groups hold a few blocks, the full groups all of them. */
  int64_t sliding_bytes = 0, full_bytes = 0;
  for (int g = 0; g < cache->n_groups; g++) {
    if (cache->groups[g].window > 0)
      sliding_bytes += group_bytes(cache, g);
    else
      full_bytes += group_bytes(cache, g);
  }
  printf("%s chunk %d: KV bytes after %d tokens: full %lld, sliding %lld\n", fixture, chunk, TOKENS,
         (long long)full_bytes, (long long)sliding_bytes);
  assert_true(sliding_bytes * 20 < full_bytes);
  ci_kv_seq_free(seq);
  assert_int_equal(ci_kv_cache_blocks_used(cache), 0);
  ci_kv_cache_free(cache);
  ci_model_free(model);
  be->ops->destroy(be);
}

static void test_gemma3_sliding_groups_stay_bounded(void **state) {
  (void)state;
  check_growth("gemma3", CHUNK);
  check_growth("gemma3", 1);
}

/* gemma4-ple: 6 layers, the last 2 share the KV of layers 2 (sliding) and 3 (full). */
static void test_gemma4_sharers_own_no_cache(void **state) {
  (void)state;
  ci_backend *be = ci_cpu_backend_create(2);
  assert_non_null(be);
  ci_model *model = load_fixture(be, "gemma4-ple");
  const ci_model_spec *s = &model->spec;
  assert_int_equal(s->n_layers, 6);
  assert_int_equal(s->n_cache_layers, 4);
  assert_int_equal(s->layers[4].cache_layer, 2);
  assert_int_equal(s->layers[5].cache_layer, 3);
  ci_kv_cache *cache = ci_model_kv_cache_create(model, CI_KV_BF16, BLOCK, 0);
  assert_non_null(cache);
  assert_int_equal(cache->n_layers, 4);
  int layers_in_groups = 0;
  for (int g = 0; g < cache->n_groups; g++) layers_in_groups += cache->groups[g].n_layers;
  assert_int_equal(layers_in_groups, 4);
  ci_kv_cache_free(cache);
  ci_model_free(model);
  be->ops->destroy(be);
  check_growth("gemma4-ple", CHUNK);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gemma3_sliding_groups_stay_bounded),
      cmocka_unit_test(test_gemma4_sharers_own_no_cache),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
