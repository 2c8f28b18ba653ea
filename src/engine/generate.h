/* Single-sequence generation (docs/generation.md §1-3, §10), synchronous: the prompt runs through a
 * serving engine of batch 1 (engine/engine.h, the one generation loop: chunked prefill into a
 * fresh paged KV cache, then one decode step per sampled token until EOS or max_tokens), and
 * each sampled token goes to the caller's callback, which may end it (a stop string). The caller
 * owns the model and the sampler (the seed and output index continue across calls); the engine
 * and its KV cache live for the call. The engine samples ahead of the callback, so the callback
 * must not read the sampler's state (a token event carries its logprob). */
#ifndef CI_ENGINE_GENERATE_H
#define CI_ENGINE_GENERATE_H

#include "io/generation_config.h"
#include "model/model.h"
#include "sample/sampler.h"

#include <stdint.h>

typedef enum {
  CI_FINISH_STOP,   /* an EOS id, or the callback asked to stop (stop string) */
  CI_FINISH_LENGTH, /* max_tokens sampled */
  CI_FINISH_ABORT   /* the callback returned < 0 (cancelled, output failed) */
} ci_finish_reason;

/* "stop", "length", "abort". */
const char *ci_finish_reason_name(ci_finish_reason reason);

/* Called once per sampled token that is not in the EOS set, in order. Returns 0 to continue,
 * > 0 to finish with CI_FINISH_STOP, < 0 to finish with CI_FINISH_ABORT. */
typedef int (*ci_token_callback)(void *ctx, int32_t id);

/* Where the sequence's KV codec plan comes from. */
typedef enum {
  CI_KV_PLAN_MODEL_CONFIG, /* the model's kv_config.json, if any (the default) */
  CI_KV_PLAN_NONE,         /* stay in kv_codec */
  CI_KV_PLAN_TARGET,       /* kv_target from kv_start */
} ci_kv_plan_source;

typedef struct {
  int max_tokens;            /* >= 1; counts every sampled token, EOS included */
  int prefill_chunk;         /* prompt tokens per prefill forward; 0 = 2048 */
  int ctx_size;              /* context limit; 0 = the model's max_position_embeddings */
  ci_kv_codec kv_codec;      /* storage the KV cache starts in (bf16, or f32) */
  ci_kv_plan_source kv_plan; /* which codec plan the sequence follows (docs/kv-cache.md §5, §7) */
  ci_kv_format kv_target;    /* CI_KV_PLAN_TARGET: convert to this ... */
  int64_t kv_start;          /* ... once the sequence holds this many tokens */
  int kv_protect;            /* CI_KV_PLAN_TARGET: the first and last N cache layers stay */
  const ci_eos_set *eos;     /* the EOS set E; NULL or empty = never stop on EOS (ignore_eos) */
  ci_token_callback on_token; /* may be NULL */
  void *ctx;                  /* passed to on_token */
} ci_generate_options;

typedef struct {
  int prompt_tokens;    /* P */
  int generated_tokens; /* g, EOS included */
  double prefill_seconds;
  double prefill_tok_s; /* P / prefill time */
  double decode_tok_s;  /* (g - 1) / (last token time - first token time); 0 when g < 2 */
  double ttft_seconds;  /* call start -> first token sampled */
  double total_seconds;
  int64_t peak_rss_bytes;
} ci_generate_stats;

typedef struct {
  int32_t *ids; /* [n_ids] every sampled token, a terminating EOS included; owned */
  int n_ids;
  ci_finish_reason finish;
  ci_generate_stats stats;
} ci_generate_result;

/* max_tokens 256, prefill_chunk 2048, ctx_size from the model, bf16 KV, no EOS, no callback. */
void ci_generate_options_default(ci_generate_options *options);

/* Runs prompt[0..n_prompt) through model and samples with `sampler` (its output index
 * continues from where it stands). Requires n_prompt >= 1, prompt ids < vocab and
 * n_prompt + max_tokens <= ctx_size. Returns CI_OK with *result filled, or CI_ERR with
 * ci_last_error (bad input, KV exhausted, forward failure); *result must be released with
 * ci_generate_result_free either way (after a failure it holds the tokens sampled before it). */
int ci_generate(ci_model *model, ci_sampler *sampler, const int32_t *prompt, int n_prompt,
                const ci_generate_options *options, ci_generate_result *result);

/* Frees result->ids. */
void ci_generate_result_free(ci_generate_result *result);

#endif
