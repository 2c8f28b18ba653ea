/* Draft-model drafting for speculative decoding (docs/generation.md "Speculative decoding"): a
 * request's draft sequence, in the draft model's own paged KV cache, first catches up on the
 * tokens it has not seen, then proposes k tokens one forward at a time. Draft j is drawn from
 * q_j, the request's sampling parameters applied to the draft's logits (processors over the
 * history extended by the drafts before it, filters, temperature), by a Gumbel draw keyed by the
 * output index the token would take under a seed of its own (independent of the target's
 * acceptance test). At temperature 0, q_j is the draft's argmax. */
#ifndef CI_ENGINE_DRAFT_MODEL_H
#define CI_ENGINE_DRAFT_MODEL_H

#include "model/model.h"
#include "sample/sampler.h"

#include <stdint.h>

typedef struct {
  ci_model *model;     /* borrowed */
  ci_kv_seq *seq;      /* owned, in the draft model's cache */
  ci_sampler *sampler; /* owned: the request's parameters and seed */
  int vocab;
  int max_draft;
  float *logits;  /* [vocab] the draft's logits of the next position */
  float *scratch; /* [vocab] */
  int32_t *ids;   /* [vocab] */
  float *probs;   /* [vocab] */
  float *q;       /* [max_draft][vocab] q_j of the last proposal, dense */
} ci_draft_state;

/* A draft state for one request: a new sequence in `cache` (the draft model's) with a rollback
 * reserve of max_draft, and a sampler with `params` and `seed`. Returns CI_OK, or CI_ERR with
 * ci_last_error; the state is then empty (ci_draft_state_free is still safe). */
int ci_draft_state_init(ci_draft_state *d, ci_model *model, ci_kv_cache *cache,
                        const ci_sampler_params *params, uint64_t seed, int max_draft);

/* Frees the sequence and buffers; a zeroed state is a no-op. */
void ci_draft_state_free(ci_draft_state *d);

/* Proposes k (1..max_draft) tokens after context[0..n), the first taking output index
 * first_index, into drafts[0..k) and q rows 0..k-1. The draft sequence then holds the context and
 * the first k-1 drafts inside an open round (ci_draft_state_keep closes it). Returns k, or -1
 * with ci_last_error. */
int ci_draft_propose(ci_draft_state *d, const int32_t *context, int64_t n, int k,
                     uint64_t first_index, int32_t *drafts);

/* Closes the proposal's round keeping n_keep positions (the context length at the proposal up to
 * what it holds now): the positions of rejected drafts are rolled back. Returns CI_OK or CI_ERR. */
int ci_draft_state_keep(ci_draft_state *d, int64_t n_keep);

#endif
