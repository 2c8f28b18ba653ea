/* Speculative decoding flags of generate and chat (see spec_flags.h). */
#include "cli/spec_flags.h"

#include <stdio.h>

int ci_cli_spec_flags(const ci_flag *flags, int nf, const char *verb, cinfer_params *params) {
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
  params->lookup_ngram = (int)ngram;
  params->draft_max = (int)draft_max;
  params->draft_min = (int)draft_min;
  return 0;
}
