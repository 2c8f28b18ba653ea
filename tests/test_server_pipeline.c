/* The server's text pipeline without a model or a socket: a hand-built ci_server over a synthetic
 * word-level tokenizer with the Gemma 4 markers, a template mentioning <|channel> and a chat
 * format for architecture gemma4_text (cinfer_chat_format_create); engine events are applied one
 * at a time as the HTTP thread applies them. Checks Gemma channel reasoning and tool calls reach
 * reasoning / tool_calls (markup never in a content delta), finish reasons, reasoning_tokens,
 * tool_choice none, a call cut by max_tokens, <|tool_response> in the EOS set, and the timings
 * object. A second group does the same for Qwen3.5: its real chat template (thinking on and off),
 * think-tag reasoning and Qwen XML tool calls decoded as text. */
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

/* A template that drops `tools`: the tools go into a system prompt, assistant tool calls become
 * hermes text (never "None"). */
static void test_tool_prompt_injection(void **state) {
  fixture *f = *state;
  json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                             "\"parameters\":{\"type\":\"object\"}}}]",
                             0, NULL);
  json_t *messages = json_loads(
      "[{\"role\":\"user\",\"content\":\"Weather?\"},{\"role\":\"assistant\",\"content\":null,"
      "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":"
      "\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}}]}]",
      0, NULL);
  assert_non_null(tools);
  assert_non_null(messages);
  json_t *injected = ci_srv_inject_tool_prompt(messages, tools);
  assert_non_null(injected);
  assert_int_equal(json_array_size(injected), 3);
  const char *system = json_string_value(json_object_get(json_array_get(injected, 0), "content"));
  assert_non_null(strstr(system, "get_weather"));
  assert_non_null(strstr(system, "<tool_call>"));
  json_t *request = json_pack("{s:O, s:b}", "messages", injected, "add_generation_prompt", 1);
  char *request_text = json_dumps(request, JSON_COMPACT);
  char *text = NULL;
  size_t len = 0;
  assert_int_equal(cinfer_chat_template_render(f->tmpl, request_text, &text, &len), CINFER_OK);
  assert_null(strstr(text, "None"));
  assert_non_null(strstr(text, "<|turn>assistant\n<tool_call>\n{\"name\":\"get_weather\","
                               "\"arguments\":{\"city\":\"Paris\"}}\n</tool_call><turn|>"));
  cinfer_free(text);
  free(request_text);
  json_decref(request);
  /* a first system message gets the prompt appended */
  json_t *with_system = json_loads("[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                                   "{\"role\":\"user\",\"content\":\"Hi\"}]",
                                   0, NULL);
  json_t *merged = ci_srv_inject_tool_prompt(with_system, tools);
  assert_int_equal(json_array_size(merged), 2);
  system = json_string_value(json_object_get(json_array_get(merged, 0), "content"));
  const char *head = "Be brief.\n\nYou can call functions.";
  assert_true(strncmp(system, head, strlen(head)) == 0);
  json_decref(merged);
  json_decref(with_system);
  json_decref(injected);
  json_decref(messages);
  json_decref(tools);
}

/* ==== Qwen3.5: the real chat template, think tags and Qwen XML tool calls as text ==== */

enum {
  Q_I = 1,
  Q_THINK,
  Q_NL,
  Q_NL2,
  Q_HELLO,
  Q_WORLD,
  Q_PARIS,
  Q_FN,
  Q_FN_END,
  Q_CITY,
  Q_PARAM_END,
  Q_DAYS,
  Q_3,
  Q_THINK_OPEN = 20,
  Q_THINK_CLOSE,
  Q_CALL_OPEN,
  Q_CALL_CLOSE,
  Q_IM_END
};

/* Qwen's <think>, </think>, <tool_call>, </tool_call> are added tokens that are not special: they
 * decode into the text, where the think-tag split and the text tool-call parser find them. */
static const char qwen35_tokenizer_json[] =
    "{\"model\": {\"type\": \"WordLevel\", \"unk_token\": \"<unk>\", \"vocab\": {\"<unk>\": 0, "
    "\"I\": 1, \" think\": 2, \"\\n\": 3, \"\\n\\n\": 4, \"Hello\": 5, \" world\": 6, "
    "\"Paris\": 7, \"<function=get_weather>\": 8, \"</function>\": 9, \"<parameter=city>\": 10, "
    "\"</parameter>\": 11, \"<parameter=days>\": 12, \"3\": 13, \"<think>\": 20, "
    "\"</think>\": 21, \"<tool_call>\": 22, \"</tool_call>\": 23, \"<|im_end|>\": 24}}, "
    "\"decoder\": {\"type\": \"Fuse\"}, \"added_tokens\": ["
    "{\"id\": 20, \"content\": \"<think>\", \"special\": false},"
    "{\"id\": 21, \"content\": \"</think>\", \"special\": false},"
    "{\"id\": 22, \"content\": \"<tool_call>\", \"special\": false},"
    "{\"id\": 23, \"content\": \"</tool_call>\", \"special\": false},"
    "{\"id\": 24, \"content\": \"<|im_end|>\", \"special\": true}]}";

static int setup_qwen35(void **state) {
  fixture *f = calloc(1, sizeof *f);
  if (!f ||
      cinfer_tokenizer_from_json(qwen35_tokenizer_json, strlen(qwen35_tokenizer_json), &f->tok) !=
          CINFER_OK ||
      cinfer_chat_template_load(CI_FIXTURE_DIR "/../golden/template/qwen35", &f->tmpl) !=
          CINFER_OK ||
      cinfer_chat_format_create(f->tok, f->tmpl, "qwen3_5_text", &f->format) != CINFER_OK)
    return -1;
  cinfer_params_init(&f->defaults, NULL);
  f->server.o.tokenizer = f->tok;
  f->server.o.chat_template = f->tmpl;
  f->server.o.chat_format = f->format;
  f->server.o.vocab = 25;
  f->server.o.defaults = &f->defaults;
  pthread_mutex_init(&f->server.metrics_mu, NULL);
  ci_server_detect_formats(&f->server);
  *state = f;
  return 0;
}

static json_t *qwen35_weather_tools(void) {
  return json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"
                    "\"string\"},\"days\":{\"type\":\"integer\"}}}}}]",
                    0, NULL);
}

/* A Qwen3.5 job for one user message: the prompt rendered by the real template (tools declared,
 * thinking as asked), the tools kept for parsing. */
static void qwen35_job(fixture *f, int thinking, ci_srv_job *job) {
  memset(job, 0, sizeof *job);
  json_t *messages = json_loads("[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}]", 0, NULL);
  json_t *tools = qwen35_weather_tools();
  json_t *kwargs = json_pack("{s:b}", "enable_thinking", thinking);
  char *err = NULL;
  if (ci_srv_tokenize_chat(&f->server, messages, tools, kwargs, job, &err))
    fail_msg("tokenize_chat: %s", err);
  job->tools = tools; /* owned by the job */
  json_decref(kwargs);
  json_decref(messages);
}

/* Reasoning, then two calls: what Qwen3.5 writes with thinking on (the prompt opened <think>). */
static const int32_t qwen35_calls[] = {
    Q_I,  Q_THINK,  Q_NL, Q_THINK_CLOSE, Q_NL2, Q_CALL_OPEN, Q_NL, Q_FN,        Q_NL, Q_CITY,
    Q_NL, Q_PARIS,  Q_NL, Q_PARAM_END,   Q_NL,  Q_DAYS,      Q_NL, Q_3,         Q_NL, Q_PARAM_END,
    Q_NL, Q_FN_END, Q_NL, Q_CALL_CLOSE,  Q_NL,  Q_CALL_OPEN, Q_NL, Q_FN,        Q_NL, Q_CITY,
    Q_NL, Q_HELLO,  Q_NL, Q_PARAM_END,   Q_NL,  Q_FN_END,    Q_NL, Q_CALL_CLOSE};
enum { N_QWEN35_CALLS = sizeof qwen35_calls / sizeof qwen35_calls[0] };

static void test_qwen35_reasoning_and_calls(void **state) {
  fixture *f = *state;
  assert_true(cinfer_chat_format_has_reasoning(f->format)); /* think tags */
  assert_int_equal(f->server.n_chat_stop_ids, 0);           /* no Gemma call tokens */
  ci_srv_job job;
  qwen35_job(f, 1, &job);
  /* the template opened <think>: the reply starts inside reasoning */
  const char *tail = "<|im_start|>assistant\n<think>\n";
  assert_true(job.rendered_len >= strlen(tail));
  assert_memory_equal(job.rendered + job.rendered_len - strlen(tail), tail, strlen(tail));
  assert_non_null(strstr(job.rendered, "<function=example_function_name>"));
  ci_srv_gen g;
  streamed out;
  run(f, &job, qwen35_calls, N_QWEN35_CALLS, CINFER_FINISH_STOP, &g, &out);
  assert_string_equal(out.reasoning, "I think\n");
  assert_string_equal(g.reasoning.data, "I think\n");
  /* only the newlines after </think> are content; no markup ever reaches a content delta */
  assert_string_equal(out.content, "\n\n");
  assert_null(strstr(out.content, "<"));
  assert_int_equal(json_array_size(g.calls), 2);
  assert_int_equal(out.calls, 2);
  assert_string_equal(json_string_value(json_object_get(json_array_get(g.calls, 0), "name")),
                      "get_weather");
  assert_string_equal(json_string_value(json_object_get(json_array_get(g.calls, 0), "arguments")),
                      "{\"city\":\"Paris\",\"days\":3}");
  assert_string_equal(json_string_value(json_object_get(json_array_get(g.calls, 1), "arguments")),
                      "{\"city\":\"Hello\"}");
  assert_string_equal(g.finish, "tool_calls");
  assert_int_equal(g.reasoning_tokens, 3); /* I think \n */
  ci_srv_gen_free(&g);
  /* cut by max_tokens inside the first call's second value: closed best effort */
  run(f, &job, qwen35_calls, 18, CINFER_FINISH_LENGTH, &g, &out);
  assert_int_equal(json_array_size(g.calls), 1);
  assert_string_equal(json_string_value(json_object_get(json_array_get(g.calls, 0), "arguments")),
                      "{\"city\":\"Paris\",\"days\":3}");
  assert_string_equal(g.finish, "tool_calls");
  ci_srv_gen_free(&g);
  /* cut inside reasoning: what it holds is reasoning, nothing is content */
  run(f, &job, qwen35_calls, 2, CINFER_FINISH_LENGTH, &g, &out);
  assert_string_equal(out.reasoning, "I think");
  assert_null(g.content.data);
  assert_string_equal(g.finish, "length");
  ci_srv_gen_free(&g);
  ci_srv_job_free(&job);
}

static void test_qwen35_thinking_off(void **state) {
  fixture *f = *state;
  ci_srv_job job;
  qwen35_job(f, 0, &job);
  /* enable_thinking false: the template closed an empty think block, the reply is content */
  const char *tail = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
  assert_memory_equal(job.rendered + job.rendered_len - strlen(tail), tail, strlen(tail));
  const int32_t answer[] = {Q_HELLO, Q_WORLD};
  ci_srv_gen g;
  streamed out;
  run(f, &job, answer, 2, CINFER_FINISH_STOP, &g, &out);
  assert_string_equal(out.content, "Hello world");
  assert_string_equal(out.reasoning, "");
  assert_int_equal(json_array_size(g.calls), 0);
  assert_string_equal(g.finish, "stop");
  ci_srv_gen_free(&g);
  /* a call after the answer's text: the text is content, the call a call */
  const int32_t text_then_call[] = {Q_HELLO,     Q_NL2,  Q_CALL_OPEN, Q_NL,    Q_FN,
                                    Q_NL,        Q_CITY, Q_NL,        Q_PARIS, Q_NL,
                                    Q_PARAM_END, Q_NL,   Q_FN_END,    Q_NL,    Q_CALL_CLOSE};
  run(f, &job, text_then_call, sizeof text_then_call / sizeof text_then_call[0], CINFER_FINISH_STOP,
      &g, &out);
  assert_string_equal(out.content, "Hello\n\n");
  assert_int_equal(json_array_size(g.calls), 1);
  assert_string_equal(json_string_value(json_object_get(json_array_get(g.calls, 0), "arguments")),
                      "{\"city\":\"Paris\"}");
  ci_srv_gen_free(&g);
  /* tool_choice none: nothing is parsed, the markup stays content */
  job.tools_off = 1;
  run(f, &job, text_then_call, 6, CINFER_FINISH_LENGTH, &g, &out);
  assert_string_equal(out.content, "Hello\n\n<tool_call>\n<function=get_weather>\n");
  assert_int_equal(json_array_size(g.calls), 0);
  ci_srv_gen_free(&g);
  ci_srv_job_free(&job);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_formats_detected),
      cmocka_unit_test(test_gemma_reasoning_and_calls),
      cmocka_unit_test(test_tool_choice_none),
      cmocka_unit_test(test_cut_by_max_tokens),
      cmocka_unit_test(test_prompt_primed_channel),
      cmocka_unit_test(test_timings),
      cmocka_unit_test(test_tool_prompt_injection),
  };
  const struct CMUnitTest qwen35[] = {
      cmocka_unit_test(test_qwen35_reasoning_and_calls),
      cmocka_unit_test(test_qwen35_thinking_off),
  };
  const int failed = cmocka_run_group_tests(tests, setup, teardown);
  return failed + cmocka_run_group_tests(qwen35, setup_qwen35, teardown);
}
