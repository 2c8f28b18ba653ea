/* The EOS set of a model, built in one place for every verb and the server (docs/generation.md §3):
 * config.json's eos ids, generation_config.json's, and the tokenizer's eos_token. */
#ifndef CI_ENGINE_EOS_SET_H
#define CI_ENGINE_EOS_SET_H

#include "io/generation_config.h"
#include "model/spec.h"
#include "text/tokenizer.h"

/* E = spec's eos ids ∪ gen's (gen may be NULL) ∪ tok's eos_token (tok may be NULL: token-id
 * prompts load no tokenizer). Returns CI_ERR with ci_last_error when the set overflows. */
int ci_eos_set_for_model(ci_eos_set *set, const ci_model_spec *spec,
                         const ci_generation_config *gen, const ci_tokenizer *tok);

#endif
