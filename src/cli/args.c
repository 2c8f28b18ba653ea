/* Command-line flag parsing shared by the verbs (see args.h). */
#include "cli/args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ci_flag *find_flag(ci_flag *flags, int n_flags, const char *arg, size_t len) {
  for (int i = 0; i < n_flags; i++) {
    if (strlen(flags[i].name) == len && strncmp(flags[i].name, arg, len) == 0) return &flags[i];
    if (flags[i].alias && strlen(flags[i].alias) == len && strncmp(flags[i].alias, arg, len) == 0)
      return &flags[i];
  }
  return NULL;
}

int ci_args_parse(int argc, char **argv, ci_flag *flags, int n_flags, const char *verb) {
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    const char *eq = strchr(arg, '=');
    size_t len = eq && arg[0] == '-' ? (size_t)(eq - arg) : strlen(arg);
    ci_flag *flag = arg[0] == '-' ? find_flag(flags, n_flags, arg, len) : NULL;
    if (!flag) {
      fprintf(stderr, "cinfer %s: unknown argument '%s' (see cinfer %s --help)\n", verb, arg, verb);
      return 2;
    }
    if (flag->value && flag->takes_value != 2) { /* 2: repeatable (ci_args_all) */
      fprintf(stderr, "cinfer %s: %s given twice\n", verb, flag->name);
      return 2;
    }
    if (!flag->takes_value) {
      if (eq) {
        fprintf(stderr, "cinfer %s: %s takes no value\n", verb, flag->name);
        return 2;
      }
      flag->value = "1";
    } else if (eq) {
      flag->value = eq + 1;
    } else if (i + 1 < argc) {
      flag->value = argv[++i];
    } else {
      fprintf(stderr, "cinfer %s: %s needs a value\n", verb, flag->name);
      return 2;
    }
  }
  return 0;
}

const char *ci_args_get(const ci_flag *flags, int n_flags, const char *name) {
  for (int i = 0; i < n_flags; i++)
    if (strcmp(flags[i].name, name) == 0) return flags[i].value;
  return NULL;
}

int ci_args_int(const ci_flag *flags, int n_flags, const char *name, long long fallback,
                long long min, long long max, long long *out) {
  const char *v = ci_args_get(flags, n_flags, name);
  if (!v) {
    *out = fallback;
    return 0;
  }
  char *end;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (errno || end == v || *end != '\0' || x < min || x > max) {
    fprintf(stderr, "cinfer: %s must be an integer in [%lld, %lld], got '%s'\n", name, min, max, v);
    return 2;
  }
  *out = x;
  return 0;
}

int32_t *ci_parse_id_list(const char *csv, int *n) {
  size_t cap = 16;
  int count = 0;
  int32_t *ids = malloc(cap * sizeof *ids);
  if (!ids) {
    fprintf(stderr, "cinfer: out of memory\n");
    return NULL;
  }
  const char *p = csv;
  for (;;) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    const char *start = p;
    while (*p && *p != ',') p++;
    const char *end = p;
    while (end > start && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\n' || end[-1] == '\r'))
      end--;
    char item[32];
    size_t len = (size_t)(end - start);
    char *parse_end = NULL;
    long long value = 0;
    int ok = len > 0 && len < sizeof item;
    if (ok) {
      memcpy(item, start, len);
      item[len] = '\0';
      errno = 0;
      value = strtoll(item, &parse_end, 10);
      ok = !errno && *parse_end == '\0';
    }
    if (!ok) {
      fprintf(stderr, "cinfer: --ids item %d ('%.*s') is not an integer\n", count,
              (int)(len > 40 ? 40 : len), start);
      free(ids);
      return NULL;
    }
    if (value < 0 || value > INT32_MAX) {
      fprintf(stderr, "cinfer: token id %lld at index %d is out of range (ids are >= 0)\n", value,
              count);
      free(ids);
      return NULL;
    }
    if ((size_t)count == cap) {
      cap *= 2;
      int32_t *bigger = realloc(ids, cap * sizeof *ids);
      if (!bigger) {
        free(ids);
        fprintf(stderr, "cinfer: out of memory\n");
        return NULL;
      }
      ids = bigger;
    }
    ids[count++] = (int32_t)value;
    if (*p == '\0') break;
    p++; /* skip the comma */
  }
  *n = count;
  return ids;
}

int ci_args_all(int argc, char **argv, const char *name, const char **values, int max) {
  const size_t n = strlen(name);
  int count = 0;
  for (int i = 1; i < argc; i++) {
    if (strncmp(argv[i], name, n) != 0) continue;
    const char *v = argv[i][n] == '='                    ? argv[i] + n + 1
                    : argv[i][n] == '\0' && i + 1 < argc ? argv[++i]
                                                         : NULL;
    if (v && count < max) values[count] = v;
    count += v != NULL;
  }
  return count;
}
