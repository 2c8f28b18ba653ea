/* The KV-cache flags shared by the verbs that run a model (`--kv-codec`, `--kv-bits`,
 * `--kv-value-bits`, `--kv-group-size`, `--kv-start`, `--kv-protect`) and the plan they resolve
 * to. */
#ifndef CI_CLI_KV_FLAGS_H
#define CI_CLI_KV_FLAGS_H

#include "cli/args.h"
#include "engine/generate.h"
#include "engine/session.h"
#include "tensor/kv_format.h"

/* Flag table entries to splice into a verb's flags. */
#define CI_CLI_KV_FLAGS                                                                            \
  {"--kv-codec", NULL, 1, NULL}, {"--kv-bits", NULL, 1, NULL}, {"--kv-value-bits", NULL, 1, NULL}, \
      {"--kv-group-size", NULL, 1, NULL}, {"--kv-start", NULL, 1, NULL}, {                         \
    "--kv-protect", NULL, 1, NULL                                                                  \
  }

/* Usage text of those flags. */
#define CI_CLI_KV_USAGE                                                                            \
  "  [--kv-codec bf16|f32|affine|turbo|turbo-v] [--kv-bits B] [--kv-value-bits B]\n"               \
  "  [--kv-group-size G] [--kv-start S] [--kv-protect N]\n"

typedef struct {
  ci_kv_codec base; /* what sequences start in: bf16, or f32 for reference runs */
  int quantized;    /* a target codec is set */
  ci_kv_format target;
  long long start;    /* conversion threshold S */
  int protect;        /* the first and last N cache layers stay in the base format */
  int explicit_codec; /* --kv-codec was given (overrides kv_config.json, even as bf16) */
} ci_cli_kv_plan;

/* Resolves the flags (bits default 4, value bits = bits, group 64, start 0, protect 0). Prints one
 * line naming the bad flag and returns 2 on a usage error, else 0. */
int ci_cli_kv_plan_parse(const ci_flag *flags, int n_flags, const char *verb, ci_cli_kv_plan *out);

/* Where the plan's sequences take their codec plan from (docs/kv-cache.md §7 precedence): the
 * flags' target, else (no --kv-codec) the model's kv_config.json; an explicit bf16/f32 --kv-codec
 * means none. */
ci_kv_plan_source ci_cli_kv_plan_source(const ci_cli_kv_plan *plan);

/* Sets the KV fields of session options from the plan. */
void ci_cli_kv_plan_to_session(const ci_cli_kv_plan *plan, ci_session_options *options);

/* Sets the KV fields of generation options from the plan. */
void ci_cli_kv_plan_to_options(const ci_cli_kv_plan *plan, ci_generate_options *options);

#endif
