/* Log-softmax and top-N log-probabilities (see logprobs.h). The loops work in fixed blocks of
 * independent lanes so that compilers vectorize them. */
#include "sample/logprobs.h"

#include "base/error.h"
#include "base/float_lanes.h"

#include <math.h>

enum { LANES = 16 };

/* Whether any value is NaN. */
static int has_nan(const float *z, int n) {
  int lane[LANES] = {0};
  int i = 0;
  for (; i + LANES <= n; i += LANES)
    for (int j = 0; j < LANES; j++) lane[j] |= z[i + j] != z[i + j];
  int any = 0;
  for (int j = 0; j < LANES; j++) any |= lane[j];
  for (; i < n; i++) any |= z[i] != z[i];
  return any;
}

int ci_log_softmax(const float *z, int n, float *lp) {
  if (has_nan(z, n)) { /* rare: go on from a copy with NaN replaced by -inf */
    for (int i = 0; i < n; i++) lp[i] = z[i] == z[i] ? z[i] : -INFINITY;
    z = lp;
  }
  const float max = ci_max_of(z, n);
  if (max == -INFINITY) return ci_fail("every token has a logit of -inf (all tokens banned)");
  if (max == INFINITY) {
    for (int i = 0; i < n; i++) lp[i] = z[i] == INFINITY ? 0.0f : -INFINITY;
    return CI_OK;
  }
  const float lse = (float)((double)max + log(ci_sum_exp(z, n, max)));
  int i = 0;
  for (; i + LANES <= n; i += LANES) { /* through a block copy, since lp may alias z */
    float block[LANES];
    for (int j = 0; j < LANES; j++) block[j] = z[i + j] - lse;
    for (int j = 0; j < LANES; j++) lp[i + j] = block[j];
  }
  for (; i < n; i++) lp[i] = z[i] - lse;
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
