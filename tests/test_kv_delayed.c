/* Delayed KV quantization through real forward passes (docs/kv-cache.md §5, §12 invariant 6): a
 * start beyond the prompt leaves logits bit-identical to bf16; conversion happens exactly at
 * `start` for chunk sizes 1, 3 and whole (right after the first chunk when start is 0, never while
 * empty); results after conversion agree across chunkings; sliding-window layers and KV-sharing
 * layers run on quantized blocks, with every block moved to the target pool. */
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
#include <unistd.h>

typedef struct {
  float *logits; /* [n, vocab] */
  int converted;
  int64_t offset;    /* conversion offset */
  int64_t base_used; /* blocks left in the base pools after the run */
} run_result;

static ci_model *load(ci_backend *be, const char *name) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/%s", CI_FIXTURE_DIR, name);
  ci_model *m = ci_model_load(dir, be);
  if (!m) fprintf(stderr, "%s: %s\n", dir, ci_last_error());
  assert_non_null(m);
  return m;
}

/* Teacher-forced logits of ids[0..n) fed `chunk` at a time with the given plan (NULL = bf16). */
static run_result run(ci_model *m, const int32_t *ids, int n, int chunk, const ci_kv_format *target,
                      int64_t start) {
  ci_kv_cache *cache = ci_model_kv_cache_create(m, CI_KV_BF16, 16, 0);
  assert_non_null(cache);
  ci_kv_seq *seq = ci_kv_seq_create(cache);
  if (target) assert_int_equal(ci_kv_seq_set_plan(seq, target, start), CI_OK);
  run_result r = {0};
  const int vocab = m->spec.vocab;
  r.logits = malloc((size_t)n * vocab * sizeof(float));
  for (int done = 0; done < n; done += chunk) {
    const int len = n - done < chunk ? n - done : chunk;
    assert_int_equal(
        ci_model_forward(m, seq, ids + done, len, r.logits + (int64_t)done * vocab, len), CI_OK);
  }
  r.converted = seq->converted;
  r.offset = seq->conversion_offset;
  for (int g = 0; g < cache->n_groups; g++) r.base_used += cache->groups[g].pools[0]->n_used;
  ci_kv_seq_free(seq);
  assert_int_equal(ci_kv_cache_blocks_used(cache), 0);
  ci_kv_cache_free(cache);
  return r;
}

static float max_diff(const float *a, const float *b, int64_t count) {
  float d = 0.0f;
  for (int64_t i = 0; i < count; i++) d = fmaxf(d, fabsf(a[i] - b[i]));
  return d;
}

static int32_t *make_ids(int n, int vocab, uint32_t seed) {
  int32_t *ids = malloc((size_t)n * sizeof *ids);
  for (int i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    ids[i] = (int32_t)((seed >> 8) % (uint32_t)vocab);
  }
  return ids;
}

static const ci_kv_format formats[] = {{CI_KV_AFFINE, 8, 8, 32},
                                       {CI_KV_AFFINE, 4, 4, 32},
                                       {CI_KV_TURBO, 4, 4, 0},
                                       {CI_KV_TURBO, 3, 2, 0},
                                       {CI_KV_TURBO_V, 8, 3, 32}};

/* A start past the prompt: the sequence never converts and stays bit-identical to bf16. */
static void test_start_beyond_prompt(void **state) {
  (void)state;
  ci_backend *be = ci_cpu_backend_create(2);
  ci_model *m = load(be, "qwen3");
  const int n = 48, vocab = m->spec.vocab;
  int32_t *ids = make_ids(n, vocab, 1);
  const int chunks[] = {n, 1, 3};
  for (size_t c = 0; c < 3; c++) {
    run_result plain = run(m, ids, n, chunks[c], NULL, 0);
    for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++) {
      run_result r = run(m, ids, n, chunks[c], &formats[f], n + 1);
      assert_false(r.converted);
      assert_memory_equal(r.logits, plain.logits, (size_t)n * vocab * sizeof(float));
      free(r.logits);
    }
    free(plain.logits);
  }
  free(ids);
  ci_model_free(m);
  be->ops->destroy(be);
}

/* Conversion exactly at start, whatever the chunk size; start 0 converts after the first chunk.
 * Logits before start equal bf16; after it, chunkings agree and differ from bf16. */
static void check_exact_crossing(const char *fixture, int n, int64_t start,
                                 const ci_kv_format *format) {
  ci_backend *be = ci_cpu_backend_create(2);
  ci_model *m = load(be, fixture);
  const int vocab = m->spec.vocab;
  int32_t *ids = make_ids(n, vocab, 7);
  const int chunks[] = {n, 1, 3};
  run_result first = {0};
  for (size_t c = 0; c < 3; c++) {
    run_result plain = run(m, ids, n, chunks[c], NULL, 0);
    run_result r = run(m, ids, n, chunks[c], format, start);
    assert_true(r.converted);
    assert_int_equal(r.offset, start > 0 ? start : chunks[c]);
    assert_int_equal(r.base_used, 0); /* every retained block moved to the target pool */
    if (start > 0) {
      /* Before the crossing the cache is bf16: identical logits. */
      assert_memory_equal(r.logits, plain.logits, (size_t)start * vocab * sizeof(float));
      /* Quantized attention from `start` on changes the logits. */
      assert_true(max_diff(r.logits + start * vocab, plain.logits + start * vocab,
                           (int64_t)(n - start) * vocab) > 0.0f);
    }
    if (c == 0) {
      first = r;
    } else {
      if (start > 0) {
        const float d = max_diff(r.logits, first.logits, (int64_t)n * vocab);
        if (!(d <= 1e-3f)) fprintf(stderr, "%s chunk %d vs whole: %g\n", fixture, chunks[c], d);
        assert_true(d <= 1e-3f);
      }
      free(r.logits);
    }
    free(plain.logits);
  }
  free(first.logits);
  free(ids);
  ci_model_free(m);
  be->ops->destroy(be);
}

static void test_exact_crossing_full_layers(void **state) {
  (void)state;
  for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++) {
    check_exact_crossing("qwen3", 48, 20, &formats[f]);
    check_exact_crossing("qwen3", 48, 0, &formats[f]);
  }
}

/* Sliding layers (gemma3: W 8, D 16) on quantized blocks, conversion at W + 1. */
static void test_sliding_quantized(void **state) {
  (void)state;
  static const ci_kv_format sliding_formats[] = {{CI_KV_TURBO, 4, 4, 0}, {CI_KV_TURBO, 2, 3, 0}};
  for (size_t f = 0; f < sizeof sliding_formats / sizeof sliding_formats[0]; f++)
    check_exact_crossing("gemma3", 64, 9, &sliding_formats[f]);
  /* A codec whose groups do not fit the sliding head_dim is rejected by layer. */
  ci_backend *be = ci_cpu_backend_create(1);
  ci_model *m = load(be, "gemma3");
  ci_kv_cache *cache = ci_model_kv_cache_create(m, CI_KV_BF16, 16, 0);
  ci_kv_seq *seq = ci_kv_seq_create(cache);
  const ci_kv_format turbo_v = {CI_KV_TURBO_V, 8, 3, 32};
  assert_int_equal(ci_kv_seq_set_plan(seq, &turbo_v, 0), CI_ERR);
  assert_non_null(strstr(ci_last_error(), "cache layer 0"));
  ci_kv_seq_free(seq);
  ci_kv_cache_free(cache);
  ci_model_free(m);
  be->ops->destroy(be);
}

/* KV sharers (gemma4-ple layers 4, 5) read their quantized donors. */
static void test_shared_quantized(void **state) {
  (void)state;
  static const ci_kv_format shared_formats[] = {{CI_KV_TURBO, 4, 4, 0}, {CI_KV_TURBO_V, 4, 4, 32}};
  check_exact_crossing("gemma4-ple", 64, 9, &shared_formats[0]);
  /* turbo-v needs D % 32: the full layers (D 32) could, the sliding ones (D 16) cannot. */
  ci_backend *be = ci_cpu_backend_create(1);
  ci_model *m = load(be, "gemma4-ple");
  ci_kv_cache *cache = ci_model_kv_cache_create(m, CI_KV_BF16, 16, 0);
  ci_kv_seq *seq = ci_kv_seq_create(cache);
  assert_int_equal(ci_kv_seq_set_plan(seq, &shared_formats[1], 0), CI_ERR);
  ci_kv_seq_free(seq);
  ci_kv_cache_free(cache);
  ci_model_free(m);
  be->ops->destroy(be);
}

/* kv_config.json: per-layer plans (gemma4: full layers 2 and 5 get different codecs, the
 * sliding layers stay bf16); bad entries are rejected by name. */
static void test_kv_config(void **state) {
  (void)state;
  char dir[] = "/tmp/cinfer-kvconfig-XXXXXX";
  assert_non_null(mkdtemp(dir));
  static const char *const files[] = {"config.json", "model.safetensors"};
  char src[1200], dst[1200];
  for (int i = 0; i < 2; i++) {
    snprintf(src, sizeof src, "%s/gemma4/%s", CI_FIXTURE_DIR, files[i]);
    snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
    assert_int_equal(symlink(src, dst), 0);
  }
  snprintf(dst, sizeof dst, "%s/kv_config.json", dir);
  FILE *f = fopen(dst, "w");
  fputs("[{\"layer_idx\": 2, \"codec\": \"turbo\", \"k_bits\": 4, \"v_bits\": 3},\n"
        " {\"layer_idx\": 5, \"bits\": 8, \"group_size\": 32}]\n",
        f);
  fclose(f);
  ci_backend *be = ci_cpu_backend_create(1);
  ci_model *m = ci_model_load(dir, be);
  if (!m) fprintf(stderr, "%s\n", ci_last_error());
  assert_non_null(m);
  ci_kv_cache *cache = ci_model_kv_cache_create(m, CI_KV_BF16, 16, 0);
  assert_int_not_equal(cache->group_of_layer[2], cache->group_of_layer[5]);
  ci_kv_seq *seq = ci_kv_seq_create(cache);
  assert_int_equal(ci_model_kv_seq_apply_config(m, seq), CI_OK);
  int32_t *ids = make_ids(20, m->spec.vocab, 3);
  float *logits = malloc((size_t)m->spec.vocab * sizeof(float));
  assert_int_equal(ci_model_forward(m, seq, ids, 20, logits, 1), CI_OK);
  const ci_kv_format turbo = {CI_KV_TURBO, 4, 3, 0}, affine = {CI_KV_AFFINE, 8, 8, 32};
  const ci_kv_format bf16 = ci_kv_format_plain(CI_KV_BF16);
  ci_paged_kv v2 = ci_kv_seq_view(seq, 2), v5 = ci_kv_seq_view(seq, 5), v0 = ci_kv_seq_view(seq, 0);
  assert_true(ci_kv_format_equal(&v2.format, &turbo));
  assert_true(ci_kv_format_equal(&v5.format, &affine));
  assert_true(ci_kv_format_equal(&v0.format, &bf16));
  free(logits);
  free(ids);
  ci_kv_seq_free(seq);
  ci_kv_cache_free(cache);
  ci_model_free(m);
  static const struct {
    const char *json, *expected;
  } bad[] = {{"[{\"layer_idx\": 9, \"bits\": 8}]", "not a cache layer"},
             {"[{\"layer_idx\": 1, \"bits\": 3}]", "4 or 8"},
             {"[{\"layer_idx\": 1}]", "bits"},
             {"{\"layer_idx\": 1}", "JSON array"},
             {"[{\"layer_idx\": 1, \"codec\": \"zip\"}]", "unknown KV codec"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    f = fopen(dst, "w");
    fputs(bad[i].json, f);
    fclose(f);
    assert_null(ci_model_load(dir, be));
    if (!strstr(ci_last_error(), bad[i].expected)) fprintf(stderr, "%s\n", ci_last_error());
    assert_non_null(strstr(ci_last_error(), bad[i].expected));
  }
  be->ops->destroy(be);
  unlink(dst);
  for (int i = 0; i < 2; i++) {
    snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
    unlink(dst);
  }
  rmdir(dir);
}

/* --kv-protect: the first and last N cache layers keep bf16 while the others convert; protecting
 * every layer gives the bf16 logits exactly; a cache made for a smaller protect refuses. */
static void test_protect(void **state) {
  (void)state;
  ci_backend *be = ci_cpu_backend_create(1);
  ci_model *m = load(be, "gemma3"); /* 6 cache layers, sliding and full */
  const int n_layers = m->spec.n_cache_layers, vocab = m->spec.vocab, n = 24;
  assert_true(n_layers >= 3);
  int32_t *ids = make_ids(n, vocab, 5);
  const ci_kv_format turbo = {CI_KV_TURBO, 4, 4, 0};
  const ci_kv_format bf16 = ci_kv_format_plain(CI_KV_BF16);
  float *bf16_logits = malloc((size_t)n * vocab * sizeof(float));
  float *logits = malloc((size_t)n * vocab * sizeof(float));
  for (int protect = 1; protect <= (n_layers + 1) / 2; protect++) {
    ci_kv_cache *cache = ci_model_kv_cache_create_protected(m, CI_KV_BF16, 16, 0, protect);
    assert_non_null(cache);
    ci_kv_seq *plain = ci_kv_seq_create(cache), *seq = ci_kv_seq_create(cache);
    assert_int_equal(ci_kv_seq_set_plan_protected(seq, &turbo, 4, protect), CI_OK);
    assert_int_equal(ci_model_forward(m, plain, ids, n, bf16_logits, n), CI_OK);
    assert_int_equal(ci_model_forward(m, seq, ids, n, logits, n), CI_OK);
    assert_int_equal(seq->converted, 2 * protect < n_layers); /* all protected: nothing to do */
    for (int l = 0; l < n_layers; l++) {
      const ci_paged_kv view = ci_kv_seq_view(seq, l);
      const int kept = l < protect || l >= n_layers - protect;
      assert_true(ci_kv_format_equal(&view.format, kept ? &bf16 : &turbo));
    }
    const float d = max_diff(logits, bf16_logits, (int64_t)n * vocab);
    if (2 * protect >= n_layers)
      assert_true(d == 0.0f); /* every layer protected: bf16 throughout */
    else
      assert_true(d > 0.0f);
    ci_kv_seq_free(plain);
    ci_kv_seq_free(seq);
    ci_kv_cache_free(cache);
  }
  /* a cache without separate groups for the protected layers refuses the plan */
  ci_kv_cache *cache = ci_model_kv_cache_create(m, CI_KV_BF16, 16, 0);
  ci_kv_seq *seq = ci_kv_seq_create(cache);
  assert_int_equal(ci_kv_seq_set_plan_protected(seq, &turbo, 0, 1), CI_ERR);
  assert_non_null(strstr(ci_last_error(), "smaller protect"));
  ci_kv_seq_free(seq);
  ci_kv_cache_free(cache);
  free(bf16_logits);
  free(logits);
  free(ids);
  ci_model_free(m);
  be->ops->destroy(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_protect),
      cmocka_unit_test(test_start_beyond_prompt),
      cmocka_unit_test(test_exact_crossing_full_layers),
      cmocka_unit_test(test_sliding_quantized),
      cmocka_unit_test(test_shared_quantized),
      cmocka_unit_test(test_kv_config),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
