/* The EOS set of a model (see eos_set.h). */
#include "engine/eos_set.h"

#include "base/error.h"

#include <string.h>

int ci_eos_set_for_model(ci_eos_set *set, const ci_model_spec *spec,
                         const ci_generation_config *gen, const ci_tokenizer *tok) {
  memset(set, 0, sizeof *set);
  if (ci_eos_set_build(set, spec->eos_ids, spec->n_eos, gen)) return CI_ERR;
  if (tok && ci_eos_set_add(set, ci_tokenizer_config_token_id(tok, "eos_token"))) return CI_ERR;
  return CI_OK;
}
