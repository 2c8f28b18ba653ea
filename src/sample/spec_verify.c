/* Speculative verification of one drafted token: greedy match or rejection sampling with the
 * residual draw (see spec_verify.h). Random numbers come from the request's seed and the output
 * index (streams 2 and 3, docs/generation.md §4.4), so the outcome never depends on the batch. */
#include "sample/spec_verify.h"

#include "base/error.h"
#include "sample/rng.h"

#include <math.h>
#include <stdlib.h>

int ci_spec_scratch_init(ci_spec_scratch *sc, int vocab) {
  sc->vocab = vocab;
  sc->ids = malloc((size_t)vocab * sizeof *sc->ids);
  sc->probs = malloc((size_t)vocab * sizeof *sc->probs);
  sc->dense = calloc((size_t)vocab, sizeof *sc->dense);
  if (!sc->ids || !sc->probs || !sc->dense) {
    ci_spec_scratch_free(sc);
    return ci_fail("speculative verification: out of memory");
  }
  return CI_OK;
}

void ci_spec_scratch_free(ci_spec_scratch *sc) {
  free(sc->ids);
  free(sc->probs);
  free(sc->dense);
  sc->ids = NULL;
  sc->probs = NULL;
  sc->dense = NULL;
}

/* Gumbel-max over weights w_t > 0 of the listed ids: argmax log w_t - ln(-ln u(key, stream, t)),
 * ties to the lower id. */
static int32_t gumbel_draw(const int32_t *ids, const float *weights, int n, uint64_t key,
                           uint32_t stream) {
  int32_t best = -1;
  double best_score = -INFINITY;
  for (int i = 0; i < n; i++) {
    if (!(weights[i] > 0.0f)) continue;
    const int32_t t = ids[i];
    const double score =
        log((double)weights[i]) - log(-log(ci_rng_uniform(key, stream, (uint64_t)t)));
    if (score > best_score || (score == best_score && t < best)) {
      best = t;
      best_score = score;
    }
  }
  return best;
}

int32_t ci_spec_verify(ci_sampler *s, ci_spec_scratch *sc, float *logits, const int32_t *history,
                       size_t n_history, uint64_t index, int32_t draft, const float *q,
                       int *accepted) {
  *accepted = 0;
  if (ci_sampler_get_params(s)->temperature == 0.0f) {
    const int32_t t = ci_sampler_sample_at(s, logits, history, n_history, index);
    *accepted = t >= 0 && t == draft;
    return t;
  }
  const int n = ci_sampler_distribution(s, logits, history, n_history, index, sc->ids, sc->probs);
  if (n < 0) return -1;
  for (int i = 0; i < n; i++) sc->dense[sc->ids[i]] = sc->probs[i];
  ci_rng rng;
  ci_rng_init(&rng, ci_sampler_seed(s));
  const uint64_t key = ci_rng_key(&rng, index);
  const double pd = draft >= 0 && draft < sc->vocab ? sc->dense[draft] : 0.0;
  const double qd = q ? (draft >= 0 && draft < sc->vocab ? q[draft] : 0.0) : 1.0;
  const double r = ci_rng_uniform(key, CI_RNG_STREAM_SPEC_ACCEPT, 0);
  int32_t token = draft;
  if (pd > 0.0 && r * qd <= pd) {
    *accepted = 1;
  } else {
    /* residual max(0, p - q) over p's support (outside it p is 0), in place of probs */
    double mass = 0.0;
    for (int i = 0; i < n; i++) {
      const int32_t t = sc->ids[i];
      const double qt = q ? q[t] : (t == draft ? 1.0 : 0.0);
      const double res = sc->dense[t] - qt > 0.0 ? sc->dense[t] - qt : 0.0;
      mass += res;
      sc->probs[i] = (float)res;
    }
    if (mass >= 1e-12) {
      token = gumbel_draw(sc->ids, sc->probs, n, key, CI_RNG_STREAM_SPEC_RESIDUAL);
    } else {
      for (int i = 0; i < n; i++) sc->probs[i] = sc->dense[sc->ids[i]];
      token = gumbel_draw(sc->ids, sc->probs, n, key, CI_RNG_STREAM_DRAW);
    }
  }
  for (int i = 0; i < n; i++) sc->dense[sc->ids[i]] = 0.0f;
  if (token < 0) {
    ci_fail("speculative verification: no token can be sampled");
    return -1;
  }
  return token;
}
