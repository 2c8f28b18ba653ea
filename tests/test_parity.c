/* Parity with Hugging Face transformers: every fixture in tests/fixtures (tiny random models
 * exported by tools/make_fixtures.py with transformers' f32 logits) fed whole, in chunks of 1
 * and of 3 (and of W + 1 for sliding-window models) through the paged KV cache: max |Δlogit| <=
 * 1e-3 and the same argmax everywhere. The bf16 KV codec is compared with logits_kvbf16.f32
 * (transformers with K and V rounded to bf16 where attention reads them), the f32 codec with
 * logits.f32. The f32 codec must agree within 1e-3; the bf16 codec within 2.5e-2, because a 1e-6
 * difference in a K/V element near a bf16 rounding boundary flips it by one bf16 ulp (2^-8
 * relative), which the tiny fixtures' large weights amplify to ~3e-3 in a few logits, and to 1.8e-2
 * in gemma4-ple, whose per-layer inputs and layer scalars amplify more (measured; which elements
 * flip depends on the kernel path's summation order; typical agreement is 1e-5). The argmax must
 * agree everywhere. Each kernel path the CPU supports (plain C, AVX2, AVX-512 with and without
 * VNNI) is run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "backend/cpu/cpu_backend.h"
#include "base/error.h"
#include "model/model.h"
#include "fixture_files.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const float f32_kv_tolerance = 1e-3f;
static const float bf16_kv_tolerance = 2.5e-2f;

/* Runs one fixture at one chunk size; returns the max |Δlogit| and counts argmax mismatches. */
static float run_fixture(ci_model *model, ci_kv_codec codec, const int32_t *ids, int n,
                         const float *ref, int chunk, int *argmax_mismatches) {
  const int V = model->spec.vocab;
  ci_kv_cache *cache = ci_model_kv_cache_create(model, codec, 16, 0);
  assert_non_null(cache);
  ci_kv_seq *seq = ci_kv_seq_create(cache);
  assert_non_null(seq);
  float *logits = malloc((size_t)n * V * sizeof(float));
  for (int start = 0; start < n; start += chunk) {
    int len = n - start < chunk ? n - start : chunk;
    int rc = ci_model_forward(model, seq, ids + start, len, logits + (size_t)start * V, len);
    if (rc) fprintf(stderr, "forward failed: %s\n", ci_last_error());
    assert_int_equal(rc, CI_OK);
  }
  assert_int_equal(seq->n, n);
  float max_diff = 0.0f;
  *argmax_mismatches = 0;
  for (int i = 0; i < n; i++) {
    int best = 0, ref_best = 0;
    for (int v = 0; v < V; v++) {
      float d = fabsf(logits[(size_t)i * V + v] - ref[(size_t)i * V + v]);
      if (!(d <= max_diff)) max_diff = d; /* NaN propagates as a failure */
      if (logits[(size_t)i * V + v] > logits[(size_t)i * V + best]) best = v;
      if (ref[(size_t)i * V + v] > ref[(size_t)i * V + ref_best]) ref_best = v;
    }
    if (best != ref_best) (*argmax_mismatches)++;
  }
  free(logits);
  ci_kv_seq_free(seq);
  assert_int_equal(ci_kv_cache_blocks_used(cache), 0);
  ci_kv_cache_free(cache);
  return max_diff;
}

/* Returns the number of failed chunkings of one fixture (each is printed). */
static int test_fixture_dir(const char *dir) {
  int failures = 0;
  ci_backend *be = ci_cpu_backend_create(2);
  assert_non_null(be);
  ci_model *model = ci_model_load(dir, be);
  if (!model) fprintf(stderr, "load %s: %s\n", dir, ci_last_error());
  assert_non_null(model);
  int n;
  int32_t *ids = fixture_read_ids(dir, &n);
  assert_true(n >= 32);
  static const struct {
    ci_kv_codec codec;
    const char *reference;
    float tolerance;
  } kv_cases[] = {{CI_KV_BF16, "logits_kvbf16.f32", bf16_kv_tolerance},
                  {CI_KV_F32, "logits.f32", f32_kv_tolerance}};
  for (size_t k = 0; k < sizeof kv_cases / sizeof kv_cases[0]; k++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, kv_cases[k].reference);
    size_t size = 0;
    float *ref = (float *)fixture_read_file(path, &size);
    assert_non_null(ref);
    assert_int_equal(size, (size_t)n * model->spec.vocab * sizeof(float));
    /* Sliding models also run in chunks of W + 1, so a chunk spans a whole window. */
    int window = 0;
    for (int l = 0; l < model->spec.n_layers; l++)
      if (model->spec.layers[l].window > window) window = model->spec.layers[l].window;
    const int chunks[] = {n, 1, 3, window + 1};
    const size_t n_chunks = window > 0 && window + 1 < n ? 4 : 3;
    for (size_t c = 0; c < n_chunks; c++) {
      int mismatches;
      float diff = run_fixture(model, kv_cases[k].codec, ids, n, ref, chunks[c], &mismatches);
      printf("  %-20s kv %-4s chunk %2d: max |dlogit| %.2e, argmax mismatches %d\n",
             strrchr(dir, '/') + 1, ci_kv_codec_name(kv_cases[k].codec), chunks[c], diff,
             mismatches);
      if (!(diff <= kv_cases[k].tolerance) || mismatches != 0) {
        printf("  FAIL: %s kv %s at chunk %d\n", dir, ci_kv_codec_name(kv_cases[k].codec),
               chunks[c]);
        failures++;
      }
    }
    free(ref);
  }
  free(ids);
  ci_model_free(model);
  be->ops->destroy(be);
  return failures;
}

static void test_all_fixtures(void **state) {
  (void)state;
  DIR *d = opendir(CI_FIXTURE_DIR);
  assert_non_null(d);
  char *names[256];
  int count = 0;
  struct dirent *e;
  while ((e = readdir(d)) && count < 256) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/logits.f32", CI_FIXTURE_DIR, e->d_name);
    FILE *f = fopen(path, "rb");
    if (!f) continue;
    fclose(f);
    names[count++] = strdup(e->d_name);
  }
  closedir(d);
  assert_true(count >= 24);
  /* Every kernel path this CPU supports: the CPUID choice is lowered through CINFER_ISA, and
   * the VNNI int8-plane decode kernels are switched off with CINFER_INT8=0. */
  static const struct {
    ci_isa isa;
    const char *int8;
  } paths[] = {{CI_ISA_REF, "1"}, {CI_ISA_AVX2, "1"}, {CI_ISA_AVX512, "0"}, {CI_ISA_AVX512, "1"}};
  int failures = 0;
  for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
    if (!ci_isa_supported(paths[p].isa)) continue;
    setenv("CINFER_ISA", ci_isa_name(paths[p].isa), 1);
    setenv("CINFER_INT8", paths[p].int8, 1);
    printf("kernels: %s, int8 planes %s\n", ci_isa_name(paths[p].isa), paths[p].int8);
    for (int i = 0; i < count; i++) {
      char dir[1024];
      snprintf(dir, sizeof dir, "%s/%s", CI_FIXTURE_DIR, names[i]);
      failures += test_fixture_dir(dir);
    }
  }
  unsetenv("CINFER_ISA");
  unsetenv("CINFER_INT8");
  for (int i = 0; i < count; i++) free(names[i]);
  assert_int_equal(failures, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_all_fixtures)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
