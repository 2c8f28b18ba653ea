/* The sampler (docs/generation.md §4; bare § numbers below refer to that page): request parameters,
 * the processors of §4.2, log-softmax, and the chain of §4.3 in its exact mlx-lm-compatible order —
 * top-p, min-p, XTC, top-k on the untempered lp, then a Gumbel-max draw over softmax(lp / T) keyed
 * by (seed, output index, token id) — or the argmax of lp at temperature 0. One sampler serves one
 * sequence: it owns a copy of the parameters, the seed, the next output index and scratch buffers
 * sized to the vocabulary (about 12 bytes per token), so a step allocates nothing. */
#ifndef CI_SAMPLE_SAMPLER_H
#define CI_SAMPLE_SAMPLER_H

#include "sample/processors.h"

#include <stddef.h>
#include <stdint.h>

/* Per-request parameters (§4.1). The pointers are borrowed: ci_sampler_create copies them. */
typedef struct {
  float temperature;         /* [0, 5]; 0 = greedy argmax, everything else skipped */
  float top_p;               /* [0, 1]; applied iff 0 < top_p < 1 */
  int top_k;                 /* >= 0; 0 or >= V = off */
  float min_p;               /* [0, 1]; 0 = off */
  int min_tokens_to_keep;    /* >= 1: the highest ones min-p never removes */
  float xtc_probability;     /* [0, 1]; 0 = off */
  float xtc_threshold;       /* [0, 0.5] */
  const int32_t *xtc_exempt; /* ids XTC never removes (EOS and newline ids) */
  int n_xtc_exempt;
  ci_penalties penalties; /* repetition (> 0), presence and frequency ([-2, 2]), windows >= 0 */
  const ci_logit_bias *logit_bias; /* bias in [-100, 100] or -inf (ban); ids < V */
  int n_logit_bias;
  uint64_t seed; /* request seed (an int64 taken as its bit pattern) */
  int has_seed;  /* 0: the sampler draws a seed from the OS (never from the clock) */
} ci_sampler_params;

typedef struct ci_sampler ci_sampler;

/* Built-in defaults (docs/generation.md §4.1): temperature 0.7, every filter and penalty off,
 * penalty windows 20, min_tokens_to_keep 1, xtc_threshold 0.1, no seed. */
void ci_sampler_params_default(ci_sampler_params *params);

/* Checks every field against §4.1 for a vocabulary of `vocab` tokens. Returns CI_OK, or CI_ERR
 * with a message naming the field (e.g. "top_p must be in [0, 1]"). */
int ci_sampler_params_validate(const ci_sampler_params *params, int vocab);

/* Validates params and creates a sampler for `vocab` tokens (seeded from the OS when
 * !params->has_seed). Returns NULL with ci_last_error on failure. The caller frees it. */
ci_sampler *ci_sampler_create(const ci_sampler_params *params, int vocab);

/* NULL is a no-op. */
void ci_sampler_free(ci_sampler *sampler);

/* Samples output index ci_sampler_index(sampler) and advances the index. logits holds the
 * vocab raw logits of the position being sampled and receives the processed logits z;
 * history is prompt + every token sampled so far (for the penalty windows). Returns the token
 * id, or -1 with ci_last_error when no token can be sampled (every token banned). */
int32_t ci_sampler_next(ci_sampler *sampler, float *logits, const int32_t *history,
                        size_t n_history);

/* The same for an explicit output index s (speculative verification samples positions out of
 * order); does not move the sampler's index. */
int32_t ci_sampler_sample_at(ci_sampler *sampler, float *logits, const int32_t *history,
                             size_t n_history, uint64_t s);

/* The final distribution output index s is drawn from (speculative verification needs it as
 * p_k, §6): runs the processors and filters as ci_sampler_sample_at does and writes the
 * surviving ids (in no particular order) to ids and softmax(lp / T) over them to probs, both
 * with room for vocab entries. At temperature 0 it is the argmax with probability 1. Returns
 * the number of survivors, or -1 with ci_last_error (every token banned). */
int ci_sampler_distribution(ci_sampler *sampler, float *logits, const int32_t *history,
                            size_t n_history, uint64_t s, int32_t *ids, float *probs);

/* Whether this sampler's choice is the greedy pick of the raw logits row (tensor/backend.h's
 * ci_row_pick): temperature 0 and no logit bias or penalty, so that a step may return the pick
 * instead of the row. The caller then emits pick.token and calls ci_sampler_advance(s, 1); the
 * token is the one ci_sampler_next would give, the logprob that of the pick. */
int ci_sampler_takes_row_picks(const ci_sampler *sampler);

/* Moves the output index on by n tokens emitted at explicit indexes (ci_sampler_sample_at,
 * speculative verification). */
void ci_sampler_advance(ci_sampler *sampler, uint64_t n);

/* lp = log_softmax(processed logits) of the last sampling call: vocab floats owned by the
 * sampler, valid until the next call (logprob = lp[token], §5). */
const float *ci_sampler_logprobs(const ci_sampler *sampler);

/* The seed in use (the drawn one when the request had none) and the next output index. */
uint64_t ci_sampler_seed(const ci_sampler *sampler);
uint64_t ci_sampler_index(const ci_sampler *sampler);

/* The parameters in use (pointer fields point into the sampler's own copies). */
const ci_sampler_params *ci_sampler_get_params(const ci_sampler *sampler);

#endif
