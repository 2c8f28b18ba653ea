/* Speculative verification of one drafted token (docs/generation.md §6 "Round", step 4): greedy
 * acceptance (the draft must be the argmax) and the rejection sampling of Leviathan et al. / Chen
 * et al. (accept d with probability min(1, p(d)/q(d)), else draw from normalize(max(0, p - q))),
 * which leaves every emitted token distributed exactly as the target's sampler would draw it.
 * p is the sampler's final distribution at the position: processors (logit bias, penalties over
 * the history extended by the drafts before it), filters (top-k, top-p, min-p) and temperature. */
#ifndef CI_SAMPLE_SPEC_VERIFY_H
#define CI_SAMPLE_SPEC_VERIFY_H

#include "sample/sampler.h"

#include <stddef.h>
#include <stdint.h>

/* Scratch of one verifier, sized to the vocabulary (owned by whoever verifies). */
typedef struct {
  int vocab;
  int32_t *ids; /* [vocab] surviving ids of p */
  float *probs; /* [vocab] their probabilities */
  float *dense; /* [vocab] p scattered by id; all zero between calls */
} ci_spec_scratch;

/* Allocates the scratch. Returns CI_OK, or CI_ERR with ci_last_error (out of memory). */
int ci_spec_scratch_init(ci_spec_scratch *scratch, int vocab);

/* Frees the scratch's buffers (a zeroed scratch is a no-op). */
void ci_spec_scratch_free(ci_spec_scratch *scratch);

/* Verifies `draft` at output index `index` against the target's raw logits of that position
 * (processed in place), with `history` = prompt + tokens so far + the drafts before this one.
 * q: the drafter's final distribution over the vocabulary (dense probabilities), or NULL for a
 * point mass on the draft (prompt lookup). Returns the token to emit (the draft when *accepted,
 * else its replacement), or -1 with ci_last_error (every token banned). The sampler's index is
 * not moved; ci_sampler_logprobs holds this position's lp afterwards. */
int32_t ci_spec_verify(ci_sampler *sampler, ci_spec_scratch *scratch, float *logits,
                       const int32_t *history, size_t n_history, uint64_t index, int32_t draft,
                       const float *q, int *accepted);

#endif
