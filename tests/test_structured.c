/* Structured output end to end through the public API on the bundled starter model: JSON Schema
 * and GBNF constrained generation at temperature > 0 (with top-k/p, min-p, penalties), in
 * sessions and in an engine batch that mixes constrained and free requests. Every constrained
 * output must parse (jansson) and validate against its schema (a validator for the keywords
 * used here), and finish by EOS, never by length. Bad grammars and schemas are refused with a
 * message naming the problem. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cinfer.h>
#include <jansson.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STARTER CI_FIXTURE_DIR "/../../models/starter"

static const char *SCHEMA =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":12},"
    "\"count\":{\"type\":\"integer\"},"
    "\"ratio\":{\"type\":\"number\"},"
    "\"ok\":{\"type\":\"boolean\"},"
    "\"kind\":{\"enum\":[\"list\",\"dict\",\"set\"]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":6},"
    "\"minItems\":1,\"maxItems\":3},"
    "\"owner\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},"
    "\"admin\":{\"type\":\"boolean\"}},\"required\":[\"id\"],\"additionalProperties\":false},"
    "\"note\":{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"string\",\"maxLength\":5}]}},"
    "\"required\":[\"name\",\"count\",\"ok\",\"kind\",\"tags\",\"owner\"],"
    "\"additionalProperties\":false}";

/* Validates v against the subset of JSON Schema SCHEMA uses; returns NULL or what is wrong. */
static const char *validate(json_t *v, json_t *schema) {
  json_t *any = json_object_get(schema, "anyOf");
  if (any) {
    size_t i;
    json_t *alt;
    json_array_foreach(any, i, alt) if (!validate(v, alt)) return NULL;
    return "no anyOf alternative matches";
  }
  json_t *e = json_object_get(schema, "enum");
  if (e) {
    size_t i;
    json_t *x;
    json_array_foreach(e, i, x) if (json_equal(x, v)) return NULL;
    return "not in enum";
  }
  const char *type = json_string_value(json_object_get(schema, "type"));
  if (!type) return NULL;
  if (!strcmp(type, "null")) return json_is_null(v) ? NULL : "not null";
  if (!strcmp(type, "boolean")) return json_is_boolean(v) ? NULL : "not a boolean";
  if (!strcmp(type, "integer")) return json_is_integer(v) ? NULL : "not an integer";
  if (!strcmp(type, "number")) return json_is_number(v) ? NULL : "not a number";
  if (!strcmp(type, "string")) {
    if (!json_is_string(v)) return "not a string";
    json_t *max = json_object_get(schema, "maxLength");
    /* maxLength counts code points */
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)json_string_value(v); *p; p++)
      n += (*p & 0xC0) != 0x80;
    return max && n > (size_t)json_integer_value(max) ? "string too long" : NULL;
  }
  if (!strcmp(type, "array")) {
    if (!json_is_array(v)) return "not an array";
    json_t *min = json_object_get(schema, "minItems"), *max = json_object_get(schema, "maxItems");
    if (min && json_array_size(v) < (size_t)json_integer_value(min)) return "too few items";
    if (max && json_array_size(v) > (size_t)json_integer_value(max)) return "too many items";
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) {
      const char *why = validate(x, json_object_get(schema, "items"));
      if (why) return why;
    }
    return NULL;
  }
  if (!strcmp(type, "object")) {
    if (!json_is_object(v)) return "not an object";
    json_t *props = json_object_get(schema, "properties");
    size_t i;
    json_t *r;
    json_array_foreach(
        json_object_get(schema, "required"), i,
        r) if (!json_object_get(v, json_string_value(r))) return "a required property is missing";
    const char *key;
    json_t *x;
    json_object_foreach(v, key, x) {
      json_t *ps = json_object_get(props, key);
      if (!ps) return "a property the schema does not list";
      const char *why = validate(x, ps);
      if (why) return why;
    }
    return NULL;
  }
  return "unknown type";
}

static void expect_valid(const char *text, const char *schema_text) {
  json_error_t err;
  json_t *v = json_loads(text, 0, &err);
  if (!v) fail_msg("output does not parse (%s): %s", err.text, text);
  json_t *schema = json_loads(schema_text, 0, &err);
  assert_non_null(schema);
  const char *why = validate(v, schema);
  if (why) fail_msg("output does not validate (%s): %s", why, text);
  json_decref(v);
  json_decref(schema);
}

static cinfer_model *load(void) {
  cinfer_model_options options;
  cinfer_model_options_init(&options);
  options.n_threads = 2;
  cinfer_model *model = NULL;
  assert_int_equal(cinfer_model_load(STARTER, &options, &model), CINFER_OK);
  return model;
}

static char *prompt_text(const cinfer_model *model) {
  char *prompt = NULL;
  assert_int_equal(cinfer_chat_render(model,
                                      "[{\"role\":\"user\",\"content\":\"Describe a Python list "
                                      "as JSON.\"}]",
                                      1, &prompt),
                   CINFER_OK);
  return prompt;
}

static cinfer_params sampled(const cinfer_model *model, uint64_t seed) {
  cinfer_params p;
  cinfer_params_init(&p, model);
  p.temperature = 1.0f;
  p.seed = seed;
  p.has_seed = 1;
  p.max_tokens = 400;
  return p;
}

/* Sessions: several seeds and sampler settings, each output valid. */
static void test_session_schema(void **state) {
  (void)state;
  cinfer_model *model = load();
  char *prompt = prompt_text(model);
  for (int k = 0; k < 6; k++) {
    cinfer_params p = sampled(model, 1000 + (uint64_t)k);
    p.json_schema = SCHEMA;
    p.json_schema_strict = 1;
    if (k == 1) p.top_k = 5;
    if (k == 2) p.top_p = 0.8f;
    if (k == 3) p.min_p = 0.05f;
    if (k == 4) p.repetition_penalty = 1.3f, p.presence_penalty = 0.5f;
    if (k == 5) p.temperature = 0.0f;
    cinfer_session *s = NULL;
    assert_int_equal(cinfer_session_create(model, &p, &s), CINFER_OK);
    assert_int_equal(cinfer_session_feed_text(s, prompt, 0), CINFER_OK);
    assert_int_equal(cinfer_session_generate(s, NULL, NULL), CINFER_OK);
    assert_int_equal(cinfer_session_finish_reason(s), CINFER_FINISH_STOP);
    size_t n_all;
    const int32_t *all = cinfer_session_tokens(s, &n_all);
    const size_t n_gen = cinfer_session_n_generated(s);
    char *text = NULL;
    assert_int_equal(cinfer_detokenize(model, all + n_all - n_gen, n_gen, 1, &text, NULL),
                     CINFER_OK);
    printf("session %d: %s\n", k, text);
    expect_valid(text, SCHEMA);
    cinfer_free(text);
    cinfer_session_free(s);
  }
  /* GBNF, and ignore_eos: a finished grammar ends the turn */
  cinfer_params p = sampled(model, 7);
  p.grammar = "root ::= \"answer: \" (\"yes\" | \"no\") \".\"";
  p.ignore_eos = 1;
  cinfer_session *s = NULL;
  assert_int_equal(cinfer_session_create(model, &p, &s), CINFER_OK);
  assert_int_equal(cinfer_session_feed_text(s, prompt, 0), CINFER_OK);
  assert_int_equal(cinfer_session_generate(s, NULL, NULL), CINFER_OK);
  assert_int_equal(cinfer_session_finish_reason(s), CINFER_FINISH_STOP);
  size_t n_all;
  const int32_t *all = cinfer_session_tokens(s, &n_all);
  const size_t n_gen = cinfer_session_n_generated(s);
  char *text = NULL;
  assert_int_equal(cinfer_detokenize(model, all + n_all - n_gen, n_gen, 1, &text, NULL), CINFER_OK);
  assert_true(!strcmp(text, "answer: yes.") || !strcmp(text, "answer: no."));
  cinfer_free(text);
  cinfer_session_free(s);
  /* refusals name the problem */
  p = sampled(model, 1);
  p.json_schema = "{\"type\":\"string\",\"pattern\":\"a+\"}";
  assert_int_equal(cinfer_session_create(model, &p, &s), CINFER_INVALID_ARGUMENT);
  assert_non_null(strstr(cinfer_last_error(), "unsupported keyword \"pattern\""));
  p.json_schema = NULL;
  p.grammar = "root ::= [a-";
  assert_int_equal(cinfer_session_create(model, &p, &s), CINFER_INVALID_ARGUMENT);
  assert_non_null(strstr(cinfer_last_error(), "grammar line 1, column 10"));
  p.json_schema = "{}";
  assert_int_equal(cinfer_session_create(model, &p, &s), CINFER_INVALID_ARGUMENT);
  assert_non_null(strstr(cinfer_last_error(), "not both"));
  cinfer_free(prompt);
  cinfer_model_free(model);
}

/* Collects one request's text. */
static char *collect(cinfer_model *model, cinfer_request *r, cinfer_finish *finish) {
  int32_t ids[512];
  size_t n = 0;
  cinfer_event ev;
  for (;;) {
    assert_int_equal(cinfer_request_next(r, &ev, -1), CINFER_OK);
    if (ev.kind == CINFER_EVENT_TOKEN) {
      assert_true(n < 512);
      ids[n++] = ev.token;
      continue;
    }
    if (ev.kind == CINFER_EVENT_ERROR) fail_msg("request failed: %s", ev.message);
    *finish = ev.finish;
    break;
  }
  char *text = NULL;
  assert_int_equal(cinfer_detokenize(model, ids, n, 1, &text, NULL), CINFER_OK);
  return text;
}

/* An engine batch: constrained (schema, json object, GBNF) and free requests side by side. */
static void test_engine_batch(void **state) {
  (void)state;
  cinfer_model *model = load();
  char *prompt = prompt_text(model);
  int32_t *ids = NULL;
  size_t n_ids = 0;
  assert_int_equal(cinfer_tokenize(model, prompt, strlen(prompt), 0, &ids, &n_ids), CINFER_OK);
  cinfer_engine_options eo;
  cinfer_engine_options_init(&eo);
  eo.max_batch = 6;
  eo.context_size = 1024;
  cinfer_engine *engine = NULL;
  assert_int_equal(cinfer_engine_create(model, &eo, &engine), CINFER_OK);
  enum { N = 6 };
  cinfer_request *req[N];
  for (int i = 0; i < N; i++) {
    cinfer_params p = sampled(model, 50 + (uint64_t)i);
    if (i % 3 == 0) p.json_schema = SCHEMA, p.json_schema_strict = 1;
    if (i == 1)
      p.json_schema = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
                      "\"string\",\"maxLength\":4}},\"required\":[\"a\"]}";
    if (i == 4) p.grammar = "root ::= [a-c]{3} \"!\"", p.ignore_eos = 1;
    if (i == 2 || i == 5) p.max_tokens = 40; /* free */
    assert_int_equal(cinfer_engine_submit(engine, ids, n_ids, &p, &req[i]), CINFER_OK);
  }
  for (int i = 0; i < N; i++) {
    cinfer_finish finish;
    char *text = collect(model, req[i], &finish);
    printf("request %d: %s\n", i, text);
    if (i % 3 == 0) {
      assert_int_equal(finish, CINFER_FINISH_STOP);
      expect_valid(text, SCHEMA);
    } else if (i == 1) {
      assert_int_equal(finish, CINFER_FINISH_STOP);
      json_t *v = json_loads(text, 0, NULL);
      if (!v || !json_is_string(json_object_get(v, "a"))) fail_msg("not {\"a\": string}: %s", text);
      json_decref(v);
    } else if (i == 4) {
      assert_int_equal(finish, CINFER_FINISH_STOP);
      assert_int_equal(strlen(text), 4);
      assert_true(strspn(text, "abc") == 3 && text[3] == '!');
    }
    cinfer_free(text);
    cinfer_request_free(req[i]);
  }
  /* a bad schema at submit is a rejection naming the keyword */
  cinfer_params p = sampled(model, 1);
  p.json_schema = "{\"type\":\"array\",\"prefixItems\":[]}";
  cinfer_request *bad = NULL;
  assert_int_equal(cinfer_engine_submit(engine, ids, n_ids, &p, &bad), CINFER_REJECTED);
  assert_non_null(strstr(cinfer_last_error(), "unsupported keyword \"prefixItems\""));
  cinfer_engine_free(engine);
  cinfer_free(ids);
  cinfer_free(prompt);
  cinfer_model_free(model);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_session_schema),
      cmocka_unit_test(test_engine_batch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
