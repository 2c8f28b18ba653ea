/* Public API engine: the continuous-batching engine (engine/engine.h) behind opaque handles,
 * with cinfer_params resolved into engine jobs and engine events copied into cinfer_events. */
#include "api/api_internal.h"

#include "base/error.h"
#include "engine/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cinfer_engine {
  cinfer_model *model; /* not owned */
  ci_engine *engine;   /* owned */
};

struct cinfer_request {
  ci_engine_request *request; /* the caller's share */
  int finished;               /* DONE or ERROR was read */
};

void cinfer_engine_options_init(cinfer_engine_options *options) {
  ci_engine_options defaults;
  ci_engine_options_default(&defaults);
  memset(options, 0, sizeof *options);
  options->max_batch = defaults.batch;
  options->prefix_cache_bytes = defaults.prefix_cache_bytes;
}

cinfer_status cinfer_engine_create(cinfer_model *model, const cinfer_engine_options *options,
                                   cinfer_engine **out) {
  if (!out) return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_engine_create: out is NULL");
  *out = NULL;
  if (!model) return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_engine_create: model is NULL");
  cinfer_engine_options defaults;
  cinfer_engine_options_init(&defaults);
  if (!options) options = &defaults;
  ci_engine_options o;
  ci_engine_options_default(&o);
  if (options->max_batch < 1 || options->context_size < 0 || options->kv_protect < 0 ||
      options->kv_budget_bytes < 0 || options->prefix_cache_bytes < 0)
    return ci_api_fail(CINFER_INVALID_ARGUMENT,
                       "engine options: max_batch must be >= 1, the others >= 0");
  if (options->kv_codec && strcmp(options->kv_codec, "bf16") != 0 &&
      strcmp(options->kv_codec, "f32") != 0)
    return ci_api_fail(CINFER_INVALID_ARGUMENT,
                       "engine kv_codec must be \"bf16\" or \"f32\" (got \"%s\"); quantized "
                       "codecs are per request (cinfer_params)",
                       options->kv_codec);
  o.batch = options->max_batch;
  o.ctx_size = options->context_size;
  o.base = options->kv_codec && strcmp(options->kv_codec, "f32") == 0 ? CI_KV_F32 : CI_KV_BF16;
  o.kv_protect = options->kv_protect;
  o.kv_budget_bytes = options->kv_budget_bytes;
  o.prefix_cache_bytes = options->prefix_cache_bytes;
  cinfer_engine *e = calloc(1, sizeof *e);
  if (!e) return ci_api_fail(CINFER_ERROR, "out of memory for an engine");
  e->model = model;
  e->engine = ci_engine_create(model->model, &o);
  if (!e->engine) {
    free(e);
    return CINFER_ERROR;
  }
  *out = e;
  return CINFER_OK;
}

void cinfer_engine_free(cinfer_engine *engine) {
  if (!engine) return;
  ci_engine_free(engine->engine);
  free(engine);
}

cinfer_status cinfer_engine_submit(cinfer_engine *engine, const int32_t *prompt, size_t n_prompt,
                                   const cinfer_params *params, cinfer_request **out) {
  if (!out) return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_engine_submit: out is NULL");
  *out = NULL;
  if (!engine || !prompt || n_prompt == 0 || n_prompt > (size_t)INT32_MAX)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_engine_submit: no prompt");
  cinfer_params defaults;
  if (!params) {
    cinfer_params_init(&defaults, engine->model);
    params = &defaults;
  }
  ci_api_resolved r;
  cinfer_status status = ci_api_resolve(engine->model, params, &r);
  if (status != CINFER_OK) return status;
  if (r.kv_plan == CI_KV_PLAN_NONE && r.kv_base != CI_KV_BF16)
    return ci_api_fail(CINFER_INVALID_ARGUMENT,
                       "kv_codec \"%s\" is engine-wide (cinfer_engine_options.kv_codec)",
                       params->kv_codec);
  ci_grammar *grammar;
  ci_grammar_vocab *grammar_vocab;
  status = ci_api_grammar(engine->model, params, CINFER_REJECTED, &grammar, &grammar_vocab);
  if (status != CINFER_OK) return status;
  cinfer_request *request = calloc(1, sizeof *request);
  if (!request) {
    ci_grammar_free(grammar);
    return ci_api_fail(CINFER_ERROR, "out of memory for a request");
  }
  ci_engine_job job = {0};
  job.grammar = grammar; /* the request takes its own reference */
  job.grammar_vocab = grammar_vocab;
  job.prompt = prompt;
  job.n_prompt = (int)n_prompt;
  job.max_tokens = r.max_tokens;
  job.sampling = r.sampling;
  job.eos = r.eos;
  job.kv_plan = r.kv_plan;
  job.kv_target = r.kv_target;
  job.kv_start = r.kv_start;
  job.kv_protect = r.kv_protect;
  const ci_engine_verdict verdict = ci_engine_submit(engine->engine, &job, &request->request);
  ci_grammar_free(grammar);
  switch (verdict) {
  case CI_ENGINE_SUBMITTED:
    *out = request;
    return CINFER_OK;
  case CI_ENGINE_REJECTED:
  case CI_ENGINE_OVER_CONTEXT:
  case CI_ENGINE_OVER_BUDGET:
    status = CINFER_REJECTED;
    break;
  case CI_ENGINE_OUT_OF_MEMORY:
    status = CINFER_ERROR;
    break;
  case CI_ENGINE_QUEUE_FULL:
    status = CINFER_QUEUE_FULL;
    break;
  case CI_ENGINE_STOPPED:
    status = CINFER_STOPPED;
    break;
  }
  free(request);
  return status;
}

static cinfer_finish finish_of(ci_finish_reason reason) {
  switch (reason) {
  case CI_FINISH_STOP:
    return CINFER_FINISH_STOP;
  case CI_FINISH_LENGTH:
    return CINFER_FINISH_LENGTH;
  case CI_FINISH_ABORT:
    return CINFER_FINISH_CANCEL;
  }
  return CINFER_FINISH_NONE;
}

cinfer_status cinfer_request_next(cinfer_request *request, cinfer_event *event,
                                  double timeout_seconds) {
  if (!request || !event)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_request_next: NULL argument");
  memset(event, 0, sizeof *event);
  if (request->finished) return CINFER_DONE;
  ci_engine_event e;
  if (!ci_engine_request_next(request->request, &e, timeout_seconds)) return CINFER_TIMEOUT;
  switch (e.kind) {
  case CI_ENGINE_EVENT_TOKEN:
    event->kind = CINFER_EVENT_TOKEN;
    event->token = e.token;
    event->logprob = e.logprob;
    break;
  case CI_ENGINE_EVENT_DONE:
    event->kind = CINFER_EVENT_DONE;
    event->token = -1;
    event->finish = finish_of(e.finish);
    event->prompt_tokens = e.prompt_tokens;
    event->cached_tokens = e.cached_tokens;
    event->generated_tokens = e.generated_tokens;
    request->finished = 1;
    break;
  case CI_ENGINE_EVENT_ERROR:
    event->kind = CINFER_EVENT_ERROR;
    event->token = -1;
    snprintf(event->message, sizeof event->message, "%s", e.message);
    request->finished = 1;
    break;
  }
  return CINFER_OK;
}

void cinfer_request_cancel(cinfer_request *request) {
  if (request) ci_engine_request_cancel(request->request);
}

void cinfer_request_free(cinfer_request *request) {
  if (!request) return;
  ci_engine_request_release(request->request);
  free(request);
}
