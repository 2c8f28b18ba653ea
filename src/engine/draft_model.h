/* Draft-model drafting for speculative decoding (docs/generation.md "Speculative decoding"): a
 * request's draft sequence, in the draft model's own paged KV cache, first catches up on the
 * tokens it has not seen, then proposes k tokens one forward at a time. Several requests draft
 * together with a ci_draft_batch: one draft-model step per drafted position covers every
 * sequence still drafting (each with its own k), which gives the same drafts as drafting each
 * alone (the draft model's steps are batch invariant). Draft j is drawn from
 * q_j, the request's sampling parameters applied to the draft's logits (processors over the
 * history extended by the drafts before it, filters, temperature), by a Gumbel draw keyed by the
 * output index the token would take under a seed of its own (independent of the target's
 * acceptance test). At temperature 0, q_j is the draft's argmax. */
#ifndef CI_ENGINE_DRAFT_MODEL_H
#define CI_ENGINE_DRAFT_MODEL_H

#include "model/model.h"
#include "model/workspace.h"
#include "sample/rng.h"
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
  /* the proposal under way (ci_draft_begin) */
  const int32_t *context; /* [n] then the drafts: drafts == context + n */
  int64_t n;
  int k, j; /* drafts wanted, drafted so far */
  uint64_t first_index;
  ci_rng rng;
} ci_draft_state;

/* Drafts several requests' rounds together. Owns a workspace and step buffers for up to
 * max_seqs sequences of up to max_catch_up catch-up rows each, sized at creation so that a round
 * allocates nothing. */
typedef struct {
  ci_model *model;       /* borrowed */
  ci_workspace *ws;      /* owned */
  ci_step_seq *step;     /* [max_seqs] */
  ci_draft_state **live; /* [max_seqs] */
  float *logits;         /* [max_seqs][vocab] */
  int max_seqs;
  int max_catch_up;  /* rows of a sequence's catch-up in the batched step; more run alone first */
  int logits_pinned; /* logits registered with the backend (a device writes them directly) */
} ci_draft_batch;

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

/* Starts a proposal of k (1..max_draft) tokens after context[0..n) for ci_draft_batch_run, the
 * first taking output index first_index; they go to context + n. Returns CI_OK, or CI_ERR with
 * ci_last_error (nothing to draft from, bad k). */
int ci_draft_begin(ci_draft_state *d, const int32_t *context, int64_t n, int k,
                   uint64_t first_index);

/* A batch for `model` of up to max_seqs sequences whose catch-ups run together up to
 * max_catch_up rows each (a longer one first runs its excess alone, in chunks of at most
 * max_seqs * max_catch_up rows). Returns CI_OK, or CI_ERR with ci_last_error (the batch is then
 * empty; freeing it is safe). */
int ci_draft_batch_init(ci_draft_batch *b, ci_model *model, int max_seqs, int max_catch_up);

/* Frees what the batch owns; a zeroed batch is a no-op. */
void ci_draft_batch_free(ci_draft_batch *b);

/* Runs the begun proposals of states[0..n) (n <= max_seqs) together: one draft-model step for
 * every sequence's catch-up, then one step per further drafted position over the sequences still
 * drafting. Each state ends as after ci_draft_propose. *steps (may be NULL) gets the number of
 * draft-model steps run (the largest k). Returns CI_OK, or CI_ERR with ci_last_error: then every
 * state of the call is in no defined state and its request must stop speculating. *drafting_ms
 * (may be NULL) gets the wall time of those steps alone: the long catch-ups run first (a prompt,
 * tokens decoded without speculating) are left out, so a speculation policy weighs what a
 * drafted position costs, not what a prompt once cost. */
int ci_draft_batch_run(ci_draft_batch *b, ci_draft_state *const *states, int n, int *steps,
                       double *drafting_ms);

/* Closes the proposal's round keeping n_keep positions (the context length at the proposal up to
 * what it holds now): the positions of rejected drafts are rolled back. Returns CI_OK or CI_ERR. */
int ci_draft_state_keep(ci_draft_state *d, int64_t n_keep);

#endif
