/* The public C API (include/cinfer.h) on the fixtures and the starter model: errors as status +
 * message, model facts, greedy sessions equal to transformers' continuation (greedy.txt),
 * step/finish semantics, logits rows, cancel and reset, the engine's events, the text layer
 * (tokenizers, chat templates, streaming detokenizer), KV codec checks, timings, synthetic
 * context, device options and random-weight models.
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
#include <sys/stat.h>
#include <unistd.h>

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
  options.precision = CINFER_PRECISION_EXACT; /* compared with transformers in f32 */
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
                   CINFER_CONTEXT_EXCEEDED);
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

/* --device/--gpu: a bad device or ordinal is a clear error, the CPU loads. */
static void test_device_options(void **state) {
  (void)state;
  cinfer_model_options options;
  cinfer_model_options_init(&options);
  assert_null(options.device);
  assert_int_equal(options.gpu, 0);
  assert_int_equal(options.precision, CINFER_PRECISION_FAST);
  cinfer_model *model = NULL;
  options.precision = (cinfer_precision)7;
  assert_int_equal(cinfer_model_load(LLAMA, &options, &model), CINFER_INVALID_ARGUMENT);
  assert_null(model);
  assert_non_null(strstr(cinfer_last_error(), "precision"));
  options.precision = CINFER_PRECISION_EXACT;
  options.device = "gpu";
  assert_int_equal(cinfer_model_load(LLAMA, &options, &model), CINFER_ERROR);
  assert_null(model);
  assert_non_null(strstr(cinfer_last_error(), "unknown device 'gpu'"));
  options.device = "cpu";
  options.gpu = -1;
  assert_int_equal(cinfer_model_load(LLAMA, &options, &model), CINFER_INVALID_ARGUMENT);
  assert_non_null(strstr(cinfer_last_error(), "gpu"));
  options.gpu = 0;
  options.n_threads = 2;
  assert_int_equal(cinfer_model_load(LLAMA, &options, &model), CINFER_OK);
  assert_int_equal(cinfer_model_vocab_size(model), 256);
  cinfer_model_free(model);
}

/* KV codec names and checks, KV bytes per token, weight bytes, generation defaults. */
static void test_kv_codec_and_facts(void **state) {
  (void)state;
  cinfer_params params;
  cinfer_params_init(&params, NULL);
  char name[32];
  int quantized = -1;
  assert_int_equal(cinfer_params_kv_codec(&params, name, sizeof name, &quantized), CINFER_OK);
  assert_string_equal(name, "bf16");
  assert_int_equal(quantized, 0);
  params.kv_codec = "affine";
  params.kv_group_size = 32;
  assert_int_equal(cinfer_params_kv_codec(&params, name, sizeof name, &quantized), CINFER_OK);
  assert_int_equal(quantized, 1);
  assert_non_null(strstr(name, "affine"));
  assert_non_null(strstr(name, "32"));
  params.kv_codec = "zip";
  assert_int_equal(cinfer_params_kv_codec(&params, name, sizeof name, NULL),
                   CINFER_INVALID_ARGUMENT);
  assert_non_null(strstr(cinfer_last_error(), "unknown KV codec \"zip\""));
  params.kv_codec = NULL;
  params.kv_start = -1;
  assert_int_equal(cinfer_params_kv_codec(&params, NULL, 0, NULL), CINFER_INVALID_ARGUMENT);
  assert_non_null(strstr(cinfer_last_error(), "kv_start"));
  assert_int_equal(cinfer_params_kv_codec(NULL, NULL, 0, NULL), CINFER_INVALID_ARGUMENT);
  params.kv_start = 0;

  cinfer_model *model = load(LLAMA);
  int64_t bf16 = 0, f32 = 0, turbo = 0;
  assert_int_equal(cinfer_model_kv_bytes_per_token(model, &params, &bf16), CINFER_OK);
  /* 2 layers x (K + V) x 2 KV heads x head_dim 16 x 2 bytes */
  assert_int_equal(bf16, 2 * 2 * 2 * 16 * 2);
  params.kv_codec = "f32";
  assert_int_equal(cinfer_model_kv_bytes_per_token(model, &params, &f32), CINFER_OK);
  assert_int_equal(f32, 2 * bf16);
  params.kv_codec = "turbo";
  assert_int_equal(cinfer_model_kv_bytes_per_token(model, &params, &turbo), CINFER_OK);
  assert_true(turbo > 0 && turbo < bf16);
  params.kv_codec = "zip";
  assert_int_equal(cinfer_model_kv_bytes_per_token(model, &params, &turbo),
                   CINFER_INVALID_ARGUMENT);
  assert_int_equal(cinfer_model_kv_bytes_per_token(model, NULL, &turbo), CINFER_INVALID_ARGUMENT);
  assert_true(cinfer_model_weight_bytes(model) > 0);
  assert_int_equal(cinfer_model_weight_bytes(NULL), 0);
  assert_int_equal(cinfer_model_max_new_tokens(model), 0); /* no generation_config.json */
  cinfer_model_free(model);
  model = load(STARTER);
  assert_true(cinfer_model_max_new_tokens(model) >= 0);
  cinfer_model_free(model);
}

/* Timings, the seed, KV bytes, synthetic positions and the explicit max_tokens rule. */
static void test_session_extras(void **state) {
  (void)state;
  cinfer_model *model = load(LLAMA);
  size_t n_prompt = 0;
  int32_t *prompt = read_ids(LLAMA "/ids.txt", &n_prompt);
  cinfer_params params = greedy_params(model, 6);
  params.seed = 42;
  params.has_seed = 1;
  cinfer_session *session = NULL;
  assert_int_equal(cinfer_session_create(model, &params, &session), CINFER_OK);
  assert_true(cinfer_session_seed(session) == 42);
  assert_int_equal(cinfer_session_kv_bytes(session), 0);
  assert_int_equal(cinfer_session_feed(session, prompt, n_prompt, NULL, 0), CINFER_OK);
  assert_true(cinfer_session_kv_bytes(session) > 0);
  assert_int_equal(cinfer_session_generate(session, NULL, NULL), CINFER_OK);
  cinfer_timings t;
  assert_int_equal(cinfer_session_timings(session, &t), CINFER_OK);
  assert_int_equal(t.prompt_tokens, (int)n_prompt);
  assert_int_equal(t.generated_tokens, 6);
  assert_true(t.prefill_seconds > 0 && t.prefill_tok_s > 0);
  assert_true(t.ttft_seconds >= t.prefill_seconds);
  assert_true(t.decode_seconds > 0 && t.decode_tok_s > 0);
  assert_int_equal(cinfer_session_timings(NULL, &t), CINFER_INVALID_ARGUMENT);
  /* log-probabilities of the last sampled token: greedy, so it is the best one */
  float lp = 1.0f, top_lp[3];
  int32_t top_ids[3];
  int n_top = -1;
  assert_int_equal(cinfer_session_logprobs(session, 3, &lp, top_ids, top_lp, &n_top), CINFER_OK);
  size_t n_all = 0;
  const int32_t *all = cinfer_session_tokens(session, &n_all);
  assert_int_equal(top_ids[0], all[n_all - 1]); /* the generation's last token */
  assert_int_equal(cinfer_session_reset(session), CINFER_OK);
  assert_int_equal(cinfer_session_feed(session, prompt, n_prompt, NULL, 0), CINFER_OK);
  assert_int_equal(cinfer_session_logprobs(session, 3, &lp, top_ids, top_lp, &n_top),
                   CINFER_INVALID_ARGUMENT); /* nothing sampled since the feed */
  int32_t sampled;
  assert_int_equal(cinfer_session_step(session, &sampled), CINFER_OK);
  assert_int_equal(cinfer_session_logprobs(session, 3, &lp, top_ids, top_lp, &n_top), CINFER_OK);
  assert_int_equal(n_top, 3);
  assert_int_equal(top_ids[0], sampled);
  assert_true(lp <= 0.0f && lp == top_lp[0]);
  assert_true(top_lp[0] >= top_lp[1] && top_lp[1] >= top_lp[2]);
  assert_int_equal(
      cinfer_session_logprobs(session, CINFER_MAX_TOP_LOGPROBS + 1, &lp, top_ids, top_lp, &n_top),
      CINFER_INVALID_ARGUMENT);
  /* synthetic positions: only into an empty session, within the context */
  assert_int_equal(cinfer_session_fill_synthetic(session, 8, 1), CINFER_INVALID_ARGUMENT);
  assert_non_null(strstr(cinfer_last_error(), "empty session"));
  assert_int_equal(cinfer_session_reset(session), CINFER_OK);
  assert_int_equal(cinfer_session_fill_synthetic(session, -1, 1), CINFER_INVALID_ARGUMENT);
  assert_int_equal(cinfer_session_fill_synthetic(session, 1 << 20, 1), CINFER_INVALID_ARGUMENT);
  assert_non_null(strstr(cinfer_last_error(), "context size"));
  assert_int_equal(cinfer_session_fill_synthetic(session, 32, 1), CINFER_OK);
  assert_true(cinfer_session_kv_bytes(session) > 0);
  assert_int_equal(cinfer_session_feed(session, prompt, n_prompt, NULL, 0), CINFER_OK);
  int32_t token;
  assert_int_equal(cinfer_session_step(session, &token), CINFER_OK);
  cinfer_session_free(session);
  /* an explicit max_tokens past the context fails at the first step; a default one is cut */
  params.context_size = (int)n_prompt + 3;
  params.max_tokens = 4;
  params.max_tokens_explicit = 1;
  assert_int_equal(cinfer_session_create(model, &params, &session), CINFER_OK);
  assert_int_equal(cinfer_session_feed(session, prompt, n_prompt, NULL, 0), CINFER_OK);
  assert_int_equal(cinfer_session_step(session, &token), CINFER_INVALID_ARGUMENT);
  assert_non_null(strstr(cinfer_last_error(), "exceeds the context size"));
  cinfer_session_free(session);
  params.max_tokens_explicit = 0;
  assert_int_equal(cinfer_session_create(model, &params, &session), CINFER_OK);
  assert_int_equal(cinfer_session_feed(session, prompt, n_prompt, NULL, 0), CINFER_OK);
  assert_int_equal(cinfer_session_generate(session, NULL, NULL), CINFER_OK);
  assert_int_equal(cinfer_session_n_generated(session), 3);
  assert_int_equal(cinfer_session_finish_reason(session), CINFER_FINISH_LENGTH);
  cinfer_session_free(session);
  free(prompt);
  cinfer_model_free(model);
}

/* Tokenizers and chat templates without weights, and the model's own. */
static void test_text_handles(void **state) {
  (void)state;
  cinfer_tokenizer *tok = NULL, *file_tok = NULL, *missing = (cinfer_tokenizer *)1;
  assert_int_equal(cinfer_tokenizer_load(STARTER, &tok), CINFER_OK);
  assert_int_equal(cinfer_tokenizer_load(CI_FIXTURE_DIR "/no-such-dir", &missing), CINFER_ERROR);
  assert_null(missing);
  assert_true(strlen(cinfer_last_error()) > 0);
  assert_int_equal(cinfer_tokenizer_load(STARTER "/tokenizer.json", &file_tok), CINFER_OK);
  const char *text = "def fib(n): return n";
  int32_t *a = NULL, *b = NULL;
  size_t na = 0, nb = 0;
  assert_int_equal(cinfer_tokenizer_encode(tok, text, strlen(text), 0, &a, &na), CINFER_OK);
  assert_int_equal(cinfer_tokenizer_encode(file_tok, text, strlen(text), 0, &b, &nb), CINFER_OK);
  assert_int_equal(na, nb);
  assert_memory_equal(a, b, na * sizeof *a);
  char *back = NULL;
  assert_int_equal(cinfer_tokenizer_decode(tok, a, na, 1, &back, NULL), CINFER_OK);
  assert_string_equal(back, text);
  cinfer_free(back);
  const int32_t bad = 1 << 30;
  assert_int_equal(cinfer_tokenizer_decode(tok, &bad, 1, 0, &back, NULL), CINFER_INVALID_ARGUMENT);
  assert_int_equal(cinfer_tokenizer_encode(NULL, text, 1, 0, &b, &nb), CINFER_INVALID_ARGUMENT);
  cinfer_free(a);
  cinfer_free(b);
  cinfer_tokenizer_free(file_tok);

  cinfer_chat_template *t = NULL;
  assert_int_equal(cinfer_chat_template_load(STARTER, &t), CINFER_OK);
  char *out = NULL;
  size_t len = 0;
  assert_int_equal(
      cinfer_chat_template_render(t,
                                  "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], "
                                  "\"add_generation_prompt\": true}",
                                  &out, &len),
      CINFER_OK);
  assert_non_null(strstr(out, "Hi"));
  assert_int_equal(len, strlen(out));
  cinfer_free(out);
  assert_int_equal(cinfer_chat_template_render(t, "[]", &out, NULL), CINFER_INVALID_ARGUMENT);
  assert_non_null(strstr(cinfer_last_error(), "not a JSON object"));
  assert_non_null(cinfer_chat_template_bos_token(t));
  cinfer_chat_template_free(t);
  assert_int_equal(cinfer_chat_template_load(LLAMA, &t), CINFER_ERROR);
  assert_null(t);
  assert_int_equal(cinfer_chat_template_from_source("{{ messages[0].content }}!", "<s>", NULL, &t),
                   CINFER_OK);
  assert_string_equal(cinfer_chat_template_bos_token(t), "<s>");
  assert_string_equal(cinfer_chat_template_eos_token(t), "");
  assert_int_equal(
      cinfer_chat_template_render(t, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}",
                                  &out, NULL),
      CINFER_OK);
  assert_string_equal(out, "Hi!");
  cinfer_free(out);
  cinfer_chat_template_free(t);
  assert_int_equal(
      cinfer_chat_template_from_source("{{ raise_exception('boom') }}", NULL, NULL, &t), CINFER_OK);
  assert_int_equal(cinfer_chat_template_render(t, "{\"messages\": []}", &out, NULL), CINFER_ERROR);
  assert_non_null(strstr(cinfer_last_error(), "boom"));
  cinfer_chat_template_free(t);
  assert_int_equal(cinfer_chat_template_from_source("{% if %}", NULL, NULL, &t), CINFER_ERROR);

  /* a model's own handles */
  cinfer_model *model = load(STARTER);
  assert_non_null(cinfer_model_tokenizer(model));
  assert_non_null(cinfer_model_chat_template(model));
  cinfer_model_free(model);
  model = load(LLAMA);
  assert_null(cinfer_model_tokenizer(model));
  assert_null(cinfer_model_chat_template(model));
  cinfer_model_free(model);
  cinfer_tokenizer_free(tok);
}

/* Streaming detokenization: the pieces add up to the decoded text; a stop string cuts it. */
static void test_detokenizer(void **state) {
  (void)state;
  cinfer_tokenizer *tok = NULL;
  assert_int_equal(cinfer_tokenizer_load(STARTER, &tok), CINFER_OK);
  const char *text = "def fib(n): return n \xc3\xa9t\xc3\xa9 \xe2\x9c\x93";
  int32_t *ids = NULL;
  size_t n = 0;
  assert_int_equal(cinfer_tokenizer_encode(tok, text, strlen(text), 0, &ids, &n), CINFER_OK);
  for (int with_stop = 0; with_stop < 2; with_stop++) {
    const char *stop[] = {"fib("};
    cinfer_detokenizer *d = NULL;
    assert_int_equal(
        cinfer_detokenizer_create(tok, with_stop ? stop : NULL, with_stop ? 1 : 0, 1, &d),
        CINFER_OK);
    char got[256] = {0};
    size_t got_len = 0;
    cinfer_status status = CINFER_OK;
    for (size_t i = 0; i < n && status == CINFER_OK; i++) {
      const char *piece;
      size_t len;
      status = cinfer_detokenizer_push(d, ids[i], &piece, &len);
      assert_true(got_len + len < sizeof got);
      memcpy(got + got_len, piece, len);
      got_len += len;
    }
    if (status == CINFER_OK) {
      const char *piece;
      size_t len;
      status = cinfer_detokenizer_finish(d, &piece, &len);
      memcpy(got + got_len, piece, len);
      got_len += len;
    }
    if (with_stop) {
      assert_int_equal(status, CINFER_DONE);
      assert_string_equal(got, "def ");
      assert_string_equal(cinfer_detokenizer_stop_string(d), "fib(");
    } else {
      assert_int_equal(status, CINFER_OK);
      assert_string_equal(got, text);
      assert_null(cinfer_detokenizer_stop_string(d));
      const char *piece;
      size_t len;
      assert_int_equal(cinfer_detokenizer_push(d, 1 << 30, &piece, &len), CINFER_INVALID_ARGUMENT);
    }
    cinfer_detokenizer_free(d);
  }
  cinfer_detokenizer *d = NULL;
  assert_int_equal(cinfer_detokenizer_create(NULL, NULL, 0, 1, &d), CINFER_INVALID_ARGUMENT);
  const char *null_stop[] = {NULL};
  assert_int_equal(cinfer_detokenizer_create(tok, null_stop, 1, 1, &d), CINFER_INVALID_ARGUMENT);
  assert_null(d);
  cinfer_free(ids);
  cinfer_tokenizer_free(tok);
}

/* A random-weight model written from a config loads and runs; bad options are named. */
static void test_write_random(void **state) {
  (void)state;
  char dir[] = "/tmp/ci_api_random_XXXXXX";
  assert_non_null(mkdtemp(dir));
  const cinfer_random_model_options q8 = {"q8", 32, 7};
  assert_int_equal(cinfer_model_write_random(LLAMA "/config.json", dir, &q8), CINFER_OK);
  cinfer_model *model = load(dir);
  assert_int_equal(cinfer_model_vocab_size(model), 256);
  cinfer_params params = greedy_params(model, 4);
  cinfer_session *session = NULL;
  const int32_t prompt[] = {1, 2, 3};
  assert_int_equal(cinfer_session_create(model, &params, &session), CINFER_OK);
  assert_int_equal(cinfer_session_feed(session, prompt, 3, NULL, 0), CINFER_OK);
  assert_int_equal(cinfer_session_generate(session, NULL, NULL), CINFER_OK);
  assert_int_equal(cinfer_session_n_generated(session), 4);
  cinfer_session_free(session);
  cinfer_model_free(model);
  const cinfer_random_model_options q5 = {"q5", 0, 0}, g48 = {"q4", 48, 0};
  assert_int_equal(cinfer_model_write_random(LLAMA "/config.json", dir, &q5),
                   CINFER_INVALID_ARGUMENT);
  assert_non_null(strstr(cinfer_last_error(), "q5"));
  assert_int_equal(cinfer_model_write_random(LLAMA "/config.json", dir, &g48),
                   CINFER_INVALID_ARGUMENT);
  assert_non_null(strstr(cinfer_last_error(), "48"));
  assert_int_equal(cinfer_model_write_random(LLAMA "/missing.json", dir, NULL), CINFER_ERROR);
  assert_non_null(strstr(cinfer_last_error(), "missing.json"));
  assert_int_equal(cinfer_model_write_random(NULL, dir, NULL), CINFER_INVALID_ARGUMENT);
  char path[256];
  snprintf(path, sizeof path, "%s/config.json", dir);
  unlink(path);
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  unlink(path);
  rmdir(dir);
}

/* Engine events: top logprobs with each token (best first), timings with DONE. */
/* cos(a, b) of two unit vectors. */
static double cosine(const float *a, const float *b, int n) {
  double dot = 0;
  for (int i = 0; i < n; i++) dot += (double)a[i] * b[i];
  return dot;
}

/* A greedy 16-token answer of the starter model to prompt, with an embedding computed while it
 * runs when embed_ids is given. */
static void greedy_tokens(cinfer_engine *engine, const cinfer_model *model, const int32_t *prompt,
                          size_t n_prompt, const int32_t *embed_ids, size_t n_embed, float *vec,
                          int32_t *tokens) {
  cinfer_params params = greedy_params(model, 16);
  params.kv_codec = NULL;
  cinfer_request *request = NULL;
  assert_int_equal(cinfer_engine_submit(engine, prompt, n_prompt, &params, &request), CINFER_OK);
  cinfer_event event;
  int n = 0;
  for (;;) {
    assert_int_equal(cinfer_request_next(request, &event, 60.0), CINFER_OK);
    if (event.kind != CINFER_EVENT_TOKEN) break;
    if (n == 2 && embed_ids) /* between decode steps of the running request */
      assert_int_equal(cinfer_engine_embed(engine, embed_ids, n_embed, CINFER_POOL_MEAN, vec),
                       CINFER_OK);
    tokens[n++] = event.token;
  }
  assert_int_equal(event.kind, CINFER_EVENT_DONE);
  assert_int_equal(n, 16);
  cinfer_request_free(request);
}

/* Embeddings: unit vectors of the model's width; a causal model's first row depends on the first
 * token alone (CLS of a text = the embedding of its first token, across 256-row chunks too); last
 * and mean pooling differ; the folder's sentence-transformers config picks the pooling; an
 * embedding between the steps of a running request leaves its answer unchanged; bad input is an
 * error. */
static void test_embeddings(void **state) {
  (void)state;
  cinfer_model *model = load(STARTER);
  assert_int_equal(cinfer_model_pooling(model), CINFER_POOL_MEAN);
  const int hidden = cinfer_model_hidden_size(model);
  assert_true(hidden > 0);
  cinfer_engine *engine = NULL;
  assert_int_equal(cinfer_engine_create(model, NULL, &engine), CINFER_OK);
  const char text[] = "def add(a, b):\n    return a + b\n";
  int32_t *ids = NULL;
  size_t n = 0;
  assert_int_equal(cinfer_tokenize(model, text, strlen(text), 1, &ids, &n), CINFER_OK);
  assert_true(n >= 5);
  float *mean = malloc((size_t)hidden * sizeof(float)), *last = malloc((size_t)hidden * 4),
        *cls = malloc((size_t)hidden * 4), *first = malloc((size_t)hidden * 4),
        *again = malloc((size_t)hidden * 4);
  assert_int_equal(cinfer_engine_embed(engine, ids, n, CINFER_POOL_MEAN, mean), CINFER_OK);
  assert_int_equal(cinfer_engine_embed(engine, ids, n, CINFER_POOL_LAST, last), CINFER_OK);
  assert_int_equal(cinfer_engine_embed(engine, ids, n, CINFER_POOL_CLS, cls), CINFER_OK);
  assert_int_equal(cinfer_engine_embed(engine, ids, 1, CINFER_POOL_MEAN, first), CINFER_OK);
  assert_int_equal(cinfer_engine_embed(engine, ids, n, CINFER_POOL_MEAN, again), CINFER_OK);
  assert_true(fabs(cosine(mean, mean, hidden) - 1.0) < 1e-4);
  assert_true(fabs(cosine(last, last, hidden) - 1.0) < 1e-4);
  assert_memory_equal(mean, again, (size_t)hidden * sizeof(float)); /* deterministic */
  assert_true(cosine(cls, first, hidden) > 0.9999);
  assert_true(cosine(mean, last, hidden) < 0.999);
  /* a text longer than a 256-row chunk */
  enum { LONG = 600 };
  int32_t *long_ids = malloc(LONG * sizeof *long_ids);
  for (int i = 0; i < LONG; i++) long_ids[i] = ids[(size_t)i % n];
  assert_int_equal(cinfer_engine_embed(engine, long_ids, LONG, CINFER_POOL_CLS, again), CINFER_OK);
  assert_true(cosine(again, first, hidden) > 0.9999);
  assert_int_equal(cinfer_engine_embed(engine, long_ids, LONG, CINFER_POOL_MEAN, again), CINFER_OK);
  assert_true(fabs(cosine(again, again, hidden) - 1.0) < 1e-4);
  /* beside a running request: its answer is the solo answer */
  int32_t solo[16], beside[16];
  greedy_tokens(engine, model, ids, n, NULL, 0, NULL, solo);
  greedy_tokens(engine, model, ids, n, long_ids, LONG, again, beside);
  assert_memory_equal(solo, beside, sizeof solo);
  assert_true(fabs(cosine(again, again, hidden) - 1.0) < 1e-4);
  /* errors */
  assert_int_equal(cinfer_engine_embed(engine, ids, 0, CINFER_POOL_MEAN, again),
                   CINFER_INVALID_ARGUMENT);
  const int32_t bad_id[] = {1, 1 << 30};
  assert_int_not_equal(cinfer_engine_embed(engine, bad_id, 2, CINFER_POOL_MEAN, again), CINFER_OK);
  assert_non_null(strstr(cinfer_last_error(), "out of range"));
  cinfer_engine_free(engine);
  cinfer_model_free(model);
  /* a folder whose sentence-transformers config asks for the last token */
  char dir[] = "/tmp/cinfer-embed-XXXXXX", path[512], target[1024];
  assert_non_null(mkdtemp(dir));
  static const char *const files[] = {"config.json",
                                      "generation_config.json",
                                      "model-00001-of-00003.safetensors",
                                      "model-00002-of-00003.safetensors",
                                      "model-00003-of-00003.safetensors",
                                      "model.safetensors.index.json",
                                      "tokenizer.json",
                                      "tokenizer_config.json"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, files[i]);
    assert_non_null(realpath(STARTER, target));
    strcat(target, "/");
    strcat(target, files[i]);
    assert_int_equal(symlink(target, path), 0);
  }
  snprintf(path, sizeof path, "%s/modules.json", dir);
  FILE *f = fopen(path, "w");
  fputs("[{\"idx\": 0, \"name\": \"0\", \"path\": \"\", \"type\": "
        "\"sentence_transformers.models.Transformer\"}, {\"idx\": 1, \"name\": \"1\", \"path\": "
        "\"1_Pooling\", \"type\": \"sentence_transformers.models.Pooling\"}]",
        f);
  fclose(f);
  snprintf(path, sizeof path, "%s/1_Pooling", dir);
  assert_int_equal(mkdir(path, 0755), 0);
  snprintf(path, sizeof path, "%s/1_Pooling/config.json", dir);
  f = fopen(path, "w");
  fputs("{\"word_embedding_dimension\": 1, \"pooling_mode_cls_token\": false, "
        "\"pooling_mode_mean_tokens\": false, \"pooling_mode_lasttoken\": true}",
        f);
  fclose(f);
  model = load(dir);
  assert_int_equal(cinfer_model_pooling(model), CINFER_POOL_LAST);
  cinfer_model_free(model);
  remove(path);
  snprintf(path, sizeof path, "%s/1_Pooling", dir);
  rmdir(path);
  snprintf(path, sizeof path, "%s/modules.json", dir);
  remove(path);
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, files[i]);
    remove(path);
  }
  rmdir(dir);
  cinfer_free(ids);
  free(long_ids);
  free(mean);
  free(last);
  free(cls);
  free(first);
  free(again);
}

static void test_engine_events(void **state) {
  (void)state;
  cinfer_model *model = load(LLAMA);
  cinfer_engine *engine = NULL;
  assert_int_equal(cinfer_engine_create(model, NULL, &engine), CINFER_OK);
  size_t n_prompt = 0;
  int32_t *prompt = read_ids(LLAMA "/ids.txt", &n_prompt);
  cinfer_params params = greedy_params(model, 5);
  params.kv_codec = NULL;
  params.top_logprobs = 3;
  cinfer_request *request = NULL;
  assert_int_equal(cinfer_engine_submit(engine, prompt, n_prompt, &params, &request), CINFER_OK);
  cinfer_event event;
  int tokens = 0;
  for (;;) {
    assert_int_equal(cinfer_request_next(request, &event, 60.0), CINFER_OK);
    if (event.kind != CINFER_EVENT_TOKEN) break;
    tokens++;
    assert_int_equal(event.n_top, 3);
    assert_int_equal(event.top_ids[0], event.token); /* greedy: the best one */
    assert_true(event.top_logprobs[0] >= event.top_logprobs[1]);
    assert_true(event.top_logprobs[1] >= event.top_logprobs[2]);
  }
  assert_int_equal(event.kind, CINFER_EVENT_DONE);
  assert_int_equal(tokens, 5);
  assert_true(event.prefill_seconds > 0 && event.decode_seconds > 0 && event.queue_seconds >= 0);
  cinfer_request_free(request);
  params.top_logprobs = CINFER_MAX_TOP_LOGPROBS + 1;
  assert_int_equal(cinfer_engine_submit(engine, prompt, n_prompt, &params, &request),
                   CINFER_INVALID_ARGUMENT);
  assert_non_null(strstr(cinfer_last_error(), "top_logprobs"));
  cinfer_engine_free(engine);
  free(prompt);
  cinfer_model_free(model);
}

/* A word-level vocabulary with think tags and a hermes tool call (test_chat_output). */
static const char think_tokenizer_json[] =
    "{\"model\": {\"type\": \"WordLevel\", \"unk_token\": \"<unk>\", \"vocab\": {\"<unk>\": 0, "
    "\"<think>\": 1, \"</think>\": 2, \"hmm\": 3, \" ok\": 4, \"<tool_call>\": 5, "
    "\"</tool_call>\": 6, \"{\\\"name\\\": \\\"f\\\", \\\"arguments\\\": {}}\": 7, \"Hello\": 8, "
    "\" world\": 9, \"<s>\": 10}}, \"decoder\": {\"type\": \"Fuse\"}, \"added_tokens\": ["
    "{\"id\": 1, \"content\": \"<think>\", \"special\": false},"
    "{\"id\": 2, \"content\": \"</think>\", \"special\": false},"
    "{\"id\": 10, \"content\": \"<s>\", \"special\": true}]}";

typedef struct {
  char content[256], reasoning[256], calls[512];
  int n_calls;
} answer;

static void add_content(void *user, const char *text, size_t len) {
  answer *a = user;
  strncat(a->content, text, len);
}

static void add_reasoning(void *user, const char *text, size_t len) {
  answer *a = user;
  strncat(a->reasoning, text, len);
}

static void add_call(void *user, const char *call_json) {
  answer *a = user;
  strncat(a->calls, call_json, sizeof a->calls - strlen(a->calls) - 1);
  a->n_calls++;
}

static const cinfer_chat_output_sinks answer_sinks = {add_content, add_reasoning, add_call};

/* Pushes ids then finishes; returns the last status (CINFER_DONE when a stop string fired). */
static cinfer_status run_output(cinfer_chat_output *o, const int32_t *ids, size_t n, answer *a) {
  memset(a, 0, sizeof *a);
  for (size_t i = 0; i < n; i++) {
    const cinfer_status status = cinfer_chat_output_push(o, ids[i], &answer_sinks, a);
    if (status != CINFER_OK) return status;
  }
  return cinfer_chat_output_finish(o, &answer_sinks, a);
}

/* The chat output parser: think-tag reasoning, hermes tool calls, a prompt that opened <think>,
 * stop strings, raw text, and bad input. */
static void test_chat_output(void **state) {
  (void)state;
  cinfer_tokenizer *tok = NULL;
  assert_int_equal(
      cinfer_tokenizer_from_json(think_tokenizer_json, strlen(think_tokenizer_json), &tok),
      CINFER_OK);
  assert_int_equal(cinfer_tokenizer_token_id(tok, "</think>"), 2);
  assert_int_equal(cinfer_tokenizer_token_id(tok, "nope"), -1);
  assert_int_equal(cinfer_tokenizer_config_token(tok, "bos_token"), -1); /* no config */
  cinfer_tokenizer *bad = NULL;
  assert_int_equal(cinfer_tokenizer_from_json("{", 1, &bad), CINFER_ERROR);
  assert_null(bad);
  cinfer_chat_format *format = NULL;
  assert_int_equal(cinfer_chat_format_create(tok, NULL, "qwen3", &format), CINFER_OK);
  assert_true(cinfer_chat_format_has_reasoning(format));
  assert_int_equal(cinfer_chat_format_stop_tokens(format, NULL, 0), 0);
  /* Qwen XML tool calls: only a template that teaches <function=...> with <parameter=...> */
  assert_false(cinfer_chat_format_xml_tool_calls(format));
  assert_false(cinfer_chat_format_xml_tool_calls(NULL));
  assert_true(cinfer_chat_format_reasoning_open(format, "a<think>\nb", 10));
  assert_false(cinfer_chat_format_reasoning_open(format, "a<think>b</think>", 17));
  assert_false(cinfer_chat_format_reasoning_open(format, "plain", 5));
  assert_false(cinfer_chat_format_reasoning_open(NULL, "<think>", 7));
  const char *const templates[] = {"{{ '<function=' }}", "{{ '<function=x>\n<parameter=y>' }}"};
  for (int i = 0; i < 2; i++) {
    cinfer_chat_template *t = NULL;
    cinfer_chat_format *xml = NULL;
    assert_int_equal(cinfer_chat_template_from_source(templates[i], NULL, NULL, &t), CINFER_OK);
    assert_int_equal(cinfer_chat_format_create(tok, t, "qwen3_5_text", &xml), CINFER_OK);
    assert_int_equal(cinfer_chat_format_xml_tool_calls(xml), i);
    cinfer_chat_format_free(xml);
    cinfer_chat_template_free(t);
  }

  cinfer_chat_output_options options = {0};
  options.tools_json = "[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]";
  cinfer_chat_output *o = NULL;
  answer a;
  const int32_t full[] = {1, 3, 4, 2, 8, 5, 7, 6};
  assert_int_equal(cinfer_chat_output_create(format, &options, &o), CINFER_OK);
  assert_int_equal(run_output(o, full, 8, &a), CINFER_OK);
  assert_string_equal(a.reasoning, "hmm ok");
  assert_string_equal(a.content, "Hello");
  assert_int_equal(a.n_calls, 1);
  assert_non_null(strstr(a.calls, "\"name\":\"f\""));
  assert_int_equal(cinfer_chat_output_reasoning_tokens(o), 2);
  assert_null(cinfer_chat_output_stop_string(o));
  cinfer_chat_output_free(o);

  /* tool_choice none: the call stays text */
  options.tools_off = 1;
  assert_int_equal(cinfer_chat_output_create(format, &options, &o), CINFER_OK);
  assert_int_equal(run_output(o, full + 4, 4, &a), CINFER_OK);
  assert_int_equal(a.n_calls, 0);
  assert_string_equal(a.content,
                      "Hello<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>");
  cinfer_chat_output_free(o);

  /* a prompt that ends inside <think>: the answer starts as reasoning */
  const cinfer_chat_output_options primed = {.prompt = "user: hi\n<think>\n", .prompt_len = 17};
  assert_int_equal(cinfer_chat_output_create(format, &primed, &o), CINFER_OK);
  assert_int_equal(run_output(o, full + 1, 4, &a), CINFER_OK);
  assert_string_equal(a.reasoning, "hmm ok");
  assert_string_equal(a.content, "Hello");
  cinfer_chat_output_free(o);

  /* a stop string across tokens ends the answer before it */
  const char *stop[] = {"lo wor"};
  const cinfer_chat_output_options stopping = {.stop = stop, .n_stop = 1};
  const int32_t hello_world[] = {8, 9, 8};
  assert_int_equal(cinfer_chat_output_create(format, &stopping, &o), CINFER_OK);
  assert_int_equal(run_output(o, hello_world, 3, &a), CINFER_DONE);
  assert_string_equal(a.content, "Hel");
  assert_string_equal(cinfer_chat_output_stop_string(o), "lo wor");
  cinfer_chat_output_free(o);

  /* raw text: nothing is parsed */
  const cinfer_chat_output_options raw = {.raw_text = 1, .tools_json = options.tools_json};
  assert_int_equal(cinfer_chat_output_create(format, &raw, &o), CINFER_OK);
  assert_int_equal(run_output(o, full, 5, &a), CINFER_OK);
  assert_string_equal(a.content, "<think>hmm ok</think>Hello");
  assert_string_equal(a.reasoning, "");
  assert_int_equal(cinfer_chat_output_push(o, 1000, &answer_sinks, &a), CINFER_INVALID_ARGUMENT);
  cinfer_chat_output_free(o);

  /* bad input */
  const cinfer_chat_output_options bad_tools = {.tools_json = "{\"no\": 1}"};
  assert_int_equal(cinfer_chat_output_create(format, &bad_tools, &o), CINFER_INVALID_ARGUMENT);
  assert_null(o);
  assert_non_null(strstr(cinfer_last_error(), "tools"));
  const cinfer_chat_output_options null_stop = {.stop = NULL, .n_stop = 2};
  assert_int_equal(cinfer_chat_output_create(format, &null_stop, &o), CINFER_INVALID_ARGUMENT);
  assert_int_equal(cinfer_chat_output_create(NULL, NULL, &o), CINFER_INVALID_ARGUMENT);
  assert_int_equal(cinfer_chat_output_push(NULL, 1, NULL, NULL), CINFER_INVALID_ARGUMENT);
  cinfer_chat_format_free(format);
  cinfer_tokenizer_free(tok);

  /* a model's own format */
  cinfer_model *model = load(STARTER);
  assert_non_null(cinfer_model_chat_format(model));
  cinfer_model_free(model);
  model = load(LLAMA);
  assert_null(cinfer_model_chat_format(model));
  assert_int_equal(cinfer_model_n_layers(model), 2);
  assert_string_equal(cinfer_model_device(model), "cpu");
  assert_string_equal(cinfer_model_device_note(model), ""); /* no GPU here: nothing to explain */
  assert_string_equal(cinfer_model_device_note(NULL), "");
  cinfer_model_free(model);
}

/* Engine extras: options, stats, context size, request params the server uses (stop_token_ids,
 * logit bias), rejections by status, and stop. */
static void test_engine_extras(void **state) {
  (void)state;
  cinfer_model *model = load(LLAMA);
  cinfer_engine_options options;
  cinfer_engine_options_init(&options);
  assert_int_equal(options.batch_tokens, 2048);
  assert_int_equal(options.max_queue, 256);
  cinfer_engine *engine = NULL;
  options.batch_tokens = 0;
  assert_int_equal(cinfer_engine_create(model, &options, &engine), CINFER_INVALID_ARGUMENT);
  assert_non_null(strstr(cinfer_last_error(), "batch_tokens"));
  cinfer_engine_options_init(&options);
  options.max_batch = 2;
  options.context_size = 64;
  options.kv_budget_bytes = 64 * 2 * 2 * 2 * 16 * 2 * 4; /* a few 64-token requests */
  assert_int_equal(cinfer_engine_create(model, &options, &engine), CINFER_OK);
  assert_int_equal(cinfer_engine_context_size(engine), 64);
  assert_int_equal(cinfer_engine_max_batch(engine), 2);
  size_t n_prompt = 0;
  int32_t *prompt = read_ids(LLAMA "/ids.txt", &n_prompt);
  cinfer_params params = greedy_params(model, 8);
  params.kv_codec = NULL;
  /* the greedy continuation, then the same with its third token as a stop id */
  int32_t first[8];
  cinfer_request *request = NULL;
  cinfer_event event;
  assert_int_equal(cinfer_engine_submit(engine, prompt, n_prompt, &params, &request), CINFER_OK);
  int n = 0;
  while (cinfer_request_next(request, &event, 60.0) == CINFER_OK &&
         event.kind == CINFER_EVENT_TOKEN)
    first[n++] = event.token;
  assert_int_equal(n, 8);
  cinfer_request_free(request);
  params.stop_token_ids = &first[2];
  params.n_stop_token_ids = 1;
  assert_int_equal(cinfer_engine_submit(engine, prompt, n_prompt, &params, &request), CINFER_OK);
  n = 0;
  while (cinfer_request_next(request, &event, 60.0) == CINFER_OK &&
         event.kind == CINFER_EVENT_TOKEN)
    n++;
  assert_int_equal(event.kind, CINFER_EVENT_DONE);
  assert_int_equal(event.finish, CINFER_FINISH_STOP);
  int want = 2; /* tokens before the first occurrence of the stop id */
  for (int i = 0; i < 2; i++)
    if (first[i] == first[2]) want = i;
  assert_int_equal(n, want);
  cinfer_request_free(request);
  /* a logit bias that bans the greedy first token changes it */
  const cinfer_logit_bias ban = {first[0], -100.0f};
  params.stop_token_ids = NULL;
  params.n_stop_token_ids = 0;
  params.logit_bias = &ban;
  params.n_logit_bias = 1;
  assert_int_equal(cinfer_engine_submit(engine, prompt, n_prompt, &params, &request), CINFER_OK);
  assert_int_equal(cinfer_request_next(request, &event, 60.0), CINFER_OK);
  assert_int_equal(event.kind, CINFER_EVENT_TOKEN);
  assert_true(event.token != first[0]);
  cinfer_request_free(request);
  /* bad params are named */
  const cinfer_logit_bias out_of_range = {1 << 20, 1.0f};
  params.logit_bias = &out_of_range;
  assert_int_equal(cinfer_engine_submit(engine, prompt, n_prompt, &params, &request),
                   CINFER_INVALID_ARGUMENT);
  assert_non_null(strstr(cinfer_last_error(), "logit_bias"));
  params.logit_bias = NULL;
  params.n_logit_bias = 0;
  const int32_t bad_stop = -3;
  params.stop_token_ids = &bad_stop;
  params.n_stop_token_ids = 1;
  assert_int_equal(cinfer_engine_submit(engine, prompt, n_prompt, &params, &request),
                   CINFER_INVALID_ARGUMENT);
  assert_non_null(strstr(cinfer_last_error(), "stop_token_ids"));
  params.stop_token_ids = NULL;
  params.n_stop_token_ids = 0;
  params.kv_codec = "affine";
  params.kv_group_size = 128; /* head_dim 16 cannot hold groups of 128 */
  assert_int_equal(cinfer_engine_submit(engine, prompt, n_prompt, &params, &request),
                   CINFER_INVALID_ARGUMENT);
  params.kv_codec = NULL;
  /* too long: context first, then the KV budget */
  params.max_tokens = 64;
  params.max_tokens_explicit = 1;
  assert_int_equal(cinfer_engine_submit(engine, prompt, n_prompt, &params, &request),
                   CINFER_CONTEXT_EXCEEDED);
  assert_non_null(strstr(cinfer_last_error(), "maximum context length is 64"));
  cinfer_engine_stats stats;
  assert_int_equal(cinfer_engine_get_stats(engine, &stats), CINFER_OK);
  assert_true(stats.requests_finished >= 2);
  assert_true(stats.generated_tokens >= 8);
  assert_true(stats.kv_budget_bytes > 0);
  assert_true(stats.n_kv_formats >= 1);
  assert_string_equal(stats.kv_formats[0].codec, "bf16");
  assert_int_equal(cinfer_engine_get_stats(NULL, &stats), CINFER_INVALID_ARGUMENT);
  /* stop: later submits are refused */
  cinfer_engine_stop(engine);
  params.max_tokens = 4;
  assert_int_equal(cinfer_engine_submit(engine, prompt, n_prompt, &params, &request),
                   CINFER_STOPPED);
  cinfer_engine_free(engine);
  /* a budget too small for a whole request */
  cinfer_engine_options_init(&options);
  options.context_size = 2048;
  options.kv_budget_bytes = 4096;
  options.prefix_cache_bytes = 0;
  assert_int_equal(cinfer_engine_create(model, &options, &engine), CINFER_OK);
  params.max_tokens = 1024;
  assert_int_equal(cinfer_engine_submit(engine, prompt, n_prompt, &params, &request),
                   CINFER_OVER_BUDGET);
  assert_non_null(strstr(cinfer_last_error(), "memory budget"));
  cinfer_engine_free(engine);
  free(prompt);
  cinfer_model_free(model);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_errors),         cmocka_unit_test(test_model_facts),
      cmocka_unit_test(test_greedy_session), cmocka_unit_test(test_generate_cancel_eos),
      cmocka_unit_test(test_logit_rows),     cmocka_unit_test(test_context_and_kv_plan),
      cmocka_unit_test(test_engine),         cmocka_unit_test(test_text),
      cmocka_unit_test(test_device_options), cmocka_unit_test(test_kv_codec_and_facts),
      cmocka_unit_test(test_session_extras), cmocka_unit_test(test_text_handles),
      cmocka_unit_test(test_detokenizer),    cmocka_unit_test(test_write_random),
      cmocka_unit_test(test_engine_events),  cmocka_unit_test(test_chat_output),
      cmocka_unit_test(test_engine_extras),  cmocka_unit_test(test_embeddings),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
