/* Qwen3.5 chat through a live `cinfer serve`: the tiny random qwen3_5_text fixture with a
 * word-level test vocabulary that holds Qwen's <think>, </think>, <tool_call>, </tool_call> and
 * XML call pieces, and Qwen3.5's real chat template (tests/golden/template/qwen35). The weights
 * are random, so what the model says is steered, not trusted: with thinking on (the template
 * opens <think>) and </think> banned by logit_bias, the whole reply is reasoning (OpenAI
 * reasoning_content, an Anthropic thinking block); with thinking off it is content; a GBNF
 * grammar makes the model write one Qwen XML call, which comes back as tool_calls (streamed and
 * not) with arguments typed by the tool's schema and no markup in the content; tool_choice
 * "required" or a named function forces one call in that XML format, its values of the schema's
 * types. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "serve_process.h"

#define FIXTURE CI_FIXTURE_DIR "/qwen35"
#define TEMPLATE CI_FIXTURE_DIR "/../golden/template/qwen35/chat_template.jinja"

/* Vocabulary ids the requests steer with. */
enum { V_EOS = 2, V_THINK_CLOSE = 5 };

typedef struct {
  char dir[64];
  serve_process server;
} fixture;

static void write_file(const char *dir, const char *name, const char *text, size_t len) {
  char path[256];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(text, 1, len, f), len);
  assert_int_equal(fclose(f), 0);
}

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("cannot open %s", path);
  char *buf = malloc(1 << 16);
  assert_non_null(buf);
  *len = fread(buf, 1, (1 << 16) - 1, f);
  buf[*len] = '\0';
  fclose(f);
  return buf;
}

/* The test vocabulary (256 ids, the fixture's vocab_size): the special and Qwen marker tokens,
 * the pieces of get_weather and get_time calls, digits, lowercase letters, and filler words. */
static char *tokenizer_json(void) {
  static const char *const words[] = {"<unk>",
                                      "<|endoftext|>",
                                      "<|im_end|>",
                                      "<|im_start|>",
                                      "<think>",
                                      "</think>",
                                      "<tool_call>",
                                      "</tool_call>",
                                      "\n",
                                      "<function=get_weather>",
                                      "</function>",
                                      "<parameter=city>",
                                      "</parameter>",
                                      "<function=get_time>",
                                      "<parameter=days>",
                                      "<parameter=metric>",
                                      "<parameter=zone>",
                                      "0",
                                      "1",
                                      "2",
                                      "3",
                                      "4",
                                      "5",
                                      "6",
                                      "7",
                                      "8",
                                      "9"};
  enum { N_WORDS = sizeof words / sizeof words[0] };
  json_t *vocab = json_object(), *added = json_array();
  assert_non_null(vocab);
  assert_non_null(added);
  for (int i = 0; i < 256; i++) {
    char word[32];
    if (i < N_WORDS)
      snprintf(word, sizeof word, "%s", words[i]);
    else if (i < N_WORDS + 26)
      snprintf(word, sizeof word, "%c", 'a' + (i - N_WORDS));
    else
      snprintf(word, sizeof word, " w%d", i);
    assert_int_equal(json_object_set_new(vocab, word, json_integer(i)), 0);
    if (i >= 1 && i < 8) /* Qwen's <think>, <tool_call>, ... are added but not special */
      json_array_append_new(
          added, json_pack("{s:i, s:s, s:b}", "id", i, "content", word, "special", i <= 3));
  }
  /* words split on whitespace: the prompt's token count follows its words (count_tokens) */
  json_t *tok =
      json_pack("{s:{s:s, s:s, s:o}, s:{s:s}, s:{s:s}, s:o}", "model", "type", "WordLevel",
                "unk_token", "<unk>", "vocab", vocab, "pre_tokenizer", "type", "WhitespaceSplit",
                "decoder", "type", "Fuse", "added_tokens", added);
  assert_non_null(tok);
  char *text = json_dumps(tok, JSON_COMPACT);
  json_decref(tok);
  assert_non_null(text);
  return text;
}

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  assert_non_null(f);
  snprintf(f->dir, sizeof f->dir, "/tmp/cinfer-qwen35-serve-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  size_t len;
  char *text = read_file(FIXTURE "/config.json", &len);
  write_file(f->dir, "config.json", text, len);
  free(text);
  text = read_file(TEMPLATE, &len);
  write_file(f->dir, "chat_template.jinja", text, len);
  free(text);
  text = tokenizer_json();
  write_file(f->dir, "tokenizer.json", text, strlen(text));
  free(text);
  const char config[] = "{\"eos_token\": \"<|im_end|>\", \"pad_token\": \"<|endoftext|>\"}";
  write_file(f->dir, "tokenizer_config.json", config, strlen(config));
  char link[256];
  snprintf(link, sizeof link, "%s/model.safetensors", f->dir);
  assert_int_equal(symlink(FIXTURE "/model.safetensors", link), 0);
  const char *flags[] = {"--threads", "1", "--quiet", NULL};
  if (serve_start(&f->server, f->dir, flags)) fail_msg("cinfer serve did not start on %s", f->dir);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  const int code = serve_stop(&f->server);
  const char *names[] = {"config.json", "chat_template.jinja", "tokenizer.json",
                         "tokenizer_config.json", "model.safetensors"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", f->dir, names[i]);
    unlink(path);
  }
  rmdir(f->dir);
  free(f);
  return code == 0 ? 0 : -1;
}

/* Sends json (NULL: a GET) and returns the parsed 200 response. */
static json_t *request(const fixture *f, const char *path, const char *json) {
  char *body;
  const int status = serve_http(f->server.port, json ? "POST" : "GET", path, NULL, json, &body);
  if (status != 200) fail_msg("%s -> %d %s", path, status, body ? body : "");
  json_t *j = json_loads(body, 0, NULL);
  if (!j) fail_msg("%s: not JSON: %s", path, body);
  free(body);
  return j;
}

static const json_t *first_message(const json_t *response) {
  return json_object_get(json_array_get(json_object_get(response, "choices"), 0), "message");
}

#define TOOLS                                                                                      \
  "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "                \
  "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": "                  \
  "\"string\"}}}}}]"

static void test_models_advertise_reasoning(void **state) {
  fixture *f = *state;
  json_t *r = request(f, "/v1/models", NULL);
  const json_t *model = json_array_get(json_object_get(r, "data"), 0);
  assert_true(json_is_true(json_object_get(model, "reasoning"))); /* think tags detected */
  json_decref(r);
}

static void test_thinking_on_and_off(void **state) {
  fixture *f = *state;
  char req[1024];
  /* thinking on (the template's default): the reply starts inside <think>; with </think> banned
     and EOS ignored, all of it is reasoning */
  snprintf(req, sizeof req,
           "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 6, "
           "\"temperature\": 0, \"ignore_eos\": true, \"logit_bias\": {\"%d\": -100}}",
           V_THINK_CLOSE);
  json_t *r = request(f, "/v1/chat/completions", req);
  const json_t *m = first_message(r);
  const char *reasoning_value = json_string_value(json_object_get(m, "reasoning_content"));
  assert_non_null(reasoning_value);
  assert_true(strlen(reasoning_value) > 0);
  char *reasoning = strdup(reasoning_value);
  assert_non_null(reasoning);
  const char *content = json_string_value(json_object_get(m, "content"));
  assert_true(!content || !*content);
  json_decref(r);
  /* Anthropic: the same reply is a thinking block */
  snprintf(req, sizeof req,
           "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], "
           "\"max_tokens\": 6, \"temperature\": 0, \"ignore_eos\": true, \"logit_bias\": "
           "{\"%d\": -100}, \"thinking\": {\"type\": \"enabled\", \"budget_tokens\": 1024}}",
           V_THINK_CLOSE);
  r = request(f, "/v1/messages", req);
  const json_t *block = json_array_get(json_object_get(r, "content"), 0);
  assert_string_equal(json_string_value(json_object_get(block, "type")), "thinking");
  assert_string_equal(json_string_value(json_object_get(block, "thinking")), reasoning);
  free(reasoning);
  json_decref(r);
  /* an unknown thinking type is a 400 naming the field */
  char *body;
  assert_int_equal(
      serve_http(f->server.port, "POST", "/v1/messages", NULL,
                 "{\"model\": \"m\", \"max_tokens\": 4, \"messages\": [{\"role\": "
                 "\"user\", \"content\": \"Hi\"}], \"thinking\": {\"type\": \"maybe\"}}",
                 &body),
      400);
  assert_non_null(strstr(body, "thinking.type"));
  free(body);
  /* thinking off: the template closes an empty think block, the reply is content */
  snprintf(req, sizeof req,
           "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 6, "
           "\"temperature\": 0, \"ignore_eos\": true, \"logit_bias\": {\"%d\": -100}, "
           "\"chat_template_kwargs\": {\"enable_thinking\": false}}",
           V_THINK_CLOSE);
  r = request(f, "/v1/chat/completions", req);
  m = first_message(r);
  content = json_string_value(json_object_get(m, "content"));
  assert_non_null(content);
  assert_true(strlen(content) > 0);
  assert_null(json_object_get(m, "reasoning_content"));
  json_decref(r);
}

/* A grammar that makes the model write exactly one Qwen XML call (then EOS). */
#define CALL_GRAMMAR                                                                               \
  "\"grammar\": \"root ::= "                                                                       \
  "\\\"<tool_call>\\\\n<function=get_weather>\\\\n<parameter=city>\\\\n\\\" "                      \
  "[a-z] [a-z] [a-z] \\\"\\\\n</parameter>\\\\n</function>\\\\n</tool_call>\\\"\""

static void test_xml_tool_call(void **state) {
  fixture *f = *state;
  const char req[] = "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}], " TOOLS
                     ", " CALL_GRAMMAR ", \"max_tokens\": 40, \"temperature\": 0, "
                     "\"chat_template_kwargs\": {\"enable_thinking\": false}}";
  json_t *r = request(f, "/v1/chat/completions", req);
  const json_t *choice = json_array_get(json_object_get(r, "choices"), 0);
  assert_string_equal(json_string_value(json_object_get(choice, "finish_reason")), "tool_calls");
  const json_t *m = json_object_get(choice, "message");
  const json_t *calls = json_object_get(m, "tool_calls");
  assert_int_equal(json_array_size(calls), 1);
  const json_t *fn = json_object_get(json_array_get(calls, 0), "function");
  assert_string_equal(json_string_value(json_object_get(fn, "name")), "get_weather");
  json_t *args = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, NULL);
  assert_non_null(args);
  const char *city_value = json_string_value(json_object_get(args, "city"));
  assert_non_null(city_value);
  assert_int_equal(strlen(city_value), 3);
  assert_int_equal(strspn(city_value, "abcdefghijklmnopqrstuvwxyz"), 3);
  assert_int_equal(json_object_size(args), 1);
  char city[4];
  memcpy(city, city_value, 4);
  const char *content = json_string_value(json_object_get(m, "content"));
  assert_true(!content || !strchr(content, '<'));
  char want[64];
  snprintf(want, sizeof want, "{\"city\":\"%s\"}", city);
  json_decref(args);
  json_decref(r);
  /* streamed: the same call in a tool_calls delta, no markup in any content delta */
  const char stream_req[] =
      "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}], " TOOLS ", " CALL_GRAMMAR
      ", \"max_tokens\": 40, \"temperature\": 0, \"stream\": true, "
      "\"chat_template_kwargs\": {\"enable_thinking\": false}}";
  char *body;
  assert_int_equal(
      serve_http(f->server.port, "POST", "/v1/chat/completions", NULL, stream_req, &body), 200);
  int saw_call = 0, saw_finish = 0;
  for (char *line = strtok(body, "\n"); line; line = strtok(NULL, "\n")) {
    if (strncmp(line, "data: {", 7)) continue;
    json_t *chunk = json_loads(line + 6, 0, NULL);
    assert_non_null(chunk);
    const json_t *c = json_array_get(json_object_get(chunk, "choices"), 0);
    const json_t *delta = json_object_get(c, "delta");
    const char *text = json_string_value(json_object_get(delta, "content"));
    if (text && strchr(text, '<')) fail_msg("markup in a content delta: %s", text);
    const json_t *dcalls = json_object_get(delta, "tool_calls");
    if (json_array_size(dcalls)) {
      const json_t *dfn = json_object_get(json_array_get(dcalls, 0), "function");
      assert_string_equal(json_string_value(json_object_get(dfn, "name")), "get_weather");
      assert_string_equal(json_string_value(json_object_get(dfn, "arguments")), want);
      saw_call++;
    }
    const char *finish = json_string_value(json_object_get(c, "finish_reason"));
    if (finish) saw_finish = !strcmp(finish, "tool_calls");
    json_decref(chunk);
  }
  free(body);
  assert_int_equal(saw_call, 1);
  assert_true(saw_finish);
  /* Anthropic: a tool_use block with the typed input */
  const char anthropic_req[] =
      "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}], "
      "\"tools\": [{\"name\": \"get_weather\", \"input_schema\": {\"type\": \"object\", "
      "\"properties\": {\"city\": {\"type\": \"string\"}}}}], " CALL_GRAMMAR
      ", \"max_tokens\": 40, \"temperature\": 0, \"thinking\": {\"type\": \"disabled\"}}";
  r = request(f, "/v1/messages", anthropic_req);
  if (strcmp(json_string_value(json_object_get(r, "stop_reason")), "tool_use")) {
    char *dump = json_dumps(r, JSON_COMPACT);
    fail_msg("not a tool_use answer: %s", dump);
  }
  const json_t *blocks = json_object_get(r, "content");
  const json_t *use = json_array_get(blocks, json_array_size(blocks) - 1);
  assert_string_equal(json_string_value(json_object_get(use, "type")), "tool_use");
  assert_string_equal(json_string_value(json_object_get(use, "name")), "get_weather");
  assert_string_equal(json_string_value(json_object_get(json_object_get(use, "input"), "city")),
                      city);
  json_decref(r);
}

/* Two tools whose parameters are typed: an enum, an integer, an optional boolean, a short
 * string. */
#define TYPED_TOOLS                                                                                \
  "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "                \
  "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", "      \
  "\"enum\": [\"rome\", \"oslo\"]}, \"days\": {\"type\": \"integer\"}, \"metric\": {\"type\": "    \
  "\"boolean\"}}, \"required\": [\"days\", \"city\"]}}}, {\"type\": \"function\", \"function\": "  \
  "{\"name\": \"get_time\", \"parameters\": {\"type\": \"object\", \"properties\": {\"zone\": "    \
  "{\"type\": \"string\", \"minLength\": 1, \"maxLength\": 4}}, \"required\": [\"zone\"]}}}]"

/* The one tool call of a chat answer, checked against TYPED_TOOLS' schemas; returns its name. */
static const char *check_typed_call(const json_t *r, char *name, size_t name_size) {
  const json_t *choice = json_array_get(json_object_get(r, "choices"), 0);
  const json_t *m = json_object_get(choice, "message");
  const json_t *calls = json_object_get(m, "tool_calls");
  if (json_array_size(calls) != 1) {
    char *dump = json_dumps(r, JSON_COMPACT);
    fail_msg("not one tool call: %s", dump);
  }
  assert_string_equal(json_string_value(json_object_get(choice, "finish_reason")), "tool_calls");
  const json_t *fn = json_object_get(json_array_get(calls, 0), "function");
  snprintf(name, name_size, "%s", json_string_value(json_object_get(fn, "name")));
  json_t *args = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, NULL);
  assert_non_null(args);
  printf("  forced call %s(%s)\n", name, json_string_value(json_object_get(fn, "arguments")));
  if (!strcmp(name, "get_weather")) {
    const char *city = json_string_value(json_object_get(args, "city"));
    assert_non_null(city);
    assert_true(!strcmp(city, "rome") || !strcmp(city, "oslo"));
    assert_true(json_is_integer(json_object_get(args, "days")));
    const json_t *metric = json_object_get(args, "metric");
    assert_true(!metric || json_is_boolean(metric));
    assert_int_equal(json_object_size(args), 2 + (metric != NULL));
  } else {
    assert_string_equal(name, "get_time");
    const char *zone = json_string_value(json_object_get(args, "zone"));
    assert_non_null(zone);
    assert_true(strlen(zone) >= 1 && strlen(zone) <= 4);
    assert_null(strchr(zone, '<'));
    assert_int_equal(json_object_size(args), 1);
  }
  const char *content = json_string_value(json_object_get(m, "content"));
  assert_true(!content || !strchr(content, '<'));
  json_decref(args);
  return name;
}

/* tool_choice "required" and a named function constrain the random model to one call in
 * Qwen3.5's own XML format (the template's), which the server parses back with arguments of the
 * schema's types; several seeds, so that different calls and values come out. */
static void test_forced_xml_tool_call(void **state) {
  fixture *f = *state;
  char req[2048], name[64];
  int saw[2] = {0, 0};
  for (int seed = 1; seed <= 6; seed++) {
    snprintf(req, sizeof req,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}], " TYPED_TOOLS
             ", \"tool_choice\": \"required\", \"max_tokens\": 60, \"temperature\": 1.5, "
             "\"seed\": %d, \"chat_template_kwargs\": {\"enable_thinking\": false}}",
             seed);
    json_t *r = request(f, "/v1/chat/completions", req);
    saw[!strcmp(check_typed_call(r, name, sizeof name), "get_time")]++;
    json_decref(r);
  }
  printf("  required: %d get_weather, %d get_time\n", saw[0], saw[1]);
  /* a named function: always that one */
  const char *const names[] = {"get_time", "get_weather"};
  for (int i = 0; i < 2; i++)
    for (int seed = 1; seed <= 2; seed++) {
      snprintf(req, sizeof req,
               "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}], " TYPED_TOOLS
               ", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"%s\"}}, "
               "\"max_tokens\": 60, \"temperature\": 1.5, \"seed\": %d, "
               "\"chat_template_kwargs\": {\"enable_thinking\": false}}",
               names[i], seed);
      json_t *r = request(f, "/v1/chat/completions", req);
      assert_string_equal(check_typed_call(r, name, sizeof name), names[i]);
      json_decref(r);
    }
  /* thinking on (the template opens <think>): the answer may reason first, closes </think>
   * (favoured here by logit_bias), then makes the call, which is parsed as a call */
  snprintf(req, sizeof req,
           "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}], " TYPED_TOOLS
           ", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": "
           "\"get_weather\"}}, \"max_tokens\": 60, \"temperature\": 0, \"logit_bias\": "
           "{\"%d\": 100}}",
           V_THINK_CLOSE);
  json_t *thinking = request(f, "/v1/chat/completions", req);
  assert_string_equal(check_typed_call(thinking, name, sizeof name), "get_weather");
  const json_t *tm = first_message(thinking);
  const char *tr = json_string_value(json_object_get(tm, "reasoning_content"));
  assert_true(!tr || !strchr(tr, '<'));
  json_decref(thinking);
  /* Anthropic tool_choice {"type": "tool"} goes the same way */
  const char anthropic_req[] =
      "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"Time?\"}], "
      "\"tools\": [{\"name\": \"get_time\", \"input_schema\": {\"type\": \"object\", "
      "\"properties\": {\"zone\": {\"type\": \"string\", \"maxLength\": 3}}, \"required\": "
      "[\"zone\"]}}], \"tool_choice\": {\"type\": \"tool\", \"name\": \"get_time\"}, "
      "\"max_tokens\": 40, \"temperature\": 0, \"thinking\": {\"type\": \"disabled\"}}";
  json_t *r = request(f, "/v1/messages", anthropic_req);
  assert_string_equal(json_string_value(json_object_get(r, "stop_reason")), "tool_use");
  const json_t *blocks = json_object_get(r, "content");
  const json_t *use = json_array_get(blocks, json_array_size(blocks) - 1);
  assert_string_equal(json_string_value(json_object_get(use, "name")), "get_time");
  const char *zone = json_string_value(json_object_get(json_object_get(use, "input"), "zone"));
  assert_non_null(zone);
  assert_true(strlen(zone) <= 3);
  json_decref(r);
  /* a parameter type the XML form cannot write is a 400 naming it */
  char *body;
  assert_int_equal(serve_http(f->server.port, "POST", "/v1/chat/completions", NULL,
                              "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                              "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": "
                              "\"f\", \"parameters\": {\"type\": \"object\", \"properties\": "
                              "{\"a\": {\"type\": \"date\"}}}}}], \"tool_choice\": \"required\"}",
                              &body),
                   400);
  assert_non_null(strstr(body, "\\\"date\\\""));
  free(body);
}

/* Anthropic history: an assistant's thinking blocks become its reasoning_content, which the
 * Qwen3.5 template renders inside <think> for a turn after the last user query (a tool loop). */
static long long count_tokens(const fixture *f, const char *thinking_block) {
  char req[2048];
  snprintf(req, sizeof req,
           "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}, "
           "{\"role\": \"assistant\", \"content\": [%s{\"type\": \"tool_use\", \"id\": \"t1\", "
           "\"name\": \"get_weather\", \"input\": {\"city\": \"abc\"}}]}, {\"role\": \"user\", "
           "\"content\": [{\"type\": \"tool_result\", \"tool_use_id\": \"t1\", \"content\": "
           "\"sunny\"}]}], \"tools\": [{\"name\": \"get_weather\", \"input_schema\": {\"type\": "
           "\"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}]}",
           thinking_block);
  json_t *r = request(f, "/v1/messages/count_tokens", req);
  const long long n = json_integer_value(json_object_get(r, "input_tokens"));
  json_decref(r);
  return n;
}

static void test_anthropic_thinking_history(void **state) {
  fixture *f = *state;
  const long long without = count_tokens(f, "");
  const long long with = count_tokens(
      f, "{\"type\": \"thinking\", \"thinking\": \"three more words\", \"signature\": \"s\"}, ");
  assert_true(without > 0);
  assert_int_equal(with - without, 3);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_models_advertise_reasoning),
      cmocka_unit_test(test_thinking_on_and_off),
      cmocka_unit_test(test_xml_tool_call),
      cmocka_unit_test(test_forced_xml_tool_call),
      cmocka_unit_test(test_anthropic_thinking_history),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
