/* Model loading rejects bad model folders with a clear message and no crash (run under
 * ASan/UBSan in `make test`): broken config.json, broken or mismatched weights, and bad token ids
 * given to `cinfer logits`. Each case starts from a copy of a good fixture. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "backend/cpu/cpu_backend.h"
#include "base/error.h"
#include "io/safetensors.h"
#include "io/safetensors_write.h"
#include "model/model.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define GOOD_FIXTURE CI_FIXTURE_DIR "/qwen2"

/* ==== Building broken folders ==== */

static void make_temp_dir(char *out, size_t cap) {
  snprintf(out, cap, "/tmp/cinfer-load-XXXXXX");
  assert_non_null(mkdtemp(out));
}

static void remove_dir(const char *dir) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

static void copy_file(const char *src, const char *dst) {
  char cmd[2200];
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", src, dst);
  assert_int_equal(system(cmd), 0);
}

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  fwrite(text, 1, strlen(text), f);
  fclose(f);
}

/* Copies the good fixture's config.json into dir, applying `edit` (may be NULL). */
static void write_config(const char *dir, void (*edit)(json_t *)) {
  json_error_t err;
  json_t *cfg = json_load_file(GOOD_FIXTURE "/config.json", 0, &err);
  assert_non_null(cfg);
  if (edit) edit(cfg);
  char path[512];
  snprintf(path, sizeof path, "%s/config.json", dir);
  assert_int_equal(json_dump_file(cfg, path, JSON_INDENT(1)), 0);
  json_decref(cfg);
}

/* Rewrites the good fixture's weights into dir: `skip` is left out, `reshape` gets a different
 * (consistent) shape by dropping its last row. */
static void write_weights(const char *dir, const char *skip, const char *reshape) {
  ci_weights *w = ci_weights_open(GOOD_FIXTURE);
  assert_non_null(w);
  ci_st_writer *writer = ci_st_writer_new();
  for (int i = 0; i < ci_weights_count(w); i++) {
    const ci_st_tensor *t = ci_weights_at(w, i);
    if (skip && !strcmp(t->name, skip)) continue;
    int64_t shape[CI_ST_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    if (reshape && !strcmp(t->name, reshape)) shape[0] -= 1;
    assert_int_equal(ci_st_writer_add(writer, t->name, t->dtype, t->ndim, shape, t->data), CI_OK);
  }
  char path[512];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  assert_int_equal(ci_st_writer_write(writer, path), CI_OK);
  ci_st_writer_free(writer);
  ci_weights_free(w);
}

/* Loading dir must fail with a message containing `expected`. */
static void expect_load_error(const char *dir, const char *expected) {
  ci_backend *be = ci_cpu_backend_create(1);
  assert_non_null(be);
  ci_clear_error();
  ci_model *m = ci_model_load(dir, be);
  if (m || !strstr(ci_last_error(), expected))
    fprintf(stderr, "expected an error containing '%s', got '%s'\n", expected, ci_last_error());
  assert_null(m);
  assert_non_null(strstr(ci_last_error(), expected));
  be->ops->destroy(be);
}

/* ==== Config cases ==== */

static void set_model_type(json_t *c) {
  json_object_set_new(c, "model_type", json_string("gpt9"));
}
static void zero_heads(json_t *c) {
  json_object_set_new(c, "num_attention_heads", json_integer(0));
}
static void wrong_hidden(json_t *c) {
  json_object_set_new(c, "intermediate_size", json_integer(96));
}
static void string_layers(json_t *c) {
  json_object_set_new(c, "num_hidden_layers", json_string("two"));
}
static void bad_gqa(json_t *c) {
  json_object_set_new(c, "num_key_value_heads", json_integer(3));
}
static void dynamic_rope(json_t *c) {
  json_object_set_new(c, "rope_scaling", json_pack("{s:s, s:f}", "type", "dynamic", "factor", 2.0));
  json_object_del(c, "rope_parameters");
}
static void gptq(json_t *c) {
  json_object_set_new(c, "quantization_config",
                      json_pack("{s:s, s:i}", "quant_method", "gptq", "group_size", 128));
}
static void three_bits(json_t *c) {
  json_object_set_new(c, "quantization", json_pack("{s:i, s:i}", "bits", 3, "group_size", 64));
}

static void test_config_errors(void **state) {
  (void)state;
  static const struct {
    void (*edit)(json_t *);
    const char *expected;
  } cases[] = {
      {set_model_type, "unsupported model_type \"gpt9\" (supported: llama, mistral, qwen2, qwen3, "
                       "gemma2, gemma3_text, gemma3, gemma4_text, gemma4, qwen3_5_text, "
                       "qwen3_5)"},
      {zero_heads, "num_attention_heads"},
      {wrong_hidden, "mlp.gate_proj.weight: shape"},
      {string_layers, "\"num_hidden_layers\" must be an integer"},
      {bad_gqa, "not a multiple of num_key_value_heads"},
      {dynamic_rope, "\"dynamic\" is not supported"},
      {gptq, "quant_method \"gptq\" is not supported"},
      {three_bits, "unsupported bits 3"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char dir[64];
    make_temp_dir(dir, sizeof dir);
    write_config(dir, cases[i].edit);
    char src[512], dst[512];
    snprintf(src, sizeof src, "%s/model.safetensors", GOOD_FIXTURE);
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    copy_file(src, dst);
    expect_load_error(dir, cases[i].expected);
    remove_dir(dir);
  }
}

static void test_config_not_json_or_missing(void **state) {
  (void)state;
  char dir[64], path[512], src[512];
  make_temp_dir(dir, sizeof dir);
  expect_load_error(dir, "config.json: missing");
  snprintf(path, sizeof path, "%s/config.json", dir);
  write_text(path, "{\"model_type\": \"llama\", ");
  expect_load_error(dir, "not valid JSON");
  write_text(path, "[1, 2]");
  expect_load_error(dir, "must be a JSON object");
  write_config(dir, NULL);
  expect_load_error(dir, "no model.safetensors");
  snprintf(src, sizeof src, "%s/model.safetensors", GOOD_FIXTURE);
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  copy_file(src, path);
  ci_backend *be = ci_cpu_backend_create(1);
  ci_model *m = ci_model_load(dir, be); /* the untouched copy loads */
  assert_non_null(m);
  ci_model_free(m);
  be->ops->destroy(be);
  remove_dir(dir);
}

/* ==== Weight cases ==== */

static void test_weight_errors(void **state) {
  (void)state;
  char dir[64], path[512];
  make_temp_dir(dir, sizeof dir);
  write_config(dir, NULL);
  write_weights(dir, "model.layers.1.mlp.up_proj.weight", NULL);
  expect_load_error(dir, "missing tensor model.layers.1.mlp.up_proj.weight");
  write_weights(dir, "model.layers.0.self_attn.k_proj.bias", NULL);
  expect_load_error(dir, "missing tensor model.layers.0.self_attn.k_proj.bias");
  write_weights(dir, NULL, "model.layers.0.self_attn.o_proj.weight");
  expect_load_error(dir, "model.layers.0.self_attn.o_proj.weight: shape");
  write_weights(dir, NULL, "model.norm.weight");
  expect_load_error(dir, "model.norm.weight: shape disagrees");

  /* Byte-level damage to the file itself. */
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  write_text(path, "abc");
  expect_load_error(dir, "truncated");
  FILE *f = fopen(path, "wb");
  uint64_t absurd = 1ull << 50;
  fwrite(&absurd, sizeof absurd, 1, f);
  fputs("{}", f);
  fclose(f);
  expect_load_error(dir, "header");
  f = fopen(path, "wb");
  uint64_t len = 8;
  fwrite(&len, sizeof len, 1, f);
  fputs("not json", f);
  fclose(f);
  expect_load_error(dir, "JSON");
  const char *bad_headers[][2] = {
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", "data section"},
      {"{\"a\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,4]}}", "dtype"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,4]}}", "shape"},
  };
  for (size_t i = 0; i < sizeof bad_headers / sizeof bad_headers[0]; i++) {
    f = fopen(path, "wb");
    len = strlen(bad_headers[i][0]);
    fwrite(&len, sizeof len, 1, f);
    fputs(bad_headers[i][0], f);
    fwrite("\0\0\0\0", 1, 4, f);
    fclose(f);
    expect_load_error(dir, bad_headers[i][1]);
  }
  remove_dir(dir);
}

/* An extra tensor the architecture does not use is rejected by name. */
static void test_unexpected_tensor(void **state) {
  (void)state;
  char dir[64], path[512];
  make_temp_dir(dir, sizeof dir);
  write_config(dir, NULL);
  ci_weights *w = ci_weights_open(GOOD_FIXTURE);
  ci_st_writer *writer = ci_st_writer_new();
  for (int i = 0; i < ci_weights_count(w); i++) {
    const ci_st_tensor *t = ci_weights_at(w, i);
    ci_st_writer_add(writer, t->name, t->dtype, t->ndim, t->shape, t->data);
  }
  static const float extra[2] = {1, 2};
  const int64_t shape[1] = {2};
  ci_st_writer_add(writer, "model.layers.0.mystery.weight", CI_F32, 1, shape, extra);
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  assert_int_equal(ci_st_writer_write(writer, path), CI_OK);
  ci_st_writer_free(writer);
  ci_weights_free(w);
  expect_load_error(dir, "unexpected tensor model.layers.0.mystery.weight");
  remove_dir(dir);
}

static void untie(json_t *c) {
  json_object_set_new(c, "tie_word_embeddings", json_false());
}
static void drop_tie(json_t *c) {
  json_object_del(c, "tie_word_embeddings");
}

/* A config that says (or, for qwen2, defaults to) untied embeddings needs lm_head.weight: the
 * loader must name it rather than silently reuse the embedding as the head. */
static void test_untied_without_head(void **state) {
  (void)state;
  void (*edits[])(json_t *) = {untie, drop_tie};
  for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
    char dir[64];
    make_temp_dir(dir, sizeof dir);
    write_config(dir, edits[i]);
    write_weights(dir, NULL, NULL); /* the tied fixture has no lm_head.weight */
    expect_load_error(dir, "missing tensor lm_head.weight");
    remove_dir(dir);
  }
}

/* ==== Bad token ids through the CLI ==== */

/* Runs `cinfer logits` with `ids`; returns the exit status and the first stderr line. */
static int run_logits(const char *ids, char *first_line, size_t cap) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "'%s' logits --model '%s' --ids '%s' --out /dev/null 2>&1",
           CI_CINFER_BIN, GOOD_FIXTURE, ids);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  first_line[0] = '\0';
  if (!fgets(first_line, (int)cap, p)) first_line[0] = '\0';
  char rest[256];
  while (fgets(rest, sizeof rest, p)) {
  }
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void test_bad_token_ids(void **state) {
  (void)state;
  static const struct {
    const char *ids;
    const char *expected;
  } cases[] = {
      {"1,2,100000", "token id 100000 at index 2 is out of range [0, 448)"},
      {"1,-4,2", "out of range"},
      {"1,two,3", "is not an integer"},
      {"1,,3", "is not an integer"},
      {"", "is not an integer"},
      {"99999999999999999999", "is not an integer"},
  };
  char line[512];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int rc = run_logits(cases[i].ids, line, sizeof line);
    if (rc == 0 || !strstr(line, cases[i].expected))
      fprintf(stderr, "ids '%s': rc %d, message '%s'\n", cases[i].ids, rc, line);
    assert_true(rc != 0);
    assert_non_null(strstr(line, cases[i].expected));
  }
  assert_int_equal(run_logits("1,2,3", line, sizeof line), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config_errors),       cmocka_unit_test(test_config_not_json_or_missing),
      cmocka_unit_test(test_weight_errors),       cmocka_unit_test(test_unexpected_tensor),
      cmocka_unit_test(test_untied_without_head), cmocka_unit_test(test_bad_token_ids),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
