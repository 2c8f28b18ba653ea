/* Public API sessions: one sequence fed and sampled on the caller's thread, over ci_session
 * (engine/session.h) and a sampler. The sequence's tokens are kept here; a sampled token is run
 * through the model only when the next one is asked for (or more ids are fed), so generation
 * costs exactly what ci_generate costs and gives the same tokens. */
#include "api/api_internal.h"

#include "base/error.h"
#include "base/timing.h"
#include "engine/draft_model.h"
#include "engine/finish_rule.h"
#include "engine/lookup.h"
#include "engine/session.h"
#include "kv/reservation.h"
#include "sample/logprobs.h"
#include "grammar/matcher.h"
#include "sample/spec_verify.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

enum {
  DEFAULT_PREFILL_CHUNK = 2048,
  DEFAULT_DRAFT_MAX = 5,
  MAX_DRAFT = 32,
  DRAFT_BLOCK_TOKENS = 16
};

struct cinfer_session {
  cinfer_model *model; /* not owned */
  ci_api_resolved params;
  int context_size;
  int prefill_chunk;
  int vocab;
  ci_session *seq;     /* owned: the KV cache and sequence */
  ci_lora *lora;       /* a reference to the adapter every feed applies; NULL without one */
  ci_sampler *sampler; /* owned */
  int32_t *tokens;     /* [n_tokens] fed and sampled ids; owned */
  size_t n_tokens, cap;
  size_t n_run;       /* tokens[0..n_run) are in the KV cache */
  float *logits;      /* [vocab] raw logits after tokens[n_run - 1]; owned */
  int has_logits;     /* logits are those of the current n_run */
  float *scratch;     /* [vocab] the sampler's working copy; owned */
  size_t n_generated; /* sampled in the current turn */

  ci_grammar *grammar;             /* owned reference; NULL when unconstrained */
  ci_grammar_vocab *grammar_vocab; /* the model's */
  ci_grammar_matcher *matcher;     /* owned: the current turn's, created at its first step */

  cinfer_finish finish;
  atomic_int cancelled;
  int has_sampled;         /* the sampler's log-probabilities are those of the last step's token */
  size_t n_synthetic;      /* positions before tokens[0] filled by cinfer_session_fill_synthetic */
  int max_tokens_explicit; /* the prompt plus max_tokens must fit the context */
  /* The current turn's timings (cinfer_session_timings). */
  int turn_open; /* fed since the last step: a later feed adds to the turn's prompt */
  int turn_prompt_tokens;
  double turn_start, prefill_seconds, first_token_at, last_token_at;
  const float *lp; /* lp of the token sampled last (the sampler's, or a queued token's copy) */
  /* Speculative decoding (docs/generation.md §6), by prompt lookup or a draft model: a round's
   * emitted tokens wait in spec_queue and come out one per step while the KV round stays open;
   * it closes when the queue drains, or earlier on a feed (keeping what was handed out). */
  int lookup_ngram, spec_max, spec_min, spec_len;
  ci_model *draft_model;    /* borrowed (params.draft_model); NULL = prompt lookup */
  ci_kv_cache *draft_cache; /* owned: the draft model's KV (bf16) */
  ci_draft_state draft;     /* its sequence (a prefix of tokens), sampler and q rows */
  int64_t spec_draft_keep;  /* positions the draft keeps when the open round closes */
  ci_spec_scratch spec_scratch;
  float *spec_rows; /* [(spec_max + 1) * vocab] the verify rows' logits */
  float *spec_lp;   /* [(spec_max + 1) * vocab] lp of each queued token */
  int32_t spec_queue[MAX_DRAFT + 1];
  int spec_n_queue, spec_popped;
  size_t spec_n_run0; /* n_run before the open round */
  int64_t spec_kv0;   /* KV positions before the open round */
  int turn_drafted, turn_accepted;
};

/* Gives the session a draft model: its KV cache and a draft state seeded with the session's
 * seed (drawn from the sampler's own, so that a seeded session drafts the same way each run). */
static cinfer_status draft_open(cinfer_session *s, ci_model *draft) {
  s->draft_model = draft;
  s->draft_cache = ci_model_kv_cache_create(draft, CI_KV_BF16, DRAFT_BLOCK_TOKENS, 0);
  /* a device backend needs the draft sequence's KV memory up front (one bf16 format) */
  if (!s->draft_cache || ci_kv_cache_reserve_device(s->draft_cache, 1, s->context_size,
                                                    ci_kv_format_plain(CI_KV_BF16), s->spec_max, 1))
    return ci_api_fail(CINFER_ERROR, "draft model: %s", ci_last_error());
  if (ci_draft_state_init(&s->draft, draft, s->draft_cache, &s->params.sampling,
                          ci_sampler_seed(s->sampler), s->spec_max))
    return ci_api_fail(CINFER_ERROR, "%s", ci_last_error());
  return CINFER_OK;
}

/* A sampler for the session's parameters with `seed` (keeps the drawn seed across resets). */
static ci_sampler *new_sampler(const cinfer_session *s, const uint64_t *seed) {
  ci_sampler_params params = s->params.sampling;
  if (seed) {
    params.seed = *seed;
    params.has_seed = 1;
  }
  return ci_sampler_create(&params, s->vocab);
}

cinfer_status cinfer_session_create(cinfer_model *model, const cinfer_params *params,
                                    cinfer_session **out) {
  if (!out) return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_session_create: out is NULL");
  *out = NULL;
  if (!model) return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_session_create: model is NULL");
  cinfer_params defaults;
  if (!params) {
    cinfer_params_init(&defaults, model);
    params = &defaults;
  }
  cinfer_session *s = calloc(1, sizeof *s);
  if (!s) return ci_api_fail(CINFER_ERROR, "out of memory for a session");
  s->model = model;
  s->vocab = ci_model_vocab_size(model->model);
  cinfer_status status = ci_api_resolve(model, params, &s->params);
  if (status != CINFER_OK) {
    cinfer_session_free(s);
    return status;
  }
  status = ci_api_grammar(model, params, CINFER_INVALID_ARGUMENT, &s->grammar, &s->grammar_vocab);
  if (status != CINFER_OK) {
    cinfer_session_free(s);
    return status;
  }
  s->context_size =
      params->context_size > 0 ? params->context_size : ci_model_context_length(model->model);
  s->prefill_chunk = params->prefill_chunk > 0 ? params->prefill_chunk : DEFAULT_PREFILL_CHUNK;
  s->max_tokens_explicit = params->max_tokens_explicit;
  ci_session_options options;
  ci_session_options_default(&options);
  options.kv_codec = s->params.kv_base;
  options.kv_plan = s->params.kv_plan;
  options.kv_target = s->params.kv_target;
  options.kv_start = s->params.kv_start;
  options.kv_protect = s->params.kv_protect;
  options.max_tokens = s->context_size;
  options.lora = s->lora = ci_lora_retain(s->params.lora);
  s->seq = ci_session_create(model->model, &options);
  s->sampler = s->seq ? new_sampler(s, NULL) : NULL;
  s->logits = malloc((size_t)s->vocab * sizeof *s->logits);
  s->scratch = malloc((size_t)s->vocab * sizeof *s->scratch);
  if (params->draft_model &&
      ci_model_vocab_size(params->draft_model->model) != ci_model_vocab_size(model->model)) {
    ci_api_fail(CINFER_INVALID_ARGUMENT,
                "the draft model has %d tokens in its vocabulary, the model %d (a draft model "
                "must share the model's tokenizer)",
                ci_model_vocab_size(params->draft_model->model), ci_model_vocab_size(model->model));
    cinfer_session_free(s);
    return CINFER_INVALID_ARGUMENT;
  }
  /* XTC makes the filtered distribution random: such sessions never speculate */
  if ((params->lookup_ngram > 0 || params->draft_model) &&
      s->params.sampling.xtc_probability == 0.0f && s->seq && s->sampler) {
    s->lookup_ngram = params->lookup_ngram;
    s->spec_max = params->draft_max > 0 ? params->draft_max : DEFAULT_DRAFT_MAX;
    s->spec_min = params->draft_min > 0 ? params->draft_min : 1;
    if (s->spec_min > s->spec_max) s->spec_min = s->spec_max;
    s->spec_len = s->spec_max;
    const size_t rows = (size_t)(s->spec_max + 1) * (size_t)s->vocab;
    s->spec_rows = malloc(rows * sizeof *s->spec_rows);
    s->spec_lp = malloc(rows * sizeof *s->spec_lp);
    if (!s->spec_rows || !s->spec_lp || ci_spec_scratch_init(&s->spec_scratch, s->vocab)) {
      ci_fail("out of memory for a session");
      cinfer_session_free(s);
      return CINFER_ERROR;
    }
    ci_kv_seq_set_rollback_reserve(ci_session_kv_seq(s->seq), s->spec_max);
    if (params->draft_model && draft_open(s, params->draft_model->model) != CINFER_OK) {
      cinfer_session_free(s);
      return CINFER_ERROR;
    }
  }
  if (!s->seq || !s->sampler || !s->logits || !s->scratch) {
    if (s->seq && s->sampler) ci_fail("out of memory for a session");
    cinfer_session_free(s);
    return CINFER_ERROR;
  }
  atomic_init(&s->cancelled, 0);
  *out = s;
  return CINFER_OK;
}

void cinfer_session_free(cinfer_session *session) {
  if (!session) return;
  ci_session_free(session->seq);
  ci_lora_release(session->lora);
  ci_sampler_free(session->sampler);
  ci_grammar_matcher_free(session->matcher);
  ci_grammar_free(session->grammar);
  free(session->tokens);
  free(session->logits);
  free(session->scratch);
  free(session->spec_rows);
  free(session->spec_lp);
  ci_spec_scratch_free(&session->spec_scratch);
  ci_draft_state_free(&session->draft);
  ci_kv_cache_free(session->draft_cache);
  free(session);
}

/* Closes the draft model's open round (if any): it keeps what it drafted from and the accepted
 * drafts it has seen, never more than the tokens handed out so far (its positions stay a prefix
 * of tokens). */
static cinfer_status draft_close(cinfer_session *s) {
  if (!s->draft_model || !s->draft.seq) return CINFER_OK;
  const int64_t keep =
      s->spec_draft_keep < (int64_t)s->n_tokens ? s->spec_draft_keep : (int64_t)s->n_tokens;
  return ci_draft_state_keep(&s->draft, keep) ? CINFER_ERROR : CINFER_OK;
}

/* Closes an open speculative round keeping what was handed out: the KV keeps the round's first
 * token and the handed-out tokens but the last (which is pending, as after any step). */
static cinfer_status spec_close(cinfer_session *s) {
  if (s->spec_n_queue == 0) return CINFER_OK;
  ci_kv_seq *seq = ci_session_kv_seq(s->seq);
  const int kept = s->spec_popped > 0 ? s->spec_popped : 1;
  s->spec_n_queue = s->spec_popped = 0;
  s->n_run = s->spec_n_run0 + (size_t)kept;
  s->has_logits = 0;
  cinfer_status status = draft_close(s);
  if (seq && ci_kv_seq_round_close(seq, s->spec_kv0 + kept)) status = CINFER_ERROR;
  return status;
}

/* Makes room for `room` tokens in all. */
static cinfer_status reserve_tokens(cinfer_session *s, size_t room) {
  if (room <= s->cap) return CINFER_OK;
  size_t cap = s->cap ? s->cap : 256;
  while (cap < room) cap *= 2;
  int32_t *bigger = realloc(s->tokens, cap * sizeof *bigger);
  if (!bigger) return ci_api_fail(CINFER_ERROR, "out of memory for %zu tokens", cap);
  s->tokens = bigger;
  s->cap = cap;
  return CINFER_OK;
}

/* Appends ids to tokens (not yet run). */
static cinfer_status append_tokens(cinfer_session *s, const int32_t *ids, size_t n) {
  if (reserve_tokens(s, s->n_tokens + n) != CINFER_OK) return CINFER_ERROR;
  memcpy(s->tokens + s->n_tokens, ids, n * sizeof *ids);
  s->n_tokens += n;
  return CINFER_OK;
}

/* Runs tokens[n_run..n_tokens) through the model in prefill chunks. The last n_rows of them give
 * logits into rows (when non-NULL); the last one's are also kept in s->logits. On failure the
 * tokens not run are dropped. */
static cinfer_status run_pending(cinfer_session *s, float *rows, size_t n_rows) {
  const size_t total = s->n_tokens - s->n_run;
  const size_t wanted = rows ? n_rows : 1; /* rows of the last `wanted` tokens */
  const size_t first_row = total - wanted;
  for (size_t start = 0; start < total;) {
    const size_t len =
        total - start < (size_t)s->prefill_chunk ? total - start : (size_t)s->prefill_chunk;
    const size_t end = start + len;
    float *dest = NULL;
    int n_logit_rows = 0;
    if (end > first_row) {
      const size_t from = start > first_row ? start : first_row;
      n_logit_rows = (int)(end - from);
      dest = rows ? rows + (from - first_row) * (size_t)s->vocab : s->logits;
    }
    if (ci_session_feed(s->seq, s->tokens + s->n_run, (int)len, dest, n_logit_rows)) {
      s->n_tokens = s->n_run;
      s->has_logits = 0;
      return CINFER_ERROR;
    }
    s->n_run += len;
    start = end;
  }
  if (rows)
    memcpy(s->logits, rows + (wanted - 1) * (size_t)s->vocab, (size_t)s->vocab * sizeof *s->logits);
  s->has_logits = 1;
  return CINFER_OK;
}

cinfer_status cinfer_session_feed(cinfer_session *session, const int32_t *ids, size_t n_ids,
                                  float *logits, size_t n_logit_rows) {
  if (!session || !ids || n_ids == 0)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_session_feed: no ids");
  if (logits && (n_logit_rows < 1 || n_logit_rows > n_ids))
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "n_logit_rows %zu out of range [1, %zu]",
                       n_logit_rows, n_ids);
  for (size_t i = 0; i < n_ids; i++)
    if (ids[i] < 0 || ids[i] >= session->vocab)
      return ci_api_fail(CINFER_INVALID_ARGUMENT,
                         "token id %d at index %zu is out of range "
                         "[0, %d)",
                         (int)ids[i], i, session->vocab);
  if (session->n_synthetic + session->n_tokens + n_ids > (size_t)session->context_size)
    return ci_api_fail(CINFER_ERROR, "%zu tokens + %zu new exceed the context size %d",
                       session->n_synthetic + session->n_tokens, n_ids, session->context_size);
  const double start = ci_now_seconds();
  session->has_sampled = 0;
  if (!session->turn_open) {
    session->turn_open = 1;
    session->turn_prompt_tokens = 0;
    session->turn_start = start;
    session->prefill_seconds = session->first_token_at = session->last_token_at = 0;
    session->turn_drafted = session->turn_accepted = 0;
  }
  session->finish = CINFER_FINISH_NONE;
  session->n_generated = 0;
  ci_grammar_matcher_free(session->matcher); /* the grammar restarts with the turn */
  session->matcher = NULL;
  atomic_store(&session->cancelled, 0);
  if (spec_close(session) != CINFER_OK) return CINFER_ERROR;
  if (append_tokens(session, ids, n_ids) != CINFER_OK) return CINFER_ERROR;
  const cinfer_status status = run_pending(session, logits, n_logit_rows);
  session->prefill_seconds += ci_now_seconds() - start;
  if (status == CINFER_OK) session->turn_prompt_tokens += (int)n_ids;
  return status;
}

cinfer_status cinfer_session_feed_text(cinfer_session *session, const char *text, int add_special) {
  if (!session || !text)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_session_feed_text: NULL argument");
  int32_t *ids = NULL;
  size_t n = 0;
  cinfer_status status = cinfer_tokenize(session->model, text, strlen(text), add_special, &ids, &n);
  if (status == CINFER_OK && n == 0)
    status = ci_api_fail(CINFER_INVALID_ARGUMENT, "the text encodes to no tokens");
  if (status == CINFER_OK) status = cinfer_session_feed(session, ids, n, NULL, 0);
  free(ids);
  return status;
}

/* Ends the turn with `reason`; returns CINFER_DONE with *token = -1. */
static cinfer_status finish(cinfer_session *s, cinfer_finish reason, int32_t *token) {
  if (s->finish == CINFER_FINISH_NONE) s->finish = reason;
  *token = -1;
  return CINFER_DONE;
}

/* One speculative round after a pending sampled token x (tokens[n_tokens - 1], not yet in the
 * KV): prompt lookup or the draft model drafts d_1 .. d_k from the tokens so far, [x, d_1 .. d_k]
 * run in one forward inside an open KV round, and verification (greedy match or rejection sampling,
 * spec_verify.h) fills spec_queue with the accepted drafts and the next token, cut at a finishing
 * token. No draft (or no room): the queue stays empty and the step decodes one token as usual. */
static cinfer_status spec_round(cinfer_session *s) {
  ci_kv_seq *seq = ci_session_kv_seq(s->seq);
  if (!seq) return CINFER_OK;
  int64_t k = s->spec_len;
  const int64_t left = (int64_t)s->params.max_tokens - (int64_t)s->n_generated - 1;
  const int64_t room = (int64_t)s->context_size - (int64_t)(s->n_synthetic + s->n_tokens) - 1;
  const int64_t limit = ci_kv_seq_chunk_limit(seq); /* no round past a pending conversion */
  if (k > left) k = left;
  if (k > room) k = room;
  if (limit != INT64_MAX && k > limit - 1) k = limit - 1;
  if (k <= 0) return CINFER_OK;
  /* the drafts go right after the tokens (not counted): the processors' history of a verify
   * position is the tokens plus the drafts before it */
  if (reserve_tokens(s, s->n_tokens + (size_t)k) != CINFER_OK) return CINFER_ERROR;
  int32_t *drafts = s->tokens + s->n_tokens;
  const uint64_t base = ci_sampler_index(s->sampler);
  int n_drafts;
  if (s->draft_model) {
    n_drafts = ci_draft_propose(&s->draft, s->tokens, (int64_t)s->n_tokens, (int)k, base, drafts);
    s->spec_draft_keep = (int64_t)s->n_tokens; /* until verification says more */
    if (n_drafts < 0) {
      ci_api_fail(CINFER_ERROR, "speculative drafting: %s", ci_last_error());
      draft_close(s);
      return CINFER_ERROR;
    }
  } else
    n_drafts = ci_lookup_draft(s->tokens, (int64_t)s->n_tokens, s->lookup_ngram, 1, (int)k, drafts);
  if (n_drafts == 0) return CINFER_OK;
  s->spec_kv0 = seq->n;
  s->spec_n_run0 = s->n_run;
  if (ci_kv_seq_round_open(seq, n_drafts + 1)) {
    draft_close(s);
    return CINFER_ERROR;
  }
  s->spec_n_queue = 1; /* the round is open: spec_close closes it on any exit below */
  s->spec_popped = 0;
  if (ci_session_feed(s->seq, s->tokens + s->n_tokens - 1, n_drafts + 1, s->spec_rows,
                      n_drafts + 1)) {
    s->spec_n_queue = 0;
    ci_kv_seq_round_close(seq, seq->n);
    draft_close(s);
    s->has_logits = 0;
    return CINFER_ERROR;
  }
  const float *q = s->draft_model ? s->draft.q : NULL;
  const size_t v = (size_t)s->vocab;
  int m = 0, accepted = 0;
  for (int j = 0; j <= n_drafts; j++) {
    float *row = s->spec_rows + (size_t)j * v;
    int ok = 0;
    int32_t t;
    if (j < n_drafts)
      t = ci_spec_verify(s->sampler, &s->spec_scratch, row, s->tokens, s->n_tokens + (size_t)j,
                         base + (uint64_t)j, drafts[j], q ? q + (size_t)j * v : NULL, &ok);
    else
      t = ci_sampler_sample_at(s->sampler, row, s->tokens, s->n_tokens + (size_t)j,
                               base + (uint64_t)j);
    if (t < 0) {
      spec_close(s);
      return CINFER_ERROR;
    }
    memcpy(s->spec_lp + (size_t)j * v, ci_sampler_logprobs(s->sampler), v * sizeof(float));
    s->spec_queue[m++] = t;
    accepted += ok;
    ci_finish_reason reason;
    if (ci_generation_ends(&s->params.eos, t, (int64_t)s->n_generated + m, s->params.max_tokens,
                           &reason) ||
        !ok)
      break;
  }
  ci_sampler_advance(s->sampler, (uint64_t)m);
  s->spec_n_queue = m;
  s->has_logits = 0;
  s->turn_drafted += n_drafts;
  s->turn_accepted += accepted;
  /* the draft keeps the context it drafted from and the accepted drafts it has seen */
  s->spec_draft_keep = (int64_t)s->n_tokens + (accepted < n_drafts - 1 ? accepted : n_drafts - 1);
  /* adapt: all accepted -> one more next time; else the accepted length plus one */
  if (accepted == n_drafts)
    s->spec_len = s->spec_len < s->spec_max ? s->spec_len + 1 : s->spec_max;
  else
    s->spec_len = accepted + 1 > s->spec_min ? accepted + 1 : s->spec_min;
  if (s->spec_len > s->spec_max) s->spec_len = s->spec_max;
  return CINFER_OK;
}

cinfer_status cinfer_session_step(cinfer_session *session, int32_t *token) {
  if (!session || !token)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_session_step: NULL argument");
  cinfer_session *s = session;
  *token = -1;
  if (atomic_load(&s->cancelled)) {
    s->finish = CINFER_FINISH_CANCEL;
    return ci_api_fail(CINFER_CANCELLED, "the session was cancelled");
  }
  if (s->finish != CINFER_FINISH_NONE) return CINFER_DONE;
  if (s->n_tokens == 0)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "nothing to continue: feed a prompt first");
  if (s->n_generated == 0 && s->max_tokens_explicit &&
      s->n_synthetic + s->n_tokens + (size_t)s->params.max_tokens > (size_t)s->context_size)
    return ci_api_fail(CINFER_INVALID_ARGUMENT,
                       "the prompt (%zu tokens) + max_tokens (%d) exceeds the context size %d",
                       s->n_tokens, s->params.max_tokens, s->context_size);
  s->turn_open = 0;
  if (s->n_generated >= (size_t)s->params.max_tokens ||
      s->n_synthetic + s->n_tokens >= (size_t)s->context_size)
    return finish(s, CINFER_FINISH_LENGTH, token);
  /* a grammar-constrained session does not speculate (drafts are not masked) */
  if (s->spec_max > 0 && !s->grammar && s->spec_n_queue == 0 && s->n_tokens > 0 &&
      s->n_run + 1 == s->n_tokens) {
    s->has_sampled = 0;
    if (spec_round(s) != CINFER_OK) return CINFER_ERROR;
  }
  int32_t next;
  if (s->spec_n_queue > 0) { /* a speculative round's tokens, one per step */
    next = s->spec_queue[s->spec_popped];
    s->lp = s->spec_lp + (size_t)s->spec_popped * (size_t)s->vocab;
    s->spec_popped++;
    if (s->spec_popped == s->spec_n_queue && spec_close(s) != CINFER_OK) return CINFER_ERROR;
  } else {
    if (s->n_run < s->n_tokens && run_pending(s, NULL, 0) != CINFER_OK) return CINFER_ERROR;
    if (!s->has_logits)
      return ci_api_fail(CINFER_ERROR,
                         "no logits to sample from (a feed failed): reset the session");
    if (atomic_load(&s->cancelled)) {
      s->finish = CINFER_FINISH_CANCEL;
      return ci_api_fail(CINFER_CANCELLED, "the session was cancelled");
    }
    /* docs/generation.md §3: sample, count, then the finish rule (EOS > length). */
    memcpy(s->scratch, s->logits, (size_t)s->vocab * sizeof *s->scratch);
    if (s->grammar) { /* the grammar mask (processor 5 of §4.2) */
      if (!s->matcher && !(s->matcher = ci_grammar_matcher_create(s->grammar, s->grammar_vocab)))
        return ci_api_fail(CINFER_ERROR, "%s", ci_last_error());
      const int allowed =
          ci_grammar_matcher_apply(s->matcher, s->scratch, s->params.eos.ids, s->params.eos.n);
      if (allowed < 0) return ci_api_fail(CINFER_ERROR, "%s", ci_last_error());
      if (allowed == 0) {
        if (!ci_grammar_matcher_is_complete(s->matcher))
          return ci_api_fail(CINFER_ERROR, "the grammar allows no token of the vocabulary here");
        return finish(s, CINFER_FINISH_STOP, token); /* complete, and nothing may follow */
      }
    }
    s->has_sampled = 0; /* the sampler's log-probabilities change now */
    next = ci_sampler_next(s->sampler, s->scratch, s->tokens, s->n_tokens);
    if (next < 0) return CINFER_ERROR;
    s->lp = ci_sampler_logprobs(s->sampler);
  }
  s->has_sampled = 1;
  if (s->matcher && !ci_eos_set_contains(&s->params.eos, next) &&
      ci_grammar_matcher_accept_token(s->matcher, next))
    return ci_api_fail(CINFER_ERROR, "%s", ci_last_error());
  if (append_tokens(s, &next, 1) != CINFER_OK) return CINFER_ERROR;
  s->last_token_at = ci_now_seconds();
  if (s->n_generated == 0) s->first_token_at = s->last_token_at;
  s->n_generated++;
  *token = next;
  ci_finish_reason reason;
  if (!ci_generation_ends(&s->params.eos, next, (int64_t)s->n_generated, s->params.max_tokens,
                          &reason))
    return CINFER_OK;
  s->finish = reason == CI_FINISH_STOP ? CINFER_FINISH_STOP : CINFER_FINISH_LENGTH;
  return reason == CI_FINISH_STOP ? CINFER_DONE : CINFER_OK; /* EOS comes back with DONE */
}

cinfer_status cinfer_session_generate(cinfer_session *session, cinfer_token_callback on_token,
                                      void *user) {
  for (;;) {
    int32_t token;
    const cinfer_status status = cinfer_session_step(session, &token);
    if (status == CINFER_DONE) return CINFER_OK;
    if (status != CINFER_OK) return status;
    if (on_token && on_token(user, token) != 0) {
      session->finish = CINFER_FINISH_STOP;
      return CINFER_OK;
    }
  }
}

void cinfer_session_cancel(cinfer_session *session) {
  if (session) atomic_store(&session->cancelled, 1);
}

cinfer_finish cinfer_session_finish_reason(const cinfer_session *session) {
  return session ? session->finish : CINFER_FINISH_NONE;
}

const int32_t *cinfer_session_tokens(const cinfer_session *session, size_t *n_tokens) {
  if (n_tokens) *n_tokens = session ? session->n_tokens : 0;
  return session ? session->tokens : NULL;
}

size_t cinfer_session_n_generated(const cinfer_session *session) {
  return session ? session->n_generated : 0;
}

const float *cinfer_session_logits(const cinfer_session *session) {
  return session && session->has_logits ? session->logits : NULL;
}

cinfer_status cinfer_session_reset(cinfer_session *session) {
  if (!session) return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_session_reset: NULL session");
  const uint64_t seed = ci_sampler_seed(session->sampler);
  ci_sampler *sampler = new_sampler(session, &seed);
  if (!sampler) return CINFER_ERROR;
  ci_sampler_free(session->sampler);
  session->sampler = sampler;
  session->spec_n_queue = session->spec_popped = 0; /* the sequence goes, round and all */
  session->spec_len = session->spec_max;
  session->n_tokens = session->n_run = session->n_generated = session->n_synthetic = 0;
  ci_grammar_matcher_free(session->matcher);
  session->matcher = NULL;
  session->has_logits = 0;
  session->finish = CINFER_FINISH_NONE;
  session->turn_open = 0;
  session->has_sampled = 0;
  atomic_store(&session->cancelled, 0);
  if (ci_session_reset(session->seq)) return CINFER_ERROR;
  if (session->spec_max > 0)
    ci_kv_seq_set_rollback_reserve(ci_session_kv_seq(session->seq), session->spec_max);
  if (session->draft_model) { /* a new draft sequence, seeded as the new sampler */
    ci_draft_state_free(&session->draft);
    if (ci_draft_state_init(&session->draft, session->draft_model, session->draft_cache,
                            &session->params.sampling, seed, session->spec_max))
      return ci_api_fail(CINFER_ERROR, "%s", ci_last_error());
  }
  return CINFER_OK;
}

cinfer_status cinfer_session_timings(const cinfer_session *session, cinfer_timings *timings) {
  if (!session || !timings)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_session_timings: NULL argument");
  const cinfer_session *s = session;
  memset(timings, 0, sizeof *timings);
  timings->prompt_tokens = s->turn_prompt_tokens;
  timings->generated_tokens = (int)s->n_generated;
  timings->draft_tokens = s->turn_drafted;
  timings->accepted_tokens = s->turn_accepted;
  timings->prefill_seconds = s->prefill_seconds;
  if (s->prefill_seconds > 0) timings->prefill_tok_s = s->turn_prompt_tokens / s->prefill_seconds;
  if (s->n_generated > 0) {
    timings->ttft_seconds = s->first_token_at - s->turn_start;
    timings->decode_seconds = s->last_token_at - s->first_token_at;
  }
  if (s->n_generated > 1 && timings->decode_seconds > 0)
    timings->decode_tok_s = (double)(s->n_generated - 1) / timings->decode_seconds;
  return CINFER_OK;
}

cinfer_status cinfer_session_logprobs(const cinfer_session *session, int k, float *logprob,
                                      int32_t *top_ids, float *top_logprobs, int *n_top) {
  if (n_top) *n_top = 0;
  if (!session || k < 0 || k > CINFER_MAX_TOP_LOGPROBS || (k > 0 && (!top_ids || !top_logprobs)))
    return ci_api_fail(CINFER_INVALID_ARGUMENT,
                       "cinfer_session_logprobs: k must be in [0, %d] with room for k entries",
                       CINFER_MAX_TOP_LOGPROBS);
  const float *lp = session->has_sampled ? session->lp : NULL;
  if (!lp)
    return ci_api_fail(CINFER_INVALID_ARGUMENT,
                       "no log-probabilities: the last call was not a step that sampled a token");
  if (logprob) *logprob = lp[session->tokens[session->n_tokens - 1]];
  ci_logprob top[CINFER_MAX_TOP_LOGPROBS];
  const int n = ci_logprobs_top(lp, session->vocab, k, top);
  for (int i = 0; i < n; i++) {
    top_ids[i] = top[i].id;
    top_logprobs[i] = top[i].logprob;
  }
  if (n_top) *n_top = n;
  return CINFER_OK;
}

uint64_t cinfer_session_seed(const cinfer_session *session) {
  return session ? ci_sampler_seed(session->sampler) : 0;
}

int64_t cinfer_session_kv_bytes(const cinfer_session *session) {
  return session ? ci_session_kv_bytes_used(session->seq) : 0;
}

cinfer_status cinfer_session_fill_synthetic(cinfer_session *session, int64_t n_positions,
                                            uint64_t seed) {
  if (!session)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_session_fill_synthetic: NULL session");
  if (n_positions < 0)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "n_positions must be >= 0 (got %lld)",
                       (long long)n_positions);
  if (session->n_tokens != 0 || ci_session_position(session->seq) != 0)
    return ci_api_fail(CINFER_INVALID_ARGUMENT,
                       "synthetic positions go into an empty session only (reset it first)");
  if (n_positions > session->context_size)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "%lld positions exceed the context size %d",
                       (long long)n_positions, session->context_size);
  if (ci_session_fill_synthetic(session->seq, n_positions, seed)) return CINFER_ERROR;
  session->n_synthetic = (size_t)n_positions;
  return CINFER_OK;
}
