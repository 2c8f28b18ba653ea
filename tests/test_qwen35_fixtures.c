/* Qwen3.5 against transformers: the fixtures qwen35 (raw bf16 checkpoint), qwen35-q4g64 and
 * qwen35-q8g32 (MLX layout and affine quantization) that tools/make_fixtures.py exports —
 * transformers' f32 logits of an 80-token prompt (two of its 64-token prefill chunks) and its
 * 16-token greedy continuation. cinfer with the f32 KV codec must match the logits within 1e-3
 * with the same argmax at every chunking (whole, 1, 3, 13, 64, 65: the chunked and recurrent
 * forms of the DeltaNet and every split between them), the bf16 KV codec the K/V-rounded
 * reference within 2.5e-2 (see test_parity.c), the same model under the nested `qwen3_5`
 * config serialisation gives the same logits, and greedy decoding reproduces the continuation.
 * The test is skipped (exit 77) while tests/fixtures/qwen35 does not exist yet. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backend/cpu/cpu_backend.h"
#include "base/error.h"
#include "fixture_files.h"
#include "model/model.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { SKIP = 77, N_GREEDY = 16 };

static const char *const fixtures[] = {"qwen35", "qwen35-q4g64", "qwen35-q8g32"};

static int exists(const char *path) {
  return access(path, R_OK) == 0;
}

/* Logits of every prompt position fed in chunks through a fresh sequence in `codec`. */
static void run_chunks(ci_model *m, ci_kv_codec codec, const int32_t *ids, int n, int chunk,
                       float *out) {
  ci_kv_cache *cache = ci_model_kv_cache_create(m, codec, 16, 0);
  assert_non_null(cache);
  ci_kv_seq *seq = ci_kv_seq_create(cache);
  assert_non_null(seq);
  for (int s = 0; s < n; s += chunk) {
    const int len = n - s < chunk ? n - s : chunk;
    if (ci_model_forward(m, seq, ids + s, len, out + (size_t)s * m->spec.vocab, len))
      fail_msg("forward: %s", ci_last_error());
  }
  ci_kv_seq_free(seq);
  ci_kv_cache_free(cache);
}

/* Max |a - b| over n rows of V, and the rows whose argmax differs. */
static float compare(const float *a, const float *b, int n, int V, int *mismatches) {
  float worst = 0.0f;
  *mismatches = 0;
  for (int i = 0; i < n; i++) {
    int ba = 0, bb = 0;
    for (int v = 0; v < V; v++) {
      const float d = fabsf(a[(size_t)i * V + v] - b[(size_t)i * V + v]);
      if (!(d <= worst)) worst = d;
      if (a[(size_t)i * V + v] > a[(size_t)i * V + ba]) ba = v;
      if (b[(size_t)i * V + v] > b[(size_t)i * V + bb]) bb = v;
    }
    *mismatches += ba != bb;
  }
  return worst;
}

static float *read_logits(const char *dir, const char *file, int n, int V) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  size_t size;
  float *ref = (float *)fixture_read_file(path, &size);
  if (!ref) fail_msg("%s is missing", path);
  assert_int_equal(size, (size_t)n * V * sizeof(float));
  return ref;
}

/* The greedy continuation of the prompt with the f32 codec. */
static void greedy(ci_model *m, const int32_t *ids, int n, int32_t *out) {
  const int V = m->spec.vocab;
  ci_kv_cache *cache = ci_model_kv_cache_create(m, CI_KV_F32, 16, 0);
  ci_kv_seq *seq = ci_kv_seq_create(cache);
  float *logits = malloc((size_t)V * sizeof(float));
  assert_int_equal(ci_model_forward(m, seq, ids, n, logits, 1), CI_OK);
  for (int t = 0; t < N_GREEDY; t++) {
    int best = 0;
    for (int v = 1; v < V; v++)
      if (logits[v] > logits[best]) best = v;
    out[t] = best;
    if (t + 1 < N_GREEDY) assert_int_equal(ci_model_forward(m, seq, &out[t], 1, logits, 1), CI_OK);
  }
  free(logits);
  ci_kv_seq_free(seq);
  ci_kv_cache_free(cache);
}

/* A copy of the fixture under the nested serialisation: {"model_type": "qwen3_5",
 * "text_config": <its config>, ...} beside a link to its weights. Returns the folder. */
static void nested_copy(const char *dir, char *out) {
  strcpy(out, "/tmp/ci_qwen35_nested_XXXXXX");
  assert_non_null(mkdtemp(out));
  char path[1024], link[1024];
  snprintf(path, sizeof path, "%s/config.json", dir);
  json_t *text = json_load_file(path, 0, NULL);
  assert_non_null(text);
  json_t *top = json_pack("{s:s, s:O}", "model_type", "qwen3_5", "text_config", text);
  json_t *q = json_object_get(text, "quantization");
  if (q) { /* MLX keeps the quantization map at the top level */
    json_object_set(top, "quantization", q);
    json_object_del(json_object_get(top, "text_config"), "quantization");
    json_object_del(json_object_get(top, "text_config"), "quantization_config");
  }
  json_object_set(top, "tie_word_embeddings", json_object_get(text, "tie_word_embeddings"));
  snprintf(path, sizeof path, "%s/config.json", out);
  assert_int_equal(json_dump_file(top, path, JSON_INDENT(2)), 0);
  json_decref(top);
  json_decref(text);
  char *abs = realpath(dir, NULL);
  assert_non_null(abs);
  snprintf(path, sizeof path, "%s/model.safetensors", abs);
  snprintf(link, sizeof link, "%s/model.safetensors", out);
  assert_int_equal(symlink(path, link), 0);
  free(abs);
}

static void remove_nested(const char *dir) {
  char path[1024];
  snprintf(path, sizeof path, "%s/config.json", dir);
  unlink(path);
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  unlink(path);
  rmdir(dir);
}

/* Returns the number of failed checks of one fixture (each printed). */
static int check_fixture(ci_backend *be, const char *name) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/%s", CI_FIXTURE_DIR, name);
  ci_model *m = ci_model_load(dir, be);
  if (!m) fail_msg("load %s: %s", dir, ci_last_error());
  const int V = m->spec.vocab;
  int n, failures = 0, mismatches;
  int32_t *ids = fixture_read_ids(dir, &n);
  assert_true(ids && n >= 32);
  float *ref = read_logits(dir, "logits.f32", n, V);
  float *ref_bf16 = read_logits(dir, "logits_kvbf16.f32", n, V);
  float *got = malloc((size_t)n * V * sizeof(float));
  const int chunks[] = {n, 1, 3, 13, 64, 65};
  for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
    run_chunks(m, CI_KV_F32, ids, n, chunks[c], got);
    const float d = compare(got, ref, n, V, &mismatches);
    printf("  %-14s kv f32  chunk %2d: max |dlogit| %.2e, argmax mismatches %d\n", name, chunks[c],
           d, mismatches);
    if (!(d <= 1e-3f) || mismatches) failures++;
  }
  run_chunks(m, CI_KV_BF16, ids, n, n, got);
  float d = compare(got, ref_bf16, n, V, &mismatches);
  printf("  %-14s kv bf16 whole   : max |dlogit| %.2e, argmax mismatches %d\n", name, d,
         mismatches);
  if (!(d <= 2.5e-2f) || mismatches) failures++;
  /* the nested serialisation */
  char nested[64];
  nested_copy(dir, nested);
  ci_model *mn = ci_model_load(nested, be);
  if (!mn) fail_msg("load nested %s: %s", name, ci_last_error());
  run_chunks(mn, CI_KV_F32, ids, n, n, got);
  d = compare(got, ref, n, V, &mismatches);
  printf("  %-14s nested qwen3_5 config: max |dlogit| %.2e\n", name, d);
  if (!(d <= 1e-3f) || mismatches) failures++;
  ci_model_free(mn);
  remove_nested(nested);
  /* greedy continuation */
  char path[1100];
  snprintf(path, sizeof path, "%s/greedy.txt", dir);
  char *want = fixture_read_file(path, NULL);
  if (want) {
    int32_t tokens[N_GREEDY];
    greedy(m, ids, n, tokens);
    char line[N_GREEDY * 12] = "";
    for (int t = 0; t < N_GREEDY; t++)
      snprintf(line + strlen(line), sizeof line - strlen(line), t ? ",%d" : "%d", tokens[t]);
    want[strcspn(want, "\r\n")] = '\0';
    printf("  %-14s greedy %s (transformers %s)\n", name, line, want);
    if (strcmp(line, want)) failures++;
    free(want);
  } else {
    printf("  %-14s FAIL: greedy.txt is missing\n", name);
    failures++;
  }
  free(got);
  free(ref);
  free(ref_bf16);
  free(ids);
  ci_model_free(m);
  return failures;
}

static void test_fixtures(void **state) {
  (void)state;
  ci_backend *be = ci_cpu_backend_create(2);
  assert_non_null(be);
  int failures = 0;
  for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/logits.f32", CI_FIXTURE_DIR, fixtures[i]);
    if (!exists(path)) {
      printf("  %s: not exported yet (tools/make_fixtures.py --only qwen35)\n", fixtures[i]);
      continue;
    }
    failures += check_fixture(be, fixtures[i]);
  }
  be->ops->destroy(be);
  assert_int_equal(failures, 0);
}

int main(void) {
  if (!exists(CI_FIXTURE_DIR "/qwen35/logits.f32")) {
    printf("SKIP: " CI_FIXTURE_DIR "/qwen35 does not exist yet (export it with "
           "tools/make_fixtures.py --only qwen35)\n");
    return SKIP;
  }
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_fixtures)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
