/* Greedy selection (see greedy.h). */
#include "sample/greedy.h"

int ci_argmax(const float *logits, int n) {
  int best = 0;
  for (int i = 1; i < n; i++)
    if (logits[i] > logits[best] || logits[best] != logits[best]) best = i;
  return best;
}
