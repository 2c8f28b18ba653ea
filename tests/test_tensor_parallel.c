/* Tensor parallelism on CPU ranks (model/tensor_parallel.h): a fixture split over two ranks gives
 * its prompt logits within 1e-3 of transformers (as the whole model must: test_parity) with the
 * same argmax, and then greedy decode steps within 1e-3 of the whole model's logits with the same
 * tokens (f32 KV, exact numerics: the split only sums the o/down products in two parts), for
 * dense, biased, q/k-normed, softcapped, sliding-window, tied-head, q8 and Gemma 4 fixtures (whose
 * one-KV-head layers the ranks share), and over four ranks, which share every KV head in pairs;
 * batched decode on the split model is bit-identical to solo decode (batch invariance), also with
 * TurboQuant KV converting mid-way, and split decode over converted TurboQuant KV stays within
 * 1e-3 of the whole model's; models that cannot be split are refused with the reason; and
 * `cinfer generate --tensor-parallel 2` writes the whole model's greedy text; LoRA adapters on a
 * split model match transformers + peft and stay batch-invariant. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backend/cpu/cpu_backend.h"
#include "base/error.h"
#include "cinfer.h"
#include "fixture_files.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/tensor_parallel.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { DECODE_STEPS = 8, N_SEQ = 3 };

static void fixture_dir(char *out, size_t size, const char *name) {
  snprintf(out, size, "%s/%s", CI_FIXTURE_DIR, name);
}

/* A model split over `world` CPU ranks of one thread each (exact numerics), or NULL. */
static ci_model *load_split(const char *dir, int world, ci_backend **rank0) {
  ci_backend *backends[16];
  for (int r = 0; r < world; r++) {
    backends[r] = ci_cpu_backend_create_with(1, CI_PRECISION_EXACT);
    assert_non_null(backends[r]);
  }
  *rank0 = backends[0];
  return ci_model_load_tp(dir, backends, world, CI_WEIGHTS_MMAP);
}

static int argmax(const float *row, int n) {
  int best = 0;
  for (int i = 1; i < n; i++)
    if (row[i] > row[best]) best = i;
  return best;
}

/* Largest |a - b| over n, and the largest |a| (the scale the difference is judged against). */
static float max_diff(const float *a, const float *b, int n, float *scale) {
  float worst = 0.0f;
  *scale = 0.0f;
  for (int i = 0; i < n; i++) {
    worst = fmaxf(worst, fabsf(a[i] - b[i]));
    *scale = fmaxf(*scale, fabsf(a[i]));
  }
  return worst;
}

static const float tolerance = 1e-3f; /* test_parity's bound for f32 KV */

/* Frees what check_parity and check_converted_kv hold of the whole model and the split one:
 * each model's sequence, cache, logits, model and backend. */
static void free_whole_and_split(ci_model *whole, ci_backend *whole_be, ci_kv_cache *cache_w,
                                 ci_kv_seq *seq_w, float *lw, ci_model *split, ci_backend *split_be,
                                 ci_kv_cache *cache_s, ci_kv_seq *seq_s, float *ls) {
  ci_kv_seq_free(seq_w);
  ci_kv_seq_free(seq_s);
  ci_kv_cache_free(cache_w);
  ci_kv_cache_free(cache_s);
  free(lw);
  free(ls);
  ci_model_free(whole);
  whole_be->ops->destroy(whole_be);
  ci_model_free(split);
  split_be->ops->destroy(split_be);
}

/* Prompt then greedy decode on the whole model and on the two-rank split (see the top). */
static void check_parity(const char *name, int world) {
  char dir[1024];
  fixture_dir(dir, sizeof dir, name);
  ci_backend *whole_be = ci_cpu_backend_create_with(1, CI_PRECISION_EXACT), *split_be;
  assert_non_null(whole_be);
  ci_model *whole = ci_model_load(dir, whole_be);
  if (!whole) fail_msg("%s: %s", name, ci_last_error());
  ci_model *split = load_split(dir, world, &split_be);
  if (!split) fail_msg("%s split: %s", name, ci_last_error());
  assert_int_equal(ci_model_tensor_parallel(split), world);
  int n_ids;
  int32_t *ids = fixture_read_ids(dir, &n_ids);
  assert_non_null(ids);
  const int vocab = whole->spec.vocab;
  ci_kv_cache *cache_w = ci_model_kv_cache_create(whole, CI_KV_F32, 16, 0);
  ci_kv_cache *cache_s = ci_model_kv_cache_create(split, CI_KV_F32, 16, 0);
  assert_non_null(cache_w);
  assert_non_null(cache_s);
  ci_kv_seq *seq_w = ci_kv_seq_create(cache_w), *seq_s = ci_kv_seq_create(cache_s);
  float *lw = malloc((size_t)n_ids * vocab * sizeof *lw);
  float *ls = malloc((size_t)n_ids * vocab * sizeof *ls);
  assert_int_equal(ci_model_forward(whole, seq_w, ids, n_ids, lw, n_ids), CI_OK);
  if (ci_model_forward(split, seq_s, ids, n_ids, ls, n_ids)) fail_msg("%s", ci_last_error());
  char path[1100];
  snprintf(path, sizeof path, "%s/logits.f32", dir);
  size_t bytes;
  float *reference = (float *)fixture_read_file(path, &bytes);
  assert_non_null(reference);
  assert_int_equal(bytes, (size_t)n_ids * vocab * sizeof(float));
  float scale, diff = max_diff(reference, ls, n_ids * vocab, &scale);
  if (!(diff <= tolerance))
    fail_msg("%s: split prompt logits differ from transformers by %g", name, (double)diff);
  for (int r = 0; r < n_ids; r++)
    if (argmax(reference + (size_t)r * vocab, vocab) != argmax(ls + (size_t)r * vocab, vocab))
      fail_msg("%s: row %d: split argmax differs from transformers", name, r);
  const float to_reference = diff;
  free(reference);
  diff = max_diff(lw, ls, n_ids * vocab, &scale);
  int32_t next = argmax(lw + (size_t)(n_ids - 1) * vocab, vocab);
  float worst = diff;
  for (int step = 0; step < DECODE_STEPS; step++) {
    assert_int_equal(ci_model_forward(whole, seq_w, &next, 1, lw, 1), CI_OK);
    assert_int_equal(ci_model_forward(split, seq_s, &next, 1, ls, 1), CI_OK);
    diff = max_diff(lw, ls, vocab, &scale);
    worst = fmaxf(worst, diff);
    if (!(diff <= tolerance))
      fail_msg("%s: decode step %d logits differ by %g (largest %g)", name, step, (double)diff,
               (double)scale);
    const int32_t a = argmax(lw, vocab), b = argmax(ls, vocab);
    if (a != b) fail_msg("%s: decode step %d picks %d whole, %d split", name, step, a, b);
    next = a;
  }
  printf("  %-18s %d ranks: prompt within %.2g of transformers; within %.2g of the whole model "
         "over %d prompt rows and %d decode steps\n",
         name, world, (double)to_reference, (double)worst, n_ids, DECODE_STEPS);
  free(ids);
  free_whole_and_split(whole, whole_be, cache_w, seq_w, lw, split, split_be, cache_s, seq_s, ls);
}

static void test_parity(void **state) {
  (void)state;
  static const char *const fixtures[] = {"llama",        "llama-q8g32", "qwen2",
                                         "qwen3-q8g32",  "mistral",     "gemma2",
                                         "gemma3",       "llama3-tied", "llama3-tied-q8g32",
                                         "llama-linear", "gemma4"};
  for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) check_parity(fixtures[i], 2);
  /* four ranks: one query head each, two ranks to each KV head */
  check_parity("llama", 4);
  check_parity("qwen2", 4);
  check_parity("gemma4", 4);
}

/* Whole and split decode with TurboQuant 4-bit KV converting at position 9 (each rank converts
 * its heads of every block, in an arena with a budget): within test_parity's 1e-3 of the whole
 * model (a rank reading another rank's or unconverted storage would be off by whole logits). */
static void check_converted_kv(const char *name, int world) {
  char dir[1024];
  fixture_dir(dir, sizeof dir, name);
  ci_backend *whole_be = ci_cpu_backend_create_with(1, CI_PRECISION_EXACT), *split_be;
  ci_model *whole = ci_model_load(dir, whole_be);
  ci_model *split = load_split(dir, world, &split_be);
  assert_non_null(whole);
  if (!split) fail_msg("%s: %s", name, ci_last_error());
  const int vocab = whole->spec.vocab;
  ci_kv_cache *cache_w = ci_model_kv_cache_create(whole, CI_KV_F32, 8, 0);
  ci_kv_cache *cache_s = ci_model_kv_cache_create(split, CI_KV_F32, 8, 1 << 20);
  assert_non_null(cache_w);
  assert_non_null(cache_s);
  ci_kv_seq *seq_w = ci_kv_seq_create(cache_w), *seq_s = ci_kv_seq_create(cache_s);
  ci_kv_format turbo;
  assert_int_equal(ci_kv_format_parse("turbo", 4, 0, 0, &turbo), CI_OK);
  assert_int_equal(ci_kv_seq_set_plan(seq_w, &turbo, 9), CI_OK);
  assert_int_equal(ci_kv_seq_set_plan(seq_s, &turbo, 9), CI_OK);
  float *lw = malloc((size_t)vocab * sizeof *lw), *ls = malloc((size_t)vocab * sizeof *ls);
  int32_t prompt[9];
  for (int t = 0; t < 9; t++) prompt[t] = (int32_t)((t * 31 + 5) % vocab);
  assert_int_equal(ci_model_forward(whole, seq_w, prompt, 9, lw, 1), CI_OK);
  assert_int_equal(ci_model_forward(split, seq_s, prompt, 9, ls, 1), CI_OK);
  int32_t next = argmax(lw, vocab);
  float worst = 0.0f, scale;
  for (int step = 0; step < 3 * DECODE_STEPS; step++) {
    assert_int_equal(ci_model_forward(whole, seq_w, &next, 1, lw, 1), CI_OK);
    assert_int_equal(ci_model_forward(split, seq_s, &next, 1, ls, 1), CI_OK);
    worst = fmaxf(worst, max_diff(lw, ls, vocab, &scale));
    next = argmax(lw, vocab);
  }
  printf("  %-18s %d ranks, TurboQuant 4-bit KV from position 9: logits within %.2g of the whole "
         "model's over %d decode steps\n",
         name, world, (double)worst, 3 * DECODE_STEPS);
  if (!(worst <= tolerance)) fail_msg("%s: converted KV differs by %g", name, (double)worst);
  free_whole_and_split(whole, whole_be, cache_w, seq_w, lw, split, split_be, cache_s, seq_s, ls);
}

static void test_converted_kv(void **state) {
  (void)state;
  check_converted_kv("llama", 2);
  check_converted_kv("gemma4", 4);
}

/* Sequence i's KV plan: bf16; TurboQuant 4/4 from the start; TurboQuant 3/3 from position 9. */
static void apply_plan(ci_kv_seq *seq, int i) {
  if (i == 0) return;
  ci_kv_format target;
  assert_int_equal(ci_kv_format_parse("turbo", i == 1 ? 4 : 3, 0, 0, &target), CI_OK);
  assert_int_equal(ci_kv_seq_set_plan(seq, &target, i == 1 ? 0 : 9), CI_OK);
}

/* Three sequences of different prompts and KV plans on the split model: decoding them as one
 * batch gives each exactly the logits of decoding it alone. */
static void check_batch_invariance(const char *name) {
  char dir[1024];
  fixture_dir(dir, sizeof dir, name);
  ci_backend *be;
  ci_model *split = load_split(dir, 2, &be);
  if (!split) fail_msg("%s split: %s", name, ci_last_error());
  const int vocab = split->spec.vocab;
  ci_kv_cache *cache = ci_model_kv_cache_create(split, CI_KV_BF16, 8, 0);
  assert_non_null(cache);
  ci_kv_seq *solo[N_SEQ], *batch[N_SEQ];
  int32_t next[N_SEQ];
  float *solo_logits = malloc((size_t)N_SEQ * vocab * sizeof *solo_logits);
  float *batch_logits = malloc((size_t)N_SEQ * vocab * sizeof *batch_logits);
  for (int i = 0; i < N_SEQ; i++) {
    solo[i] = ci_kv_seq_create(cache);
    batch[i] = ci_kv_seq_create(cache);
    apply_plan(solo[i], i);
    apply_plan(batch[i], i);
    int32_t prompt[12];
    const int n = 4 + 3 * i;
    for (int t = 0; t < n; t++) prompt[t] = (int32_t)((t * 29 + i * 7 + 3) % vocab);
    assert_int_equal(ci_model_forward(split, solo[i], prompt, n, solo_logits, 1), CI_OK);
    assert_int_equal(ci_model_forward(split, batch[i], prompt, n, batch_logits, 1), CI_OK);
    next[i] = argmax(solo_logits, vocab);
  }
  for (int step = 0; step < DECODE_STEPS; step++) {
    for (int i = 0; i < N_SEQ; i++)
      assert_int_equal(ci_model_forward(split, solo[i], &next[i], 1, solo_logits + i * vocab, 1),
                       CI_OK);
    if (ci_model_forward_decode_batch(split, batch, next, N_SEQ, batch_logits))
      fail_msg("%s", ci_last_error());
    for (int i = 0; i < N_SEQ; i++) {
      if (memcmp(solo_logits + i * vocab, batch_logits + i * vocab, (size_t)vocab * sizeof(float)))
        fail_msg("%s: step %d sequence %d: batched logits differ from solo", name, step, i);
      next[i] = argmax(solo_logits + i * vocab, vocab);
    }
  }
  for (int i = 0; i < N_SEQ; i++) {
    ci_kv_seq_free(solo[i]);
    ci_kv_seq_free(batch[i]);
  }
  ci_kv_cache_free(cache);
  free(solo_logits);
  free(batch_logits);
  ci_model_free(split);
  be->ops->destroy(be);
}

static void test_batch_invariance(void **state) {
  (void)state;
  check_batch_invariance("llama");
  check_batch_invariance("gemma3");
  check_batch_invariance("qwen2-q8g32");
}

/* A split that cannot be made is an error naming the reason. */
static void expect_refused(const char *name, int world, const char *reason) {
  char dir[1024];
  fixture_dir(dir, sizeof dir, name);
  ci_backend *be;
  ci_model *m = load_split(dir, world, &be);
  if (m) fail_msg("%s over %d ranks: loaded", name, world);
  if (!strstr(ci_last_error(), reason))
    fail_msg("%s over %d ranks: error '%s' does not say '%s'", name, world, ci_last_error(),
             reason);
  be->ops->destroy(be);
}

static void test_refusals(void **state) {
  (void)state;
  expect_refused("llama", 3, "do not split evenly over 3 ranks");
  expect_refused("llama-q4g64", 2, "quantization groups of 64");
  expect_refused("gemma4-moe", 2, "experts");
  expect_refused("gemma4-ple", 2, "per-layer inputs");
  expect_refused("qwen35", 2, "DeltaNet");
  expect_refused("llama", 9, "1 to 8");
}

/* A PEFT adapter (every linear layer adapted) on a split model: the prompt logits of
 * transformers + peft within 1e-3 (each rank adds its share of the update: B's rows of q, k, v,
 * gate, up; A's columns of o and down before the sum), and decode batched with a sequence
 * without the adapter bit-identical to solo. */
static void check_lora(const char *adapter, const char *base, int world) {
  char adir[1024], bdir[1024], path[1200];
  fixture_dir(adir, sizeof adir, adapter);
  fixture_dir(bdir, sizeof bdir, base);
  ci_backend *be;
  ci_model *split = load_split(bdir, world, &be);
  if (!split) fail_msg("%s: %s", base, ci_last_error());
  ci_lora *lora = ci_lora_load(adir, split);
  if (!lora) fail_msg("%s on %s over %d ranks: %s", adapter, base, world, ci_last_error());
  int n;
  int32_t *ids = fixture_read_ids(adir, &n);
  assert_non_null(ids);
  snprintf(path, sizeof path, "%s/logits_%s.f32", adir, base);
  size_t size;
  float *want = (float *)fixture_read_file(path, &size);
  assert_non_null(want);
  const int vocab = split->spec.vocab;
  assert_int_equal(size, (size_t)n * vocab * sizeof(float));
  ci_kv_cache *cache = ci_model_kv_cache_create(split, CI_KV_F32, 16, 0);
  assert_non_null(cache);
  ci_kv_seq *seq = ci_kv_seq_create(cache), *plain = ci_kv_seq_create(cache);
  ci_kv_seq *solo = ci_kv_seq_create(cache), *solo_plain = ci_kv_seq_create(cache);
  float *got = malloc((size_t)n * vocab * sizeof *got);
  if (ci_model_forward_lora(split, seq, lora, ids, n, got, n)) fail_msg("%s", ci_last_error());
  float scale;
  const float diff = max_diff(want, got, n * vocab, &scale);
  printf("  %s on %s, %d ranks: max |dlogit| vs transformers+peft %.2e\n", adapter, base, world,
         (double)diff);
  if (!(diff <= tolerance))
    fail_msg("%s on %s: %g from transformers+peft", adapter, base, (double)diff);
  /* batched: the adapted sequence beside one without, against each alone */
  assert_int_equal(ci_model_forward_lora(split, solo, lora, ids, n, NULL, 0), CI_OK);
  assert_int_equal(ci_model_forward(split, plain, ids, n, NULL, 0), CI_OK);
  assert_int_equal(ci_model_forward(split, solo_plain, ids, n, NULL, 0), CI_OK);
  float *rows = malloc((size_t)2 * vocab * sizeof *rows);
  float *alone = malloc((size_t)2 * vocab * sizeof *alone);
  int32_t next[2] = {3, 5};
  ci_workspace *ws = ci_workspace_create(split->be);
  assert_non_null(ws);
  for (int step = 0; step < 4; step++) {
    const ci_step_seq both[2] = {
        {.seq = seq, .ids = &next[0], .n_rows = 1, .n_logit_rows = 1, .lora = lora},
        {.seq = plain, .ids = &next[1], .n_rows = 1, .n_logit_rows = 1}};
    if (ci_model_step(split, ws, both, 2, rows)) fail_msg("%s", ci_last_error());
    assert_int_equal(ci_model_forward_lora(split, solo, lora, &next[0], 1, alone, 1), CI_OK);
    assert_int_equal(ci_model_forward(split, solo_plain, &next[1], 1, alone + vocab, 1), CI_OK);
    if (memcmp(rows, alone, (size_t)2 * vocab * sizeof(float)))
      fail_msg("%s: step %d: batched rows differ from solo", adapter, step);
    next[0] = argmax(rows, vocab);
    next[1] = argmax(rows + vocab, vocab);
  }
  ci_workspace_free(ws);
  ci_kv_seq_free(seq);
  ci_kv_seq_free(plain);
  ci_kv_seq_free(solo);
  ci_kv_seq_free(solo_plain);
  ci_kv_cache_free(cache);
  free(rows);
  free(alone);
  free(got);
  free(want);
  free(ids);
  ci_lora_release(lora);
  ci_model_free(split);
  be->ops->destroy(be);
}

static void test_lora(void **state) {
  (void)state;
  check_lora("lora-llama", "llama", 2);
  check_lora("lora-llama", "llama", 4);
  check_lora("lora-llama", "llama-q8g32", 2);
  check_lora("lora-qwen3", "qwen3", 2);
}

/* stdout of a shell command (at most size - 1 bytes). */
static void command_output(const char *command, char *out, size_t size) {
  FILE *pipe = popen(command, "r");
  assert_non_null(pipe);
  const size_t n = fread(out, 1, size - 1, pipe);
  out[n] = '\0';
  assert_int_equal(pclose(pipe), 0);
}

static void test_cli(void **state) {
  (void)state;
  char command[2048], whole[4096], split[4096];
  const char *base = CI_CINFER_BIN " generate --model " CI_STARTER_DIR
                                   " --prompt 'def main():' -n 24 --temp 0 --device cpu -t 2";
  snprintf(command, sizeof command, "%s 2>/dev/null", base);
  command_output(command, whole, sizeof whole);
  snprintf(command, sizeof command, "%s --tensor-parallel 2 2>/dev/null", base);
  command_output(command, split, sizeof split);
  assert_true(strlen(whole) > 0);
  assert_string_equal(whole, split);
}

/* The public API loads a split model and says so (what `/stats` reports); a bad rank count is
 * refused. */
static void test_api(void **state) {
  (void)state;
  cinfer_model_options options;
  cinfer_model_options_init(&options);
  options.device = "cpu";
  options.n_threads = 2;
  options.tensor_parallel = 2;
  cinfer_model *model = NULL;
  char dir[1024];
  fixture_dir(dir, sizeof dir, "qwen2");
  if (cinfer_model_load(dir, &options, &model) != CINFER_OK) fail_msg("%s", cinfer_last_error());
  assert_int_equal(cinfer_model_tensor_parallel(model), 2);
  assert_string_equal(cinfer_model_device(model), "cpu");
  cinfer_model_free(model);
  options.tensor_parallel = 9;
  assert_int_equal(cinfer_model_load(dir, &options, &model), CINFER_INVALID_ARGUMENT);
  assert_null(model);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parity),       cmocka_unit_test(test_batch_invariance),
      cmocka_unit_test(test_converted_kv), cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_cli),          cmocka_unit_test(test_api),
      cmocka_unit_test(test_lora),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
