/* cinfer.h: the public C API of cinfer, the one header an embedding program includes.
 *
 * Objects (all opaque; every one is created by a function here and freed by its _free):
 *   cinfer_model    a model folder loaded on a device (the CPU or a GPU: weights, config,
 *                   tokenizer and chat template when the folder has them,
 *                   generation_config.json defaults).
 *                   Immutable once loaded: any number of sessions and engines may share it, from
 *                   any threads. It must outlive them.
 *   cinfer_session  one sequence run synchronously on the caller's thread: feed ids or text,
 *                   then step (sample one token) or generate until done. One thread at a time;
 *                   cinfer_session_cancel may be called from any thread.
 *   cinfer_engine   a continuous-batching engine thread serving many requests at once: submit a
 *                   prompt, read its events (tokens, then done or error), cancel.
 *   cinfer_request  one submitted request of an engine.
 *   cinfer_tokenizer, cinfer_chat_template
 *                   text handles usable without weights (a model's own are views it owns).
 *   cinfer_detokenizer
 *                   generated ids to text pieces, UTF-8 safe, with stop strings.
 *   cinfer_chat_format, cinfer_chat_output
 *                   a model family's output conventions, and the parser of one answer into
 *                   content, reasoning and tool calls.
 *
 * Errors: functions that can fail return a cinfer_status; negative values are failures, and
 * cinfer_last_error() then holds a one-line message (per thread). Memory the library hands out
 * (token arrays, strings) is freed with cinfer_free.
 *
 * Build: `make install` puts this header, libcinfer.a and cinfer.pc under PREFIX; link with
 *   cc app.c $(pkg-config --cflags --libs --static cinfer)
 */
#ifndef CINFER_H
#define CINFER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ==== Version and errors ==== */

#define CINFER_VERSION_MAJOR 0
#define CINFER_VERSION_MINOR 1
#define CINFER_VERSION_PATCH 0

/* The library's version as "MAJOR.MINOR.PATCH" (a static string). */
const char *cinfer_version(void);

typedef enum {
  CINFER_OK = 0,
  CINFER_DONE = 1,    /* generation finished (EOS, max_tokens, context full); not an error */
  CINFER_TIMEOUT = 2, /* no engine event within the timeout; not an error */
  CINFER_ERROR = -1,  /* a runtime failure (unreadable model, KV memory exhausted, ...) */
  CINFER_INVALID_ARGUMENT = -2, /* a NULL handle, an id out of range, a bad parameter */
  CINFER_UNSUPPORTED = -3,      /* the model lacks what was asked (no tokenizer, no template) */
  CINFER_CANCELLED = -4,        /* cinfer_session_cancel stopped the session */
  CINFER_QUEUE_FULL = -5,       /* engine: too many waiting requests; try again later */
  CINFER_REJECTED = -6,         /* engine: this request can never run (too big, bad params) */
  CINFER_STOPPED = -7,          /* engine: it is shutting down */
  CINFER_CONTEXT_EXCEEDED = -8, /* the prompt plus max_tokens does not fit the context */
  CINFER_OVER_BUDGET = -9       /* engine: the request needs more KV than its budget ever allows */
} cinfer_status;

/* A short name of a status ("ok", "invalid argument", ...). */
const char *cinfer_status_name(cinfer_status status);

/* The calling thread's message about its last failure ("" when none). Valid until the thread's
 * next call into the library. */
const char *cinfer_last_error(void);

/* Frees memory the library returned (token arrays, strings). NULL is a no-op. */
void cinfer_free(void *memory);

/* ==== Models ==== */

typedef struct cinfer_model cinfer_model;

/* The numerics of a model's matrix products. FAST (the default) runs activations in the precision
 * of the weights' own arithmetic: bf16 weights and prompt processing multiply x rounded to bf16
 * (bf16 products, f32 sums; AVX512-BF16 where the CPU has it), q8/q4 decoding multiplies x as one
 * int8 value per element and group scale (VNNI). EXACT keeps f32 activations (three int8 planes
 * for q8/q4): logits within ~1e-3 of transformers in f32, at up to twice the time. Either way a
 * sequence's logits do not depend on the other sequences of a batch. On a GPU, FAST rounds matmul
 * inputs to bf16 and EXACT splits them into two bf16 planes. */
typedef enum { CINFER_PRECISION_FAST = 0, CINFER_PRECISION_EXACT = 1 } cinfer_precision;

typedef struct {
  int n_threads;      /* CPU threads for the forward pass; 0 = every online CPU */
  const char *device; /* "cpu", "cuda", or NULL/"auto" = cuda when a GPU is visible, else cpu */
  int gpu;            /* GPU ordinal when the device is cuda (0) */
  int mmap;           /* 1: run from the mapped weight files; 0 (default): on the CPU, read the
                         weights into memory advised for 2 MiB huge pages (faster decode: fewer
                         TLB misses); a GPU copies the weights to its memory either way */
  cinfer_precision precision; /* matmul numerics (CINFER_PRECISION_FAST) */
  int tensor_parallel; /* ranks the model is split over (heads, MLP units and vocabulary), one
                          backend and host thread each; 0 or 1: whole. CPU ranks share out
                          n_threads; CUDA ranks take GPUs gpu, gpu + 1, ... */
} cinfer_model_options;

/* Fills the defaults (n_threads 0, device NULL = auto, gpu 0, mmap 0, precision fast,
 * tensor_parallel 0). */
void cinfer_model_options_init(cinfer_model_options *options);

/* Loads a model folder (config.json + safetensors; a Hugging Face cache id such as
 * "org/name" is resolved in the local cache too). options may be NULL (defaults). The folder's
 * tokenizer.json, chat template and generation_config.json are loaded when present. On success
 * *out is the model; on failure *out is NULL and the status says why. */
cinfer_status cinfer_model_load(const char *path, const cinfer_model_options *options,
                                cinfer_model **out);

/* Frees the model and its backend. Every session and engine over it must be freed first. NULL is
 * a no-op. */
void cinfer_model_free(cinfer_model *model);

/* Number of token ids the model knows: ids are in [0, vocab), logit rows are vocab wide. */
int cinfer_model_vocab_size(const cinfer_model *model);

/* The model's context length (config.json max_position_embeddings). */
int cinfer_model_context_length(const cinfer_model *model);

/* The architecture as config.json names it ("llama", "qwen3", "gemma3_text", ...); owned by the
 * library. */
const char *cinfer_model_architecture(const cinfer_model *model);

/* 1 when `token` ends generation for this model (config.json and generation_config.json EOS ids
 * and the tokenizer's eos_token), else 0. */
int cinfer_model_is_eos(const cinfer_model *model, int32_t token);

/* ==== Text ==== */

/* Encodes len bytes of UTF-8 text with the model's tokenizer; add_special adds the tokenizer's
 * special tokens (BOS), as Hugging Face's add_special_tokens=True. *ids (free with cinfer_free)
 * receives *n_ids ids. CINFER_UNSUPPORTED when the model folder has no tokenizer.json. */
cinfer_status cinfer_tokenize(const cinfer_model *model, const char *text, size_t len,
                              int add_special, int32_t **ids, size_t *n_ids);

/* Decodes ids to NUL-terminated UTF-8 text (free with cinfer_free); skip_special drops special
 * tokens. *len (may be NULL) receives the length without the NUL. */
cinfer_status cinfer_detokenize(const cinfer_model *model, const int32_t *ids, size_t n_ids,
                                int skip_special, char **text, size_t *len);

/* Renders a chat with the model's chat template: messages_json is a JSON array of
 * {"role": ..., "content": ...} objects; add_generation_prompt appends the assistant turn's
 * opening. *text (free with cinfer_free) is the prompt to feed without special tokens.
 * CINFER_UNSUPPORTED when the model has no chat template. */
cinfer_status cinfer_chat_render(const cinfer_model *model, const char *messages_json,
                                 int add_generation_prompt, char **text);

/* ==== Generation parameters (sessions and engine requests) ==== */

/* One logit bias: the token's logit gets bias added before sampling (-INFINITY bans it). */
typedef struct {
  int32_t token;
  float bias; /* [-100, 100] or -INFINITY */
} cinfer_logit_bias;

typedef struct {
  /* Sampling. temperature 0 is greedy (argmax). */
  float temperature;        /* [0, 5] */
  float top_p;              /* (0, 1) filters; 0 or 1 = off */
  int top_k;                /* 0 = off */
  float min_p;              /* [0, 1]; 0 = off */
  float repetition_penalty; /* > 0; 1 = off */
  float presence_penalty;   /* [-2, 2]; 0 = off */
  float frequency_penalty;  /* [-2, 2]; 0 = off */
  int repetition_context;   /* last tokens each penalty looks at (20, 20, 20) */
  int presence_context;
  int frequency_context;
  float xtc_probability;               /* XTC: [0, 1]; 0 = off */
  float xtc_threshold;                 /* XTC: [0, 0.5] (0.1) */
  const cinfer_logit_bias *logit_bias; /* borrowed: copied by the function that takes params */
  size_t n_logit_bias;
  uint64_t seed; /* used when has_seed; otherwise a seed is drawn from the OS */
  int has_seed;
  /* Limits. */
  int max_tokens;          /* tokens one generation samples at most, EOS included (>= 1) */
  int max_tokens_explicit; /* 0 (cinfer_params_init): max_tokens is a default and is cut to the
                              room the context leaves; 1: the caller asked for it, so a prompt
                              plus max_tokens past the context is an error (a session's first
                              step, an engine submit) */
  int ignore_eos;          /* 1: EOS ids do not end generation */
  const int32_t *stop_token_ids; /* more ids that end generation as EOS does (finish stop), also
                                    with ignore_eos; borrowed (copied) */
  size_t n_stop_token_ids;
  int top_logprobs; /* engine requests: 0..CINFER_MAX_TOP_LOGPROBS most likely tokens reported
                       with each token event */
  int num_draft;    /* engine requests, when the engine speculates (lookup_ngram > 0): drafts per
                       round at most (capped at the engine's draft_max); 0 = the engine's
                       draft_max, < 0 = this request does not speculate */
  /* KV cache codec plan (docs/kv-cache.md). kv_codec NULL follows the model folder's
   * kv_config.json (bf16 without one); "bf16" or "f32" store every layer in that format;
   * "affine", "turbo" or "turbo-v" store bf16 until the sequence holds kv_start tokens, then
   * convert to that codec with kv_bits (K) / kv_value_bits (V, 0 = kv_bits) and kv_group_size
   * (affine, 0 = 64), keeping the first and last kv_protect cache layers in bf16. */
  const char *kv_codec; /* borrowed: copied by the function that takes the params */
  int kv_bits;          /* 2..8 (4) */
  int kv_value_bits;    /* 0 or 2..8 */
  int kv_group_size;    /* 0 or 32..128 */
  int64_t kv_start;     /* >= 0 */
  int kv_protect;       /* >= 0 */
  /* Sessions only (an engine sets these for all its requests). */
  int context_size;  /* positions a session may hold; 0 = the model's context length */
  int prefill_chunk; /* prompt tokens per forward pass while feeding; 0 = 2048 */
  int lookup_ngram;  /* speculative decoding by prompt lookup (docs/generation.md "Speculative
                        decoding"): n-grams of lookup_ngram .. 1 tokens draft up to draft_max
                        tokens per step, verified in one forward; 0 = off */
  int draft_max;     /* 0 = 5; at most 32 */
  int draft_min;     /* 0 = 1; the adaptive draft length never drops below it */
  cinfer_model *draft_model; /* a draft model sharing the model's tokenizer (borrowed; it must
                                outlive the session): drafts instead of prompt lookup, from its
                                own KV cache and its own sampling distribution; NULL = none */
  /* Structured output (docs/generation.md §4.2): the generated text is constrained to a grammar;
   * every token it does not allow next is masked before sampling, EOS only once the text is
   * complete. At most one of: grammar, GBNF text (llama.cpp's format, start rule "root"); or
   * json_schema, a JSON Schema as JSON text (json_schema_strict: objects admit no property the
   * schema does not list, as OpenAI's strict mode; else additionalProperties decides, default
   * any). Borrowed: compiled by the function that takes the params. A bad grammar or an
   * unsupported schema keyword is CINFER_INVALID_ARGUMENT (sessions) or CINFER_REJECTED (engine
   * submit) with a message naming it. A session's grammar restarts with each feed. */
  const char *grammar;
  const char *grammar_root; /* the GBNF start rule; NULL = "root" */
  const char *json_schema;
  int json_schema_strict;
  /* A LoRA adapter (cinfer_adapter_load) loaded for this model, applied beside the base weights;
   * NULL = none. Borrowed: the session or request takes a reference of its own, so the caller
   * may free its handle at once. */
  const struct cinfer_adapter *adapter;
} cinfer_params;

/* Fills the defaults: the built-in sampling defaults (temperature 0.7, filters off, penalty
 * windows 20, xtc_threshold 0.1, max_tokens
 * 256) overridden by the model's generation_config.json when model is non-NULL; EOS honoured;
 * kv_codec NULL (the model's plan), kv_bits 4; context_size and prefill_chunk 0. */
void cinfer_params_init(cinfer_params *params, const cinfer_model *model);

/* ==== LoRA adapters ==== */

/* A LoRA adapter for one model (docs/models.md "LoRA adapters"): low-rank updates of the
 * attention and MLP projections, applied per session or request beside the shared base weights,
 * so requests with different adapters (or none) run in the same batch. */
typedef struct cinfer_adapter cinfer_adapter;

/* Loads the adapter folder path for model: a PEFT folder (adapter_config.json +
 * adapter_model.safetensors) or an mlx-lm folder (adapter_config.json + adapters.safetensors).
 * Every tensor is checked against the model; a malformed or mismatched adapter (unknown module,
 * shape, rank, missing file, truncated or oversized file, DoRA) is CINFER_INVALID_ARGUMENT with a
 * message naming the problem. The model must outlive the adapter. */
cinfer_status cinfer_adapter_load(const cinfer_model *model, const char *path,
                                  cinfer_adapter **out);

/* Another handle to the same adapter (freed with cinfer_adapter_free); NULL when out of memory. */
cinfer_adapter *cinfer_adapter_share(const cinfer_adapter *adapter);

/* Drops the caller's handle; sessions and requests that run with the adapter keep it alive until
 * they end. NULL is a no-op. */
void cinfer_adapter_free(cinfer_adapter *adapter);

typedef struct {
  const char *format; /* "peft" or "mlx-lm" */
  int max_rank;       /* the largest rank of its layers */
  int n_modules;      /* adapted linear layers */
  float scale;        /* alpha / r (alpha / sqrt(r) with rsLoRA), or mlx-lm's scale */
  int64_t n_params;   /* values of every A and B */
} cinfer_adapter_info;

/* Describes the adapter. */
cinfer_status cinfer_adapter_get_info(const cinfer_adapter *adapter, cinfer_adapter_info *info);

/* ==== Sessions ==== */

typedef struct cinfer_session cinfer_session;

/* Why generation ended. */
typedef enum {
  CINFER_FINISH_NONE = 0, /* still running, or nothing generated yet */
  CINFER_FINISH_STOP,     /* an EOS id was sampled, or the token callback asked to stop */
  CINFER_FINISH_LENGTH,   /* max_tokens sampled, or the context is full */
  CINFER_FINISH_CANCEL    /* cinfer_session_cancel or cinfer_request_cancel */
} cinfer_finish;

/* Creates a session over model with params (NULL = cinfer_params_init(params, model)): an empty
 * sequence with its own KV cache and sampler. On failure *out is NULL. */
cinfer_status cinfer_session_create(cinfer_model *model, const cinfer_params *params,
                                    cinfer_session **out);

/* Frees the session (its KV cache and sampler). NULL is a no-op. */
void cinfer_session_free(cinfer_session *session);

/* Appends n_ids token ids (each in [0, vocab)) to the sequence and runs them through the model
 * (prefill, in chunks of prefill_chunk). Starts a new turn: the previous generation's finish
 * state, token count and cancellation are cleared. When logits is non-NULL it receives
 * [n_logit_rows, vocab] floats: the raw logits after each of the last n_logit_rows ids
 * (1 <= n_logit_rows <= n_ids; n_ids rows give every position, for scoring). CINFER_ERROR when
 * the sequence would pass context_size. */
cinfer_status cinfer_session_feed(cinfer_session *session, const int32_t *ids, size_t n_ids,
                                  float *logits, size_t n_logit_rows);

/* Tokenizes text (add_special as in cinfer_tokenize) and feeds it (cinfer_session_feed without
 * logits). */
cinfer_status cinfer_session_feed_text(cinfer_session *session, const char *text, int add_special);

/* Samples the next token from the logits of the last position and appends it to the sequence
 * (it is run through the model when the next token is asked for, so the last one costs no
 * forward pass). Returns CINFER_OK with *token set; CINFER_DONE when generation has finished:
 * *token is the EOS id if one was just sampled (it stays in the sequence), else -1 (max_tokens
 * already sampled, context full, or finished before); CINFER_CANCELLED after
 * cinfer_session_cancel; CINFER_INVALID_ARGUMENT when nothing was fed yet. */
cinfer_status cinfer_session_step(cinfer_session *session, int32_t *token);

/* Called by cinfer_session_generate with each token sampled (EOS excluded); return 0 to go on,
 * non-zero to stop (finish CINFER_FINISH_STOP). */
typedef int (*cinfer_token_callback)(void *user, int32_t token);

/* Steps until generation finishes, calling on_token (may be NULL) with each token. Returns
 * CINFER_OK when it finished (see cinfer_session_finish_reason), CINFER_CANCELLED, or an error. */
cinfer_status cinfer_session_generate(cinfer_session *session, cinfer_token_callback on_token,
                                      void *user);

/* Asks the session to stop: its current or next step returns CINFER_CANCELLED. Safe from any
 * thread while another runs the session; the next feed clears it. */
void cinfer_session_cancel(cinfer_session *session);

/* Why the current turn's generation ended (CINFER_FINISH_NONE while it runs). */
cinfer_finish cinfer_session_finish_reason(const cinfer_session *session);

/* Every token of the sequence in order: fed ids and sampled ones (an EOS included). *n_tokens
 * receives the count. The array belongs to the session and is valid until its next call. */
const int32_t *cinfer_session_tokens(const cinfer_session *session, size_t *n_tokens);

/* Tokens sampled in the current turn (since the last feed). */
size_t cinfer_session_n_generated(const cinfer_session *session);

/* The raw logits (vocab floats) after the last token run through the model — the distribution
 * the next step samples from; NULL before any feed. Owned by the session, valid until its next
 * call. */
const float *cinfer_session_logits(const cinfer_session *session);

/* Empties the sequence (KV freed, tokens forgotten) and restarts the sampler's output count;
 * the parameters stay. */
cinfer_status cinfer_session_reset(cinfer_session *session);

/* ==== Engine: many concurrent requests ==== */

typedef struct cinfer_engine cinfer_engine;
typedef struct cinfer_request cinfer_request;

/* Whether the engine's steps speculate (cinfer_engine_options.spec_policy). */
typedef enum {
  CINFER_SPEC_AUTO = 0,
  CINFER_SPEC_ALWAYS = 1,
  CINFER_SPEC_NEVER = 2
} cinfer_spec_policy;

typedef struct {
  int max_batch;              /* sequences decoded together (8) */
  int context_size;           /* per-request context limit; 0 = the model's context length */
  const char *kv_codec;       /* what every sequence starts in: "bf16" (NULL) or "f32" */
  int kv_protect;             /* requests may keep up to this many first/last layers in bf16 (0) */
  int64_t kv_budget_bytes;    /* KV memory all running requests share, reserved when the engine
                                 is created; 0 = max_batch requests of context_size tokens, at
                                 most half of the machine's memory */
  int64_t prefix_cache_bytes; /* KV kept for reuse by later prompts with the same prefix (2 GiB);
                                 0 = off */
  int batch_tokens;  /* rows one step runs at most, prompt chunks and decodes together (2048) */
  int prefill_chunk; /* prompt tokens per chunk (2048) */
  int max_queue;     /* waiting requests beyond which submit answers CINFER_QUEUE_FULL (256) */
  /* Speculative decoding (docs/generation.md "Speculative decoding"): each round drafts tokens
   * (by prompt lookup: those that followed the latest earlier occurrence of the last
   * lookup_ngram .. 1 tokens; or by a draft model) and verifies them in one step; output is the
   * same as without it (greedy: token for token; sampling: in distribution). */
  int lookup_ngram;          /* 0 = off (0) */
  cinfer_model *draft_model; /* a draft model sharing the model's tokenizer (borrowed; it must
                                outlive the engine): drafts instead of prompt lookup (NULL) */
  int draft_max;             /* drafts per round at most, 1..32 (5) */
  int draft_min;      /* the adaptive draft length never drops below this, 1..draft_max (1) */
  int spec_max_batch; /* a step with more decoding sequences than this never speculates; 0 = no
                         cap: each step speculates only when the engine's measured step times and
                         acceptance say it pays (0) */
  int spec_policy;    /* CINFER_SPEC_AUTO: a step speculates when it pays (above); ALWAYS: every
                         step that has drafts does (as llama.cpp does); NEVER: none (AUTO) */
  /* Prompt cache on disk (docs/kv-cache.md "Prompt cache on disk"): the prefix cache's KV
   * blocks are written to this directory (created if missing) as they fill, by a writer thread
   * that never holds up a step, and read back when a request's prompt starts with them, also
   * after a restart. Needs prefix_cache_bytes > 0. NULL = off. */
  const char *prompt_cache_dir;
  int64_t prompt_cache_queue_bytes; /* bytes waiting for the writer at most; beyond, new blocks
                                       are not written (0: 256 MiB) */
  /* Told about every file skipped (truncated, corrupt, foreign) and every failed write; called
   * on the engine's or the writer's thread. NULL: only counted in the stats. */
  void (*prompt_cache_warn)(void *user, const char *message);
  void *prompt_cache_warn_user;
} cinfer_engine_options;

/* Fills the defaults listed above. */
void cinfer_engine_options_init(cinfer_engine_options *options);

/* Creates an engine over model (options NULL = defaults) and starts its thread. */
cinfer_status cinfer_engine_create(cinfer_model *model, const cinfer_engine_options *options,
                                   cinfer_engine **out);

/* Stops the engine thread (running and queued requests end with an error event) and frees it.
 * Request handles still held must be freed too (before or after). NULL is a no-op. */
void cinfer_engine_free(cinfer_engine *engine);

/* Queues a request: prompt ids (copied) continued with params (NULL = cinfer_params_init with the
 * engine's model; context_size and prefill_chunk are the engine's). A max_tokens that is not
 * explicit is cut to the room the context leaves. When it was not queued: CINFER_QUEUE_FULL,
 * CINFER_STOPPED, CINFER_INVALID_ARGUMENT or CINFER_REJECTED (bad params or ids),
 * CINFER_CONTEXT_EXCEEDED or CINFER_OVER_BUDGET (too long), CINFER_ERROR (out of memory), each
 * with the reason as the last error. */
cinfer_status cinfer_engine_submit(cinfer_engine *engine, const int32_t *prompt, size_t n_prompt,
                                   const cinfer_params *params, cinfer_request **out);

/* Queues n (1..cinfer_engine_max_batch) choices of one prompt, as cinfer_engine_submit does one:
 * the prompt is prefilled once and the n sequences then share its KV blocks copy-on-write, each
 * sampling on its own (the OpenAI `n`). Choice 0 samples with params' seed, choice i > 0 with
 * cinfer_choice_seed(seed, i) (without a seed each choice draws its own). The choices are admitted
 * together; a choice whose first one is cancelled or fails before the prompt is prefilled ends
 * the same way. On CINFER_OK out[0..n) are the handles (free each); otherwise none was queued. */
cinfer_status cinfer_engine_submit_n(cinfer_engine *engine, const int32_t *prompt, size_t n_prompt,
                                     const cinfer_params *params, int n, cinfer_request **out);

/* The seed choice `index` of an n > 1 submission seeded `seed` samples with (seed itself for
 * choice 0). */
uint64_t cinfer_choice_seed(uint64_t seed, int index);

enum { CINFER_MAX_TOP_LOGPROBS = 20 };

typedef enum {
  CINFER_EVENT_TOKEN = 0, /* one sampled token (never an EOS) */
  CINFER_EVENT_DONE = 1,  /* the request finished; its last event */
  CINFER_EVENT_ERROR = 2  /* the request failed (message); its last event */
} cinfer_event_kind;

typedef struct {
  cinfer_event_kind kind;
  int32_t token;          /* TOKEN */
  float logprob;          /* TOKEN: log-probability of token under the sampling distribution */
  cinfer_finish finish;   /* DONE */
  int prompt_tokens;      /* DONE */
  int cached_tokens;      /* DONE: prompt tokens reused from the prefix cache */
  int generated_tokens;   /* DONE: sampled tokens, EOS included */
  double queue_seconds;   /* DONE: submit -> admission */
  double prefill_seconds; /* DONE: admission -> first token */
  double decode_seconds;  /* DONE: first token -> last token */
  int draft_tokens;       /* DONE: tokens drafted by speculative decoding */
  int accepted_tokens;    /* DONE: of which verification accepted */
  int n_top;              /* TOKEN: entries in top_ids/top_logprobs */
  int32_t top_ids[CINFER_MAX_TOP_LOGPROBS];    /* TOKEN: the most likely tokens, best first */
  float top_logprobs[CINFER_MAX_TOP_LOGPROBS]; /* TOKEN: their log-probabilities */
  char message[256];                           /* ERROR */
} cinfer_event;

/* Waits up to timeout_seconds (< 0: forever) for the request's next event. CINFER_OK with *event
 * filled, CINFER_TIMEOUT, or CINFER_DONE when the last event was already read. */
cinfer_status cinfer_request_next(cinfer_request *request, cinfer_event *event,
                                  double timeout_seconds);

/* Asks the engine to stop the request at its next step; it then ends with a DONE event whose
 * finish is CINFER_FINISH_CANCEL. Safe from any thread. */
void cinfer_request_cancel(cinfer_request *request);

/* Releases the caller's handle (cancelling the request if it still runs). NULL is a no-op. */
void cinfer_request_free(cinfer_request *request);

/* Stops the engine thread without freeing it: running and queued requests end with an error
 * event (so readers of their events finish), later submits answer CINFER_STOPPED. Idempotent. */
void cinfer_engine_stop(cinfer_engine *engine);

/* The per-request context limit in use. */
int cinfer_engine_context_size(const cinfer_engine *engine);

/* The most sequences one step runs. */
int cinfer_engine_max_batch(const cinfer_engine *engine);

enum { CINFER_MAX_KV_FORMATS = 8 };

/* KV storage of one format ("bf16", "affine:4:64", ...). */
typedef struct {
  char codec[32];
  int64_t blocks_used, blocks_free, bytes_used;
} cinfer_kv_usage;

/* A snapshot of the engine's counters and gauges. */
typedef struct {
  int n_kv_formats;
  cinfer_kv_usage kv_formats[CINFER_MAX_KV_FORMATS];
  int n_kv_conversions; /* sequences converted so far, per target codec */
  char kv_conversion_codecs[CINFER_MAX_KV_FORMATS][32];
  int64_t kv_conversions[CINFER_MAX_KV_FORMATS];
  int running, waiting;
  int64_t blocks_used, bytes_used, kv_budget_bytes, reserved_bytes;
  int64_t requests_finished, requests_cancelled, requests_failed;
  int64_t prompt_tokens, cached_tokens, generated_tokens, steps, step_rows;
  int64_t prefix_hits, prefix_misses;
  int64_t spec_draft_tokens, spec_accepted_tokens; /* speculative decoding: drafted, accepted */
  int64_t spec_steps, spec_declined_steps; /* steps that verified drafts; steps with drafts the
                                              policy kept plain (it did not pay, or the cap) */
  int64_t spec_draft_steps;                /* draft-model steps (each drafts every sequence) */
  int64_t prefix_cache_bytes, prefix_cache_max_bytes; /* bytes only the prefix cache holds; cap */
  int64_t prefix_cache_blocks, prefix_cache_entries;
  int64_t prefill_tokens; /* prompt tokens forwarded (not read from the prefix cache, and a
                             prompt of n choices once) */
  /* the prompt cache on disk (0 when off) */
  int prompt_cache_on;
  int64_t prompt_cache_blocks_written, prompt_cache_bytes_written;
  int64_t prompt_cache_blocks_dropped; /* not written: the writer's queue was full */
  int64_t prompt_cache_write_errors;
  int64_t prompt_cache_blocks_loaded, prompt_cache_bytes_loaded;
  int64_t prompt_cache_files_rejected; /* skipped with a warning: truncated, corrupt, foreign */
  int64_t prompt_cache_queued_bytes;   /* waiting for the writer now */
} cinfer_engine_stats;

/* Prompt cache on disk: writes every block the prefix cache holds that is not on disk yet, and
 * returns once they are written (*blocks, may be NULL: how many). CINFER_INVALID_ARGUMENT when
 * the engine has no prompt_cache_dir, CINFER_STOPPED when it is stopping. Not from the engine's
 * own callbacks. */
cinfer_status cinfer_engine_cache_save(cinfer_engine *engine, int64_t *blocks);

/* Prompt cache on disk: reads the blocks of this prompt (under params' KV plan; NULL = the
 * defaults) from disk into the prefix cache, so that a request starting with it prefills only
 * the rest; within the prefix cache's byte cap and the KV budget. *cached_tokens: the prompt
 * tokens the prefix cache now holds (a multiple of the block size); *loaded_blocks (may be
 * NULL): blocks read. CINFER_INVALID_ARGUMENT (no prompt_cache_dir, bad ids or plan),
 * CINFER_QUEUE_FULL (every sequence slot is taken: try again), CINFER_STOPPED. */
cinfer_status cinfer_engine_cache_load(cinfer_engine *engine, const int32_t *prompt,
                                       size_t n_prompt, const cinfer_params *params,
                                       int64_t *cached_tokens, int64_t *loaded_blocks);

/* One file of a prompt-cache directory (cinfer_prompt_cache_scan). */
typedef struct {
  const char *name; /* inside the directory */
  int64_t bytes;
  long long mtime; /* last used (read or written), seconds since the epoch */
  int valid;       /* it passed its checks; else problem says why */
  const char *problem;
  const char *key; /* valid: the key it was stored under (key_bytes long, no NUL): model
                      identity, backend, block size, layer groups, KV codec state, adapter */
  size_t key_bytes;
  int64_t index;    /* valid: block index (positions index*T .. index*T + T - 1) */
  int block_tokens; /* T */
} cinfer_prompt_cache_file;

/* Calls fn for every block file (and leftover temporary file) of a prompt-cache directory, with
 * its header checked (and, with verify, its payload checksum). fn returns 0 to go on. Returns
 * CINFER_OK, or CINFER_ERROR (the directory cannot be read, or fn returned non-zero). */
cinfer_status cinfer_prompt_cache_scan(const char *dir, int verify,
                                       int (*fn)(void *user, const cinfer_prompt_cache_file *file),
                                       void *user);

/* Deletes the files of a prompt-cache directory that can never be loaded (failed checks,
 * temporary files older than ten minutes, blocks whose predecessor block is gone), then, while the
 * block files take more than max_bytes (< 0: no cap), the least recently used prompts' blocks,
 * deepest first. *removed and
 * *freed_bytes (may be NULL) get counts. Safe while a server uses the directory (a block it
 * still wants is recomputed). */
cinfer_status cinfer_prompt_cache_prune(const char *dir, int64_t max_bytes, int64_t *removed,
                                        int64_t *freed_bytes);

/* Fills *stats with the engine's counters now. */
cinfer_status cinfer_engine_get_stats(cinfer_engine *engine, cinfer_engine_stats *stats);

/* ==== Model facts and the KV codec ==== */

/* Number of transformer layers (config.json num_hidden_layers). */
int cinfer_model_n_layers(const cinfer_model *model);

/* The backend the model runs on ("cpu", "cuda", ...). */
const char *cinfer_model_device(const cinfer_model *model);

/* Ranks the model is split over (cinfer_model_options.tensor_parallel; 1 when whole). */
int cinfer_model_tensor_parallel(const cinfer_model *model);

/* Why device auto runs the model on the CPU although a GPU is visible (the GPU backend cannot run
 * it yet, e.g. quantized weights), or "" when it did not fall back. Programs should show it:
 * the fallback is not meant to be silent. */
const char *cinfer_model_device_note(const cinfer_model *model);

/* generation_config.json's max_new_tokens, or 0 when the model folder sets none (a program with a
 * built-in default of its own uses it only then). */
int cinfer_model_max_new_tokens(const cinfer_model *model);

/* Bytes of weights one forward pass reads per token (every matrix once): the memory traffic a
 * decode step cannot avoid. */
int64_t cinfer_model_weight_bytes(const cinfer_model *model);

/* Checks the KV fields of params (kv_codec, kv_bits, kv_value_bits, kv_group_size, kv_start,
 * kv_protect) without a model: CINFER_INVALID_ARGUMENT naming the bad field otherwise. When name
 * is non-NULL it receives the canonical name of the codec the sequence ends up in ("bf16",
 * "f32", "affine:4:64", ...; "bf16" when kv_codec is NULL, the format sequences start in — a
 * model folder's kv_config.json may still convert them); *quantized (may be NULL) is 1 when
 * kv_codec names a quantized codec (affine, turbo, turbo-v). */
cinfer_status cinfer_params_kv_codec(const cinfer_params *params, char *name, size_t name_size,
                                     int *quantized);

/* Bytes one token of KV takes in this model (K and V of every cache layer) when stored in the
 * codec params name (its quantized target, else its base format; bf16 when kv_codec is NULL). */
cinfer_status cinfer_model_kv_bytes_per_token(const cinfer_model *model,
                                              const cinfer_params *params, int64_t *bytes);

/* ==== Session extras: timings, seeds, synthetic context ==== */

/* How long the current turn took (the feeds since the last generation, then its steps). */
typedef struct {
  int prompt_tokens;      /* ids fed in the turn */
  int generated_tokens;   /* tokens sampled in the turn, EOS included */
  int draft_tokens;       /* tokens drafted by speculative decoding in the turn */
  int accepted_tokens;    /* of which verification accepted */
  double prefill_seconds; /* time spent feeding */
  double ttft_seconds;    /* first feed of the turn -> first token sampled */
  double decode_seconds;  /* first token sampled -> last token sampled */
  double prefill_tok_s;   /* prompt_tokens / prefill_seconds (0 when nothing was fed) */
  double decode_tok_s;    /* (generated_tokens - 1) / decode_seconds; 0 below 2 tokens */
} cinfer_timings;

/* The timings of the session's current turn. */
cinfer_status cinfer_session_timings(const cinfer_session *session, cinfer_timings *timings);

/* The log-probability of the token the session sampled last (*logprob, may be NULL) and the k
 * most likely tokens of the same distribution, best first, as engine token events carry them (k
 * in [0, CINFER_MAX_TOP_LOGPROBS]; top_ids and top_logprobs hold k entries; *n_top receives how
 * many were written). CINFER_INVALID_ARGUMENT when nothing was sampled since the last feed or
 * reset. */
cinfer_status cinfer_session_logprobs(const cinfer_session *session, int k, float *logprob,
                                      int32_t *top_ids, float *top_logprobs, int *n_top);

/* The sampling seed in use (the one drawn from the OS when the params had none). */
uint64_t cinfer_session_seed(const cinfer_session *session);

/* Bytes of KV storage the session's sequence holds now. */
int64_t cinfer_session_kv_bytes(const cinfer_session *session);

/* Fills the next n_positions positions of the KV cache with seeded pseudo-random K/V, as if that
 * many tokens had been fed (the values mean nothing; the time attention then takes is real: a
 * benchmark at a given context depth). Only on an empty session. */
cinfer_status cinfer_session_fill_synthetic(cinfer_session *session, int64_t n_positions,
                                            uint64_t seed);

/* ==== Tokenizers and chat templates on their own ==== */

typedef struct cinfer_tokenizer cinfer_tokenizer;
typedef struct cinfer_chat_template cinfer_chat_template;

/* Loads a tokenizer without weights: path is a model folder (its tokenizer.json and
 * tokenizer_config.json) or a tokenizer.json file. */
cinfer_status cinfer_tokenizer_load(const char *path, cinfer_tokenizer **out);

/* A tokenizer from the text of a tokenizer.json (tests, embedded tokenizers). */
cinfer_status cinfer_tokenizer_from_json(const char *json, size_t len, cinfer_tokenizer **out);

/* The id of a special token tokenizer_config.json names ("bos_token", "eos_token", ...), or -1. */
int32_t cinfer_tokenizer_config_token(const cinfer_tokenizer *tokenizer, const char *key);

/* The id of a token string of the vocabulary ("<think>"), or -1. */
int32_t cinfer_tokenizer_token_id(const cinfer_tokenizer *tokenizer, const char *token);

/* Frees a tokenizer from cinfer_tokenizer_load or cinfer_tokenizer_from_json. NULL is a no-op. */
void cinfer_tokenizer_free(cinfer_tokenizer *tokenizer);

/* The model's tokenizer (owned by the model), or NULL when its folder has no tokenizer.json. */
const cinfer_tokenizer *cinfer_model_tokenizer(const cinfer_model *model);

/* As cinfer_tokenize and cinfer_detokenize, on a tokenizer. */
cinfer_status cinfer_tokenizer_encode(const cinfer_tokenizer *tokenizer, const char *text,
                                      size_t len, int add_special, int32_t **ids, size_t *n_ids);
cinfer_status cinfer_tokenizer_decode(const cinfer_tokenizer *tokenizer, const int32_t *ids,
                                      size_t n_ids, int skip_special, char **text, size_t *len);

/* Loads the chat template of a model folder (tokenizer_config.json's chat_template, or
 * chat_template.jinja/.json) without weights. */
cinfer_status cinfer_chat_template_load(const char *model_dir, cinfer_chat_template **out);

/* A chat template from Jinja source; bos_token and eos_token (may be NULL) are the values the
 * template sees as bos_token/eos_token. */
cinfer_status cinfer_chat_template_from_source(const char *source, const char *bos_token,
                                               const char *eos_token, cinfer_chat_template **out);

/* Frees a template from cinfer_chat_template_load/_from_source. NULL is a no-op. */
void cinfer_chat_template_free(cinfer_chat_template *chat_template);

/* The model's chat template (owned by the model), or NULL when it has none. */
const cinfer_chat_template *cinfer_model_chat_template(const cinfer_model *model);

/* The template's bos_token/eos_token strings ("" when unset); owned by the template. */
const char *cinfer_chat_template_bos_token(const cinfer_chat_template *chat_template);
const char *cinfer_chat_template_eos_token(const cinfer_chat_template *chat_template);

/* Renders a whole chat request, as Hugging Face's apply_chat_template: request_json is an object
 * with "messages" and optionally "tools", "add_generation_prompt", "documents" and any template
 * keyword (enable_thinking, ...). *text (free with cinfer_free) receives *len bytes (len may be
 * NULL). A template error is CINFER_ERROR with the template's own message. */
cinfer_status cinfer_chat_template_render(const cinfer_chat_template *chat_template,
                                          const char *request_json, char **text, size_t *len);

/* ==== Streaming detokenization and stop strings ==== */

typedef struct cinfer_detokenizer cinfer_detokenizer;

/* A detokenizer that turns generated ids into text pieces as soon as the text is stable (never
 * inside a UTF-8 character), cutting the text before the first of n_stop stop strings (copied;
 * matched across token boundaries and never emitted). skip_special drops special tokens. The
 * tokenizer must outlive it. */
cinfer_status cinfer_detokenizer_create(const cinfer_tokenizer *tokenizer, const char *const *stop,
                                        size_t n_stop, int skip_special, cinfer_detokenizer **out);

/* Frees the detokenizer. NULL is a no-op. */
void cinfer_detokenizer_free(cinfer_detokenizer *detokenizer);

/* Pushes one id. *piece and *len receive the text that became final (may be empty; owned by the
 * detokenizer, valid until its next call). CINFER_OK to go on; CINFER_DONE when a stop string
 * completed (piece = the text before it; later pushes give nothing); CINFER_INVALID_ARGUMENT for
 * an id outside the vocabulary. */
cinfer_status cinfer_detokenizer_push(cinfer_detokenizer *detokenizer, int32_t token,
                                      const char **piece, size_t *len);

/* End of generation: releases the text held back (it may still complete a stop string:
 * CINFER_DONE). */
cinfer_status cinfer_detokenizer_finish(cinfer_detokenizer *detokenizer, const char **piece,
                                        size_t *len);

/* The stop string that ended the text (the detokenizer's copy), or NULL while none has. */
const char *cinfer_detokenizer_stop_string(const cinfer_detokenizer *detokenizer);

/* ==== Random-weight models (tests and benchmarks without a download) ==== */

typedef struct {
  const char *dtype; /* "bf16" (NULL), "q8" or "q4": quantized weights are affine with ... */
  int group_size;    /* ... this group size: 32, 64 (0 = 64) or 128 */
  uint64_t seed;     /* the same seed writes the same weights */
} cinfer_random_model_options;

/* Writes a model folder at out_dir (created if missing): config.json (the config at config_path,
 * with a quantization entry when quantized) and model.safetensors with seeded random weights of
 * every tensor the config needs. options may be NULL (bf16, seed 0). */
cinfer_status cinfer_model_write_random(const char *config_path, const char *out_dir,
                                        const cinfer_random_model_options *options);

/* ==== Chat output of a model family: reasoning and tool calls ==== */

typedef struct cinfer_chat_format cinfer_chat_format;
typedef struct cinfer_chat_output cinfer_chat_output;

/* The output conventions of a model family, detected from its tokenizer, its chat template (may
 * be NULL) and its architecture (config.json model_type; may be NULL): think-tag reasoning
 * (<think> and </think> are tokens), Gemma channel reasoning (the template mentions <|channel>
 * and the tokenizer has the channel markers), Gemma 4 tool-call tokens (architecture gemma4*);
 * tool calls written as text (<tool_call>{...}</tool_call> and the like) otherwise. The tokenizer
 * and template must outlive it. */
cinfer_status cinfer_chat_format_create(const cinfer_tokenizer *tokenizer,
                                        const cinfer_chat_template *chat_template,
                                        const char *architecture, cinfer_chat_format **out);

/* Frees a format from cinfer_chat_format_create. NULL is a no-op. */
void cinfer_chat_format_free(cinfer_chat_format *format);

/* The model's format (owned by the model), or NULL when its folder has no tokenizer.json. */
const cinfer_chat_format *cinfer_model_chat_format(const cinfer_model *model);

/* 1 when the model's chat template asks for tool calls in the Qwen XML format (Qwen3.5,
 * Qwen3-Coder: <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n
 * </tool_call>) rather than hermes JSON; the server forces that form for tool_choice "required"
 * or a named function. */
int cinfer_chat_format_xml_tool_calls(const cinfer_chat_format *format);

/* 1 when an answer to `prompt` (a rendered chat prompt) starts inside reasoning: the format has
 * think tags and the prompt's last <think> is not closed (a template that opens it, as Qwen3.5's
 * does with thinking on). */
int cinfer_chat_format_reasoning_open(const cinfer_chat_format *format, const char *prompt,
                                      size_t len);

/* 1 when answers of this format can carry reasoning apart from content. */
int cinfer_chat_format_has_reasoning(const cinfer_chat_format *format);

/* Tokens that end a chat answer besides the EOS ids (Gemma 4: <|tool_response> after a call);
 * writes up to cap of them to ids and returns how many there are. Add them to a request's
 * stop_token_ids unless it ignores EOS. */
size_t cinfer_chat_format_stop_tokens(const cinfer_chat_format *format, int32_t *ids, size_t cap);

typedef struct {
  const char *const *stop; /* stop strings (copied); the text ends before the first one */
  size_t n_stop;
  const char *tools_json; /* the request's tool definitions, a JSON array in OpenAI's shape
                             ({type, function: {name, parameters}}); NULL: text tool calls are
                             not parsed (Gemma 4 call tokens still are, with any name) */
  int tools_off;          /* tool_choice "none": no call is parsed, their text stays content */
  int raw_text;           /* plain completion: no reasoning or tool-call parsing at all */
  int hermes_tool_calls;  /* read tool calls as hermes JSON text even where the format has its
                             own call tokens (a call the request's grammar forced as text) */
  const char *prompt;     /* the rendered prompt (may be NULL): an answer that starts inside an
                             open <think> or channel begins as reasoning */
  size_t prompt_len;
} cinfer_chat_output_options;

/* Where an answer's parts go, as they become final. */
typedef struct {
  void (*content)(void *user, const char *text, size_t len);
  void (*reasoning)(void *user, const char *text, size_t len);
  void (*tool_call)(void *user, const char *call_json); /* {"name": ..., "arguments": "..."} */
} cinfer_chat_output_sinks;

/* A parser for one answer: streaming detokenization with stop strings, then reasoning split,
 * then tool-call parsing, as the format says. options may be NULL (none of them). */
cinfer_status cinfer_chat_output_create(const cinfer_chat_format *format,
                                        const cinfer_chat_output_options *options,
                                        cinfer_chat_output **out);

/* Frees the parser. NULL is a no-op. */
void cinfer_chat_output_free(cinfer_chat_output *output);

/* Pushes one generated token (never an EOS), calling sinks with what became final. CINFER_OK;
 * CINFER_DONE when a stop string completed (nothing after it is ever produced);
 * CINFER_INVALID_ARGUMENT for an id outside the vocabulary; CINFER_ERROR when out of memory. */
cinfer_status cinfer_chat_output_push(cinfer_chat_output *output, int32_t token,
                                      const cinfer_chat_output_sinks *sinks, void *user);

/* End of the answer: releases held-back text and flushes every stage (a call cut short is closed
 * best effort). CINFER_DONE when the held text completed a stop string. */
cinfer_status cinfer_chat_output_finish(cinfer_chat_output *output,
                                        const cinfer_chat_output_sinks *sinks, void *user);

/* The stop string that ended the text, or NULL. */
const char *cinfer_chat_output_stop_string(const cinfer_chat_output *output);

/* Tokens of the answer that were reasoning (between <think> and </think>, or in a channel). */
int cinfer_chat_output_reasoning_tokens(const cinfer_chat_output *output);
/* ==== Model hub and cache ==== */

/* Models named by a Hugging Face Hub repo id ("org/name") live in the Hugging Face cache, the
 * layout huggingface_hub shares: HUB/models--ORG--NAME/{blobs/ETAG, snapshots/COMMIT/FILE
 * (relative symlinks into blobs), refs/REVISION (a branch's or tag's commit)}. HUB is
 * $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
 * ~/.cache/huggingface/hub. cinfer_model_load resolves repo ids there. */

/* The hub cache folder (*dir malloc'd, free with cinfer_free; it need not exist yet). */
cinfer_status cinfer_hub_cache_dir(char **dir);

/* 1 when `model` is written as a repo id ("org/name" or "org/name@revision") that names no local
 * folder, so it can only come from the cache or the Hub; else 0. */
int cinfer_is_repo_id(const char *model);

/* Resolves a model argument as cinfer_model_load does (a folder, a cached repo id, or a unique
 * part of one) without loading anything: CINFER_OK with *dir (free with cinfer_free), or
 * CINFER_ERROR with the reason. */
cinfer_status cinfer_model_resolve(const char *model, char **dir);

/* What a pull reports through its callback. */
typedef enum {
  CINFER_PULL_LISTED = 0,    /* the revision's files are known: n_files, total, commit */
  CINFER_PULL_FILE_START,    /* a file starts downloading (file_done > 0 when it resumes) */
  CINFER_PULL_FILE_PROGRESS, /* bytes arrived (at most about 10 reports a second) */
  CINFER_PULL_FILE_RETRY,    /* its transfer broke; it resumes from file_done (message says why) */
  CINFER_PULL_FILE_DONE,     /* downloaded and verified */
  CINFER_PULL_FILE_CACHED    /* already in the cache; nothing to download */
} cinfer_pull_event;

typedef struct {
  cinfer_pull_event event;
  const char *repo_id;
  const char *commit;  /* the revision's commit hash */
  const char *file;    /* FILE_* events: its path in the repo */
  const char *message; /* FILE_RETRY: why the transfer broke */
  int file_index;      /* 0-based, of n_files */
  int n_files;
  int64_t file_done, file_total; /* bytes of this file present / expected */
  int64_t done, total;           /* bytes over every file of the pull, cached ones included */
  int64_t downloaded;            /* bytes received over the network since the pull began */
  double seconds;                /* since the pull began */
} cinfer_pull_progress;

/* Return 0 to go on, non-zero to stop the pull (it then fails with CINFER_CANCELLED; a partial
 * file is kept and resumed by the next pull). */
typedef int (*cinfer_pull_callback)(void *user, const cinfer_pull_progress *progress);

typedef struct {
  const char *endpoint;          /* NULL: $HF_ENDPOINT, else https://huggingface.co */
  const char *token;             /* NULL: $HF_TOKEN; sent as "Authorization: Bearer TOKEN" */
  const char *cache_dir;         /* NULL: cinfer_hub_cache_dir() */
  cinfer_pull_callback progress; /* may be NULL */
  void *user;
  int retries; /* resumptions of a broken transfer per file (5) */
} cinfer_pull_options;

/* Fills the defaults listed above. */
void cinfer_pull_options_init(cinfer_pull_options *options);

/* Downloads "org/name[@revision]" (revision: a branch, tag or commit; "main" when absent) into
 * the cache: only the files cinfer reads (config.json, generation_config.json, tokenizer files,
 * chat templates, kv_config.json, *.safetensors and their index, adapter files), each resumed
 * from a partial download when one is there and verified against the Hub's hash (sha256 of LFS
 * files, git blob id of the others); refs/REVISION is written. Files already in the cache are
 * not downloaded again. On success *snapshot_dir (may be NULL; free with cinfer_free) is the
 * snapshot folder. Errors name the cause: a gated repo (accept its terms, set HF_TOKEN), a
 * missing repo or revision, a refused token, a network failure, a hash mismatch. */
cinfer_status cinfer_pull(const char *repo, const cinfer_pull_options *options,
                          char **snapshot_dir);

/* What cinfer can tell about a model folder from its config.json alone (no weights read). */
typedef struct {
  char *architecture; /* config.json model_type ("" when absent) */
  char *dtype;        /* weights: "bfloat16", "float16", ..., or "q4 g64" when quantized */
  int supported;      /* 1 when cinfer can load this configuration */
  char *why;          /* when not supported: the reason ("" otherwise) */
} cinfer_model_info;

/* Reads the info of `model` (resolved as cinfer_model_resolve does). CINFER_OK with *info filled
 * (release with cinfer_model_info_clear) — also for an unsupported model —, or CINFER_ERROR when
 * the folder cannot be found. */
cinfer_status cinfer_model_info_read(const char *model, cinfer_model_info *info);

/* Frees what an info holds and zeroes it. */
void cinfer_model_info_clear(cinfer_model_info *info);

/* One model of the cache. */
typedef struct {
  char *repo_id;      /* "org/name" */
  char *revision;     /* the ref its snapshot was found by ("main"), or "" */
  char *commit;       /* the snapshot's commit hash ("" when the repo has no snapshot) */
  char *path;         /* the snapshot folder ("" when none) */
  int64_t size_bytes; /* bytes on disk (the repo's blobs) */
  cinfer_model_info info;
} cinfer_cached_model;

/* Lists the models of cache_dir (NULL: cinfer_hub_cache_dir()) sorted by repo id: *models
 * (release with cinfer_cache_list_free) receives *n entries. A missing cache is an empty list. */
cinfer_status cinfer_cache_list(const char *cache_dir, cinfer_cached_model **models, size_t *n);

/* Frees a list from cinfer_cache_list. NULL is a no-op. */
void cinfer_cache_list_free(cinfer_cached_model *models, size_t n);

/* Deletes repo_id ("org/name") from cache_dir (NULL: cinfer_hub_cache_dir()): its folder and its
 * lock files, nothing outside them (symlinks are not followed; ids with ".." are refused).
 * *freed_bytes (may be NULL) receives the bytes removed. CINFER_ERROR when it is not cached. */
cinfer_status cinfer_cache_remove(const char *cache_dir, const char *repo_id, int64_t *freed_bytes);

/* Whether a model fits this machine's memory. */
typedef struct {
  int64_t context;      /* tokens per sequence; 0 = the model's context length */
  int batch;            /* sequences held at once (1) */
  const char *kv_codec; /* "bf16" (NULL), "f32", "affine", "turbo" or "turbo-v" */
  int kv_bits;          /* affine: 4|8, turbo: 2..4, turbo-v: K bits 4|8 (0 = 4) */
  int kv_value_bits;    /* turbo, turbo-v: V bits 2..4 (0 = kv_bits) */
  int kv_group_size;    /* affine: 32|64|128 (0 = 64) */
  const char *device;   /* "cpu" (NULL); "cuda" is refused until GPU memory can be read */
  int64_t memory_bytes; /* > 0: use this as the memory available instead of measuring it */
  int draft_max;        /* > 0: requests speculate with rounds of up to draft_max drafts (a hybrid
                           model then holds state checkpoints); 0: no speculation (0..32) */
} cinfer_fit_options;

typedef struct {
  char kv_codec[32];     /* the codec as cinfer names it ("bf16", "affine:8:64", ...) */
  int64_t context;       /* tokens per sequence checked */
  int64_t context_limit; /* the model's context length */
  int batch;
  int64_t weights_bytes;      /* tensor bytes of the safetensors files (from their headers) */
  int64_t kv_bytes;           /* KV cache of batch sequences of `context` tokens: what the
                                 engine's admission reserves for them (blocks at their peak, a
                                 quantized codec's first chunk in bf16 until it converts, and
                                 state_bytes per sequence) */
  int64_t kv_bytes_per_token; /* one token of one sequence over every layer (full attention) */
  int64_t workspace_bytes;    /* activations of one prefill step (2048 rows) and the logits */
  int64_t total_bytes;        /* weights + kv + workspace */
  int64_t memory_available;   /* MemAvailable (or the cgroup limit, or memory_bytes) */
  int64_t memory_total;       /* MemTotal (or the cgroup limit) */
  int fits;                   /* total_bytes <= memory_available */
  int64_t max_context;        /* the largest context <= context_limit that fits; 0 if none */
  int64_t state_bytes; /* per sequence, in kv_bytes: a hybrid model's (Qwen3.5) recurrent state
                          and, with draft_max, its speculative checkpoints, in whole KV-arena
                          slabs; 0 for other models */
  int draft_max;       /* the options' draft_max */
} cinfer_fit_result;

/* Fills the defaults (context 0, batch 1, bf16, cpu, measured memory). */
void cinfer_fit_options_init(cinfer_fit_options *options);

/* Estimates the memory `model` (resolved as cinfer_model_resolve does) needs with the options,
 * from config.json and the safetensors headers (no weights are read), against this machine's
 * memory. CINFER_OK with *result filled, CINFER_ERROR (no such model, unsupported config,
 * unreadable weights), CINFER_INVALID_ARGUMENT (bad codec, context or batch) or
 * CINFER_UNSUPPORTED (a device whose memory cannot be read). */
cinfer_status cinfer_fit(const char *model, const cinfer_fit_options *options,
                         cinfer_fit_result *result);

/* ==== Grammars (structured output) ==== */

/* Compiles a JSON Schema (JSON text; strict as cinfer_params.json_schema_strict) to GBNF with
 * start rule "root", so a program can compose it into a larger grammar (a tool call around
 * arguments). *gbnf is freed with cinfer_free. CINFER_INVALID_ARGUMENT naming an unsupported
 * keyword or malformed JSON. */
cinfer_status cinfer_json_schema_to_gbnf(const char *schema_json, size_t len, int strict,
                                         char **gbnf);

/* Checks GBNF text (llama.cpp's format) with start rule root (NULL = "root"): CINFER_OK, or
 * CINFER_INVALID_ARGUMENT with a message naming the line and column of the problem. */
cinfer_status cinfer_grammar_check(const char *gbnf, size_t len, const char *root);

/* ==== Embeddings ==== */

/* How the token rows of a text become one vector. */
typedef enum {
  CINFER_POOL_MEAN = 1, /* the mean of every token's row */
  CINFER_POOL_LAST = 2, /* the last token's row (Qwen3-Embedding style) */
  CINFER_POOL_CLS = 3   /* the first token's row */
} cinfer_pooling;

/* The pooling the model folder's sentence-transformers config names (modules.json and its Pooling
 * module's config.json: pooling_mode_lasttoken, pooling_mode_cls_token, else mean); mean when
 * the folder has none. */
cinfer_pooling cinfer_model_pooling(const cinfer_model *model);

/* The CPU threads the model's forward pass uses (n_threads, or every online CPU for 0). */
int cinfer_model_threads(const cinfer_model *model);

/* The width of the model's hidden states (the length of an embedding). */
int cinfer_model_hidden_size(const cinfer_model *model);

/* Embeds n_ids tokens: the model's final-normed hidden states (the LM head's input) pooled and
 * L2-normalized into out[cinfer_model_hidden_size]. Runs on the engine's thread between two
 * generation steps (in a KV sequence of its own, freed before it returns), so it can be called
 * from any thread while the engine serves requests; blocks until done. CINFER_CONTEXT_EXCEEDED
 * when the text is longer than the engine's context. */
cinfer_status cinfer_engine_embed(cinfer_engine *engine, const int32_t *ids, size_t n_ids,
                                  cinfer_pooling pooling, float *out);

#ifdef __cplusplus
}
#endif

#endif
