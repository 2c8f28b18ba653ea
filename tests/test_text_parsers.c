/* Tool-call parsing (hermes JSON, Qwen XML, fail soft, streaming hold-back), the think-tag
 * reasoning split (partial tags across pieces, primed prompts), the Gemma 4 tool-call syntax
 * (values, several calls, truncation) and the Gemma 4 token router (channels, tool-call segments)
 * over a small synthetic tokenizer fed one token at a time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "gemma_markers_tokenizer.h"
#include "base/error.h"
#include "text/detok_stream.h"
#include "text/gemma_output.h"
#include "text/gemma_tool_call.h"
#include "text/reasoning_split.h"
#include "text/tokenizer.h"
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

/* ==== Qwen3.5 (Qwen XML calls as its chat template asks for them) ==== */

static json_t *qwen35_tools(void) {
  return json_loads(
      "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
      "\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
      "\"ratio\":{\"type\":\"number\"},\"hot\":{\"type\":\"boolean\"},\"opts\":{\"type\":"
      "\"object\"},\"hours\":{\"type\":\"array\"},\"maybe\":{\"type\":[\"integer\",\"null\"]},"
      "\"any\":{\"description\":\"no type\"},\"code\":{\"type\":\"string\"}}}}},"
      "{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"parameters\":{\"type\":"
      "\"object\",\"properties\":{}}}}]",
      0, NULL);
}

/* Streams text in pieces of `chunk` bytes through a parser. */
static json_t *chunk_parse(const json_t *t, const char *text, size_t chunk, sink_buf *out) {
  memset(out, 0, sizeof *out);
  ci_tool_parser *p = ci_tool_parser_create(t);
  assert_non_null(p);
  json_t *calls = json_array();
  const size_t n = strlen(text);
  for (size_t i = 0; i < n; i += chunk)
    ci_tool_parser_push(p, text + i, n - i < chunk ? n - i : chunk, calls, content_sink, out);
  ci_tool_parser_finish(p, calls, content_sink, out);
  ci_tool_parser_free(p);
  return calls;
}

static const char *call_args(const json_t *calls, size_t i) {
  return json_string_value(json_object_get(json_array_get(calls, i), "arguments"));
}

static const char *call_name(const json_t *calls, size_t i) {
  return json_string_value(json_object_get(json_array_get(calls, i), "name"));
}

/* What a Qwen3.5 model writes after </think>: two calls, the second with a multi-line value. */
static const char qwen35_reply[] =
    "\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
    "<function=get_weather>\n<parameter=city>\nSan Jos\303\251\n</parameter>\n<parameter=code>\n"
    "def f():\n    return 1\n\n</parameter>\n</function>\n</tool_call>\n";

static void test_qwen35_calls_any_chunking(void **state) {
  (void)state;
  json_t *t = qwen35_tools();
  const size_t n = strlen(qwen35_reply);
  for (size_t chunk = 1; chunk <= n; chunk++) {
    sink_buf out;
    json_t *calls = chunk_parse(t, qwen35_reply, chunk, &out);
    if (json_array_size(calls) != 2)
      fail_msg("chunk %zu: %zu calls", chunk, json_array_size(calls));
    assert_string_equal(call_name(calls, 0), "get_weather");
    assert_string_equal(call_args(calls, 0), "{\"city\":\"New York\",\"days\":3}");
    /* one newline either side belongs to the format; the value's own blank line stays */
    assert_string_equal(call_args(calls, 1),
                        "{\"city\":\"San Jos\303\251\",\"code\":\"def f():\\n    return 1\\n\"}");
    /* the text before the first call is content; newlines between and after calls are not */
    if (strcmp(out.text, "\n\n")) fail_msg("chunk %zu: content \"%s\"", chunk, out.text);
    json_decref(calls);
  }
  json_decref(t);
}

static void expect_args(const json_t *t, const char *params, const char *want) {
  char text[1024];
  snprintf(text, sizeof text, "<tool_call>\n<function=get_weather>\n%s</function>\n</tool_call>",
           params);
  sink_buf out;
  json_t *calls = chunk_parse(t, text, 7, &out);
  if (json_array_size(calls) != 1) fail_msg("%s: no call (content \"%s\")", params, out.text);
  if (strcmp(call_args(calls, 0), want))
    fail_msg("%s: got %s, want %s", params, call_args(calls, 0), want);
  assert_string_equal(out.text, "");
  json_decref(calls);
}

#define PARAM(k, v) "<parameter=" k ">\n" v "\n</parameter>\n"

static void test_qwen35_value_types(void **state) {
  (void)state;
  json_t *t = qwen35_tools();
  /* declared types convert; text that does not fit its type stays a string */
  expect_args(t, PARAM("city", "42") PARAM("days", "7") PARAM("ratio", "2.5"),
              "{\"city\":\"42\",\"days\":7,\"ratio\":2.5}");
  expect_args(t, PARAM("days", "three") PARAM("ratio", "4.0") PARAM("hot", "True"),
              "{\"days\":\"three\",\"ratio\":4,\"hot\":true}");
  expect_args(t, PARAM("hot", "FALSE") PARAM("opts", "{\"unit\": \"c\"}") PARAM("hours", "[9, 12]"),
              "{\"hot\":false,\"opts\":{\"unit\":\"c\"},\"hours\":[9,12]}");
  expect_args(t, PARAM("ratio", "0x10") PARAM("days", "1e3") PARAM("maybe", "inf"),
              "{\"ratio\":\"0x10\",\"days\":\"1e3\",\"maybe\":\"inf\"}");
  expect_args(t, PARAM("opts", "[1]") PARAM("hours", "not json") PARAM("hot", "maybe"),
              "{\"opts\":\"[1]\",\"hours\":\"not json\",\"hot\":\"maybe\"}");
  /* null in any case is null; a type list tries its non-null types */
  expect_args(t, PARAM("city", "null") PARAM("maybe", "5") PARAM("days", "NULL"),
              "{\"city\":null,\"maybe\":5,\"days\":null}");
  /* no type, or a parameter the schema does not declare: the text as it is */
  expect_args(t, PARAM("any", "5") PARAM("extra", "{\"a\": 1}"),
              "{\"any\":\"5\",\"extra\":\"{\\\"a\\\": 1}\"}");
  /* a missing </parameter> ends at the next <parameter= or at </function> */
  expect_args(t, "<parameter=city>\nParis\n<parameter=days>\n3\n",
              "{\"city\":\"Paris\",\"days\":3}");
  /* no parameters: empty arguments; the tool without properties takes its text as strings */
  sink_buf out;
  json_t *calls =
      chunk_parse(t, "<tool_call>\n<function=get_time>\n</function>\n</tool_call>Done.", 3, &out);
  assert_int_equal(json_array_size(calls), 1);
  assert_string_equal(call_name(calls, 0), "get_time");
  assert_string_equal(call_args(calls, 0), "{}");
  assert_string_equal(out.text, "Done."); /* text after a call is content */
  json_decref(calls);
  json_decref(t);
}

static void test_qwen35_malformed(void **state) {
  (void)state;
  json_t *t = qwen35_tools();
  sink_buf out;
  /* cut by max_tokens inside a value: closed best effort */
  json_t *calls = chunk_parse(
      t, "Let me look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", 5, &out);
  assert_int_equal(json_array_size(calls), 1);
  assert_string_equal(call_args(calls, 0), "{\"city\":\"Par\"}");
  assert_string_equal(out.text, "Let me look.\n");
  json_decref(calls);
  /* malformed or unknown: released as content, byte for byte */
  const char *bad[] = {
      "<tool_call>\n<function=>\n</function>\n</tool_call>",
      "<tool_call>\n<function=rm_rf>\n<parameter=path>\n/\n</parameter>\n</function>\n</tool_call>",
      "<tool_call>\n<function=get_weather\n</tool_call>",
      "<tool_call>\nno function here\n</tool_call>",
      "<tool_call>\n<function=get_weather>\n<parameter=city", /* cut inside a tag */
      "<function=get_wea",
      "a < b <tool_c",
      "<tool_call><tool_call></tool_call>",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    for (size_t chunk = 1; chunk <= 9; chunk += 4) {
      calls = chunk_parse(t, bad[i], chunk, &out);
      if (!strcmp(bad[i], "<tool_call>\n<function=get_weather>\n<parameter=city")) {
        /* the function is complete: a call without arguments, the cut tag dropped */
        assert_int_equal(json_array_size(calls), 1);
        assert_string_equal(call_args(calls, 0), "{}");
      } else {
        if (json_array_size(calls)) fail_msg("%s: parsed as a call", bad[i]);
        if (strcmp(out.text, bad[i])) fail_msg("%s: content \"%s\"", bad[i], out.text);
      }
      json_decref(calls);
    }
  }
  /* arbitrary bytes around markers never crash and lose nothing when no call parses */
  unsigned seed = 12345;
  const char *pieces[] = {"<tool_call>", "</tool_call>", "<function=", "</function>",
                          "<parameter=", "</parameter>", ">",          "\n",
                          "x",           "get_weather",  "\303"};
  for (int round = 0; round < 200; round++) {
    char text[400] = "";
    for (int k = 0; k < 20; k++) {
      seed = seed * 1103515245u + 12345u;
      strcat(text, pieces[(seed >> 16) % (sizeof pieces / sizeof pieces[0])]);
    }
    calls = chunk_parse(t, text, 1 + round % 6, &out);
    if (!json_array_size(calls) && strcmp(out.text, text))
      fail_msg("%s: content \"%s\"", text, out.text);
    json_decref(calls);
  }
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

/* ==== Gemma 4 ==== */

/* The compact JSON of a Gemma value (NULL when it does not parse); caller frees. */
static char *gemma_json(const char *text, int truncated) {
  json_t *v = ci_gemma_value_to_json(text, strlen(text), truncated);
  char *out = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER) : NULL;
  json_decref(v);
  return out;
}

static void expect_gemma(const char *text, int truncated, const char *want) {
  char *got = gemma_json(text, truncated);
  if (!want) {
    if (got) fail_msg("%s parsed as %s", text, got);
    return;
  }
  if (!got || strcmp(got, want)) fail_msg("%s: got %s, want %s", text, got ? got : "NULL", want);
  free(got);
}

#define Q "<|\"|>"

static void test_gemma_values(void **state) {
  (void)state;
  expect_gemma("{city:" Q "Paris" Q ",days:3}", 0, "{\"city\":\"Paris\",\"days\":3}");
  expect_gemma("{a:[1, 2,{b:" Q "say \"hi\"\n" Q "}], c:true,d:null,e:-1.5e2}", 0,
               "{\"a\":[1,2,{\"b\":\"say \\\"hi\\\"\\n\"}],\"c\":true,\"d\":null,\"e\":-150.0}");
  expect_gemma("{q:" Q "a{b},c:d]" Q "}", 0, "{\"q\":\"a{b},c:d]\"}");
  expect_gemma("{unit:celsius, n:\"json \\\" str\"}", 0,
               "{\"unit\":\"celsius\",\"n\":\"json \\\" str\"}");
  expect_gemma("{" Q "quoted key" Q ":1,}", 0, "{\"quoted key\":1}");
  expect_gemma("{}", 0, "{}");
  expect_gemma("{a:1", 0, NULL);
  expect_gemma("{a:1]", 0, NULL);
  expect_gemma("{a:" Q "open", 0, NULL);
  /* cut by max_tokens: closed best effort */
  expect_gemma("{city:" Q "Par", 1, "{\"city\":\"Par\"}");
  expect_gemma("{a:1,b:", 1, "{\"a\":1,\"b\":null}");
  expect_gemma("{a:[1,2", 1, "{\"a\":[1,2]}");
  expect_gemma("{a:1,bc", 1, "{\"a\":1}");
  expect_gemma("{a:{b:\"x", 1, "{\"a\":{\"b\":\"x\"}}");
}

static json_t *weather_tools(void) {
  return json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}]", 0, NULL);
}

static const char *call_field(const json_t *calls, size_t i, const char *key) {
  return json_string_value(json_object_get(json_array_get(calls, i), key));
}

static void test_gemma_segments(void **state) {
  (void)state;
  json_t *t = weather_tools();
  json_t *calls = json_array();
  const char *two =
      "call:get_weather{city:" Q "Paris" Q "}\ncall:get_weather{city:" Q "Rome" Q ",days:2}";
  assert_int_equal(ci_gemma_tool_calls_parse(t, two, strlen(two), 0, calls), 2);
  assert_string_equal(call_field(calls, 0, "name"), "get_weather");
  assert_string_equal(call_field(calls, 0, "arguments"), "{\"city\":\"Paris\"}");
  assert_string_equal(call_field(calls, 1, "arguments"), "{\"city\":\"Rome\",\"days\":2}");
  json_array_clear(calls);
  const char *unknown = "call:rm_rf{path:" Q "/" Q "}";
  assert_int_equal(ci_gemma_tool_calls_parse(t, unknown, strlen(unknown), 0, calls), -1);
  assert_int_equal(ci_gemma_tool_calls_parse(NULL, unknown, strlen(unknown), 0, calls), 1);
  json_array_clear(calls);
  /* one bad call fails the whole segment */
  const char *mixed = "call:get_weather{city:" Q "Paris" Q "} hello";
  assert_int_equal(ci_gemma_tool_calls_parse(t, mixed, strlen(mixed), 0, calls), -1);
  assert_int_equal(ci_gemma_tool_calls_parse(t, "", 0, 0, calls), -1);
  const char *open = "call:get_weather{city:" Q "Pa";
  assert_int_equal(ci_gemma_tool_calls_parse(t, open, strlen(open), 0, calls), -1);
  assert_int_equal(json_array_size(calls), 0);
  assert_int_equal(ci_gemma_tool_calls_parse(t, open, strlen(open), 1, calls), 1);
  assert_string_equal(call_field(calls, 0, "arguments"), "{\"city\":\"Pa\"}");
  assert_int_equal(ci_gemma_tool_calls_parse(t, "call:get_weather", 16, 1, calls), 1);
  assert_string_equal(call_field(calls, 1, "arguments"), "{}");
  json_decref(calls);
  json_decref(t);
}

static ci_tokenizer *gemma_tokenizer(void) {
  ci_tokenizer *tok =
      ci_tokenizer_load_json(gemma_markers_tokenizer_json, strlen(gemma_markers_tokenizer_json));
  if (!tok) fail_msg("synthetic tokenizer: %s", ci_last_error());
  return tok;
}

typedef struct {
  const ci_tokenizer *tok;
  ci_detok_stream *detok; /* the caller's content decoder */
  char content[512], reasoning[512];
  json_t *calls;
} router_out;

static void r_reasoning(void *ctx, const char *text, size_t len) {
  strncat(((router_out *)ctx)->reasoning, text, len);
}
static void r_content(void *ctx, const char *text, size_t len) {
  strncat(((router_out *)ctx)->content, text, len);
}
static void r_call(void *ctx, json_t *call) {
  json_array_append(((router_out *)ctx)->calls, call);
}
static const ci_gemma_sinks router_sinks = {r_reasoning, r_content, r_call};

/* Feeds ids one at a time as the server does: the router first, content to a detok stream. */
static void route(const ci_tokenizer *tok, const ci_gemma_output_options *o, const int32_t *ids,
                  size_t n, router_out *out) {
  memset(out, 0, sizeof *out);
  out->calls = json_array();
  out->detok = ci_detok_stream_create(tok, NULL, 0, 1);
  ci_gemma_markers m;
  ci_gemma_markers_find(tok, &m);
  ci_gemma_output *g = ci_gemma_output_create(tok, &m, o);
  assert_non_null(g);
  const char *piece;
  size_t len;
  for (size_t i = 0; i < n; i++) {
    const int r = ci_gemma_output_push(g, ids[i], &router_sinks, out);
    assert_true(r >= 0);
    if (r == 0 && ci_detok_stream_push(out->detok, ids[i], &piece, &len) >= 0)
      r_content(out, piece, len);
  }
  if (ci_detok_stream_finish(out->detok, &piece, &len) >= 0) r_content(out, piece, len);
  ci_gemma_output_finish(g, &router_sinks, out);
  ci_gemma_output_free(g);
  ci_detok_stream_free(out->detok);
}

static void test_gemma_router(void **state) {
  (void)state;
  ci_tokenizer *tok = gemma_tokenizer();
  json_t *t = weather_tools();
  ci_gemma_output_options o = {.channels = 1, .tool_calls = 1, .tools = t};
  router_out out;
  ci_gemma_markers m;
  ci_gemma_markers_find(tok, &m);
  assert_int_equal(m.channel_open, T_CH_OPEN);
  assert_int_equal(m.response_open, T_RESPONSE);
  assert_true(ci_gemma_markers_have_channels(&m) && ci_gemma_markers_have_calls(&m));

  /* reasoning, content, then a tool call: markup never reaches the content */
  const int32_t full[] = {T_CH_OPEN, T_THOUGHT, T_NL,        T_I,     T_THINK,   T_CH_CLOSE,
                          T_HELLO,   T_WORLD,   T_CALL_OPEN, T_CALL,  T_WEATHER, T_LBRACE,
                          T_CITY,    T_QUOTE,   T_PARIS,     T_QUOTE, T_COMMA,   T_DAYS,
                          T_3,       T_RBRACE,  T_CALL_CLOSE};
  route(tok, &o, full, sizeof full / sizeof full[0], &out);
  assert_string_equal(out.reasoning, "I think");
  assert_string_equal(out.content, "Hello world");
  assert_int_equal(json_array_size(out.calls), 1);
  assert_string_equal(call_field(out.calls, 0, "arguments"), "{\"city\":\"Paris\",\"days\":3}");
  json_decref(out.calls);

  /* an empty channel yields nothing; a stray close is dropped */
  const int32_t empty[] = {T_CH_OPEN, T_THOUGHT, T_NL, T_CH_CLOSE, T_HELLO, T_CH_CLOSE};
  route(tok, &o, empty, 6, &out);
  assert_string_equal(out.reasoning, "");
  assert_string_equal(out.content, "Hello");
  json_decref(out.calls);

  /* a channel cut by max_tokens surfaces its partial reasoning; a cut name line nothing */
  const int32_t cut[] = {T_CH_OPEN, T_THOUGHT, T_NL, T_I, T_THINK};
  route(tok, &o, cut, 5, &out);
  assert_string_equal(out.reasoning, "I think");
  json_decref(out.calls);
  route(tok, &o, cut, 2, &out);
  assert_string_equal(out.reasoning, "");
  assert_string_equal(out.content, "");
  json_decref(out.calls);

  /* a prompt that ends inside an open channel (name line included) */
  const char primed[] = "<|turn>model\n<|channel>thought\n";
  int name_done;
  assert_int_equal(ci_gemma_prompt_open(primed, strlen(primed), &name_done), 1);
  assert_int_equal(name_done, 1);
  assert_int_equal(ci_gemma_prompt_open("<|channel>thought\n<channel|>", 28, &name_done), 0);
  assert_int_equal(ci_gemma_prompt_open("<|channel>", 10, &name_done), 1);
  assert_int_equal(name_done, 0);
  ci_gemma_output_options open = o;
  open.in_channel = open.name_done = 1;
  const int32_t rest[] = {T_I, T_THINK, T_CH_CLOSE, T_HELLO};
  route(tok, &open, rest, 4, &out);
  assert_string_equal(out.reasoning, "I think");
  assert_string_equal(out.content, "Hello");
  json_decref(out.calls);

  /* a tool call cut by max_tokens is closed best effort */
  const int32_t cut_call[] = {T_HELLO,  T_CALL_OPEN, T_CALL,  T_WEATHER,
                              T_LBRACE, T_CITY,      T_QUOTE, T_PARIS};
  route(tok, &o, cut_call, 8, &out);
  assert_string_equal(out.content, "Hello");
  assert_int_equal(json_array_size(out.calls), 1);
  assert_string_equal(call_field(out.calls, 0, "arguments"), "{\"city\":\"Paris\"}");
  json_decref(out.calls);

  /* fail soft: a segment that does not parse is released as content, markers included */
  const int32_t bad[] = {T_CALL_OPEN, T_HELLO, T_WORLD, T_CALL_CLOSE, T_I};
  route(tok, &o, bad, 5, &out);
  assert_int_equal(json_array_size(out.calls), 0);
  assert_string_equal(out.content, "<|tool_call>Hello world<tool_call|>I");
  json_decref(out.calls);

  /* parsing off (tool_choice none, other families): the markers are skipped specials */
  ci_gemma_output_options off = {0};
  route(tok, &off, full, sizeof full / sizeof full[0], &out);
  assert_string_equal(out.reasoning, "");
  assert_string_equal(out.content,
                      "thought\nI thinkHello worldcall:get_weather{city:Paris,days:3}");
  assert_int_equal(json_array_size(out.calls), 0);
  json_decref(out.calls);

  json_decref(t);
  ci_tokenizer_free(tok);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hermes_json),
      cmocka_unit_test(test_qwen_xml),
      cmocka_unit_test(test_fail_soft),
      cmocka_unit_test(test_reasoning_split),
      cmocka_unit_test(test_qwen35_calls_any_chunking),
      cmocka_unit_test(test_qwen35_value_types),
      cmocka_unit_test(test_qwen35_malformed),
      cmocka_unit_test(test_gemma_values),
      cmocka_unit_test(test_gemma_segments),
      cmocka_unit_test(test_gemma_router),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
