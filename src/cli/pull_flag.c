/* `--pull` on the verbs that take --model: a repo id missing from the cache is pulled first when
 * it is given, and is otherwise an error that says how to get it (never a silent download). */
#include "cinfer.h"
#include "cli/hub_verbs.h"

#include <stdio.h>
#include <string.h>

/* The value of --model / -m in argv, or NULL. */
static const char *model_value(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (!strncmp(argv[i], "--model=", 8)) return argv[i] + 8;
    if ((!strcmp(argv[i], "--model") || !strcmp(argv[i], "-m")) && i + 1 < argc) return argv[i + 1];
  }
  return NULL;
}

int ci_cli_model_pull_flag(int *argc, char **argv, const char *verb) {
  int pull = 0;
  for (int i = 1; i < *argc; i++) {
    if (strcmp(argv[i], "--pull") != 0) continue;
    pull = 1;
    for (int k = i; k < *argc; k++) argv[k] = argv[k + 1];
    (*argc)--;
    i--;
  }
  const char *model = model_value(*argc, argv);
  if (!model) {
    if (!pull) return -1;
    fprintf(stderr, "cinfer %s: --pull needs --model org/name\n", verb);
    return 2;
  }
  if (!cinfer_is_repo_id(model)) return -1;
  char *dir = NULL;
  if (cinfer_model_resolve(model, &dir) == CINFER_OK) {
    cinfer_free(dir);
    return -1;
  }
  if (pull) return ci_cli_pull(model, 0, NULL) ? 1 : -1;
  char *hub = NULL;
  cinfer_hub_cache_dir(&hub);
  fprintf(stderr,
          "cinfer %s: %s is not in the Hugging Face cache (%s): run `cinfer pull %s` first, or "
          "add --pull to download it now\n",
          verb, model, hub ? hub : "?", model);
  cinfer_free(hub);
  return 1;
}
