/* Tool-call parsing (hermes JSON, Qwen XML, fail soft, streaming hold-back) and the think-tag
 * reasoning split (partial tags across pieces, primed prompts). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "text/reasoning_split.h"
#include "text/tool_call_parse.h"

#include <string.h>

typedef struct {
  char text[512];
  char reasoning[512];
} sink_buf;

static void content_sink(void *ctx, const char *text, size_t len) {
  sink_buf *b = ctx;
  strncat(b->text, text, len);
}

static void split_sink(void *ctx, int is_reasoning, const char *text, size_t len) {
  sink_buf *b = ctx;
  strncat(is_reasoning ? b->reasoning : b->text, text, len);
}

static json_t *tools(void) {
  return json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
                    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"
                    "\"days\":{\"type\":\"integer\"}}}}}]",
                    0, NULL);
}

/* Streams text one byte at a time through a parser. */
static json_t *stream_parse(const json_t *t, const char *text, sink_buf *out) {
  ci_tool_parser *p = ci_tool_parser_create(t);
  json_t *calls = json_array();
  for (size_t i = 0; text[i]; i++) ci_tool_parser_push(p, text + i, 1, calls, content_sink, out);
  ci_tool_parser_finish(p, calls, content_sink, out);
  ci_tool_parser_free(p);
  return calls;
}

static void test_hermes_json(void **state) {
  (void)state;
  json_t *t = tools();
  sink_buf out = {{0}, {0}};
  json_t *calls = stream_parse(
      t,
      "Sure. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
      "</tool_call>",
      &out);
  assert_string_equal(out.text, "Sure. ");
  assert_int_equal(json_array_size(calls), 1);
  assert_string_equal(json_string_value(json_object_get(json_array_get(calls, 0), "name")),
                      "get_weather");
  assert_string_equal(json_string_value(json_object_get(json_array_get(calls, 0), "arguments")),
                      "{\"city\":\"Paris\"}");
  json_decref(calls);
  json_decref(t);
}

static void test_qwen_xml(void **state) {
  (void)state;
  json_t *t = tools();
  sink_buf out = {{0}, {0}};
  json_t *calls = stream_parse(t,
                               "<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n"
                               "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n"
                               "</tool_call>",
                               &out);
  assert_int_equal(json_array_size(calls), 1);
  /* city is a string in the schema: raw text kept; days is typed */
  assert_string_equal(json_string_value(json_object_get(json_array_get(calls, 0), "arguments")),
                      "{\"city\":\"42\",\"days\":3}");
  assert_string_equal(out.text, "");
  json_decref(calls);
  json_decref(t);
}

static void test_fail_soft(void **state) {
  (void)state;
  json_t *t = tools();
  sink_buf out = {{0}, {0}};
  json_t *calls = stream_parse(t, "a <tool_call>{\"name\": \"rm_rf\"}</tool_call> b", &out);
  assert_int_equal(json_array_size(calls), 0);
  assert_string_equal(out.text, "a <tool_call>{\"name\": \"rm_rf\"}</tool_call> b");
  json_decref(calls);
  memset(&out, 0, sizeof out);
  calls = stream_parse(t, "x < y and <tool", &out); /* a held-back prefix is flushed at finish */
  assert_string_equal(out.text, "x < y and <tool");
  json_decref(calls);
  json_decref(t);
}

static void test_reasoning_split(void **state) {
  (void)state;
  const char *text = "<think>plan it</think>The answer.";
  sink_buf out = {{0}, {0}};
  ci_reasoning_split *s = ci_reasoning_split_create(0);
  for (size_t i = 0; text[i]; i++) ci_reasoning_split_push(s, text + i, 1, split_sink, &out);
  ci_reasoning_split_finish(s, split_sink, &out);
  ci_reasoning_split_free(s);
  assert_string_equal(out.reasoning, "plan it");
  assert_string_equal(out.text, "The answer.");
  memset(&out, 0, sizeof out);
  s = ci_reasoning_split_create(1); /* primed prompt: a bare </think> closes reasoning */
  ci_reasoning_split_push(s, "hmm</thi", 8, split_sink, &out);
  ci_reasoning_split_push(s, "nk>\n\nok", 7, split_sink, &out);
  ci_reasoning_split_finish(s, split_sink, &out);
  ci_reasoning_split_free(s);
  assert_string_equal(out.reasoning, "hmm");
  assert_string_equal(out.text, "\n\nok");
  assert_int_equal(ci_reasoning_prompt_open("a<think>\n", 9), 1);
  assert_int_equal(ci_reasoning_prompt_open("a<think></think>b", 17), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hermes_json),
      cmocka_unit_test(test_qwen_xml),
      cmocka_unit_test(test_fail_soft),
      cmocka_unit_test(test_reasoning_split),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
