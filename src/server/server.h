/* The HTTP server (docs/server.md): libmicrohttpd, thread per connection, OpenAI and
 * Anthropic routes over the public C API's engine (cinfer.h, used as any embedding program would).
 * HTTP threads own the text side of a request (chat template, tokenizer, and the chat output
 * parser: streaming detokenizer, stop strings, reasoning and tool-call parsing); the engine
 * thread owns the model. This header is the server's public face plus the pieces its files share
 * (server_internal section). */
#ifndef CI_SERVER_SERVER_H
#define CI_SERVER_SERVER_H

#include "cinfer.h"

#include <jansson.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ci_server ci_server;
typedef struct ci_response_store ci_response_store;
typedef struct ci_adapter_registry ci_adapter_registry;

/* Everything the server borrows (all must outlive it) and its settings. */
typedef struct {
  cinfer_engine *engine;
  const cinfer_model *model;                 /* NULL in tests that drive the text pipeline */
  const cinfer_tokenizer *tokenizer;         /* the model's */
  const cinfer_chat_template *chat_template; /* NULL: chat routes answer 400 */
  const cinfer_chat_format *chat_format;     /* the model's output conventions */
  int vocab;                                 /* token ids are below this */
  /* Request defaults: built-in < generation_config.json < the CLI flags (cinfer_params_init with
     the model, then the flags); their KV fields are the server's plan (kv_protect: the default,
     and the most a request may ask, the cache's layout). */
  const cinfer_params *defaults;
  int max_tokens_configured; /* the CLI or generation_config.json set max_tokens (else a route's
                                own default applies) */
  const char *model_id;
  const char *host;
  int port;
  const char *api_keys; /* comma-separated; NULL or "" = no auth */
  size_t max_body;      /* bytes */
  int threads;
  const char *cors;    /* --cors: "*" or comma-separated origins; NULL = no CORS headers */
  int no_webui;        /* --no-webui: no chat page at / (404 like any unknown route) */
  int log_format;      /* the access log: CI_LOG_TEXT or CI_LOG_JSON (--log-format) */
  int quiet;           /* --quiet: no access log, no libmicrohttpd warnings */
  int idle_timeout;    /* seconds an idle connection is kept (0: 30) */
  int max_connections; /* open connections at most (0: 4096) */
  /* LoRA adapters: mounted at start (ids and handles, borrowed: the server shares them), and the
   * folder run-time mounts (POST /v1/adapters) resolve names under (NULL: no run-time mounts). */
  const char *const *adapter_ids;
  cinfer_adapter *const *adapters;
  int n_adapters;
  const char *adapter_dir;
} ci_server_options;

enum { CI_LOG_TEXT = 0, CI_LOG_JSON = 1 };

/* Binds and starts serving. NULL with ci_last_error (port taken, ...). */
ci_server *ci_server_start(const ci_server_options *options);

/* The port the server listens on (the one the system chose for --port 0). */
int ci_server_port(const ci_server *server);

/* Stops accepting, ends open connections (the engine must have been stopped first so streams
 * finish) and frees the server. */
void ci_server_stop(ci_server *server);

/* ==== server_internal: shared by the server's files ==== */

typedef struct {
  char *data;
  size_t len, cap;
  int oom; /* an append could not grow the buffer (the text is incomplete) */
} ci_strbuf;

void ci_strbuf_append(ci_strbuf *b, const char *s, size_t n);
void ci_strbuf_appendf(ci_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ci_strbuf_free(ci_strbuf *b);

/* Sets *err to a new string (free it) formatted from fmt; returns -1, for `return
 * ci_srv_fail(...)`. */
int ci_srv_fail(char **err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

enum { CI_HIST_BUCKETS = 12 };
typedef struct {
  int64_t counts[CI_HIST_BUCKETS + 1]; /* last = +Inf */
  double sum;
  int64_t n;
} ci_histogram;

void ci_histogram_observe(ci_histogram *h, double seconds);

/* Per-route request counters by status class. */
enum { CI_ROUTE_SLOTS = 16 };
typedef struct {
  char route[48];
  int status;
  int64_t count;
} ci_route_count;

struct ci_server {
  ci_server_options o;
  struct MHD_Daemon *daemon;
  int port;                 /* bound */
  int32_t chat_stop_ids[8]; /* tokens that end a chat answer besides EOS (the chat format's) */
  int n_chat_stop_ids;
  int64_t weights_bytes;
  double started_at;
  char **keys;
  int n_keys;
  int loopback; /* it listens on a loopback address only (admin routes need no key there) */
  pthread_mutex_t metrics_mu;
  ci_route_count routes[64];
  int n_routes;
  ci_histogram ttft, itl, queue, duration;
  ci_response_store *responses;  /* /v1/responses conversations for previous_response_id */
  ci_adapter_registry *adapters; /* mounted LoRA adapters (adapters.c) */
  char *adapter_root;            /* realpath of --adapter-dir; NULL: no run-time mounts */
};

/* adapters.c: the registry of mounted adapters (thread-safe), the admin routes and a request's
 * adapter. */
ci_adapter_registry *ci_adapter_registry_create(void);
void ci_adapter_registry_free(ci_adapter_registry *registry);
/* Mounts `adapter` (the registry takes the handle) as id. 0, or 409 (id taken) / 507 (full): the
 * caller keeps the handle. */
int ci_adapter_registry_add(ci_adapter_registry *registry, const char *id, cinfer_adapter *adapter,
                            int runtime);
/* A new handle to adapter id (free it), NULL when none (*found 0) or out of memory (*found 1). */
cinfer_adapter *ci_adapter_registry_get(ci_adapter_registry *registry, const char *id, int *found);
/* Whether name is a valid adapter id / folder name: 1 to 64 of [A-Za-z0-9._-], no leading '.'. */
int ci_adapter_name_ok(const char *name);
/* Resolves folder name under root (a realpath) into out: 0, or an HTTP status (400 bad name, 403
 * outside root or run-time mounts off, 404 missing) with err set. */
int ci_adapter_resolve(const char *root, const char *name, char *out, size_t out_size, char *err,
                       size_t err_size);
/* GET/POST /v1/adapters, DELETE /v1/adapters/{id}: returns the status with *out the JSON body. */
int ci_server_adapters(ci_server *s, const char *method, const char *url, const char *body,
                       size_t len, json_t **out);

/* responses.c: the bounded store of Responses conversations (thread-safe). */
ci_response_store *ci_response_store_create(void);
void ci_response_store_free(ci_response_store *store);

void ci_server_count_request(ci_server *s, const char *route, int status);

/* Error body in an API's shape. anthropic: {"type":"error","error":{type,message}}; else
 * {"error":{message,type,param,code}}. */
json_t *ci_server_error_body(int anthropic, int status, const char *code, const char *message);

/* ---- one generation seen from an HTTP thread ---- */

typedef struct {
  ci_server *srv;
  cinfer_request *req;
  cinfer_chat_output *text; /* owned: the answer's parser */
  int reasoning_tokens;
  int want_logprobs, top_logprobs;
  /* deltas since the last ci_srv_gen_take */
  ci_strbuf d_content, d_reasoning;
  json_t *d_calls, *d_logprobs;
  /* totals */
  ci_strbuf content, reasoning;
  json_t *calls, *logprobs;
  int done, failed;
  const char *finish; /* "stop" | "length" | "tool_calls" */
  int stopped_by_string, eos_stop;
  char *stop_sequence; /* the stop string that fired */
  int prompt_tokens, cached_tokens, completion_tokens;
  int draft_tokens, accepted_tokens; /* speculative decoding: drafted, accepted (DONE event) */
  /* timings: the engine's (DONE event), else measured here (a stop string ends the stream
     before the engine reports) */
  int engine_timings;
  double queue_s, prefill_s, decode_s;
  char error[256];
  double t_start, t_first, t_prev;
  int client_fd;         /* watched while waiting for the engine (<= 0: not watched) */
  double client_checked; /* when its socket was last looked at */
} ci_srv_gen;

/* The text side of a prepared request, ready to submit. */
enum { CI_SRV_MAX_STOP_IDS = 64 };

typedef struct {
  int32_t *prompt; /* malloc'd */
  int n_prompt;
  char *rendered; /* the chat template's rendering (malloc'd; NULL: a raw prompt) */
  size_t rendered_len;
  cinfer_params params;    /* the request's parameters (sampling, limits, KV plan) */
  cinfer_logit_bias *bias; /* params.logit_bias; owned */
  char **stop;
  int n_stop;
  int logprobs, top_logprobs;
  json_t *tools; /* owned; NULL = no tool parsing */
  int tools_off; /* tool_choice "none": nothing is parsed */
  int raw_text;  /* /v1/completions: no reasoning or tool-call parsing at all */
  /* extensions (docs/server.md "Extensions") */
  int32_t stop_ids[CI_SRV_MAX_STOP_IDS]; /* stop_token_ids, then the chat format's stop tokens */
  int n_stop_ids;
  int continue_final;       /* continue_final_message */
  char *grammar;            /* owned GBNF: response_format / grammar / json_schema / a forced
                               tool call; NULL = free text */
  const char *grammar_root; /* its start rule (static; NULL = "root") */
  int forced_tool_call;     /* the grammar is a tool call (tool_choice required or named) */
  const char *err_code;     /* set with a parse error that is not "invalid_value" */
  int client_fd;            /* the client's socket, watched for a disconnect (<= 0: none) */
  char *echo;    /* /v1/completions echo: the prompt's text, put before the answer (owned) */
  int n_choices; /* OpenAI `n`: choices sharing the prompt's prefill (0 or 1: one) */
  cinfer_adapter *adapter; /* the request's LoRA adapter (a handle of its own); NULL = none */
} ci_srv_job;

void ci_srv_job_free(ci_srv_job *j);

/* Submits the job. Returns 0 with g ready, or an HTTP status (400/429/503) with *body set. */
int ci_srv_gen_start(ci_server *s, ci_srv_job *job, ci_srv_gen *g, int anthropic, json_t **body);

/* Submits the job as n (1..CI_SRV_MAX_CHOICES, at most the engine's batch) choices sharing one
 * prefill (cinfer_engine_submit_n): gens[i] is choice i, each with its own text pipeline. Returns
 * 0 with every gens[i] ready, or an HTTP status with *body set (then none is). */
enum { CI_SRV_MAX_CHOICES = 128 };
int ci_srv_gen_start_n(ci_server *s, ci_srv_job *job, ci_srv_gen *gens, int n, int anthropic,
                       json_t **body);

/* Sets up g's text pipeline for job (a cinfer_chat_output: detokenizer, stop strings, reasoning
 * split, tool parsing, Gemma routing) without submitting anything; ci_srv_gen_start calls it.
 * Exposed so tests can drive the pipeline with ci_srv_gen_apply. */
void ci_srv_gen_init_text(ci_server *s, ci_srv_job *job, ci_srv_gen *g);

/* Processes the next engine event (waits up to timeout_s). Returns 1 when something happened,
 * 0 on timeout. */
int ci_srv_gen_pump(ci_srv_gen *g, double timeout_s);

/* Runs a non-streaming generation to its end: 200, or 500 with *out the error body (Anthropic's
 * shape when anthropic). */
int ci_srv_gen_run_to_end(ci_srv_gen *g, int anthropic, json_t **out);

/* Applies one engine event, received at time `now`, to the text pipeline. */
void ci_srv_gen_apply(ci_srv_gen *g, const cinfer_event *ev, double now);

/* The `timings` extension object of a finished generation (docs/generation.md §10). */
json_t *ci_srv_gen_timings(const ci_srv_gen *g);

/* Reads what the chat format adds to every request (its stop tokens, e.g. Gemma 4's
 * <|tool_response>). ci_server_start calls it; tests that build a ci_server by hand call it too. */
void ci_server_detect_formats(ci_server *s);

/* Clears the deltas after the caller has formatted them. */
void ci_srv_gen_clear_deltas(ci_srv_gen *g);

void ci_srv_gen_free(ci_srv_gen *g);

/* Random id "prefix" + 24 hex digits into buf (size >= 40). */
void ci_server_new_id(const char *prefix, char *buf, size_t size);

/* Request parsing helpers shared by the API files. Each returns 0 or fills *err (malloc'd). */
int ci_srv_parse_sampling(ci_server *s, const json_t *body, int anthropic, ci_srv_job *job,
                          int default_max_tokens, char **err);
int ci_srv_tokenize_chat(ci_server *s, json_t *messages, json_t *tools, const json_t *kwargs,
                         ci_srv_job *job, char **err);

/* The cinfer request extensions (docs/server.md "Extensions"): kv, ignore_eos, stop_token_ids,
 * continue_final_message. ci_srv_parse_sampling calls it. Returns 0 or fills *err (and
 * job->err_code for unsupported values). */
int ci_srv_parse_extensions(ci_server *s, const json_t *body, ci_srv_job *job, char **err);

/* The request's LoRA adapter: "adapter": ID, or "model": "BASE:ID" (adapters.c). An adapter that
 * is not mounted fills *err (a 400); ci_srv_parse_extensions calls it. */
int ci_srv_parse_adapter(ci_server *s, const json_t *body, ci_srv_job *job, char **err);

/* Structured output (response_format, grammar, json_schema) into job->grammar (GBNF, checked
 * through the public API); an unsupported
 * schema feature or a bad grammar fills *err naming it (a 400). ci_srv_parse_extensions calls
 * it. Returns 0 or -1. */
int ci_srv_parse_structured(ci_server *s, const json_t *body, ci_srv_job *job, char **err);

/* tool_choice (OpenAI chat): none and auto change nothing here; "required" or {"type":
 * "function", "function": {"name": N}} set job->grammar to one tool call of the tools (or of N)
 * in the model's format: Qwen XML (ci_srv_xml_tool_grammar) when its chat template asks for it
 * (cinfer_chat_format_xml_tool_calls), else hermes (<tool_call>\n{"name": ..., "arguments":
 * {...}}\n</tool_call>), the arguments constrained to the tool's parameters schema. An unknown
 * string, an unknown name, "required" without tools or a request that already has a grammar fills
 * *err (a 400). */
int ci_srv_parse_tool_choice(ci_server *s, const json_t *tools, const json_t *choice,
                             ci_srv_job *job, char **err);

/* xml_tool_grammar.c: GBNF (start rule "tool-call") of one Qwen XML tool call
 * (<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...</function>\n</tool_call>)
 * of the OpenAI-shaped tools, or of `named` alone (an element of tools), each value written as
 * the tool's parameters schema types it. NULL with *err (a 400: a schema it cannot write). */
char *ci_srv_xml_tool_grammar(const json_t *tools, const json_t *named, char **err);

/* After ci_srv_tokenize_chat: a forced tool call (ci_srv_parse_tool_choice) whose prompt ends
 * inside an open <think> (Qwen3.5 with thinking on) lets the answer reason first — text without
 * '<', then </think> — before the call. Returns 0, or -1 with *err. */
int ci_srv_forced_call_after_thinking(ci_server *s, ci_srv_job *job, char **err);

/* messages for a chat template that does not render `tools`: a generic tool-use system prompt
 * (the tools as JSON and the hermes call format) merged into the first system message or put
 * before the messages, and assistant tool calls written out as hermes text (a template without
 * tool support would render a null content as "None"). NULL on out of memory. */
json_t *ci_srv_inject_tool_prompt(const json_t *messages, const json_t *tools);

/* fim.c: fill-in-the-middle. ci_srv_fim_markers fills ids with the tokenizer's prefix, suffix
 * and middle FIM tokens and returns 1, or 0 when it has none. ci_srv_fim_prompt replaces
 * job->prompt with [lead] PREFIX-MARK prefix SUFFIX-MARK suffix MIDDLE-MARK (prefix: the text
 * given, tokenized without special tokens, or NULL to keep job->prompt's ids as the prefix; lead:
 * what the tokenizer puts before any text, a BOS) and adds the tokens that end a middle to
 * job->stop_ids. Returns 0, or -1 with *err (no FIM tokens: a 400 naming the problem). */
int ci_srv_fim_markers(const cinfer_tokenizer *tokenizer, int32_t ids[3]);
int ci_srv_fim_prompt(ci_server *s, const char *prefix, size_t prefix_len, const char *suffix,
                      size_t suffix_len, ci_srv_job *job, char **err);

/* Route handlers: return the HTTP status and either *body (JSON) or *stream (SSE, owned by
 * the response afterwards). */
typedef struct ci_srv_stream ci_srv_stream;
/* client_fd: the connection's socket, watched while generating: a client that goes away cancels
 * its request at the engine's next step (-1: not watched). */
int ci_openai_chat(ci_server *s, json_t *body, json_t **out, ci_srv_stream **stream, int client_fd);
int ci_openai_completions(ci_server *s, json_t *body, json_t **out, ci_srv_stream **stream,
                          int client_fd);
int ci_openai_models(ci_server *s, json_t **out);
/* utility.c and anthropic.c: GET /v1/models/{id} (404 for another id), POST /tokenize, POST
 * /detokenize, POST /v1/messages/count_tokens; each returns the status with *out set. */
int ci_openai_model(ci_server *s, const char *id, json_t **out);
int ci_server_tokenize(ci_server *s, const json_t *body, json_t **out);
int ci_server_detokenize(ci_server *s, const json_t *body, json_t **out);
int ci_anthropic_count_tokens(ci_server *s, json_t *body, json_t **out);
/* prompt_cache.c: POST /v1/cache/save and POST /v1/cache/load (admin routes). */
int ci_server_cache_save(ci_server *s, const json_t *body, json_t **out);
int ci_server_cache_load(ci_server *s, json_t *body, json_t **out);
/* embeddings.c: POST /v1/embeddings. */
int ci_openai_embeddings(ci_server *s, json_t *body, json_t **out);
/* responses.c: POST /v1/responses. */
int ci_openai_responses(ci_server *s, json_t *body, json_t **out, ci_srv_stream **stream,
                        int client_fd);
int ci_anthropic_messages(ci_server *s, json_t *body, json_t **out, ci_srv_stream **stream,
                          int client_fd);
char *ci_server_metrics_text(ci_server *s);
json_t *ci_server_stats_json(ci_server *s);

/* SSE streams: `produce` appends the next frames to out (blocking on the engine), setting
 * *finished when the stream is complete. */
struct ci_srv_stream {
  ci_srv_gen gen;
  int kind; /* 0 chat, 1 completion, 2 anthropic, 3 responses */
  int phase;
  int include_usage;
  int block_open; /* anthropic: 0 none, 1 thinking, 2 text */
  int block_index;
  long text_offset; /* completions logprobs: characters streamed so far (choice 0) */
  /* OpenAI n > 1: choices 1..n_more beside gen (choice 0); owned */
  ci_srv_gen *more;
  int n_more;
  long *more_offsets;    /* [n_more] text_offset of each later choice */
  unsigned char *closed; /* [1 + n_more] the choice's finish chunk was sent */
  char id[48];
  long long created;
  ci_strbuf out;
  size_t out_pos;
  int finished;
  void (*produce)(ci_srv_stream *st);
  void *ext; /* a route's own stream state (owned), freed with ext_free */
  void (*ext_free)(void *ext);
};

void ci_srv_stream_free(ci_srv_stream *st);

#endif
