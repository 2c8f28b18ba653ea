/* Command-line flags: a tiny parser for `--name value` / `--name=value` flags shared by the
 * verbs, with typed, range-checked accessors that print one clear line on bad input. */
#ifndef CI_CLI_ARGS_H
#define CI_CLI_ARGS_H

#include <stdint.h>

typedef struct {
  const char *name;  /* "--model" */
  const char *alias; /* "-m" or NULL */
  int takes_value;   /* 0 for boolean switches; 2: a value that may be given again (read every
                        occurrence with ci_args_all; ci_args_get gives the last) */
  const char *value; /* set by ci_args_parse; "1" for a present switch */
} ci_flag;

/* Fills flags[].value from argv (argv[0] is the verb). Unknown flags, missing values and
 * repeated flags are usage errors: prints one line to stderr and returns 2; returns 0 on success.
 */
int ci_args_parse(int argc, char **argv, ci_flag *flags, int n_flags, const char *verb);

/* The value of `name` (NULL if absent). */
const char *ci_args_get(const ci_flag *flags, int n_flags, const char *name);

/* Every value of a repeatable flag `name` in argv (parsed already), in order: the first max of
 * them into values; returns how many there are (may exceed max). */
int ci_args_all(int argc, char **argv, const char *name, const char **values, int max);

/* Parses an integer flag in [min, max]; absent gives `fallback`. Prints an error and returns 2
 * on a bad value, else 0. */
int ci_args_int(const ci_flag *flags, int n_flags, const char *name, long long fallback,
                long long min, long long max, long long *out);

/* Parses a comma-separated list of integers (token ids). Returns a malloc'd array and sets *n,
 * or prints an error naming the bad item and returns NULL. */
int32_t *ci_parse_id_list(const char *csv, int *n);

#endif
