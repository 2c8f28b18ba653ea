/* The rule that ends a generation (see finish_rule.h). */
#include "engine/finish_rule.h"

int ci_generation_ends(const ci_eos_set *eos, int32_t token, int64_t generated, int64_t max_tokens,
                       ci_finish_reason *finish) {
  if (eos && ci_eos_set_contains(eos, token)) {
    *finish = CI_FINISH_STOP;
    return 1;
  }
  if (generated >= max_tokens) {
    *finish = CI_FINISH_LENGTH;
    return 1;
  }
  return 0;
}
