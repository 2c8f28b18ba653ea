/* Tests of generation_config.json reading (absent file, scalars, lists, do_sample, malformed
 * input), the EOS set and the parameter precedence built on them (docs/generation.md §4.1). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "base/error.h"
#include "engine/params.h"
#include "io/generation_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A temporary model folder holding generation_config.json with `text` (NULL: no file). */
typedef struct {
  char dir[64];
  char path[128];
} temp_folder;

static void folder_make(temp_folder *f, const char *text) {
  strcpy(f->dir, "/tmp/ci_gencfg_XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  snprintf(f->path, sizeof f->path, "%s/generation_config.json", f->dir);
  if (text) {
    FILE *file = fopen(f->path, "wb");
    assert_non_null(file);
    fputs(text, file);
    assert_int_equal(fclose(file), 0);
  }
}

static void folder_remove(temp_folder *f) {
  unlink(f->path);
  rmdir(f->dir);
}

/* Loads `text` as a model folder's generation_config.json. */
static int load_text(const char *text, ci_generation_config *gc) {
  temp_folder f;
  folder_make(&f, text);
  int status = ci_generation_config_load(f.dir, gc);
  folder_remove(&f);
  return status;
}

static void test_absent_file(void **state) {
  (void)state;
  ci_generation_config gc;
  memset(&gc, 0xAB, sizeof gc);
  assert_int_equal(load_text(NULL, &gc), CI_OK);
  assert_int_equal(gc.has_temperature + gc.has_top_p + gc.has_top_k + gc.has_min_p +
                       gc.has_repetition_penalty + gc.has_max_new_tokens + gc.n_eos,
                   0);
}

static void test_scalars(void **state) {
  (void)state;
  ci_generation_config gc;
  assert_int_equal(load_text("{\"temperature\": 0.6, \"top_p\": 0.95, \"top_k\": 20, "
                             "\"min_p\": 0, \"repetition_penalty\": 1.1, \"max_new_tokens\": 64, "
                             "\"do_sample\": true, \"eos_token_id\": 7, \"bos_token_id\": 1, "
                             "\"transformers_version\": \"4.51.0\", \"pad_token_id\": null}",
                             &gc),
                   CI_OK);
  assert_true(gc.has_temperature && gc.temperature == 0.6f);
  assert_true(gc.has_top_p && gc.top_p == 0.95f);
  assert_true(gc.has_top_k && gc.top_k == 20);
  assert_true(gc.has_min_p && gc.min_p == 0.0f);
  assert_true(gc.has_repetition_penalty && gc.repetition_penalty == 1.1f);
  assert_true(gc.has_max_new_tokens && gc.max_new_tokens == 64);
  assert_int_equal(gc.n_eos, 1);
  assert_int_equal(gc.eos_ids[0], 7);
}

static void test_lists_nulls_and_do_sample(void **state) {
  (void)state;
  ci_generation_config gc;
  /* Llama-3 style: a list of EOS ids; do_sample false overrides the temperature */
  assert_int_equal(load_text("{\"eos_token_id\": [128001, 128008, 128009], \"do_sample\": false, "
                             "\"temperature\": 0.6, \"top_p\": null, \"top_k\": 50.0}",
                             &gc),
                   CI_OK);
  assert_int_equal(gc.n_eos, 3);
  assert_int_equal(gc.eos_ids[2], 128009);
  assert_true(gc.has_temperature && gc.temperature == 0.0f);
  assert_false(gc.has_top_p);
  assert_true(gc.has_top_k && gc.top_k == 50);
  assert_int_equal(load_text("{\"eos_token_id\": null, \"do_sample\": null}", &gc), CI_OK);
  assert_int_equal(gc.n_eos, 0);
  assert_false(gc.has_temperature);
  assert_int_equal(load_text("{\"eos_token_id\": []}", &gc), CI_OK);
  assert_int_equal(gc.n_eos, 0);
}

static void test_malformed(void **state) {
  (void)state;
  static const struct {
    const char *text, *message;
  } cases[] = {
      {"{\"temperature\": 0.7,", "not valid JSON"},
      {"", "not valid JSON"},
      {"[1, 2]", "top level must be a JSON object"},
      {"{\"temperature\": \"hot\"}", "\"temperature\" must be a number >= 0"},
      {"{\"temperature\": -1}", "\"temperature\""},
      {"{\"top_p\": 1.5}", "\"top_p\" must be a number in [0, 1]"},
      {"{\"top_k\": 2.5}", "\"top_k\" must be an integer >= 0"},
      {"{\"top_k\": -3}", "\"top_k\""},
      {"{\"min_p\": true}", "\"min_p\""},
      {"{\"repetition_penalty\": 0}", "\"repetition_penalty\" must be a number > 0"},
      {"{\"max_new_tokens\": 0}", "\"max_new_tokens\" must be an integer >= 1"},
      {"{\"do_sample\": 1}", "\"do_sample\" must be true or false"},
      {"{\"eos_token_id\": \"</s>\"}", "\"eos_token_id\" must be an integer or a list"},
      {"{\"eos_token_id\": [1, \"x\"]}", "\"eos_token_id\" entries must be integers >= 0"},
      {"{\"eos_token_id\": [1, -2]}", "\"eos_token_id\" entries"},
      {"{\"eos_token_id\": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}", "at most 16"},
      {"{\"temperature\": 1, \"temperature\": 2}", "not valid JSON"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ci_generation_config gc;
    if (load_text(cases[i].text, &gc) != CI_ERR) fail_msg("accepted %s", cases[i].text);
    if (!strstr(ci_last_error(), cases[i].message))
      fail_msg("for %s: message '%s' lacks '%s'", cases[i].text, ci_last_error(), cases[i].message);
    assert_non_null(strstr(ci_last_error(), "generation_config.json"));
    assert_int_equal(gc.has_temperature + gc.n_eos, 0); /* nothing half-filled */
  }
  /* a missing folder reads as a folder without the file */
  ci_generation_config gc;
  assert_int_equal(ci_generation_config_load("/nonexistent-dir/for-sure", &gc), CI_OK);
}

static void test_eos_set(void **state) {
  (void)state;
  ci_generation_config gc;
  assert_int_equal(load_text("{\"eos_token_id\": [106, 1, 106]}", &gc), CI_OK);
  const int config_ids[] = {1, 50};
  ci_eos_set eos;
  assert_int_equal(ci_eos_set_build(&eos, config_ids, 2, &gc), CI_OK);
  assert_int_equal(eos.n, 3);
  assert_int_equal(eos.ids[0], 1);
  assert_int_equal(eos.ids[1], 50);
  assert_int_equal(eos.ids[2], 106);
  assert_true(ci_eos_set_contains(&eos, 106) && !ci_eos_set_contains(&eos, 2));
  assert_int_equal(ci_eos_set_add(&eos, 2), CI_OK); /* the tokenizer's eos_token */
  assert_int_equal(ci_eos_set_add(&eos, -1), CI_OK);
  assert_int_equal(eos.n, 4);
  assert_int_equal(ci_eos_set_build(&eos, config_ids, 2, NULL), CI_OK);
  assert_int_equal(eos.n, 2);
  for (int i = 0; eos.n < CI_EOS_SET_MAX; i++) ci_eos_set_add(&eos, 1000 + i);
  assert_int_equal(ci_eos_set_add(&eos, 5000), CI_ERR);
}

static void test_precedence(void **state) {
  (void)state;
  ci_sampler_params p;
  int max_tokens, defaulted;
  /* built-in */
  ci_sampling_resolve(NULL, NULL, 0, 256, &p, &max_tokens, &defaulted);
  assert_true(p.temperature == 0.7f && p.top_p == 1.0f && p.top_k == 0 && p.min_p == 0.0f);
  assert_true(p.penalties.repetition == 1.0f && !p.has_seed);
  assert_true(max_tokens == 256 && defaulted);
  /* generation_config over built-in */
  ci_generation_config gc;
  assert_int_equal(load_text("{\"temperature\": 0.6, \"top_k\": 20, \"max_new_tokens\": 99}", &gc),
                   CI_OK);
  ci_sampling_resolve(&gc, NULL, 0, 256, &p, &max_tokens, &defaulted);
  assert_true(p.temperature == 0.6f && p.top_k == 20 && p.top_p == 1.0f);
  assert_true(max_tokens == 99 && defaulted); /* still a default: clamped, not rejected */
  /* CLI over generation_config, request over CLI */
  ci_sampling_overrides cli = {0}, request = {0};
  cli.has_temperature = 1;
  cli.temperature = 0.0f;
  cli.has_top_p = 1;
  cli.top_p = 0.5f;
  cli.has_seed = 1;
  cli.seed = 7;
  request.has_top_p = 1;
  request.top_p = 0.8f;
  request.has_max_tokens = 1;
  request.max_tokens = 12;
  request.has_presence_penalty = 1;
  request.presence_penalty = 0.25f;
  const ci_sampling_overrides *layers[] = {&cli, NULL, &request};
  ci_sampling_resolve(&gc, layers, 3, 256, &p, &max_tokens, &defaulted);
  assert_true(p.temperature == 0.0f && p.top_p == 0.8f && p.top_k == 20);
  assert_true(p.has_seed && p.seed == 7 && p.penalties.presence == 0.25f);
  assert_true(max_tokens == 12 && !defaulted);
  assert_int_equal(ci_sampler_params_validate(&p, 100), CI_OK);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_absent_file),
      cmocka_unit_test(test_scalars),
      cmocka_unit_test(test_lists_nulls_and_do_sample),
      cmocka_unit_test(test_malformed),
      cmocka_unit_test(test_eos_set),
      cmocka_unit_test(test_precedence),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
