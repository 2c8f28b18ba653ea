/* Single-sequence generation loop: chunked prefill, then decode until a finish condition
 * (see generate.h). */
#include "engine/generate.h"

#include "base/error.h"
#include "base/timing.h"

#include <stdlib.h>
#include <string.h>

enum { DEFAULT_PREFILL_CHUNK = 2048, KV_BLOCK_TOKENS = 16 };

static const char *const finish_names[] = {
    [CI_FINISH_STOP] = "stop", [CI_FINISH_LENGTH] = "length", [CI_FINISH_ABORT] = "abort"};

const char *ci_finish_reason_name(ci_finish_reason reason) {
  return reason <= CI_FINISH_ABORT ? finish_names[reason] : "?";
}

void ci_generate_options_default(ci_generate_options *o) {
  memset(o, 0, sizeof *o);
  o->max_tokens = 256;
  o->prefill_chunk = DEFAULT_PREFILL_CHUNK;
  o->kv_codec = CI_KV_BF16;
}

void ci_generate_result_free(ci_generate_result *result) {
  if (!result) return;
  free(result->ids);
  result->ids = NULL;
  result->n_ids = 0;
}

static int validate(const ci_model *model, const int32_t *prompt, int n_prompt,
                    const ci_generate_options *o) {
  const ci_model_spec *spec = &model->spec;
  if (n_prompt < 1) return ci_fail("the prompt is empty (at least one token needed)");
  for (int i = 0; i < n_prompt; i++)
    if (prompt[i] < 0 || prompt[i] >= spec->vocab)
      return ci_fail("prompt token id %d at index %d is out of range [0, %d)", (int)prompt[i], i,
                     spec->vocab);
  if (o->max_tokens < 1) return ci_fail("max_tokens must be >= 1");
  if (o->prefill_chunk < 0) return ci_fail("prefill chunk must be >= 1");
  const int64_t ctx = o->ctx_size > 0 ? o->ctx_size : spec->max_position;
  if ((int64_t)n_prompt + o->max_tokens > ctx)
    return ci_fail("prompt (%d tokens) + max_tokens (%d) exceeds the context size %lld", n_prompt,
                   o->max_tokens, (long long)ctx);
  return CI_OK;
}

/* Prefill prompt[0..n) in chunks; the last chunk writes the logits of its last row. */
static int prefill(ci_model *model, ci_kv_seq *seq, const int32_t *prompt, int n, int chunk,
                   float *logits) {
  for (int start = 0; start < n; start += chunk) {
    const int len = n - start < chunk ? n - start : chunk;
    const int last = start + len == n;
    if (ci_model_forward(model, seq, prompt + start, len, last ? logits : NULL, 1))
      return ci_fail_context("prefill of prompt tokens [%d, %d)", start, start + len);
  }
  return CI_OK;
}

int ci_generate(ci_model *model, ci_sampler *sampler, const int32_t *prompt, int n_prompt,
                const ci_generate_options *o, ci_generate_result *result) {
  memset(result, 0, sizeof *result);
  const double t_start = ci_now_seconds();
  if (validate(model, prompt, n_prompt, o)) return CI_ERR;
  const int vocab = model->spec.vocab;
  const int chunk = o->prefill_chunk > 0 ? o->prefill_chunk : DEFAULT_PREFILL_CHUNK;
  int status = CI_ERR;
  ci_kv_cache *cache =
      ci_model_kv_cache_create_protected(model, o->kv_codec, KV_BLOCK_TOKENS, 0, o->kv_protect);
  ci_kv_seq *seq = cache ? ci_kv_seq_create(cache) : NULL;
  if (seq && (o->kv_plan == CI_KV_PLAN_TARGET
                  ? ci_kv_seq_set_plan_protected(seq, &o->kv_target, o->kv_start, o->kv_protect)
              : o->kv_plan == CI_KV_PLAN_MODEL_CONFIG ? ci_model_kv_seq_apply_config(model, seq)
                                                      : CI_OK)) {
    ci_kv_seq_free(seq);
    seq = NULL;
  }
  float *logits = malloc((size_t)vocab * sizeof *logits);
  /* history = prompt + sampled tokens, the window the penalties look at */
  int32_t *history = malloc(((size_t)n_prompt + (size_t)o->max_tokens) * sizeof *history);
  result->ids = malloc((size_t)o->max_tokens * sizeof *result->ids);
  if (!seq || !logits || !history || !result->ids) {
    if (seq) ci_fail("out of memory for generation buffers");
    goto done;
  }
  memcpy(history, prompt, (size_t)n_prompt * sizeof *history);
  size_t n_history = (size_t)n_prompt;

  const double t_prefill = ci_now_seconds();
  if (prefill(model, seq, prompt, n_prompt, chunk, logits)) goto done;
  const double t_prefilled = ci_now_seconds();

  double t_first = 0.0, t_last = 0.0;
  for (;;) {
    /* docs/generation.md §3: sample, count, then EOS > callback (stop strings) > length. */
    const int32_t token = ci_sampler_next(sampler, logits, history, n_history);
    if (token < 0) goto done;
    t_last = ci_now_seconds();
    if (result->n_ids == 0) t_first = t_last;
    history[n_history++] = token;
    result->ids[result->n_ids++] = token;
    if (o->eos && ci_eos_set_contains(o->eos, token)) {
      result->finish = CI_FINISH_STOP;
      break;
    }
    const int verdict = o->on_token ? o->on_token(o->ctx, token) : 0;
    if (verdict != 0) {
      result->finish = verdict > 0 ? CI_FINISH_STOP : CI_FINISH_ABORT;
      break;
    }
    if (result->n_ids == o->max_tokens) {
      result->finish = CI_FINISH_LENGTH;
      break;
    }
    if (ci_model_forward(model, seq, &token, 1, logits, 1)) {
      ci_fail_context("decode step %d", result->n_ids);
      goto done;
    }
  }
  status = CI_OK;

  ci_generate_stats *st = &result->stats;
  st->prompt_tokens = n_prompt;
  st->generated_tokens = result->n_ids;
  st->prefill_seconds = t_prefilled - t_prefill;
  st->prefill_tok_s = st->prefill_seconds > 0 ? n_prompt / st->prefill_seconds : 0.0;
  st->decode_tok_s =
      result->n_ids > 1 && t_last > t_first ? (result->n_ids - 1) / (t_last - t_first) : 0.0;
  st->ttft_seconds = t_first - t_start;
  st->total_seconds = ci_now_seconds() - t_start;
  st->peak_rss_bytes = ci_peak_rss_bytes();
done:
  free(history);
  free(logits);
  ci_kv_seq_free(seq);
  ci_kv_cache_free(cache);
  return status;
}
