/* Public API text handles on their own: tokenizers and chat templates loaded without weights
 * (a model's own are views of the ones it loaded), encoding, decoding and whole-request chat
 * rendering. */
#include "api/api_internal.h"

#include "base/error.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

cinfer_status cinfer_tokenizer_load(const char *path, cinfer_tokenizer **out) {
  if (!out) return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_tokenizer_load: out is NULL");
  *out = NULL;
  if (!path) return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_tokenizer_load: path is NULL");
  struct stat st;
  const int is_file = stat(path, &st) == 0 && S_ISREG(st.st_mode);
  cinfer_tokenizer *t = calloc(1, sizeof *t);
  if (!t) return ci_api_fail(CINFER_ERROR, "out of memory for a tokenizer");
  t->impl = is_file ? ci_tokenizer_load_file(path) : ci_tokenizer_load_dir(path);
  if (!t->impl) {
    free(t);
    return CINFER_ERROR;
  }
  *out = t;
  return CINFER_OK;
}

void cinfer_tokenizer_free(cinfer_tokenizer *tokenizer) {
  if (!tokenizer) return;
  ci_tokenizer_free(tokenizer->impl);
  free(tokenizer);
}

const cinfer_tokenizer *cinfer_model_tokenizer(const cinfer_model *model) {
  return model && model->tokenizer ? &model->tokenizer_view : NULL;
}

cinfer_status cinfer_tokenizer_encode(const cinfer_tokenizer *tokenizer, const char *text,
                                      size_t len, int add_special, int32_t **ids, size_t *n_ids) {
  if (!tokenizer || !text || !ids || !n_ids)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_tokenizer_encode: NULL argument");
  *ids = NULL;
  *n_ids = 0;
  return ci_tokenizer_encode(tokenizer->impl, text, len, add_special, ids, n_ids) ? CINFER_ERROR
                                                                                  : CINFER_OK;
}

cinfer_status cinfer_tokenizer_decode(const cinfer_tokenizer *tokenizer, const int32_t *ids,
                                      size_t n_ids, int skip_special, char **text, size_t *len) {
  if (!tokenizer || (!ids && n_ids) || !text)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_tokenizer_decode: NULL argument");
  *text = NULL;
  size_t n = 0;
  if (ci_tokenizer_decode(tokenizer->impl, ids, n_ids, skip_special, text, &n))
    return CINFER_INVALID_ARGUMENT;
  if (len) *len = n;
  return CINFER_OK;
}

/* Wraps a freshly loaded template (NULL: the load failed, ci_last_error says why). */
static cinfer_status wrap_template(ci_chat_template *impl, cinfer_chat_template **out) {
  if (!impl) return CINFER_ERROR;
  cinfer_chat_template *t = calloc(1, sizeof *t);
  if (!t) {
    ci_chat_template_free(impl);
    return ci_api_fail(CINFER_ERROR, "out of memory for a chat template");
  }
  t->impl = impl;
  *out = t;
  return CINFER_OK;
}

cinfer_status cinfer_chat_template_load(const char *model_dir, cinfer_chat_template **out) {
  if (!out) return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_chat_template_load: out is NULL");
  *out = NULL;
  if (!model_dir)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_chat_template_load: model_dir is NULL");
  return wrap_template(ci_chat_template_load_dir(model_dir), out);
}

cinfer_status cinfer_chat_template_from_source(const char *source, const char *bos_token,
                                               const char *eos_token, cinfer_chat_template **out) {
  if (!out)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_chat_template_from_source: out is NULL");
  *out = NULL;
  if (!source)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_chat_template_from_source: no source");
  return wrap_template(ci_chat_template_from_source(source, bos_token, eos_token), out);
}

void cinfer_chat_template_free(cinfer_chat_template *chat_template) {
  if (!chat_template) return;
  ci_chat_template_free(chat_template->impl);
  free(chat_template);
}

const cinfer_chat_template *cinfer_model_chat_template(const cinfer_model *model) {
  return model && model->chat_template ? &model->chat_template_view : NULL;
}

const char *cinfer_chat_template_bos_token(const cinfer_chat_template *chat_template) {
  const char *s = chat_template ? ci_chat_template_bos_token(chat_template->impl) : NULL;
  return s ? s : "";
}

const char *cinfer_chat_template_eos_token(const cinfer_chat_template *chat_template) {
  const char *s = chat_template ? ci_chat_template_eos_token(chat_template->impl) : NULL;
  return s ? s : "";
}

cinfer_status cinfer_chat_template_render(const cinfer_chat_template *chat_template,
                                          const char *request_json, char **text, size_t *len) {
  if (!chat_template || !request_json || !text)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_chat_template_render: NULL argument");
  *text = NULL;
  json_error_t error;
  json_t *request = json_loads(request_json, 0, &error);
  if (!json_is_object(request)) {
    json_decref(request);
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "chat request: %s",
                       request ? "not a JSON object" : error.text);
  }
  size_t n = 0;
  const int status = ci_chat_template_render(chat_template->impl, request, text, &n);
  json_decref(request);
  if (status) return CINFER_ERROR;
  if (len) *len = n;
  return CINFER_OK;
}

cinfer_status cinfer_tokenizer_from_json(const char *json, size_t len, cinfer_tokenizer **out) {
  if (!out) return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_tokenizer_from_json: out is NULL");
  *out = NULL;
  if (!json) return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_tokenizer_from_json: no text");
  cinfer_tokenizer *t = calloc(1, sizeof *t);
  if (!t) return ci_api_fail(CINFER_ERROR, "out of memory for a tokenizer");
  t->impl = ci_tokenizer_load_json(json, len);
  if (!t->impl) {
    free(t);
    return CINFER_ERROR;
  }
  *out = t;
  return CINFER_OK;
}

int32_t cinfer_tokenizer_config_token(const cinfer_tokenizer *tokenizer, const char *key) {
  return tokenizer && key ? ci_tokenizer_config_token_id(tokenizer->impl, key) : -1;
}

int32_t cinfer_tokenizer_token_id(const cinfer_tokenizer *tokenizer, const char *token) {
  return tokenizer && token ? ci_tokenizer_token_to_id(tokenizer->impl, token) : -1;
}
