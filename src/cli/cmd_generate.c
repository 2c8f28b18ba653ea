/* `cinfer generate`: continuation of a prompt with the full sampler, run by a public-API session
 * (cinfer_session: the library's generation loop; stats from its timings). Parameters: flags >
 * generation_config.json > built-in (cinfer_params_init, then the flags). Token-id prompts (--ids)
 * print the generated ids as they come; text prompts (--prompt, --prompt-file, --chat) go
 * through the model's tokenizer and chat template and stream text. */
#include "base/error.h"
#include "base/timing.h"
#include "cinfer.h"
#include "cli/args.h"
#include "cli/feed_progress.h"
#include "cli/kv_flags.h"
#include "cli/sampling_flags.h"
#include "cli/spec_flags.h"
#include "cli/text_session.h"
#include "cli/verbs.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static const char usage[] =
    "usage: cinfer generate -m|--model DIR (--ids CSV | -p|--prompt TEXT | -f|--prompt-file FILE)\n"
    "                       [--chat [--system TEXT] [--chat-template FILE]] [--stop STRING]\n"
    "                       [-n|--max-tokens N] [--temp T] [--top-p P]\n"
    "                       [--top-k K] [--min-p P] [--repeat-penalty R] [--presence-penalty P]\n"
    "                       [--frequency-penalty F] [--seed S] [--prefill-chunk N]\n"
    "                       [-c|--ctx-size N] [--ignore-eos] [--json]\n"
    "                       [--adapter DIR]\n" CI_CLI_MODEL_USAGE CI_CLI_KV_USAGE CI_CLI_SPEC_USAGE
    "Sampling defaults come from the model's generation_config.json, else temperature 0.7 and\n"
    "every filter off; --temp 0 is greedy. A text prompt streams the generated text (--chat\n"
    "wraps it in the model's chat template); an --ids prompt prints the generated ids (EOS not\n"
    "printed). Stats go to stderr; --json prints {ids, text?, finish_reason, stats} instead.\n"
    "--lookup-ngram N speculates by prompt lookup, --draft-model DIR with a smaller model sharing\n"
    "the tokenizer (docs/generation.md §6): the same output (greedy: token for token), fewer\n"
    "forward passes of the model.\n"
    "--prompt-file - reads the prompt from standard input. --adapter DIR applies a LoRA adapter\n"
    "(a PEFT or mlx-lm folder) beside the model's weights.\n";

/* ==== Prompt ==== */

/* 1 when the prompt is text (--prompt, --prompt-file) rather than ids. */
static int text_mode(const ci_flag *flags, int nf) {
  return ci_args_get(flags, nf, "--prompt") || ci_args_get(flags, nf, "--prompt-file");
}

/* Reads a whole file ("-": standard input) as a NUL-terminated string; NULL with the reason
 * printed when it cannot be read. */
static char *read_text_file(const char *path) {
  const int is_stdin = !strcmp(path, "-");
  FILE *f = is_stdin ? stdin : fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "cinfer generate: cannot open %s: %s\n", path, strerror(errno));
    return NULL;
  }
  size_t cap = 4096, len = 0, got;
  char *buf = malloc(cap);
  while (buf && (got = fread(buf + len, 1, cap - len - 1, f)) > 0) {
    len += got;
    if (len + 1 == cap) {
      char *bigger = realloc(buf, cap *= 2);
      if (!bigger) {
        free(buf);
        buf = NULL;
      }
      buf = bigger;
    }
  }
  const int read_failed = ferror(f);
  if (!is_stdin) fclose(f);
  if (!buf) {
    fprintf(stderr, "cinfer generate: out of memory reading %s\n", path);
  } else if (read_failed) {
    fprintf(stderr, "cinfer generate: cannot read %s\n", is_stdin ? "standard input" : path);
    free(buf);
    buf = NULL;
  } else {
    buf[len] = '\0';
  }
  return buf;
}

/* The prompt's token ids: --ids as given; text through the chat template (--chat, with an
 * optional --system message) or the tokenizer with its special tokens. NULL on error (printed). */
static int32_t *prompt_ids(const ci_flag *flags, int nf, const cinfer_model *model, int *n_ids) {
  const char *ids_arg = ci_args_get(flags, nf, "--ids");
  if (!text_mode(flags, nf)) {
    if (!ids_arg) {
      fprintf(stderr, "cinfer generate: --ids, --prompt or --prompt-file is required\n%s", usage);
      return NULL;
    }
    return ci_parse_id_list(ids_arg, n_ids);
  }
  const char *prompt = ci_args_get(flags, nf, "--prompt");
  char *owned = NULL;
  if (!prompt) {
    const char *path = ci_args_get(flags, nf, "--prompt-file");
    owned = read_text_file(path);
    if (!owned) return NULL;
    prompt = owned;
  }
  int32_t *ids;
  if (ci_args_get(flags, nf, "--chat")) {
    json_t *messages = json_array();
    const char *system = ci_args_get(flags, nf, "--system");
    if (messages && system &&
        json_array_append_new(messages,
                              json_pack("{s:s, s:s}", "role", "system", "content", system))) {
      json_decref(messages);
      messages = NULL;
    }
    if (messages && json_array_append_new(
                        messages, json_pack("{s:s, s:s}", "role", "user", "content", prompt))) {
      json_decref(messages);
      messages = NULL;
    }
    if (!messages) fprintf(stderr, "cinfer generate: out of memory\n");
    cinfer_chat_template *own = NULL;
    const char *template_path = ci_args_get(flags, nf, "--chat-template");
    if (template_path && !(own = ci_cli_chat_template_file("generate", template_path,
                                                           cinfer_model_chat_template(model)))) {
      json_decref(messages);
      messages = NULL;
    }
    ids = messages ? ci_text_prompt_chat(model, own, messages, n_ids) : NULL;
    cinfer_chat_template_free(own);
    json_decref(messages);
  } else {
    ids = ci_text_prompt_plain(model, prompt, n_ids);
  }
  free(owned);
  return ids;
}

/* ==== Output ==== */

typedef struct {
  int printed;           /* ids printed so far */
  int json;              /* collect only; the JSON object is printed at the end */
  ci_text_printer *text; /* a text prompt: stream text instead of ids */
  int failed;            /* printing failed (generation stops, exit 1) */
} token_printer;

/* Per generated token: print its id, or feed it to the text printer (which returns 1 when a stop
 * string completes). Non-zero stops generation. */
static int print_token(void *ctx, int32_t id) {
  token_printer *p = ctx;
  int r = 0;
  if (p->text)
    r = ci_text_printer_on_token(p->text, id);
  else if (!p->json)
    r = printf("%s%d", p->printed++ ? "," : "", (int)id) < 0 || fflush(stdout) != 0 ? -1 : 0;
  if (r < 0) p->failed = 1;
  return r;
}

static const char *finish_name(cinfer_finish finish, int failed) {
  if (failed) return "abort";
  switch (finish) {
  case CINFER_FINISH_STOP:
    return "stop";
  case CINFER_FINISH_LENGTH:
    return "length";
  case CINFER_FINISH_CANCEL:
  case CINFER_FINISH_NONE:
    break;
  }
  return "abort";
}

static void print_json(const int32_t *generated, size_t n_generated, const char *finish,
                       const cinfer_timings *t, uint64_t seed, const char *text) {
  json_t *ids = json_array();
  for (size_t i = 0; ids && i < n_generated; i++)
    json_array_append_new(ids, json_integer(generated[i]));
  json_t *stats = json_pack(
      "{s:i, s:f, s:f, s:i, s:f, s:f, s:I, s:I, s:i, s:i}", "prompt_tokens", t->prompt_tokens,
      "prefill_ms", t->prefill_seconds * 1000, "prefill_tok_s", t->prefill_tok_s, "gen_tokens",
      t->generated_tokens, "decode_tok_s", t->decode_tok_s, "ttft_ms", t->ttft_seconds * 1000,
      "peak_rss_bytes", (json_int_t)ci_peak_rss_bytes(), "seed", (json_int_t)(int64_t)seed,
      "draft_tokens", t->draft_tokens, "accepted_tokens", t->accepted_tokens);
  json_t *root = ids && stats ? json_pack("{s:o, s:s, s:o}", "ids", ids, "finish_reason", finish,
                                          "stats", stats)
                              : NULL;
  if (root && text) json_object_set_new(root, "text", json_string(text));
  char *dumped = root ? json_dumps(root, JSON_PRESERVE_ORDER) : NULL;
  if (dumped)
    printf("%s\n", dumped);
  else
    fprintf(stderr, "cinfer generate: out of memory for the JSON output\n");
  free(dumped);
  json_decref(root);
}

/* ==== Verb ==== */

int ci_verb_generate(int argc, char **argv) {
  ci_flag flags[] = {{"--model", "-m", 1, NULL},
                     {"--adapter", NULL, 1, NULL},
                     {"--ids", NULL, 1, NULL},
                     {"--prompt", "-p", 1, NULL},
                     {"--prompt-file", "-f", 1, NULL},
                     {"--chat", NULL, 0, NULL},
                     {"--system", NULL, 1, NULL},
                     {"--chat-template", NULL, 1, NULL},
                     {"--prefill-chunk", NULL, 1, NULL},
                     {"--ctx-size", "-c", 1, NULL},
                     {"--ignore-eos", NULL, 0, NULL},
                     {"--json", NULL, 0, NULL},
                     {"--help", "-h", 0, NULL},
                     {"--stop", NULL, 1, NULL},
                     CI_CLI_SAMPLING_FLAGS,
                     CI_CLI_SPEC_FLAGS,
                     CI_CLI_MODEL_FLAGS,
                     CI_CLI_KV_FLAGS};
  const int nf = sizeof flags / sizeof flags[0];
  if (ci_args_parse(argc, argv, flags, nf, "generate")) return 2;
  if (ci_args_get(flags, nf, "--help")) {
    fputs(usage, stdout);
    return 0;
  }
  const char *model_arg = ci_args_get(flags, nf, "--model");
  if (!model_arg) {
    fprintf(stderr, "cinfer generate: --model is required\n%s", usage);
    return 2;
  }
  /* Every flag is checked before the model loads (usage errors exit 2 at once). */
  cinfer_params params;
  cinfer_params_init(&params, NULL);
  cinfer_model_options model_options;
  long long prefill_chunk, ctx_size;
  if (ci_cli_kv_flags(flags, nf, "generate", &params, NULL, 0, NULL) ||
      ci_cli_sampling_flags(flags, nf, "generate", &params) ||
      ci_cli_spec_flags(flags, nf, "generate", &params) ||
      ci_cli_model_options(flags, nf, "generate", &model_options) ||
      ci_args_int(flags, nf, "--prefill-chunk", 2048, 1, 1 << 24, &prefill_chunk) ||
      ci_args_int(flags, nf, "--ctx-size", 0, 1, INT_MAX, &ctx_size))
    return 2;
  if (!text_mode(flags, nf) && !ci_args_get(flags, nf, "--ids")) {
    fprintf(stderr, "cinfer generate: --ids, --prompt or --prompt-file is required\n%s", usage);
    return 2;
  }
  if ((ci_args_get(flags, nf, "--chat") || ci_args_get(flags, nf, "--system") ||
       ci_args_get(flags, nf, "--chat-template") || ci_args_get(flags, nf, "--stop")) &&
      !text_mode(flags, nf)) {
    fprintf(stderr, "cinfer generate: --chat, --system, --chat-template and --stop need a text "
                    "prompt "
                    "(--prompt or --prompt-file)\n");
    return 2;
  }
  if (ci_args_get(flags, nf, "--system") && !ci_args_get(flags, nf, "--chat")) {
    fprintf(stderr,
            "cinfer generate: --system needs --chat (a system message is part of a chat)\n");
    return 2;
  }
  if (ci_args_get(flags, nf, "--prompt") && ci_args_get(flags, nf, "--prompt-file")) {
    fprintf(stderr, "cinfer generate: give --prompt or --prompt-file, not both\n");
    return 2;
  }
  const char *prompt_file = ci_args_get(flags, nf, "--prompt-file");
  if (prompt_file && strcmp(prompt_file, "-") != 0 && ci_fail_if_unopenable(prompt_file)) {
    fprintf(stderr, "cinfer generate: %s\n", ci_last_error()); /* before a model loads */
    return 2;
  }
  int n_prompt = 0;
  int32_t *prompt = NULL;
  if (!text_mode(flags, nf)) {
    prompt = prompt_ids(flags, nf, NULL, &n_prompt);
    if (!prompt) return 2;
  }

  cinfer_model *model = NULL;
  cinfer_adapter *adapter = NULL;
  cinfer_model *draft = NULL;
  int rc = ci_cli_model_load(flags, nf, "generate", model_arg, &model);
  if (rc) {
    free(prompt);
    return rc;
  }
  rc = 1;
  ci_text_printer text_out = {0};
  cinfer_session *session = NULL;
  const int json = ci_args_get(flags, nf, "--json") != NULL;
  token_printer printer = {0, json, NULL, 0};
  if (text_mode(flags, nf)) {
    prompt = prompt_ids(flags, nf, model, &n_prompt);
    if (!prompt) goto done;
    const char *stop = ci_args_get(flags, nf, "--stop");
    if (ci_text_printer_init(&text_out, model, stop ? &stop : NULL, stop ? 1 : 0, !json)) goto done;
    printer.text = &text_out;
  }
  /* The layers of the parameters: built-in < generation_config.json < flags. */
  cinfer_params_init(&params, model);
  if (ci_cli_adapter_load("generate", model, ci_args_get(flags, nf, "--adapter"), &adapter))
    goto done;
  params.adapter = adapter;
  ci_cli_kv_flags(flags, nf, "generate", &params, NULL, 0, NULL);
  ci_cli_sampling_flags(flags, nf, "generate", &params);
  ci_cli_spec_flags(flags, nf, "generate", &params);
  if (ci_cli_draft_model_load(flags, nf, "generate", model, &draft)) goto done;
  params.draft_model = draft;
  params.prefill_chunk = (int)prefill_chunk;
  params.context_size = (int)ctx_size;
  params.ignore_eos = ci_args_get(flags, nf, "--ignore-eos") != NULL;
  cinfer_status status = cinfer_session_create(model, &params, &session);
  if (status == CINFER_OK)
    status = ci_cli_feed(session, prompt, (size_t)n_prompt, isatty(STDERR_FILENO), NULL);
  if (status == CINFER_OK) status = cinfer_session_generate(session, print_token, &printer);
  if (status != CINFER_OK) {
    fprintf(stderr, "%scinfer generate: %s\n", printer.printed || text_out.len ? "\n" : "",
            cinfer_last_error());
    goto done;
  }
  if (printer.text && !printer.failed && ci_text_printer_finish(&text_out)) printer.failed = 1;
  if (printer.failed) {
    fprintf(stderr, "\ncinfer generate: writing the output failed\n");
    goto done;
  }
  size_t n_tokens = 0;
  const int32_t *tokens = cinfer_session_tokens(session, &n_tokens);
  cinfer_timings t;
  cinfer_session_timings(session, &t);
  if (json)
    print_json(tokens + n_prompt, n_tokens - (size_t)n_prompt,
               finish_name(cinfer_session_finish_reason(session), printer.failed), &t,
               cinfer_session_seed(session),
               printer.text ? (text_out.text ? text_out.text : "") : NULL);
  else
    printf("\n");
  fflush(stdout);
  fprintf(stderr,
          "prompt %d tok %.1f tok/s | gen %d tok %.1f tok/s | ttft %.1f ms | peak %.2f GB\n",
          t.prompt_tokens, t.prefill_tok_s, t.generated_tokens, t.decode_tok_s,
          t.ttft_seconds * 1000, (double)ci_peak_rss_bytes() / 1e9);
  if (t.draft_tokens > 0)
    fprintf(stderr, "speculative: %d drafted, %d accepted (%.0f%%)\n", t.draft_tokens,
            t.accepted_tokens, 100.0 * t.accepted_tokens / t.draft_tokens);
  rc = 0;
done:
  ci_text_printer_free(&text_out);
  cinfer_session_free(session);
  if (text_mode(flags, nf))
    cinfer_free(prompt);
  else
    free(prompt);
  cinfer_adapter_free(adapter);
  cinfer_model_free(draft);
  cinfer_model_free(model);
  return rc;
}
