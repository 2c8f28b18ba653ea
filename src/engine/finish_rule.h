/* The rule that ends a generation (docs/generation.md §3), in one place for the serving engine
 * and the public API's session: a sampled token is counted, then an EOS id ends the sequence
 * (stop), else reaching max_tokens ends it (length). */
#ifndef CI_ENGINE_FINISH_RULE_H
#define CI_ENGINE_FINISH_RULE_H

#include "engine/generate.h"
#include "io/generation_config.h"

#include <stdint.h>

/* 1 when `token`, the generated-th sampled token (EOS included, generated >= 1), ends the
 * sequence, with *finish set to CI_FINISH_STOP (an EOS id of `eos`) or CI_FINISH_LENGTH
 * (generated == max_tokens); 0 otherwise. */
int ci_generation_ends(const ci_eos_set *eos, int32_t token, int64_t generated, int64_t max_tokens,
                       ci_finish_reason *finish);

#endif
