/* The speculative decoding flags of the single-sequence verbs (generate, chat): --lookup-ngram N
 * (prompt lookup, 0 = off), --draft-max N, --draft-min N (docs/generation.md §6). */
#ifndef CI_CLI_SPEC_FLAGS_H
#define CI_CLI_SPEC_FLAGS_H

#include "cinfer.h"
#include "cli/args.h"

/* Flag table entries to splice into a verb's flags. */
#define CI_CLI_SPEC_FLAGS                                                                          \
  {"--lookup-ngram", NULL, 1, NULL}, {"--draft-max", "--num-draft", 1, NULL}, {                    \
    "--draft-min", NULL, 1, NULL                                                                   \
  }

#define CI_CLI_SPEC_USAGE "                    [--lookup-ngram N] [--draft-max 5] [--draft-min 1]\n"

/* Sets params' lookup_ngram, draft_max and draft_min from the flags. Prints one line naming a bad
 * flag and returns 2, else 0. */
int ci_cli_spec_flags(const ci_flag *flags, int nf, const char *verb, cinfer_params *params);

#endif
