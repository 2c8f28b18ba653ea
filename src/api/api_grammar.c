/* Public API structured output: cinfer_params' grammar (GBNF) or json_schema compiled for one
 * request, and the model's token bytes for the grammar mask, built once on first use. */
#include "api/api_internal.h"

#include "base/error.h"
#include "grammar/json_schema.h"

#include <string.h>

/* The model's grammar vocabulary, built on first use (under the model's grammar mutex). */
static ci_grammar_vocab *model_vocab(cinfer_model *model) {
  pthread_mutex_lock(&model->grammar_mu);
  if (!model->grammar_vocab)
    model->grammar_vocab =
        ci_grammar_vocab_from_tokenizer(model->tokenizer, ci_model_vocab_size(model->model));
  ci_grammar_vocab *v = model->grammar_vocab;
  pthread_mutex_unlock(&model->grammar_mu);
  return v;
}

cinfer_status ci_api_grammar(cinfer_model *model, const cinfer_params *params,
                             cinfer_status invalid, ci_grammar **grammar,
                             ci_grammar_vocab **vocab) {
  *grammar = NULL;
  *vocab = NULL;
  if (!params->grammar && !params->json_schema) return CINFER_OK;
  if (params->grammar && params->json_schema)
    return ci_api_fail(invalid, "grammar and json_schema: give one of them, not both");
  if (!model->tokenizer)
    return ci_api_fail(CINFER_UNSUPPORTED,
                       "a grammar needs the model's tokenizer (the folder has no tokenizer.json)");
  ci_grammar *g =
      params->grammar
          ? ci_grammar_parse(params->grammar, strlen(params->grammar),
                             params->grammar_root ? params->grammar_root : "root")
          : ci_grammar_from_json_schema(params->json_schema, strlen(params->json_schema),
                                        params->json_schema_strict);
  if (!g) return ci_api_fail(invalid, "%s", ci_last_error());
  ci_grammar_vocab *v = model_vocab(model);
  if (!v) {
    ci_grammar_free(g);
    return ci_api_fail(CINFER_ERROR, "grammar vocabulary: %s", ci_last_error());
  }
  *grammar = g;
  *vocab = v;
  return CINFER_OK;
}

cinfer_status cinfer_json_schema_to_gbnf(const char *schema_json, size_t len, int strict,
                                         char **gbnf) {
  if (!schema_json || !gbnf) return ci_api_fail(CINFER_INVALID_ARGUMENT, "NULL schema or result");
  *gbnf = NULL;
  json_error_t error;
  json_t *schema = json_loadb(schema_json, len, JSON_DECODE_ANY, &error);
  if (!schema) return ci_api_fail(CINFER_INVALID_ARGUMENT, "JSON Schema: %s", error.text);
  char *text = ci_json_schema_to_gbnf(schema, strict);
  json_decref(schema);
  if (!text) return ci_api_fail(CINFER_INVALID_ARGUMENT, "%s", ci_last_error());
  *gbnf = text;
  return CINFER_OK;
}

cinfer_status cinfer_grammar_check(const char *gbnf, size_t len, const char *root) {
  if (!gbnf) return ci_api_fail(CINFER_INVALID_ARGUMENT, "NULL grammar");
  ci_grammar *g = ci_grammar_parse(gbnf, len, root ? root : "root");
  if (!g) return ci_api_fail(CINFER_INVALID_ARGUMENT, "%s", ci_last_error());
  ci_grammar_free(g);
  return CINFER_OK;
}
