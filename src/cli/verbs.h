/* The verbs of the cinfer command line, one file each, and the helpers they share. The verbs
 * use cinfer's public C API (cinfer.h) exactly as an embedding program would. */
#ifndef CI_CLI_VERBS_H
#define CI_CLI_VERBS_H

#include "cinfer.h"

#include <stddef.h>
#include "cli/args.h"

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
int ci_verb_cache(int argc, char **argv);

/* The flags of every verb that runs a model: where it runs. Splice into a verb's flags. */
#define CI_CLI_MODEL_FLAGS                                                                         \
  {"--threads", "-t", 1, NULL}, {"--device", NULL, 1, NULL}, {"--gpu", NULL, 1, NULL},             \
      {"--mmap", NULL, 0, NULL}, {"--precision", NULL, 1, NULL}, {                                 \
    "--tensor-parallel", NULL, 1, NULL                                                             \
  }

/* Usage text of those flags. */
#define CI_CLI_MODEL_USAGE                                                                         \
  "  [-t|--threads N] [--device cpu|cuda|auto] [--gpu N] [--mmap] [--precision fast|exact]\n"      \
  "  [--tensor-parallel N]\n"

/* Reads --threads, --device, --gpu, --mmap, --precision and --tensor-parallel into *options
 * (printing a bad value; returns 2), else 0. --threads above the online CPUs is capped to them with
 * a warning on stderr. */
int ci_cli_model_options(const ci_flag *flags, int n_flags, const char *verb,
                         cinfer_model_options *options);

/* Loads `model_arg` (folder or HF cache id) with cinfer_model_load and the options the flags
 * give. Prints the error as one line and returns 2 on a bad flag, 1 when the model does not
 * load, 0 on success (*out is the model). */
int ci_cli_model_load(const ci_flag *flags, int n_flags, const char *verb, const char *model_arg,
                      cinfer_model **out);

/* --adapter DIR: loads a LoRA adapter for model into *out (NULL when arg is NULL). Prints the
 * error (naming verb) and returns 1 when it does not load, else 0. */
int ci_cli_adapter_load(const char *verb, const cinfer_model *model, const char *arg,
                        cinfer_adapter **out);

/* Splits a serve --adapter value: NAME=DIR, or DIR named by its last path component. Returns 0,
 * or -1 for an empty name or folder (or a name longer than name_size - 1). */
int ci_cli_adapter_spec(const char *arg, char *name, size_t name_size, const char **dir);

/* --chat-template FILE: the template in the Jinja file at path, with bos_token/eos_token from
 * tokens_from (may be NULL). Prints the error (naming verb) and returns NULL on failure. */
cinfer_chat_template *ci_cli_chat_template_file(const char *verb, const char *path,
                                                const cinfer_chat_template *tokens_from);

#endif
