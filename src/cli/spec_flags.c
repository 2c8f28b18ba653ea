/* Speculative decoding flags of generate, chat and serve (see spec_flags.h). */
#include "cli/spec_flags.h"

#include "cli/verbs.h"

#include <stdio.h>

int ci_cli_spec_parse(const ci_flag *flags, int nf, const char *verb, ci_cli_spec *spec) {
  long long ngram, draft_max, draft_min;
  if (ci_args_int(flags, nf, "--lookup-ngram", 0, 0, 64, &ngram) ||
      ci_args_int(flags, nf, "--draft-max", 5, 1, 32, &draft_max) ||
      ci_args_int(flags, nf, "--draft-min", 1, 1, 32, &draft_min))
    return 2;
  if (draft_min > draft_max) {
    fprintf(stderr, "cinfer %s: --draft-min %lld is over --draft-max %lld\n", verb, draft_min,
            draft_max);
    return 2;
  }
  spec->lookup_ngram = (int)ngram;
  spec->draft_max = (int)draft_max;
  spec->draft_min = (int)draft_min;
  spec->draft_model = ci_args_get(flags, nf, "--draft-model");
  return 0;
}

int ci_cli_spec_flags(const ci_flag *flags, int nf, const char *verb, cinfer_params *params) {
  ci_cli_spec spec;
  if (ci_cli_spec_parse(flags, nf, verb, &spec)) return 2;
  params->lookup_ngram = spec.lookup_ngram;
  params->draft_max = spec.draft_max;
  params->draft_min = spec.draft_min;
  return 0;
}

int ci_cli_draft_model_load(const ci_flag *flags, int nf, const char *verb,
                            const cinfer_model *model, cinfer_model **out) {
  *out = NULL;
  const char *arg = ci_args_get(flags, nf, "--draft-model");
  if (!arg) return 0;
  cinfer_model *draft = NULL;
  if (ci_cli_model_load(flags, nf, verb, arg, &draft)) return 1;
  if (cinfer_model_vocab_size(draft) != cinfer_model_vocab_size(model)) {
    fprintf(stderr,
            "cinfer %s: the draft model %s has %d tokens, the model %d: a draft model must share "
            "the model's tokenizer\n",
            verb, arg, cinfer_model_vocab_size(draft), cinfer_model_vocab_size(model));
    cinfer_model_free(draft);
    return 1;
  }
  *out = draft;
  return 0;
}
