/* Structured output on the server's generation routes (docs/server.md "Structured output"):
 * tool_choice "required" or a named function (the output constrained to one tool call of the
 * allowed tools, hermes JSON or the Qwen XML format as the model's template asks, its arguments
 * to the tool's parameters schema), OpenAI's response_format
 * ({"type": "text"}, {"type": "json_object"} with llama-server's optional "schema", {"type":
 * "json_schema", "json_schema": {"name", "schema", "strict"}}) and the `grammar` (GBNF) and
 * `json_schema` extensions, compiled into the job's grammar. The server's token bytes for the mask
 * are built on the first constrained request. */
#include "server/server.h"

#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Checks job->grammar (GBNF) with the library; `what` names the field in errors. */
static int check_grammar(const ci_srv_job *job, const char *what, char **err) {
  if (!job->grammar) return ci_srv_fail(err, "out of memory");
  if (cinfer_grammar_check(job->grammar, strlen(job->grammar), job->grammar_root) != CINFER_OK)
    return ci_srv_fail(err, "%s: %s", what, cinfer_last_error());
  return 0;
}

/* Compiles a schema object into job->grammar; `what` names its field in errors. */
static int from_schema(const json_t *schema, int strict, const char *what, ci_srv_job *job,
                       char **err) {
  if (!json_is_object(schema) && !json_is_true(schema))
    return ci_srv_fail(err, "%s must be a JSON Schema object", what);
  char *text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY), *gbnf = NULL;
  if (!text) return ci_srv_fail(err, "out of memory");
  const cinfer_status status = cinfer_json_schema_to_gbnf(text, strlen(text), strict, &gbnf);
  free(text);
  if (status != CINFER_OK) return ci_srv_fail(err, "%s: %s", what, cinfer_last_error());
  job->grammar = strdup(gbnf);
  cinfer_free(gbnf);
  return check_grammar(job, what, err);
}

static int from_response_format(const json_t *rf, ci_srv_job *job, char **err) {
  const char *type = json_string_value(json_object_get(rf, "type"));
  if (!json_is_object(rf) || !type)
    return ci_srv_fail(err, "response_format must be an object with a \"type\" (text, json_object, "
                            "json_schema)");
  if (!strcmp(type, "text")) return 0;
  if (!strcmp(type, "json_object")) {
    const json_t *schema = json_object_get(rf, "schema"); /* llama-server's extension */
    if (schema && !json_is_null(schema))
      return from_schema(schema, 0, "response_format.schema", job, err);
    json_t *any_object = json_pack("{s:s}", "type", "object"); /* any JSON object */
    if (!any_object) return ci_srv_fail(err, "out of memory");
    const int rc = from_schema(any_object, 0, "response_format", job, err);
    json_decref(any_object);
    return rc;
  }
  if (!strcmp(type, "json_schema")) {
    const json_t *js = json_object_get(rf, "json_schema");
    if (!json_is_object(js))
      return ci_srv_fail(err,
                         "response_format.json_schema must be an object {name, schema, strict}");
    const json_t *strict = json_object_get(js, "strict");
    if (strict && !json_is_null(strict) && !json_is_boolean(strict))
      return ci_srv_fail(err, "response_format.json_schema.strict must be a boolean");
    const json_t *schema = json_object_get(js, "schema");
    if (!schema || json_is_null(schema)) /* OpenAI: no schema = any JSON */
      schema = json_true();
    return from_schema(schema, json_is_true(strict), "response_format.json_schema.schema", job,
                       err);
  }
  return ci_srv_fail(err,
                     "response_format.type \"%.64s\" is not supported (text, json_object, "
                     "json_schema)",
                     type);
}

int ci_srv_parse_structured(ci_server *s, const json_t *body, ci_srv_job *job, char **err) {
  const json_t *rf = json_object_get(body, "response_format");
  const json_t *grammar = json_object_get(body, "grammar");
  const json_t *schema = json_object_get(body, "json_schema");
  if (rf && json_is_null(rf)) rf = NULL;
  if (grammar && json_is_null(grammar)) grammar = NULL;
  if (schema && json_is_null(schema)) schema = NULL;
  if (!rf && !grammar && !schema) return 0;
  if (!!rf + !!grammar + !!schema > 1)
    return ci_srv_fail(err, "give one of response_format, grammar and json_schema");
  if (!s->o.tokenizer) return ci_srv_fail(err, "structured output needs the model's tokenizer");
  (void)s;
  int rc;
  if (grammar) {
    if (!json_is_string(grammar)) return ci_srv_fail(err, "grammar must be a string (GBNF)");
    job->grammar = strndup(json_string_value(grammar), json_string_length(grammar));
    rc = check_grammar(job, "grammar", err);
  } else if (schema) {
    rc = from_schema(schema, 0, "json_schema", job, err);
  } else {
    rc = from_response_format(rf, job, err);
  }
  return rc;
}

/* The tool of `name` in tools, or NULL. */
static const json_t *find_tool(const json_t *tools, const char *name) {
  size_t i;
  const json_t *t;
  json_array_foreach(tools, i, t) {
    const char *n = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
    if (n && !strcmp(n, name)) return t;
  }
  return NULL;
}

/* Appends {"name": const NAME, "arguments": parameters} for tool t to the anyOf array. */
static int add_call_schema(json_t *any_of, const json_t *t) {
  const json_t *fn = json_object_get(t, "function");
  json_t *params = json_object_get(fn, "parameters");
  json_t *args =
      params && !json_is_null(params) ? json_incref(params) : json_pack("{s:s}", "type", "object");
  json_t *call = json_pack("{s:s, s:{s:{s:O}, s:o}, s:[s, s], s:b}", "type", "object", "properties",
                           "name", "const", json_object_get(fn, "name"), "arguments", args,
                           "required", "name", "arguments", "additionalProperties", 0);
  return !call || json_array_append_new(any_of, call) ? -1 : 0;
}

int ci_srv_parse_tool_choice(ci_server *s, const json_t *tools, const json_t *choice,
                             ci_srv_job *job, char **err) {
  if (!choice || json_is_null(choice)) return 0;
  const size_t n_tools = json_is_array(tools) ? json_array_size(tools) : 0;
  const char *mode = json_string_value(choice);
  const json_t *named = NULL;
  if (mode) {
    if (!strcmp(mode, "none") || !strcmp(mode, "auto")) return 0;
    if (strcmp(mode, "required"))
      return ci_srv_fail(err,
                         "tool_choice \"%.64s\" is not one of none, auto, required (or "
                         "{\"type\": \"function\", \"function\": {\"name\": ...}})",
                         mode);
    if (n_tools == 0) return ci_srv_fail(err, "tool_choice \"required\" needs tools");
  } else {
    const char *name =
        json_string_value(json_object_get(json_object_get(choice, "function"), "name"));
    const char *type = json_string_value(json_object_get(choice, "type"));
    if (!json_is_object(choice) || !name || (type && strcmp(type, "function")))
      return ci_srv_fail(err,
                         "tool_choice must be none, auto, required or {\"type\": \"function\", "
                         "\"function\": {\"name\": ...}}");
    named = find_tool(tools, name);
    if (!named) return ci_srv_fail(err, "tool_choice names \"%.64s\", which is not in tools", name);
  }
  if (job->grammar)
    return ci_srv_fail(err, "tool_choice required or a named function cannot be combined with "
                            "response_format, grammar or json_schema");
  if (cinfer_chat_format_xml_tool_calls(s->o.chat_format)) {
    /* Qwen3.5, Qwen3-Coder: the call in the XML format its template teaches the model */
    if (!(job->grammar = ci_srv_xml_tool_grammar(tools, named, err))) return -1;
    job->grammar_root = "tool-call";
    if (check_grammar(job, "tools", err)) return -1;
    job->forced_tool_call = 1;
    return 0;
  }
  /* the call is constrained to a hermes tool call of one of the tools (or the named one):
   * <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call> */
  json_t *any_of = json_array();
  int rc = any_of ? 0 : -1;
  if (named) {
    rc = add_call_schema(any_of, named);
  } else {
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) if (!rc) rc = add_call_schema(any_of, t);
  }
  json_t *schema = rc ? NULL : json_pack("{s:o}", "anyOf", any_of);
  if (!schema) {
    if (rc) json_decref(any_of);
    return ci_srv_fail(err, "out of memory");
  }
  char *schema_text = json_dumps(schema, JSON_COMPACT), *gbnf = NULL;
  json_decref(schema);
  if (!schema_text) return ci_srv_fail(err, "out of memory");
  const cinfer_status status =
      cinfer_json_schema_to_gbnf(schema_text, strlen(schema_text), 1, &gbnf);
  free(schema_text);
  if (status != CINFER_OK)
    return ci_srv_fail(err, "tools: a parameters schema: %s", cinfer_last_error());
  static const char call_rule[] = "tool-call ::= \"<tool_call>\\n\" root \"\\n</tool_call>\"\n";
  const size_t len = strlen(gbnf);
  char *text = malloc(len + sizeof call_rule);
  if (!text) {
    cinfer_free(gbnf);
    return ci_srv_fail(err, "out of memory");
  }
  memcpy(text, gbnf, len);
  memcpy(text + len, call_rule, sizeof call_rule);
  cinfer_free(gbnf);
  job->grammar = text;
  job->grammar_root = "tool-call";
  if (check_grammar(job, "tools", err)) return -1;
  job->forced_tool_call = 1;
  return 0;
}

int ci_srv_forced_call_after_thinking(ci_server *s, ci_srv_job *job, char **err) {
  if (!job->forced_tool_call ||
      !cinfer_chat_format_reasoning_open(s->o.chat_format, job->rendered, job->rendered_len))
    return 0;
  /* the answer starts inside the template's open <think>: reasoning (text without '<'), its
   * </think>, then the call */
  static const char rule[] = "after-thinking ::= [^<]* \"</think>\" [ \\n]* tool-call\n";
  const size_t len = strlen(job->grammar);
  char *text = realloc(job->grammar, len + sizeof rule);
  if (!text) return ci_srv_fail(err, "out of memory");
  memcpy(text + len, rule, sizeof rule);
  job->grammar = text;
  job->grammar_root = "after-thinking";
  return check_grammar(job, "tools", err);
}

/* The hermes text of an assistant message's tool calls. */
static void append_calls_text(ci_strbuf *b, const json_t *calls) {
  size_t i;
  const json_t *c;
  json_array_foreach(calls, i, c) {
    const json_t *fn = json_object_get(c, "function");
    const json_t *args = json_object_get(fn, "arguments");
    json_t *call =
        json_pack("{s:O?, s:O?}", "name", json_object_get(fn, "name"), "arguments", args);
    char *text = call ? json_dumps(call, JSON_COMPACT) : NULL;
    json_decref(call);
    if (!text) {
      b->oom = 1;
      return;
    }
    ci_strbuf_appendf(b, "%s<tool_call>\n%s\n</tool_call>", b->len ? "\n" : "", text);
    free(text);
  }
}

json_t *ci_srv_inject_tool_prompt(const json_t *messages, const json_t *tools) {
  char *tools_text = json_dumps(tools, JSON_COMPACT);
  if (!tools_text) return NULL;
  ci_strbuf prompt = {0};
  ci_strbuf_appendf(&prompt,
                    "You can call functions. The available tools, as JSON: %s\n"
                    "To call a tool, reply with only\n<tool_call>\n{\"name\": \"TOOL_NAME\", "
                    "\"arguments\": {ARGUMENTS AS JSON}}\n</tool_call>\n"
                    "A tool's result comes back in a later message.",
                    tools_text);
  free(tools_text);
  json_t *out = json_array();
  const json_t *first = json_array_get(messages, 0);
  const char *first_role = json_string_value(json_object_get(first, "role"));
  const int merge = first_role && !strcmp(first_role, "system") &&
                    json_is_string(json_object_get(first, "content"));
  size_t i;
  const json_t *m;
  int failed = !out || prompt.oom;
  if (!failed && !merge)
    failed = json_array_append_new(
                 out, json_pack("{s:s, s:s}", "role", "system", "content", prompt.data)) != 0;
  json_array_foreach(messages, i, m) {
    if (failed) break;
    json_t *copy = json_deep_copy(m);
    if (!copy) {
      failed = 1;
      break;
    }
    const json_t *calls = json_object_get(m, "tool_calls");
    const char *content = json_string_value(json_object_get(m, "content"));
    if (i == 0 && merge) {
      ci_strbuf merged = {0};
      ci_strbuf_appendf(&merged, "%s\n\n%s", content, prompt.data);
      failed |= merged.oom || json_object_set_new(copy, "content", json_string(merged.data));
      ci_strbuf_free(&merged);
    } else if (json_array_size(calls) > 0) { /* the calls as text, never a null content */
      ci_strbuf text = {0};
      if (content && *content) ci_strbuf_appendf(&text, "%s", content);
      append_calls_text(&text, calls);
      failed |= text.oom || json_object_set_new(copy, "content", json_string(text.data));
      json_object_del(copy, "tool_calls");
      ci_strbuf_free(&text);
    }
    failed |= json_array_append_new(out, copy) != 0;
  }
  ci_strbuf_free(&prompt);
  if (failed) {
    json_decref(out);
    return NULL;
  }
  return out;
}
