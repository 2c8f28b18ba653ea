/* ci_session (engine/session.h) and ci_model_open: a session's logits are bit-identical to
 * ci_model_forward on a sequence of its own, whatever the feed chunks; the position limit,
 * bad ids, synthetic fill (position, KV bytes, conversion), reset, the model facts, and the
 * up-front KV memory of a backend with memory of its own. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "base/error.h"
#include "engine/session.h"
#include "kv/cache.h"
#include "model/model.h"
#include "backend/cpu/cpu_backend.h"
#include <stdio.h>

#include <stdlib.h>
#include <string.h>

#define FIXTURE(name) CI_FIXTURE_DIR "/" name

enum { N = 40 };

static void fill_ids(int32_t *ids, int n, int vocab) {
  uint64_t state = 7;
  for (int i = 0; i < n; i++) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    ids[i] = (int32_t)((state >> 33) % (uint64_t)vocab);
  }
}

/* Logits of every position through ci_model_forward on a plain bf16 sequence, in one step. */
static float *reference_logits(ci_model *model, const int32_t *ids, int n) {
  const int vocab = ci_model_vocab_size(model);
  ci_kv_cache *cache = ci_model_kv_cache_create(model, CI_KV_BF16, 16, 0);
  ci_kv_seq *seq = ci_kv_seq_create(cache);
  float *logits = malloc((size_t)n * vocab * sizeof *logits);
  assert_int_equal(ci_model_forward(model, seq, ids, n, logits, n), CI_OK);
  ci_kv_seq_free(seq);
  ci_kv_cache_free(cache);
  return logits;
}

static void check_model(const char *dir) {
  ci_model *model = ci_model_open(dir, 2);
  assert_non_null(model);
  const int vocab = ci_model_vocab_size(model);
  int32_t ids[N];
  fill_ids(ids, N, vocab);
  float *want = reference_logits(model, ids, N);
  float *got = malloc((size_t)N * vocab * sizeof *got);
  ci_session_options options;
  ci_session_options_default(&options);
  options.kv_plan = CI_KV_PLAN_NONE;
  ci_session *session = ci_session_create(model, &options);
  assert_non_null(session);
  assert_ptr_equal(ci_session_model(session), model);
  for (int round = 0; round < 2; round++) { /* the second after a reset */
    int done = 0;
    const int chunks[] = {1, 7, 16, 16};
    for (int c = 0; done < N; c++) {
      const int len = N - done < chunks[c % 4] ? N - done : chunks[c % 4];
      assert_int_equal(ci_session_feed(session, ids + done, len, got + (size_t)done * vocab, len),
                       CI_OK);
      done += len;
      assert_int_equal(ci_session_position(session), done);
    }
    assert_memory_equal(got, want, (size_t)N * vocab * sizeof *got);
    assert_true(ci_session_kv_bytes_used(session) > 0);
    assert_int_equal(ci_session_reset(session), CI_OK);
    assert_int_equal(ci_session_position(session), 0);
  }
  ci_session_free(session);
  free(want);
  free(got);
  ci_model_close(model);
}

static void test_logits_match_forward(void **state) {
  (void)state;
  check_model(FIXTURE("llama"));
  check_model(FIXTURE("gemma3")); /* sliding-window layers */
  check_model(FIXTURE("gemma4")); /* KV-sharing layers */
}

static void test_limits_and_errors(void **state) {
  (void)state;
  ci_model *model = ci_model_open(FIXTURE("llama"), 1);
  assert_non_null(model);
  assert_string_equal(ci_model_architecture(model), "llama");
  assert_true(ci_model_context_length(model) > 0);
  const ci_kv_format bf16 = ci_kv_format_plain(CI_KV_BF16), f32 = ci_kv_format_plain(CI_KV_F32);
  assert_int_equal(ci_model_kv_bytes_per_token(model, &f32),
                   2 * ci_model_kv_bytes_per_token(model, &bf16));
  ci_session_options options;
  ci_session_options_default(&options);
  options.max_tokens = 10;
  ci_session *session = ci_session_create(model, &options);
  assert_non_null(session);
  int32_t ids[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  assert_int_equal(ci_session_feed(session, ids, 11, NULL, 0), CI_ERR);
  assert_int_equal(ci_session_position(session), 0);
  const int32_t bad = ci_model_vocab_size(model);
  assert_int_equal(ci_session_feed(session, &bad, 1, NULL, 0), CI_ERR);
  assert_non_null(strstr(ci_last_error(), "out of range"));
  float logits[2];
  assert_int_equal(ci_session_feed(session, ids, 1, logits, 2), CI_ERR); /* 2 rows of 1 */
  assert_int_equal(ci_session_feed(session, ids, 0, NULL, 0), CI_ERR);
  assert_int_equal(ci_session_feed(session, ids, 10, NULL, 0), CI_OK);
  assert_int_equal(ci_session_fill_synthetic(session, 1, 1), CI_ERR);
  ci_session_free(session);
  ci_model_close(model);
  assert_null(ci_model_open(FIXTURE("no-such-model"), 1));
  assert_non_null(strstr(ci_last_error(), "no-such-model"));
}

/* Synthetic rows count as positions, convert like fed ones, and a feed can follow them. */
static void test_fill_synthetic(void **state) {
  (void)state;
  ci_model *model = ci_model_open(FIXTURE("gemma3"), 1);
  assert_non_null(model);
  ci_session_options options;
  ci_session_options_default(&options);
  ci_session *plain = ci_session_create(model, &options);
  options.kv_plan = CI_KV_PLAN_TARGET;
  assert_int_equal(ci_kv_format_parse("turbo", 4, 0, 0, &options.kv_target), CI_OK);
  options.kv_start = 64;
  ci_session *quantized = ci_session_create(model, &options);
  assert_non_null(plain);
  assert_non_null(quantized);
  assert_int_equal(ci_session_fill_synthetic(plain, 300, 5), CI_OK);
  assert_int_equal(ci_session_fill_synthetic(quantized, 300, 5), CI_OK);
  assert_int_equal(ci_session_position(plain), 300);
  assert_true(ci_session_kv_bytes_used(quantized) < ci_session_kv_bytes_used(plain));
  int32_t id = 3;
  float *logits = malloc((size_t)ci_model_vocab_size(model) * sizeof *logits);
  assert_int_equal(ci_session_feed(quantized, &id, 1, logits, 1), CI_OK);
  free(logits);
  assert_int_equal(ci_session_position(quantized), 301);
  assert_int_equal(ci_session_fill_synthetic(quantized, 0, 5), CI_OK);
  assert_int_equal(ci_session_fill_synthetic(quantized, -1, 5), CI_ERR);
  ci_session_free(plain);
  ci_session_free(quantized);
  ci_model_close(model);
}

/* A backend with memory of its own (a GPU) needs the session's block tables and KV arena made up
 * front: with the CPU backend marked so, a session gives the host-visible logits bit for bit,
 * with plain and converting (turbo after 16 tokens) KV, fills its whole max_tokens from the arena
 * it sized, and refuses the position after. */
static void check_device_memory(const char *dir) {
  ci_model *model = ci_model_open(dir, 2);
  assert_non_null(model);
  const int vocab = ci_model_vocab_size(model);
  int32_t ids[N];
  fill_ids(ids, N, vocab);
  float *want[2], *got = malloc((size_t)N * vocab * sizeof *got);
  ci_session_options options[2];
  for (int plan = 0; plan < 2; plan++) {
    ci_session_options_default(&options[plan]);
    options[plan].max_tokens = N;
    if (plan) {
      options[plan].kv_plan = CI_KV_PLAN_TARGET;
      assert_int_equal(ci_kv_format_parse("turbo", 4, 0, 0, &options[plan].kv_target), CI_OK);
      options[plan].kv_start = 16;
    } else {
      options[plan].kv_plan = CI_KV_PLAN_NONE;
    }
    ci_session *host = ci_session_create(model, &options[plan]);
    assert_non_null(host);
    want[plan] = malloc((size_t)N * vocab * sizeof *want[plan]);
    for (int done = 0; done < N; done += 8)
      assert_int_equal(ci_session_feed(host, ids + done, 8, want[plan] + (size_t)done * vocab, 8),
                       CI_OK);
    ci_session_free(host);
  }
  model->be->host_visible = 0;
  for (int plan = 0; plan < 2; plan++) {
    ci_session *session = ci_session_create(model, &options[plan]);
    assert_non_null(session);
    for (int done = 0; done < N; done += 8)
      assert_int_equal(ci_session_feed(session, ids + done, 8, got + (size_t)done * vocab, 8),
                       CI_OK);
    assert_memory_equal(got, want[plan], (size_t)N * vocab * sizeof *got);
    assert_int_equal(ci_session_feed(session, ids, 1, NULL, 0), CI_ERR); /* past max_tokens */
    assert_int_equal(ci_session_reset(session), CI_OK);
    assert_int_equal(ci_session_feed(session, ids, 8, got, 8), CI_OK);
    assert_memory_equal(got, want[plan], (size_t)8 * vocab * sizeof *got);
    ci_session_free(session);
    free(want[plan]);
  }
  model->be->host_visible = 1;
  free(got);
  ci_model_close(model);
}

static void test_device_memory(void **state) {
  (void)state;
  check_device_memory(FIXTURE("llama"));
  check_device_memory(FIXTURE("gemma3")); /* sliding-window layers */
}

/* kB of anonymous memory in transparent huge pages (0 when unknown). */
static long anon_huge_kb(void) {
  FILE *f = fopen("/proc/self/smaps_rollup", "r");
  char line[256];
  long kb = 0;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "AnonHugePages:", 14)) kb = atol(line + 14);
  if (f) fclose(f);
  return kb;
}

/* Weights read into huge-page memory (the CPU default) give the logits of mapped weights, bit
 * for bit; the starter model (31 MB) is large enough for 2 MiB pages, which are reported. */
static void test_weights_in_huge_pages(void **state) {
  (void)state;
  const char *dirs[] = {FIXTURE("llama"), FIXTURE("gemma3-q4g64"), CI_STARTER_DIR};
  for (size_t d = 0; d < sizeof dirs / sizeof dirs[0]; d++) {
    ci_backend *be = ci_cpu_backend_create(1);
    ci_model *mapped = ci_model_load_in(dirs[d], be, CI_WEIGHTS_MMAP);
    const long before = anon_huge_kb();
    ci_model *read = ci_model_load_in(dirs[d], be, CI_WEIGHTS_HUGE_PAGES);
    if (!mapped || !read) fail_msg("%s: %s", dirs[d], ci_last_error());
    printf("  %s: %ld kB of its weights in huge pages (0 where the kernel's THP is off)\n",
           strrchr(dirs[d], '/') + 1, anon_huge_kb() - before);
    const int V = mapped->spec.vocab;
    int32_t ids[12];
    for (int i = 0; i < 12; i++) ids[i] = (int32_t)((i * 37 + 5) % V);
    float *a = malloc((size_t)12 * V * sizeof *a), *b = malloc((size_t)12 * V * sizeof *b);
    ci_model *models[2] = {mapped, read};
    float *out[2] = {a, b};
    for (int k = 0; k < 2; k++) {
      ci_kv_cache *cache = ci_model_kv_cache_create(models[k], CI_KV_BF16, 16, 0);
      ci_kv_seq *seq = ci_kv_seq_create(cache);
      assert_int_equal(ci_model_forward(models[k], seq, ids, 12, out[k], 12), CI_OK);
      ci_kv_seq_free(seq);
      ci_kv_cache_free(cache);
    }
    assert_memory_equal(a, b, (size_t)12 * V * sizeof *a);
    free(a);
    free(b);
    ci_model_free(mapped);
    ci_model_free(read);
    be->ops->destroy(be);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_logits_match_forward),  cmocka_unit_test(test_limits_and_errors),
      cmocka_unit_test(test_fill_synthetic),        cmocka_unit_test(test_device_memory),
      cmocka_unit_test(test_weights_in_huge_pages),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
