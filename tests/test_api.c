/* The public C API (include/cinfer.h) on the fixtures and the starter model: errors as status +
 * message, model facts, greedy sessions equal to transformers' continuation (greedy.txt),
 * step/finish semantics, logits rows, cancel and reset, the engine's events, and the text layer.
 * Uses nothing but <cinfer.h>. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cinfer.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LLAMA CI_FIXTURE_DIR "/llama"
#define STARTER CI_FIXTURE_DIR "/../../models/starter"

/* Reads a comma-separated id file; returns a malloc'd array. */
static int32_t *read_ids(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  int32_t *ids = malloc(4096 * sizeof *ids);
  *n = 0;
  int v;
  while (*n < 4096 && fscanf(f, "%d", &v) == 1) {
    ids[(*n)++] = v;
    if (fgetc(f) != ',') break;
  }
  fclose(f);
  return ids;
}

static cinfer_model *load(const char *dir) {
  cinfer_model_options options;
  cinfer_model_options_init(&options);
  options.n_threads = 2;
  cinfer_model *model = NULL;
  assert_int_equal(cinfer_model_load(dir, &options, &model), CINFER_OK);
  assert_non_null(model);
  return model;
}

/* Greedy f32-KV parameters that ignore EOS, as the greedy fixtures were made. */
static cinfer_params greedy_params(const cinfer_model *model, int max_tokens) {
  cinfer_params params;
  cinfer_params_init(&params, model);
  params.temperature = 0.0f;
  params.max_tokens = max_tokens;
  params.ignore_eos = 1;
  params.kv_codec = "f32";
  return params;
}

static void test_errors(void **state) {
  (void)state;
  char version[32];
  snprintf(version, sizeof version, "%d.%d.%d", CINFER_VERSION_MAJOR, CINFER_VERSION_MINOR,
           CINFER_VERSION_PATCH);
  assert_string_equal(cinfer_version(), version);
  cinfer_model *model = (cinfer_model *)1;
  assert_int_equal(cinfer_model_load(CI_FIXTURE_DIR "/no-such-model", NULL, &model), CINFER_ERROR);
  assert_null(model);
  assert_non_null(strstr(cinfer_last_error(), "no-such-model"));
  assert_int_equal(cinfer_model_load(NULL, NULL, &model), CINFER_INVALID_ARGUMENT);
  assert_string_equal(cinfer_status_name(CINFER_QUEUE_FULL), "queue full");
  cinfer_model_free(NULL);
  cinfer_session_free(NULL);
  cinfer_engine_free(NULL);
  cinfer_request_free(NULL);
}

static void test_model_facts(void **state) {
  (void)state;
  cinfer_model *model = load(LLAMA);
  assert_int_equal(cinfer_model_vocab_size(model), 256);
  assert_true(cinfer_model_context_length(model) > 0);
  assert_string_equal(cinfer_model_architecture(model), "llama");
  /* no tokenizer.json in the fixture */
  int32_t *ids = NULL;
  size_t n = 0;
  assert_int_equal(cinfer_tokenize(model, "hi", 2, 1, &ids, &n), CINFER_UNSUPPORTED);
  char *text = NULL;
  assert_int_equal(cinfer_chat_render(model, "[]", 1, &text), CINFER_UNSUPPORTED);
  cinfer_model_free(model);
}

static void test_greedy_session(void **state) {
  (void)state;
  cinfer_model *model = load(LLAMA);
  size_t n_prompt, n_want;
  int32_t *prompt = read_ids(LLAMA "/ids.txt", &n_prompt);
  int32_t *want = read_ids(LLAMA "/greedy.txt", &n_want);
  assert_int_equal(n_want, 16);
  cinfer_params params = greedy_params(model, 16);
  cinfer_session *session = NULL;
  assert_int_equal(cinfer_session_create(model, &params, &session), CINFER_OK);
  int32_t token;
  assert_int_equal(cinfer_session_step(session, &token), CINFER_INVALID_ARGUMENT);
  for (int round = 0; round < 2; round++) { /* the second round after a reset */
    assert_null(cinfer_session_logits(session));
    assert_int_equal(cinfer_session_feed(session, prompt, n_prompt, NULL, 0), CINFER_OK);
    assert_non_null(cinfer_session_logits(session));
    for (size_t i = 0; i < n_want; i++) {
      assert_int_equal(cinfer_session_step(session, &token), CINFER_OK);
      assert_int_equal(token, want[i]);
      assert_int_equal(cinfer_session_finish_reason(session),
                       i + 1 == n_want ? CINFER_FINISH_LENGTH : CINFER_FINISH_NONE);
    }
    assert_int_equal(cinfer_session_step(session, &token), CINFER_DONE);
    assert_int_equal(token, -1);
    assert_int_equal(cinfer_session_n_generated(session), n_want);
    size_t n_tokens = 0;
    const int32_t *tokens = cinfer_session_tokens(session, &n_tokens);
    assert_int_equal(n_tokens, n_prompt + n_want);
    assert_memory_equal(tokens, prompt, n_prompt * sizeof *prompt);
    assert_memory_equal(tokens + n_prompt, want, n_want * sizeof *want);
    assert_int_equal(cinfer_session_reset(session), CINFER_OK);
  }
  /* A new turn continues the sequence: the last sampled token is run first. */
  assert_int_equal(cinfer_session_feed(session, prompt, n_prompt, NULL, 0), CINFER_OK);
  assert_int_equal(cinfer_session_step(session, &token), CINFER_OK);
  assert_int_equal(cinfer_session_feed(session, prompt, 3, NULL, 0), CINFER_OK);
  assert_int_equal(cinfer_session_n_generated(session), 0);
  size_t n_tokens = 0;
  cinfer_session_tokens(session, &n_tokens);
  assert_int_equal(n_tokens, n_prompt + 1 + 3);
  cinfer_session_free(session);
  free(prompt);
  free(want);
  cinfer_model_free(model);
}

/* generate() with a callback that stops after 5 tokens; cancel; EOS ends a turn. */
static int stop_after_five(void *user, int32_t token) {
  int *count = user;
  (void)token;
  return ++*count == 5;
}

static void test_generate_cancel_eos(void **state) {
  (void)state;
  cinfer_model *model = load(LLAMA);
  size_t n_prompt, n_want;
  int32_t *prompt = read_ids(LLAMA "/ids.txt", &n_prompt);
  int32_t *want = read_ids(LLAMA "/greedy.txt", &n_want);
  cinfer_params params = greedy_params(model, 16);
  cinfer_session *session = NULL;
  assert_int_equal(cinfer_session_create(model, &params, &session), CINFER_OK);
  assert_int_equal(cinfer_session_feed(session, prompt, n_prompt, NULL, 0), CINFER_OK);
  int count = 0;
  assert_int_equal(cinfer_session_generate(session, stop_after_five, &count), CINFER_OK);
  assert_int_equal(count, 5);
  assert_int_equal(cinfer_session_finish_reason(session), CINFER_FINISH_STOP);
  cinfer_session_cancel(session);
  int32_t token;
  assert_int_equal(cinfer_session_step(session, &token), CINFER_CANCELLED);
  assert_int_equal(cinfer_session_finish_reason(session), CINFER_FINISH_CANCEL);
  cinfer_session_free(session);

  /* With EOS honoured, a sampled EOS ends the turn with CINFER_DONE and is never a token. */
  cinfer_params honour = greedy_params(model, 16);
  honour.ignore_eos = 0;
  assert_int_equal(cinfer_session_create(model, &honour, &session), CINFER_OK);
  assert_int_equal(cinfer_session_feed(session, prompt, n_prompt, NULL, 0), CINFER_OK);
  cinfer_status status;
  size_t steps = 0;
  while ((status = cinfer_session_step(session, &token)) == CINFER_OK) {
    assert_false(cinfer_model_is_eos(model, token));
    steps++;
  }
  assert_int_equal(status, CINFER_DONE);
  if (cinfer_session_finish_reason(session) == CINFER_FINISH_STOP)
    assert_true(cinfer_model_is_eos(model, token));
  else
    assert_int_equal(steps, 16);
  cinfer_session_free(session);
  free(prompt);
  free(want);
  cinfer_model_free(model);
}

/* Logits of every position: one feed, or a small prefill chunk, agree; the last row is what
 * cinfer_session_logits shows; the argmax of the last row is the first greedy token. */
static void test_logit_rows(void **state) {
  (void)state;
  cinfer_model *model = load(LLAMA);
  const int vocab = cinfer_model_vocab_size(model);
  size_t n, n_want;
  int32_t *ids = read_ids(LLAMA "/ids.txt", &n);
  int32_t *want = read_ids(LLAMA "/greedy.txt", &n_want);
  float *all = malloc(n * vocab * sizeof *all), *chunked = malloc(n * vocab * sizeof *chunked);
  cinfer_params params = greedy_params(model, 1);
  cinfer_session *a = NULL, *b = NULL;
  assert_int_equal(cinfer_session_create(model, &params, &a), CINFER_OK);
  params.prefill_chunk = 7;
  assert_int_equal(cinfer_session_create(model, &params, &b), CINFER_OK);
  assert_int_equal(cinfer_session_feed(a, ids, n, all, n), CINFER_OK);
  assert_int_equal(cinfer_session_feed(b, ids, n, chunked, 10), CINFER_OK);
  for (size_t i = 0; i < 10 * (size_t)vocab; i++)
    assert_true(fabsf(chunked[i] - all[(n - 10) * vocab + i]) < 1e-3f);
  assert_memory_equal(cinfer_session_logits(a), all + (n - 1) * vocab, vocab * sizeof(float));
  int best = 0;
  for (int i = 1; i < vocab; i++)
    if (all[(n - 1) * vocab + i] > all[(n - 1) * vocab + best]) best = i;
  assert_int_equal(best, want[0]);
  assert_int_equal(cinfer_session_feed(a, ids, n, all, n + 1), CINFER_INVALID_ARGUMENT);
  const int32_t bad = vocab;
  assert_int_equal(cinfer_session_feed(a, &bad, 1, NULL, 0), CINFER_INVALID_ARGUMENT);
  assert_non_null(strstr(cinfer_last_error(), "out of range"));
  cinfer_session_free(a);
  cinfer_session_free(b);
  free(all);
  free(chunked);
  free(ids);
  free(want);
  cinfer_model_free(model);
}

static void test_context_and_kv_plan(void **state) {
  (void)state;
  cinfer_model *model = load(LLAMA);
  size_t n;
  int32_t *ids = read_ids(LLAMA "/ids.txt", &n);
  cinfer_params params = greedy_params(model, 100);
  params.context_size = (int)n + 2;
  cinfer_session *session = NULL;
  assert_int_equal(cinfer_session_create(model, &params, &session), CINFER_OK);
  assert_int_equal(cinfer_session_feed(session, ids, n, NULL, 0), CINFER_OK);
  int32_t token;
  assert_int_equal(cinfer_session_step(session, &token), CINFER_OK);
  assert_int_equal(cinfer_session_step(session, &token), CINFER_OK);
  assert_int_equal(cinfer_session_step(session, &token), CINFER_DONE);
  assert_int_equal(cinfer_session_finish_reason(session), CINFER_FINISH_LENGTH);
  assert_int_equal(cinfer_session_feed(session, ids, 1, NULL, 0), CINFER_ERROR);
  cinfer_session_free(session);

  params = greedy_params(model, 4);
  params.kv_codec = "turbo";
  params.kv_start = 8;
  assert_int_equal(cinfer_session_create(model, &params, &session), CINFER_OK);
  assert_int_equal(cinfer_session_feed(session, ids, n, NULL, 0), CINFER_OK);
  assert_int_equal(cinfer_session_generate(session, NULL, NULL), CINFER_OK);
  assert_int_equal(cinfer_session_n_generated(session), 4);
  cinfer_session_free(session);
  params.kv_codec = "zip";
  assert_int_equal(cinfer_session_create(model, &params, &session), CINFER_INVALID_ARGUMENT);
  assert_null(session);
  params = greedy_params(model, 0);
  assert_int_equal(cinfer_session_create(model, &params, &session), CINFER_INVALID_ARGUMENT);
  free(ids);
  cinfer_model_free(model);
}

/* The engine gives the same greedy tokens (f32 KV) to several concurrent requests. */
static void test_engine(void **state) {
  (void)state;
  cinfer_model *model = load(LLAMA);
  size_t n_prompt, n_want;
  int32_t *prompt = read_ids(LLAMA "/ids.txt", &n_prompt);
  int32_t *want = read_ids(LLAMA "/greedy.txt", &n_want);
  cinfer_engine_options options;
  cinfer_engine_options_init(&options);
  options.kv_codec = "f32";
  cinfer_engine *engine = NULL;
  assert_int_equal(cinfer_engine_create(model, &options, &engine), CINFER_OK);
  cinfer_params params = greedy_params(model, 16);
  params.kv_codec = NULL;
  enum { N = 3 };
  cinfer_request *requests[N];
  for (int r = 0; r < N; r++)
    assert_int_equal(cinfer_engine_submit(engine, prompt, n_prompt, &params, &requests[r]),
                     CINFER_OK);
  for (int r = 0; r < N; r++) {
    cinfer_event event;
    size_t got = 0;
    for (;;) {
      assert_int_equal(cinfer_request_next(requests[r], &event, 60.0), CINFER_OK);
      if (event.kind != CINFER_EVENT_TOKEN) break;
      assert_true(got < n_want);
      assert_int_equal(event.token, want[got++]);
      assert_true(event.logprob <= 0.0f);
    }
    assert_int_equal(event.kind, CINFER_EVENT_DONE);
    assert_int_equal(event.finish, CINFER_FINISH_LENGTH);
    assert_int_equal(event.generated_tokens, 16);
    assert_int_equal(event.prompt_tokens, (int)n_prompt);
    assert_int_equal(got, n_want);
    assert_int_equal(cinfer_request_next(requests[r], &event, 0.0), CINFER_DONE);
    cinfer_request_free(requests[r]);
  }
  /* cancel: the request ends with finish CANCEL (or had already finished) */
  cinfer_request *request = NULL;
  params.max_tokens = 1000;
  assert_int_equal(cinfer_engine_submit(engine, prompt, n_prompt, &params, &request), CINFER_OK);
  cinfer_request_cancel(request);
  cinfer_event event;
  do assert_int_equal(cinfer_request_next(request, &event, 60.0), CINFER_OK);
  while (event.kind == CINFER_EVENT_TOKEN);
  assert_int_equal(event.kind, CINFER_EVENT_DONE);
  assert_int_equal(event.finish, CINFER_FINISH_CANCEL);
  cinfer_request_free(request);
  /* an explicit max_tokens too long for the context: rejected with a reason */
  params.max_tokens = cinfer_model_context_length(model) + 1;
  params.max_tokens_explicit = 1;
  assert_int_equal(cinfer_engine_submit(engine, prompt, n_prompt, &params, &request),
                   CINFER_REJECTED);
  assert_null(request);
  assert_true(strlen(cinfer_last_error()) > 0);
  /* a defaulted one is cut to the room the context leaves */
  params.max_tokens_explicit = 0;
  params.max_tokens = cinfer_model_context_length(model) + 1;
  assert_int_equal(cinfer_engine_submit(engine, prompt, n_prompt, &params, &request), CINFER_OK);
  cinfer_request_cancel(request);
  do assert_int_equal(cinfer_request_next(request, &event, 60.0), CINFER_OK);
  while (event.kind == CINFER_EVENT_TOKEN);
  assert_int_equal(event.kind, CINFER_EVENT_DONE);
  cinfer_request_free(request);
  cinfer_engine_free(engine);
  free(prompt);
  free(want);
  cinfer_model_free(model);
}

/* Text on the starter model: tokenize/detokenize round trip, chat rendering, feed_text. */
static void test_text(void **state) {
  (void)state;
  cinfer_model *model = load(STARTER);
  const char *text = "def fib(n):";
  int32_t *ids = NULL;
  size_t n = 0;
  assert_int_equal(cinfer_tokenize(model, text, strlen(text), 0, &ids, &n), CINFER_OK);
  assert_true(n > 0);
  char *back = NULL;
  size_t len = 0;
  assert_int_equal(cinfer_detokenize(model, ids, n, 0, &back, &len), CINFER_OK);
  assert_string_equal(back, text);
  assert_int_equal(len, strlen(text));
  cinfer_free(back);
  cinfer_free(ids);
  char *prompt = NULL;
  assert_int_equal(
      cinfer_chat_render(model, "[{\"role\": \"user\", \"content\": \"Hi\"}]", 1, &prompt),
      CINFER_OK);
  assert_non_null(strstr(prompt, "Hi"));
  assert_int_equal(cinfer_chat_render(model, "{}", 1, &back), CINFER_INVALID_ARGUMENT);
  cinfer_params params;
  cinfer_params_init(&params, model);
  params.temperature = 0.0f;
  params.max_tokens = 8;
  cinfer_session *session = NULL;
  assert_int_equal(cinfer_session_create(model, &params, &session), CINFER_OK);
  assert_int_equal(cinfer_session_feed_text(session, prompt, 0), CINFER_OK);
  assert_int_equal(cinfer_session_generate(session, NULL, NULL), CINFER_OK);
  assert_true(cinfer_session_n_generated(session) >= 1);
  cinfer_session_free(session);
  cinfer_free(prompt);
  cinfer_model_free(model);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_errors),         cmocka_unit_test(test_model_facts),
      cmocka_unit_test(test_greedy_session), cmocka_unit_test(test_generate_cancel_eos),
      cmocka_unit_test(test_logit_rows),     cmocka_unit_test(test_context_and_kv_plan),
      cmocka_unit_test(test_engine),         cmocka_unit_test(test_text),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
