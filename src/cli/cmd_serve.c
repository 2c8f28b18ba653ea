/* `cinfer serve`: loads the model, starts the engine thread and the HTTP server, prints the URL
 * and a ready-to-paste curl line, and shuts down cleanly on SIGINT/SIGTERM. */
#include "base/error.h"
#include "cli/args.h"
#include "cli/kv_flags.h"
#include "cli/sampling_flags.h"
#include "engine/model_open.h"
#include "cli/verbs.h"
#include "engine/engine.h"
#include "engine/eos_set.h"
#include "engine/params.h"
#include "io/generation_config.h"
#include "io/model_path.h"
#include "server/server.h"
#include "tensor/kv_format.h"

/* Interim: the server is moved onto cinfer.h next; until then serve opens the model itself. */
typedef struct {
  ci_model *model;
} ci_cli_model;
typedef struct {
  ci_kv_codec base;
  int quantized;
  ci_kv_format target;
  long long start;
  int protect;
  int explicit_codec;
} ci_cli_kv_plan;

static int ci_cli_kv_plan_parse(const ci_flag *flags, int n_flags, const char *verb,
                                ci_cli_kv_plan *out) {
  memset(out, 0, sizeof *out);
  const char *codec = ci_args_get(flags, n_flags, "--kv-codec");
  long long bits, value_bits, group, start, protect;
  if (ci_args_int(flags, n_flags, "--kv-bits", 4, 2, 8, &bits) ||
      ci_args_int(flags, n_flags, "--kv-value-bits", 0, 2, 8, &value_bits) ||
      ci_args_int(flags, n_flags, "--kv-group-size", 0, 32, 128, &group) ||
      ci_args_int(flags, n_flags, "--kv-start", 0, 0, 1LL << 40, &start) ||
      ci_args_int(flags, n_flags, "--kv-protect", 0, 0, 1 << 16, &protect))
    return 2;
  ci_kv_format format;
  if (ci_kv_format_parse(codec ? codec : "bf16", (int)bits, (int)value_bits, (int)group, &format)) {
    fprintf(stderr, "cinfer %s: --kv-codec: %s\n", verb, ci_last_error());
    return 2;
  }
  out->start = start;
  out->protect = (int)protect;
  out->explicit_codec = codec != NULL;
  if (ci_kv_format_is_quantized(&format)) {
    out->base = CI_KV_BF16;
    out->quantized = 1;
    out->target = format;
  } else {
    out->base = format.codec;
  }
  return 0;
}

static int ci_cli_model_open(const char *model_arg, int n_threads, ci_cli_model *out) {
  out->model = ci_model_open(model_arg, n_threads);
  if (!out->model) {
    fprintf(stderr, "cinfer: %s\n", ci_last_error());
    return 1;
  }
  return 0;
}

static void ci_cli_model_close(ci_cli_model *cm) {
  ci_model_close(cm->model);
  cm->model = NULL;
}

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char usage[] =
    "usage: cinfer serve --model DIR|org/name [--host 127.0.0.1] [--port 8080] [--api-key KEY]\n"
    "                    [--alias NAME] [--batch N] [--batch-tokens N] [--max-queue N]\n"
    "                    [-c|--ctx-size N] [--memory-budget GB] [--prefill-chunk N]\n"
    "                    [--prompt-cache GiB] [--max-body MiB] [--threads N] [--cors ORIGIN|*]\n"
    "                    [sampling defaults: --temp ...]\n" CI_CLI_KV_USAGE
    "Serves the OpenAI (/v1/chat/completions, /v1/completions, /v1/models) and Anthropic\n"
    "(/v1/messages) APIs plus /health, /metrics and /stats. --api-key (or CINFER_API_KEY; a\n"
    "comma-separated list) requires `Authorization: Bearer KEY` or `x-api-key: KEY`. --cors\n"
    "ORIGIN (a comma-separated list, or *) adds CORS headers and answers OPTIONS preflights.\n"
    "--prompt-cache caps the KV bytes the prefix cache keeps for reuse (default 2 GiB, within\n"
    "the KV budget; 0 turns it off).\n";

/* The sampling flags as a precedence layer (interim, see above). */
static int ci_cli_serve_sampling_flags(const ci_flag *flags, int nf, ci_sampling_overrides *o) {
  cinfer_params base, p;
  cinfer_params_init(&base, NULL);
  p = base;
  if (ci_cli_sampling_flags(flags, nf, "serve", &p)) return 2;
  o->has_temperature = ci_args_get(flags, nf, "--temp") != NULL;
  o->temperature = p.temperature;
  o->has_top_p = ci_args_get(flags, nf, "--top-p") != NULL;
  o->top_p = p.top_p;
  o->has_top_k = ci_args_get(flags, nf, "--top-k") != NULL;
  o->top_k = p.top_k;
  o->has_min_p = ci_args_get(flags, nf, "--min-p") != NULL;
  o->min_p = p.min_p;
  o->has_repetition_penalty = ci_args_get(flags, nf, "--repeat-penalty") != NULL;
  o->repetition_penalty = p.repetition_penalty;
  o->has_presence_penalty = ci_args_get(flags, nf, "--presence-penalty") != NULL;
  o->presence_penalty = p.presence_penalty;
  o->has_frequency_penalty = ci_args_get(flags, nf, "--frequency-penalty") != NULL;
  o->frequency_penalty = p.frequency_penalty;
  o->has_seed = p.has_seed;
  o->seed = p.seed;
  o->has_max_tokens = p.max_tokens_explicit;
  o->max_tokens = p.max_tokens;
  return 0;
}

int ci_verb_serve(int argc, char **argv) {
  ci_flag flags[] = {{"--model", "-m", 1, NULL},
                     {"--host", NULL, 1, NULL},
                     {"--port", NULL, 1, NULL},
                     {"--api-key", NULL, 1, NULL},
                     {"--alias", NULL, 1, NULL},
                     {"--batch", "--parallel", 1, NULL},
                     {"--batch-tokens", NULL, 1, NULL},
                     {"--max-queue", NULL, 1, NULL},
                     {"--ctx-size", "-c", 1, NULL},
                     {"--memory-budget", NULL, 1, NULL},
                     {"--prefill-chunk", NULL, 1, NULL},
                     {"--prompt-cache", NULL, 1, NULL},
                     {"--max-body", NULL, 1, NULL},
                     {"--threads", "-t", 1, NULL},
                     {"--cors", NULL, 1, NULL},
                     {"--help", "-h", 0, NULL},
                     CI_CLI_SAMPLING_FLAGS,
                     CI_CLI_KV_FLAGS};
  const int nf = sizeof flags / sizeof flags[0];
  if (ci_args_parse(argc, argv, flags, nf, "serve")) return 2;
  if (ci_args_get(flags, nf, "--help")) {
    fputs(usage, stdout);
    return 0;
  }
  ci_cli_kv_plan kv_plan;
  if (ci_cli_kv_plan_parse(flags, nf, "serve", &kv_plan)) return 2;
  const char *model_arg = ci_args_get(flags, nf, "--model");
  if (!model_arg) {
    fprintf(stderr, "cinfer serve: --model is required\n%s", usage);
    return 2;
  }
  ci_sampling_overrides cli = {0};
  if (ci_cli_serve_sampling_flags(flags, nf, &cli)) return 2;
  long long port, batch, batch_tokens, max_queue, ctx_size, prefill_chunk, max_body, threads;
  if (ci_args_int(flags, nf, "--port", 8080, 0, 65535, &port) ||
      ci_args_int(flags, nf, "--batch", 8, 1, 512, &batch) ||
      ci_args_int(flags, nf, "--batch-tokens", 2048, 1, 1 << 20, &batch_tokens) ||
      ci_args_int(flags, nf, "--max-queue", 256, 0, 1 << 20, &max_queue) ||
      ci_args_int(flags, nf, "--ctx-size", 0, 1, INT_MAX, &ctx_size) ||
      ci_args_int(flags, nf, "--prefill-chunk", 2048, 1, 1 << 24, &prefill_chunk) ||
      ci_args_int(flags, nf, "--max-body", 16, 1, 4096, &max_body) ||
      ci_args_int(flags, nf, "--threads", 0, 1, 4096, &threads))
    return 2;
  double budget_gb = 0;
  const char *budget_arg = ci_args_get(flags, nf, "--memory-budget");
  if (budget_arg) {
    char *end;
    budget_gb = strtod(budget_arg, &end);
    if (*end || !(budget_gb > 0)) {
      fprintf(stderr, "cinfer serve: --memory-budget must be a positive number of GB\n");
      return 2;
    }
  }
  double prompt_cache_gib = 2;
  const char *prompt_cache_arg = ci_args_get(flags, nf, "--prompt-cache");
  if (prompt_cache_arg) {
    char *end;
    prompt_cache_gib = strtod(prompt_cache_arg, &end);
    if (*end || !(prompt_cache_gib >= 0) || prompt_cache_gib > 1e6) {
      fprintf(stderr, "cinfer serve: --prompt-cache must be a number of GiB >= 0\n");
      return 2;
    }
  }
  const char *host = ci_args_get(flags, nf, "--host");
  if (!host) host = "127.0.0.1";
  const char *api_key = ci_args_get(flags, nf, "--api-key");
  if (!api_key) api_key = getenv("CINFER_API_KEY");

  /* Block the stop signals before any thread starts, so sigwait below receives them. */
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
  signal(SIGPIPE, SIG_IGN);

  char *dir = ci_model_path_resolve(model_arg);
  if (!dir) {
    fprintf(stderr, "cinfer serve: %s\n", ci_last_error());
    return 1;
  }
  int rc = 1;
  ci_generation_config gen;
  ci_cli_model cm = {0};
  ci_tokenizer *tok = NULL;
  ci_chat_template *tmpl = NULL;
  ci_engine *engine = NULL;
  ci_server *server = NULL;
  if (ci_generation_config_load(dir, &gen)) {
    fprintf(stderr, "cinfer serve: %s\n", ci_last_error());
    goto done;
  }
  if (ci_cli_model_open(dir, (int)threads, &cm)) goto done;
  tok = ci_tokenizer_load_dir(dir);
  if (!tok) {
    fprintf(stderr, "cinfer serve: %s\n", ci_last_error());
    goto done;
  }
  tmpl = ci_chat_template_load_dir(dir); /* optional: chat routes answer 400 without one */
  ci_engine_options eo;
  ci_engine_options_default(&eo);
  eo.batch = (int)batch;
  eo.batch_tokens = (int)batch_tokens;
  eo.prefill_chunk = (int)prefill_chunk;
  eo.max_queue = (int)max_queue;
  eo.ctx_size = (int)ctx_size;
  eo.base = kv_plan.base;
  eo.kv_protect = kv_plan.protect;
  eo.prefix_cache_bytes = (int64_t)(prompt_cache_gib * (double)(1 << 30));
  if (budget_gb > 0) {
    const int64_t weights = ci_model_weight_bytes_per_token(cm.model);
    eo.kv_budget_bytes = (int64_t)(budget_gb * 1e9) - weights - (64LL << 20);
    if (eo.kv_budget_bytes <= 0) {
      fprintf(stderr,
              "cinfer serve: --memory-budget %.2f GB leaves nothing for the KV cache "
              "(weights take %.2f GB)\n",
              budget_gb, (double)weights / 1e9);
      goto done;
    }
  }
  if (ctx_size > cm.model->spec.max_position) {
    fprintf(stderr, "cinfer serve: --ctx-size %lld exceeds max_position_embeddings %d\n", ctx_size,
            cm.model->spec.max_position);
    rc = 2;
    goto done;
  }
  engine = ci_engine_create(cm.model, &eo);
  if (!engine) {
    fprintf(stderr, "cinfer serve: %s\n", ci_last_error());
    goto done;
  }
  ci_server_options so;
  memset(&so, 0, sizeof so);
  so.engine = engine;
  so.model = cm.model;
  so.tokenizer = tok;
  so.chat_template = tmpl;
  so.gen = &gen;
  so.cli = &cli;
  if (ci_eos_set_for_model(&so.eos, &cm.model->spec, &gen, tok)) {
    fprintf(stderr, "cinfer serve: %s\n", ci_last_error());
    goto done;
  }
  so.kv_plan = kv_plan.quantized        ? CI_KV_PLAN_TARGET
               : kv_plan.explicit_codec ? CI_KV_PLAN_NONE
                                        : CI_KV_PLAN_MODEL_CONFIG;
  so.kv_target = kv_plan.target;
  so.kv_start = kv_plan.start;
  so.kv_protect = kv_plan.protect;
  const char *alias = ci_args_get(flags, nf, "--alias");
  const char *base = strrchr(dir, '/');
  struct stat st_arg;
  const int is_folder = stat(model_arg, &st_arg) == 0 && S_ISDIR(st_arg.st_mode);
  so.model_id = alias ? alias : !is_folder ? model_arg : (base && base[1] ? base + 1 : dir);
  so.host = host;
  so.port = (int)port;
  so.api_keys = api_key;
  so.max_body = (size_t)max_body << 20;
  so.threads = (int)threads;
  so.cors = ci_args_get(flags, nf, "--cors");
  server = ci_server_start(&so);
  if (!server) {
    fprintf(stderr, "cinfer serve: %s\n", ci_last_error());
    goto done;
  }
  char kv_name[64];
  ci_kv_format_name(&kv_plan.target, kv_name, sizeof kv_name);
  ci_engine_stats engine_stats;
  ci_engine_get_stats(engine, &engine_stats); /* the KV budget the engine resolved */
  fprintf(stderr,
          "cinfer ready http://%s:%lld/v1 model=%s ctx=%d kv=%s batch=%lld kv-budget=%.2fGB "
          "prompt-cache=%.2fGB\n",
          host, port, so.model_id, ci_engine_ctx_size(engine), kv_plan.quantized ? kv_name : "bf16",
          batch, (double)engine_stats.kv_budget_bytes / 1e9,
          (double)engine_stats.prefix_cache_max_bytes / 1e9);
  fprintf(stderr,
          "try: curl http://%s:%lld/v1/chat/completions -H 'Content-Type: application/json'%s%s%s "
          "-d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":64}'\n",
          host, port, api_key ? " -H 'Authorization: Bearer " : "", api_key ? api_key : "",
          api_key ? "'" : "");
  int sig = 0;
  sigwait(&stop_signals, &sig);
  fprintf(stderr, "cinfer serve: signal %d, shutting down\n", sig);
  rc = 0;
done:
  if (engine) ci_engine_stop(engine); /* ends every stream, so connections can close */
  ci_server_stop(server);
  ci_engine_free(engine);
  ci_chat_template_free(tmpl);
  ci_tokenizer_free(tok);
  ci_cli_model_close(&cm);
  free(dir);
  return rc;
}
