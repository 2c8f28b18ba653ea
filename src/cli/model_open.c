/* Opening a model for a verb: path resolution, backend start-up and loading, with errors
 * printed as one line. */
#include "backend/cpu/cpu_backend.h"
#include "base/error.h"
#include "cli/verbs.h"
#include "io/model_path.h"

#include <stdio.h>
#include <stdlib.h>

int ci_cli_model_open(const char *model_arg, int n_threads, ci_cli_model *out) {
  out->be = NULL;
  out->model = NULL;
  char *dir = ci_model_path_resolve(model_arg);
  if (!dir) {
    fprintf(stderr, "cinfer: %s\n", ci_last_error());
    return 1;
  }
  out->be = ci_cpu_backend_create(n_threads);
  if (!out->be) {
    fprintf(stderr, "cinfer: %s\n", ci_last_error());
    free(dir);
    return 1;
  }
  out->model = ci_model_load(dir, out->be);
  if (!out->model) {
    fprintf(stderr, "cinfer: cannot load model %s: %s\n", dir, ci_last_error());
    free(dir);
    ci_cli_model_close(out);
    return 1;
  }
  free(dir);
  return 0;
}

void ci_cli_model_close(ci_cli_model *cm) {
  ci_model_free(cm->model);
  if (cm->be) cm->be->ops->destroy(cm->be);
  cm->model = NULL;
  cm->be = NULL;
}
