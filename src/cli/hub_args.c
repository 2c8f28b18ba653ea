/* Helpers of the model-managing verbs: one positional argument among flags, and byte sizes as
 * people read them (see hub_verbs.h). */
#include "cli/hub_verbs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The flag `arg` names (up to '='), or NULL. */
static const ci_flag *flag_of(const ci_flag *flags, int n_flags, const char *arg) {
  const char *eq = strchr(arg, '=');
  const size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
  for (int i = 0; i < n_flags; i++) {
    if (strlen(flags[i].name) == len && !strncmp(flags[i].name, arg, len)) return &flags[i];
    if (flags[i].alias && strlen(flags[i].alias) == len && !strncmp(flags[i].alias, arg, len))
      return &flags[i];
  }
  return NULL;
}

int ci_cli_args_positional(int argc, char **argv, ci_flag *flags, int n_flags, const char *verb,
                           const char **positional) {
  *positional = NULL;
  char **rest = malloc((size_t)(argc + 1) * sizeof *rest);
  if (!rest) {
    fprintf(stderr, "cinfer %s: out of memory\n", verb);
    return 1;
  }
  int n = 0;
  rest[n++] = argv[0];
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (arg[0] == '-' && arg[1] != '\0') {
      rest[n++] = argv[i];
      const ci_flag *f = flag_of(flags, n_flags, arg);
      if (f && f->takes_value && !strchr(arg, '=') && i + 1 < argc) rest[n++] = argv[++i];
      continue;
    }
    if (*positional) {
      fprintf(stderr, "cinfer %s: unexpected argument '%s' (after '%s')\n", verb, arg, *positional);
      free(rest);
      return 2;
    }
    *positional = arg;
  }
  rest[n] = NULL;
  const int rc = ci_args_parse(n, rest, flags, n_flags, verb);
  free(rest);
  return rc;
}

void ci_cli_format_bytes(int64_t bytes, char *buf, size_t size) {
  static const char *units[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  double v = (double)bytes;
  int u = 0;
  while ((v >= 1000.0 || v <= -1000.0) && u < 5) {
    v /= 1000.0;
    u++;
  }
  if (u == 0)
    snprintf(buf, size, "%lld B", (long long)bytes);
  else
    snprintf(buf, size,
             v < 10 && v > -10     ? "%.2f %s"
             : v < 100 && v > -100 ? "%.1f %s"
                                   : "%.0f %s",
             v, units[u]);
}
