/* `cinfer chat`: an interactive multi-turn chat on stdin/stdout through the model's chat
 * template, streaming each answer as it is generated. The history is kept across turns;
 * /reset clears it, /exit (or end of input) quits. */
#include "base/error.h"
#include "cli/args.h"
#include "cli/kv_flags.h"
#include "cli/sampling_flags.h"
#include "cli/text_session.h"
#include "cli/verbs.h"
#include "engine/eos_set.h"
#include "engine/generate.h"
#include "io/generation_config.h"
#include "io/model_path.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage[] =
    "usage: cinfer chat --model DIR [--system TEXT] [-n|--max-tokens N] [--temp T] [--top-p P]\n"
    "                   [--top-k K] [--min-p P] [--repeat-penalty R] [--presence-penalty P]\n"
    "                   [--frequency-penalty F] [--seed S] [--threads N]\n" CI_CLI_KV_USAGE
    "Type a message and press enter; /reset clears the conversation, /exit quits.\n";

enum { CHAT_DEFAULT_MAX_TOKENS = 1024 };

/* A fresh history holding the system message, if any. */
static json_t *new_history(const char *system) {
  json_t *messages = json_array();
  if (system)
    json_array_append_new(messages, json_pack("{s:s, s:s}", "role", "system", "content", system));
  return messages;
}

/* Removes trailing newline characters in place. */
static void chomp(char *line) {
  size_t n = strlen(line);
  while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
}

int ci_verb_chat(int argc, char **argv) {
  ci_flag flags[] = {{"--model", "-m", 1, NULL},   {"--system", NULL, 1, NULL},
                     {"--threads", "-t", 1, NULL}, {"--help", "-h", 0, NULL},
                     CI_CLI_SAMPLING_FLAGS,        CI_CLI_KV_FLAGS};
  const int nf = sizeof flags / sizeof flags[0];
  if (ci_args_parse(argc, argv, flags, nf, "chat")) return 2;
  if (ci_args_get(flags, nf, "--help")) {
    fputs(usage, stdout);
    return 0;
  }
  const char *model_arg = ci_args_get(flags, nf, "--model");
  if (!model_arg) {
    fprintf(stderr, "cinfer chat: --model is required\n%s", usage);
    return 2;
  }
  ci_sampling_overrides cli = {0};
  ci_cli_kv_plan kv_plan;
  long long threads;
  if (ci_cli_sampling_flags(flags, nf, "chat", &cli) ||
      ci_args_int(flags, nf, "--threads", 0, 1, 4096, &threads) ||
      ci_cli_kv_plan_parse(flags, nf, "chat", &kv_plan))
    return 2;
  char *dir = ci_model_path_resolve(model_arg);
  if (!dir) {
    fprintf(stderr, "cinfer chat: %s\n", ci_last_error());
    return 1;
  }
  ci_generation_config gen;
  ci_text_session text;
  if (ci_generation_config_load(dir, &gen)) {
    fprintf(stderr, "cinfer chat: %s\n", ci_last_error());
    free(dir);
    return 1;
  }
  if (ci_text_session_open(dir, 1, &text)) {
    free(dir);
    return 1;
  }
  free(dir);
  ci_cli_model cm;
  if (ci_cli_model_open(model_arg, (int)threads, &cm)) {
    ci_text_session_close(&text);
    return 1;
  }
  const ci_model_spec *spec = &cm.model->spec;
  const ci_sampling_overrides *layers[] = {&cli};
  ci_sampler_params params;
  int max_tokens, defaulted;
  ci_sampling_resolve(&gen, layers, 1, CHAT_DEFAULT_MAX_TOKENS, &params, &max_tokens, &defaulted);
  ci_eos_set eos = {0};
  int rc = 1;
  ci_sampler *sampler = NULL;
  json_t *history = new_history(ci_args_get(flags, nf, "--system"));
  char *line = NULL;
  size_t cap = 0;
  if (ci_eos_set_for_model(&eos, spec, &gen, text.tokenizer)) {
    fprintf(stderr, "cinfer chat: %s\n", ci_last_error());
    goto done;
  }
  sampler = ci_sampler_create(&params, spec->vocab);
  if (!sampler) {
    fprintf(stderr, "cinfer chat: %s\n", ci_last_error());
    goto done;
  }
  const int interactive = isatty(STDIN_FILENO);
  if (interactive) fprintf(stderr, "cinfer chat: /reset clears the conversation, /exit quits\n");
  rc = 0;
  for (;;) {
    if (interactive) {
      fputs("> ", stdout);
      fflush(stdout);
    }
    if (getline(&line, &cap, stdin) < 0) break;
    chomp(line);
    if (line[0] == '\0') continue;
    if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
    if (!strcmp(line, "/reset")) {
      json_decref(history);
      history = new_history(ci_args_get(flags, nf, "--system"));
      fprintf(stderr, "(conversation cleared)\n");
      continue;
    }
    json_array_append_new(history, json_pack("{s:s, s:s}", "role", "user", "content", line));
    int n_prompt = 0;
    int32_t *prompt = ci_text_session_chat(&text, history, &n_prompt);
    if (!prompt) {
      json_array_remove(history, json_array_size(history) - 1);
      continue;
    }
    ci_text_printer out;
    if (ci_text_printer_init(&out, &text, NULL, 0, 1)) {
      free(prompt);
      rc = 1;
      break;
    }
    ci_generate_options options;
    ci_generate_options_default(&options);
    options.max_tokens = max_tokens;
    options.ctx_size = spec->max_position;
    if (n_prompt + options.max_tokens > options.ctx_size)
      options.max_tokens = options.ctx_size - n_prompt;
    options.eos = &eos;
    options.on_token = ci_text_printer_on_token;
    options.ctx = &out;
    ci_cli_kv_plan_to_options(&kv_plan, &options);
    ci_generate_result result = {0};
    int status = options.max_tokens < 1
                     ? ci_fail("the conversation fills the context; /reset to start over")
                     : ci_generate(cm.model, sampler, prompt, n_prompt, &options, &result);
    if (status == CI_OK) status = ci_text_printer_finish(&out) ? CI_ERR : CI_OK;
    printf("\n");
    fflush(stdout);
    if (status) {
      fprintf(stderr, "cinfer chat: %s\n", ci_last_error());
      json_array_remove(history, json_array_size(history) - 1);
    } else {
      json_array_append_new(history, json_pack("{s:s, s:s}", "role", "assistant", "content",
                                               out.text ? out.text : ""));
      if (interactive)
        fprintf(stderr, "(%d tokens, %.1f tok/s)\n", result.stats.generated_tokens,
                result.stats.decode_tok_s);
    }
    ci_generate_result_free(&result);
    ci_text_printer_free(&out);
    free(prompt);
  }
done:
  free(line);
  json_decref(history);
  ci_sampler_free(sampler);
  ci_cli_model_close(&cm);
  ci_text_session_close(&text);
  return rc;
}
