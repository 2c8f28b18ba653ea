/* KV-cache flags of the model-running verbs (see kv_flags.h). */
#include "cli/kv_flags.h"

#include "base/error.h"

#include <stdio.h>
#include <string.h>

int ci_cli_kv_plan_parse(const ci_flag *flags, int n_flags, const char *verb, ci_cli_kv_plan *out) {
  memset(out, 0, sizeof *out);
  const char *codec = ci_args_get(flags, n_flags, "--kv-codec");
  long long bits, value_bits, group, start, protect;
  if (ci_args_int(flags, n_flags, "--kv-bits", 4, 2, 8, &bits) ||
      ci_args_int(flags, n_flags, "--kv-value-bits", 0, 2, 8, &value_bits) ||
      ci_args_int(flags, n_flags, "--kv-group-size", 0, 32, 128, &group) ||
      ci_args_int(flags, n_flags, "--kv-start", 0, 0, 1LL << 40, &start) ||
      ci_args_int(flags, n_flags, "--kv-protect", 0, 0, 1 << 16, &protect))
    return 2;
  ci_kv_format format;
  if (ci_kv_format_parse(codec ? codec : "bf16", (int)bits, (int)value_bits, (int)group, &format)) {
    fprintf(stderr, "cinfer %s: --kv-codec: %s\n", verb, ci_last_error());
    return 2;
  }
  out->start = start;
  out->protect = (int)protect;
  out->explicit_codec = codec != NULL;
  if (ci_kv_format_is_quantized(&format)) {
    out->base = CI_KV_BF16;
    out->quantized = 1;
    out->target = format;
  } else {
    out->base = format.codec;
  }
  return 0;
}

ci_kv_plan_source ci_cli_kv_plan_source(const ci_cli_kv_plan *plan) {
  return plan->quantized        ? CI_KV_PLAN_TARGET
         : plan->explicit_codec ? CI_KV_PLAN_NONE
                                : CI_KV_PLAN_MODEL_CONFIG;
}

void ci_cli_kv_plan_to_session(const ci_cli_kv_plan *plan, ci_session_options *options) {
  options->kv_codec = plan->base;
  options->kv_plan = ci_cli_kv_plan_source(plan);
  options->kv_target = plan->target;
  options->kv_start = plan->start;
  options->kv_protect = plan->protect;
}

void ci_cli_kv_plan_to_options(const ci_cli_kv_plan *plan, ci_generate_options *options) {
  options->kv_codec = plan->base;
  options->kv_plan = ci_cli_kv_plan_source(plan);
  options->kv_target = plan->target;
  options->kv_start = plan->start;
  options->kv_protect = plan->protect;
}
