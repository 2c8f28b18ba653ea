/* `cinfer render`: prints the chat-template rendering of a chat request exactly (nothing added),
 * or the template's error message on stderr with exit code 1. */
#include "base/error.h"
#include "cinfer.h"
#include "cli/args.h"
#include "cli/verbs.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>

static const char usage[] =
    "usage: cinfer render --model DIR --request FILE.json [--chat-template FILE]\n"
    "  FILE.json: {\"messages\": [...], \"tools\"?: [...], \"add_generation_prompt\"?: bool, ...}\n"
    "  (use - to read the request from stdin)\n";

/* A template from a Jinja file; the special tokens still come from the model folder when one is
 * given. Prints the error and returns NULL on failure. */
static cinfer_chat_template *template_from_file(const char *path, const char *model_dir) {
  cinfer_chat_template *model = NULL;
  if (model_dir && cinfer_chat_template_load(model_dir, &model) != CINFER_OK) model = NULL;
  cinfer_chat_template *t = ci_cli_chat_template_file("render", path, model);
  cinfer_chat_template_free(model);
  return t;
}

int ci_verb_render(int argc, char **argv) {
  ci_flag flags[] = {{"--model", "-m", 1, NULL},
                     {"--request", "-r", 1, NULL},
                     {"--chat-template", NULL, 1, NULL},
                     {"--help", "-h", 0, NULL}};
  const int nf = sizeof flags / sizeof flags[0];
  if (ci_args_parse(argc, argv, flags, nf, "render")) return 2;
  if (ci_args_get(flags, nf, "--help")) {
    fputs(usage, stdout);
    return 0;
  }
  const char *model_dir = ci_args_get(flags, nf, "--model");
  const char *request_path = ci_args_get(flags, nf, "--request");
  const char *template_path = ci_args_get(flags, nf, "--chat-template");
  if ((!model_dir && !template_path) || !request_path) {
    fprintf(stderr, "cinfer render: --request and --model (or --chat-template) are required\n%s",
            usage);
    return 2;
  }
  json_error_t err;
  json_t *request = request_path[0] == '-' && !request_path[1]
                        ? json_loadf(stdin, 0, &err)
                        : json_load_file(request_path, 0, &err);
  if (!request) {
    if (strcmp(request_path, "-") != 0 && ci_fail_if_unopenable(request_path))
      fprintf(stderr, "cinfer render: %s\n", ci_last_error());
    else
      fprintf(stderr, "cinfer render: %s: line %d, column %d: %s\n", request_path, err.line,
              err.column, err.text);
    return 1;
  }
  cinfer_chat_template *t = NULL;
  if (template_path) {
    t = template_from_file(template_path, model_dir);
  } else if (cinfer_chat_template_load(model_dir, &t) != CINFER_OK) {
    fprintf(stderr, "cinfer render: %s\n", cinfer_last_error());
  }
  char *request_text = t ? json_dumps(request, JSON_PRESERVE_ORDER | JSON_COMPACT) : NULL;
  json_decref(request);
  if (!t || !request_text) {
    if (t) fprintf(stderr, "cinfer render: out of memory\n");
    cinfer_chat_template_free(t);
    return 1;
  }
  char *text = NULL;
  size_t len = 0;
  int rc = 0;
  if (cinfer_chat_template_render(t, request_text, &text, &len) != CINFER_OK) {
    fprintf(stderr, "%s\n", cinfer_last_error()); /* exactly the template's message */
    rc = 1;
  } else if (fwrite(text, 1, len, stdout) != len || fflush(stdout) != 0) {
    fprintf(stderr, "cinfer render: write to stdout failed\n");
    rc = 1;
  }
  cinfer_free(text);
  free(request_text);
  cinfer_chat_template_free(t);
  return rc;
}
