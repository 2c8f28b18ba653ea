/* The greedy pick of a logits row on the host (see row_pick.h), with the sampler's reductions
 * (base/float_lanes.h). */
#include "backend/cpu/row_pick.h"

#include "base/float_lanes.h"

#include <math.h>

ci_row_pick ci_row_pick_of(const float *z, int64_t vocab) {
  const float max = ci_max_of(z, vocab);
  if (max == -INFINITY) return (ci_row_pick){.token = -1, .logprob = -INFINITY};
  int32_t token = 0;
  while (!(z[token] == max)) token++; /* the lowest id holding the maximum */
  if (max == INFINITY) return (ci_row_pick){.token = token, .logprob = 0.0f};
  const float lse = (float)((double)max + log(ci_sum_exp(z, vocab, max))); /* as ci_log_softmax */
  return (ci_row_pick){.token = token, .logprob = max - lse};
}
