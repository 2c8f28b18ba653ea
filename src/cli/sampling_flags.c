/* Sampling flags shared by the generating verbs (see sampling_flags.h). */
#include "cli/sampling_flags.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

/* A float flag in [min, max] into *out; absent leaves it. Prints an error and returns 2 on a bad
 * value, else 0. */
static int float_flag(const ci_flag *flags, int nf, const char *verb, const char *name, double min,
                      double max, float *out) {
  const char *v = ci_args_get(flags, nf, name);
  if (!v) return 0;
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (errno || end == v || *end != '\0' || !(x >= min && x <= max)) {
    fprintf(stderr, "cinfer %s: %s must be a number in [%g, %g], got '%s'\n", verb, name, min, max,
            v);
    return 2;
  }
  *out = (float)x;
  return 0;
}

/* An integer flag in [min, max]; absent leaves *has = 0. */
static int int_flag(const ci_flag *flags, int nf, const char *name, long long min, long long max,
                    int *has, long long *out) {
  *has = 0;
  if (!ci_args_get(flags, nf, name)) return 0;
  if (ci_args_int(flags, nf, name, 0, min, max, out)) return 2;
  *has = 1;
  return 0;
}

int ci_cli_sampling_flags(const ci_flag *flags, int nf, const char *verb, cinfer_params *params) {
  long long top_k = 0, seed = 0, max_tokens = 0;
  int has_top_k, has_seed, has_max_tokens;
  if (float_flag(flags, nf, verb, "--temp", 0, 5, &params->temperature) ||
      float_flag(flags, nf, verb, "--top-p", 0, 1, &params->top_p) ||
      float_flag(flags, nf, verb, "--min-p", 0, 1, &params->min_p) ||
      float_flag(flags, nf, verb, "--repeat-penalty", 1e-6, 1e6, &params->repetition_penalty) ||
      float_flag(flags, nf, verb, "--presence-penalty", -2, 2, &params->presence_penalty) ||
      float_flag(flags, nf, verb, "--frequency-penalty", -2, 2, &params->frequency_penalty) ||
      int_flag(flags, nf, "--top-k", 0, INT_MAX, &has_top_k, &top_k) ||
      int_flag(flags, nf, "--seed", LLONG_MIN, LLONG_MAX, &has_seed, &seed) ||
      int_flag(flags, nf, "--max-tokens", 1, 1 << 24, &has_max_tokens, &max_tokens))
    return 2;
  if (has_top_k) params->top_k = (int)top_k;
  if (has_seed) {
    params->seed = (uint64_t)seed;
    params->has_seed = 1;
  }
  if (has_max_tokens) {
    params->max_tokens = (int)max_tokens;
    params->max_tokens_explicit = 1;
  }
  return 0;
}
