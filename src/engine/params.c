/* Parameter precedence: built-in < generation_config.json < CLI < request (see params.h). */
#include "engine/params.h"

static void apply_generation_config(const ci_generation_config *gen, ci_sampler_params *p,
                                    int *max_tokens) {
  if (gen->has_temperature) p->temperature = gen->temperature;
  if (gen->has_top_p) p->top_p = gen->top_p;
  if (gen->has_top_k) p->top_k = gen->top_k;
  if (gen->has_min_p) p->min_p = gen->min_p;
  if (gen->has_repetition_penalty) p->penalties.repetition = gen->repetition_penalty;
  if (gen->has_max_new_tokens) *max_tokens = gen->max_new_tokens;
}

static void apply_overrides(const ci_sampling_overrides *o, ci_sampler_params *p, int *max_tokens,
                            int *defaulted) {
  if (o->has_temperature) p->temperature = o->temperature;
  if (o->has_top_p) p->top_p = o->top_p;
  if (o->has_top_k) p->top_k = o->top_k;
  if (o->has_min_p) p->min_p = o->min_p;
  if (o->has_repetition_penalty) p->penalties.repetition = o->repetition_penalty;
  if (o->has_presence_penalty) p->penalties.presence = o->presence_penalty;
  if (o->has_frequency_penalty) p->penalties.frequency = o->frequency_penalty;
  if (o->has_seed) {
    p->seed = o->seed;
    p->has_seed = 1;
  }
  if (o->has_max_tokens) {
    *max_tokens = o->max_tokens;
    *defaulted = 0;
  }
}

void ci_sampling_resolve(const ci_generation_config *gen,
                         const ci_sampling_overrides *const *layers, int n_layers,
                         int builtin_max_tokens, ci_sampler_params *params, int *max_tokens,
                         int *max_tokens_defaulted) {
  ci_sampler_params_default(params);
  *max_tokens = builtin_max_tokens;
  *max_tokens_defaulted = 1;
  if (gen) apply_generation_config(gen, params, max_tokens);
  for (int i = 0; i < n_layers; i++)
    if (layers[i]) apply_overrides(layers[i], params, max_tokens, max_tokens_defaulted);
}
