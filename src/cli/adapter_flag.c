/* --adapter: a LoRA adapter folder for the generating verbs (generate, chat: one; serve: any
 * number, each DIR or NAME=DIR), loaded for the verb's model with the reason printed when it
 * does not load. */
#include "cli/verbs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ci_cli_adapter_load(const char *verb, const cinfer_model *model, const char *arg,
                        cinfer_adapter **out) {
  *out = NULL;
  if (!arg) return 0;
  if (cinfer_adapter_load(model, arg, out) != CINFER_OK) {
    fprintf(stderr, "cinfer %s: --adapter %s: %s\n", verb, arg, cinfer_last_error());
    return 1;
  }
  cinfer_adapter_info info;
  cinfer_adapter_get_info(*out, &info);
  fprintf(stderr, "adapter %s: %s, rank %d, scale %g, %d linear layers adapted\n", arg, info.format,
          info.max_rank, (double)info.scale, info.n_modules);
  return 0;
}

int ci_cli_adapter_spec(const char *arg, char *name, size_t name_size, const char **dir) {
  const char *eq = strchr(arg, '=');
  if (eq) {
    if (eq == arg || !eq[1] || (size_t)(eq - arg) >= name_size) return -1;
    memcpy(name, arg, (size_t)(eq - arg));
    name[eq - arg] = '\0';
    *dir = eq + 1;
    return 0;
  }
  /* the folder's own name: the last non-empty path component */
  size_t end = strlen(arg);
  while (end > 1 && arg[end - 1] == '/') end--;
  size_t start = end;
  while (start > 0 && arg[start - 1] != '/') start--;
  if (end == start || end - start >= name_size) return -1;
  memcpy(name, arg + start, end - start);
  name[end - start] = '\0';
  *dir = arg;
  return 0;
}
