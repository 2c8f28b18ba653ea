/* The serving engine: engine thread, FIFO admission under the KV memory contract (each request
 * reserves its peak under its own codec plan), the prefix cache at admission and finish, and the
 * continuous-batching step (docs/generation.md §8, docs/architecture.md "The step"). Each step:
 * boundary work (cancellations and finished sequences leave; their full blocks go to the prefix
 * cache, the rest is freed), admission, then one forward (ci_model_step) of every decoding
 * sequence's row together with the prefill chunks that fit the step's token budget. A chunk's
 * length depends only on its own request (never on what else is in the step) and the step
 * computes each sequence's rows as it would alone, so every request's logits are identical to a
 * solo run. The KV arena, block tables, workspace and logits are sized at creation. */
#include "engine/engine.h"

#include "base/error.h"
#include "base/hash64.h"
#include "base/timing.h"
#include "engine/draft_model.h"
#include "engine/finish_rule.h"
#include "engine/lookup.h"
#include "engine/spec_policy.h"
#include "engine/prefix_cache.h"
#include "engine/prompt_cache.h"
#include "kv/reservation.h"
#include "sample/logprobs.h"
#include "sample/spec_verify.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Prompt-cache keys: the longest key text, and how many recent keys' texts are remembered. */
enum { KEY_TEXT_MAX = 16384, KEY_REGISTRY = 64 };

/* ==== Requests and their event queues ==== */

/* REQ_FORK_WAIT: a later choice of an n > 1 submission, admitted with the first one and waiting
 * for its prefill to end (it then forks the first one's sequence and decodes). */
typedef enum { REQ_QUEUED, REQ_PREFILL, REQ_FORK_WAIT, REQ_DECODE, REQ_FINISHED } request_state;

struct ci_engine_request {
  ci_engine *engine;
  int refs;      /* caller + engine; guarded by engine->mu */
  int cancelled; /* guarded by engine->mu */
  request_state state;
  /* job */
  int32_t *history; /* prompt then sampled tokens: [n_prompt + max_tokens] */
  int n_prompt, n_history, max_tokens, top_logprobs;
  ci_eos_set eos;
  ci_kv_plan_source kv_plan;
  ci_kv_format kv_target;
  int64_t kv_start;
  int kv_protect;
  ci_sampler *sampler;
  int owns_sampler;
  int64_t reservation; /* bytes */
  /* n > 1 choices of one prompt (ci_engine_submit_n): the first choice prefills and holds
   * group_size (n) and the whole group's reservation; each later one points at it (holding a
   * reference) and forks its sequence when that prefill ends */
  struct ci_engine_request *fork_of;
  int group_size;
  int64_t group_reservation;
  ci_grammar_matcher *matcher; /* owned; NULL when unconstrained */
  ci_lora *lora;               /* a reference; NULL without an adapter */
  /* engine-side progress */
  ci_kv_seq *seq;
  int n_prefilled;     /* prompt tokens whose KV is stored */
  int cached;          /* of which the prefix cache supplied */
  int64_t disk_blocks; /* of the prefix cache's, read from disk at admission */
  int64_t pc_blocks;   /* full blocks registered in the prefix cache ... */
  int pc_converted;    /* ... in this conversion state */
  int conversion_counted;
  int generated;
  int32_t pending; /* last sampled token, not yet forwarded */
  /* speculative decoding: drafts per round at most (0 = none), the adaptive length, counters;
   * a round's drafts sit in history[n_history ..) while it is verified */
  int spec_max, spec_len;
  int spec_drafted, spec_accepted;
  /* a seeded sampling request speculates in every round it drafts, whatever the measured policy
   * or the batch decide: rejection sampling picks other (equally distributed) tokens than plain
   * sampling, so a decision that depends on timing or load would make its output depend on them */
  int spec_pinned;
  ci_spec_scratch spec_scratch;
  ci_draft_state draft; /* with a draft model: its sequence, sampler and q rows */
  char spec_error[200]; /* drafting failed: the request fails with this at the next step */
  double t_submit, t_admit, t_first, t_last;
  struct ci_engine_request *next; /* queue / running list */
  /* events: guarded by mu. Tokens queue in `events`; the last event (DONE or ERROR) has a slot
   * of its own that needs no allocation, so it can never be lost, and the reader gets it once
   * the queue is drained. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  ci_engine_event *events;
  int n_events, cap_events, head;
  ci_engine_event final;
  int has_final, final_read;
  int events_lost; /* a token could not be queued: the request fails (engine thread only) */
};

struct ci_engine {
  ci_model *model;
  ci_engine_options o;
  ci_kv_cache *cache;
  ci_kv_cache *draft_cache; /* the draft model's, when there is one */
  int speculates;           /* a drafter is configured */
  ci_prefix_cache *prefix;  /* NULL when off; engine thread only */
  ci_prompt_cache *disk;    /* the prefix cache's blocks on disk; NULL when off */
  char *key_text;           /* [KEY_TEXT_MAX] scratch: the text of the key being built */
  struct {
    uint64_t key;
    char *text;
  } keys[KEY_REGISTRY]; /* recent keys' texts, for persisting their blocks (engine thread) */
  int next_key;
  ci_workspace *ws;       /* sized at creation for the largest step */
  float *logits;          /* [batch, vocab]: one row per sequence of a step */
  ci_row_pick *picks;     /* [batch]: each logit row's greedy pick (ci_model_step_picks) */
  float *fork_logits;     /* [vocab]: a copy of a prefill's last row for each forked choice */
  int logits_pinned;      /* logits registered with the backend (pin_host) */
  ci_step_seq *step_seqs; /* [batch] the sequences of a step */
  /* speculation: the policy's measurements, and a step's drafting (engine thread) */
  ci_spec_policy policy;
  ci_draft_batch draft_batch;    /* with a draft model */
  ci_draft_state **draft_states; /* [batch] the proposals of a step */
  int *spec_k;                   /* [batch] a step's planned draft lengths ... */
  double *spec_accept;           /* [batch] ... and the expected acceptance of each */
  int *spec_entry;               /* [batch] ... and the entry of each */
  pthread_t thread;
  pthread_mutex_t mu; /* queue, running list, refs, cancel flags, stats */
  pthread_cond_t cv;
  int stopping;
  int joined; /* ci_engine_stop has joined (or is joining) the thread */
  ci_engine_request *queue_head, *queue_tail;
  int n_waiting;
  ci_engine_request *running; /* admission order */
  int n_running;
  int64_t reserved;
  ci_engine_stats stats;
  ci_engine_exclusive *exclusive; /* calls waiting to run between two steps (FIFO) */
};

/* A ci_engine_run_exclusive call waiting for the engine thread. */
struct ci_engine_exclusive {
  ci_engine_exclusive_fn fn;
  void *arg;
  int result, done;
  pthread_cond_t cv; /* signalled when done (under the engine's mu) */
  ci_engine_exclusive *next;
};

/* Queues an event for the reader (engine thread). The final event goes to its own slot (first one
 * wins). A token that cannot be queued is not dropped silently: the request is marked
 * events_lost, later tokens are not queued either (the reader would see a gap), and the request
 * ends with an "out of memory" error at the next boundary (sweep_locked / finish_locked). */
static void push_event(ci_engine_request *r, const ci_engine_event *ev) {
  pthread_mutex_lock(&r->mu);
  if (ev->kind != CI_ENGINE_EVENT_TOKEN) {
    if (!r->has_final) {
      r->final = *ev;
      r->has_final = 1;
    }
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return;
  }
  if (r->events_lost || r->has_final) {
    pthread_mutex_unlock(&r->mu);
    return;
  }
  if (r->n_events == r->cap_events) {
    /* compact first, then grow */
    if (r->head > 0) {
      memmove(r->events, r->events + r->head, (size_t)(r->n_events - r->head) * sizeof *ev);
      r->n_events -= r->head;
      r->head = 0;
    }
    if (r->n_events == r->cap_events) {
      int cap = r->cap_events ? r->cap_events * 2 : 16;
      ci_engine_event *bigger = realloc(r->events, (size_t)cap * sizeof *bigger);
      if (!bigger) { /* out of memory: the request fails rather than lose a token */
        r->events_lost = 1;
        pthread_mutex_unlock(&r->mu);
        return;
      }
      r->events = bigger;
      r->cap_events = cap;
    }
  }
  r->events[r->n_events++] = *ev;
  pthread_cond_signal(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

int ci_engine_request_next(ci_engine_request *r, ci_engine_event *event, double timeout_s) {
  pthread_mutex_lock(&r->mu);
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  if (timeout_s >= 0) {
    const long long ns = deadline.tv_nsec + (long long)(timeout_s * 1e9);
    deadline.tv_sec += (time_t)(ns / 1000000000LL);
    deadline.tv_nsec = (long)(ns % 1000000000LL);
  }
  while (r->head == r->n_events && !r->has_final) {
    if (timeout_s < 0)
      pthread_cond_wait(&r->cv, &r->mu);
    else if (pthread_cond_timedwait(&r->cv, &r->mu, &deadline) == ETIMEDOUT)
      break;
  }
  int got = 0;
  if (r->head < r->n_events) {
    *event = r->events[r->head++];
    got = 1;
  } else if (r->has_final && !r->final_read) {
    *event = r->final;
    r->final_read = 1;
    got = 1;
  }
  pthread_mutex_unlock(&r->mu);
  return got;
}

static void request_destroy(ci_engine_request *r) {
  free(r->history);
  ci_spec_scratch_free(&r->spec_scratch);
  ci_draft_state_free(&r->draft);
  if (r->owns_sampler) ci_sampler_free(r->sampler);
  ci_grammar_matcher_free(r->matcher);
  ci_kv_seq_free(r->seq);
  ci_lora_release(r->lora);
  free(r->events);
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->cv);
  free(r);
}

/* Drops one reference; the caller holds engine->mu. */
static void request_unref_locked(ci_engine_request *r) {
  if (--r->refs > 0) return;
  ci_engine_request *first = r->fork_of; /* a later choice holds a reference on the first */
  request_destroy(r);
  if (first) request_unref_locked(first);
}

void ci_engine_request_cancel(ci_engine_request *r) {
  if (!r) return;
  pthread_mutex_lock(&r->engine->mu);
  r->cancelled = 1;
  pthread_cond_signal(&r->engine->cv);
  pthread_mutex_unlock(&r->engine->mu);
}

void ci_engine_request_release(ci_engine_request *r) {
  if (!r) return;
  ci_engine *e = r->engine;
  pthread_mutex_lock(&e->mu);
  r->cancelled = 1;
  pthread_cond_signal(&e->cv);
  request_unref_locked(r);
  pthread_mutex_unlock(&e->mu);
}

/* ==== The prefill-chunk rule ==== */

/* The most prompt tokens one prefill chunk may hold. */
static int64_t chunk_cap(const ci_engine *e) {
  return e->o.prefill_chunk < e->o.batch_tokens ? e->o.prefill_chunk : e->o.batch_tokens;
}

/* The rows of the next prefill chunk of a sequence with `left` prompt tokens to go and KV
 * chunk limit `limit` (ci_kv_seq_chunk_limit). It depends on the request alone, never on what
 * else runs in the step: batch invariance, admission (peak blocks, the conversion offset) and
 * the prefix-cache key all rely on that. */
static int64_t chunk_rows(const ci_engine *e, int64_t left, int64_t limit) {
  int64_t chunk = left < chunk_cap(e) ? left : chunk_cap(e);
  return chunk < limit ? chunk : limit;
}

/* ==== Memory contract ==== */

/* Bytes of the draft model's KV arena on a device: e->o.batch sequences of the whole context in
 * bf16 with their recurrent states and checkpoints (rounds of up to draft_max rows), plus a
 * partly filled slab per layer group. */
static int64_t draft_arena_bytes(const ci_engine *e) {
  const ci_kv_cache *c = e->draft_cache;
  const ci_kv_format bf16 = ci_kv_format_plain(CI_KV_BF16);
  const int64_t blocks = (e->o.ctx_size + e->o.block_tokens - 1) / e->o.block_tokens;
  int64_t per_seq = ci_kv_cache_state_cost(c, e->o.draft_max);
  for (int g = 0; g < c->n_groups; g++) per_seq += blocks * ci_kv_cache_block_cost(c, g, &bf16);
  return (int64_t)e->o.batch * per_seq + (int64_t)c->n_groups * ci_kv_cache_slab_bytes(c);
}

/* The peak KV bytes of a request of n tokens (prompt n_prompt) under its codec plan
 * (docs/kv-cache.md §10, docs/generation.md §9; kv/reservation.h, the formula `cinfer fit` uses
 * too): layers convert to targets[layer] (NULL = no plan; `uniform`: targets[0] for every layer
 * but the first and last `protect`) once start tokens are stored. Only immutable cache geometry
 * is read, so any thread may call it. */
static int64_t plan_reservation(const ci_engine *e, const ci_kv_format *targets, int uniform,
                                int protect, int64_t start, int64_t n_prompt, int64_t n,
                                int spec_max) {
  const ci_kv_request_shape shape = {.base = ci_kv_format_plain(e->o.base),
                                     .targets = targets,
                                     .uniform = uniform,
                                     .protect = protect,
                                     .start = start,
                                     .n_prompt = n_prompt,
                                     .n = n,
                                     .chunk_cap = chunk_cap(e),
                                     .rollback_reserve = e->speculates ? e->o.draft_max : 0,
                                     .spec_max = spec_max};
  return ci_kv_request_reservation(e->cache, &shape);
}

int64_t ci_engine_reservation_bytes(const ci_engine *e, int64_t n) {
  return plan_reservation(e, NULL, 0, 0, 0, n, n, e->speculates ? e->o.draft_max : 0);
}

/* The most drafts a request of this job proposes in a round; 0 when it never speculates (no
 * drafter, num_draft < 0, or XTC, which makes the filtered distribution random). */
static int job_spec_max(const ci_engine *e, const ci_engine_job *job) {
  const ci_sampler_params *sp = job->sampler ? ci_sampler_get_params(job->sampler) : &job->sampling;
  if (!e->speculates || job->num_draft < 0 || sp->xtc_probability != 0.0f) return 0;
  return job->num_draft > 0 && job->num_draft < e->o.draft_max ? job->num_draft : e->o.draft_max;
}

/* The reservation of a job under its own codec plan. */
static int64_t job_reservation(const ci_engine *e, const ci_engine_job *job, int64_t n) {
  const int spec_max = job_spec_max(e, job);
  switch (job->kv_plan) {
  case CI_KV_PLAN_TARGET:
    return plan_reservation(e, &job->kv_target, 1, job->kv_protect, job->kv_start, job->n_prompt, n,
                            spec_max);
  case CI_KV_PLAN_MODEL_CONFIG:
    return plan_reservation(e, e->model->kv_config, 0, 0, 0, job->n_prompt, n, spec_max);
  default:
    return plan_reservation(e, NULL, 0, 0, 0, job->n_prompt, n, spec_max);
  }
}

int ci_engine_ctx_size(const ci_engine *e) {
  return e->o.ctx_size;
}

int ci_engine_max_batch(const ci_engine *e) {
  return e->o.batch;
}

/* ==== Options, creation ==== */

void ci_engine_options_default(ci_engine_options *o) {
  memset(o, 0, sizeof *o);
  o->batch = 8;
  o->batch_tokens = 2048;
  o->prefill_chunk = 2048;
  o->max_queue = 256;
  o->block_tokens = 16;
  o->base = CI_KV_BF16;
  o->prefix_cache_bytes = (int64_t)2 << 30;
  o->draft_max = 5;
  o->draft_min = 1;
}

static void *engine_main(void *arg);
static int persist_new_block(void *arg, const ci_prefix_block *block);

/* Frees what ci_engine_create allocated (the thread is not running). */
static void engine_free_parts(ci_engine *e) {
  ci_prompt_cache_close(e->disk); /* writes out what is queued */
  ci_prefix_cache_free(e->prefix);
  free(e->key_text);
  for (int i = 0; i < KEY_REGISTRY; i++) free(e->keys[i].text);
  ci_kv_cache_free(e->cache);
  ci_kv_cache_free(e->draft_cache);
  ci_workspace_free(e->ws);
  if (e->logits_pinned) e->model->be->ops->unpin_host(e->model->be, e->logits);
  free(e->logits);
  free(e->picks);
  free(e->fork_logits);
  free(e->step_seqs);
  ci_draft_batch_free(&e->draft_batch);
  free(e->draft_states);
  free(e->spec_k);
  free(e->spec_accept);
  free(e->spec_entry);
  free(e);
}

ci_engine *ci_engine_create(ci_model *model, const ci_engine_options *options) {
  ci_engine *e = calloc(1, sizeof *e);
  if (!e) return ci_fail("engine: out of memory"), NULL;
  e->model = model;
  e->o = *options;
  if (e->o.batch < 1 || e->o.batch > CI_ENGINE_MAX_BATCH || e->o.batch_tokens < 1 ||
      e->o.prefill_chunk < 1 || e->o.max_queue < 0 || e->o.block_tokens < 1) {
    free(e);
    return ci_fail("engine: batch must be 1..%d; batch_tokens, prefill_chunk and block_tokens "
                   ">= 1",
                   CI_ENGINE_MAX_BATCH),
           NULL;
  }
  if (e->o.lookup_ngram < 0 || e->o.draft_max < 1 || e->o.draft_max > CI_ENGINE_MAX_DRAFT ||
      e->o.draft_min < 1 || e->o.draft_min > e->o.draft_max || e->o.spec_max_batch < 0 ||
      e->o.spec_policy < CI_ENGINE_SPEC_AUTO || e->o.spec_policy > CI_ENGINE_SPEC_NEVER) {
    free(e);
    return ci_fail("engine: lookup n-gram must be >= 0, draft max 1..%d, draft min "
                   "1..draft max, spec max batch >= 0 and the spec policy auto, always or never",
                   CI_ENGINE_MAX_DRAFT),
           NULL;
  }
  e->speculates = e->o.lookup_ngram > 0 || e->o.draft_model;
  if (e->o.draft_model && e->o.draft_model->spec.vocab != model->spec.vocab) {
    ci_fail("engine: the draft model has %d tokens in its vocabulary, the model %d (a draft "
            "model must share the model's tokenizer)",
            e->o.draft_model->spec.vocab, model->spec.vocab);
    free(e);
    return NULL;
  }
  /* the rows of a decode entry: one, or a speculative round's x and drafts */
  const int decode_rows = e->speculates ? 1 + e->o.draft_max : 1;
  if (e->o.ctx_size <= 0 || e->o.ctx_size > model->spec.max_position)
    e->o.ctx_size = model->spec.max_position;
  e->cache =
      ci_model_kv_cache_create_protected(model, e->o.base, e->o.block_tokens, 0, e->o.kv_protect);
  if (!e->cache) return engine_free_parts(e), NULL;
  e->logits =
      malloc((size_t)e->o.batch * decode_rows * (size_t)model->spec.vocab * sizeof *e->logits);
  e->picks = malloc((size_t)e->o.batch * decode_rows * sizeof *e->picks);
  e->step_seqs = malloc((size_t)e->o.batch * sizeof *e->step_seqs);
  e->fork_logits = malloc((size_t)model->spec.vocab * sizeof *e->fork_logits);
  e->draft_states = malloc((size_t)e->o.batch * sizeof *e->draft_states);
  e->spec_k = malloc((size_t)e->o.batch * sizeof *e->spec_k);
  e->spec_accept = malloc((size_t)e->o.batch * sizeof *e->spec_accept);
  e->spec_entry = malloc((size_t)e->o.batch * sizeof *e->spec_entry);
  ci_spec_policy_init(&e->policy);
  if (!e->logits || !e->picks || !e->step_seqs || !e->fork_logits || !e->draft_states ||
      !e->spec_k || !e->spec_accept || !e->spec_entry)
    return engine_free_parts(e), ci_fail("engine: out of memory"), NULL;
  /* a device writes the logits of each step straight into this buffer when it is pinned; a
   * failure only makes the download slower */
  e->logits_pinned =
      model->be->ops->pin_host(model->be, e->logits,
                               (size_t)e->o.batch * decode_rows * (size_t)model->spec.vocab *
                                   sizeof *e->logits) == CI_OK;
  /* the largest step compose_step builds: decode rows of the other sequences plus a first
   * chunk of up to batch_tokens rows */
  e->ws = ci_workspace_create(model->be);
  if (!e->ws || ci_workspace_fit(e->ws, &model->spec, e->o.batch * decode_rows + e->o.batch_tokens,
                                 e->o.batch * decode_rows))
    return engine_free_parts(e), NULL;
  if (ci_kv_cache_set_limits(e->cache, e->o.batch, e->o.ctx_size))
    return engine_free_parts(e), NULL;
  if (e->o.draft_model) {
    e->draft_cache = ci_model_kv_cache_create(e->o.draft_model, CI_KV_BF16, e->o.block_tokens, 0);
    if (!e->draft_cache || ci_kv_cache_set_limits(e->draft_cache, e->o.batch, e->o.ctx_size))
      return engine_free_parts(e), ci_fail_context("draft model"), NULL;
    /* a device backend takes KV memory only from an arena made up front: room for every
     * sequence of the batch at the whole context in bf16, plus a partly filled slab per group */
    if (!e->o.draft_model->be->host_visible &&
        ci_kv_cache_set_arena(e->draft_cache, draft_arena_bytes(e)))
      return engine_free_parts(e), ci_fail_context("draft model"), NULL;
    /* a sequence's catch-up is at most 1 + draft_max rows after a round; more (its prompt, or
     * tokens decoded without speculating) runs alone first */
    if (ci_draft_batch_init(&e->draft_batch, e->o.draft_model, e->o.batch, 1 + e->o.draft_max))
      return engine_free_parts(e), NULL;
  }
  if (e->o.kv_budget_bytes < 0) {
    /* unbounded: KV memory is taken as sequences grow (never refused by admission) */
    e->o.kv_budget_bytes = INT64_MAX / 4;
  } else {
    if (e->o.kv_budget_bytes == 0) {
      /* batch requests of the whole context, within half of the machine's memory */
      e->o.kv_budget_bytes = (int64_t)e->o.batch * ci_engine_reservation_bytes(e, e->o.ctx_size);
      const int64_t half_memory = (int64_t)sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGE_SIZE) / 2;
      if (half_memory > 0 && e->o.kv_budget_bytes > half_memory) e->o.kv_budget_bytes = half_memory;
    }
    /* the arena: the budget, plus a partly filled slab for each layer group in each format a
     * sequence may use */
    const int64_t slack =
        (int64_t)e->cache->n_groups * CI_ENGINE_MAX_KV_FORMATS * ci_kv_cache_slab_bytes(e->cache);
    if (ci_kv_cache_set_arena(e->cache, e->o.kv_budget_bytes + slack))
      return engine_free_parts(e), NULL;
  }
  e->stats.kv_budget_bytes = e->o.kv_budget_bytes;
  if (e->o.prefix_cache_bytes < 0) e->o.prefix_cache_bytes = 0;
  if (e->o.prefix_cache_bytes > e->o.kv_budget_bytes)
    e->o.prefix_cache_bytes = e->o.kv_budget_bytes;
  e->stats.prefix_cache_max_bytes = e->o.prefix_cache_bytes;
  if (!(e->key_text = malloc(KEY_TEXT_MAX)))
    return engine_free_parts(e), ci_fail("engine: out of memory"), NULL;
  if (e->o.prefix_cache_bytes > 0 && !(e->prefix = ci_prefix_cache_create(e->cache)))
    return engine_free_parts(e), NULL;
  if (e->o.prompt_cache_dir) {
    if (!e->prefix)
      return engine_free_parts(e),
             ci_fail("engine: the prompt cache on disk needs the prefix cache (its byte cap is "
                     "0)"),
             NULL;
    if (ci_kv_cache_state_bytes(e->cache) > 0)
      return engine_free_parts(e),
             ci_fail("engine: the prompt cache on disk stores KV blocks only, not the recurrent "
                     "state a hybrid model (Qwen3.5) needs with them; run without "
                     "--prompt-cache-dir"),
             NULL;
    e->disk = ci_prompt_cache_open(e->o.prompt_cache_dir, e->cache, e->o.prompt_cache_queue_bytes,
                                   e->o.prompt_cache_warn, e->o.prompt_cache_warn_arg);
    if (!e->disk) return engine_free_parts(e), NULL;
    ci_prefix_cache_set_hook(e->prefix, persist_new_block, e);
    e->stats.prompt_cache_on = 1;
  }
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  if (pthread_create(&e->thread, NULL, engine_main, e)) {
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    engine_free_parts(e);
    return ci_fail("engine: cannot start the engine thread"), NULL;
  }
  return e;
}

/* ==== Submission ==== */

uint64_t ci_engine_choice_seed(uint64_t seed, int index) {
  if (index == 0) return seed;
  /* splitmix64 of the seed moved by the index: distinct, well mixed streams */
  uint64_t z = seed + (uint64_t)index * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/* A new queued request of a validated job (choice `index`: its own sampler, seeded by
 * ci_engine_choice_seed when the job has a seed; its own grammar matcher). NULL when out of
 * memory. */
static ci_engine_request *request_new(ci_engine *e, const ci_engine_job *job, int index,
                                      int64_t reservation) {
  const int vocab = e->model->spec.vocab;
  const int64_t n_total = (int64_t)job->n_prompt + job->max_tokens;
  ci_engine_request *r = calloc(1, sizeof *r);
  if (!r) return ci_fail("out of memory"), NULL;
  r->engine = e;
  r->history = malloc((size_t)n_total * sizeof *r->history);
  r->owns_sampler = !job->sampler;
  if (job->sampler) {
    r->sampler = job->sampler;
  } else {
    ci_sampler_params sampling = job->sampling;
    if (sampling.has_seed) sampling.seed = ci_engine_choice_seed(sampling.seed, index);
    r->sampler = ci_sampler_create(&sampling, vocab);
  }
  if (job->grammar) r->matcher = ci_grammar_matcher_create(job->grammar, job->grammar_vocab);
  if (!r->history || !r->sampler || (job->grammar && !r->matcher)) {
    /* the parameters were valid: memory ran out */
    if (!r->history) ci_fail("out of memory");
    free(r->history);
    ci_grammar_matcher_free(r->matcher);
    if (r->owns_sampler) ci_sampler_free(r->sampler);
    free(r);
    return NULL;
  }
  memcpy(r->history, job->prompt, (size_t)job->n_prompt * sizeof *r->history);
  r->n_prompt = r->n_history = job->n_prompt;
  r->max_tokens = job->max_tokens;
  r->top_logprobs = job->top_logprobs;
  r->eos = job->eos;
  r->kv_plan = job->kv_plan;
  r->kv_target = job->kv_target;
  r->kv_start = job->kv_start;
  r->kv_protect = job->kv_protect;
  r->reservation = reservation;
  r->group_size = 1;
  r->group_reservation = reservation;
  r->spec_max = job_spec_max(e, job);
  if (r->spec_max > 0) {
    const ci_sampler_params *sampling = ci_sampler_get_params(r->sampler);
    r->spec_pinned = sampling->temperature > 0 && sampling->has_seed;
    r->spec_len = r->spec_max;
    if (ci_spec_scratch_init(&r->spec_scratch, vocab)) {
      free(r->history);
      ci_grammar_matcher_free(r->matcher);
      if (r->owns_sampler) ci_sampler_free(r->sampler);
      free(r);
      return NULL;
    }
  }
  r->lora = ci_lora_retain(job->lora);
  r->state = REQ_QUEUED;
  r->refs = 2;
  r->t_submit = ci_now_seconds();
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
  return r;
}

ci_engine_verdict ci_engine_submit(ci_engine *e, const ci_engine_job *job,
                                   ci_engine_request **out) {
  return ci_engine_submit_n(e, job, 1, out);
}

ci_engine_verdict ci_engine_submit_n(ci_engine *e, const ci_engine_job *job, int n,
                                     ci_engine_request **out) {
  for (int i = 0; i < n; i++) out[i] = NULL;
  const int vocab = e->model->spec.vocab;
  if (n < 1 || n > e->o.batch)
    return ci_fail("n must be between 1 and the engine's batch size %d (got %d)", e->o.batch, n),
           CI_ENGINE_REJECTED;
  if (n > 1 && job->sampler)
    return ci_fail("n > 1 choices need samplers of their own (no borrowed sampler)"),
           CI_ENGINE_REJECTED;
  if (job->n_prompt < 1) return ci_fail("the prompt is empty"), CI_ENGINE_REJECTED;
  if (job->max_tokens < 1) return ci_fail("max_tokens must be >= 1"), CI_ENGINE_REJECTED;
  if ((int64_t)job->n_prompt + job->max_tokens > e->o.ctx_size)
    return ci_fail("prompt (%d tokens) + max_tokens (%d) exceeds the context size %d",
                   job->n_prompt, job->max_tokens, e->o.ctx_size),
           CI_ENGINE_OVER_CONTEXT;
  for (int i = 0; i < job->n_prompt; i++)
    if (job->prompt[i] < 0 || job->prompt[i] >= vocab)
      return ci_fail("prompt token id %d is out of range [0, %d)", (int)job->prompt[i], vocab),
             CI_ENGINE_REJECTED;
  if (job->kv_plan == CI_KV_PLAN_TARGET &&
      (job->kv_protect < 0 || job->kv_protect > e->o.kv_protect))
    return ci_fail("kv protect %d: the engine keeps at most %d layers at each end apart",
                   job->kv_protect, e->o.kv_protect),
           CI_ENGINE_REJECTED;
  const int64_t n_total = (int64_t)job->n_prompt + job->max_tokens;
  const int64_t reservation = job_reservation(e, job, n_total);
  if (reservation * n > e->o.kv_budget_bytes) {
    int64_t cap = 0, too_big = n_total; /* the longest request of this plan that fits */
    while (too_big - cap > 1) {
      const int64_t mid = cap + (too_big - cap) / 2;
      if (job_reservation(e, job, mid) * n <= e->o.kv_budget_bytes)
        cap = mid;
      else
        too_big = mid;
    }
    if (n > 1)
      return ci_fail("%d choices of %lld tokens of context (prompt %d + max_tokens %d) need "
                     "more KV than the memory budget; it caps each of %d choices at %lld tokens",
                     n, (long long)n_total, job->n_prompt, job->max_tokens, n, (long long)cap),
             CI_ENGINE_OVER_BUDGET;
    return ci_fail("request needs %lld tokens of context (prompt %d + max_tokens %d) but the "
                   "memory budget caps a request at %lld tokens",
                   (long long)n_total, job->n_prompt, job->max_tokens, (long long)cap),
           CI_ENGINE_OVER_BUDGET;
  }
  if (job->top_logprobs < 0 || job->top_logprobs > CI_ENGINE_MAX_TOP_LOGPROBS)
    return ci_fail("top_logprobs must be an integer between 0 and 20"), CI_ENGINE_REJECTED;
  if (!job->sampler && ci_sampler_params_validate(&job->sampling, vocab)) return CI_ENGINE_REJECTED;
  if (job->grammar && (!job->grammar_vocab || job->grammar_vocab->n_vocab != vocab))
    return ci_fail("a grammar needs the token bytes of the model's %d-token vocabulary", vocab),
           CI_ENGINE_REJECTED;
  if (job->lora && job->lora->model != e->model)
    return ci_fail("the adapter was loaded for another model"), CI_ENGINE_REJECTED;
  ci_engine_request *made[CI_ENGINE_MAX_BATCH];
  for (int i = 0; i < n; i++) {
    made[i] = request_new(e, job, i, reservation);
    if (!made[i]) {
      for (int k = 0; k < i; k++) request_destroy(made[k]);
      return CI_ENGINE_OUT_OF_MEMORY;
    }
  }
  /* later choices point at the first (a reference each) and wait for its prefill */
  made[0]->group_size = n;
  made[0]->group_reservation = reservation * n;
  made[0]->refs += n - 1;
  for (int i = 1; i < n; i++) made[i]->fork_of = made[0];

  pthread_mutex_lock(&e->mu);
  ci_engine_verdict verdict = CI_ENGINE_SUBMITTED;
  if (e->stopping)
    verdict = CI_ENGINE_STOPPED;
  else if (e->n_waiting + n > e->o.max_queue)
    verdict = CI_ENGINE_QUEUE_FULL;
  if (verdict == CI_ENGINE_SUBMITTED) {
    /* the choices stay together in the queue: nothing is ever inserted between them */
    for (int i = 0; i < n; i++) {
      if (e->queue_tail)
        e->queue_tail->next = made[i];
      else
        e->queue_head = made[i];
      e->queue_tail = made[i];
    }
    e->n_waiting += n;
    e->stats.waiting = e->n_waiting;
    pthread_cond_signal(&e->cv);
  }
  pthread_mutex_unlock(&e->mu);
  if (verdict != CI_ENGINE_SUBMITTED) {
    ci_fail(verdict == CI_ENGINE_STOPPED ? "the server is shutting down"
                                         : "the request queue is full");
    for (int i = 0; i < n; i++) request_destroy(made[i]);
    return verdict;
  }
  for (int i = 0; i < n; i++) out[i] = made[i];
  return CI_ENGINE_SUBMITTED;
}

/* ==== Prefix cache (engine thread only) ==== */

/* The prefix-cache key of a sequence's KV state, as text (into e->key_text) and as the hash the
 * prefix cache uses: the model's identity (config and weights), the backend, the block size, the
 * layer groups' geometry, the base format, the codec plan (target of every layer group, start)
 * and whether (and where) the sequence converted, and the LoRA adapter's content hash (empty for
 * none). Sequences whose
 * stored bytes would be equal share keys; the text is written into every persisted block, and a
 * block is loaded only under exactly the same text. */
static uint64_t prefix_key(ci_engine *e, const ci_kv_seq *seq, int converted, int64_t c,
                           const ci_lora *lora) {
  char *buf = e->key_text;
  size_t at = 0;
#define KEY_APPEND(...)                                                                            \
  do {                                                                                             \
    const int n_ = snprintf(buf + at, at < KEY_TEXT_MAX ? KEY_TEXT_MAX - at : 0, __VA_ARGS__);     \
    at += n_ > 0 ? (size_t)n_ : 0;                                                                 \
  } while (0)
  const ci_kv_cache *kv = seq->cache;
  char name[48];
  ci_kv_format_name(&kv->groups[0].pools[0]->format, name, sizeof name);
  KEY_APPEND("cinfer-kv1 model=%016llx%016llx backend=%s T=%d base=%s groups=",
             (unsigned long long)e->model->identity[0], (unsigned long long)e->model->identity[1],
             e->model->be->ops->name, kv->block_tokens, name);
  for (int g = 0; g < kv->n_groups; g++) {
    const ci_kv_group *group = &kv->groups[g];
    KEY_APPEND("%sw%d.h%d.d%d.l%d", g ? "," : "", group->window, group->n_kv_heads, group->head_dim,
               group->layers[0]);
    for (int l = 1; l < group->n_layers; l++) KEY_APPEND(".%d", group->layers[l]);
  }
  if (seq->has_plan) {
    KEY_APPEND(" plan=");
    for (int g = 0; g < kv->n_groups; g++) {
      const ci_kv_block_table *t = &seq->tables[g];
      /* after conversion has_target is cleared and the pool's format is the target */
      ci_kv_format_name(t->has_target ? &t->target : &t->pool->format, name, sizeof name);
      KEY_APPEND("%s%s", g ? "," : "", name);
    }
    KEY_APPEND(" start=%lld conv=", (long long)seq->start);
    if (converted)
      KEY_APPEND("%lld", (long long)c);
    else
      KEY_APPEND("no");
  } else {
    KEY_APPEND(" plan=none");
  }
  /* the adapter by its content, so a remounted adapter with new weights never reuses blocks */
  if (lora)
    KEY_APPEND(" adapter=%016llx", (unsigned long long)lora->key);
  else
    KEY_APPEND(" adapter=");
#undef KEY_APPEND
  if (at >= KEY_TEXT_MAX) buf[KEY_TEXT_MAX - 1] = '\0'; /* a truncated text is still a key */
  const uint64_t key = ci_hash64(buf, strlen(buf), 0x6b65792d74657874ULL);
  if (e->disk) { /* remember the text, for persisting this key's blocks */
    int i = 0;
    while (i < KEY_REGISTRY && (e->keys[i].key != key || !e->keys[i].text)) i++;
    if (i == KEY_REGISTRY) {
      char *copy = strdup(buf);
      if (copy) {
        free(e->keys[e->next_key].text);
        e->keys[e->next_key].key = key;
        e->keys[e->next_key].text = copy;
        e->next_key = (e->next_key + 1) % KEY_REGISTRY;
      }
    }
  }
  return key;
}

/* The text of a key prefix_key built (NULL when forgotten). */
static const char *key_text_of(const ci_engine *e, uint64_t key) {
  for (int i = 0; i < KEY_REGISTRY; i++)
    if (e->keys[i].text && e->keys[i].key == key) return e->keys[i].text;
  return NULL;
}

/* The prefix cache's hook: queues a new block for the disk (engine thread). */
static int persist_new_block(void *arg, const ci_prefix_block *block) {
  ci_engine *e = arg;
  const char *text = key_text_of(e, block->key);
  if (!text) return -1;
  if (ci_prompt_cache_enqueue(e->disk, text, block)) return 1;
  ci_prompt_cache_count_drop(e->disk);
  return 0;
}

/* The format each layer group's blocks are in under a key: the plan's targets once converted,
 * else what the sequence stores now. */
static void key_formats(const ci_kv_seq *seq, int converted, ci_kv_format *formats) {
  for (int g = 0; g < seq->cache->n_groups; g++) {
    const ci_kv_block_table *t = &seq->tables[g];
    formats[g] = converted && t->has_target ? t->target : t->pool->format;
  }
}

/* Reads the blocks of tokens[0 .. max_blocks*T) under the key just built from disk into the
 * prefix cache (within max_bytes). Returns the blocks loaded. Engine thread. */
static int64_t fill_from_disk(ci_engine *e, const ci_kv_seq *seq, uint64_t key, int converted,
                              const int32_t *tokens, int64_t max_blocks, int64_t max_bytes) {
  if (!e->disk || max_blocks < 1) return 0;
  ci_kv_format *formats = malloc((size_t)seq->cache->n_groups * sizeof *formats);
  if (!formats) return 0;
  key_formats(seq, converted, formats);
  const int64_t loaded = ci_prompt_cache_fill(e->disk, e->prefix, key, e->key_text, formats, tokens,
                                              max_blocks, max_bytes);
  free(formats);
  return loaded;
}

/* Registers the request's full blocks when new ones filled since the last time (or always
 * when `force`). Engine thread. */
static void register_prefix(ci_engine *e, ci_engine_request *r, int force) {
  if (!e->prefix || !r->seq) return;
  const ci_kv_seq *seq = r->seq;
  const int64_t blocks = seq->n / e->cache->block_tokens;
  if (!force && blocks == r->pc_blocks && seq->converted == r->pc_converted) return;
  if (blocks == 0) return;
  /* an unconverted sequence holds fewer than `start` tokens, so its base-format blocks all lie
   * below the start, as attaching them requires */
  const uint64_t key = prefix_key(e, r->seq, seq->converted, seq->conversion_offset, r->lora);
  if (ci_prefix_cache_insert(e->prefix, key, r->history, seq) == CI_OK) {
    r->pc_blocks = blocks;
    r->pc_converted = seq->converted;
    /* hybrid models: the recurrent state when the step ended on a block boundary (every
     * prefill chunk of a multiple of T; while decoding, the latest boundary only) */
    if (seq->state)
      ci_prefix_cache_snapshot(e->prefix, key, r->history, seq, r->state == REQ_DECODE);
  }
}

/* Attaches the longest cached prefix of tokens under the key of (converted, c) with
 * min_p <= p <= max_p, after reading what the memory cache lacks of it from disk. Returns p. */
static int64_t attach_under(ci_engine *e, ci_engine_request *r, int converted, int64_t c,
                            int64_t min_p, int64_t max_p) {
  ci_kv_seq *seq = r->seq;
  const uint64_t key = prefix_key(e, seq, converted, c, r->lora);
  r->disk_blocks +=
      fill_from_disk(e, seq, key, converted, r->history, max_p / e->cache->block_tokens, INT64_MAX);
  return ci_prefix_cache_attach(e->prefix, key, r->history, min_p, max_p, seq, converted, c);
}

/* Attaches the longest usable cached prefix of a newly admitted request's prompt (at least one
 * prompt token is left to forward). Engine thread, at admission. */
static void attach_prefix(ci_engine *e, ci_engine_request *r) {
  if (!e->prefix) return;
  ci_kv_seq *seq = r->seq;
  const int64_t max_p = r->n_prompt - 1;
  int64_t p = 0;
  if (seq->has_plan) {
    /* converted blocks: the conversion offset the request would reach on its own (its start,
     * or the end of its first chunk when the start is 0) */
    const int64_t c = seq->start > 0 ? seq->start : chunk_rows(e, r->n_prompt, INT64_MAX);
    p = attach_under(e, r, 1, c, c, max_p);
    if (p == 0 && seq->start > 0) {
      const int64_t below_start = seq->start - 1 < max_p ? seq->start - 1 : max_p;
      p = attach_under(e, r, 0, 0, 0, below_start);
    }
  } else {
    p = attach_under(e, r, 0, 0, 0, max_p);
  }
  r->cached = r->n_prefilled = (int)p;
  r->pc_blocks = p / e->cache->block_tokens;
  r->pc_converted = seq->converted;
}

/* ==== The engine thread ==== */

/* Counts a sequence's conversion once, under each distinct format its groups converted to.
 * Caller holds e->mu. */
static void count_conversion_locked(ci_engine *e, ci_engine_request *r) {
  if (!r->seq || !r->seq->converted || r->conversion_counted) return;
  r->conversion_counted = 1;
  const ci_kv_cache *c = e->cache;
  for (int g = 0; g < c->n_groups; g++) {
    const ci_kv_format *f = &r->seq->tables[g].pool->format;
    if (r->seq->tables[g].pool == c->groups[g].pools[0]) continue; /* stayed in the base */
    int seen = 0;
    for (int h = 0; h < g && !seen; h++)
      seen = ci_kv_format_equal(&r->seq->tables[h].pool->format, f);
    if (seen) continue;
    ci_engine_stats *st = &e->stats;
    int k = 0;
    while (k < st->n_kv_conversions && !ci_kv_format_equal(&st->kv_conversion_formats[k], f)) k++;
    if (k == st->n_kv_conversions) {
      if (k == CI_ENGINE_MAX_KV_FORMATS) continue;
      st->kv_conversion_formats[st->n_kv_conversions++] = *f;
    }
    st->kv_conversions[k]++;
  }
}

/* Ends a request: last event, stats, blocks freed. Caller holds e->mu. */
static void finish_locked(ci_engine *e, ci_engine_request *r, ci_finish_reason finish,
                          const char *error) {
  if (r->state == REQ_FINISHED) return;
  ci_engine_event ev;
  memset(&ev, 0, sizeof ev);
  const double now = ci_now_seconds();
  if (!error && r->events_lost) error = "out of memory: a token event could not be queued";
  if (error) {
    ev.kind = CI_ENGINE_EVENT_ERROR;
    snprintf(ev.message, sizeof ev.message, "%s", error);
    e->stats.requests_failed++;
  } else {
    ev.kind = CI_ENGINE_EVENT_DONE;
    ev.finish = finish;
    if (finish == CI_FINISH_ABORT)
      e->stats.requests_cancelled++;
    else
      e->stats.requests_finished++;
  }
  ev.token = r->generated > 0 ? r->history[r->n_history - 1] : -1;
  ev.prompt_tokens = r->n_prompt;
  ev.cached_tokens = r->cached;
  ev.generated_tokens = r->generated;
  ev.queue_seconds = (r->t_admit > 0 ? r->t_admit : now) - r->t_submit;
  ev.prefill_seconds = r->t_first > 0 ? r->t_first - r->t_admit : 0;
  ev.decode_seconds = r->t_first > 0 ? r->t_last - r->t_first : 0;
  ev.draft_tokens = r->spec_drafted;
  ev.accepted_tokens = r->spec_accepted;
  r->state = REQ_FINISHED;
  /* the stored KV outlives the request in the prefix cache (not after a failed step, whose
   * writes may be partial, nor at shutdown) */
  if (!error && r->seq && !e->stopping) register_prefix(e, r, 1);
  count_conversion_locked(e, r);
  ci_kv_seq_free(r->seq);
  r->seq = NULL;
  ci_draft_state_free(&r->draft);
  push_event(r, &ev);
}

/* Counts and emits a sampled token with its log-probability (top entries from the sampler's last
 * log-softmax when the request asks for them); returns 1 with *finish set when it ends the request
 * (the finish rule: EOS, which is not emitted, then length). */
static int take_token(ci_engine *e, ci_engine_request *r, int32_t token, float logprob,
                      ci_finish_reason *finish) {
  const double now = ci_now_seconds();
  if (r->generated == 0) r->t_first = now;
  r->t_last = now;
  r->generated++;
  r->history[r->n_history++] = token;
  r->pending = token;
  const int ends = ci_generation_ends(&r->eos, token, r->generated, r->max_tokens, finish);
  if (ends && *finish == CI_FINISH_STOP) return 1;
  ci_engine_event ev;
  ev.kind = CI_ENGINE_EVENT_TOKEN;
  ev.token = token;
  ev.logprob = logprob;
  ev.n_top = 0;
  if (r->top_logprobs > 0) {
    const float *lp = ci_sampler_logprobs(r->sampler);
    ci_logprob top[CI_ENGINE_MAX_TOP_LOGPROBS];
    ev.n_top = ci_logprobs_top(lp, e->model->spec.vocab, r->top_logprobs, top);
    for (int i = 0; i < ev.n_top; i++) {
      ev.top_ids[i] = top[i].id;
      ev.top_logprobs[i] = top[i].logprob;
    }
  }
  push_event(r, &ev);
  return ends;
}

/* Appends a request to the running list (admission order). Caller holds e->mu. */
static void append_running_locked(ci_engine *e, ci_engine_request *r) {
  ci_engine_request **tail = &e->running;
  while (*tail) tail = &(*tail)->next;
  *tail = r;
  e->n_running++;
}

/* Ends a later choice whose first choice finished before its prefill ended (cancelled or
 * failed): with the first one's error, else as cancelled. Caller holds e->mu. */
static void finish_orphan_locked(ci_engine *e, ci_engine_request *r) {
  ci_engine_request *first = r->fork_of;
  char message[256] = "";
  pthread_mutex_lock(&first->mu);
  if (first->has_final && first->final.kind == CI_ENGINE_EVENT_ERROR)
    snprintf(message, sizeof message, "%s", first->final.message);
  pthread_mutex_unlock(&first->mu);
  finish_locked(e, r, CI_FINISH_ABORT, message[0] ? message : NULL);
}

/* The KV sequence of an admitted request, with its recurrent state and, when it speculates, its
 * state checkpoints (hybrid models: runs of arena slabs, taken here once so that no step
 * allocates). When the arena has no run free for them, the blocks only the prefix cache holds go
 * and it tries once more. NULL with ci_last_error. Caller holds e->mu. */
static ci_kv_seq *request_sequence(ci_engine *e, const ci_engine_request *r) {
  for (int attempt = 0;; attempt++) {
    ci_kv_seq *seq = ci_kv_seq_create(e->cache);
    if (seq && (r->spec_max == 0 || !ci_kv_seq_reserve_checkpoints(seq, r->spec_max + 1)))
      return seq;
    ci_kv_seq_free(seq);
    /* free slabs scattered between the prefix cache's blocks may hold no run long enough */
    if (attempt > 0 || !e->prefix || ci_kv_cache_state_bytes(e->cache) == 0) return NULL;
    ci_prefix_cache_trim(e->prefix, 0);
  }
}

/* Admission at a step boundary: FIFO, no overtaking; a cancelled queued request leaves.
 * Caller holds e->mu. */
static void admit_locked(ci_engine *e) {
  while (e->queue_head) {
    ci_engine_request *r = e->queue_head;
    /* the first of n choices is admitted for the whole group (slots and reservations); the
     * later ones follow it at once, without checks of their own */
    if (!r->cancelled && !r->fork_of) {
      if (e->n_running + r->group_size > e->o.batch) break;
      if (e->reserved + r->group_reservation > e->o.kv_budget_bytes) break;
      /* blocks only the prefix cache holds live inside the budget and give way to requests */
      if (e->prefix)
        ci_prefix_cache_trim(e->prefix, e->o.kv_budget_bytes - e->reserved - r->group_reservation);
      /* a hybrid model's state needs consecutive free slabs: while other requests run, one that
       * finds none waits at the head of the queue for them to give theirs back */
      r->seq = request_sequence(e, r);
      if (!r->seq && e->n_running > 0 && ci_kv_cache_state_bytes(e->cache) > 0) break;
    }
    e->queue_head = r->next;
    if (!e->queue_head) e->queue_tail = NULL;
    r->next = NULL;
    e->n_waiting--;
    if (r->cancelled) {
      finish_locked(e, r, CI_FINISH_ABORT, NULL);
      request_unref_locked(r);
      continue;
    }
    if (r->fork_of) {
      if (r->fork_of->state == REQ_FINISHED) { /* the first choice failed or was cancelled */
        finish_orphan_locked(e, r);
        request_unref_locked(r);
        continue;
      }
      r->t_admit = ci_now_seconds();
      r->state = REQ_FORK_WAIT;
      e->reserved += r->reservation;
      append_running_locked(e, r);
      continue;
    }
    int status = r->seq ? CI_OK : CI_ERR;
    if (!status)
      status = r->kv_plan == CI_KV_PLAN_TARGET
                   ? ci_kv_seq_set_plan_protected(r->seq, &r->kv_target, r->kv_start, r->kv_protect)
               : r->kv_plan == CI_KV_PLAN_MODEL_CONFIG
                   ? ci_model_kv_seq_apply_config(e->model, r->seq)
                   : CI_OK;
    if (status) {
      finish_locked(e, r, CI_FINISH_ABORT, ci_last_error());
      request_unref_locked(r);
      continue;
    }
    if (r->spec_max > 0) ci_kv_seq_set_rollback_reserve(r->seq, r->spec_max);
    if (r->spec_max > 0 && e->o.draft_model &&
        ci_draft_state_init(&r->draft, e->o.draft_model, e->draft_cache,
                            ci_sampler_get_params(r->sampler), ci_sampler_seed(r->sampler),
                            r->spec_max)) {
      finish_locked(e, r, CI_FINISH_ABORT, ci_last_error());
      request_unref_locked(r);
      continue;
    }
    r->t_admit = ci_now_seconds(); /* reading blocks from disk counts as prefill time */
    /* the request is in no list now and what attaching touches is this thread's alone, so
       submitters need not wait while blocks are read from disk */
    if (e->disk) pthread_mutex_unlock(&e->mu);
    attach_prefix(e, r);
    if (e->disk) pthread_mutex_lock(&e->mu);
    r->state = REQ_PREFILL;
    e->reserved += r->reservation;
    /* blocks read from disk that the request did not attach stay within the budget */
    if (r->disk_blocks > 0) ci_prefix_cache_trim(e->prefix, e->o.kv_budget_bytes - e->reserved);
    if (r->cached > 0)
      e->stats.prefix_hits++;
    else
      e->stats.prefix_misses++;
    e->stats.cached_tokens += r->cached;
    append_running_locked(e, r);
  }
}

/* Removes finished and cancelled sequences. Caller holds e->mu. */
static void sweep_locked(ci_engine *e) {
  int finished = 0;
  ci_engine_request **link = &e->running;
  while (*link) {
    ci_engine_request *r = *link;
    if ((r->cancelled || r->events_lost) && r->state != REQ_FINISHED)
      finish_locked(e, r, CI_FINISH_ABORT, NULL); /* events_lost: an error event */
    if (r->state == REQ_FORK_WAIT && r->fork_of->state == REQ_FINISHED)
      finish_orphan_locked(e, r); /* the first choice comes earlier in the list */
    if (r->state == REQ_FINISHED) {
      *link = r->next;
      r->next = NULL;
      e->n_running--;
      e->reserved -= r->reservation;
      if (!r->fork_of) e->stats.prompt_tokens += r->n_prompt; /* a group's prompt counts once */
      e->stats.generated_tokens += r->generated;
      request_unref_locked(r);
      finished = 1;
    } else {
      link = &r->next;
    }
  }
  if (finished && e->prefix) ci_prefix_cache_trim(e->prefix, e->o.prefix_cache_bytes);
}

/* A request's rows in this step. */
typedef struct {
  ci_engine_request *r;
  int rows;
} step_entry;

/* Samples the request's next token from its logits row and emits it. Returns CI_OK, or CI_ERR
 * (the request failed); *finished says it ended (EOS or length). */
static int sample_next(ci_engine *e, ci_engine_request *r, float *logits, int *finished,
                       ci_finish_reason *finish) {
  if (r->matcher) { /* the grammar mask (processor 5; -inf commutes with processors 1-4) */
    const int allowed = ci_grammar_matcher_apply(r->matcher, logits, r->eos.ids, r->eos.n);
    if (allowed < 0) return CI_ERR;
    if (allowed == 0) {
      if (!ci_grammar_matcher_is_complete(r->matcher))
        return ci_fail("the grammar allows no token of the vocabulary here");
      *finished = 1; /* complete, nothing may follow and no EOS to sample */
      *finish = CI_FINISH_STOP;
      return CI_OK;
    }
  }
  const int32_t token = ci_sampler_next(r->sampler, logits, r->history, (size_t)r->n_history);
  if (token < 0) return CI_ERR;
  if (r->matcher && !ci_eos_set_contains(&r->eos, token) &&
      ci_grammar_matcher_accept_token(r->matcher, token))
    return CI_ERR;
  *finished = take_token(e, r, token, ci_sampler_logprobs(r->sampler)[token], finish);
  return CI_OK;
}

/* Emits the step's greedy pick for a request whose sampler takes picks (no row was needed). */
static int take_pick(ci_engine *e, ci_engine_request *r, ci_row_pick pick, int *finished,
                     ci_finish_reason *finish) {
  if (pick.token < 0) return ci_fail("every token has a logit of -inf (all tokens banned)");
  ci_sampler_advance(r->sampler, 1);
  *finished = take_token(e, r, pick.token, pick.logprob, finish);
  return CI_OK;
}

/* Whether a step's logit rows for entry r can be its greedy picks alone: rows sampled (or a
 * speculative round verified) by a sampler that takes picks, with no grammar mask, no top
 * log-probabilities and no forked choices reading a row. */
static int takes_pick(const ci_engine_request *r) {
  const int one_choice = r->state == REQ_DECODE || r->group_size <= 1;
  return one_choice && !r->matcher && r->top_logprobs == 0 &&
         ci_sampler_takes_row_picks(r->sampler);
}

/* Ends a request of this step (failed or finished). */
static void end_in_step(ci_engine *e, ci_engine_request *r, int status, int finished,
                        ci_finish_reason finish) {
  if (!status && !finished) return;
  char message[256];
  snprintf(message, sizeof message, "%s", status ? ci_last_error() : "");
  pthread_mutex_lock(&e->mu);
  finish_locked(e, r, finish, status ? message : NULL);
  pthread_mutex_unlock(&e->mu);
}

/* Drafts a speculative round for a decoding request (docs/generation.md "Speculative
 * decoding", round step 1-2): prompt-lookup proposals, at most its adaptive draft length, the
 * tokens it may still sample after the pending one, and S - n - 1 while a KV conversion is
 * pending, written after its history; returns how many (0 = a plain decode step). It depends on
 * the request alone, never on the batch. */
static int plan_round(const ci_engine *e, ci_engine_request *r) {
  if (r->spec_max == 0) return 0;
  int64_t k = r->spec_len;
  const int64_t left = (int64_t)r->max_tokens - r->generated - 1;
  if (k > left) k = left;
  const int64_t limit = ci_kv_seq_chunk_limit(r->seq);
  if (limit != INT64_MAX && k > limit - 1) k = limit - 1;
  if (k <= 0) return 0;
  if (!e->o.draft_model)
    return ci_lookup_draft(r->history, r->n_history, e->o.lookup_ngram, 1, (int)k,
                           r->history + r->n_history);
  /* the draft model drafts later, for every sequence of the step at once (draft_step) */
  if (ci_draft_begin(&r->draft, r->history, r->n_history, (int)k, ci_sampler_index(r->sampler))) {
    snprintf(r->spec_error, sizeof r->spec_error, "%s", ci_last_error());
    return 0;
  }
  return (int)k;
}

/* The draft model drafts the planned rounds of entries spec_entry[0..n) together (one
 * draft-model step per drafted position, ci_draft_batch_run). On failure every one of them
 * fails at the step (its draft sequence is in no defined state). */
static void draft_step(ci_engine *e, step_entry *entries, int n) {
  for (int i = 0; i < n; i++) e->draft_states[i] = &entries[e->spec_entry[i]].r->draft;
  int steps = 0;
  double drafting_ms = 0;
  if (ci_draft_batch_run(&e->draft_batch, e->draft_states, n, &steps, &drafting_ms)) {
    for (int i = 0; i < n; i++) {
      ci_engine_request *r = entries[e->spec_entry[i]].r;
      snprintf(r->spec_error, sizeof r->spec_error, "%s", ci_last_error());
    }
    return;
  }
  ci_spec_policy_observe_draft(&e->policy, steps, drafting_ms);
  pthread_mutex_lock(&e->mu);
  e->stats.spec_draft_steps += steps;
  pthread_mutex_unlock(&e->mu);
}

/* Whether the step speculates, for entries[0..n) of which spec_entry[0..n_spec) planned drafts
 * (spec_k): the policy (engine/spec_policy.h), the spec_max_batch cap, or a forced choice. */
static int step_speculates(ci_engine *e, const step_entry *entries, int n, int n_decode,
                           int n_spec) {
  if (n_spec == 0) return 0;
  if (e->o.spec_policy == CI_ENGINE_SPEC_NEVER ||
      (e->o.spec_max_batch > 0 && n_decode > e->o.spec_max_batch))
    return 0;
  if (e->o.spec_policy == CI_ENGINE_SPEC_ALWAYS) return 1;
  /* a request that has not drafted yet has no acceptance of its own: its first round is measured */
  for (int i = 0; i < n_spec; i++)
    if (entries[e->spec_entry[i]].r->spec_drafted == 0) {
      e->policy.plain_run = 0;
      return 1;
    }
  int base_rows = 0, draft_steps = 0;
  for (int i = 0; i < n; i++) base_rows += entries[i].r->state == REQ_DECODE ? 1 : entries[i].rows;
  for (int i = 0; i < n_spec; i++) {
    const ci_engine_request *r = entries[e->spec_entry[i]].r;
    /* the request's own acceptance, starting from the running rate of all requests */
    e->spec_accept[i] = (r->spec_accepted + 4.0 * e->policy.accept) / (r->spec_drafted + 4.0);
    if (e->o.draft_model && e->spec_k[i] > draft_steps) draft_steps = e->spec_k[i];
  }
  return ci_spec_policy_decide(&e->policy, base_rows, n_decode, e->spec_k, e->spec_accept, n_spec,
                               draft_steps);
}

/* Verifies a round of rows = 1 + k rows (logits of x, d_1 .. d_k) and emits the accepted drafts
 * and the next token one by one (round steps 4-6): greedy keeps the longest prefix matching the
 * argmax, sampling runs the rejection test of spec_verify.h. The target's KV then keeps x and the
 * accepted drafts that were followed by another emitted token; the last emitted token is the
 * new pending one. With picks (a greedy request, takes_pick) the rows' picks stand for the
 * rows. Returns CI_OK or CI_ERR; *finished says the request ended. */
static int verify_round(ci_engine *e, ci_engine_request *r, float *logits, const ci_row_pick *picks,
                        int rows, int *finished, ci_finish_reason *finish) {
  const int64_t vocab = e->model->spec.vocab;
  const int k = rows - 1;
  const int64_t n0 = r->seq->n - rows;
  const int64_t n_hist0 = r->n_history;
  const float *q = e->o.draft_model ? r->draft.q : NULL;
  int emitted = 0, accepted = 0, status = CI_OK;
  for (int j = 0; j <= k && !*finished; j++) {
    float *row = logits + (int64_t)j * vocab;
    const uint64_t index = ci_sampler_index(r->sampler);
    int ok = 0;
    int32_t token;
    if (picks) { /* greedy: the row's pick is the token ci_spec_verify would take */
      token = picks[j].token;
      if (token < 0) ci_fail("every token has a logit of -inf (all tokens banned)");
      ok = j < k && token == r->history[r->n_history];
    } else if (j < k) { /* draft d_{j+1} sits where the next token goes */
      token =
          ci_spec_verify(r->sampler, &r->spec_scratch, row, r->history, (size_t)r->n_history, index,
                         r->history[r->n_history], q ? q + (int64_t)j * vocab : NULL, &ok);
    } else {
      token = ci_sampler_sample_at(r->sampler, row, r->history, (size_t)r->n_history, index);
    }
    if (token < 0) {
      status = CI_ERR;
      break;
    }
    ci_sampler_advance(r->sampler, 1);
    accepted += ok;
    emitted++;
    const float logprob = picks ? picks[j].logprob : ci_sampler_logprobs(r->sampler)[token];
    *finished = take_token(e, r, token, logprob, finish);
    if (!ok) break;
  }
  r->spec_drafted += k;
  r->spec_accepted += accepted;
  ci_spec_policy_observe_accept(&e->policy, k, accepted);
  /* counted before the request's final event can be read */
  pthread_mutex_lock(&e->mu);
  e->stats.spec_draft_tokens += k;
  e->stats.spec_accepted_tokens += accepted;
  pthread_mutex_unlock(&e->mu);
  /* adapt: all accepted -> one more next time; else the accepted length plus one */
  if (accepted == k)
    r->spec_len = r->spec_len < r->spec_max ? r->spec_len + 1 : r->spec_max;
  else
    r->spec_len = accepted + 1 > e->o.draft_min ? accepted + 1 : e->o.draft_min;
  if (r->spec_len > r->spec_max) r->spec_len = r->spec_max;
  if (ci_kv_seq_round_close(r->seq, n0 + (emitted > 0 ? emitted : 1)) && status == CI_OK)
    status = CI_ERR;
  /* the draft keeps the context it drafted from and the accepted drafts it has seen */
  if (q && ci_draft_state_keep(&r->draft, n_hist0 + (accepted < k - 1 ? accepted : k - 1)) &&
      status == CI_OK)
    status = CI_ERR;
  return status;
}

/* The first of n choices ended its prefill with `row`, the logits of its last prompt position:
 * each later choice still waiting forks its sequence (sharing every KV block; the first write
 * into a shared block copies it) and samples its own first token from a copy of the row. A
 * choice that cannot fork fails alone. Engine thread. */
static void fork_choices(ci_engine *e, ci_engine_request *first, const float *row) {
  const int64_t vocab = e->model->spec.vocab;
  for (ci_engine_request *r = first->next; r; r = r->next) {
    if (r->fork_of != first || r->state != REQ_FORK_WAIT) continue;
    r->seq = ci_kv_seq_fork(first->seq);
    int status = r->seq ? CI_OK : CI_ERR;
    if (!status && r->spec_max > 0) status = ci_kv_seq_reserve_checkpoints(r->seq, r->spec_max + 1);
    if (!status && r->spec_max > 0 && e->o.draft_model)
      status = ci_draft_state_init(&r->draft, e->o.draft_model, e->draft_cache,
                                   ci_sampler_get_params(r->sampler), ci_sampler_seed(r->sampler),
                                   r->spec_max);
    int finished = 0;
    ci_finish_reason finish = CI_FINISH_STOP;
    if (!status) {
      r->n_prefilled = r->n_prompt;
      r->cached = first->cached;
      r->conversion_counted = r->seq->converted; /* the first choice's conversion, shared */
      r->state = REQ_DECODE;
      memcpy(e->fork_logits, row, (size_t)vocab * sizeof *row);
      status = sample_next(e, r, e->fork_logits, &finished, &finish);
    }
    end_in_step(e, r, status, finished, finish);
  }
}

/* Picks the step's rows from a snapshot of the running list (only this thread changes it): a
 * decode row of every decoding sequence, then prefill chunks in admission order under the
 * token budget. A chunk never shrinks to fit the budget (that would make results depend on the
 * batch): it waits, unless it is the step's first prefill. Returns the number of entries. */
static int compose_step(ci_engine *e, step_entry *entries) {
  int n = 0, budget = e->o.batch_tokens, prefills = 0, n_spec = 0;
  for (ci_engine_request *r = e->running; r && n < e->o.batch; r = r->next)
    if (r->state == REQ_DECODE) {
      const int k = plan_round(e, r);
      if (k > 0) {
        e->spec_k[n_spec] = k;
        e->spec_entry[n_spec++] = n;
      }
      entries[n++] = (step_entry){r, 1 + k};
      budget -= 1 + k;
    }
  const int n_decode = n;
  for (ci_engine_request *r = e->running; r && n < e->o.batch; r = r->next) {
    if (r->state != REQ_PREFILL) continue;
    const int64_t chunk =
        chunk_rows(e, r->n_prompt - r->n_prefilled, ci_kv_seq_chunk_limit(r->seq));
    if (chunk > budget && prefills > 0) break;
    entries[n++] = (step_entry){r, (int)chunk};
    budget -= (int)chunk;
    prefills++;
  }
  /* the policy only changes draft lengths (to 0): greedy tokens stay the same; a declined step
   * still verifies the rounds of seeded sampling requests (spec_pinned) unless speculation is
   * off altogether */
  const int speculate = step_speculates(e, entries, n, n_decode, n_spec);
  int kept = 0;
  for (int i = 0; i < n_spec; i++) {
    const int pinned =
        entries[e->spec_entry[i]].r->spec_pinned && e->o.spec_policy != CI_ENGINE_SPEC_NEVER;
    if (speculate || pinned) {
      e->spec_entry[kept++] = e->spec_entry[i]; /* draft_step reads the rounds' k from them */
    } else {
      entries[e->spec_entry[i]].rows = 1;
    }
  }
  if (n_spec > 0) {
    pthread_mutex_lock(&e->mu);
    if (kept > 0)
      e->stats.spec_steps++;
    else
      e->stats.spec_declined_steps++;
    pthread_mutex_unlock(&e->mu);
  }
  if (kept > 0 && e->o.draft_model) draft_step(e, entries, kept);
  return n;
}

/* One step: every entry's rows (decode tokens and prefill chunks) in one forward, then each
 * request that reached the end of its prompt, or decodes, samples from its logits row. A
 * forward error fails every request of the step. */
static void engine_step(ci_engine *e) {
  step_entry entries[CI_ENGINE_MAX_BATCH];
  int n = compose_step(e, entries);
  /* KV blocks first, sequence by sequence: one that cannot get its blocks fails alone instead of
   * failing the step */
  int kept = 0;
  for (int i = 0; i < n; i++) {
    ci_engine_request *r = entries[i].r;
    const int round = r->state == REQ_DECODE && entries[i].rows > 1;
    if (r->spec_error[0]) {
      ci_fail("speculative drafting: %s", r->spec_error);
      end_in_step(e, r, CI_ERR, 0, CI_FINISH_STOP);
    } else if ((round && ci_kv_seq_round_open(r->seq, entries[i].rows)) ||
               ci_kv_seq_reserve(r->seq, entries[i].rows))
      end_in_step(e, r, CI_ERR, 0, CI_FINISH_STOP);
    else
      entries[kept++] = entries[i];
  }
  n = kept;
  if (n == 0) return;
  const int64_t vocab = e->model->spec.vocab;
  int64_t rows = 0, prefill_rows = 0;
  for (int i = 0; i < n; i++) {
    ci_engine_request *r = entries[i].r;
    const int decode = r->state == REQ_DECODE;
    if (!decode) prefill_rows += entries[i].rows;
    const int last = decode || r->n_prefilled + entries[i].rows == r->n_prompt;
    e->step_seqs[i] =
        (ci_step_seq){.seq = r->seq,
                      .lora = r->lora,
                      .ids = decode ? r->history + r->n_history - 1 : r->history + r->n_prefilled,
                      .n_rows = entries[i].rows,
                      .n_logit_rows = decode ? entries[i].rows
                                      : last ? 1
                                             : 0};
    rows += entries[i].rows;
  }
  /* whole logit rows only when a request needs one (a device then downloads them); a greedy
   * request takes its pick whatever the others need, so its tokens never depend on the batch */
  int rows_needed = 0, picks_needed = 0;
  for (int i = 0; i < n; i++) {
    if (e->step_seqs[i].n_logit_rows == 0) continue;
    const int picked = takes_pick(entries[i].r);
    picks_needed |= picked;
    rows_needed |= !picked;
  }
  /* the policy weighs the forward (drafting is timed on its own, in draft_step) */
  const double t0 = ci_now_seconds();
  const int step_status =
      ci_model_step_picks(e->model, e->ws, e->step_seqs, n, rows_needed ? e->logits : NULL,
                          picks_needed ? e->picks : NULL);
  if (!step_status)
    ci_spec_policy_observe_step(&e->policy, (int)rows, (ci_now_seconds() - t0) * 1e3);
  if (step_status) {
    for (int i = 0; i < n; i++) end_in_step(e, entries[i].r, CI_ERR, 0, CI_FINISH_STOP);
  } else {
    float *row = e->logits;
    const ci_row_pick *pick = e->picks;
    for (int i = 0; i < n; i++) {
      ci_engine_request *r = entries[i].r;
      const int round = r->state == REQ_DECODE && entries[i].rows > 1;
      const int picked = takes_pick(r);
      if (r->state == REQ_PREFILL) r->n_prefilled += entries[i].rows;
      if (!e->step_seqs[i].n_logit_rows) continue;
      const int forks = r->state == REQ_PREFILL && r->group_size > 1;
      r->state = REQ_DECODE;
      if (forks) fork_choices(e, r, row); /* before r's own sampling changes the row */
      int finished = 0;
      ci_finish_reason finish = CI_FINISH_STOP;
      const int status =
          round ? verify_round(e, r, row, picked ? pick : NULL, entries[i].rows, &finished, &finish)
          : picked ? take_pick(e, r, *pick, &finished, &finish)
                   : sample_next(e, r, row, &finished, &finish);
      row += vocab * e->step_seqs[i].n_logit_rows;
      pick += e->step_seqs[i].n_logit_rows;
      end_in_step(e, r, status, finished, finish);
    }
  }
  for (int i = 0; i < n; i++)
    if (entries[i].r->state != REQ_FINISHED) register_prefix(e, entries[i].r, 0);
  pthread_mutex_lock(&e->mu);
  for (int i = 0; i < n; i++) count_conversion_locked(e, entries[i].r);
  e->stats.steps++;
  e->stats.step_rows += rows;
  e->stats.prefill_tokens += prefill_rows;
  pthread_mutex_unlock(&e->mu);
}

/* Runs the waiting exclusive calls (mu held on entry and exit; released while one runs). */
static void run_exclusive_locked(ci_engine *e) {
  while (e->exclusive) {
    ci_engine_exclusive *x = e->exclusive;
    e->exclusive = x->next;
    pthread_mutex_unlock(&e->mu);
    const int result = x->fn(x->arg, e->model, e->ws, e->cache);
    pthread_mutex_lock(&e->mu);
    x->result = result;
    x->done = 1;
    pthread_cond_signal(&x->cv);
  }
}

int ci_engine_run_exclusive(ci_engine *e, ci_engine_exclusive_fn fn, void *arg) {
  ci_engine_exclusive x = {.fn = fn, .arg = arg, .result = CI_ERR};
  pthread_cond_init(&x.cv, NULL);
  pthread_mutex_lock(&e->mu);
  if (e->stopping) {
    pthread_mutex_unlock(&e->mu);
    pthread_cond_destroy(&x.cv);
    return ci_fail("the engine is stopping");
  }
  ci_engine_exclusive **tail = &e->exclusive;
  while (*tail) tail = &(*tail)->next;
  *tail = &x;
  pthread_cond_signal(&e->cv);
  while (!x.done) pthread_cond_wait(&x.cv, &e->mu);
  pthread_mutex_unlock(&e->mu);
  pthread_cond_destroy(&x.cv);
  if (x.result == -2) return ci_fail("the engine stopped before running the call");
  return x.result;
}

static void *engine_main(void *arg) {
  ci_engine *e = arg;
  pthread_mutex_lock(&e->mu);
  for (;;) {
    sweep_locked(e);
    if (e->stopping) break;
    run_exclusive_locked(e);
    admit_locked(e);
    e->stats.running = e->n_running;
    e->stats.waiting = e->n_waiting;
    e->stats.reserved_bytes = e->reserved;
    e->stats.blocks_used = ci_kv_cache_blocks_used(e->cache);
    e->stats.bytes_used = ci_kv_cache_bytes_used(e->cache);
    e->stats.n_kv_formats =
        ci_kv_cache_usage_by_format(e->cache, e->stats.kv_formats, CI_ENGINE_MAX_KV_FORMATS);
    if (e->prefix) {
      ci_prefix_cache_stats pcs;
      ci_prefix_cache_get_stats(e->prefix, &pcs);
      e->stats.prefix_cache_bytes = pcs.bytes;
      e->stats.prefix_cache_blocks = pcs.blocks;
      e->stats.prefix_cache_entries = pcs.nodes;
    }
    if (e->n_running == 0 && !e->exclusive) {
      pthread_cond_wait(&e->cv, &e->mu);
      continue;
    }
    pthread_mutex_unlock(&e->mu);
    engine_step(e);
    pthread_mutex_lock(&e->mu);
  }
  /* shutdown: exclusive calls still waiting fail; everything still running or queued ends with
     an error event */
  for (ci_engine_exclusive *x = e->exclusive, *next; x; x = next) {
    next = x->next;
    x->result = -2;
    x->done = 1;
    pthread_cond_signal(&x->cv);
  }
  e->exclusive = NULL;
  for (ci_engine_request *r = e->running, *next; r; r = next) {
    next = r->next;
    finish_locked(e, r, CI_FINISH_ABORT, "the server is shutting down");
    request_unref_locked(r);
  }
  e->running = NULL;
  for (ci_engine_request *r = e->queue_head, *next; r; r = next) {
    next = r->next;
    finish_locked(e, r, CI_FINISH_ABORT, "the server is shutting down");
    request_unref_locked(r);
  }
  e->queue_head = e->queue_tail = NULL;
  pthread_mutex_unlock(&e->mu);
  return NULL;
}

void ci_engine_get_stats(ci_engine *e, ci_engine_stats *stats) {
  pthread_mutex_lock(&e->mu);
  *stats = e->stats;
  pthread_mutex_unlock(&e->mu);
  if (e->disk) { /* the writer's counters move between steps too */
    ci_prompt_cache_stats ds;
    ci_prompt_cache_get_stats(e->disk, &ds);
    stats->prompt_cache_blocks_written = ds.blocks_written;
    stats->prompt_cache_bytes_written = ds.bytes_written;
    stats->prompt_cache_blocks_dropped = ds.blocks_dropped;
    stats->prompt_cache_write_errors = ds.write_errors;
    stats->prompt_cache_blocks_loaded = ds.blocks_loaded;
    stats->prompt_cache_bytes_loaded = ds.bytes_loaded;
    stats->prompt_cache_files_rejected = ds.files_rejected;
    stats->prompt_cache_queued_bytes = ds.queued_bytes;
  }
}

/* ==== Prompt cache on disk: explicit save and load ==== */

typedef struct {
  ci_engine *e;
  int64_t taken;
} save_call;

/* The save hook: queues a block while the writer's queue has room. */
static int save_block(void *arg, const ci_prefix_block *block) {
  save_call *call = arg;
  const char *text = key_text_of(call->e, block->key);
  if (!text) return -1; /* its key is forgotten: it cannot be named on disk */
  return ci_prompt_cache_enqueue(call->e->disk, text, block);
}

static int save_some(void *arg, ci_model *model, ci_workspace *ws, ci_kv_cache *cache) {
  (void)model, (void)ws, (void)cache;
  save_call *call = arg;
  call->taken = ci_prefix_cache_each_unpersisted(call->e->prefix, save_block, call);
  return CI_OK;
}

int ci_engine_prompt_cache_save(ci_engine *e, int64_t *blocks) {
  if (blocks) *blocks = 0;
  if (!e->disk) return ci_fail("the engine has no prompt cache directory");
  int64_t total = 0;
  for (;;) { /* a queue's worth at a time, written out before the next */
    save_call call = {e, 0};
    if (ci_engine_run_exclusive(e, save_some, &call)) return CI_ERR;
    ci_prompt_cache_flush(e->disk);
    total += call.taken;
    if (call.taken == 0) break;
  }
  if (blocks) *blocks = total;
  return CI_OK;
}

typedef struct {
  ci_engine *e;
  const ci_engine_job *job;
  int64_t cached, loaded;
} load_call;

/* The bytes an explicit load may add to the prefix cache: what its cap and the KV budget left by
 * running requests' reservations both still allow (engine thread). */
static int64_t load_room(const ci_engine *e) {
  const int64_t held = ci_prefix_cache_bytes(e->prefix);
  const int64_t by_cap = e->o.prefix_cache_bytes - held;
  const int64_t by_budget = e->o.kv_budget_bytes - e->reserved - held;
  return by_cap < by_budget ? by_cap : by_budget;
}

static int load_some(void *arg, ci_model *model, ci_workspace *ws, ci_kv_cache *cache) {
  (void)ws;
  load_call *call = arg;
  ci_engine *e = call->e;
  const ci_engine_job *job = call->job;
  ci_kv_seq *seq = ci_kv_seq_create(cache);
  if (!seq) return ci_fail("every sequence slot is in use; try again later");
  int status =
      job->kv_plan == CI_KV_PLAN_TARGET
          ? ci_kv_seq_set_plan_protected(seq, &job->kv_target, job->kv_start, job->kv_protect)
      : job->kv_plan == CI_KV_PLAN_MODEL_CONFIG ? ci_model_kv_seq_apply_config(model, seq)
                                                : CI_OK;
  if (status) {
    ci_kv_seq_free(seq);
    return CI_ERR;
  }
  const int64_t T = cache->block_tokens, n_blocks = job->n_prompt / T;
  /* the states attach_prefix looks for: converted at the offset the request would reach, and
     (below a later start, or without a plan) the base format */
  int64_t c = 0;
  if (seq->has_plan) {
    c = seq->start > 0 ? seq->start : chunk_rows(e, job->n_prompt, INT64_MAX);
    const int64_t room = load_room(e);
    const uint64_t key = prefix_key(e, seq, 1, c, job->lora);
    if (n_blocks * T >= c && room > 0)
      call->loaded += fill_from_disk(e, seq, key, 1, job->prompt, n_blocks, room);
    const int64_t found = ci_prefix_cache_lookup(e->prefix, key, job->prompt, n_blocks) * T;
    call->cached = found >= c ? found : 0;
  }
  if (!seq->has_plan || (call->cached == 0 && seq->start > 0)) {
    const int64_t below = seq->has_plan ? (seq->start - 1) / T : n_blocks;
    const int64_t max_blocks = below < n_blocks ? below : n_blocks;
    const uint64_t key = prefix_key(e, seq, 0, 0, job->lora);
    const int64_t room = load_room(e);
    if (room > 0) call->loaded += fill_from_disk(e, seq, key, 0, job->prompt, max_blocks, room);
    call->cached = ci_prefix_cache_lookup(e->prefix, key, job->prompt, max_blocks) * T;
  }
  ci_kv_seq_free(seq);
  return CI_OK;
}

int ci_engine_prompt_cache_load(ci_engine *e, const ci_engine_job *job, int64_t *cached_tokens,
                                int64_t *loaded_blocks) {
  *cached_tokens = 0;
  if (loaded_blocks) *loaded_blocks = 0;
  if (!e->disk) return ci_fail("the engine has no prompt cache directory");
  if (job->n_prompt < 1) return ci_fail("the prompt is empty");
  for (int i = 0; i < job->n_prompt; i++)
    if (job->prompt[i] < 0 || job->prompt[i] >= e->model->spec.vocab)
      return ci_fail("token id %d at position %d is outside the vocabulary", job->prompt[i], i);
  load_call call = {e, job, 0, 0};
  if (ci_engine_run_exclusive(e, load_some, &call)) return CI_ERR;
  *cached_tokens = call.cached;
  if (loaded_blocks) *loaded_blocks = call.loaded;
  return CI_OK;
}

void ci_engine_stop(ci_engine *e) {
  pthread_mutex_lock(&e->mu);
  const int joined = e->joined;
  e->stopping = 1;
  e->joined = 1;
  pthread_cond_signal(&e->cv);
  pthread_mutex_unlock(&e->mu);
  if (!joined) pthread_join(e->thread, NULL);
}

void ci_engine_free(ci_engine *e) {
  if (!e) return;
  ci_engine_stop(e);
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->cv);
  engine_free_parts(e);
}
