/* The sampling flags of the generating verbs (--temp/--temperature, --top-p, --top-k, --min-p,
 * --repeat-penalty, --presence-penalty, --frequency-penalty, --seed, -n/--max-tokens), the CLI
 * layer of the parameter precedence: they override the defaults cinfer_params_init took from the
 * built-ins and the model's generation_config.json. */
#ifndef CI_CLI_SAMPLING_FLAGS_H
#define CI_CLI_SAMPLING_FLAGS_H

#include "cinfer.h"
#include "cli/args.h"

/* Flag table entries to splice into a verb's flags. */
#define CI_CLI_SAMPLING_FLAGS                                                                      \
  {"--max-tokens", "-n", 1, NULL}, {"--temp", "--temperature", 1, NULL},                           \
      {"--top-p", NULL, 1, NULL}, {"--top-k", NULL, 1, NULL}, {"--min-p", NULL, 1, NULL},          \
      {"--repeat-penalty", NULL, 1, NULL}, {"--presence-penalty", NULL, 1, NULL},                  \
      {"--frequency-penalty", NULL, 1, NULL}, {                                                    \
    "--seed", NULL, 1, NULL                                                                        \
  }

/* Overrides params' sampling fields with the flags that are present (-n also sets
 * max_tokens_explicit). Prints one line naming a bad flag and returns 2, else 0. */
int ci_cli_sampling_flags(const ci_flag *flags, int nf, const char *verb, cinfer_params *params);

#endif
