/* `cinfer generate`: continuation of a prompt with the full sampler, run by the serving engine
 * (engine/generate.h: a batch-1 engine, the server's loop; stats from its DONE timings).
 * Parameters: flags > generation_config.json > built-in (docs/generation.md §4.1). Token-id prompts (--ids)
 * print the generated ids as they come; text prompts (--prompt, --prompt-file, --chat) arrive
 * with the tokenizer and chat template. */
#include "base/error.h"
#include "cli/args.h"
#include "cli/kv_flags.h"
#include "cli/sampling_flags.h"
#include "cli/text_session.h"
#include "cli/verbs.h"
#include "engine/eos_set.h"
#include "engine/generate.h"
#include "engine/params.h"
#include "io/generation_config.h"
#include "io/model_path.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static const char usage[] =
    "usage: cinfer generate --model DIR (--ids CSV | --prompt TEXT | --prompt-file FILE)\n"
    "                       [--chat [--system TEXT]] [--stop STRING]\n"
    "                       [-n|--max-tokens N] [--temp T] [--top-p P]\n"
    "                       [--top-k K] [--min-p P] [--repeat-penalty R] [--presence-penalty P]\n"
    "                       [--frequency-penalty F] [--seed S] [--prefill-chunk N]\n"
    "                       [-c|--ctx-size N] [--ignore-eos] [--threads N] "
    "[--json]\n" CI_CLI_KV_USAGE
    "Sampling defaults come from the model's generation_config.json, else temperature 0.7 and\n"
    "every filter off; --temp 0 is greedy. A text prompt streams the generated text (--chat\n"
    "wraps it in the model's chat template); an --ids prompt prints the generated ids (EOS not\n"
    "printed). Stats go to stderr; --json prints {ids, text?, finish_reason, stats} instead.\n";

/* Built-in max_tokens of this verb (docs/generation.md §4.1). */
enum { GENERATE_DEFAULT_MAX_TOKENS = 256 };

/* ==== Prompt ==== */

/* 1 when the prompt is text (--prompt, --prompt-file) rather than ids. */
static int text_mode(const ci_flag *flags, int nf) {
  return ci_args_get(flags, nf, "--prompt") || ci_args_get(flags, nf, "--prompt-file");
}

/* Reads a whole file as a NUL-terminated string (NULL if unreadable). */
static char *read_text_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
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
  fclose(f);
  if (buf) buf[len] = '\0';
  return buf;
}

/* The prompt's token ids: --ids as given; text through the chat template (--chat, with an
 * optional --system message) or the tokenizer with its special tokens. NULL on error (printed). */
static int32_t *prompt_ids(const ci_flag *flags, int nf, const ci_text_session *text, int *n_ids) {
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
    if (!owned) {
      fprintf(stderr, "cinfer generate: cannot read --prompt-file %s\n", path);
      return NULL;
    }
    prompt = owned;
  }
  int32_t *ids;
  if (ci_args_get(flags, nf, "--chat")) {
    json_t *messages = json_array();
    const char *system = ci_args_get(flags, nf, "--system");
    if (system)
      json_array_append_new(messages, json_pack("{s:s, s:s}", "role", "system", "content", system));
    json_array_append_new(messages, json_pack("{s:s, s:s}", "role", "user", "content", prompt));
    ids = ci_text_session_chat(text, messages, n_ids);
    json_decref(messages);
  } else {
    ids = ci_text_session_plain(text, prompt, n_ids);
  }
  free(owned);
  return ids;
}

/* ==== Output ==== */

typedef struct {
  int printed; /* ids printed so far */
  int json;    /* collect only; the JSON object is printed at the end */
} id_printer;

/* Per generated token: print it (the text path will feed the detokenizer and the stop-string
 * matcher here, returning 1 when a stop string completes). */
static int print_token(void *ctx, int32_t id) {
  id_printer *p = ctx;
  if (p->json) return 0;
  if (printf("%s%d", p->printed++ ? "," : "", (int)id) < 0 || fflush(stdout) != 0) return -1;
  return 0;
}

static void print_json(const ci_generate_result *r, uint64_t seed, const char *text) {
  json_t *ids = json_array();
  for (int i = 0; i < r->n_ids; i++) json_array_append_new(ids, json_integer(r->ids[i]));
  const ci_generate_stats *s = &r->stats;
  json_t *stats = json_pack(
      "{s:i, s:f, s:f, s:i, s:f, s:f, s:I, s:I}", "prompt_tokens", s->prompt_tokens, "prefill_ms",
      s->prefill_seconds * 1000, "prefill_tok_s", s->prefill_tok_s, "gen_tokens",
      s->generated_tokens, "decode_tok_s", s->decode_tok_s, "ttft_ms", s->ttft_seconds * 1000,
      "peak_rss_bytes", (json_int_t)s->peak_rss_bytes, "seed", (json_int_t)(int64_t)seed);
  json_t *root = json_pack("{s:o, s:s, s:o}", "ids", ids, "finish_reason",
                           ci_finish_reason_name(r->finish), "stats", stats);
  if (root && text) json_object_set_new(root, "text", json_string(text));
  char *dumped = root ? json_dumps(root, JSON_PRESERVE_ORDER) : NULL;
  if (dumped) printf("%s\n", dumped);
  free(dumped);
  json_decref(root);
}

/* ==== Verb ==== */

/* Reads generation_config.json of the resolved model folder. */
static int load_generation_config(const char *model_arg, ci_generation_config *gen) {
  char *dir = ci_model_path_resolve(model_arg);
  int status = dir ? ci_generation_config_load(dir, gen) : CI_ERR;
  free(dir);
  return status;
}

int ci_verb_generate(int argc, char **argv) {
  ci_flag flags[] = {{"--model", "-m", 1, NULL},
                     {"--ids", NULL, 1, NULL},
                     {"--prompt", NULL, 1, NULL},
                     {"--prompt-file", NULL, 1, NULL},
                     {"--chat", NULL, 0, NULL},
                     {"--system", NULL, 1, NULL},
                     {"--max-tokens", "-n", 1, NULL},
                     {"--temp", "--temperature", 1, NULL},
                     {"--top-p", NULL, 1, NULL},
                     {"--top-k", NULL, 1, NULL},
                     {"--min-p", NULL, 1, NULL},
                     {"--repeat-penalty", NULL, 1, NULL},
                     {"--presence-penalty", NULL, 1, NULL},
                     {"--frequency-penalty", NULL, 1, NULL},
                     {"--seed", NULL, 1, NULL},
                     {"--prefill-chunk", NULL, 1, NULL},
                     {"--ctx-size", "-c", 1, NULL},
                     {"--ignore-eos", NULL, 0, NULL},
                     {"--threads", "-t", 1, NULL},
                     {"--json", NULL, 0, NULL},
                     {"--help", "-h", 0, NULL},
                     {"--stop", NULL, 1, NULL},
                     CI_CLI_KV_FLAGS};
  const int nf = sizeof flags / sizeof flags[0];
  if (ci_args_parse(argc, argv, flags, nf, "generate")) return 2;
  ci_cli_kv_plan kv_plan;
  if (ci_cli_kv_plan_parse(flags, nf, "generate", &kv_plan)) return 2;
  if (ci_args_get(flags, nf, "--help")) {
    fputs(usage, stdout);
    return 0;
  }
  const char *model_arg = ci_args_get(flags, nf, "--model");
  if (!model_arg) {
    fprintf(stderr, "cinfer generate: --model is required\n%s", usage);
    return 2;
  }
  ci_sampling_overrides cli = {0};
  long long threads, prefill_chunk, ctx_size;
  if (ci_cli_sampling_flags(flags, nf, "generate", &cli) ||
      ci_args_int(flags, nf, "--threads", 0, 1, 4096, &threads) ||
      ci_args_int(flags, nf, "--prefill-chunk", 2048, 1, 1 << 24, &prefill_chunk) ||
      ci_args_int(flags, nf, "--ctx-size", 0, 1, INT_MAX, &ctx_size))
    return 2;
  if (!text_mode(flags, nf) && !ci_args_get(flags, nf, "--ids")) {
    fprintf(stderr, "cinfer generate: --ids, --prompt or --prompt-file is required\n%s", usage);
    return 2;
  }
  if ((ci_args_get(flags, nf, "--chat") || ci_args_get(flags, nf, "--system") ||
       ci_args_get(flags, nf, "--stop")) &&
      !text_mode(flags, nf)) {
    fprintf(stderr, "cinfer generate: --chat, --system and --stop need a text prompt "
                    "(--prompt or --prompt-file)\n");
    return 2;
  }
  int n_prompt = 0;
  int32_t *prompt = NULL;
  ci_text_session text = {0};
  ci_text_printer text_out = {0};
  if (!text_mode(flags, nf)) {
    prompt = prompt_ids(flags, nf, NULL, &n_prompt);
    if (!prompt) return 2;
  }

  int rc = 1;
  ci_sampler *sampler = NULL;
  ci_generate_result result = {0};
  ci_generation_config gen;
  if (load_generation_config(model_arg, &gen)) {
    fprintf(stderr, "cinfer generate: %s\n", ci_last_error());
    free(prompt);
    return 1;
  }
  ci_cli_model cm;
  if (ci_cli_model_open(model_arg, (int)threads, &cm)) {
    free(prompt);
    return 1;
  }
  const ci_model_spec *spec = &cm.model->spec;
  if (text_mode(flags, nf)) {
    char *dir = ci_model_path_resolve(model_arg);
    const int failed =
        !dir || ci_text_session_open(dir, ci_args_get(flags, nf, "--chat") != NULL, &text);
    free(dir);
    if (failed) goto done;
    prompt = prompt_ids(flags, nf, &text, &n_prompt);
    if (!prompt) goto done;
    const char *stop = ci_args_get(flags, nf, "--stop");
    if (ci_text_printer_init(&text_out, &text, stop ? &stop : NULL, stop ? 1 : 0,
                             !ci_args_get(flags, nf, "--json")))
      goto done;
  }

  const ci_sampling_overrides *layers[] = {&cli};
  ci_sampler_params params;
  int max_tokens, max_tokens_defaulted;
  ci_sampling_resolve(&gen, layers, 1, GENERATE_DEFAULT_MAX_TOKENS, &params, &max_tokens,
                      &max_tokens_defaulted);
  const int ctx = ctx_size > 0 ? (int)ctx_size : spec->max_position;
  if (max_tokens_defaulted && (long long)n_prompt + max_tokens > ctx && n_prompt < ctx)
    max_tokens = ctx - n_prompt; /* a defaulted cap is clamped to the context */

  ci_eos_set eos = {0};
  const int ignore_eos = ci_args_get(flags, nf, "--ignore-eos") != NULL;
  if (!ignore_eos && ci_eos_set_for_model(&eos, spec, &gen, text.tokenizer)) {
    fprintf(stderr, "cinfer generate: %s\n", ci_last_error());
    goto done;
  }
  sampler = ci_sampler_create(&params, spec->vocab);
  if (!sampler) {
    fprintf(stderr, "cinfer generate: %s\n", ci_last_error());
    goto done;
  }

  id_printer printer = {0, ci_args_get(flags, nf, "--json") != NULL};
  ci_generate_options options;
  ci_generate_options_default(&options);
  options.max_tokens = max_tokens;
  ci_cli_kv_plan_to_options(&kv_plan, &options);
  options.prefill_chunk = (int)prefill_chunk;
  options.ctx_size = ctx;
  options.eos = &eos;
  options.on_token = text.tokenizer ? ci_text_printer_on_token : print_token;
  options.ctx = text.tokenizer ? (void *)&text_out : (void *)&printer;
  if (ci_generate(cm.model, sampler, prompt, n_prompt, &options, &result)) {
    fprintf(stderr, "%scinfer generate: %s\n", printer.printed || text_out.len ? "\n" : "",
            ci_last_error());
    goto done;
  }
  if (text.tokenizer && ci_text_printer_finish(&text_out)) {
    fprintf(stderr, "cinfer generate: %s\n", ci_last_error());
    goto done;
  }
  if (printer.json)
    print_json(&result, ci_sampler_seed(sampler),
               text.tokenizer ? (text_out.text ? text_out.text : "") : NULL);
  else
    printf("\n");
  fflush(stdout);
  const ci_generate_stats *s = &result.stats;
  fprintf(stderr,
          "prompt %d tok %.1f tok/s | gen %d tok %.1f tok/s | ttft %.1f ms | peak %.2f GB\n",
          s->prompt_tokens, s->prefill_tok_s, s->generated_tokens, s->decode_tok_s,
          s->ttft_seconds * 1000, (double)s->peak_rss_bytes / 1e9);
  rc = result.finish == CI_FINISH_ABORT ? 1 : 0;
done:
  ci_text_printer_free(&text_out);
  ci_text_session_close(&text);
  ci_generate_result_free(&result);
  ci_sampler_free(sampler);
  free(prompt);
  ci_cli_model_close(&cm);
  return rc;
}
