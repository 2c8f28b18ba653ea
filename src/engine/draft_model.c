/* Draft-model drafting: catch-up forward, then one forward per draft with a keyed draw from the
 * draft's final distribution, alone or batched over several requests (see draft_model.h). */
#include "engine/draft_model.h"

#include "base/error.h"
#include "base/timing.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Mixed into the request seed for the draft's own draws (any constant that is not 0). */
#define DRAFT_SEED_SALT 0xD2AF7C0FFEE1234Bull

int ci_draft_state_init(ci_draft_state *d, ci_model *model, ci_kv_cache *cache,
                        const ci_sampler_params *params, uint64_t seed, int max_draft) {
  memset(d, 0, sizeof *d);
  d->model = model;
  d->vocab = model->spec.vocab;
  d->max_draft = max_draft;
  ci_sampler_params p = *params;
  p.seed = seed;
  p.has_seed = 1;
  d->sampler = ci_sampler_create(&p, d->vocab);
  if (!d->sampler) return ci_fail_context("draft model");
  d->seq = ci_kv_seq_create(cache);
  if (!d->seq) {
    ci_draft_state_free(d);
    return ci_fail_context("draft model");
  }
  ci_kv_seq_set_rollback_reserve(d->seq, max_draft);
  /* a hybrid draft model's state checkpoints for its rounds of up to max_draft rows, now, so
   * that drafting never allocates */
  if (ci_kv_seq_reserve_checkpoints(d->seq, max_draft)) {
    ci_draft_state_free(d);
    return ci_fail_context("draft model");
  }
  const size_t v = (size_t)d->vocab;
  d->logits = malloc(v * sizeof *d->logits);
  d->scratch = malloc(v * sizeof *d->scratch);
  d->ids = malloc(v * sizeof *d->ids);
  d->probs = malloc(v * sizeof *d->probs);
  d->q = malloc((size_t)max_draft * v * sizeof *d->q);
  if (!d->logits || !d->scratch || !d->ids || !d->probs || !d->q) {
    ci_draft_state_free(d);
    return ci_fail("draft model: out of memory");
  }
  return CI_OK;
}

void ci_draft_state_free(ci_draft_state *d) {
  ci_kv_seq_free(d->seq);
  ci_sampler_free(d->sampler);
  free(d->logits);
  free(d->scratch);
  free(d->ids);
  free(d->probs);
  free(d->q);
  memset(d, 0, sizeof *d);
}

int ci_draft_begin(ci_draft_state *d, const int32_t *context, int64_t n, int k,
                   uint64_t first_index) {
  if (k < 1 || k > d->max_draft || d->seq->n >= n)
    return ci_fail("draft model: nothing to draft from (%lld of %lld tokens seen, %d drafts)",
                   (long long)d->seq->n, (long long)n, k);
  d->context = context;
  d->n = n;
  d->k = k;
  d->j = 0;
  d->first_index = first_index;
  ci_rng_init(&d->rng, ci_sampler_seed(d->sampler) ^ DRAFT_SEED_SALT);
  return CI_OK;
}

/* Draws draft j of the proposal from `logits` (the draft's logits of its position) into q row j
 * and context[n + j]. */
static int draft_pick(ci_draft_state *d, const float *logits) {
  const size_t v = (size_t)d->vocab;
  const int j = d->j;
  int32_t *drafts = (int32_t *)d->context + d->n; /* the caller's history, past the context */
  memcpy(d->scratch, logits, v * sizeof *d->scratch);
  /* context and drafts are contiguous: the processors see the drafts before j */
  const int count = ci_sampler_distribution(d->sampler, d->scratch, d->context, (size_t)(d->n + j),
                                            d->first_index + (uint64_t)j, d->ids, d->probs);
  if (count < 0) return ci_fail_context("draft model");
  float *q = d->q + (size_t)j * v;
  memset(q, 0, v * sizeof *q);
  const uint64_t key = ci_rng_key(&d->rng, d->first_index + (uint64_t)j);
  int32_t best = -1;
  double best_score = -INFINITY;
  for (int i = 0; i < count; i++) {
    q[d->ids[i]] = d->probs[i];
    if (!(d->probs[i] > 0.0f)) continue;
    const double score = log((double)d->probs[i]) -
                         log(-log(ci_rng_uniform(key, CI_RNG_STREAM_DRAW, (uint64_t)d->ids[i])));
    if (score > best_score || (score == best_score && d->ids[i] < best)) {
      best = d->ids[i];
      best_score = score;
    }
  }
  if (best < 0) return ci_fail("draft model: no token can be drafted");
  drafts[j] = best;
  d->j++;
  return CI_OK;
}

int ci_draft_propose(ci_draft_state *d, const int32_t *context, int64_t n, int k,
                     uint64_t first_index, int32_t *drafts) {
  if (drafts != context + n) return ci_fail("draft model: the drafts must follow the context");
  if (ci_draft_begin(d, context, n, k, first_index)) return -1;
  const int64_t seen = d->seq->n;
  if (ci_model_forward(d->model, d->seq, context + seen, (int)(n - seen), d->logits, 1))
    return ci_fail_context("draft model");
  if (ci_kv_seq_round_open(d->seq, 1)) return CI_ERR;
  while (d->j < k) {
    if (draft_pick(d, d->logits)) return CI_ERR;
    if (d->j < k && ci_model_forward(d->model, d->seq, context + n + d->j - 1, 1, d->logits, 1))
      return ci_fail_context("draft model");
  }
  return k;
}

int ci_draft_batch_init(ci_draft_batch *b, ci_model *model, int max_seqs, int max_catch_up) {
  memset(b, 0, sizeof *b);
  b->model = model;
  b->max_seqs = max_seqs;
  b->max_catch_up = max_catch_up;
  const int max_rows = max_seqs * max_catch_up;
  b->ws = ci_workspace_create(model->be);
  b->step = malloc((size_t)max_seqs * sizeof *b->step);
  b->live = malloc((size_t)max_seqs * sizeof *b->live);
  b->logits = malloc((size_t)max_seqs * (size_t)model->spec.vocab * sizeof *b->logits);
  if (!b->ws || !b->step || !b->live || !b->logits) {
    ci_draft_batch_free(b);
    return ci_fail("draft model: out of memory");
  }
  if (ci_workspace_fit(b->ws, &model->spec, max_rows, max_seqs)) {
    ci_draft_batch_free(b);
    return ci_fail_context("draft model");
  }
  /* a failure only makes the download slower */
  b->logits_pinned = model->be->ops->pin_host(model->be, b->logits,
                                              (size_t)max_seqs * (size_t)model->spec.vocab *
                                                  sizeof *b->logits) == CI_OK;
  return CI_OK;
}

void ci_draft_batch_free(ci_draft_batch *b) {
  if (b->logits_pinned) b->model->be->ops->unpin_host(b->model->be, b->logits);
  ci_workspace_free(b->ws);
  free(b->step);
  free(b->live);
  free(b->logits);
  memset(b, 0, sizeof *b);
}

int ci_draft_batch_run(ci_draft_batch *b, ci_draft_state *const *states, int n, int *steps,
                       double *drafting_ms) {
  if (steps) *steps = 0;
  if (drafting_ms) *drafting_ms = 0;
  if (n < 1) return CI_OK;
  if (n > b->max_seqs)
    return ci_fail("draft model: %d sequences in a batch of at most %d", n, b->max_seqs);
  const size_t v = (size_t)b->model->spec.vocab;
  const int chunk = b->max_seqs * b->max_catch_up; /* the rows the workspace holds */
  /* a long catch-up (a prompt, or tokens decoded without speculating) first runs alone, in
   * chunks that depend on the sequence only, down to max_catch_up rows */
  for (int i = 0; i < n; i++) {
    ci_draft_state *d = states[i];
    while (d->n - d->seq->n > b->max_catch_up) {
      const int64_t over = d->n - d->seq->n - b->max_catch_up;
      const ci_step_seq one = {
          .seq = d->seq, .ids = d->context + d->seq->n, .n_rows = over < chunk ? (int)over : chunk};
      if (ci_model_step(b->model, b->ws, &one, 1, NULL)) return ci_fail_context("draft model");
    }
  }
  /* the catch-up: every sequence's unseen tokens, the last row's logits */
  for (int i = 0; i < n; i++) {
    const ci_draft_state *d = states[i];
    const int64_t seen = d->seq->n;
    b->step[i] = (ci_step_seq){
        .seq = d->seq, .ids = d->context + seen, .n_rows = (int)(d->n - seen), .n_logit_rows = 1};
    b->live[i] = states[i];
  }
  int live = n;
  const double t0 = ci_now_seconds();
  while (live > 0) {
    if (ci_model_step(b->model, b->ws, b->step, live, b->logits))
      return ci_fail_context("draft model");
    if (steps) ++*steps;
    int kept = 0;
    for (int i = 0; i < live; i++) {
      ci_draft_state *d = b->live[i];
      if (d->j == 0 && ci_kv_seq_round_open(d->seq, 1)) return CI_ERR;
      if (draft_pick(d, b->logits + (size_t)i * v)) return CI_ERR;
      if (d->j == d->k) continue; /* done: it drops out of the later steps */
      b->live[kept] = d;
      b->step[kept++] = (ci_step_seq){
          .seq = d->seq, .ids = d->context + d->n + d->j - 1, .n_rows = 1, .n_logit_rows = 1};
    }
    live = kept;
  }
  if (drafting_ms) *drafting_ms = (ci_now_seconds() - t0) * 1e3;
  return CI_OK;
}

int ci_draft_state_keep(ci_draft_state *d, int64_t n_keep) {
  if (!d->seq->round_open) return CI_OK;
  if (n_keep > d->seq->n) n_keep = d->seq->n;
  return ci_kv_seq_round_close(d->seq, n_keep);
}
