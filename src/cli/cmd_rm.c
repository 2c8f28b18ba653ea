/* `cinfer rm org/name`: deletes a model repo from the Hugging Face cache (cinfer_cache_remove:
 * its folder only, symlinks not followed, ids with ".." refused). */
#include "cinfer.h"
#include "cli/hub_verbs.h"

#include <stdio.h>

static const char usage[] = "usage: cinfer rm org/name\n"
                            "  Deletes the model repo from the Hugging Face cache (every revision\n"
                            "  of it). `cinfer ls` lists what is there.\n";

int ci_verb_rm(int argc, char **argv) {
  ci_flag flags[] = {{"--help", "-h", 0, NULL}};
  const int nf = (int)(sizeof flags / sizeof flags[0]);
  const char *repo = NULL;
  const int rc = ci_cli_args_positional(argc, argv, flags, nf, "rm", &repo);
  if (rc) return rc;
  if (ci_args_get(flags, nf, "--help")) {
    fputs(usage, stdout);
    return 0;
  }
  if (!repo) {
    fprintf(stderr, "cinfer rm: which model? (cinfer rm org/name; `cinfer ls` lists them)\n");
    return 2;
  }
  char *hub = NULL;
  if (cinfer_hub_cache_dir(&hub) != CINFER_OK) {
    fprintf(stderr, "cinfer rm: %s\n", cinfer_last_error());
    return 1;
  }
  int64_t freed = 0;
  const cinfer_status st = cinfer_cache_remove(hub, repo, &freed);
  if (st != CINFER_OK) {
    fprintf(stderr, "cinfer rm: %s\n", cinfer_last_error());
    cinfer_free(hub);
    return st == CINFER_INVALID_ARGUMENT ? 2 : 1;
  }
  char size[32];
  ci_cli_format_bytes(freed, size, sizeof size);
  printf("removed %s (%s) from %s\n", repo, size, hub);
  cinfer_free(hub);
  return 0;
}
