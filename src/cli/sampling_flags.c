/* Sampling flags shared by the generating verbs (see sampling_flags.h). */
#include "cli/sampling_flags.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

/* A float flag in [min, max]; absent leaves *has = 0. Prints an error and returns 2 on a bad
 * value, else 0. */
static int float_flag(const ci_flag *flags, int nf, const char *verb, const char *name, double min,
                      double max, int *has, float *out) {
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
  *has = 1;
  *out = (float)x;
  return 0;
}

/* Integer flag into an override; absent leaves *has = 0. */
static int int_flag(const ci_flag *flags, int nf, const char *name, long long min, long long max,
                    int *has, long long *out) {
  if (!ci_args_get(flags, nf, name)) return 0;
  if (ci_args_int(flags, nf, name, 0, min, max, out)) return 2;
  *has = 1;
  return 0;
}

int ci_cli_sampling_flags(const ci_flag *flags, int nf, const char *verb,
                          ci_sampling_overrides *o) {
  long long top_k = 0, seed = 0, max_tokens = 0;
  int bad = float_flag(flags, nf, verb, "--temp", 0, 5, &o->has_temperature, &o->temperature) ||
            float_flag(flags, nf, verb, "--top-p", 0, 1, &o->has_top_p, &o->top_p) ||
            float_flag(flags, nf, verb, "--min-p", 0, 1, &o->has_min_p, &o->min_p) ||
            float_flag(flags, nf, verb, "--repeat-penalty", 1e-6, 1e6, &o->has_repetition_penalty,
                       &o->repetition_penalty) ||
            float_flag(flags, nf, verb, "--presence-penalty", -2, 2, &o->has_presence_penalty,
                       &o->presence_penalty) ||
            float_flag(flags, nf, verb, "--frequency-penalty", -2, 2, &o->has_frequency_penalty,
                       &o->frequency_penalty) ||
            int_flag(flags, nf, "--top-k", 0, INT_MAX, &o->has_top_k, &top_k) ||
            int_flag(flags, nf, "--seed", LLONG_MIN, LLONG_MAX, &o->has_seed, &seed) ||
            int_flag(flags, nf, "--max-tokens", 1, 1 << 24, &o->has_max_tokens, &max_tokens);
  o->top_k = (int)top_k;
  o->seed = (uint64_t)seed;
  o->max_tokens = (int)max_tokens;
  return bad ? 2 : 0;
}
