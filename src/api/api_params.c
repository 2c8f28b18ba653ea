/* Public API generation parameters: their defaults (built-in, then the model's
 * generation_config.json) and their resolution into sampler parameters, the EOS set and the
 * KV codec plan. */
#include "api/api_internal.h"

#include "base/error.h"
#include "engine/params.h"

#include <string.h>

enum { BUILTIN_MAX_TOKENS = 256 };

void cinfer_params_init(cinfer_params *params, const cinfer_model *model) {
  memset(params, 0, sizeof *params);
  ci_sampler_params sampling;
  int max_tokens, defaulted;
  ci_sampling_resolve(model ? &model->generation : NULL, NULL, 0, BUILTIN_MAX_TOKENS, &sampling,
                      &max_tokens, &defaulted);
  params->temperature = sampling.temperature;
  params->top_p = sampling.top_p;
  params->top_k = sampling.top_k;
  params->min_p = sampling.min_p;
  params->repetition_penalty = sampling.penalties.repetition;
  params->presence_penalty = sampling.penalties.presence;
  params->frequency_penalty = sampling.penalties.frequency;
  params->max_tokens = max_tokens;
  params->kv_bits = 4;
}

/* The KV fields: the same precedence as the command line's --kv-* flags (docs/kv-cache.md §7). */
cinfer_status ci_api_resolve_kv(const cinfer_params *p, ci_api_resolved *out) {
  out->kv_base = CI_KV_BF16;
  out->kv_plan = CI_KV_PLAN_MODEL_CONFIG;
  out->kv_start = p->kv_start;
  out->kv_protect = p->kv_protect;
  if (p->kv_start < 0 || p->kv_protect < 0)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "kv_start and kv_protect must be >= 0");
  if (!p->kv_codec) return CINFER_OK;
  ci_kv_format format;
  if (ci_kv_format_parse(p->kv_codec, p->kv_bits ? p->kv_bits : 4, p->kv_value_bits,
                         p->kv_group_size, &format))
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "kv_codec: %s", ci_last_error());
  if (ci_kv_format_is_quantized(&format)) {
    out->kv_plan = CI_KV_PLAN_TARGET;
    out->kv_target = format;
  } else {
    out->kv_plan = CI_KV_PLAN_NONE;
    out->kv_base = format.codec;
  }
  return CINFER_OK;
}

cinfer_status ci_api_resolve(const cinfer_model *model, const cinfer_params *p,
                             ci_api_resolved *out) {
  memset(out, 0, sizeof *out);
  ci_sampler_params *s = &out->sampling;
  ci_sampler_params_default(s);
  s->temperature = p->temperature;
  s->top_p = p->top_p;
  s->top_k = p->top_k;
  s->min_p = p->min_p;
  s->penalties.repetition = p->repetition_penalty;
  s->penalties.presence = p->presence_penalty;
  s->penalties.frequency = p->frequency_penalty;
  s->seed = p->seed;
  s->has_seed = p->has_seed;
  if (ci_sampler_params_validate(s, ci_model_vocab_size(model->model)))
    return CINFER_INVALID_ARGUMENT;
  if (p->max_tokens < 1)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "max_tokens must be >= 1 (got %d)", p->max_tokens);
  if (p->context_size < 0 || p->prefill_chunk < 0)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "context_size and prefill_chunk must be >= 0");
  out->max_tokens = p->max_tokens;
  if (!p->ignore_eos) out->eos = model->eos;
  return ci_api_resolve_kv(p, out);
}
