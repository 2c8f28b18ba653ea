/* Public API models: loading a folder (weights, tokenizer, chat template, generation defaults,
 * EOS set), the facts about it, and its text layer (tokenize, detokenize, chat rendering). */
#include "api/api_internal.h"

#include "base/error.h"
#include "base/threadpool.h"
#include "engine/eos_set.h"
#include "io/model_path.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void cinfer_model_options_init(cinfer_model_options *options) {
  memset(options, 0, sizeof *options);
}

/* Loads everything beside the weights; CINFER_OK or CINFER_ERROR. */
static cinfer_status load_text_and_defaults(cinfer_model *m) {
  if (ci_generation_config_load(m->dir, &m->generation)) return CINFER_ERROR;
  char path[4096];
  snprintf(path, sizeof path, "%s/tokenizer.json", m->dir);
  if (access(path, F_OK) == 0) {
    m->tokenizer = ci_tokenizer_load_dir(m->dir);
    if (!m->tokenizer) return CINFER_ERROR;
  }
  m->chat_template = ci_chat_template_load_dir(m->dir);
  if (!m->chat_template) {
    snprintf(m->template_error, sizeof m->template_error, "%s", ci_last_error());
    ci_clear_error();
  }
  /* the one EOS set of the model: config.json, generation_config.json, the tokenizer's eos_token */
  if (ci_eos_set_for_model(&m->eos, &m->model->spec, &m->generation, m->tokenizer))
    return CINFER_ERROR;
  return CINFER_OK;
}

cinfer_status cinfer_model_load(const char *path, const cinfer_model_options *options,
                                cinfer_model **out) {
  if (!out) return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_model_load: out is NULL");
  *out = NULL;
  if (!path) return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_model_load: path is NULL");
  cinfer_model_options defaults;
  cinfer_model_options_init(&defaults);
  if (!options) options = &defaults;
  if (options->n_threads < 0)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "n_threads must be >= 0 (got %d)",
                       options->n_threads);
  if (options->gpu < 0)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "gpu must be >= 0 (got %d)", options->gpu);
  if (options->tensor_parallel < 0 || options->tensor_parallel > 8)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "tensor_parallel must be 0 to 8 (got %d)",
                       options->tensor_parallel);
  if (options->precision != CINFER_PRECISION_FAST && options->precision != CINFER_PRECISION_EXACT)
    return ci_api_fail(CINFER_INVALID_ARGUMENT,
                       "precision must be CINFER_PRECISION_FAST or CINFER_PRECISION_EXACT (got %d)",
                       (int)options->precision);
  const ci_precision precision =
      options->precision == CINFER_PRECISION_EXACT ? CI_PRECISION_EXACT : CI_PRECISION_FAST;
  cinfer_model *m = calloc(1, sizeof *m);
  if (!m) return ci_api_fail(CINFER_ERROR, "out of memory for a model");
  pthread_mutex_init(&m->grammar_mu, NULL);
  m->dir = ci_model_path_resolve(path);
  m->threads = options->n_threads > 0 ? options->n_threads : ci_cpu_count();
  const int ranks = options->tensor_parallel > 1 ? options->tensor_parallel : 1;
  const ci_device_options device = {options->device, options->gpu, options->n_threads,
                                    options->mmap,   precision,    ranks};
  m->model = m->dir ? ci_model_open_on(m->dir, &device) : NULL;
  const int is_auto = !options->device || !strcmp(options->device, "auto");
  if (!m->model && m->dir && is_auto && ci_model_gpu_visible() && ranks == 1) {
    /* auto: a model the GPU cannot run yet (f32 affine scales, ...) runs on the CPU instead; the
     * reason is kept for cinfer_model_device_note, so the fallback is never silent */
    snprintf(m->device_note, sizeof m->device_note, "the GPU cannot run this model: %s",
             ci_last_error());
    const ci_device_options cpu = {"cpu", 0, options->n_threads, options->mmap, precision, 1};
    m->model = ci_model_open_on(m->dir, &cpu);
  }
  if (!m->model || load_text_and_defaults(m) != CINFER_OK) {
    cinfer_model_free(m);
    return CINFER_ERROR;
  }
  m->tokenizer_view.impl = m->tokenizer;
  m->chat_template_view.impl = m->chat_template;
  if (m->tokenizer)
    ci_api_chat_format_detect(&m->chat_format, m->tokenizer, m->chat_template,
                              ci_model_architecture(m->model));
  *out = m;
  return CINFER_OK;
}

void cinfer_model_free(cinfer_model *model) {
  if (!model) return;
  ci_chat_template_free(model->chat_template);
  ci_grammar_vocab_free(model->grammar_vocab);
  pthread_mutex_destroy(&model->grammar_mu);
  ci_tokenizer_free(model->tokenizer);
  ci_model_close(model->model);
  free(model->dir);
  free(model);
}

int cinfer_model_vocab_size(const cinfer_model *model) {
  return model ? ci_model_vocab_size(model->model) : 0;
}

int cinfer_model_context_length(const cinfer_model *model) {
  return model ? ci_model_context_length(model->model) : 0;
}

const char *cinfer_model_architecture(const cinfer_model *model) {
  return model ? ci_model_architecture(model->model) : "";
}

int cinfer_model_is_eos(const cinfer_model *model, int32_t token) {
  return model && ci_eos_set_contains(&model->eos, token);
}

cinfer_status cinfer_tokenize(const cinfer_model *model, const char *text, size_t len,
                              int add_special, int32_t **ids, size_t *n_ids) {
  if (!model || !text || !ids || !n_ids)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_tokenize: NULL argument");
  *ids = NULL;
  *n_ids = 0;
  if (!model->tokenizer)
    return ci_api_fail(CINFER_UNSUPPORTED, "%s has no tokenizer.json", model->dir);
  return ci_tokenizer_encode(model->tokenizer, text, len, add_special, ids, n_ids) ? CINFER_ERROR
                                                                                   : CINFER_OK;
}

cinfer_status cinfer_detokenize(const cinfer_model *model, const int32_t *ids, size_t n_ids,
                                int skip_special, char **text, size_t *len) {
  if (!model || (!ids && n_ids) || !text)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_detokenize: NULL argument");
  *text = NULL;
  if (!model->tokenizer)
    return ci_api_fail(CINFER_UNSUPPORTED, "%s has no tokenizer.json", model->dir);
  size_t n = 0;
  if (ci_tokenizer_decode(model->tokenizer, ids, n_ids, skip_special, text, &n))
    return CINFER_INVALID_ARGUMENT;
  if (len) *len = n;
  return CINFER_OK;
}

cinfer_status cinfer_chat_render(const cinfer_model *model, const char *messages_json,
                                 int add_generation_prompt, char **text) {
  if (!model || !messages_json || !text)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_chat_render: NULL argument");
  *text = NULL;
  if (!model->chat_template) return ci_api_fail(CINFER_UNSUPPORTED, "%s", model->template_error);
  json_error_t error;
  json_t *messages = json_loads(messages_json, 0, &error);
  if (!json_is_array(messages)) {
    json_decref(messages);
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "messages: %s",
                       messages ? "not a JSON array" : error.text);
  }
  json_t *request = json_object();
  json_object_set_new(request, "messages", messages);
  json_object_set_new(request, "add_generation_prompt", json_boolean(add_generation_prompt));
  size_t len = 0;
  const int status = ci_chat_template_render(model->chat_template, request, text, &len);
  json_decref(request);
  return status ? CINFER_ERROR : CINFER_OK;
}
