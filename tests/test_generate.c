/* Tests of the single-sequence generation loop (docs/generation.md §2-3, §11 invariant 6) on the
 * qwen3 fixture: greedy output equals the argmax continuation computed step by step through the
 * model API, prefill chunking does not change it, termination (EOS, callback, length) and its
 * reasons, validation errors; and the `cinfer generate` verb: --temp 0 equals that
 * continuation, the same --seed repeats, generation_config.json supplies defaults and EOS ids. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "backend/cpu/cpu_backend.h"
#include "base/error.h"
#include "engine/generate.h"
#include "sample/greedy.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define FIXTURE CI_FIXTURE_DIR "/qwen3"

static const int32_t prompt[] = {93, 457, 250, 340, 238, 348, 239, 249, 504, 200, 424, 83, 394};
enum { N_PROMPT = sizeof prompt / sizeof prompt[0], MAX_GEN = 24 };

typedef struct {
  ci_backend *be;
  ci_model *model;
  int32_t reference[MAX_GEN]; /* greedy continuation, EOS ignored */
} fixture;

/* Greedy continuation through the model API directly: one prefill, then one token at a time,
 * argmax of the raw logits (what the loop must reproduce at temperature 0). */
static void reference_greedy(ci_model *model, int32_t *out, int n) {
  ci_kv_cache *cache = ci_model_kv_cache_create(model, CI_KV_BF16, 16, 0);
  ci_kv_seq *seq = ci_kv_seq_create(cache);
  float *logits = malloc((size_t)model->spec.vocab * sizeof *logits);
  assert_int_equal(ci_model_forward(model, seq, prompt, N_PROMPT, logits, 1), CI_OK);
  for (int i = 0; i < n; i++) {
    out[i] = ci_argmax(logits, model->spec.vocab);
    if (i + 1 < n) assert_int_equal(ci_model_forward(model, seq, &out[i], 1, logits, 1), CI_OK);
  }
  free(logits);
  ci_kv_seq_free(seq);
  ci_kv_cache_free(cache);
}

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  f->be = ci_cpu_backend_create(1);
  f->model = f->be ? ci_model_load(FIXTURE, f->be) : NULL;
  if (!f->model) {
    fprintf(stderr, "cannot load %s: %s\n", FIXTURE, ci_last_error());
    return -1;
  }
  reference_greedy(f->model, f->reference, MAX_GEN);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  ci_model_free(f->model);
  f->be->ops->destroy(f->be);
  free(f);
  return 0;
}

static ci_sampler *greedy_sampler(int vocab) {
  ci_sampler_params p;
  ci_sampler_params_default(&p);
  p.temperature = 0.0f;
  p.has_seed = 1;
  ci_sampler *s = ci_sampler_create(&p, vocab);
  assert_non_null(s);
  return s;
}

/* Records every token the callback sees; stops (verdict) after `stop_after` of them. */
typedef struct {
  int32_t seen[MAX_GEN];
  int n;
  int stop_after;
  int verdict;
} recorder;

static int record(void *ctx, int32_t id) {
  recorder *r = ctx;
  r->seen[r->n++] = id;
  return r->n == r->stop_after ? r->verdict : 0;
}

/* ==== Library loop ==== */

static void test_greedy_matches_model_api(void **state) {
  fixture *f = *state;
  const int chunks[] = {2048, 1, 7, 5};
  for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
    ci_sampler *s = greedy_sampler(f->model->spec.vocab);
    recorder rec = {.stop_after = -1};
    ci_generate_options o;
    ci_generate_options_default(&o);
    o.max_tokens = MAX_GEN;
    o.prefill_chunk = chunks[c];
    o.on_token = record;
    o.ctx = &rec;
    ci_generate_result r;
    assert_int_equal(ci_generate(f->model, s, prompt, N_PROMPT, &o, &r), CI_OK);
    assert_int_equal(r.n_ids, MAX_GEN);
    assert_int_equal(r.finish, CI_FINISH_LENGTH);
    if (memcmp(r.ids, f->reference, sizeof f->reference) != 0)
      fail_msg("prefill chunk %d changed the greedy tokens", chunks[c]);
    assert_memory_equal(rec.seen, f->reference, sizeof f->reference);
    assert_int_equal(r.stats.prompt_tokens, N_PROMPT);
    assert_int_equal(r.stats.generated_tokens, MAX_GEN);
    assert_true(r.stats.ttft_seconds > 0 && r.stats.prefill_tok_s > 0);
    assert_true(r.stats.decode_tok_s > 0 && r.stats.peak_rss_bytes > 0);
    assert_true(ci_sampler_index(s) == MAX_GEN);
    ci_generate_result_free(&r);
    ci_sampler_free(s);
  }
}

static void test_termination(void **state) {
  fixture *f = *state;
  const int vocab = f->model->spec.vocab;
  ci_generate_options o;
  ci_generate_result r;
  /* EOS: the 4th greedy token is made an EOS id: 4 tokens counted, 3 reach the callback */
  ci_eos_set eos = {0};
  ci_eos_set_add(&eos, f->reference[3]);
  int first = 0;
  while (f->reference[first] != f->reference[3]) first++; /* it may occur earlier */
  ci_sampler *s = greedy_sampler(vocab);
  recorder rec = {.stop_after = -1};
  ci_generate_options_default(&o);
  o.max_tokens = MAX_GEN;
  o.eos = &eos;
  o.on_token = record;
  o.ctx = &rec;
  assert_int_equal(ci_generate(f->model, s, prompt, N_PROMPT, &o, &r), CI_OK);
  assert_int_equal(r.finish, CI_FINISH_STOP);
  assert_int_equal(r.n_ids, first + 1);
  assert_int_equal(r.ids[first], f->reference[3]);
  assert_int_equal(rec.n, first);
  assert_string_equal(ci_finish_reason_name(r.finish), "stop");
  ci_generate_result_free(&r);
  ci_sampler_free(s);
  /* the callback stops (a stop string) or aborts */
  const int verdicts[2] = {1, -1};
  const ci_finish_reason reasons[2] = {CI_FINISH_STOP, CI_FINISH_ABORT};
  for (int v = 0; v < 2; v++) {
    s = greedy_sampler(vocab);
    recorder stop = {.stop_after = 5, .verdict = verdicts[v]};
    ci_generate_options_default(&o);
    o.max_tokens = MAX_GEN;
    o.on_token = record;
    o.ctx = &stop;
    assert_int_equal(ci_generate(f->model, s, prompt, N_PROMPT, &o, &r), CI_OK);
    assert_int_equal(r.finish, reasons[v]);
    assert_int_equal(r.n_ids, 5);
    ci_generate_result_free(&r);
    ci_sampler_free(s);
  }
  /* length: EOS beats length on the same token */
  s = greedy_sampler(vocab);
  ci_generate_options_default(&o);
  o.max_tokens = first + 1;
  o.eos = &eos;
  assert_int_equal(ci_generate(f->model, s, prompt, N_PROMPT, &o, &r), CI_OK);
  assert_int_equal(r.finish, CI_FINISH_STOP);
  ci_generate_result_free(&r);
  ci_sampler_free(s);
  s = greedy_sampler(vocab);
  o.max_tokens = 1;
  o.eos = NULL;
  assert_int_equal(ci_generate(f->model, s, prompt, N_PROMPT, &o, &r), CI_OK);
  assert_int_equal(r.finish, CI_FINISH_LENGTH);
  assert_int_equal(r.n_ids, 1);
  assert_true(r.stats.decode_tok_s == 0.0);
  ci_generate_result_free(&r);
  ci_sampler_free(s);
}

static void test_validation(void **state) {
  fixture *f = *state;
  ci_sampler *s = greedy_sampler(f->model->spec.vocab);
  ci_generate_options o;
  ci_generate_result r;
  ci_generate_options_default(&o);
  assert_int_equal(ci_generate(f->model, s, prompt, 0, &o, &r), CI_ERR);
  assert_non_null(strstr(ci_last_error(), "empty"));
  ci_generate_result_free(&r);
  const int32_t bad[] = {1, 100000};
  assert_int_equal(ci_generate(f->model, s, bad, 2, &o, &r), CI_ERR);
  assert_non_null(strstr(ci_last_error(), "out of range"));
  ci_generate_result_free(&r);
  o.ctx_size = N_PROMPT + 3;
  o.max_tokens = 4;
  assert_int_equal(ci_generate(f->model, s, prompt, N_PROMPT, &o, &r), CI_ERR);
  assert_non_null(strstr(ci_last_error(), "exceeds the context size"));
  ci_generate_result_free(&r);
  o.max_tokens = 3; /* P + max_tokens == ctx is allowed */
  assert_int_equal(ci_generate(f->model, s, prompt, N_PROMPT, &o, &r), CI_OK);
  assert_int_equal(r.n_ids, 3);
  ci_generate_result_free(&r);
  ci_sampler_free(s);
}

/* ==== The CLI verb ==== */

/* Runs `cinfer generate` with extra arguments; returns the exit status, stdout in out. */
static int run_generate(const char *model, const char *args, char *out, size_t cap) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "'%s' generate --model '%s' %s 2>/dev/null", CI_CINFER_BIN, model,
           args);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = '\0';
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The ids of a --json run. */
static int json_ids(const char *model, const char *args, int32_t *ids, int cap, char *finish,
                    size_t finish_cap) {
  char out[8192], full[1024];
  snprintf(full, sizeof full, "%s --json", args);
  assert_int_equal(run_generate(model, full, out, sizeof out), 0);
  json_error_t err;
  json_t *root = json_loads(out, 0, &err);
  if (!root) fail_msg("generate --json printed no JSON: %s", out);
  json_t *arr = json_object_get(root, "ids");
  assert_true(json_is_array(arr));
  int n = (int)json_array_size(arr);
  assert_true(n <= cap);
  for (int i = 0; i < n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(arr, (size_t)i));
  const char *reason = json_string_value(json_object_get(root, "finish_reason"));
  snprintf(finish, finish_cap, "%s", reason ? reason : "");
  json_t *stats = json_object_get(root, "stats");
  assert_true(json_is_object(stats));
  assert_int_equal(json_integer_value(json_object_get(stats, "prompt_tokens")), N_PROMPT);
  assert_int_equal(json_integer_value(json_object_get(stats, "gen_tokens")), n);
  json_decref(root);
  return n;
}

static const char prompt_csv[] = "93,457,250,340,238,348,239,249,504,200,424,83,394";

static void test_cli_greedy(void **state) {
  fixture *f = *state;
  int32_t ids[64];
  char finish[32], args[512];
  snprintf(args, sizeof args, "--ids %s --temp 0 --ignore-eos -n %d", prompt_csv, MAX_GEN);
  int n = json_ids(FIXTURE, args, ids, 64, finish, sizeof finish);
  assert_int_equal(n, MAX_GEN);
  assert_memory_equal(ids, f->reference, sizeof f->reference);
  assert_string_equal(finish, "length");
  /* with EOS on: the continuation up to and including the first EOS id (2) */
  snprintf(args, sizeof args, "--ids %s --temp 0 -n %d", prompt_csv, MAX_GEN);
  n = json_ids(FIXTURE, args, ids, 64, finish, sizeof finish);
  int expect = MAX_GEN;
  for (int i = 0; i < MAX_GEN; i++)
    if (f->reference[i] == 2) {
      expect = i + 1;
      break;
    }
  assert_int_equal(n, expect);
  assert_memory_equal(ids, f->reference, (size_t)n * sizeof *ids);
  /* plain output: the ids, comma-separated, EOS not printed */
  char out[4096];
  snprintf(args, sizeof args, "--ids %s --temp 0 --ignore-eos -n 5", prompt_csv);
  assert_int_equal(run_generate(FIXTURE, args, out, sizeof out), 0);
  char expect_text[256];
  snprintf(expect_text, sizeof expect_text, "%d,%d,%d,%d,%d\n", f->reference[0], f->reference[1],
           f->reference[2], f->reference[3], f->reference[4]);
  assert_string_equal(out, expect_text);
  /* --device cpu (and a GPU ordinal, unused on the CPU) runs the same */
  snprintf(args, sizeof args, "--ids %s --temp 0 --ignore-eos -n 5 --device cpu --gpu 0",
           prompt_csv);
  assert_int_equal(run_generate(FIXTURE, args, out, sizeof out), 0);
  assert_string_equal(out, expect_text);
}

static void test_cli_seed(void **state) {
  (void)state;
  int32_t a[64], b[64], c[64];
  char finish[32], args[512];
  snprintf(args, sizeof args, "--ids %s --temp 0.8 --seed 1234 --ignore-eos -n 20", prompt_csv);
  int na = json_ids(FIXTURE, args, a, 64, finish, sizeof finish);
  int nb = json_ids(FIXTURE, args, b, 64, finish, sizeof finish);
  assert_int_equal(na, 20);
  assert_int_equal(nb, 20);
  assert_memory_equal(a, b, sizeof(int32_t) * 20);
  snprintf(args, sizeof args, "--ids %s --temp 0.8 --seed 1235 --ignore-eos -n 20", prompt_csv);
  assert_int_equal(json_ids(FIXTURE, args, c, 64, finish, sizeof finish), 20);
  assert_true(memcmp(a, c, sizeof(int32_t) * 20) != 0);
  /* every sampling flag is accepted */
  snprintf(args, sizeof args,
           "--ids %s --temperature 0.9 --top-p 0.9 --top-k 50 --min-p 0.01 --repeat-penalty 1.1 "
           "--presence-penalty 0.2 --frequency-penalty 0.1 --seed -5 --prefill-chunk 4 -n 8",
           prompt_csv);
  assert_true(json_ids(FIXTURE, args, c, 64, finish, sizeof finish) >= 1);
}

static void test_cli_usage_errors(void **state) {
  (void)state;
  char out[4096];
  static const char *const bad[] = {
      "--chat --ids 1,2",    "--ids 1,2 --top-p 1.5",    "--ids 1,2 --temp -1",
      "--ids 1,2 --top-k x", "--ids 1,2 --seed",         "",
      "--ids 1,,2",          "--ids 1,2 --min-p 2",      "--ids 1,2 --device gpu",
      "--ids 1,2 --gpu -1",  "--ids 1,2 --kv-codec zip",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = run_generate(FIXTURE, bad[i], out, sizeof out);
    if (rc != 2) fail_msg("'%s' exited %d, expected 2", bad[i], rc);
  }
  /* a text prompt on a model folder without tokenizer.json is a runtime error */
  if (run_generate(FIXTURE, "--prompt hello", out, sizeof out) != 1)
    fail_msg("'--prompt hello' without a tokenizer should exit 1");
  /* an explicit max_tokens past the context is a runtime error, a defaulted one is clamped */
  char args[256];
  snprintf(args, sizeof args, "--ids %s -c 16 -n 8 --temp 0", prompt_csv);
  assert_int_equal(run_generate(FIXTURE, args, out, sizeof out), 1);
  int32_t ids[64];
  char finish[32];
  snprintf(args, sizeof args, "--ids %s -c 16 --temp 0 --ignore-eos", prompt_csv);
  assert_int_equal(json_ids(FIXTURE, args, ids, 64, finish, sizeof finish), 16 - N_PROMPT);
}

/* ==== generation_config.json through the verb ==== */

static void copy_file(const char *from, const char *to) {
  FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
  assert_non_null(in);
  assert_non_null(out);
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, in)) > 0) assert_int_equal(fwrite(buf, 1, n, out), n);
  fclose(in);
  assert_int_equal(fclose(out), 0);
}

static void test_cli_generation_config(void **state) {
  fixture *f = *state;
  char dir[] = "/tmp/ci_generate_XXXXXX", path[256];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/config.json", dir);
  copy_file(FIXTURE "/config.json", path);
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  copy_file(FIXTURE "/model.safetensors", path);
  /* do_sample false: greedy without --temp; max_new_tokens caps; an extra EOS id */
  snprintf(path, sizeof path, "%s/generation_config.json", dir);
  FILE *g = fopen(path, "wb");
  assert_non_null(g);
  fprintf(g,
          "{\"do_sample\": false, \"temperature\": 0.9, \"max_new_tokens\": 6, "
          "\"eos_token_id\": [%d]}",
          f->reference[4]);
  fclose(g);
  int first = 0;
  while (f->reference[first] != f->reference[4]) first++;
  int32_t ids[64];
  char finish[32], args[512];
  snprintf(args, sizeof args, "--ids %s", prompt_csv);
  int n = json_ids(dir, args, ids, 64, finish, sizeof finish);
  int expect = first + 1 < 6 ? first + 1 : 6;
  for (int i = 0; i < expect; i++)
    if (f->reference[i] == 2) expect = i + 1; /* config.json's EOS may come first */
  assert_int_equal(n, expect);
  assert_memory_equal(ids, f->reference, (size_t)n * sizeof *ids);
  /* flags win over the file */
  snprintf(args, sizeof args, "--ids %s --ignore-eos -n 9", prompt_csv);
  assert_int_equal(json_ids(dir, args, ids, 64, finish, sizeof finish), 9);
  assert_memory_equal(ids, f->reference, 9 * sizeof *ids);
  /* a malformed file is a clear runtime error */
  g = fopen(path, "wb");
  fputs("{\"top_p\": 7}", g);
  fclose(g);
  char out[4096];
  assert_int_equal(run_generate(dir, args, out, sizeof out), 1);
  unlink(path);
  snprintf(path, sizeof path, "%s/config.json", dir);
  unlink(path);
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  unlink(path);
  rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_greedy_matches_model_api),
      cmocka_unit_test(test_termination),
      cmocka_unit_test(test_validation),
      cmocka_unit_test(test_cli_greedy),
      cmocka_unit_test(test_cli_seed),
      cmocka_unit_test(test_cli_usage_errors),
      cmocka_unit_test(test_cli_generation_config),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
