/* KV-cache flags of the model-running verbs (see kv_flags.h). */
#include "cli/kv_flags.h"

#include <stdio.h>

int ci_cli_kv_flags(const ci_flag *flags, int n_flags, const char *verb, cinfer_params *params,
                    char *name, size_t name_size, int *quantized) {
  long long bits, value_bits, group, start, protect;
  if (ci_args_int(flags, n_flags, "--kv-bits", 4, 2, 8, &bits) ||
      ci_args_int(flags, n_flags, "--kv-value-bits", 0, 2, 8, &value_bits) ||
      ci_args_int(flags, n_flags, "--kv-group-size", 0, 32, 128, &group) ||
      ci_args_int(flags, n_flags, "--kv-start", 0, 0, 1LL << 40, &start) ||
      ci_args_int(flags, n_flags, "--kv-protect", 0, 0, 1 << 16, &protect))
    return 2;
  params->kv_codec = ci_args_get(flags, n_flags, "--kv-codec");
  params->kv_bits = (int)bits;
  params->kv_value_bits = (int)value_bits;
  params->kv_group_size = (int)group;
  params->kv_start = start;
  params->kv_protect = (int)protect;
  if (cinfer_params_kv_codec(params, name, name_size, quantized) != CINFER_OK) {
    fprintf(stderr, "cinfer %s: %s (--kv-* flags)\n", verb, cinfer_last_error());
    return 2;
  }
  return 0;
}
