/* Structured output on the server's generation routes (docs/server.md "Structured output"):
 * OpenAI's response_format ({"type": "text"}, {"type": "json_object"} with llama-server's optional
 * "schema", {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}) and the `grammar`
 * (GBNF) and `json_schema` extensions, compiled into the job's grammar. The server's token bytes
 * for the mask are built on the first constrained request. */
#include "server/server.h"

#include "base/error.h"
#include "grammar/json_schema.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(char **err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(char **err, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  *err = strdup(buf);
  return -1;
}

ci_grammar_vocab *ci_srv_grammar_vocab(ci_server *s) {
  pthread_mutex_lock(&s->grammar_mu);
  if (!s->grammar_vocab)
    s->grammar_vocab = ci_grammar_vocab_from_tokenizer(s->o.tokenizer, s->o.model->spec.vocab);
  ci_grammar_vocab *v = s->grammar_vocab;
  pthread_mutex_unlock(&s->grammar_mu);
  return v;
}

/* Compiles a schema object into job->grammar; `what` names its field in errors. */
static int from_schema(const json_t *schema, int strict, const char *what, ci_srv_job *job,
                       char **err) {
  if (!json_is_object(schema) && !json_is_true(schema))
    return fail(err, "%s must be a JSON Schema object", what);
  char *gbnf = ci_json_schema_to_gbnf((json_t *)schema, strict);
  if (!gbnf) return fail(err, "%s: %s", what, ci_last_error());
  job->grammar = ci_grammar_parse(gbnf, strlen(gbnf), "root");
  free(gbnf);
  return job->grammar ? 0 : fail(err, "%s: %s", what, ci_last_error());
}

static int from_response_format(const json_t *rf, ci_srv_job *job, char **err) {
  const char *type = json_string_value(json_object_get(rf, "type"));
  if (!json_is_object(rf) || !type)
    return fail(err, "response_format must be an object with a \"type\" (text, json_object, "
                     "json_schema)");
  if (!strcmp(type, "text")) return 0;
  if (!strcmp(type, "json_object")) {
    const json_t *schema = json_object_get(rf, "schema"); /* llama-server's extension */
    if (schema && !json_is_null(schema))
      return from_schema(schema, 0, "response_format.schema", job, err);
    const char *gbnf = ci_json_object_gbnf();
    job->grammar = ci_grammar_parse(gbnf, strlen(gbnf), "root");
    return job->grammar ? 0 : fail(err, "response_format: %s", ci_last_error());
  }
  if (!strcmp(type, "json_schema")) {
    const json_t *js = json_object_get(rf, "json_schema");
    if (!json_is_object(js))
      return fail(err, "response_format.json_schema must be an object {name, schema, strict}");
    const json_t *strict = json_object_get(js, "strict");
    if (strict && !json_is_null(strict) && !json_is_boolean(strict))
      return fail(err, "response_format.json_schema.strict must be a boolean");
    const json_t *schema = json_object_get(js, "schema");
    if (!schema || json_is_null(schema)) /* OpenAI: no schema = any JSON */
      schema = json_true();
    return from_schema(schema, json_is_true(strict), "response_format.json_schema.schema", job,
                       err);
  }
  return fail(err,
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
    return fail(err, "give one of response_format, grammar and json_schema");
  if (!s->o.tokenizer) return fail(err, "structured output needs the model's tokenizer");
  int rc;
  if (grammar) {
    if (!json_is_string(grammar)) return fail(err, "grammar must be a string (GBNF)");
    job->grammar =
        ci_grammar_parse(json_string_value(grammar), json_string_length(grammar), "root");
    rc = job->grammar ? 0 : fail(err, "grammar: %s", ci_last_error());
  } else if (schema) {
    rc = from_schema(schema, 0, "json_schema", job, err);
  } else {
    rc = from_response_format(rf, job, err);
  }
  if (rc || !job->grammar) return rc;
  if (!ci_srv_grammar_vocab(s)) return fail(err, "structured output: %s", ci_last_error());
  return 0;
}
