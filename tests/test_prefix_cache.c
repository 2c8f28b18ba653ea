/* Prefix reuse below the engine: ci_kv_seq_attach (docs/kv-cache.md §8 conditions), copy-on-write
 * of a shared partly filled block, and the prefix cache's chained lookup, token verification and
 * leaves-first LRU trimming (engine/prefix_cache.h), on a small cache with one full and one
 * sliding layer group. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backend/cpu/cpu_backend.h"
#include "base/error.h"
#include "engine/prefix_cache.h"
#include "kv/cache.h"

#include <stdlib.h>
#include <string.h>

enum { T = 16, WINDOW = 20, HKV = 2, D = 64 };

typedef struct {
  ci_backend *be;
  ci_kv_cache *cache;
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  f->be = ci_cpu_backend_create(1);
  const ci_kv_layer_desc layers[2] = {{.window = 0, .n_kv_heads = HKV, .head_dim = D},
                                      {.window = WINDOW, .n_kv_heads = HKV, .head_dim = D}};
  f->cache = ci_kv_cache_create(f->be, 2, layers, CI_KV_BF16, T, 0);
  if (!f->cache) return -1;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  assert_int_equal(ci_kv_cache_blocks_used(f->cache), 0);
  ci_kv_cache_free(f->cache);
  f->be->ops->destroy(f->be);
  free(f);
  return 0;
}

/* Appends n positions whose K/V bytes of every layer are a pattern of the position. */
static void append(ci_kv_seq *seq, int64_t n) {
  assert_int_equal(ci_kv_seq_reserve(seq, n), CI_OK);
  for (int layer = 0; layer < 2; layer++) {
    ci_paged_kv kv = ci_kv_seq_view(seq, layer);
    for (int64_t p = seq->n; p < seq->n + n; p++) {
      for (int h = 0; h < HKV; h++) {
        uint8_t *k = ci_kv_row_at(&kv, 0, p, h);
        memset(k, (int)((p * 7 + h + layer) & 0xff), kv.k_row_bytes);
      }
    }
  }
  assert_int_equal(ci_kv_seq_commit(seq, n), CI_OK);
}

/* The first K byte of position p, layer 0, head 0. */
static uint8_t k_byte(const ci_kv_seq *seq, int64_t p) {
  ci_paged_kv kv = ci_kv_seq_view(seq, 0);
  return *ci_kv_row_at(&kv, 0, p, 0);
}

static void test_copy_on_write(void **state) {
  fixture *f = *state;
  ci_kv_seq *seq = ci_kv_seq_create(f->cache);
  append(seq, 20); /* block 1 holds positions 16..19 */
  const ci_kv_block_ref shared = ci_kv_seq_block(seq, 0, 1);
  ci_kv_pool_retain(shared.pool, shared.id); /* a second owner */
  append(seq, 1);
  const ci_kv_block_ref now = ci_kv_seq_block(seq, 0, 1);
  assert_int_not_equal(now.id, shared.id);
  assert_int_equal(ci_kv_pool_refcount(shared.pool, shared.id), 1);
  for (int64_t p = 16; p < 21; p++) assert_int_equal(k_byte(seq, p), (p * 7) & 0xff);
  /* the other owner's block did not see the write */
  ci_paged_kv kv = ci_kv_seq_view(seq, 0);
  assert_int_not_equal(*ci_kv_block_row(&kv, 0, shared.id, 4, 0), (20 * 7) & 0xff);
  ci_kv_pool_release(shared.pool, shared.id);
  /* a block nobody else holds is written in place */
  append(seq, 1);
  assert_int_equal(ci_kv_seq_block(seq, 0, 1).id, now.id);
  ci_kv_seq_free(seq);
}

static void test_attach_rules(void **state) {
  fixture *f = *state;
  ci_kv_seq *src = ci_kv_seq_create(f->cache);
  append(src, 64);
  const int G = f->cache->n_groups;
  ci_kv_block_ref refs[4 * 2];
  for (int64_t i = 0; i < 4; i++)
    for (int g = 0; g < G; g++) refs[i * G + g] = ci_kv_seq_block(src, g, i);
  /* the sliding group released blocks the window no longer sees */
  int sliding = f->cache->groups[0].window ? 0 : 1;
  assert_int_equal(refs[0 * G + sliding].id, -1);

  ci_kv_seq *dst = ci_kv_seq_create(f->cache);
  /* attaching 2 blocks needs the sliding blocks of [32 - 19, 32) = blocks 0 and 1: released */
  assert_int_equal(ci_kv_seq_attach(dst, 2, refs, 0, 0), CI_ERR);
  assert_non_null(strstr(ci_last_error(), "not held"));
  assert_int_equal(dst->n, 0);
  assert_int_equal(ci_kv_seq_attach(dst, 4, refs, 1, 0), CI_ERR); /* no plan: not converted */
  assert_int_equal(ci_kv_seq_attach(dst, 4, refs, 0, 0), CI_OK);
  assert_int_equal(dst->n, 64);
  for (int64_t p = 48; p < 64; p++) assert_int_equal(k_byte(dst, p), k_byte(src, p));
  assert_int_equal(ci_kv_pool_refcount(refs[3 * G].pool, refs[3 * G].id), 2);
  assert_int_equal(ci_kv_seq_attach(dst, 4, refs, 0, 0), CI_ERR); /* not empty */
  /* it continues on its own blocks */
  append(dst, 3);
  assert_int_not_equal(ci_kv_seq_block(dst, 0, 4).id, ci_kv_seq_block(src, 0, 4).id);
  ci_kv_seq_free(src);
  for (int64_t p = 0; p < 64; p++) assert_int_equal(k_byte(dst, p), (p * 7) & 0xff);
  /* base-format blocks must stay below a plan's start */
  ci_kv_seq *planned = ci_kv_seq_create(f->cache);
  ci_kv_format affine;
  assert_int_equal(ci_kv_format_parse("affine", 8, 0, 64, &affine), CI_OK);
  assert_int_equal(ci_kv_seq_set_plan(planned, &affine, 48), CI_OK);
  for (int64_t i = 0; i < 4; i++)
    for (int g = 0; g < G; g++) refs[i * G + g] = ci_kv_seq_block(dst, g, i);
  assert_int_equal(ci_kv_seq_attach(planned, 4, refs, 0, 0), CI_ERR);
  assert_int_equal(ci_kv_seq_attach(planned, 4, refs, 1, 48), CI_ERR); /* bf16 != affine */
  ci_kv_seq_free(planned);
  ci_kv_seq_free(dst);
}

static void test_prefix_cache_lookup_and_trim(void **state) {
  fixture *f = *state;
  ci_prefix_cache *pc = ci_prefix_cache_create(f->cache);
  assert_non_null(pc);
  int32_t tokens[80];
  for (int t = 0; t < 80; t++) tokens[t] = 1000 + t;
  ci_kv_seq *src = ci_kv_seq_create(f->cache);
  /* registered as blocks fill (as the engine does), so the sliding blocks are caught before
   * the sequence releases them */
  for (int i = 0; i < 3; i++) {
    append(src, 16);
    assert_int_equal(ci_prefix_cache_insert(pc, 7, tokens, src), CI_OK);
  }
  append(src, 12);
  assert_int_equal(ci_prefix_cache_insert(pc, 7, tokens, src), CI_OK); /* nothing new */
  ci_prefix_cache_stats st;
  ci_prefix_cache_get_stats(pc, &st);
  assert_int_equal(st.nodes, 3);
  assert_int_equal(st.blocks, 6);
  const int64_t while_held = st.bytes; /* the sliding blocks the sequence let go */
  ci_kv_seq_free(src);
  ci_prefix_cache_get_stats(pc, &st);
  assert_true(st.bytes > while_held);
  const int64_t all_bytes = st.bytes;

  ci_kv_seq *seq = ci_kv_seq_create(f->cache);
  assert_int_equal(ci_prefix_cache_attach(pc, 8, tokens, 0, 79, seq, 0, 0), 0);  /* other key */
  assert_int_equal(ci_prefix_cache_attach(pc, 7, tokens, 0, 47, seq, 0, 0), 32); /* max_p */
  ci_kv_seq_free(seq);
  seq = ci_kv_seq_create(f->cache);
  assert_int_equal(ci_prefix_cache_attach(pc, 7, tokens, 40, 79, seq, 0, 0), 48);
  for (int64_t p = 32; p < 48; p++) assert_int_equal(k_byte(seq, p), (p * 7) & 0xff);
  ci_kv_seq_free(seq);
  /* a different token in block 1: only block 0 matches */
  tokens[20] = 5;
  seq = ci_kv_seq_create(f->cache);
  assert_int_equal(ci_prefix_cache_attach(pc, 7, tokens, 0, 79, seq, 0, 0), 16);
  ci_kv_seq_free(seq);
  tokens[20] = 1020;
  /* trimming evicts leaves first: the chain shortens from its end */
  ci_prefix_cache_trim(pc, all_bytes - 1);
  ci_prefix_cache_get_stats(pc, &st);
  assert_int_equal(st.nodes, 2);
  assert_true(st.bytes < all_bytes);
  seq = ci_kv_seq_create(f->cache);
  assert_int_equal(ci_prefix_cache_attach(pc, 7, tokens, 0, 79, seq, 0, 0), 32);
  ci_kv_seq_free(seq);
  ci_prefix_cache_trim(pc, 0);
  ci_prefix_cache_get_stats(pc, &st);
  assert_int_equal(st.nodes, 0);
  assert_int_equal(st.blocks, 0);
  ci_prefix_cache_free(pc);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_copy_on_write),
      cmocka_unit_test(test_attach_rules),
      cmocka_unit_test(test_prefix_cache_lookup_and_trim),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
