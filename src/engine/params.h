/* Parameter precedence (docs/generation.md §4.1): request > CLI flag > generation_config.json >
 * built-in. Each source that can set sampling parameters fills a ci_sampling_overrides (a field
 * applies only when its has_ flag is set); ci_sampling_resolve stacks them on the built-in defaults
 * and the model's generation_config.json. The thinking-aware temperature rule belongs to the caller
 * that knows the template (it sets has_temperature itself). */
#ifndef CI_ENGINE_PARAMS_H
#define CI_ENGINE_PARAMS_H

#include "io/generation_config.h"
#include "sample/sampler.h"

#include <stdint.h>

typedef struct {
  int has_temperature;
  float temperature;
  int has_top_p;
  float top_p;
  int has_top_k;
  int top_k;
  int has_min_p;
  float min_p;
  int has_repetition_penalty;
  float repetition_penalty;
  int has_presence_penalty;
  float presence_penalty;
  int has_frequency_penalty;
  float frequency_penalty;
  int has_seed;
  uint64_t seed;
  int has_max_tokens;
  int max_tokens;
} ci_sampling_overrides;

/* Resolves the parameters of one request: built-in defaults (ci_sampler_params_default,
 * max_tokens = builtin_max_tokens), then gen (may be NULL), then layers[0..n_layers) in
 * increasing precedence (e.g. {cli, request}; NULL entries are skipped). *max_tokens receives
 * the resolved cap and *max_tokens_defaulted whether no override layer set it (the model's
 * max_new_tokens is still a default) — a defaulted cap is clamped to the context, an explicit
 * one is validated against it. */
void ci_sampling_resolve(const ci_generation_config *gen,
                         const ci_sampling_overrides *const *layers, int n_layers,
                         int builtin_max_tokens, ci_sampler_params *params, int *max_tokens,
                         int *max_tokens_defaulted);

#endif
