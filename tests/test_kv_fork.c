/* ci_kv_seq_fork (docs/kv-cache.md §8 "Fork"): a fork holds the same blocks as its source (one more
 * owner each, no new block), the first step of either copies the shared half-filled last block
 * and nothing else, both then compute exactly what an unforked sequence computes (logits equal to
 * a sequence that ran the same tokens alone), and freeing both gives every block back; a fork is
 * refused while a speculative round is open. */
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
#include <string.h>

enum { BLOCK = 16, PROMPT = 21 };

static void test_fork_shares_then_copies(void **state) {
  (void)state;
  ci_backend *be = ci_cpu_backend_create(1);
  assert_non_null(be);
  ci_model *model = ci_model_load(CI_FIXTURE_DIR "/llama", be);
  if (!model) fprintf(stderr, "load llama: %s\n", ci_last_error());
  assert_non_null(model);
  const int vocab = model->spec.vocab;
  ci_kv_cache *cache = ci_model_kv_cache_create(model, CI_KV_BF16, BLOCK, 0);
  assert_non_null(cache);
  int32_t ids[PROMPT + 2];
  for (int i = 0; i < PROMPT + 2; i++) ids[i] = (int32_t)((i * 37 + 11) % vocab);
  ci_kv_seq *a = ci_kv_seq_create(cache);
  assert_int_equal(ci_model_forward(model, a, ids, PROMPT, NULL, 0), CI_OK);
  const int64_t used = ci_kv_cache_blocks_used(cache);
  ci_kv_seq *b = ci_kv_seq_fork(a);
  assert_non_null(b);
  assert_int_equal(b->n, PROMPT);
  assert_int_equal(ci_kv_cache_blocks_used(cache), used); /* nothing copied */
  for (int g = 0; g < cache->n_groups; g++)
    for (int64_t i = 0; i < a->tables[g].n_entries; i++) {
      assert_int_equal(b->tables[g].entries[i], a->tables[g].entries[i]);
      assert_int_equal(ci_kv_pool_refcount(a->tables[g].pool, a->tables[g].entries[i]), 2);
    }
  /* different next tokens: the fork's write copies the shared last block (one per group) */
  float *la = malloc((size_t)vocab * sizeof *la), *lb = malloc((size_t)vocab * sizeof *lb);
  float *lc = malloc((size_t)vocab * sizeof *lc);
  assert_true(la && lb && lc);
  assert_int_equal(ci_model_forward(model, b, &ids[PROMPT + 1], 1, lb, 1), CI_OK);
  assert_int_equal(ci_kv_cache_blocks_used(cache), used + cache->n_groups);
  for (int g = 0; g < cache->n_groups; g++) {
    const int64_t last = PROMPT / BLOCK;
    assert_true(b->tables[g].entries[last] != a->tables[g].entries[last]);
    assert_int_equal(ci_kv_pool_refcount(a->tables[g].pool, a->tables[g].entries[last]), 1);
    assert_int_equal(ci_kv_pool_refcount(a->tables[g].pool, a->tables[g].entries[0]), 2);
  }
  assert_int_equal(ci_model_forward(model, a, &ids[PROMPT], 1, la, 1), CI_OK);
  /* each equals a sequence that ran its tokens alone */
  int32_t alone[PROMPT + 1];
  memcpy(alone, ids, PROMPT * sizeof *ids);
  for (int which = 0; which < 2; which++) {
    alone[PROMPT] = ids[PROMPT + which];
    ci_kv_seq *c = ci_kv_seq_create(cache);
    assert_int_equal(ci_model_forward(model, c, alone, PROMPT + 1, lc, 1), CI_OK);
    assert_memory_equal(lc, which ? lb : la, (size_t)vocab * sizeof *lc);
    ci_kv_seq_free(c);
  }
  /* no fork inside an open round */
  assert_int_equal(ci_kv_seq_round_open(a, 1), CI_OK);
  assert_null(ci_kv_seq_fork(a));
  assert_int_equal(ci_kv_seq_round_close(a, a->n), CI_OK);
  ci_kv_seq_free(a);
  ci_kv_seq_free(b);
  assert_int_equal(ci_kv_cache_blocks_used(cache), 0);
  free(la);
  free(lb);
  free(lc);
  ci_kv_cache_free(cache);
  ci_model_free(model);
  be->ops->destroy(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_fork_shares_then_copies)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
