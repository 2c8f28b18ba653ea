/* Opening a model for a verb: ci_model_open with its error printed as one line. */
#include "base/error.h"
#include "cli/verbs.h"

#include <stdio.h>

int ci_cli_model_open(const char *model_arg, int n_threads, ci_cli_model *out) {
  out->model = ci_model_open(model_arg, n_threads);
  if (!out->model) {
    fprintf(stderr, "cinfer: %s\n", ci_last_error());
    return 1;
  }
  return 0;
}

void ci_cli_model_close(ci_cli_model *cm) {
  ci_model_close(cm->model);
  cm->model = NULL;
}
