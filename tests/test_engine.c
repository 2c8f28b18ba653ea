/* The serving engine (engine/engine.h): batch invariance (a greedy request gives the same tokens
 * alone and among concurrent requests of other lengths and KV codecs, joining mid-flight),
 * cancellation frees blocks, admission rejects what can never fit, the bounded queue, the
 * final event survives an event queue that cannot grow, and n > 1 choices share one prefill. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "backend/cpu/cpu_backend.h"
#include "base/error.h"
#include "engine/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STARTER CI_FIXTURE_DIR "/../../models/starter"

/* Test hook of this executable only (linked with -Wl,--wrap=realloc, tests/CMakeLists.txt): while
 * armed, growing a request's event queue from 16 to 32 events fails. */
void *__real_realloc(void *p, size_t n);
void *__wrap_realloc(void *p, size_t n);
static int fail_event_growth; /* set before submit, cleared after the request ended */
void *__wrap_realloc(void *p, size_t n) {
  if (fail_event_growth && n == 32 * sizeof(ci_engine_event)) return NULL;
  return __real_realloc(p, n);
}

typedef struct {
  ci_backend *be;
  ci_model *model;
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  f->be = ci_cpu_backend_create(1);
  f->model = f->be ? ci_model_load(STARTER, f->be) : NULL;
  if (!f->model) {
    fprintf(stderr, "cannot load %s: %s\n", STARTER, ci_last_error());
    return -1;
  }
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  ci_model_free(f->model);
  f->be->ops->destroy(f->be);
  free(f);
  return 0;
}

enum { N_REQ = 4, MAX_GEN = 16 };

/* Request i: a prompt of 5 + 9 i tokens, max_tokens 5, 8, 11, 14, codec bf16 / affine 8 /
 * turbo 4 / affine 4 (from position 8); 0 and 1 greedy (their steps return row picks), 2 greedy
 * with top log-probabilities and 3 sampling at temperature 0.8 with a seed (their steps return
 * whole rows), so batched steps mix picks and rows. */
static void make_job(int i, int32_t *prompt, ci_engine_job *job) {
  memset(job, 0, sizeof *job);
  const int n = 5 + 9 * i;
  for (int t = 0; t < n; t++) prompt[t] = 100 + (int32_t)((t * 37 + i * 101) % 3000);
  job->prompt = prompt;
  job->n_prompt = n;
  job->max_tokens = 5 + 3 * i;
  ci_sampler_params_default(&job->sampling);
  job->sampling.temperature = i == 3 ? 0.8f : 0.0f;
  job->sampling.seed = 7;
  job->sampling.has_seed = 1;
  job->top_logprobs = i == 2 ? 2 : 0;
  static const char *const codecs[N_REQ] = {"bf16", "affine", "turbo", "affine"};
  static const int bits[N_REQ] = {0, 8, 4, 4};
  if (i == 0) {
    job->kv_plan = CI_KV_PLAN_NONE;
  } else {
    job->kv_plan = CI_KV_PLAN_TARGET;
    assert_int_equal(ci_kv_format_parse(codecs[i], bits[i], 0, 64, &job->kv_target), 0);
    job->kv_start = i == 3 ? 8 : 0;
  }
}

/* Collects a request's tokens (and, when lps is not NULL, their logprobs) until DONE; returns the
 * count. */
static int collect_lps(ci_engine_request *r, int32_t *out, float *lps, ci_engine_event *done) {
  int n = 0;
  ci_engine_event ev;
  for (;;) {
    assert_int_equal(ci_engine_request_next(r, &ev, 60.0), 1);
    if (ev.kind == CI_ENGINE_EVENT_TOKEN) {
      assert_true(n < MAX_GEN);
      if (lps) lps[n] = ev.logprob;
      out[n++] = ev.token;
      continue;
    }
    assert_int_equal(ev.kind, CI_ENGINE_EVENT_DONE);
    *done = ev;
    return n;
  }
}

static int collect(ci_engine_request *r, int32_t *out, ci_engine_event *done) {
  return collect_lps(r, out, NULL, done);
}

static ci_engine *small_engine(fixture *f, int batch, int batch_tokens) {
  ci_engine_options o;
  ci_engine_options_default(&o);
  o.batch = batch;
  o.batch_tokens = batch_tokens;
  o.prefill_chunk = 7;
  o.ctx_size = 256;
  ci_engine *e = ci_engine_create(f->model, &o);
  assert_non_null(e);
  return e;
}

static void test_batch_invariance(void **state) {
  fixture *f = *state;
  int32_t prompts[N_REQ][64];
  ci_engine_job jobs[N_REQ];
  int32_t solo[N_REQ][MAX_GEN], batched[N_REQ][MAX_GEN];
  float solo_lps[N_REQ][MAX_GEN], batched_lps[N_REQ][MAX_GEN];
  int n_solo[N_REQ], n_batched[N_REQ];
  for (int i = 0; i < N_REQ; i++) make_job(i, prompts[i], &jobs[i]);

  ci_engine *e = small_engine(f, 1, 8);
  for (int i = 0; i < N_REQ; i++) {
    ci_engine_request *r;
    assert_int_equal(ci_engine_submit(e, &jobs[i], &r), CI_ENGINE_SUBMITTED);
    ci_engine_event done;
    n_solo[i] = collect_lps(r, solo[i], solo_lps[i], &done);
    assert_int_equal(done.generated_tokens, jobs[i].max_tokens);
    assert_int_equal(done.finish, CI_FINISH_LENGTH);
    ci_engine_request_release(r);
  }
  ci_engine_free(e);

  /* all four together, the later ones joining while the first decodes; a small token budget
   * forces prefill chunks to interleave with decode rows */
  e = small_engine(f, 4, 8);
  ci_engine_request *reqs[N_REQ];
  assert_int_equal(ci_engine_submit(e, &jobs[0], &reqs[0]), CI_ENGINE_SUBMITTED);
  ci_engine_event first;
  assert_int_equal(ci_engine_request_next(reqs[0], &first, 60.0), 1);
  assert_int_equal(first.kind, CI_ENGINE_EVENT_TOKEN);
  for (int i = 1; i < N_REQ; i++)
    assert_int_equal(ci_engine_submit(e, &jobs[i], &reqs[i]), CI_ENGINE_SUBMITTED);
  batched[0][0] = first.token;
  batched_lps[0][0] = first.logprob;
  for (int i = 0; i < N_REQ; i++) {
    ci_engine_event done;
    n_batched[i] =
        collect_lps(reqs[i], batched[i] + (i == 0), batched_lps[i] + (i == 0), &done) + (i == 0);
    ci_engine_request_release(reqs[i]);
  }
  for (int i = 0; i < N_REQ; i++) {
    assert_int_equal(n_batched[i], n_solo[i]);
    assert_memory_equal(batched[i], solo[i], (size_t)n_solo[i] * sizeof(int32_t));
    assert_memory_equal(batched_lps[i], solo_lps[i], (size_t)n_solo[i] * sizeof(float));
  }
  ci_engine_stats st;
  for (int tries = 0; tries < 100; tries++) { /* the sweep runs at the next boundary */
    ci_engine_get_stats(e, &st);
    if (st.running == 0 && st.blocks_used == st.prefix_cache_blocks) break;
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
  assert_int_equal(st.blocks_used, st.prefix_cache_blocks); /* only the prefix cache holds KV */
  ci_engine_free(e);
}

static void test_cancel_frees_blocks(void **state) {
  fixture *f = *state;
  ci_engine *e = small_engine(f, 2, 64);
  int32_t prompt[64];
  ci_engine_job job;
  make_job(2, prompt, &job);
  job.max_tokens = 200;
  ci_engine_request *r;
  assert_int_equal(ci_engine_submit(e, &job, &r), CI_ENGINE_SUBMITTED);
  ci_engine_event ev;
  assert_int_equal(ci_engine_request_next(r, &ev, 60.0), 1);
  assert_int_equal(ev.kind, CI_ENGINE_EVENT_TOKEN);
  ci_engine_stats st;
  ci_engine_get_stats(e, &st);
  ci_engine_request_cancel(r);
  for (;;) {
    assert_int_equal(ci_engine_request_next(r, &ev, 60.0), 1);
    if (ev.kind != CI_ENGINE_EVENT_TOKEN) break;
  }
  assert_int_equal(ev.kind, CI_ENGINE_EVENT_DONE);
  assert_int_equal(ev.finish, CI_FINISH_ABORT);
  assert_true(ev.generated_tokens < 200);
  ci_engine_request_release(r);
  for (int tries = 0; tries < 100; tries++) {
    ci_engine_get_stats(e, &st);
    if (st.blocks_used == st.prefix_cache_blocks && st.running == 0) break;
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
  assert_int_equal(st.blocks_used, st.prefix_cache_blocks);
  assert_int_equal(st.requests_cancelled, 1);
  /* released without reading: the engine cancels it */
  assert_int_equal(ci_engine_submit(e, &job, &r), CI_ENGINE_SUBMITTED);
  ci_engine_request_release(r);
  ci_engine_free(e);
}

static void test_admission(void **state) {
  fixture *f = *state;
  ci_engine_options o;
  ci_engine_options_default(&o);
  o.batch = 1;
  o.max_queue = 1;
  o.ctx_size = 512;
  ci_engine *tmp = ci_engine_create(f->model, &o);
  assert_non_null(tmp);
  o.kv_budget_bytes = ci_engine_reservation_bytes(tmp, 100);
  ci_engine_free(tmp);
  ci_engine *e = ci_engine_create(f->model, &o);
  int32_t prompt[64];
  ci_engine_job job;
  make_job(1, prompt, &job);
  ci_engine_request *r = NULL, *r2 = NULL, *r3 = NULL;
  job.max_tokens = 400; /* 414 tokens: over the budget */
  assert_int_equal(ci_engine_submit(e, &job, &r), CI_ENGINE_OVER_BUDGET);
  assert_non_null(strstr(ci_last_error(), "memory budget caps a request at"));
  /* the reservation follows the request's codec plan: turbo 4-bit from the start holds 394
   * tokens in about a quarter of the bytes (with its blocks' share of the arena's slabs), so it
   * fits where bf16 does not */
  ci_engine_job turbo_job = job;
  turbo_job.max_tokens = 380;
  turbo_job.kv_plan = CI_KV_PLAN_TARGET;
  assert_int_equal(ci_kv_format_parse("turbo", 4, 0, 0, &turbo_job.kv_target), 0);
  turbo_job.kv_start = 0;
  if (ci_engine_submit(e, &turbo_job, &r) != CI_ENGINE_SUBMITTED) fail_msg("%s", ci_last_error());
  ci_engine_request_cancel(r);
  ci_engine_event cancelled;
  do assert_int_equal(ci_engine_request_next(r, &cancelled, 60.0), 1);
  while (cancelled.kind == CI_ENGINE_EVENT_TOKEN);
  assert_int_equal(cancelled.kind, CI_ENGINE_EVENT_DONE);
  ci_engine_request_release(r);
  turbo_job.kv_protect = 1; /* the engine's cache keeps no layer apart */
  assert_int_equal(ci_engine_submit(e, &turbo_job, &r), CI_ENGINE_REJECTED);
  assert_non_null(strstr(ci_last_error(), "at most 0 layers"));
  turbo_job.kv_protect = 0;
  turbo_job.kv_start = 300; /* bf16 until 300 tokens: over the budget again */
  assert_int_equal(ci_engine_submit(e, &turbo_job, &r), CI_ENGINE_OVER_BUDGET);
  job.max_tokens = 600; /* over the context */
  assert_int_equal(ci_engine_submit(e, &job, &r), CI_ENGINE_OVER_CONTEXT);
  assert_non_null(strstr(ci_last_error(), "context size"));
  prompt[0] = 1 << 30;
  job.max_tokens = 4;
  assert_int_equal(ci_engine_submit(e, &job, &r), CI_ENGINE_REJECTED);
  prompt[0] = 7;
  /* batch 1, queue 1: the third concurrent request finds the queue full */
  job.max_tokens = 60;
  assert_int_equal(ci_engine_submit(e, &job, &r), CI_ENGINE_SUBMITTED);
  ci_engine_event ev;
  assert_int_equal(ci_engine_request_next(r, &ev, 60.0), 1); /* r is running */
  assert_int_equal(ci_engine_submit(e, &job, &r2), CI_ENGINE_SUBMITTED);
  assert_int_equal(ci_engine_submit(e, &job, &r3), CI_ENGINE_QUEUE_FULL);
  assert_null(r3);
  ci_engine_request_release(r);
  ci_engine_event done;
  int32_t toks[MAX_GEN * 8];
  (void)toks;
  int n = 0;
  for (;;) {
    assert_int_equal(ci_engine_request_next(r2, &done, 60.0), 1);
    if (done.kind != CI_ENGINE_EVENT_TOKEN) break;
    n++;
  }
  assert_int_equal(done.kind, CI_ENGINE_EVENT_DONE);
  assert_int_equal(n, done.generated_tokens - (done.finish == CI_FINISH_STOP));
  ci_engine_request_release(r2);
  ci_engine_free(e);
}

/* Runs one greedy job to the end on `e`; returns the token count, fills the DONE event. */
static int run_job(ci_engine *e, const ci_engine_job *job, int32_t *out, ci_engine_event *done) {
  ci_engine_request *r;
  assert_int_equal(ci_engine_submit(e, job, &r), CI_ENGINE_SUBMITTED);
  const int n = collect(r, out, done);
  ci_engine_request_release(r);
  return n;
}

/* Prefix cache (docs/generation.md §7, §11 invariant 6): a repeated prompt, a prompt extending an
 * earlier conversation, and a fully cached prompt (one token forwarded) give the tokens the same
 * request gives with no cache, for bf16 and for quantized plans (converted and not yet converted
 * blocks); cached_tokens is the attached length, a multiple of the block size. */
static void test_prefix_cache(void **state) {
  fixture *f = *state;
  enum { N_PLANS = 4, P = 70, GEN = 10 };
  for (int plan = 0; plan < N_PLANS; plan++) {
    int32_t prompt[128];
    ci_engine_job job;
    make_job(0, prompt, &job);
    for (int t = 0; t < P; t++) prompt[t] = 200 + (int32_t)((t * 53 + plan * 7) % 2500);
    job.n_prompt = P;
    job.max_tokens = GEN;
    if (plan > 0) {
      job.kv_plan = CI_KV_PLAN_TARGET;
      assert_int_equal(ci_kv_format_parse(plan == 1 ? "turbo" : "affine", 4, 0, 64, &job.kv_target),
                       0);
      /* converted blocks (from the first chunk, from 40); bf16 blocks below a later start */
      static const int64_t starts[N_PLANS] = {0, 0, 40, 100};
      job.kv_start = starts[plan];
    }
    /* the three prompts: X, X again (cached), then X + its answer + more (a next turn), and
     * X's first 65 tokens (fully cached: 64 = P - 1) */
    int32_t ref[3][MAX_GEN], got[MAX_GEN];
    int n_ref[3];
    ci_engine_event done;
    ci_engine_options o;
    ci_engine_options_default(&o);
    o.prefill_chunk = 7;
    o.batch_tokens = 64;
    o.ctx_size = 256;
    o.prefix_cache_bytes = 0;
    ci_engine *plain = ci_engine_create(f->model, &o);
    assert_non_null(plain);
    n_ref[0] = run_job(plain, &job, ref[0], &done);
    int32_t next[128];
    memcpy(next, prompt, P * sizeof *next);
    memcpy(next + P, ref[0], (size_t)n_ref[0] * sizeof *next);
    for (int t = 0; t < 20; t++) next[P + n_ref[0] + t] = 300 + t;
    ci_engine_job next_job = job;
    next_job.prompt = next;
    next_job.n_prompt = P + n_ref[0] + 20;
    n_ref[1] = run_job(plain, &next_job, ref[1], &done);
    assert_int_equal(done.cached_tokens, 0);
    ci_engine_job short_job = job;
    short_job.n_prompt = 65;
    n_ref[2] = run_job(plain, &short_job, ref[2], &done);
    ci_engine_free(plain);

    o.prefix_cache_bytes = 64 << 20;
    ci_engine *e = ci_engine_create(f->model, &o);
    assert_non_null(e);
    int n = run_job(e, &job, got, &done);
    assert_int_equal(done.cached_tokens, 0);
    assert_int_equal(n, n_ref[0]);
    assert_memory_equal(got, ref[0], (size_t)n * sizeof *got);
    n = run_job(e, &job, got, &done); /* X again: 4 full blocks of its 69 forwardable tokens */
    assert_int_equal(done.cached_tokens, 64);
    assert_int_equal(n, n_ref[0]);
    assert_memory_equal(got, ref[0], (size_t)n * sizeof *got);
    n = run_job(e, &next_job, got, &done); /* X's stored 79 tokens: 4 full blocks */
    assert_int_equal(done.cached_tokens, 64);
    assert_int_equal(n, n_ref[1]);
    assert_memory_equal(got, ref[1], (size_t)n * sizeof *got);
    n = run_job(e, &short_job, got, &done);
    assert_int_equal(done.cached_tokens, 64);
    assert_int_equal(n, n_ref[2]);
    assert_memory_equal(got, ref[2], (size_t)n * sizeof *got);

    ci_engine_stats st;
    for (int tries = 0; tries < 100; tries++) {
      ci_engine_get_stats(e, &st);
      if (st.running == 0 && st.blocks_used == st.prefix_cache_blocks) break;
      struct timespec ts = {0, 10000000};
      nanosleep(&ts, NULL);
    }
    assert_int_equal(st.blocks_used, st.prefix_cache_blocks);
    assert_true(st.prefix_cache_blocks > 0);
    assert_int_equal(st.prefix_hits, 3);
    assert_int_equal(st.prefix_misses, 1);
    assert_int_equal(st.cached_tokens, 3 * 64);
    ci_engine_free(e);
  }
}

/* The byte cap: with room for a few blocks only, the cache evicts down to the cap at each
 * finish and still serves what it kept. */
static void test_prefix_cache_cap(void **state) {
  fixture *f = *state;
  ci_engine_options o;
  ci_engine_options_default(&o);
  o.ctx_size = 256;
  o.prefix_cache_bytes = 1; /* resolved below to a few blocks' worth */
  ci_engine *probe = ci_engine_create(f->model, &o);
  assert_non_null(probe);
  const int64_t per_block = ci_engine_reservation_bytes(probe, 16);
  ci_engine_free(probe);
  o.prefix_cache_bytes = 3 * per_block;
  ci_engine *e = ci_engine_create(f->model, &o);
  assert_non_null(e);
  int32_t prompt[128], got[MAX_GEN];
  ci_engine_job job;
  make_job(0, prompt, &job);
  ci_engine_event done;
  for (int round = 0; round < 4; round++) {
    for (int t = 0; t < 100; t++) prompt[t] = 100 + (int32_t)((t * 31 + round * 977) % 2900);
    job.n_prompt = 100;
    job.max_tokens = 4;
    run_job(e, &job, got, &done);
    ci_engine_stats st;
    for (int tries = 0; tries < 100; tries++) {
      ci_engine_get_stats(e, &st);
      if (st.running == 0 && st.blocks_used == st.prefix_cache_blocks) break;
      struct timespec ts = {0, 10000000};
      nanosleep(&ts, NULL);
    }
    assert_true(st.prefix_cache_bytes <= 3 * per_block);
    assert_true(st.prefix_cache_bytes > 0);
    assert_int_equal(st.blocks_used, st.prefix_cache_blocks);
  }
  ci_engine_free(e);
}

/* A token that cannot be queued fails the request instead of vanishing: the reader gets the tokens
 * queued before it, then an ERROR (never a hang); after the final event nothing more comes. */
static void test_final_event_not_lost(void **state) {
  fixture *f = *state;
  ci_engine *e = small_engine(f, 1, 64);
  int32_t prompt[64];
  ci_engine_job job;
  make_job(0, prompt, &job);
  job.max_tokens = 40;
  job.eos.n = 0; /* all 40 tokens, unless the queue fails */
  ci_engine_request *r;
  fail_event_growth = 1;
  assert_int_equal(ci_engine_submit(e, &job, &r), CI_ENGINE_SUBMITTED);
  ci_engine_stats st;
  for (int tries = 0; tries < 6000; tries++) { /* read nothing until the request has ended */
    ci_engine_get_stats(e, &st);
    if (st.requests_failed + st.requests_finished > 0 && st.running == 0) break;
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
  fail_event_growth = 0;
  assert_int_equal(st.requests_failed, 1);
  ci_engine_event ev;
  int tokens = 0;
  for (;;) {
    assert_int_equal(ci_engine_request_next(r, &ev, 60.0), 1);
    if (ev.kind != CI_ENGINE_EVENT_TOKEN) break;
    tokens++;
  }
  assert_int_equal(tokens, 16); /* the queue's first capacity */
  assert_int_equal(ev.kind, CI_ENGINE_EVENT_ERROR);
  assert_non_null(strstr(ev.message, "out of memory"));
  assert_int_equal(ci_engine_request_next(r, &ev, 0.0), 0);
  ci_engine_request_release(r);
  /* a request that ends normally: DONE once, then nothing (no wait) */
  job.max_tokens = 3;
  assert_int_equal(ci_engine_submit(e, &job, &r), CI_ENGINE_SUBMITTED);
  int32_t out[MAX_GEN];
  ci_engine_event done;
  assert_int_equal(collect(r, out, &done), 3);
  assert_int_equal(done.finish, CI_FINISH_LENGTH);
  assert_int_equal(ci_engine_request_next(r, &ev, -1.0), 0);
  ci_engine_request_release(r);
  ci_engine_free(e);
}

/* Waits until the engine runs nothing; returns its stats. */
static void wait_idle(ci_engine *e, ci_engine_stats *st) {
  for (int tries = 0; tries < 500; tries++) {
    ci_engine_get_stats(e, st);
    if (st->running == 0 && st->waiting == 0 && st->blocks_used == st->prefix_cache_blocks) return;
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
}

/* n > 1 choices (ci_engine_submit_n): the prompt is prefilled once (prefill_tokens grows by P,
 * prompt_tokens by P), and choice i gives exactly the tokens a solo request seeded with
 * ci_engine_choice_seed(seed, i) gives, for bf16 and quantized plans converted before and after
 * the fork: the shared blocks (the last one half full, so the first write copies it) are never
 * written by another choice. Every block is free afterwards. */
static void test_choices(void **state) {
  fixture *f = *state;
  enum { N = 3, P = 37, GEN = 12, N_PLANS = 3 };
  ci_engine_options o;
  ci_engine_options_default(&o);
  o.batch = 4;
  o.batch_tokens = 64;
  o.prefill_chunk = 7;
  o.ctx_size = 256;
  o.prefix_cache_bytes = 0; /* every prompt token forwarded is counted */
  ci_engine *e = ci_engine_create(f->model, &o);
  assert_non_null(e);
  for (int plan = 0; plan < N_PLANS; plan++) {
    int32_t prompt[64];
    ci_engine_job job;
    make_job(0, prompt, &job);
    for (int t = 0; t < P; t++) prompt[t] = 300 + (int32_t)((t * 71 + plan) % 2000);
    job.n_prompt = P;
    job.max_tokens = GEN;
    job.sampling.temperature = 1.0f;
    job.sampling.has_seed = 1;
    job.sampling.seed = 7 + (uint64_t)plan;
    if (plan > 0) { /* converted at the first chunk (before the fork), or at 40 (after it) */
      job.kv_plan = CI_KV_PLAN_TARGET;
      assert_int_equal(ci_kv_format_parse("affine", 4, 0, 64, &job.kv_target), 0);
      job.kv_start = plan == 1 ? 0 : 40;
    }
    ci_engine_stats before, after;
    wait_idle(e, &before);
    ci_engine_request *r[N];
    assert_int_equal(ci_engine_submit_n(e, &job, N, r), CI_ENGINE_SUBMITTED);
    int32_t got[N][MAX_GEN];
    int n_got[N];
    ci_engine_event done;
    for (int i = 0; i < N; i++) {
      n_got[i] = collect(r[i], got[i], &done);
      assert_int_equal(done.finish, CI_FINISH_LENGTH);
      assert_int_equal(done.prompt_tokens, P);
      ci_engine_request_release(r[i]);
    }
    wait_idle(e, &after);
    assert_int_equal(after.prefill_tokens - before.prefill_tokens, P);
    assert_int_equal(after.prompt_tokens - before.prompt_tokens, P);
    assert_int_equal(after.generated_tokens - before.generated_tokens, N * GEN);
    assert_int_equal(after.blocks_used, 0);
    int differ = 0;
    for (int i = 0; i < N; i++) {
      ci_engine_job solo = job;
      solo.sampling.seed = ci_engine_choice_seed(job.sampling.seed, i);
      int32_t want[MAX_GEN];
      const int n_want = run_job(e, &solo, want, &done);
      assert_int_equal(n_got[i], n_want);
      assert_memory_equal(got[i], want, (size_t)n_want * sizeof *want);
      if (i > 0) differ |= n_got[i] != n_got[0] || memcmp(got[i], got[0], sizeof got[0]) != 0;
    }
    assert_true(differ); /* the choices sample on their own */
  }
  assert_int_equal(ci_engine_choice_seed(5, 0), 5);
  assert_true(ci_engine_choice_seed(5, 1) != ci_engine_choice_seed(5, 2));
  /* more choices than the batch can ever run */
  int32_t prompt[64];
  ci_engine_job job;
  make_job(1, prompt, &job);
  ci_engine_request *r[8];
  assert_int_equal(ci_engine_submit_n(e, &job, 5, r), CI_ENGINE_REJECTED);
  /* a group waiting for room whose first choice is cancelled: the others end cancelled too */
  ci_engine_job blocker;
  int32_t blocker_prompt[64];
  make_job(2, blocker_prompt, &blocker);
  blocker.max_tokens = 200;
  ci_engine_request *b;
  assert_int_equal(ci_engine_submit(e, &blocker, &b), CI_ENGINE_SUBMITTED);
  ci_engine_event ev;
  assert_int_equal(ci_engine_request_next(b, &ev, 60.0), 1); /* running: 3 slots are left */
  assert_int_equal(ci_engine_submit_n(e, &job, 4, r), CI_ENGINE_SUBMITTED);
  ci_engine_request_cancel(r[0]);
  ci_engine_request_release(b);
  for (int i = 0; i < 4; i++) {
    int32_t toks[MAX_GEN];
    ci_engine_event end;
    assert_int_equal(collect(r[i], toks, &end), 0);
    assert_int_equal(end.finish, CI_FINISH_ABORT);
    ci_engine_request_release(r[i]);
  }
  ci_engine_stats st;
  wait_idle(e, &st);
  assert_int_equal(st.blocks_used, 0);
  ci_engine_free(e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_batch_invariance), cmocka_unit_test(test_cancel_frees_blocks),
      cmocka_unit_test(test_admission),        cmocka_unit_test(test_prefix_cache),
      cmocka_unit_test(test_prefix_cache_cap), cmocka_unit_test(test_final_event_not_lost),
      cmocka_unit_test(test_choices),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
