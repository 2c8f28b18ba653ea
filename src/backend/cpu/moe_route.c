/* MoE routing on the CPU: softmax over the router scores, top-k experts per token, weights
 * renormalised over the chosen k and scaled per expert (docs/models.md §5.7, Mixture of experts).
 */
#include "backend/cpu/kernels.h"

#include <math.h>

void ci_cpu_moe_route(ci_backend *be, const float *scores, int64_t n, int n_experts, int top_k,
                      const float *expert_scale, int32_t *expert_ids, float *expert_weights) {
  (void)be;
  for (int64_t t = 0; t < n; t++) {
    const float *s = scores + t * n_experts;
    float max = s[0];
    for (int e = 1; e < n_experts; e++)
      if (s[e] > max) max = s[e];
    /* Probabilities up to the common softmax denominator, which the renormalisation cancels
     * out of the weights; the top-k choice is the same on them. */
    int32_t *ids = expert_ids + t * top_k;
    float *w = expert_weights + t * top_k;
    for (int k = 0; k < top_k; k++) {
      int best = -1;
      for (int e = 0; e < n_experts; e++) {
        int taken = 0;
        for (int j = 0; j < k; j++) taken |= ids[j] == e;
        if (!taken && (best < 0 || s[e] > s[best])) best = e;
      }
      ids[k] = best;
      w[k] = expf(s[best] - max);
    }
    float sum = 0.0f;
    for (int k = 0; k < top_k; k++) sum += w[k];
    for (int k = 0; k < top_k; k++)
      w[k] = w[k] / sum * (expert_scale ? expert_scale[ids[k]] : 1.0f);
  }
}
