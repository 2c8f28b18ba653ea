/* The speculative decoding flags shared by generate, chat and serve: --lookup-ngram N (prompt
 * lookup, 0 = off), --draft-model DIR (a draft model sharing the tokenizer; it drafts instead of
 * prompt lookup), --draft-max N, --draft-min N (docs/generation.md "Speculative decoding"). */
#ifndef CI_CLI_SPEC_FLAGS_H
#define CI_CLI_SPEC_FLAGS_H

#include "cinfer.h"
#include "cli/args.h"

/* Flag table entries to splice into a verb's flags. */
#define CI_CLI_SPEC_FLAGS                                                                          \
  {"--lookup-ngram", NULL, 1, NULL}, {"--draft-model", "--model-draft", 1, NULL},                  \
      {"--draft-max", "--num-draft", 1, NULL}, {                                                   \
    "--draft-min", NULL, 1, NULL                                                                   \
  }

#define CI_CLI_SPEC_USAGE                                                                          \
  "  [--lookup-ngram N | --draft-model DIR] [--draft-max 5] [--draft-min 1]\n"

/* The flags' values. */
typedef struct {
  int lookup_ngram;        /* 0 = off */
  int draft_max;           /* 1..32 (5) */
  int draft_min;           /* 1..draft_max (1) */
  const char *draft_model; /* the --draft-model argument (argv's), or NULL */
} ci_cli_spec;

/* Reads the flags into *spec. Prints one line naming a bad flag and returns 2, else 0. */
int ci_cli_spec_parse(const ci_flag *flags, int nf, const char *verb, ci_cli_spec *spec);

/* Sets params' lookup_ngram, draft_max and draft_min from the flags (the draft model is loaded
 * apart, by ci_cli_draft_model_load). Prints one line naming a bad flag and returns 2, else 0. */
int ci_cli_spec_flags(const ci_flag *flags, int nf, const char *verb, cinfer_params *params);

/* --draft-model DIR: loads it with the model flags' options into *out (NULL without the flag) and
 * checks that it shares `model`'s vocabulary. Prints the error naming verb and returns 1 (nothing
 * loaded), else 0. */
int ci_cli_draft_model_load(const ci_flag *flags, int nf, const char *verb,
                            const cinfer_model *model, cinfer_model **out);

#endif
