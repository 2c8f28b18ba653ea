/* One synchronous sequence over a loaded model: its cache, its plan, feeding ids and synthetic
 * rows (see session.h). */
#include "engine/session.h"

#include "base/error.h"
#include "kv/cache.h"
#include "kv/reservation.h"

#include <stdlib.h>
#include <string.h>

enum {
  KV_BLOCK_TOKENS = 16,
  SYNTHETIC_CHUNK = 256,
  SESSION_KV_FORMATS = 4 /* formats one sequence's blocks may be in at once: base, targets */
};

struct ci_session {
  ci_model *model; /* not owned */
  ci_session_options options;
  ci_kv_cache *cache; /* owned */
  ci_kv_seq *seq;     /* owned; NULL after a failed reset */
};

void ci_session_options_default(ci_session_options *options) {
  memset(options, 0, sizeof *options);
  options->kv_codec = CI_KV_BF16;
  options->kv_plan = CI_KV_PLAN_MODEL_CONFIG;
}

/* A new empty sequence with the options' plan (docs/kv-cache.md §7 precedence is the caller's
 * choice of kv_plan). */
static ci_kv_seq *new_sequence(ci_session *s) {
  const ci_session_options *o = &s->options;
  ci_kv_seq *seq = ci_kv_seq_create(s->cache);
  if (!seq) return NULL;
  const int status =
      o->kv_plan == CI_KV_PLAN_TARGET
          ? ci_kv_seq_set_plan_protected(seq, &o->kv_target, o->kv_start, o->kv_protect)
      : o->kv_plan == CI_KV_PLAN_MODEL_CONFIG ? ci_model_kv_seq_apply_config(s->model, seq)
                                              : CI_OK;
  if (status != CI_OK) {
    ci_kv_seq_free(seq);
    return NULL;
  }
  return seq;
}

/* A device backend takes the block tables and KV blocks only from memory made up front: this
 * session's one sequence at its whole length (ci_kv_cache_reserve_device). */
static int device_kv_memory(ci_session *s) {
  const int64_t positions =
      s->options.max_tokens > 0 ? s->options.max_tokens : ci_model_context_length(s->model);
  return ci_kv_cache_reserve_device(s->cache, 1, positions, ci_kv_format_plain(s->options.kv_codec),
                                    0, SESSION_KV_FORMATS);
}

ci_session *ci_session_create(ci_model *model, const ci_session_options *options) {
  ci_session *s = calloc(1, sizeof *s);
  if (!s) {
    ci_fail("out of memory for a session");
    return NULL;
  }
  s->model = model;
  if (options)
    s->options = *options;
  else
    ci_session_options_default(&s->options);
  s->cache = ci_model_kv_cache_create_protected(model, s->options.kv_codec, KV_BLOCK_TOKENS, 0,
                                                s->options.kv_protect);
  s->seq = s->cache && device_kv_memory(s) == CI_OK ? new_sequence(s) : NULL;
  if (!s->seq) {
    ci_session_free(s);
    return NULL;
  }
  return s;
}

void ci_session_free(ci_session *session) {
  if (!session) return;
  ci_kv_seq_free(session->seq);
  ci_kv_cache_free(session->cache);
  free(session);
}

ci_model *ci_session_model(const ci_session *session) {
  return session->model;
}

/* CI_OK when `n` more positions fit the session's limit. */
static int check_room(const ci_session *s, int64_t n) {
  if (!s->seq) return ci_fail("the session has no sequence (a reset failed)");
  const int64_t limit = s->options.max_tokens;
  if (limit > 0 && s->seq->n + n > limit)
    return ci_fail("%lld positions + %lld new exceed the session's limit of %lld",
                   (long long)s->seq->n, (long long)n, (long long)limit);
  return CI_OK;
}

int ci_session_feed(ci_session *session, const int32_t *ids, int n, float *logits,
                    int n_logit_rows) {
  if (n < 1) return ci_fail("nothing to feed (n = %d)", n);
  if (logits && (n_logit_rows < 1 || n_logit_rows > n))
    return ci_fail("logit rows %d out of range [1, %d]", n_logit_rows, n);
  if (check_room(session, n)) return CI_ERR;
  const int vocab = ci_model_vocab_size(session->model);
  for (int i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= vocab)
      return ci_fail("token id %d at index %d is out of range [0, %d)", (int)ids[i], i, vocab);
  return ci_model_forward_lora(session->model, session->seq, session->options.lora, ids, n, logits,
                               n_logit_rows);
}

int ci_session_fill_synthetic(ci_session *session, int64_t depth, uint64_t seed) {
  if (depth < 0) return ci_fail("synthetic depth %lld is negative", (long long)depth);
  if (depth == 0) return CI_OK;
  if (check_room(session, depth)) return CI_ERR;
  ci_kv_seq *seq = session->seq;
  const ci_model_spec *spec = &session->model->spec;
  ci_backend *be = session->model->be;
  if (ci_kv_seq_reserve(seq, depth)) return CI_ERR;
  const ci_kv_cache *cache = seq->cache;
  int width = 0; /* widest K row of a step over one rank's heads */
  for (int g = 0; g < cache->n_groups; g++)
    if (cache->groups[g].n_kv_heads * cache->groups[g].head_dim > width)
      width = cache->groups[g].n_kv_heads * cache->groups[g].head_dim;
  const int chunk = SYNTHETIC_CHUNK;
  float *k = malloc((size_t)chunk * width * sizeof *k),
        *v = malloc((size_t)chunk * width * sizeof *v);
  int32_t *pos = malloc((size_t)chunk * sizeof *pos);
  int rc = k && v && pos ? CI_OK : ci_fail("out of memory");
  for (int i = 0; rc == CI_OK && i < chunk * width; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    k[i] = (float)((int64_t)(seed >> 40) - (1 << 23)) / (float)(1 << 23);
    v[i] = -k[i] * 0.5f;
  }
  const int64_t first = seq->n, end = seq->n + depth;
  for (int64_t start = first; rc == CI_OK && start < end; start += chunk) {
    const int n = end - start < chunk ? (int)(end - start) : chunk;
    for (int i = 0; i < n; i++) pos[i] = (int32_t)(start + i);
    for (int l = 0; rc == CI_OK && l < spec->n_cache_layers; l++) {
      const int64_t layer_window = ci_spec_cache_layer(spec, l)->window;
      /* rows a sliding layer releases before any query sees them need no values */
      if (layer_window > 0 && start + n < end - layer_window - chunk) continue;
      for (int r = 0; rc == CI_OK && r < cache->n_ranks; r++) { /* each rank's heads */
        ci_backend *rank_be = r == 0 ? be : cache->rank_be[r];
        const ci_paged_kv kv = ci_kv_seq_view_rank(seq, l, r);
        const int32_t first_row = 0, n_rows = n;
        const ci_step_kv one = {.n_seqs = 1, .first_row = &first_row, .n_rows = &n_rows, .kv = &kv};
        rc = rank_be->ops->kv_store(rank_be, &one, k, v, pos);
      }
    }
  }
  free(k);
  free(v);
  free(pos);
  return rc == CI_OK ? ci_kv_seq_commit(seq, depth) : rc;
}

int64_t ci_session_position(const ci_session *session) {
  return session->seq ? session->seq->n : 0;
}

int64_t ci_session_kv_bytes_used(const ci_session *session) {
  return ci_kv_cache_bytes_used(session->cache);
}

ci_kv_seq *ci_session_kv_seq(ci_session *session) {
  return session->seq;
}

int ci_session_reset(ci_session *session) {
  ci_kv_seq_free(session->seq);
  session->seq = new_sequence(session);
  return session->seq ? CI_OK : CI_ERR;
}
