/* Greedy selection (see greedy.h): a vectorizable pass for the maximum, then the first index
 * holding it (ties to the lowest id). */
#include "sample/greedy.h"

#include "base/float_lanes.h"

int ci_argmax(const float *logits, int n) {
  const float max = ci_max_of(logits, n);
  for (int i = 0; i < n; i++)
    if (logits[i] == max) return i;
  return 0; /* every value is NaN */
}
