/* A session: one sequence over a loaded model, run synchronously on the caller's thread. It owns
 * its KV cache (laid out for the model, with the codec plan of its options) and its sequence;
 * `feed` runs token ids through the model (ci_model_forward, which splits a step at a pending
 * KV conversion) and can hand back the logits of the last rows. The verbs that score or time one
 * sequence (logits, perplexity, kv-quality, bench) and the public C API's sessions use it.
 *
 * Ownership: the caller owns the model, which must outlive the session; the session owns its
 * cache and sequence. One thread at a time may use a session. */
#ifndef CI_ENGINE_SESSION_H
#define CI_ENGINE_SESSION_H

#include "engine/generate.h"
#include "engine/model_open.h"
#include "tensor/kv_format.h"

#include <stdint.h>

typedef struct ci_session ci_session;

typedef struct {
  ci_kv_codec kv_codec;       /* storage the sequence starts in (bf16, or f32) */
  ci_kv_plan_source kv_plan;  /* which codec plan it follows (docs/kv-cache.md §5, §7) */
  ci_kv_format kv_target;     /* CI_KV_PLAN_TARGET: convert to this ... */
  int64_t kv_start;           /* ... once the sequence holds this many tokens */
  int kv_protect;             /* the first and last N cache layers get groups of their own and
                                 (CI_KV_PLAN_TARGET) stay in kv_codec */
  int64_t max_tokens;         /* feed fails beyond this many positions; 0 = no limit */
  const struct ci_lora *lora; /* LoRA adapter applied to every feed (borrowed: it must outlive
                                 the session); NULL = none */
} ci_session_options;

/* bf16 KV, the model's kv_config.json plan (if any), no protected layers, no position limit. */
void ci_session_options_default(ci_session_options *options);

/* Creates a session over `model` with an empty sequence that follows the options' plan. Returns
 * NULL with ci_last_error (a plan the model cannot use, out of memory). */
ci_session *ci_session_create(ci_model *model, const ci_session_options *options);

/* Frees the session's sequence and cache. NULL is a no-op. */
void ci_session_free(ci_session *session);

/* The model the session runs. */
ci_model *ci_session_model(const ci_session *session);

/* Runs ids[0..n) (n >= 1, each in [0, vocab)) at positions position() .. position()+n-1 and
 * stores their K/V. When logits is non-NULL it receives [n_logit_rows, vocab] f32 logits of the
 * last n_logit_rows positions (1 <= n_logit_rows <= n). Returns CI_OK, or CI_ERR with
 * ci_last_error (bad id, past max_tokens, KV exhausted): the sequence then holds what it held
 * before the call, unless the failure came from inside the forward pass. */
int ci_session_feed(ci_session *session, const int32_t *ids, int n, float *logits,
                    int n_logit_rows);

/* Fills the next `depth` positions of every cache layer with seeded pseudo-random K/V rows, as if
 * that many tokens had been fed (values are meaningless, timing is real: `cinfer bench --depth`);
 * a due codec conversion happens as after a feed. Returns CI_OK or CI_ERR. */
int ci_session_fill_synthetic(ci_session *session, int64_t depth, uint64_t seed);

/* The session's KV sequence (NULL after a failed reset), for speculative rounds
 * (ci_kv_seq_round_open / _close). */
ci_kv_seq *ci_session_kv_seq(ci_session *session);

/* Positions the sequence holds (tokens fed plus synthetic rows). */
int64_t ci_session_position(const ci_session *session);

/* Bytes of KV storage the session's cache has in use. */
int64_t ci_session_kv_bytes_used(const ci_session *session);

/* Empties the sequence (its blocks are freed) and gives it its plan again, as if newly created.
 * Returns CI_OK, or CI_ERR (then the session holds no sequence and every feed fails). */
int ci_session_reset(ci_session *session);

#endif
