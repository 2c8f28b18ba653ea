/* The verbs that manage models rather than run them — `pull`, `ls`, `rm`, `fit` — the `--pull`
 * switch of the verbs that take --model, and the helpers they share. They reach the library
 * through include/cinfer.h only. */
#ifndef CI_CLI_HUB_VERBS_H
#define CI_CLI_HUB_VERBS_H

#include "cli/args.h"

#include <stddef.h>
#include <stdint.h>

/* Each returns the process exit code: 0 success, 1 runtime error, 2 usage error. */
int ci_verb_pull(int argc, char **argv);
int ci_verb_ls(int argc, char **argv);
int ci_verb_rm(int argc, char **argv);
int ci_verb_fit(int argc, char **argv);

/* Pulls repo ("org/name[@revision]") into the hub cache, drawing progress on stderr (a bar on a
 * terminal, plain lines otherwise; nothing when quiet). Prints the error and returns 1 on
 * failure (2 for a malformed repo id), 0 on success; *snapshot (may be NULL; free) receives the snapshot folder. */
int ci_cli_pull(const char *repo, int quiet, char **snapshot);

/* For the verbs that take --model (-m): handles `--pull` before the verb parses its flags.
 * With --pull (removed from argv, *argc shrinks) a --model naming a repo id that is not cached
 * is pulled first, with progress. Without it such a model is an error suggesting
 * `cinfer pull ID` or --pull. Returns -1 to go on with the verb, else the exit code to end
 * with. */
int ci_cli_model_pull_flag(int *argc, char **argv, const char *verb);

/* Splits the one positional argument (e.g. the model of `cinfer fit MODEL`) out of argv and
 * parses the rest as flags (ci_args_parse). *positional is NULL when absent. Returns 0, or 2
 * after printing a usage error (a second positional, an unknown flag, ...). */
int ci_cli_args_positional(int argc, char **argv, ci_flag *flags, int n_flags, const char *verb,
                           const char **positional);

/* Writes bytes as "512 B", "12.3 MB", "1.50 GB" (decimal units, as the Hub shows sizes). */
void ci_cli_format_bytes(int64_t bytes, char *buf, size_t size);

#endif
