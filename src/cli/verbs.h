/* The verbs of the cinfer command line, one file each, and the helpers they share. */
#ifndef CI_CLI_VERBS_H
#define CI_CLI_VERBS_H

#include "model/model.h"

/* Each verb gets argv with argv[0] = the verb name and returns the process exit code:
 * 0 success, 1 runtime/load error, 2 usage error. */
int ci_verb_logits(int argc, char **argv);
int ci_verb_init_random(int argc, char **argv);
int ci_verb_bench(int argc, char **argv);
int ci_verb_generate(int argc, char **argv);
int ci_verb_chat(int argc, char **argv);
int ci_verb_kv_quality(int argc, char **argv);
int ci_verb_perplexity(int argc, char **argv);
int ci_verb_render(int argc, char **argv);
int ci_verb_tokenize(int argc, char **argv);
int ci_verb_detokenize(int argc, char **argv);
int ci_verb_serve(int argc, char **argv);

/* A loaded model and the backend it runs on. */
typedef struct {
  ci_backend *be;
  ci_model *model;
} ci_cli_model;

/* Resolves `model_arg` (folder or HF cache id), starts a CPU backend with n_threads (0 = all
 * cores) and loads the model. Prints the error and returns 1 on failure, 0 on success. */
int ci_cli_model_open(const char *model_arg, int n_threads, ci_cli_model *out);
void ci_cli_model_close(ci_cli_model *cm);

#endif
