/* Greedy selection (see greedy.h): a vectorizable pass for the maximum, then the first index
 * holding it (ties to the lowest id). */
#include "sample/greedy.h"

#include <math.h>

enum { LANES = 16 };

int ci_argmax(const float *logits, int n) {
  float lane[LANES];
  for (int j = 0; j < LANES; j++) lane[j] = -INFINITY;
  int i = 0;
  for (; i + LANES <= n; i += LANES)
    for (int j = 0; j < LANES; j++) {
      const float v = logits[i + j];
      lane[j] = v > lane[j] ? v : lane[j]; /* NaN never replaces */
    }
  float max = -INFINITY;
  for (int j = 0; j < LANES; j++) max = lane[j] > max ? lane[j] : max;
  for (; i < n; i++) max = logits[i] > max ? logits[i] : max;
  for (i = 0; i < n; i++)
    if (logits[i] == max) return i;
  return 0; /* every value is NaN */
}
