/* Single-sequence generation as a synchronous wrapper over the serving engine (see generate.h):
 * an engine of batch 1 runs the one generation loop there is; this file submits the job, feeds
 * the token events to the caller's callback (cancelling the request when it says stop) and
 * turns the DONE event into the result and its stats. */
#include "engine/generate.h"

#include "base/error.h"
#include "base/timing.h"
#include "engine/engine.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { DEFAULT_PREFILL_CHUNK = 2048 };

static const char *const finish_names[] = {
    [CI_FINISH_STOP] = "stop", [CI_FINISH_LENGTH] = "length", [CI_FINISH_ABORT] = "abort"};

const char *ci_finish_reason_name(ci_finish_reason reason) {
  return reason <= CI_FINISH_ABORT ? finish_names[reason] : "?";
}

void ci_generate_options_default(ci_generate_options *o) {
  memset(o, 0, sizeof *o);
  o->max_tokens = 256;
  o->prefill_chunk = DEFAULT_PREFILL_CHUNK;
  o->kv_codec = CI_KV_BF16;
}

void ci_generate_result_free(ci_generate_result *result) {
  if (!result) return;
  free(result->ids);
  result->ids = NULL;
  result->n_ids = 0;
}

static int validate(const ci_model *model, const int32_t *prompt, int n_prompt,
                    const ci_generate_options *o) {
  const ci_model_spec *spec = &model->spec;
  if (n_prompt < 1) return ci_fail("the prompt is empty (at least one token needed)");
  for (int i = 0; i < n_prompt; i++)
    if (prompt[i] < 0 || prompt[i] >= spec->vocab)
      return ci_fail("prompt token id %d at index %d is out of range [0, %d)", (int)prompt[i], i,
                     spec->vocab);
  if (o->max_tokens < 1) return ci_fail("max_tokens must be >= 1");
  if (o->prefill_chunk < 0) return ci_fail("prefill chunk must be >= 1");
  const int64_t ctx = o->ctx_size > 0 ? o->ctx_size : spec->max_position;
  if ((int64_t)n_prompt + o->max_tokens > ctx)
    return ci_fail("prompt (%d tokens) + max_tokens (%d) exceeds the context size %lld", n_prompt,
                   o->max_tokens, (long long)ctx);
  return CI_OK;
}

/* The engine of one call: batch 1, the caller's prefill chunk, context and KV codec, no prefix
 * cache, and a KV budget that never refuses what the context allows (the sequence's blocks are
 * allocated as it grows, as before). */
static ci_engine *call_engine(ci_model *model, const ci_generate_options *o, int chunk) {
  ci_engine_options eo;
  ci_engine_options_default(&eo);
  eo.batch = 1;
  eo.batch_tokens = chunk;
  eo.prefill_chunk = chunk;
  eo.max_queue = 1;
  eo.ctx_size = o->ctx_size > 0 ? o->ctx_size : model->spec.max_position;
  eo.base = o->kv_codec;
  eo.kv_protect = o->kv_plan == CI_KV_PLAN_TARGET ? o->kv_protect : 0;
  eo.kv_budget_bytes = -1;
  eo.prefix_cache_bytes = 0;
  return ci_engine_create(model, &eo);
}

int ci_generate(ci_model *model, ci_sampler *sampler, const int32_t *prompt, int n_prompt,
                const ci_generate_options *o, ci_generate_result *result) {
  memset(result, 0, sizeof *result);
  if (validate(model, prompt, n_prompt, o)) return CI_ERR;
  const int chunk = o->prefill_chunk > 0 ? o->prefill_chunk : DEFAULT_PREFILL_CHUNK;
  result->ids = malloc((size_t)o->max_tokens * sizeof *result->ids);
  if (!result->ids) return ci_fail("out of memory for generation buffers");
  ci_engine *engine = call_engine(model, o, chunk);
  if (!engine) return CI_ERR;
  ci_engine_job job;
  memset(&job, 0, sizeof job);
  job.prompt = prompt;
  job.n_prompt = n_prompt;
  job.max_tokens = o->max_tokens;
  job.sampler = sampler;
  if (o->eos) job.eos = *o->eos;
  job.kv_plan = o->kv_plan;
  job.kv_target = o->kv_target;
  job.kv_start = o->kv_start;
  job.kv_protect = o->kv_protect;
  ci_engine_request *request;
  if (ci_engine_submit(engine, &job, &request) != CI_ENGINE_SUBMITTED) {
    ci_engine_free(engine);
    return CI_ERR;
  }
  /* tokens after a callback verdict (the engine runs ahead until it sees the cancellation) are
   * not part of the result; every event is read, so the engine is done with the sampler */
  int verdict = 0, status = CI_OK;
  ci_engine_event ev;
  for (;;) {
    ci_engine_request_next(request, &ev, -1.0);
    if (ev.kind != CI_ENGINE_EVENT_TOKEN) break;
    if (verdict != 0) continue;
    result->ids[result->n_ids++] = ev.token;
    verdict = o->on_token ? o->on_token(o->ctx, ev.token) : 0;
    if (verdict != 0) ci_engine_request_cancel(request);
  }
  if (verdict != 0) {
    result->finish = verdict > 0 ? CI_FINISH_STOP : CI_FINISH_ABORT;
  } else if (ev.kind == CI_ENGINE_EVENT_ERROR) {
    status = ci_fail("%s", ev.message);
  } else {
    result->finish = ev.finish;
    if (ev.finish == CI_FINISH_STOP && ev.generated_tokens == result->n_ids + 1)
      result->ids[result->n_ids++] = ev.token; /* the EOS id that ended it */
  }
  ci_engine_request_release(request);
  ci_engine_free(engine);
  if (status) return CI_ERR;
  /* stats from the engine's timings: admission -> first token is the prefill */
  ci_generate_stats *st = &result->stats;
  st->prompt_tokens = n_prompt;
  st->generated_tokens = result->n_ids;
  st->prefill_seconds = ev.prefill_seconds;
  st->prefill_tok_s = ev.prefill_seconds > 0 ? n_prompt / ev.prefill_seconds : 0.0;
  st->decode_tok_s = result->n_ids > 1 && ev.decode_seconds > 0
                         ? (ev.generated_tokens - 1) / ev.decode_seconds
                         : 0.0;
  st->ttft_seconds = ev.queue_seconds + ev.prefill_seconds;
  st->total_seconds = ev.queue_seconds + ev.prefill_seconds + ev.decode_seconds;
  st->peak_rss_bytes = ci_peak_rss_bytes();
  return CI_OK;
}
