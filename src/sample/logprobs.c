/* Log-softmax and top-N log-probabilities (see logprobs.h). */
#include "sample/logprobs.h"

#include "base/error.h"

#include <math.h>

int ci_log_softmax(const float *z, int n, float *lp) {
  float max = -INFINITY;
  for (int i = 0; i < n; i++)
    if (z[i] > max) max = z[i];
  if (max == -INFINITY) return ci_fail("every token has a logit of -inf (all tokens banned)");
  if (max == INFINITY) {
    for (int i = 0; i < n; i++) lp[i] = z[i] == INFINITY ? 0.0f : -INFINITY;
    return CI_OK;
  }
  double sum = 0.0;
  for (int i = 0; i < n; i++)
    if (z[i] > -INFINITY) sum += expf(z[i] - max);
  const float lse = (float)((double)max + log(sum));
  for (int i = 0; i < n; i++) lp[i] = z[i] == z[i] ? z[i] - lse : -INFINITY;
  return CI_OK;
}

/* a ranks before b: higher logprob, then lower id. */
static int ranks_before(float lp_a, int32_t a, float lp_b, int32_t b) {
  return lp_a > lp_b || (lp_a == lp_b && a < b);
}

int ci_logprobs_top(const float *lp, int n, int k, ci_logprob *out) {
  if (k <= 0) return 0;
  if (k > n) k = n;
  int have = 0;
  for (int32_t t = 0; t < n; t++) {
    const float v = lp[t] == lp[t] ? lp[t] : -INFINITY;
    if (have == k && !ranks_before(v, t, out[k - 1].logprob, out[k - 1].id)) continue;
    int pos = have < k ? have++ : k - 1;
    while (pos > 0 && ranks_before(v, t, out[pos - 1].logprob, out[pos - 1].id)) {
      out[pos] = out[pos - 1];
      pos--;
    }
    out[pos] = (ci_logprob){t, v};
  }
  return have;
}
