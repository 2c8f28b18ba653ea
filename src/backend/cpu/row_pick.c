/* The greedy pick of a logits row on the host (see row_pick.h). The loops work in fixed blocks
 * of independent lanes so that compilers vectorize them. */
#include "backend/cpu/row_pick.h"

#include "base/fast_exp.h"

#include <math.h>

enum { LANES = 16 };

ci_row_pick ci_row_pick_of(const float *z, int64_t vocab) {
  float lane[LANES];
  for (int j = 0; j < LANES; j++) lane[j] = -INFINITY;
  int64_t i = 0;
  for (; i + LANES <= vocab; i += LANES)
    for (int j = 0; j < LANES; j++) {
      const float v = z[i + j];
      lane[j] = v > lane[j] ? v : lane[j]; /* NaN never replaces */
    }
  float max = -INFINITY;
  for (int j = 0; j < LANES; j++) max = lane[j] > max ? lane[j] : max;
  for (; i < vocab; i++) max = z[i] > max ? z[i] : max;
  if (max == -INFINITY) return (ci_row_pick){.token = -1, .logprob = -INFINITY};
  int32_t token = 0;
  while (!(z[token] == max)) token++; /* the lowest id holding the maximum */
  if (max == INFINITY) return (ci_row_pick){.token = token, .logprob = 0.0f};
  float sums[LANES] = {0};
  for (i = 0; i + LANES <= vocab; i += LANES)
    for (int j = 0; j < LANES; j++) sums[j] += ci_exp_nonpositive(z[i + j] - max); /* NaN: 0 */
  double sum = 0.0;
  for (int j = 0; j < LANES; j++) sum += sums[j];
  for (; i < vocab; i++) sum += ci_exp_nonpositive(z[i] - max);
  const float lse = (float)((double)max + log(sum)); /* as the sampler's log-softmax */
  return (ci_row_pick){.token = token, .logprob = max - lse};
}
