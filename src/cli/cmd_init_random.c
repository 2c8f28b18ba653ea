/* `cinfer init-random`: writes a random-weight model folder for any supported config
 * (cinfer_model_write_random), so realistic sizes can be benchmarked without a download. */
#include "cinfer.h"
#include "cli/args.h"
#include "cli/verbs.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static const char usage[] = "usage: cinfer init-random --config CONFIG.json --out DIR "
                            "[--dtype bf16|q8|q4] [--group-size 32|64|128] [--seed S]\n";

int ci_verb_init_random(int argc, char **argv) {
  ci_flag flags[] = {{"--config", NULL, 1, NULL}, {"--out", "-o", 1, NULL},
                     {"--dtype", NULL, 1, NULL},  {"--group-size", NULL, 1, NULL},
                     {"--seed", NULL, 1, NULL},   {"--help", "-h", 0, NULL}};
  const int nf = sizeof flags / sizeof flags[0];
  if (ci_args_parse(argc, argv, flags, nf, "init-random")) return 2;
  if (ci_args_get(flags, nf, "--help")) {
    fputs(usage, stdout);
    return 0;
  }
  const char *config_path = ci_args_get(flags, nf, "--config");
  const char *out_dir = ci_args_get(flags, nf, "--out");
  if (!config_path || !out_dir) {
    fprintf(stderr, "cinfer init-random: --config and --out are required\n%s", usage);
    return 2;
  }
  long long group_size, seed;
  if (ci_args_int(flags, nf, "--group-size", 64, 32, 128, &group_size) ||
      ci_args_int(flags, nf, "--seed", 0, 0, INT64_MAX, &seed))
    return 2;
  const cinfer_random_model_options options = {ci_args_get(flags, nf, "--dtype"), (int)group_size,
                                               (uint64_t)seed};
  const cinfer_status status = cinfer_model_write_random(config_path, out_dir, &options);
  if (status != CINFER_OK) {
    fprintf(stderr, "cinfer init-random: %s\n", cinfer_last_error());
    return status == CINFER_INVALID_ARGUMENT ? 2 : 1;
  }
  return 0;
}
