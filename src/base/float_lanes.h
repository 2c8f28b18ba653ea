/* Reductions over float rows in fixed blocks of independent lanes, written so that compilers
 * vectorize them: the largest value, and the sum of e^(z - max) that a log-softmax needs. The
 * sampler's greedy choice and log-softmax and the CPU backend's row picks share them, so a row
 * pick's token and log-probability are the sampler's bit for bit. */
#ifndef CI_BASE_FLOAT_LANES_H
#define CI_BASE_FLOAT_LANES_H

#include "base/fast_exp.h"

#include <math.h>
#include <stdint.h>

enum { CI_FLOAT_LANES = 16 };

/* The largest of z[0..n) (-inf when n is 0 or every value is -inf or NaN: NaN never wins). */
static inline float ci_max_of(const float *z, int64_t n) {
  float lane[CI_FLOAT_LANES];
  for (int j = 0; j < CI_FLOAT_LANES; j++) lane[j] = -INFINITY;
  int64_t i = 0;
  for (; i + CI_FLOAT_LANES <= n; i += CI_FLOAT_LANES)
    for (int j = 0; j < CI_FLOAT_LANES; j++) {
      const float v = z[i + j];
      lane[j] = v > lane[j] ? v : lane[j];
    }
  float max = -INFINITY;
  for (int j = 0; j < CI_FLOAT_LANES; j++) max = lane[j] > max ? lane[j] : max;
  for (; i < n; i++) max = z[i] > max ? z[i] : max;
  return max;
}

/* The sum of e^(z - max) over z[0..n) for max >= every z, in f32 lanes folded into a double
 * (-inf and NaN add 0). */
static inline double ci_sum_exp(const float *z, int64_t n, float max) {
  float lane[CI_FLOAT_LANES] = {0};
  int64_t i = 0;
  for (; i + CI_FLOAT_LANES <= n; i += CI_FLOAT_LANES)
    for (int j = 0; j < CI_FLOAT_LANES; j++) lane[j] += ci_exp_nonpositive(z[i + j] - max);
  double sum = 0.0;
  for (int j = 0; j < CI_FLOAT_LANES; j++) sum += lane[j];
  for (; i < n; i++) sum += ci_exp_nonpositive(z[i] - max);
  return sum;
}

#endif
