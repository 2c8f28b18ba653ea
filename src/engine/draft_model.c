/* Draft-model drafting: catch-up forward, then one forward per draft with a keyed draw from the
 * draft's final distribution (see draft_model.h). */
#include "engine/draft_model.h"

#include "base/error.h"
#include "sample/rng.h"

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

int ci_draft_propose(ci_draft_state *d, const int32_t *context, int64_t n, int k,
                     uint64_t first_index, int32_t *drafts) {
  if (k < 1 || k > d->max_draft || d->seq->n >= n)
    return ci_fail("draft model: nothing to draft from (%lld of %lld tokens seen, %d drafts)",
                   (long long)d->seq->n, (long long)n, k);
  const int64_t seen = d->seq->n;
  if (ci_model_forward(d->model, d->seq, context + seen, (int)(n - seen), d->logits, 1))
    return ci_fail_context("draft model");
  if (ci_kv_seq_round_open(d->seq, 1)) return CI_ERR;
  ci_rng rng;
  ci_rng_init(&rng, ci_sampler_seed(d->sampler) ^ DRAFT_SEED_SALT);
  const size_t v = (size_t)d->vocab;
  for (int j = 0; j < k; j++) {
    memcpy(d->scratch, d->logits, v * sizeof *d->scratch);
    /* context and drafts are contiguous: drafts == context + n in the caller's history */
    const int count = ci_sampler_distribution(d->sampler, d->scratch, context, (size_t)(n + j),
                                              first_index + (uint64_t)j, d->ids, d->probs);
    if (count < 0) return ci_fail_context("draft model");
    float *q = d->q + (size_t)j * v;
    memset(q, 0, v * sizeof *q);
    const uint64_t key = ci_rng_key(&rng, first_index + (uint64_t)j);
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
    if (j + 1 < k && ci_model_forward(d->model, d->seq, &drafts[j], 1, d->logits, 1))
      return ci_fail_context("draft model");
  }
  return k;
}

int ci_draft_state_keep(ci_draft_state *d, int64_t n_keep) {
  if (!d->seq->round_open) return CI_OK;
  if (n_keep > d->seq->n) n_keep = d->seq->n;
  return ci_kv_seq_round_close(d->seq, n_keep);
}
