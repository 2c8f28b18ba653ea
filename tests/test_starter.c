/* The bundled starter model against transformers: per-position NLL of the first held-out
 * sequence of models/starter/eval_ids.json (transformers in f32 on the dequantized shipped
 * weights) within 5e-3 nats at every position and 0.1% on the mean, f32 KV. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backend/cpu/cpu_backend.h"
#include "base/error.h"
#include "model/model.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define STARTER_DIR CI_FIXTURE_DIR "/../../models/starter"

static void test_starter_nll(void **state) {
  (void)state;
  json_error_t err;
  json_t *root = json_load_file(STARTER_DIR "/eval_ids.json", 0, &err);
  assert_non_null(root);
  json_t *seq = json_array_get(json_object_get(root, "sequences"), 0);
  json_t *ref = json_array_get(json_object_get(root, "per_position_nll"), 0);
  assert_non_null(seq);
  assert_non_null(ref);
  const int n = (int)json_array_size(seq);
  assert_int_equal(json_array_size(ref), (size_t)(n - 1));
  ci_backend *be = ci_cpu_backend_create(2);
  ci_model *m = ci_model_load(STARTER_DIR, be);
  if (!m) fprintf(stderr, "%s\n", ci_last_error());
  assert_non_null(m);
  const int V = m->spec.vocab, chunk = 256;
  int32_t *ids = malloc((size_t)n * sizeof *ids);
  for (int i = 0; i < n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(seq, (size_t)i));
  ci_kv_cache *cache = ci_model_kv_cache_create(m, CI_KV_F32, 16, 0);
  ci_kv_seq *kv = ci_kv_seq_create(cache);
  float *logits = malloc((size_t)chunk * V * sizeof(float));
  double sum = 0.0, ref_sum = 0.0, worst = 0.0;
  for (int start = 0; start < n - 1; start += chunk) {
    const int len = n - 1 - start < chunk ? n - 1 - start : chunk;
    assert_int_equal(ci_model_forward(m, kv, ids + start, len, logits, len), CI_OK);
    for (int r = 0; r < len; r++) {
      const float *row = logits + (size_t)r * V;
      double max = row[0], total = 0.0;
      for (int i = 1; i < V; i++) max = row[i] > max ? row[i] : max;
      for (int i = 0; i < V; i++) total += exp((double)row[i] - max);
      const double nll = log(total) + max - row[ids[start + r + 1]];
      const double want = json_number_value(json_array_get(ref, (size_t)(start + r)));
      sum += nll;
      ref_sum += want;
      if (fabs(nll - want) > worst) worst = fabs(nll - want);
    }
  }
  printf("starter: mean NLL %.6f (transformers %.6f), worst position |diff| %.2e\n", sum / (n - 1),
         ref_sum / (n - 1), worst);
  assert_true(worst <= 5e-3);
  assert_true(fabs(sum - ref_sum) <= 1e-3 * ref_sum);
  free(logits);
  free(ids);
  ci_kv_seq_free(kv);
  ci_kv_cache_free(cache);
  ci_model_free(m);
  be->ops->destroy(be);
  json_decref(root);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_starter_nll)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
