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
  ci_kv_codec base;    /* what every sequence starts in */
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
  options->batch_tokens = defaults.batch_tokens;
  options->prefill_chunk = defaults.prefill_chunk;
  options->max_queue = defaults.max_queue;
  options->lookup_ngram = defaults.lookup_ngram;
  options->draft_max = defaults.draft_max;
  options->draft_min = defaults.draft_min;
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
      options->kv_budget_bytes < 0 || options->prefix_cache_bytes < 0 ||
      options->batch_tokens < 1 || options->prefill_chunk < 1 || options->max_queue < 0)
    return ci_api_fail(CINFER_INVALID_ARGUMENT,
                       "engine options: max_batch, batch_tokens and prefill_chunk must be >= 1, "
                       "the others >= 0");
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
  o.batch_tokens = options->batch_tokens;
  o.prefill_chunk = options->prefill_chunk;
  o.max_queue = options->max_queue;
  o.lookup_ngram = options->lookup_ngram;
  o.draft_model = options->draft_model ? options->draft_model->model : NULL;
  o.draft_max = options->draft_max;
  o.draft_min = options->draft_min;
  o.spec_max_batch = options->spec_max_batch;
  if (options->spec_policy < CINFER_SPEC_AUTO || options->spec_policy > CINFER_SPEC_NEVER)
    return ci_api_fail(CINFER_INVALID_ARGUMENT,
                       "engine options: spec_policy %d is not one of "
                       "CINFER_SPEC_AUTO, CINFER_SPEC_ALWAYS, CINFER_SPEC_NEVER",
                       options->spec_policy);
  _Static_assert((int)CINFER_SPEC_ALWAYS == (int)CI_ENGINE_SPEC_ALWAYS &&
                     (int)CINFER_SPEC_NEVER == (int)CI_ENGINE_SPEC_NEVER,
                 "the public and engine speculation policies are the same values");
  o.spec_policy = options->spec_policy;
  o.prompt_cache_dir = options->prompt_cache_dir;
  o.prompt_cache_queue_bytes = options->prompt_cache_queue_bytes;
  o.prompt_cache_warn = options->prompt_cache_warn;
  o.prompt_cache_warn_arg = options->prompt_cache_warn_user;
  if (o.prompt_cache_dir && o.prefix_cache_bytes <= 0)
    return ci_api_fail(CINFER_INVALID_ARGUMENT,
                       "engine options: prompt_cache_dir needs the prefix cache "
                       "(prefix_cache_bytes > 0)");
  cinfer_engine *e = calloc(1, sizeof *e);
  if (!e) return ci_api_fail(CINFER_ERROR, "out of memory for an engine");
  e->model = model;
  e->base = o.base;
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
  return cinfer_engine_submit_n(engine, prompt, n_prompt, params, 1, out);
}

uint64_t cinfer_choice_seed(uint64_t seed, int index) {
  return ci_engine_choice_seed(seed, index);
}

/* What a job's KV state and prefix-cache key depend on, from resolved parameters: the codec plan
 * and the LoRA adapter (a request takes its own reference to it). */
static void job_state_from(ci_engine_job *job, const ci_api_resolved *r) {
  job->kv_plan = r->kv_plan;
  job->kv_target = r->kv_target;
  job->kv_start = r->kv_start;
  job->kv_protect = r->kv_protect;
  job->lora = r->lora;
}

cinfer_status cinfer_engine_submit_n(cinfer_engine *engine, const int32_t *prompt, size_t n_prompt,
                                     const cinfer_params *params, int n, cinfer_request **out) {
  if (!out) return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_engine_submit: out is NULL");
  if (!engine || n < 1 || n > ci_engine_max_batch(engine->engine))
    return ci_api_fail(CINFER_INVALID_ARGUMENT,
                       "cinfer_engine_submit_n: n must be between 1 and the engine's batch "
                       "size %d (got %d)",
                       engine ? ci_engine_max_batch(engine->engine) : 0, n);
  for (int i = 0; i < n; i++) out[i] = NULL;
  if (!prompt || n_prompt == 0 || n_prompt > (size_t)INT32_MAX)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_engine_submit: no prompt");
  cinfer_params defaults;
  if (!params) {
    cinfer_params_init(&defaults, engine->model);
    params = &defaults;
  }
  ci_api_resolved r;
  cinfer_status status = ci_api_resolve(engine->model, params, &r);
  if (status != CINFER_OK) return status;
  if (r.kv_plan == CI_KV_PLAN_NONE && r.kv_base != engine->base)
    return ci_api_fail(CINFER_INVALID_ARGUMENT,
                       "kv_codec \"%s\" is engine-wide (cinfer_engine_options.kv_codec)",
                       params->kv_codec);
  if (params->top_logprobs < 0 || params->top_logprobs > CINFER_MAX_TOP_LOGPROBS)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "top_logprobs must be in [0, %d] (got %d)",
                       CINFER_MAX_TOP_LOGPROBS, params->top_logprobs);
  /* A defaulted cap is cut to the room the context leaves; an explicit one is checked by the
   * engine (the request is rejected when it does not fit). */
  const int64_t ctx = ci_engine_ctx_size(engine->engine);
  if (!params->max_tokens_explicit && (int64_t)n_prompt < ctx &&
      (int64_t)n_prompt + r.max_tokens > ctx)
    r.max_tokens = (int)(ctx - (int64_t)n_prompt);
  if ((int64_t)n_prompt >= ctx || (int64_t)n_prompt + r.max_tokens > ctx)
    return ci_api_fail(CINFER_CONTEXT_EXCEEDED,
                       "this model's maximum context length is %lld tokens; the request needs "
                       "%lld (prompt %zu + max_tokens %d)",
                       (long long)ctx, (long long)n_prompt + r.max_tokens, n_prompt, r.max_tokens);
  ci_grammar *grammar;
  ci_grammar_vocab *grammar_vocab;
  status = ci_api_grammar(engine->model, params, CINFER_REJECTED, &grammar, &grammar_vocab);
  if (status != CINFER_OK) return status;
  cinfer_request *requests[CI_ENGINE_MAX_BATCH];
  int made = 0;
  while (made < n && (requests[made] = calloc(1, sizeof **requests))) made++;
  if (made < n) {
    for (int i = 0; i < made; i++) free(requests[i]);
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
  job_state_from(&job, &r);
  job.top_logprobs = params->top_logprobs;
  job.num_draft = params->grammar || params->json_schema ? -1 : params->num_draft;
  ci_engine_request *handles[CI_ENGINE_MAX_BATCH];
  const ci_engine_verdict verdict = ci_engine_submit_n(engine->engine, &job, n, handles);
  ci_grammar_free(grammar);
  switch (verdict) {
  case CI_ENGINE_SUBMITTED:
    for (int i = 0; i < n; i++) {
      requests[i]->request = handles[i];
      out[i] = requests[i];
    }
    return CINFER_OK;
  case CI_ENGINE_REJECTED:
    status = CINFER_REJECTED;
    break;
  case CI_ENGINE_OVER_CONTEXT:
    status = CINFER_CONTEXT_EXCEEDED;
    break;
  case CI_ENGINE_OVER_BUDGET:
    status = CINFER_OVER_BUDGET;
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
  for (int i = 0; i < n; i++) free(requests[i]);
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
    event->n_top = e.n_top < CINFER_MAX_TOP_LOGPROBS ? e.n_top : CINFER_MAX_TOP_LOGPROBS;
    memcpy(event->top_ids, e.top_ids, (size_t)event->n_top * sizeof *event->top_ids);
    memcpy(event->top_logprobs, e.top_logprobs, (size_t)event->n_top * sizeof *event->top_logprobs);
    break;
  case CI_ENGINE_EVENT_DONE:
    event->kind = CINFER_EVENT_DONE;
    event->token = -1;
    event->finish = finish_of(e.finish);
    event->prompt_tokens = e.prompt_tokens;
    event->cached_tokens = e.cached_tokens;
    event->generated_tokens = e.generated_tokens;
    event->queue_seconds = e.queue_seconds;
    event->prefill_seconds = e.prefill_seconds;
    event->decode_seconds = e.decode_seconds;
    event->draft_tokens = e.draft_tokens;
    event->accepted_tokens = e.accepted_tokens;
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

void cinfer_engine_stop(cinfer_engine *engine) {
  if (engine) ci_engine_stop(engine->engine);
}

int cinfer_engine_context_size(const cinfer_engine *engine) {
  return engine ? ci_engine_ctx_size(engine->engine) : 0;
}

int cinfer_engine_max_batch(const cinfer_engine *engine) {
  return engine ? ci_engine_max_batch(engine->engine) : 0;
}

cinfer_status cinfer_engine_get_stats(cinfer_engine *engine, cinfer_engine_stats *stats) {
  if (!engine || !stats)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_engine_get_stats: NULL argument");
  ci_engine_stats st;
  ci_engine_get_stats(engine->engine, &st);
  memset(stats, 0, sizeof *stats);
  stats->n_kv_formats =
      st.n_kv_formats < CINFER_MAX_KV_FORMATS ? st.n_kv_formats : CINFER_MAX_KV_FORMATS;
  for (int i = 0; i < stats->n_kv_formats; i++) {
    cinfer_kv_usage *u = &stats->kv_formats[i];
    ci_kv_format_name(&st.kv_formats[i].format, u->codec, sizeof u->codec);
    u->blocks_used = st.kv_formats[i].blocks_used;
    u->blocks_free = st.kv_formats[i].blocks_free;
    u->bytes_used = st.kv_formats[i].bytes_used;
  }
  stats->n_kv_conversions =
      st.n_kv_conversions < CINFER_MAX_KV_FORMATS ? st.n_kv_conversions : CINFER_MAX_KV_FORMATS;
  for (int i = 0; i < stats->n_kv_conversions; i++) {
    ci_kv_format_name(&st.kv_conversion_formats[i], stats->kv_conversion_codecs[i],
                      sizeof stats->kv_conversion_codecs[i]);
    stats->kv_conversions[i] = st.kv_conversions[i];
  }
  stats->running = st.running;
  stats->waiting = st.waiting;
  stats->blocks_used = st.blocks_used;
  stats->bytes_used = st.bytes_used;
  stats->kv_budget_bytes = st.kv_budget_bytes;
  stats->reserved_bytes = st.reserved_bytes;
  stats->requests_finished = st.requests_finished;
  stats->requests_cancelled = st.requests_cancelled;
  stats->requests_failed = st.requests_failed;
  stats->prompt_tokens = st.prompt_tokens;
  stats->cached_tokens = st.cached_tokens;
  stats->generated_tokens = st.generated_tokens;
  stats->steps = st.steps;
  stats->step_rows = st.step_rows;
  stats->prefix_hits = st.prefix_hits;
  stats->prefix_misses = st.prefix_misses;
  stats->spec_draft_tokens = st.spec_draft_tokens;
  stats->spec_accepted_tokens = st.spec_accepted_tokens;
  stats->spec_steps = st.spec_steps;
  stats->spec_declined_steps = st.spec_declined_steps;
  stats->spec_draft_steps = st.spec_draft_steps;
  stats->prefix_cache_bytes = st.prefix_cache_bytes;
  stats->prefix_cache_max_bytes = st.prefix_cache_max_bytes;
  stats->prefix_cache_blocks = st.prefix_cache_blocks;
  stats->prefix_cache_entries = st.prefix_cache_entries;
  stats->prefill_tokens = st.prefill_tokens;
  stats->prompt_cache_on = st.prompt_cache_on;
  stats->prompt_cache_blocks_written = st.prompt_cache_blocks_written;
  stats->prompt_cache_bytes_written = st.prompt_cache_bytes_written;
  stats->prompt_cache_blocks_dropped = st.prompt_cache_blocks_dropped;
  stats->prompt_cache_write_errors = st.prompt_cache_write_errors;
  stats->prompt_cache_blocks_loaded = st.prompt_cache_blocks_loaded;
  stats->prompt_cache_bytes_loaded = st.prompt_cache_bytes_loaded;
  stats->prompt_cache_files_rejected = st.prompt_cache_files_rejected;
  stats->prompt_cache_queued_bytes = st.prompt_cache_queued_bytes;
  return CINFER_OK;
}

cinfer_status cinfer_engine_cache_save(cinfer_engine *engine, int64_t *blocks) {
  if (blocks) *blocks = 0;
  if (!engine) return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_engine_cache_save: no engine");
  cinfer_engine_stats st;
  cinfer_engine_get_stats(engine, &st);
  if (!st.prompt_cache_on)
    return ci_api_fail(CINFER_INVALID_ARGUMENT,
                       "the engine has no prompt cache directory (prompt_cache_dir)");
  if (ci_engine_prompt_cache_save(engine->engine, blocks)) return CINFER_STOPPED;
  return CINFER_OK;
}

cinfer_status cinfer_engine_cache_load(cinfer_engine *engine, const int32_t *prompt,
                                       size_t n_prompt, const cinfer_params *params,
                                       int64_t *cached_tokens, int64_t *loaded_blocks) {
  if (!cached_tokens)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_engine_cache_load: cached_tokens is NULL");
  *cached_tokens = 0;
  if (loaded_blocks) *loaded_blocks = 0;
  if (!engine || !prompt || n_prompt == 0 || n_prompt > (size_t)INT32_MAX)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_engine_cache_load: no prompt");
  cinfer_engine_stats st;
  cinfer_engine_get_stats(engine, &st);
  if (!st.prompt_cache_on)
    return ci_api_fail(CINFER_INVALID_ARGUMENT,
                       "the engine has no prompt cache directory (prompt_cache_dir)");
  cinfer_params defaults;
  if (!params) {
    cinfer_params_init(&defaults, engine->model);
    params = &defaults;
  }
  ci_api_resolved r;
  cinfer_status status = ci_api_resolve(engine->model, params, &r);
  if (status != CINFER_OK) return status;
  ci_engine_job job = {0};
  job.prompt = prompt;
  job.n_prompt = (int)n_prompt;
  job_state_from(&job, &r);
  for (size_t i = 0; i < n_prompt; i++)
    if (prompt[i] < 0 || prompt[i] >= engine->model->model->spec.vocab)
      return ci_api_fail(CINFER_INVALID_ARGUMENT,
                         "token id %d at position %zu is outside the vocabulary", prompt[i], i);
  if (ci_engine_prompt_cache_load(engine->engine, &job, cached_tokens, loaded_blocks)) {
    char why[256];
    snprintf(why, sizeof why, "%s", ci_last_error());
    const cinfer_status code = strstr(why, "slot")   ? CINFER_QUEUE_FULL
                               : strstr(why, "stop") ? CINFER_STOPPED
                                                     : CINFER_INVALID_ARGUMENT;
    return ci_api_fail(code, "%s", why);
  }
  return CINFER_OK;
}

ci_engine *ci_api_engine_impl(cinfer_engine *engine) {
  return engine->engine;
}
