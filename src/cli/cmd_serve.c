/* `cinfer serve`: loads the model, starts the engine and the HTTP server over the public C API,
 * prints the URL and a ready-to-paste curl line, and shuts down cleanly on SIGINT/SIGTERM. */
#include "base/error.h"
#include "cinfer.h"
#include "cli/args.h"
#include "cli/kv_flags.h"
#include "cli/sampling_flags.h"
#include "cli/spec_flags.h"
#include "cli/verbs.h"
#include "server/server.h"

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char usage[] =
    "usage: cinfer serve --model DIR|org/name [--host 127.0.0.1] [--port 8080] [--api-key KEY]\n"
    "                    [--alias NAME] [--batch N] [--batch-tokens N] [--max-queue N]\n"
    "                    [-c|--ctx-size N] [--memory-budget GB] [--prefill-chunk N]\n"
    "                    [--prompt-cache GiB] [--prompt-cache-dir DIR] [--max-body MiB]\n"
    "                    [--cors ORIGIN|*] [--no-webui]\n"
    "                    [--chat-template FILE] [--log-format text|json] [-q|--quiet]\n"
    "                    [--idle-timeout S] [--max-connections N]\n"
    "                    [--lookup-ngram N | --draft-model DIR] [--draft-max N] [--draft-min N]\n"
    "                    [--spec-max-batch N] [--spec-policy auto|always|never]\n"
    "                    [--adapter [NAME=]DIR ...] [--adapter-dir DIR]\n"
    "                    [sampling defaults: --temp ...]\n" CI_CLI_MODEL_USAGE CI_CLI_KV_USAGE
    "Serves the OpenAI (/v1/chat/completions, /v1/completions, /v1/models) and Anthropic\n"
    "(/v1/messages) APIs plus /health, /metrics and /stats. --api-key (or CINFER_API_KEY; a\n"
    "comma-separated list) requires `Authorization: Bearer KEY` or `x-api-key: KEY`. --cors\n"
    "ORIGIN (a comma-separated list, or *) adds CORS headers and answers OPTIONS preflights.\n"
    "--prompt-cache caps the KV bytes the prefix cache keeps for reuse (default 2 GiB, within\n"
    "the KV budget; 0 turns it off). --prompt-cache-dir DIR also keeps its blocks on disk "
    "(written\n"
    "in the background, read back when a prompt starts with them, also after a restart; POST\n"
    "/v1/cache/save and /v1/cache/load for explicit control; `cinfer cache ls|prune DIR`).\n"
    "A chat page is served at / unless --no-webui. --port 0\n"
    "takes a free port (printed). --host takes an IPv4/IPv6 address or a name. One access log\n"
    "line per request on stderr (--log-format json for JSON lines; --quiet for none). Idle\n"
    "connections close after --idle-timeout seconds (default 30); at most --max-connections\n"
    "(default 4096) are open.\n"
    "--lookup-ngram N turns on speculative decoding by prompt lookup (n-grams of N .. 1 tokens\n"
    "of the prompt and the text so far propose up to --draft-max tokens (5) per round, verified\n"
    "in one step; the draft length adapts between --draft-min (1) and --draft-max);\n"
    "--draft-model DIR drafts with a smaller model sharing the tokenizer instead. A request may\n"
    "lower its draft length or turn it off with \"num_draft\" or \"speculative\". A step "
    "speculates\n"
    "only when the measured step times and acceptance say it pays; --spec-max-batch N never\n"
    "speculates in a step of more than N decoding requests (0, the default: no cap);\n"
    "--spec-policy always speculates in every step that has drafts (as llama.cpp does), never\n"
    "in none (auto, the default: when it pays).\n"
    "--adapter mounts a LoRA adapter folder (PEFT or mlx-lm; repeatable; named by its folder or\n"
    "NAME=); a request picks one with \"adapter\": NAME or \"model\": \"MODEL:NAME\".\n"
    "--adapter-dir DIR lets GET/POST /v1/adapters and DELETE /v1/adapters/{id} mount and unmount\n"
    "adapters by folder name under DIR at run time (these need --api-key unless the server\n"
    "listens on loopback only).\n";

/* The prompt cache's warnings (skipped files, failed writes) go to stderr. */
static void warn_prompt_cache(void *user, const char *message) {
  (void)user;
  fprintf(stderr, "cinfer serve: %s\n", message);
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
                     {"--prompt-cache-dir", NULL, 1, NULL},
                     {"--max-body", NULL, 1, NULL},
                     {"--cors", NULL, 1, NULL},
                     {"--no-webui", NULL, 0, NULL},
                     {"--log-format", NULL, 1, NULL},
                     {"--quiet", "-q", 0, NULL},
                     {"--idle-timeout", NULL, 1, NULL},
                     {"--max-connections", NULL, 1, NULL},
                     {"--chat-template", NULL, 1, NULL},
                     CI_CLI_SPEC_FLAGS,
                     {"--spec-max-batch", NULL, 1, NULL},
                     {"--spec-policy", NULL, 1, NULL},
                     {"--adapter", NULL, 2, NULL},
                     {"--adapter-dir", NULL, 1, NULL},
                     {"--help", "-h", 0, NULL},
                     CI_CLI_MODEL_FLAGS,
                     CI_CLI_SAMPLING_FLAGS,
                     CI_CLI_KV_FLAGS};
  const int nf = sizeof flags / sizeof flags[0];
  if (ci_args_parse(argc, argv, flags, nf, "serve")) return 2;
  if (ci_args_get(flags, nf, "--help")) {
    fputs(usage, stdout);
    return 0;
  }
  cinfer_params defaults;
  cinfer_params_init(&defaults, NULL);
  char kv_name[32];
  int kv_quantized = 0;
  if (ci_cli_kv_flags(flags, nf, "serve", &defaults, kv_name, sizeof kv_name, &kv_quantized))
    return 2;
  const char *model_arg = ci_args_get(flags, nf, "--model");
  if (!model_arg) {
    fprintf(stderr, "cinfer serve: --model is required\n%s", usage);
    return 2;
  }
  cinfer_model_options model_options;
  long long port, batch, batch_tokens, max_queue, ctx_size, prefill_chunk, max_body, idle_timeout,
      max_connections, spec_max_batch;
  ci_cli_spec spec;
  if (ci_cli_sampling_flags(flags, nf, "serve", &defaults) ||
      ci_cli_model_options(flags, nf, "serve", &model_options) ||
      ci_args_int(flags, nf, "--port", 8080, 0, 65535, &port) ||
      ci_args_int(flags, nf, "--batch", 8, 1, 512, &batch) ||
      ci_args_int(flags, nf, "--batch-tokens", 2048, 1, 1 << 20, &batch_tokens) ||
      ci_args_int(flags, nf, "--max-queue", 256, 0, 1 << 20, &max_queue) ||
      ci_args_int(flags, nf, "--ctx-size", 0, 1, INT_MAX, &ctx_size) ||
      ci_args_int(flags, nf, "--prefill-chunk", 2048, 1, 1 << 24, &prefill_chunk) ||
      ci_args_int(flags, nf, "--max-body", 16, 1, 4096, &max_body) ||
      ci_args_int(flags, nf, "--idle-timeout", 30, 1, 86400, &idle_timeout) ||
      ci_args_int(flags, nf, "--max-connections", 4096, 1, 1 << 16, &max_connections) ||
      ci_args_int(flags, nf, "--spec-max-batch", 0, 0, 512, &spec_max_batch) ||
      ci_cli_spec_parse(flags, nf, "serve", &spec))
    return 2;
  const char *spec_policy = ci_args_get(flags, nf, "--spec-policy");
  const int policy = !spec_policy || !strcmp(spec_policy, "auto") ? CINFER_SPEC_AUTO
                     : !strcmp(spec_policy, "always")             ? CINFER_SPEC_ALWAYS
                     : !strcmp(spec_policy, "never")              ? CINFER_SPEC_NEVER
                                                                  : -1;
  if (policy < 0) {
    fprintf(stderr, "cinfer serve: --spec-policy must be auto, always or never (got '%s')\n",
            spec_policy);
    return 2;
  }
  const char *log_format = ci_args_get(flags, nf, "--log-format");
  if (log_format && strcmp(log_format, "text") && strcmp(log_format, "json")) {
    fprintf(stderr, "cinfer serve: --log-format must be text or json (got '%s')\n", log_format);
    return 2;
  }
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

  cinfer_model *model = NULL;
  int rc = ci_cli_model_load(flags, nf, "serve", model_arg, &model);
  if (rc) return rc;
  rc = 1;
  cinfer_engine *engine = NULL;
  cinfer_model *draft = NULL;
  ci_server *server = NULL;
  char *folder = NULL;                       /* the model folder's real path (for its name) */
  cinfer_chat_template *own_template = NULL; /* --chat-template */
  enum { MAX_START_ADAPTERS = 64 };
  const char *adapter_args[MAX_START_ADAPTERS];
  char adapter_names[MAX_START_ADAPTERS][65];
  const char *adapter_ids[MAX_START_ADAPTERS];
  cinfer_adapter *adapters[MAX_START_ADAPTERS] = {0};
  const int n_adapter_args = ci_args_all(argc, argv, "--adapter", adapter_args, MAX_START_ADAPTERS);
  const int n_adapters = n_adapter_args < MAX_START_ADAPTERS ? n_adapter_args : MAX_START_ADAPTERS;
  if (!cinfer_model_tokenizer(model)) {
    fprintf(stderr, "cinfer serve: the model folder has no tokenizer.json\n");
    goto done;
  }
  /* The request defaults: built-in < generation_config.json < flags. */
  cinfer_params_init(&defaults, model);
  ci_cli_sampling_flags(flags, nf, "serve", &defaults);
  ci_cli_kv_flags(flags, nf, "serve", &defaults, kv_name, sizeof kv_name, &kv_quantized);
  const int max_tokens_configured =
      defaults.max_tokens_explicit || cinfer_model_max_new_tokens(model) > 0;
  cinfer_engine_options eo;
  cinfer_engine_options_init(&eo);
  eo.max_batch = (int)batch;
  eo.batch_tokens = (int)batch_tokens;
  eo.prefill_chunk = (int)prefill_chunk;
  eo.max_queue = (int)max_queue;
  eo.lookup_ngram = spec.lookup_ngram;
  eo.draft_max = spec.draft_max;
  eo.draft_min = spec.draft_min;
  eo.spec_max_batch = (int)spec_max_batch;
  eo.spec_policy = policy;
  if (ci_cli_draft_model_load(flags, nf, "serve", model, &draft)) goto done;
  eo.draft_model = draft;
  eo.context_size = (int)ctx_size;
  /* a plain --kv-codec (bf16, f32) is what every sequence stores; a quantized one is each
     request's plan from bf16 */
  eo.kv_codec = defaults.kv_codec && !kv_quantized ? defaults.kv_codec : NULL;
  eo.kv_protect = defaults.kv_protect;
  eo.prefix_cache_bytes = (int64_t)(prompt_cache_gib * (double)(1 << 30));
  eo.prompt_cache_dir = ci_args_get(flags, nf, "--prompt-cache-dir");
  eo.prompt_cache_warn = warn_prompt_cache;
  if (eo.prompt_cache_dir && eo.prefix_cache_bytes <= 0) {
    fprintf(stderr,
            "cinfer serve: --prompt-cache-dir needs the prefix cache (--prompt-cache > 0)\n");
    rc = 2;
    goto done;
  }
  if (budget_gb > 0) {
    const int64_t weights = cinfer_model_weight_bytes(model);
    eo.kv_budget_bytes = (int64_t)(budget_gb * 1e9) - weights - (64LL << 20);
    if (eo.kv_budget_bytes <= 0) {
      fprintf(stderr,
              "cinfer serve: --memory-budget %.2f GB leaves nothing for the KV cache "
              "(weights take %.2f GB)\n",
              budget_gb, (double)weights / 1e9);
      goto done;
    }
  }
  if (ctx_size > cinfer_model_context_length(model)) {
    fprintf(stderr, "cinfer serve: --ctx-size %lld exceeds max_position_embeddings %d\n", ctx_size,
            cinfer_model_context_length(model));
    rc = 2;
    goto done;
  }
  if (n_adapter_args > MAX_START_ADAPTERS) {
    fprintf(stderr, "cinfer serve: at most %d --adapter flags (mount more with --adapter-dir)\n",
            MAX_START_ADAPTERS);
    rc = 2;
    goto done;
  }
  for (int i = 0; i < n_adapters; i++) {
    const char *dir = NULL;
    if (ci_cli_adapter_spec(adapter_args[i], adapter_names[i], sizeof adapter_names[i], &dir)) {
      fprintf(stderr, "cinfer serve: --adapter '%s' is not DIR or NAME=DIR\n", adapter_args[i]);
      rc = 2;
      goto done;
    }
    adapter_ids[i] = adapter_names[i];
    if (ci_cli_adapter_load("serve", model, dir, &adapters[i])) goto done;
  }
  if (cinfer_engine_create(model, &eo, &engine) != CINFER_OK) {
    fprintf(stderr, "cinfer serve: %s\n", cinfer_last_error());
    goto done;
  }
  ci_server_options so;
  memset(&so, 0, sizeof so);
  so.engine = engine;
  so.model = model;
  so.tokenizer = cinfer_model_tokenizer(model);
  so.chat_template = cinfer_model_chat_template(model); /* optional: chat routes answer 400 */
  const char *template_path = ci_args_get(flags, nf, "--chat-template");
  if (template_path) {
    own_template = ci_cli_chat_template_file("serve", template_path, so.chat_template);
    if (!own_template) goto done;
    so.chat_template = own_template;
  }
  so.chat_format = cinfer_model_chat_format(model);
  so.vocab = cinfer_model_vocab_size(model);
  so.defaults = &defaults;
  so.max_tokens_configured = max_tokens_configured;
  const char *alias = ci_args_get(flags, nf, "--alias");
  struct stat st_arg;
  const int is_folder = stat(model_arg, &st_arg) == 0 && S_ISDIR(st_arg.st_mode);
  folder = is_folder ? realpath(model_arg, NULL) : NULL;
  const char *base = folder ? strrchr(folder, '/') : NULL;
  so.model_id = alias ? alias : !base || !base[1] ? model_arg : base + 1;
  so.host = host;
  so.port = (int)port;
  so.api_keys = api_key;
  so.max_body = (size_t)max_body << 20;
  so.threads = model_options.n_threads;
  so.cors = ci_args_get(flags, nf, "--cors");
  so.no_webui = ci_args_get(flags, nf, "--no-webui") != NULL;
  so.log_format = log_format && !strcmp(log_format, "json") ? CI_LOG_JSON : CI_LOG_TEXT;
  so.quiet = ci_args_get(flags, nf, "--quiet") != NULL;
  so.idle_timeout = (int)idle_timeout;
  so.max_connections = (int)max_connections;
  so.adapter_ids = adapter_ids;
  so.adapters = adapters;
  so.n_adapters = n_adapters;
  so.adapter_dir = ci_args_get(flags, nf, "--adapter-dir");
  server = ci_server_start(&so);
  if (!server) {
    fprintf(stderr, "cinfer serve: %s\n", ci_last_error());
    goto done;
  }
  port = ci_server_port(server); /* the one the system chose for --port 0 */
  /* an IPv6 address goes in brackets in a URL */
  const int bracket = strchr(host, ':') != NULL;
  char url_host[300];
  snprintf(url_host, sizeof url_host, "%s%s%s", bracket ? "[" : "", host, bracket ? "]" : "");
  host = url_host;
  cinfer_engine_stats engine_stats;
  cinfer_engine_get_stats(engine, &engine_stats); /* the KV budget the engine resolved */
  fprintf(stderr,
          "cinfer ready http://%s:%lld/v1 model=%s ctx=%d kv=%s batch=%lld kv-budget=%.2fGB "
          "prompt-cache=%.2fGB%s%s precision=%s\n",
          host, port, so.model_id, cinfer_engine_context_size(engine),
          kv_quantized ? kv_name : "bf16", batch, (double)engine_stats.kv_budget_bytes / 1e9,
          (double)engine_stats.prefix_cache_max_bytes / 1e9, eo.prompt_cache_dir ? " dir=" : "",
          eo.prompt_cache_dir ? eo.prompt_cache_dir : "",
          model_options.precision == CINFER_PRECISION_EXACT ? "exact" : "fast");
  fprintf(stderr,
          "try: curl http://%s:%lld/v1/chat/completions -H 'Content-Type: application/json'%s%s%s "
          "-d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":64}'\n",
          host, port, api_key ? " -H 'Authorization: Bearer " : "", api_key ? api_key : "",
          api_key ? "'" : "");
  if (!so.no_webui) fprintf(stderr, "chat page: http://%s:%lld/\n", host, port);
  int sig = 0;
  sigwait(&stop_signals, &sig);
  fprintf(stderr, "cinfer serve: signal %d, shutting down\n", sig);
  rc = 0;
done:
  cinfer_engine_stop(engine); /* ends every stream, so connections can close */
  ci_server_stop(server);
  cinfer_engine_free(engine);
  cinfer_chat_template_free(own_template);
  for (int i = 0; i < n_adapters; i++) cinfer_adapter_free(adapters[i]);
  cinfer_model_free(draft);
  cinfer_model_free(model);
  free(folder);
  return rc;
}
