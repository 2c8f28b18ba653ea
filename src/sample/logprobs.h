/* Log-probabilities (docs/generation.md §4.2 end, §5): lp = z - logsumexp(z) in f32 over the
 * processed logits, and the top-N entries of lp that responses report as top_logprobs. The
 * sampler computes lp once per step and exposes it (ci_sampler_logprobs), so logprob = lp[token]
 * is taken after the processors and before filters and temperature. */
#ifndef CI_SAMPLE_LOGPROBS_H
#define CI_SAMPLE_LOGPROBS_H

#include <stdint.h>

/* Most alternatives a response may ask for (top_logprobs <= 20). */
enum { CI_TOP_LOGPROBS_MAX = 20 };

typedef struct {
  int32_t id;
  float logprob;
} ci_logprob;

/* lp[i] = z[i] - logsumexp(z) for n >= 1 values (lp may alias z). NaN logits count as -inf;
 * if some z is +inf, those entries get 0 and the rest -inf. Returns CI_OK, or CI_ERR when every
 * z is -inf (every token banned: no distribution exists). */
int ci_log_softmax(const float *z, int n, float *lp);

/* The k highest entries of lp[0..n) sorted descending, ties to the lower id; writes
 * min(k, n) entries to out and returns that count (k <= 0 gives 0). */
int ci_logprobs_top(const float *lp, int n, int k, ci_logprob *out);

#endif
