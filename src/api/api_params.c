/* Public API generation parameters: their defaults (built-in, then the model's
 * generation_config.json) and their resolution into sampler parameters, the EOS set and the
 * KV codec plan. */
#include "api/api_internal.h"

#include "base/error.h"
#include "engine/params.h"

#include <stdint.h>
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
  params->repetition_context = sampling.penalties.repetition_context;
  params->presence_context = sampling.penalties.presence_context;
  params->frequency_context = sampling.penalties.frequency_context;
  params->xtc_probability = sampling.xtc_probability;
  params->xtc_threshold = sampling.xtc_threshold;
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
  if (p->adapter) {
    if (p->adapter->model != model)
      return ci_api_fail(CINFER_INVALID_ARGUMENT, "the adapter was loaded for another model");
    out->lora = p->adapter->lora;
  }
  ci_sampler_params *s = &out->sampling;
  ci_sampler_params_default(s);
  s->temperature = p->temperature;
  s->top_p = p->top_p;
  s->top_k = p->top_k;
  s->min_p = p->min_p;
  s->penalties.repetition = p->repetition_penalty;
  s->penalties.presence = p->presence_penalty;
  s->penalties.frequency = p->frequency_penalty;
  s->penalties.repetition_context = p->repetition_context;
  s->penalties.presence_context = p->presence_context;
  s->penalties.frequency_context = p->frequency_context;
  s->xtc_probability = p->xtc_probability;
  s->xtc_threshold = p->xtc_threshold;
  s->seed = p->seed;
  s->has_seed = p->has_seed;
  if (p->n_logit_bias > 0 && !p->logit_bias)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "logit_bias is NULL with %zu entries",
                       p->n_logit_bias);
  if (p->n_logit_bias > (size_t)INT32_MAX)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "too many logit_bias entries");
  /* cinfer_logit_bias and ci_logit_bias are both {int32_t, float} */
  _Static_assert(sizeof(cinfer_logit_bias) == sizeof(ci_logit_bias), "logit bias layout");
  s->logit_bias = (const ci_logit_bias *)p->logit_bias;
  s->n_logit_bias = (int)p->n_logit_bias;
  if (ci_sampler_params_validate(s, ci_model_vocab_size(model->model)))
    return CINFER_INVALID_ARGUMENT;
  if (p->max_tokens < 1)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "max_tokens must be >= 1 (got %d)", p->max_tokens);
  if (p->context_size < 0 || p->prefill_chunk < 0)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "context_size and prefill_chunk must be >= 0");
  if (p->lookup_ngram < 0 || p->lookup_ngram > 64 || p->draft_max < 0 || p->draft_max > 32 ||
      p->draft_min < 0 || (p->draft_max > 0 && p->draft_min > p->draft_max))
    return ci_api_fail(CINFER_INVALID_ARGUMENT,
                       "lookup_ngram must be in [0, 64], draft_max in [0, 32] and draft_min in "
                       "[0, draft_max]");
  out->max_tokens = p->max_tokens;
  if (!p->ignore_eos) out->eos = model->eos;
  if (p->n_stop_token_ids > 0 && !p->stop_token_ids)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "stop_token_ids is NULL with %zu entries",
                       p->n_stop_token_ids);
  const int vocab = ci_model_vocab_size(model->model);
  for (size_t i = 0; i < p->n_stop_token_ids; i++) {
    if (p->stop_token_ids[i] < 0 || p->stop_token_ids[i] >= vocab)
      return ci_api_fail(CINFER_INVALID_ARGUMENT, "stop_token_ids: id %d is out of range [0, %d)",
                         (int)p->stop_token_ids[i], vocab);
    if (ci_eos_set_add(&out->eos, p->stop_token_ids[i]))
      return ci_api_fail(CINFER_INVALID_ARGUMENT,
                         "stop_token_ids: at most %d distinct ids (EOS ids included)",
                         CI_EOS_SET_MAX);
  }
  const cinfer_status status = ci_api_resolve_kv(p, out);
  if (status != CINFER_OK || out->kv_plan != CI_KV_PLAN_TARGET) return status;
  /* a codec every cache layer of this model can store (head_dim divisibility, powers of two) */
  const ci_model_spec *spec = &model->model->spec;
  for (int l = 0; l < spec->n_cache_layers; l++)
    if (ci_kv_format_check(&out->kv_target, ci_spec_cache_layer(spec, l)->head_dim))
      return ci_api_fail(CINFER_INVALID_ARGUMENT, "kv_codec: %s", ci_last_error());
  return CINFER_OK;
}
