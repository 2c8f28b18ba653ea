/* The verbs of the cinfer command line, one file each, and the helpers they share. */
#ifndef CI_CLI_VERBS_H
#define CI_CLI_VERBS_H

#include "engine/model_open.h"

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

/* A model opened for a verb (engine/model_open.h: it owns its backend). */
typedef struct {
  ci_model *model;
} ci_cli_model;

/* Opens `model_arg` (folder or HF cache id) on n_threads threads (0 = all cores) with
 * ci_model_open. Prints the error as one line and returns 1 on failure, 0 on success. */
int ci_cli_model_open(const char *model_arg, int n_threads, ci_cli_model *out);

/* Closes the model (ci_model_close); cm->model becomes NULL. */
void ci_cli_model_close(ci_cli_model *cm);

#endif
