/* The server's text pipeline without a model or a socket: a hand-built ci_server over a synthetic
 * word-level tokenizer with the Gemma 4 markers, a template mentioning <|channel> and a chat
 * format for architecture gemma4_text (cinfer_chat_format_create); engine events are applied one
 * at a time as the HTTP thread applies them. Checks Gemma channel reasoning and tool calls reach
 * reasoning / tool_calls (markup never in a content delta), finish reasons, reasoning_tokens,
 * tool_choice none, a call cut by max_tokens, <|tool_response> in the EOS set, and the timings
 * object. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "server/server.h"

#include "gemma_markers_tokenizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  cinfer_tokenizer *tok;
  cinfer_chat_template *tmpl;
  cinfer_chat_format *format;
  cinfer_params defaults;
  ci_server server;
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  if (cinfer_tokenizer_from_json(gemma_markers_tokenizer_json, strlen(gemma_markers_tokenizer_json),
                                 &f->tok) != CINFER_OK ||
      cinfer_chat_template_from_source(
          "{% for m in messages %}<|turn>{{ m.role }}\n{{ m.content }}<turn|>{% endfor %}"
          "<|turn>model\n<|channel>thought\n{% if not enable_thinking %}<channel|>{% endif %}",
          NULL, NULL, &f->tmpl) != CINFER_OK ||
      cinfer_chat_format_create(f->tok, f->tmpl, "gemma4_text", &f->format) != CINFER_OK)
    return -1;
  cinfer_params_init(&f->defaults, NULL);
  f->server.o.tokenizer = f->tok;
  f->server.o.chat_template = f->tmpl;
  f->server.o.chat_format = f->format;
  f->server.o.vocab = 26;
  f->server.o.defaults = &f->defaults;
  pthread_mutex_init(&f->server.metrics_mu, NULL);
  ci_server_detect_formats(&f->server);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  pthread_mutex_destroy(&f->server.metrics_mu);
  cinfer_chat_format_free(f->format);
  cinfer_chat_template_free(f->tmpl);
  cinfer_tokenizer_free(f->tok);
  free(f);
  return 0;
}

static json_t *weather_tools(void) {
  return json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}]", 0, NULL);
}

/* What the deltas added up to, and whether any content delta carried markup. */
typedef struct {
  char content[512], reasoning[512];
  int markup_in_content;
  size_t calls;
} streamed;

/* Applies the token events then DONE (finish, prompt 10 tokens, 2 cached), collecting and clearing
 * the deltas after every event as the SSE producer does. */
static void run(fixture *f, ci_srv_job *job, const int32_t *ids, size_t n, cinfer_finish why,
                ci_srv_gen *g, streamed *out) {
  memset(g, 0, sizeof *g);
  memset(out, 0, sizeof *out);
  job->n_prompt = 10;
  ci_srv_gen_init_text(&f->server, job, g);
  for (size_t i = 0; i <= n; i++) {
    cinfer_event ev;
    memset(&ev, 0, sizeof ev);
    if (i < n) {
      ev.kind = CINFER_EVENT_TOKEN;
      ev.token = ids[i];
    } else {
      ev.kind = CINFER_EVENT_DONE;
      ev.finish = why;
      ev.prompt_tokens = 10;
      ev.cached_tokens = 2;
      ev.generated_tokens = (int)n + (why == CINFER_FINISH_STOP);
      ev.prefill_seconds = 0.5;
      ev.decode_seconds = 2.0;
    }
    ci_srv_gen_apply(g, &ev, 1.0 + (double)i);
    if (g->d_content.len && (strstr(g->d_content.data, "<|") || strstr(g->d_content.data, "call:")))
      out->markup_in_content = 1;
    if (g->d_content.len) strncat(out->content, g->d_content.data, g->d_content.len);
    if (g->d_reasoning.len) strncat(out->reasoning, g->d_reasoning.data, g->d_reasoning.len);
    out->calls += json_array_size(g->d_calls);
    ci_srv_gen_clear_deltas(g);
  }
  assert_true(g->done);
}

static const int32_t full[] = {T_CH_OPEN, T_THOUGHT, T_NL,        T_I,     T_THINK,   T_CH_CLOSE,
                               T_HELLO,   T_WORLD,   T_CALL_OPEN, T_CALL,  T_WEATHER, T_LBRACE,
                               T_CITY,    T_QUOTE,   T_PARIS,     T_QUOTE, T_COMMA,   T_DAYS,
                               T_3,       T_RBRACE,  T_CALL_CLOSE};
enum { N_FULL = sizeof full / sizeof full[0] };

static void test_formats_detected(void **state) {
  fixture *f = *state;
  assert_true(cinfer_chat_format_has_reasoning(f->format)); /* gemma channels */
  /* <|tool_response> ends generation after calls: every chat request stops on it */
  assert_int_equal(f->server.n_chat_stop_ids, 1);
  assert_int_equal(f->server.chat_stop_ids[0], T_RESPONSE);
  int32_t ids[4];
  assert_int_equal(cinfer_chat_format_stop_tokens(f->format, ids, 4), 1);
  assert_int_equal(ids[0], T_RESPONSE);
  /* a plain architecture gets no call tokens, so no stop token either */
  cinfer_chat_format *plain = NULL;
  assert_int_equal(cinfer_chat_format_create(f->tok, NULL, "llama", &plain), CINFER_OK);
  assert_int_equal(cinfer_chat_format_stop_tokens(plain, ids, 4), 0);
  assert_false(cinfer_chat_format_has_reasoning(plain)); /* no template mentioning channels */
  cinfer_chat_format_free(plain);
  assert_int_equal(cinfer_chat_format_create(NULL, NULL, NULL, &plain), CINFER_INVALID_ARGUMENT);
}

static void test_gemma_reasoning_and_calls(void **state) {
  fixture *f = *state;
  ci_srv_job job = {0};
  job.tools = weather_tools();
  ci_srv_gen g;
  streamed out;
  run(f, &job, full, N_FULL, CINFER_FINISH_STOP, &g, &out);
  assert_string_equal(g.reasoning.data, "I think");
  assert_string_equal(g.content.data, "Hello world");
  assert_string_equal(out.reasoning, "I think");
  assert_string_equal(out.content, "Hello world");
  assert_false(out.markup_in_content);
  assert_int_equal(json_array_size(g.calls), 1);
  assert_int_equal(out.calls, 1);
  const json_t *call = json_array_get(g.calls, 0);
  assert_string_equal(json_string_value(json_object_get(call, "name")), "get_weather");
  assert_string_equal(json_string_value(json_object_get(call, "arguments")),
                      "{\"city\":\"Paris\",\"days\":3}");
  assert_string_equal(g.finish, "tool_calls");
  assert_int_equal(g.reasoning_tokens, 4); /* thought \n I think */
  assert_int_equal(g.completion_tokens, N_FULL + 1);
  ci_srv_gen_free(&g);
  ci_srv_job_free(&job);
}

static void test_tool_choice_none(void **state) {
  fixture *f = *state;
  ci_srv_job job = {0};
  job.tools_off = 1; /* markup is not parsed: the call's text stays content */
  ci_srv_gen g;
  streamed out;
  run(f, &job, full, N_FULL, CINFER_FINISH_STOP, &g, &out);
  assert_string_equal(g.reasoning.data, "I think");
  assert_string_equal(g.content.data, "Hello worldcall:get_weather{city:Paris,days:3}");
  assert_int_equal(json_array_size(g.calls), 0);
  assert_string_equal(g.finish, "stop");
  ci_srv_gen_free(&g);
  /* /v1/completions: nothing is parsed, specials are dropped */
  memset(&job, 0, sizeof job);
  job.raw_text = 1;
  run(f, &job, full, N_FULL, CINFER_FINISH_STOP, &g, &out);
  assert_null(g.reasoning.data);
  assert_string_equal(g.content.data,
                      "thought\nI thinkHello worldcall:get_weather{city:Paris,days:3}");
  assert_int_equal(g.reasoning_tokens, 0);
  ci_srv_gen_free(&g);
}

static void test_cut_by_max_tokens(void **state) {
  fixture *f = *state;
  ci_srv_job job = {0};
  ci_srv_gen g;
  streamed out;
  /* a call cut after its first string: closed best effort, still a tool call */
  run(f, &job, full, 16, CINFER_FINISH_LENGTH, &g, &out);
  assert_int_equal(json_array_size(g.calls), 1);
  assert_string_equal(json_string_value(json_object_get(json_array_get(g.calls, 0), "arguments")),
                      "{\"city\":\"Paris\"}");
  assert_string_equal(g.finish, "tool_calls");
  ci_srv_gen_free(&g);
  /* a channel cut by max_tokens surfaces its reasoning */
  run(f, &job, full, 5, CINFER_FINISH_LENGTH, &g, &out);
  assert_string_equal(out.reasoning, "I think");
  assert_null(g.content.data);
  assert_string_equal(g.finish, "length");
  ci_srv_gen_free(&g);
}

static void test_prompt_primed_channel(void **state) {
  fixture *f = *state;
  /* the template closes an empty channel when thinking is off: the reply starts as content */
  json_t *messages = json_loads("[{\"role\":\"user\",\"content\":\"hi\"}]", 0, NULL);
  json_t *thinking = json_pack("{s:b}", "enable_thinking", 1);
  ci_srv_job job = {0};
  char *err = NULL;
  assert_int_equal(ci_srv_tokenize_chat(&f->server, messages, NULL, NULL, &job, &err), 0);
  ci_srv_gen g;
  streamed out;
  const int32_t plain[] = {T_HELLO, T_WORLD};
  run(f, &job, plain, 2, CINFER_FINISH_STOP, &g, &out);
  assert_string_equal(out.content, "Hello world");
  assert_string_equal(out.reasoning, "");
  ci_srv_gen_free(&g);
  ci_srv_job_free(&job);
  /* thinking on: the prompt ends inside the open channel, its name line included */
  assert_int_equal(ci_srv_tokenize_chat(&f->server, messages, NULL, thinking, &job, &err), 0);
  json_decref(thinking);
  json_decref(messages);
  const int32_t rest[] = {T_I, T_THINK, T_CH_CLOSE, T_HELLO};
  run(f, &job, rest, 4, CINFER_FINISH_STOP, &g, &out);
  assert_string_equal(out.reasoning, "I think");
  assert_string_equal(out.content, "Hello");
  assert_int_equal(g.reasoning_tokens, 2);
  ci_srv_gen_free(&g);
  ci_srv_job_free(&job);
}

static void test_timings(void **state) {
  fixture *f = *state;
  ci_srv_job job = {0};
  ci_srv_gen g;
  streamed out;
  const int32_t ids[] = {T_HELLO, T_WORLD, T_HELLO, T_WORLD};
  run(f, &job, ids, 4, CINFER_FINISH_STOP, &g, &out);
  json_t *t = ci_srv_gen_timings(&g);
  /* prompt_n = P - p = 8 over 0.5 s; predicted_n = g = 5 (EOS included), (g - 1) / 2 s */
  assert_int_equal(json_integer_value(json_object_get(t, "prompt_n")), 8);
  assert_true(fabs(json_real_value(json_object_get(t, "prompt_ms")) - 500) < 1e-6);
  assert_true(fabs(json_real_value(json_object_get(t, "prompt_per_second")) - 16) < 1e-6);
  assert_int_equal(json_integer_value(json_object_get(t, "predicted_n")), 5);
  assert_true(fabs(json_real_value(json_object_get(t, "predicted_ms")) - 2000) < 1e-6);
  assert_true(fabs(json_real_value(json_object_get(t, "predicted_per_second")) - 2) < 1e-6);
  assert_int_equal(json_integer_value(json_object_get(t, "cache_n")), 2);
  assert_int_equal(json_integer_value(json_object_get(t, "draft_n")), 0);
  assert_int_equal(json_integer_value(json_object_get(t, "draft_accepted_n")), 0);
  json_decref(t);
  ci_srv_gen_free(&g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_formats_detected),
      cmocka_unit_test(test_gemma_reasoning_and_calls),
      cmocka_unit_test(test_tool_choice_none),
      cmocka_unit_test(test_cut_by_max_tokens),
      cmocka_unit_test(test_prompt_primed_channel),
      cmocka_unit_test(test_timings),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
