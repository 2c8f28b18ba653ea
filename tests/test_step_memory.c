/* The step's memory contract: after warm-up, decode steps of several sequences (one converting
 * its KV codec during the measured steps) allocate nothing in the backend, the workspace or the
 * KV arena; the KV arena is one buffer whose address does not change as its budget fills up, and
 * a full arena refuses blocks instead of growing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backend/cpu/cpu_backend.h"
#include "base/error.h"
#include "kv/arena.h"
#include "kv/pool.h"
#include "tensor/kv_format.h"
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N_SEQ = 3, PROMPT = 20, WARMUP = 5, MEASURED = 100 };

static ci_model *load(const char *name, ci_backend *be) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/%s", CI_FIXTURE_DIR, name);
  ci_model *model = ci_model_load(dir, be);
  if (!model) fail_msg("%s: %s", dir, ci_last_error());
  return model;
}

/* Allocations so far in the backend (with its scratch), the workspace and the KV arena. */
static int64_t allocations(ci_backend *be, const ci_workspace *ws, const ci_kv_cache *cache) {
  return be->ops->allocation_count(be) + ws->allocations + cache->arena.allocations;
}

static void check_steady_state(const char *name) {
  ci_backend *be = ci_cpu_backend_create(2);
  assert_non_null(be);
  ci_model *model = load(name, be);
  const int vocab = model->spec.vocab;
  ci_kv_cache *cache = ci_model_kv_cache_create(model, CI_KV_BF16, 16, 0);
  assert_non_null(cache);
  assert_int_equal(ci_kv_cache_set_limits(cache, N_SEQ, PROMPT + WARMUP + MEASURED + 1), CI_OK);
  assert_int_equal(ci_kv_cache_set_arena(cache, 8 << 20), CI_OK);
  ci_workspace *ws = ci_workspace_create(be);
  assert_non_null(ws);
  assert_int_equal(ci_workspace_fit(ws, &model->spec, N_SEQ * PROMPT, N_SEQ), CI_OK);
  ci_kv_seq *seqs[N_SEQ];
  int32_t prompts[N_SEQ][PROMPT], next[N_SEQ];
  ci_step_seq step[N_SEQ];
  for (int i = 0; i < N_SEQ; i++) {
    seqs[i] = ci_kv_seq_create(cache);
    assert_non_null(seqs[i]);
    if (i > 0) { /* turbo 4-bit from the start; turbo 3-bit from position 60, mid-measurement */
      ci_kv_format target;
      assert_int_equal(ci_kv_format_parse("turbo", i == 1 ? 4 : 3, 0, 0, &target), CI_OK);
      assert_int_equal(ci_kv_seq_set_plan(seqs[i], &target, i == 1 ? 0 : 60), CI_OK);
    }
    for (int t = 0; t < PROMPT; t++) prompts[i][t] = (int32_t)((t * 31 + i * 7 + 2) % vocab);
    step[i] = (ci_step_seq){.seq = seqs[i], .ids = prompts[i], .n_rows = PROMPT, .n_logit_rows = 1};
  }
  float *logits = malloc((size_t)N_SEQ * vocab * sizeof *logits);
  /* the prompts in one step (the first one converts after its chunk) */
  assert_int_equal(ci_model_step(model, ws, step, N_SEQ, logits), CI_OK);
  int64_t before = 0;
  for (int s = 0; s < WARMUP + MEASURED; s++) {
    if (s == WARMUP) before = allocations(be, ws, cache);
    for (int i = 0; i < N_SEQ; i++) {
      next[i] = (int32_t)((s * 13 + i * 5 + 1) % vocab);
      step[i] = (ci_step_seq){.seq = seqs[i], .ids = &next[i], .n_rows = 1, .n_logit_rows = 1};
    }
    if (ci_model_step(model, ws, step, N_SEQ, logits)) fail_msg("%s: %s", name, ci_last_error());
  }
  const int64_t after = allocations(be, ws, cache);
  if (after != before)
    fail_msg("%s: %lld allocations in %d decode steps after warm-up", name,
             (long long)(after - before), MEASURED);
  assert_int_equal(seqs[2]->converted, 1); /* the conversion happened while measuring */
  for (int i = 0; i < N_SEQ; i++) ci_kv_seq_free(seqs[i]);
  free(logits);
  ci_workspace_free(ws);
  ci_kv_cache_free(cache);
  ci_model_free(model);
  be->ops->destroy(be);
}

static void test_steady_state_llama(void **state) {
  (void)state;
  check_steady_state("llama");
}

static void test_steady_state_gemma4_moe(void **state) {
  (void)state;
  check_steady_state("gemma4-moe");
}

static void test_steady_state_gemma4_ple(void **state) {
  (void)state;
  check_steady_state("gemma4-ple");
}

/* Fills an arena with sequences until a block is refused: its base and size never change and
 * every block lies inside it. */
static void test_arena_fixed(void **state) {
  (void)state;
  ci_backend *be = ci_cpu_backend_create(1);
  ci_model *model = load("llama", be);
  ci_kv_cache *cache = ci_model_kv_cache_create(model, CI_KV_BF16, 16, 1 << 20);
  assert_non_null(cache);
  const uint8_t *base = ci_kv_cache_arena_base(cache);
  const int64_t bytes = ci_kv_cache_arena_bytes(cache);
  assert_non_null(base);
  assert_true(bytes >= 1 << 20);
  const int64_t allocations_before = cache->arena.allocations;
  ci_kv_seq *seqs[64];
  int n = 0, refused = 0;
  while (n < 64 && !refused) {
    seqs[n] = ci_kv_seq_create(cache);
    assert_non_null(seqs[n]);
    /* 1000 positions each: 63 blocks of the 256 the arena holds */
    refused = ci_kv_seq_reserve(seqs[n], 1000) != CI_OK;
    n++;
    assert_ptr_equal(ci_kv_cache_arena_base(cache), base);
    assert_int_equal(ci_kv_cache_arena_bytes(cache), bytes);
  }
  assert_true(refused);
  assert_non_null(strstr(ci_last_error(), "slabs"));
  assert_int_equal(cache->arena.allocations, allocations_before);
  for (int i = 0; i < n; i++) {
    const ci_paged_kv kv = ci_kv_seq_view(seqs[i], 0);
    for (int64_t b = 0; b < kv.n_table_entries; b++) {
      if (kv.block_table[b] < 0) continue;
      const uint8_t *row = ci_kv_block_row(&kv, 1, kv.block_table[b], 15, kv.n_kv_heads - 1);
      assert_true(row >= base && row + kv.v_row_bytes <= base + bytes);
    }
  }
  /* freeing the sequences gives every slab back: the whole budget is usable again */
  for (int i = 0; i < n; i++) ci_kv_seq_free(seqs[i]);
  assert_int_equal(cache->arena.n_free, cache->arena.n_slabs);
  ci_kv_cache_free(cache);
  ci_model_free(model);
  be->ops->destroy(be);
}

/* Runs of consecutive slabs (recurrent states): taken from the high end while single slabs come
 * from the low end, refused by name when no run is long enough (even with enough slabs free in
 * all), and given back whole. */
static void test_arena_runs(void **state) {
  (void)state;
  ci_backend *be = ci_cpu_backend_create(1);
  ci_kv_arena arena;
  assert_int_equal(ci_kv_arena_init(&arena, be, 64, 8 * 64), CI_OK);
  const int64_t allocations = be->ops->allocation_count(be);
  uint8_t *single = ci_kv_arena_take(&arena);
  assert_ptr_equal(single, arena.base);
  uint8_t *high = ci_kv_arena_take_run(&arena, 3);
  assert_ptr_equal(high, arena.base + 5 * 64);
  uint8_t *middle = ci_kv_arena_take_run(&arena, 3);
  assert_ptr_equal(middle, arena.base + 2 * 64);
  assert_int_equal(ci_kv_arena_bytes_taken(&arena), 7 * 64);
  assert_null(ci_kv_arena_take_run(&arena, 2));
  assert_non_null(strstr(ci_last_error(), "consecutive"));
  ci_kv_arena_give_run(&arena, high, 3);
  assert_int_equal(ci_kv_arena_bytes_taken(&arena), 4 * 64);
  assert_ptr_equal(ci_kv_arena_take_run(&arena, 2), arena.base + 6 * 64);
  /* slabs 0, 1 and 5 free: three slabs, but no run of three */
  ci_kv_arena_give(&arena, single);
  assert_int_equal(arena.n_free, 3);
  assert_null(ci_kv_arena_take_run(&arena, 3));
  assert_non_null(strstr(ci_last_error(), "3 of 8 slabs free"));
  assert_ptr_equal(ci_kv_arena_take_run(&arena, 2), arena.base);
  ci_kv_arena_give_run(&arena, arena.base, 2);
  ci_kv_arena_give_run(&arena, middle, 3);
  ci_kv_arena_give_run(&arena, arena.base + 6 * 64, 2);
  assert_int_equal(ci_kv_arena_bytes_taken(&arena), 0);
  /* the whole arena is one run again, and none of this allocated */
  assert_ptr_equal(ci_kv_arena_take_run(&arena, 8), arena.base);
  assert_int_equal(be->ops->allocation_count(be), allocations);
  ci_kv_arena_give_run(&arena, arena.base, 8);
  ci_kv_arena_destroy(&arena);
  /* an arena without a budget has no runs */
  assert_int_equal(ci_kv_arena_init(&arena, be, 64, 0), CI_OK);
  assert_null(ci_kv_arena_take_run(&arena, 1));
  assert_non_null(strstr(ci_last_error(), "budget"));
  ci_kv_arena_destroy(&arena);
  be->ops->destroy(be);
}

/* A pool on a backend with memory of its own keeps a device copy of its slab table: a slab
 * taken is published there before anything can use its blocks; a slab given back is not — a
 * release comes when a step commits its rows, and the device may still have that step's work
 * queued, reading the released blocks (a NULL published at once reached a GPU ahead of it). */
static void test_pool_slab_table_on_device(void **state) {
  (void)state;
  ci_backend *be = ci_cpu_backend_create(1);
  be->host_visible = 0; /* the CPU backend then keeps the table apart, as a GPU does */
  ci_kv_arena arena;
  assert_int_equal(ci_kv_arena_init(&arena, be, 64, 4 * 64), CI_OK);
  ci_kv_pool pool;
  /* one layer, one KV head of 8 bf16 dims, one token per block: 32-byte blocks, 2 per slab */
  assert_int_equal(ci_kv_pool_init(&pool, be, &arena, ci_kv_format_plain(CI_KV_BF16), 1, 1, 1, 8),
                   CI_OK);
  assert_int_equal(pool.blocks_per_slab, 2);
  assert_true(pool.slabs_device != pool.slabs);
  uint8_t *const *device = pool.slabs_device; /* host memory here, read directly */
  const int32_t a = ci_kv_pool_alloc(&pool), b = ci_kv_pool_alloc(&pool),
                c = ci_kv_pool_alloc(&pool);
  assert_true(a / 2 == 0 && b / 2 == 0 && c / 2 == 1);
  assert_ptr_equal(device[0], pool.slabs[0]);
  assert_ptr_equal(device[1], pool.slabs[1]);
  uint8_t *old = pool.slabs[0];
  ci_kv_pool_release(&pool, a);
  ci_kv_pool_release(&pool, b); /* slot 0 empties: its slab goes back to the arena */
  assert_null(pool.slabs[0]);
  assert_ptr_equal(device[0], old);
  const int32_t d = ci_kv_pool_alloc(&pool), e = ci_kv_pool_alloc(&pool);
  assert_true(d / 2 == 1 && e / 2 == 0); /* slot 1 fills up, then slot 0 takes a slab again */
  assert_non_null(pool.slabs[0]);
  assert_ptr_equal(device[0], pool.slabs[0]);
  ci_kv_pool_release(&pool, c);
  ci_kv_pool_release(&pool, d);
  ci_kv_pool_release(&pool, e);
  ci_kv_pool_destroy(&pool);
  ci_kv_arena_destroy(&arena);
  be->host_visible = 1;
  be->ops->destroy(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_steady_state_llama),
      cmocka_unit_test(test_steady_state_gemma4_moe),
      cmocka_unit_test(test_steady_state_gemma4_ple),
      cmocka_unit_test(test_arena_fixed),
      cmocka_unit_test(test_arena_runs),
      cmocka_unit_test(test_pool_slab_table_on_device),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
