/* The KV-cache flags shared by the verbs that run a model (`--kv-codec`, `--kv-bits`,
 * `--kv-value-bits`, `--kv-group-size`, `--kv-start`, `--kv-protect`), read into the KV fields
 * of cinfer_params and checked by the library. */
#ifndef CI_CLI_KV_FLAGS_H
#define CI_CLI_KV_FLAGS_H

#include "cinfer.h"
#include "cli/args.h"

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

/* Sets params' KV fields from the flags (bits default 4, value bits = bits, group 64, start 0,
 * protect 0; no --kv-codec leaves kv_codec NULL: the model's kv_config.json plan) and checks them
 * with cinfer_params_kv_codec, which also gives the codec's name (name_size >= 32; may be NULL)
 * and whether it is quantized (may be NULL). Prints one line naming the bad flag and returns 2 on
 * a usage error, else 0. */
int ci_cli_kv_flags(const ci_flag *flags, int n_flags, const char *verb, cinfer_params *params,
                    char *name, size_t name_size, int *quantized);

#endif
