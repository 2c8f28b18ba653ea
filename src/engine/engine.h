/* The serving engine (docs/generation.md §1, §8, §9): one engine thread owns the model, the shared
 * paged KV cache and the continuous-batching scheduler. Other threads submit token-id jobs and
 * read each request's events (tokens, then done or error) from its own queue; cancelling is a
 * flag the engine applies at the next step boundary, where the sequence's blocks are freed (its
 * full blocks stay in the prefix cache, engine/prefix_cache.h).
 *
 * Ownership: the caller owns the model (it must outlive the engine). ci_engine_submit returns a
 * request handle shared by the caller and the engine thread; the caller gives up its share with
 * ci_engine_request_release (which also cancels a request still running). */
#ifndef CI_ENGINE_ENGINE_H
#define CI_ENGINE_ENGINE_H

#include "engine/generate.h"
#include "grammar/matcher.h"
#include "io/generation_config.h"
#include "model/lora.h"
#include "model/model.h"
#include "sample/sampler.h"

#include <stdint.h>

typedef struct ci_engine ci_engine;
typedef struct ci_engine_request ci_engine_request;

enum { CI_ENGINE_MAX_TOP_LOGPROBS = 20, CI_ENGINE_MAX_BATCH = 512 };

typedef struct {
  int batch;               /* max running sequences (default 8, at most CI_ENGINE_MAX_BATCH) */
  int batch_tokens;        /* rows per step (default 2048) */
  int prefill_chunk;       /* prompt tokens per prefill chunk (default 2048) */
  int max_queue;           /* waiting requests beyond which submit answers "queue full" (256) */
  int ctx_size;            /* per-request context limit; 0 = the model's max_position */
  int block_tokens;        /* KV block size T (16) */
  ci_kv_codec base;        /* what every sequence starts in (bf16) */
  int64_t kv_budget_bytes; /* KV bytes all running reservations share, allocated at creation
                              as the KV arena; 0 = batch x the reservation of one ctx_size
                              request (at most half of the machine's memory); < 0 = unbounded:
                              no arena, memory taken as sequences grow (single-request use) */
  int kv_protect; /* the first and last N cache layers get groups of their own, so that jobs may
                     keep up to N layers at each end in the base format */
  int64_t prefix_cache_bytes; /* cap on KV bytes only the prefix cache holds (2 GiB); 0 turns
                                 the prefix cache off; never more than the KV budget */
  /* Speculative decoding (docs/generation.md "Speculative decoding"): prompt lookup drafts up to
   * draft_max tokens per round from n-grams of lookup_ngram down to 1 tokens; the draft length
   * adapts to the acceptance between draft_min and draft_max. 0 = off. */
  int lookup_ngram;
  /* A draft model with the target's vocabulary (borrowed; it must outlive the engine): when set,
   * it drafts instead of prompt lookup, from its own paged KV (bf16, taken as needed, outside
   * the KV budget) and its own final sampling distribution q under the request's parameters. */
  ci_model *draft_model;
  int draft_max; /* 1..CI_ENGINE_MAX_DRAFT (5) */
  int draft_min; /* 1..draft_max (1) */
  /* Whether a step speculates (engine/spec_policy.h): CI_ENGINE_SPEC_AUTO decides per step from
   * measured step times and acceptance; ALWAYS and NEVER force it (tests, benchmarks). A step
   * with more decoding sequences than spec_max_batch (> 0) never speculates (0 = no cap). */
  int spec_policy;
  int spec_max_batch;
  /* Prompt cache on disk (engine/prompt_cache.h; needs the prefix cache): the prefix cache's
   * blocks are written to this directory as they fill and read back at admission, so a restarted
   * engine reuses them. NULL = off. */
  const char *prompt_cache_dir;
  int64_t prompt_cache_queue_bytes; /* bytes waiting for the writer at most (0: 256 MiB) */
  void (*prompt_cache_warn)(void *arg, const char *message); /* skipped files, failed writes
                                                                (engine or writer thread) */
  void *prompt_cache_warn_arg;
} ci_engine_options;

enum { CI_ENGINE_MAX_DRAFT = 32 };
enum { CI_ENGINE_SPEC_AUTO = 0, CI_ENGINE_SPEC_ALWAYS = 1, CI_ENGINE_SPEC_NEVER = 2 };

/* One job: a tokenized prompt and how to continue it. The prompt is copied by submit. */
typedef struct {
  const int32_t *prompt;
  int n_prompt;
  int max_tokens; /* >= 1, every sampled token counts (EOS included) */
  ci_sampler_params sampling;
  ci_eos_set eos;            /* n = 0: never stop on EOS */
  ci_kv_plan_source kv_plan; /* the sequence's own codec plan */
  ci_kv_format kv_target;    /* CI_KV_PLAN_TARGET: convert to this ... */
  int64_t kv_start;          /* ... at this many tokens */
  int kv_protect;            /* ... except the first and last N cache layers (<= the engine's) */
  int top_logprobs;          /* 0..20 top entries per token event (logprob is always sent) */
  int num_draft;             /* drafts per round at most: 0 = the engine's draft_max, < 0 = never
                                speculate, else that many (at most draft_max) */
  ci_sampler *sampler; /* NULL: the engine creates one from `sampling`; else borrowed (its seed
                          and output index continue): the caller leaves it alone until it has
                          read the request's final event */
  ci_grammar *grammar; /* NULL, or the constraint on the output (docs/generation.md §4.2): the
                          request takes a reference and its own matcher over grammar_vocab; every
                          token the grammar does not allow next is masked (-inf) before the
                          sampler, EOS only when the grammar is complete; a complete grammar
                          that allows nothing more ends the request (stop) */
  ci_grammar_vocab *grammar_vocab; /* the token bytes of the model's vocabulary (with grammar) */
  ci_lora *lora; /* NULL, or the LoRA adapter (loaded for the engine's model) the request runs
                    with: the request takes a reference; its prefix-cache entries are its own */
} ci_engine_job;

typedef enum {
  CI_ENGINE_EVENT_TOKEN, /* one sampled token that is not EOS */
  CI_ENGINE_EVENT_DONE,  /* the sequence finished (finish, counts); last event */
  CI_ENGINE_EVENT_ERROR  /* generation failed (message); last event */
} ci_engine_event_kind;

typedef struct {
  ci_engine_event_kind kind;
  int32_t token; /* TOKEN: the token; DONE: the last sampled one (the EOS id when it ended the
                    request), -1 when none */
  float logprob; /* lp[token] */
  int n_top;
  int32_t top_ids[CI_ENGINE_MAX_TOP_LOGPROBS];
  float top_logprobs[CI_ENGINE_MAX_TOP_LOGPROBS];
  ci_finish_reason finish; /* DONE */
  int prompt_tokens;       /* DONE: P */
  int cached_tokens;       /* DONE: prompt tokens reused from the prefix cache */
  int generated_tokens;    /* DONE: g, EOS included */
  double queue_seconds;    /* DONE: submit -> admission */
  double prefill_seconds;  /* DONE: admission -> first token */
  double decode_seconds;   /* DONE: first token -> last token */
  int draft_tokens;        /* DONE: tokens drafted for speculative verification */
  int accepted_tokens;     /* DONE: of which the target accepted */
  char message[256];       /* ERROR */
} ci_engine_event;

/* Submission verdicts: callers decide on these, never on the message text (ci_last_error
 * says why for every verdict but CI_ENGINE_SUBMITTED). */
typedef enum {
  CI_ENGINE_SUBMITTED = 0,
  CI_ENGINE_REJECTED = 1,     /* invalid: bad ids, bad params, empty prompt */
  CI_ENGINE_QUEUE_FULL = 2,   /* try again later */
  CI_ENGINE_STOPPED = 3,      /* the engine is shutting down */
  CI_ENGINE_OVER_CONTEXT = 4, /* prompt + max_tokens exceeds the context size */
  CI_ENGINE_OVER_BUDGET = 5,  /* valid, but needs more KV than the memory budget ever allows */
  CI_ENGINE_OUT_OF_MEMORY = 6 /* the request could not be allocated (may work later) */
} ci_engine_verdict;

enum { CI_ENGINE_MAX_KV_FORMATS = 8 };

/* A snapshot of the engine's counters and gauges (for /metrics and /stats). */
typedef struct {
  int n_kv_formats; /* KV usage per storage format (bf16, affine:4:64, ...) */
  ci_kv_format_usage kv_formats[CI_ENGINE_MAX_KV_FORMATS];
  int n_kv_conversions; /* sequences converted so far, per target format */
  ci_kv_format kv_conversion_formats[CI_ENGINE_MAX_KV_FORMATS];
  int64_t kv_conversions[CI_ENGINE_MAX_KV_FORMATS];
  int running, waiting;
  int64_t blocks_used, bytes_used, kv_budget_bytes, reserved_bytes;
  int64_t requests_finished, requests_cancelled, requests_failed;
  int64_t prompt_tokens, cached_tokens, generated_tokens, steps, step_rows;
  int64_t prefill_tokens; /* prompt tokens forwarded (not from the prefix cache nor a fork) */
  int64_t prefix_hits, prefix_misses;
  int64_t spec_draft_tokens, spec_accepted_tokens; /* speculative decoding, all requests */
  int64_t spec_steps;                              /* steps that verified drafts */
  int64_t spec_declined_steps; /* steps with drafts to verify that the policy (or the
                                  spec_max_batch cap) kept plain */
  int64_t spec_draft_steps;    /* draft-model steps (each covers every sequence drafting) */
  int64_t prefix_cache_bytes, prefix_cache_max_bytes; /* bytes only the cache holds; its cap */
  int64_t prefix_cache_blocks, prefix_cache_entries;  /* blocks it references; chain nodes */
  /* prompt cache on disk (all 0 when off) */
  int prompt_cache_on;
  int64_t prompt_cache_blocks_written, prompt_cache_bytes_written, prompt_cache_blocks_dropped;
  int64_t prompt_cache_write_errors, prompt_cache_blocks_loaded, prompt_cache_bytes_loaded;
  int64_t prompt_cache_files_rejected, prompt_cache_queued_bytes;
} ci_engine_stats;

/* Fills the defaults listed above. */
void ci_engine_options_default(ci_engine_options *options);

/* Creates the engine (KV cache for `model`) and starts its thread. NULL with ci_last_error. */
ci_engine *ci_engine_create(ci_model *model, const ci_engine_options *options);

/* Stops the engine thread: running and queued requests end with an error event and later
 * submissions answer CI_ENGINE_STOPPED; handles stay valid until released. Idempotent. */
void ci_engine_stop(ci_engine *engine);

/* Stops the thread (ci_engine_stop): running and queued requests end with an error event; handles
 * still held by callers stay valid until released. Then frees the engine. NULL is a no-op. */
void ci_engine_free(ci_engine *engine);

/* The context limit and KV budget in use. */
int ci_engine_ctx_size(const ci_engine *engine);

/* The most sequences a step runs (the batch option). */
int ci_engine_max_batch(const ci_engine *engine);

/* The KV bytes a request of n tokens reserves (its peak under the base codec). */
int64_t ci_engine_reservation_bytes(const ci_engine *engine, int64_t n_tokens);

/* Queues a job (FIFO). Returns a verdict; on CI_ENGINE_SUBMITTED *out is the request handle. */
ci_engine_verdict ci_engine_submit(ci_engine *engine, const ci_engine_job *job,
                                   ci_engine_request **out);

/* Submits n (1..batch) choices of one job: the prompt is prefilled once, by the first choice;
 * when its prefill ends every other choice forks its KV sequence (ci_kv_seq_fork: the blocks are
 * shared, copied on the first write) and samples its own first token from the same logits. Each
 * choice has its own sampler (seeded with ci_engine_choice_seed(seed, i) when the job has a seed;
 * a job without one draws a seed per choice), grammar matcher, events and handle out[i]. The
 * choices are admitted together (n slots, n reservations); the prompt counts once in the stats.
 * A later choice whose first one is cancelled or fails before its prefill ends ends the same way.
 * job->sampler must be NULL when n > 1. On CI_ENGINE_SUBMITTED out[0..n) are the handles. */
ci_engine_verdict ci_engine_submit_n(ci_engine *engine, const ci_engine_job *job, int n,
                                     ci_engine_request **out);

/* The seed of choice `index` of a request seeded `seed`: the seed itself for choice 0, else a
 * splitmix64 mix of seed + index * 0x9E3779B97F4A7C15. */
uint64_t ci_engine_choice_seed(uint64_t seed, int index);

/* Waits up to timeout_s seconds (< 0: forever) for the request's next event. Returns 1 with
 * *event filled, 0 on timeout. Every request ends with exactly one DONE or ERROR, after all its
 * tokens; the final event needs no allocation, so it is never lost (a token that cannot be queued
 * turns the request into an ERROR "out of memory" instead). After it, calls return 0 at once. */
int ci_engine_request_next(ci_engine_request *request, ci_engine_event *event, double timeout_s);

/* Asks the engine to stop the request at the next step boundary (client gone, stop string
 * found): it finishes with CI_FINISH_ABORT and its blocks are freed. */
void ci_engine_request_cancel(ci_engine_request *request);

/* The caller's share of the handle: cancels the request if it still runs. NULL is a no-op. */
void ci_engine_request_release(ci_engine_request *request);

/* Counters and gauges. */
void ci_engine_get_stats(ci_engine *engine, ci_engine_stats *stats);

/* Prompt cache on disk: writes every block the prefix cache holds that is not on disk yet and
 * waits until the writer has written them; *blocks (may be NULL) gets how many were queued.
 * CI_ERR when the engine has no prompt cache directory or is stopping. Any thread but the
 * engine's. */
int ci_engine_prompt_cache_save(ci_engine *engine, int64_t *blocks);

/* Prompt cache on disk: loads the blocks of the job's prompt (under its KV plan) from disk into
 * the prefix cache, within the prefix cache's byte cap and the KV budget; *cached_tokens gets the
 * prompt tokens the prefix cache now holds (a multiple of the block size), *loaded_blocks the
 * blocks read. CI_ERR when there is no prompt cache directory, the plan is invalid, or every
 * sequence slot is taken (try again). Any thread but the engine's. */
int ci_engine_prompt_cache_load(ci_engine *engine, const ci_engine_job *job, int64_t *cached_tokens,
                                int64_t *loaded_blocks);

/* Runs fn(arg, model, ws, cache) on the engine thread between two steps, with the model, the
 * engine's workspace and its KV cache to itself (a sequence it creates there must be freed before
 * it returns); waits for it and returns its result (CI_ERR when the engine stops first). For work
 * beside generation, such as embeddings. */
typedef struct ci_engine_exclusive ci_engine_exclusive;
typedef int (*ci_engine_exclusive_fn)(void *arg, ci_model *model, ci_workspace *ws,
                                      ci_kv_cache *cache);
int ci_engine_run_exclusive(ci_engine *engine, ci_engine_exclusive_fn fn, void *arg);

#endif
