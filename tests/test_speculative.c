/* Speculative decoding (docs/generation.md "Speculative decoding"): greedy output through the
 * engine is token-identical with and without prompt-lookup speculation on the starter model
 * (sliding-window layers) for bf16, affine and turbo KV, across the conversion threshold, solo
 * and batched with requests that do not speculate; the rejection-sampling rule keeps the target's
 * distribution exactly (chi-square against the analytic distribution and against plain
 * sampling, with every sampler option that shapes it); prompt lookup proposes what followed
 * the latest earlier match. A draft model drafts every speculating sequence of a step together
 * (one draft-model step per drafted position) with the drafts of each alone; the speculation
 * policy decides from measured step times (unit-tested on synthetic ones) and never changes
 * greedy output, forced on, off, or capped by spec_max_batch. Sessions (generate, chat)
 * speculate by prompt lookup or with a draft model with the tokens of plain decoding. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "backend/cpu/cpu_backend.h"
#include "cinfer.h"
#include "base/error.h"
#include "engine/engine.h"
#include "engine/lookup.h"
#include "engine/spec_policy.h"
#include "sample/spec_verify.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STARTER CI_FIXTURE_DIR "/../../models/starter"
#define STARTER_DRAFT CI_FIXTURE_DIR "/../../models/starter-draft"

enum { MAX_GEN = 48 };

typedef struct {
  ci_backend *be;
  ci_model *model, *draft;
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  f->be = ci_cpu_backend_create(1);
  f->model = f->be ? ci_model_load(STARTER, f->be) : NULL;
  f->draft = f->be ? ci_model_load(STARTER_DRAFT, f->be) : NULL;
  if (!f->model || !f->draft) {
    fprintf(stderr, "cannot load the starter models: %s\n", ci_last_error());
    return -1;
  }
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  ci_model_free(f->model);
  ci_model_free(f->draft);
  f->be->ops->destroy(f->be);
  free(f);
  return 0;
}

static void test_lookup(void **state) {
  (void)state;
  const int32_t ctx[] = {1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 2, 3};
  int32_t d[8];
  /* suffix "2 3": latest earlier match at index 6, followed by 7 8 2 3 */
  assert_int_equal(ci_lookup_draft(ctx, 12, 2, 1, 3, d), 3);
  assert_int_equal(d[0], 7);
  assert_int_equal(d[1], 8);
  assert_int_equal(d[2], 2);
  /* suffix "8 2 3" never recurs at length 3: falls back to length 2 */
  assert_int_equal(ci_lookup_draft(ctx, 12, 3, 2, 1, d), 1);
  assert_int_equal(d[0], 7);
  /* no recurrence at all */
  const int32_t fresh[] = {1, 2, 3, 4};
  assert_int_equal(ci_lookup_draft(fresh, 4, 3, 1, 4, d), 0);
  /* a match right before the end proposes what is left */
  const int32_t tail[] = {5, 6, 5};
  assert_int_equal(ci_lookup_draft(tail, 3, 1, 1, 4, d), 2);
  assert_int_equal(d[0], 6);
  assert_int_equal(d[1], 5);
}

/* A prompt with repeated spans so that lookup finds drafts, varied by i. */
static int make_prompt(int i, int32_t *prompt) {
  int n = 0;
  for (int rep = 0; rep < 3; rep++)
    for (int t = 0; t < 14; t++) prompt[n++] = 200 + (int32_t)((t * 53 + i * 7) % 1500);
  for (int t = 0; t < 3 + i; t++) prompt[n++] = 200 + (int32_t)((t * 53 + i * 7) % 1500);
  return n;
}

typedef struct {
  const char *codec; /* NULL: no plan */
  int bits;
  int64_t start;
} plan;

static void make_job(int i, const plan *p, int32_t *prompt, int num_draft, ci_engine_job *job) {
  memset(job, 0, sizeof *job);
  job->prompt = prompt;
  job->n_prompt = make_prompt(i, prompt);
  job->max_tokens = 24 + i;
  ci_sampler_params_default(&job->sampling);
  job->sampling.temperature = 0;
  job->num_draft = num_draft;
  if (!p->codec) {
    job->kv_plan = CI_KV_PLAN_NONE;
  } else {
    job->kv_plan = CI_KV_PLAN_TARGET;
    assert_int_equal(ci_kv_format_parse(p->codec, p->bits, 0, 64, &job->kv_target), 0);
    job->kv_start = p->start;
  }
}

static int collect(ci_engine_request *r, int32_t *out, float *lps, ci_engine_event *done) {
  int n = 0;
  ci_engine_event ev;
  for (;;) {
    assert_int_equal(ci_engine_request_next(r, &ev, 120.0), 1);
    if (ev.kind == CI_ENGINE_EVENT_TOKEN) {
      assert_true(n < MAX_GEN);
      lps[n] = ev.logprob;
      out[n++] = ev.token;
      continue;
    }
    if (ev.kind == CI_ENGINE_EVENT_ERROR) fprintf(stderr, "error: %s\n", ev.message);
    assert_int_equal(ev.kind, CI_ENGINE_EVENT_DONE);
    *done = ev;
    return n;
  }
}

static ci_engine *make_engine_with(fixture *f, int batch, int lookup, ci_model *draft, int policy,
                                   int max_batch) {
  ci_engine_options o;
  ci_engine_options_default(&o);
  o.batch = batch;
  o.batch_tokens = 16;
  o.prefill_chunk = 9;
  o.ctx_size = 160;
  o.lookup_ngram = lookup;
  o.draft_model = draft;
  o.draft_max = 4;
  o.draft_min = 1;
  o.spec_policy = policy;
  o.spec_max_batch = max_batch;
  ci_engine *e = ci_engine_create(f->model, &o);
  assert_non_null(e);
  return e;
}

static ci_engine *make_engine(fixture *f, int batch, int lookup, ci_model *draft) {
  return make_engine_with(f, batch, lookup, draft, CI_ENGINE_SPEC_AUTO, 0);
}

enum { N_PLANS = 5 };
static const plan plans[N_PLANS] = {{NULL, 0, 0},
                                    {"affine", 8, 0},
                                    {"turbo", 4, 0},
                                    {"affine", 4, 50}, /* converts among the decode rounds */
                                    {"turbo", 4, 56}};

/* Greedy: tokens and logprobs equal without speculation, solo and batched, for a drafter. */
static void check_greedy_identical(fixture *f, int lookup, ci_model *draft) {
  int32_t prompts[N_PLANS][64];
  ci_engine_job jobs[N_PLANS];
  int32_t want[N_PLANS][MAX_GEN], got[N_PLANS][MAX_GEN];
  float want_lp[N_PLANS][MAX_GEN], got_lp[N_PLANS][MAX_GEN];
  int n_want[N_PLANS];
  ci_engine_event done;
  ci_engine *plain = make_engine(f, 1, 0, NULL);
  for (int i = 0; i < N_PLANS; i++) {
    make_job(i, &plans[i], prompts[i], 0, &jobs[i]);
    ci_engine_request *r;
    assert_int_equal(ci_engine_submit(plain, &jobs[i], &r), CI_ENGINE_SUBMITTED);
    n_want[i] = collect(r, want[i], want_lp[i], &done);
    assert_int_equal(done.draft_tokens, 0);
    ci_engine_request_release(r);
  }
  ci_engine_free(plain);

  /* solo */
  ci_engine *spec = make_engine(f, 1, lookup, draft);
  int64_t drafted = 0, accepted = 0;
  for (int i = 0; i < N_PLANS; i++) {
    ci_engine_request *r;
    assert_int_equal(ci_engine_submit(spec, &jobs[i], &r), CI_ENGINE_SUBMITTED);
    const int n = collect(r, got[i], got_lp[i], &done);
    ci_engine_request_release(r);
    assert_int_equal(n, n_want[i]);
    assert_memory_equal(got[i], want[i], (size_t)n * sizeof(int32_t));
    assert_memory_equal(got_lp[i], want_lp[i], (size_t)n * sizeof(float));
    assert_true(done.accepted_tokens <= done.draft_tokens);
    drafted += done.draft_tokens;
    accepted += done.accepted_tokens;
  }
  assert_true(drafted > 0);
  assert_true(accepted > 0); /* the prompts repeat: some drafts must hold */
  ci_engine_stats st;
  ci_engine_get_stats(spec, &st);
  assert_int_equal(st.spec_draft_tokens, drafted);
  assert_int_equal(st.spec_accepted_tokens, accepted);
  ci_engine_free(spec);

  /* batched: all at once, the odd ones not speculating (num_draft < 0), one capped at 2 */
  spec = make_engine(f, N_PLANS, lookup, draft);
  ci_engine_request *reqs[N_PLANS];
  for (int i = 0; i < N_PLANS; i++) {
    jobs[i].num_draft = i % 2 ? -1 : i == 2 ? 2 : 0;
    assert_int_equal(ci_engine_submit(spec, &jobs[i], &reqs[i]), CI_ENGINE_SUBMITTED);
  }
  for (int i = 0; i < N_PLANS; i++) {
    const int n = collect(reqs[i], got[i], got_lp[i], &done);
    ci_engine_request_release(reqs[i]);
    assert_int_equal(n, n_want[i]);
    assert_memory_equal(got[i], want[i], (size_t)n * sizeof(int32_t));
    assert_memory_equal(got_lp[i], want_lp[i], (size_t)n * sizeof(float));
    if (i % 2) assert_int_equal(done.draft_tokens, 0);
  }
  ci_engine_free(spec);
  fprintf(stderr, "%s: %lld drafted, %lld accepted\n", draft ? "draft model" : "prompt lookup",
          (long long)drafted, (long long)accepted);
}

static void test_greedy_identical_lookup(void **state) {
  check_greedy_identical(*state, 3, NULL);
}

static void test_greedy_identical_draft_model(void **state) {
  fixture *f = *state;
  check_greedy_identical(f, 0, f->draft);
}

/* Sampled requests with a draft model run (q-based acceptance) and report their drafts; a
 * draft model of another vocabulary is refused by name. */
static void test_draft_model_sampling(void **state) {
  fixture *f = *state;
  ci_engine *spec = make_engine(f, 2, 0, f->draft);
  int32_t prompt[64], out[MAX_GEN];
  float lps[MAX_GEN];
  ci_engine_job job;
  make_job(0, &plans[0], prompt, 0, &job);
  job.sampling.temperature = 0.8f;
  job.sampling.top_k = 40;
  job.sampling.seed = 7;
  job.sampling.has_seed = 1;
  ci_engine_request *r;
  assert_int_equal(ci_engine_submit(spec, &job, &r), CI_ENGINE_SUBMITTED);
  ci_engine_event done;
  const int n = collect(r, out, lps, &done);
  ci_engine_request_release(r);
  assert_true(n > 0);
  assert_true(done.draft_tokens > 0);
  for (int i = 0; i < n; i++) assert_true(lps[i] <= 0.0f && lps[i] > -INFINITY);
  ci_engine_free(spec);
  ci_backend *be = ci_cpu_backend_create(1);
  ci_model *other = ci_model_load(CI_FIXTURE_DIR "/llama", be);
  assert_non_null(other);
  ci_engine_options o;
  ci_engine_options_default(&o);
  o.draft_model = other;
  assert_null(ci_engine_create(f->model, &o));
  assert_non_null(strstr(ci_last_error(), "draft model"));
  ci_model_free(other);
  be->ops->destroy(be);
}

/* ==== Batched drafting ==== */

enum { N_BATCHED = 4 };

/* Runs jobs[0..n) on `e` all at once (n_choices > 1: n_choices choices of jobs[0]) and checks
 * each request's tokens and logprobs against want. Returns the drafted tokens. */
static int64_t run_all(ci_engine *e, ci_engine_job *jobs, int n, int n_choices,
                       int32_t want[][MAX_GEN], float want_lp[][MAX_GEN], const int *n_want) {
  ci_engine_request *reqs[N_BATCHED];
  if (n_choices > 1)
    assert_int_equal(ci_engine_submit_n(e, &jobs[0], n_choices, reqs), CI_ENGINE_SUBMITTED);
  else
    for (int i = 0; i < n; i++)
      assert_int_equal(ci_engine_submit(e, &jobs[i], &reqs[i]), CI_ENGINE_SUBMITTED);
  const int count = n_choices > 1 ? n_choices : n;
  int64_t drafted = 0;
  for (int i = 0; i < count; i++) {
    const int w = n_choices > 1 ? 0 : i;
    int32_t got[MAX_GEN];
    float got_lp[MAX_GEN];
    ci_engine_event done;
    const int got_n = collect(reqs[i], got, got_lp, &done);
    ci_engine_request_release(reqs[i]);
    assert_int_equal(got_n, n_want[w]);
    assert_memory_equal(got, want[w], (size_t)got_n * sizeof(int32_t));
    assert_memory_equal(got_lp, want_lp[w], (size_t)got_n * sizeof(float));
    drafted += done.draft_tokens;
  }
  return drafted;
}

/* Several requests drafting with a draft model at once get the tokens of each alone; alone, a
 * round of k drafts takes k draft-model steps; together, fewer steps than drafts; n choices of
 * one prompt (identical sequences, so identical draft lengths) take exactly the steps of one. */
static void test_draft_batched(void **state) {
  fixture *f = *state;
  int32_t prompts[N_BATCHED][64], want[N_BATCHED][MAX_GEN];
  float want_lp[N_BATCHED][MAX_GEN];
  int n_want[N_BATCHED];
  ci_engine_job jobs[N_BATCHED];
  int64_t first_drafted = 0, first_steps = 0;
  ci_engine *solo = make_engine_with(f, 1, 0, f->draft, CI_ENGINE_SPEC_ALWAYS, 0);
  for (int i = 0; i < N_BATCHED; i++) {
    make_job(i, &plans[0], prompts[i], 0, &jobs[i]);
    ci_engine_request *r;
    assert_int_equal(ci_engine_submit(solo, &jobs[i], &r), CI_ENGINE_SUBMITTED);
    ci_engine_event done;
    n_want[i] = collect(r, want[i], want_lp[i], &done);
    ci_engine_request_release(r);
    if (i == 0) {
      ci_engine_stats st;
      ci_engine_get_stats(solo, &st);
      first_drafted = done.draft_tokens;
      first_steps = st.spec_draft_steps;
    }
  }
  ci_engine_stats st;
  ci_engine_get_stats(solo, &st);
  assert_true(st.spec_draft_tokens > 0);
  assert_int_equal(st.spec_draft_steps, st.spec_draft_tokens); /* k steps for k drafts */
  assert_int_equal(first_steps, first_drafted);
  assert_int_equal(st.spec_declined_steps, 0);
  ci_engine_free(solo);

  ci_engine *batched = make_engine_with(f, N_BATCHED, 0, f->draft, CI_ENGINE_SPEC_ALWAYS, 0);
  const int64_t drafted = run_all(batched, jobs, N_BATCHED, 1, want, want_lp, n_want);
  ci_engine_get_stats(batched, &st);
  assert_int_equal(st.spec_draft_tokens, drafted);
  assert_true(st.spec_draft_steps < drafted);
  fprintf(stderr, "batched drafting: %lld drafts in %lld draft-model steps\n", (long long)drafted,
          (long long)st.spec_draft_steps);
  ci_engine_free(batched);

  batched = make_engine_with(f, N_BATCHED, 0, f->draft, CI_ENGINE_SPEC_ALWAYS, 0);
  const int64_t choices_drafted = run_all(batched, jobs, 1, N_BATCHED, want, want_lp, n_want);
  ci_engine_get_stats(batched, &st);
  assert_int_equal(choices_drafted, N_BATCHED * first_drafted);
  assert_int_equal(st.spec_draft_steps, first_steps);
  ci_engine_free(batched);
}

/* ==== The speculation policy ==== */

/* The decision on synthetic timings: compute-bound steps (time grows with rows) do not pay at a
 * large batch, memory-bound ones (time flat) do; unmeasured buckets are explored first; a long
 * run of plain steps is broken to re-measure; the step-time estimate interpolates. */
static void test_policy_decision(void **state) {
  (void)state;
  assert_true(fabs(ci_spec_policy_expected_tokens(0.5, 2) - 1.75) < 1e-12);
  assert_true(fabs(ci_spec_policy_expected_tokens(0.0, 4) - 1.0) < 1e-12);
  assert_true(fabs(ci_spec_policy_expected_tokens(1.0, 4) - 5.0) < 1e-12);
  assert_int_equal(ci_spec_policy_bucket(1), 0);
  assert_int_equal(ci_spec_policy_bucket(2), 1);
  assert_int_equal(ci_spec_policy_bucket(4), 2);
  assert_int_equal(ci_spec_policy_bucket(5), 3);
  assert_int_equal(ci_spec_policy_bucket(1 << 30), CI_SPEC_POLICY_BUCKETS - 1);
  const int k8[8] = {4, 4, 4, 4, 4, 4, 4, 4};
  ci_spec_policy p;
  ci_spec_policy_init(&p);
  assert_true(ci_spec_policy_step_ms(&p, 8) < 0);
  /* nothing measured: the speculative bucket is explored first, then the plain one */
  assert_int_equal(ci_spec_policy_decide(&p, 8, 8, k8, NULL, 8, 0), 1);
  for (int i = 0; i < CI_SPEC_POLICY_MIN_SAMPLES; i++) ci_spec_policy_observe_step(&p, 40, 40.0);
  assert_int_equal(ci_spec_policy_decide(&p, 8, 8, k8, NULL, 8, 0), 0);
  /* compute-bound: 1 ms a row. 8 plain rows: 8 tokens in 8 ms; 40 rows: 8 x 1.94 in 40 ms */
  for (int i = 0; i < CI_SPEC_POLICY_MIN_SAMPLES; i++) ci_spec_policy_observe_step(&p, 8, 8.0);
  for (int i = 0; i < 20; i++) ci_spec_policy_observe_accept(&p, 4, 2);
  assert_true(fabs(p.accept - 0.5) < 1e-9);
  assert_true(fabs(ci_spec_policy_step_ms(&p, 24) - 24.0) < 1e-9); /* interpolated */
  assert_true(fabs(ci_spec_policy_step_ms(&p, 80) - 80.0) < 1e-9); /* proportional beyond */
  assert_true(fabs(ci_spec_policy_step_ms(&p, 2) - 8.0) < 1e-9);   /* no cheaper below */
  assert_int_equal(ci_spec_policy_decide(&p, 8, 8, k8, NULL, 8, 0), 0);
  /* every draft accepted is break-even there (40 tokens in 40 ms): a tie stays plain; at a
   * fixed cost of 4 ms a step on top (12 and 44 ms), it pays */
  const double sure[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  assert_int_equal(ci_spec_policy_decide(&p, 8, 8, k8, sure, 8, 0), 0);
  ci_spec_policy q;
  ci_spec_policy_init(&q);
  for (int i = 0; i < CI_SPEC_POLICY_MIN_SAMPLES; i++) {
    ci_spec_policy_observe_step(&q, 8, 12.0);
    ci_spec_policy_observe_step(&q, 40, 44.0);
  }
  assert_int_equal(ci_spec_policy_decide(&q, 8, 8, k8, sure, 8, 0), 1);
  assert_int_equal(ci_spec_policy_decide(&q, 8, 8, k8, NULL, 8, 0), 0);
  /* a long run of plain steps is broken by one speculative step */
  int spec = 0;
  for (int i = 0; i < CI_SPEC_POLICY_REPROBE + 1; i++)
    spec += ci_spec_policy_decide(&p, 8, 8, k8, NULL, 8, 0);
  assert_int_equal(spec, 1);
  /* memory-bound: a step takes 10 ms whatever its rows: speculation pays */
  ci_spec_policy_init(&p);
  for (int i = 0; i < 50; i++) {
    ci_spec_policy_observe_step(&p, 8, 10.0);
    ci_spec_policy_observe_step(&p, 40, 10.0);
  }
  assert_int_equal(ci_spec_policy_decide(&p, 8, 8, k8, NULL, 8, 0), 1);
  /* ... unless the draft model's 4 steps cost more than the tokens they add: 15.5 tokens in
   * 10 + 4 x 8 ms against 8 in 10 ms */
  for (int i = 0; i < 10; i++) ci_spec_policy_observe_draft(&p, 4, 32.0);
  assert_true(fabs(p.draft_ms - 8.0) < 1e-9);
  assert_int_equal(ci_spec_policy_decide(&p, 8, 8, k8, NULL, 8, 4), 0);
  /* nothing to draft: plain */
  assert_int_equal(ci_spec_policy_decide(&p, 8, 8, k8, NULL, 0, 0), 0);
}

/* Greedy output is the same whatever the policy decides: forced on, forced off, measured, or
 * capped by spec_max_batch (a step of more decoding sequences stays plain); the engine counts
 * the steps that speculated and those that did not. */
static void test_policy_greedy(void **state) {
  fixture *f = *state;
  int32_t prompts[N_BATCHED][64], want[N_BATCHED][MAX_GEN];
  float want_lp[N_BATCHED][MAX_GEN];
  int n_want[N_BATCHED];
  ci_engine_job jobs[N_BATCHED];
  ci_engine *plain = make_engine(f, 1, 0, NULL);
  for (int i = 0; i < N_BATCHED; i++) {
    make_job(i, &plans[i], prompts[i], 0, &jobs[i]);
    ci_engine_request *r;
    assert_int_equal(ci_engine_submit(plain, &jobs[i], &r), CI_ENGINE_SUBMITTED);
    ci_engine_event done;
    n_want[i] = collect(r, want[i], want_lp[i], &done);
    ci_engine_request_release(r);
  }
  ci_engine_free(plain);
  for (int drafter = 0; drafter < 2; drafter++) {
    ci_model *draft = drafter ? f->draft : NULL;
    const int lookup = drafter ? 0 : 3;
    static const int policies[] = {CI_ENGINE_SPEC_ALWAYS, CI_ENGINE_SPEC_NEVER,
                                   CI_ENGINE_SPEC_AUTO};
    for (int p = 0; p < 3; p++) {
      ci_engine *e = make_engine_with(f, N_BATCHED, lookup, draft, policies[p], 0);
      const int64_t drafted = run_all(e, jobs, N_BATCHED, 1, want, want_lp, n_want);
      ci_engine_stats st;
      ci_engine_get_stats(e, &st);
      if (policies[p] == CI_ENGINE_SPEC_NEVER) {
        assert_int_equal(drafted, 0);
        assert_int_equal(st.spec_steps, 0);
        assert_true(st.spec_declined_steps > 0);
        assert_int_equal(st.spec_draft_steps, 0);
      } else {
        assert_true(drafted > 0);
        assert_true(st.spec_steps > 0);
      }
      if (policies[p] == CI_ENGINE_SPEC_ALWAYS) assert_int_equal(st.spec_declined_steps, 0);
      fprintf(stderr, "%s, policy %d: %lld steps speculated, %lld declined\n",
              drafter ? "draft model" : "prompt lookup", policies[p], (long long)st.spec_steps,
              (long long)st.spec_declined_steps);
      ci_engine_free(e);
    }
    /* spec_max_batch 1: three choices decoding together never speculate; one alone does */
    ci_engine *e = make_engine_with(f, N_BATCHED, lookup, draft, CI_ENGINE_SPEC_ALWAYS, 1);
    assert_int_equal(run_all(e, jobs, 1, 3, want, want_lp, n_want), 0);
    ci_engine_stats st;
    ci_engine_get_stats(e, &st);
    assert_int_equal(st.spec_steps, 0);
    assert_true(st.spec_declined_steps > 0);
    assert_true(run_all(e, jobs, 1, 1, want, want_lp, n_want) > 0);
    ci_engine_free(e);
  }
}

/* Seeded sampling is reproducible whatever the policy or the batch decide: a seeded sampling
 * request verifies every round it drafts (rejection sampling picks other tokens than plain
 * sampling, equally distributed), so the measured policy (AUTO) and the spec_max_batch cap (three
 * choices decoding together with a cap of 1) leave its tokens as with speculation always on. */
static void test_policy_seeded_sampling(void **state) {
  fixture *f = *state;
  int32_t prompt[64];
  ci_engine_job job;
  make_job(1, &plans[0], prompt, 0, &job);
  job.sampling.temperature = 1.0f;
  job.sampling.has_seed = 1;
  job.sampling.seed = 7;
  int32_t want[MAX_GEN], got[MAX_GEN];
  float want_lp[MAX_GEN], got_lp[MAX_GEN];
  ci_engine_event done;
  ci_engine *always = make_engine_with(f, N_BATCHED, 0, f->draft, CI_ENGINE_SPEC_ALWAYS, 0);
  ci_engine_request *r;
  assert_int_equal(ci_engine_submit(always, &job, &r), CI_ENGINE_SUBMITTED);
  const int n_want = collect(r, want, want_lp, &done);
  ci_engine_request_release(r);
  ci_engine_free(always);
  assert_true(done.draft_tokens > 0);
  ci_engine *automatic = make_engine_with(f, N_BATCHED, 0, f->draft, CI_ENGINE_SPEC_AUTO, 0);
  for (int run = 0; run < 2; run++) {
    assert_int_equal(ci_engine_submit(automatic, &job, &r), CI_ENGINE_SUBMITTED);
    assert_int_equal(collect(r, got, got_lp, &done), n_want);
    ci_engine_request_release(r);
    assert_memory_equal(got, want, (size_t)n_want * sizeof(int32_t));
  }
  ci_engine_free(automatic);
  ci_engine *capped = make_engine_with(f, N_BATCHED, 0, f->draft, CI_ENGINE_SPEC_ALWAYS, 1);
  ci_engine_request *reqs[3];
  assert_int_equal(ci_engine_submit_n(capped, &job, 3, reqs), CI_ENGINE_SUBMITTED);
  for (int i = 0; i < 3; i++) {
    const int n = collect(reqs[i], got, got_lp, &done);
    ci_engine_request_release(reqs[i]);
    if (i > 0) continue; /* choice 0 keeps the job's seed */
    assert_int_equal(n, n_want);
    assert_memory_equal(got, want, (size_t)n_want * sizeof(int32_t));
    assert_true(done.draft_tokens > 0);
  }
  ci_engine_free(capped);
}

/* ==== Sampling: the distribution of a verified position ==== */

enum { V = 12, SAMPLES = 40000 };

/* Pearson's chi-square of counts against probabilities p (cells with expected < 5 pooled). */
static double chi_square(const int *counts, const double *p, int n, int total, int *dof) {
  double chi = 0.0, pooled_e = 0.0, pooled_o = 0.0;
  int cells = 0;
  for (int t = 0; t < n; t++) {
    const double expected = p[t] * total;
    if (expected < 5.0) {
      pooled_e += expected;
      pooled_o += counts[t];
      if (expected == 0.0 && counts[t] > 0) return INFINITY; /* a token p excludes */
      continue;
    }
    chi += (counts[t] - expected) * (counts[t] - expected) / expected;
    cells++;
  }
  if (pooled_e >= 5.0) {
    chi += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    cells++;
  }
  *dof = cells - 1;
  return chi;
}

/* 99.9% quantile of chi-square with k degrees of freedom (Wilson-Hilferty). */
static double chi_limit(int k) {
  const double z = 3.0902, a = 2.0 / (9.0 * k);
  const double c = 1.0 - a + z * sqrt(a);
  return k * c * c * c;
}

typedef struct {
  const char *name;
  ci_sampler_params params;
  int point_mass; /* prompt lookup's draft (a point mass) instead of a full q */
} sampling_case;

/* For each case: the token emitted at one verified position, over SAMPLES seeds, against the
 * sampler's final distribution p (and the tokens plain sampling draws against the same p). */
static void test_sampling_distribution(void **state) {
  (void)state;
  static const float raw[V] = {2.0f, 1.6f,  1.5f, 0.2f, -0.3f, 1.1f,
                               0.9f, -1.0f, 0.4f, 1.9f, 0.0f,  -2.0f};
  static const float q_raw[V] = {0.05f, 0.30f, 0.02f, 0.10f, 0.01f, 0.20f,
                                 0.05f, 0.02f, 0.05f, 0.10f, 0.05f, 0.05f};
  static const int32_t history[] = {1, 5, 5, 9, 2};
  static const ci_logit_bias bias[] = {{3, 1.5f}, {0, -0.7f}};
  sampling_case cases[6];
  for (int c = 0; c < 6; c++) ci_sampler_params_default(&cases[c].params);
  cases[0] = (sampling_case){"temperature 1", cases[0].params, 0};
  cases[0].params.temperature = 1.0f;
  cases[1] = (sampling_case){"temperature 0.6, top-k 6", cases[1].params, 0};
  cases[1].params.temperature = 0.6f;
  cases[1].params.top_k = 6;
  cases[2] = (sampling_case){"top-p 0.8, min-p 0.05", cases[2].params, 0};
  cases[2].params.temperature = 1.3f;
  cases[2].params.top_p = 0.8f;
  cases[2].params.min_p = 0.05f;
  cases[3] = (sampling_case){"penalties and logit bias", cases[3].params, 0};
  cases[3].params.temperature = 0.9f;
  cases[3].params.penalties.repetition = 1.3f;
  cases[3].params.penalties.presence = 0.4f;
  cases[3].params.penalties.frequency = 0.3f;
  cases[3].params.logit_bias = bias;
  cases[3].params.n_logit_bias = 2;
  cases[4] = (sampling_case){"point-mass draft", cases[0].params, 1};
  cases[5] = (sampling_case){"point-mass draft, penalties", cases[3].params, 1};
  double q[V];
  float qf[V];
  double q_sum = 0.0;
  for (int t = 0; t < V; t++) q_sum += q_raw[t];
  for (int t = 0; t < V; t++) {
    q[t] = q_raw[t] / q_sum;
    qf[t] = (float)q[t];
  }
  ci_spec_scratch sc;
  assert_int_equal(ci_spec_scratch_init(&sc, V), CI_OK);
  float logits[V];
  int32_t ids[V];
  float probs[V];
  for (int c = 0; c < 6; c++) {
    int spec_counts[V] = {0}, plain_counts[V] = {0}, n_accepted = 0;
    double p[V] = {0};
    for (int s = 0; s < SAMPLES; s++) {
      ci_sampler_params params = cases[c].params;
      params.seed = 0x5eed0000u + (uint64_t)s;
      params.has_seed = 1;
      ci_sampler *sampler = ci_sampler_create(&params, V);
      assert_non_null(sampler);
      if (s == 0) {
        memcpy(logits, raw, sizeof raw);
        const int n = ci_sampler_distribution(sampler, logits, history, 5, 3, ids, probs);
        for (int i = 0; i < n; i++) p[ids[i]] = probs[i];
      }
      /* the draft: drawn from q with a seed of its own (a point mass: token 1 or 5) */
      uint64_t x = (uint64_t)s * 0x9E3779B97F4A7C15ull + 12345;
      x ^= x >> 29;
      const double u = (double)(x % 1000003) / 1000003.0;
      int32_t draft = V - 1;
      double acc = 0.0;
      for (int t = 0; t < V; t++) {
        acc += q[t];
        if (u < acc) {
          draft = t;
          break;
        }
      }
      if (cases[c].point_mass) draft = s % 3 ? 1 : 5;
      memcpy(logits, raw, sizeof raw);
      int ok = 0;
      const int32_t token = ci_spec_verify(sampler, &sc, logits, history, 5, 3, draft,
                                           cases[c].point_mass ? NULL : qf, &ok);
      assert_true(token >= 0 && token < V);
      if (ok) assert_int_equal(token, draft);
      n_accepted += ok;
      spec_counts[token]++;
      memcpy(logits, raw, sizeof raw);
      plain_counts[ci_sampler_sample_at(sampler, logits, history, 5, 3)]++;
      ci_sampler_free(sampler);
    }
    int dof_spec = 0, dof_plain = 0;
    const double chi_spec = chi_square(spec_counts, p, V, SAMPLES, &dof_spec);
    const double chi_plain = chi_square(plain_counts, p, V, SAMPLES, &dof_plain);
    fprintf(stderr,
            "%-28s accepted %5.1f%%  chi2 speculative %.1f, plain %.1f (dof %d, limit %.1f)\n",
            cases[c].name, 100.0 * n_accepted / SAMPLES, chi_spec, chi_plain, dof_spec,
            chi_limit(dof_spec));
    assert_true(n_accepted > 0 && n_accepted < SAMPLES);
    assert_true(dof_spec >= 1);
    assert_true(chi_spec < chi_limit(dof_spec));
    assert_true(chi_plain < chi_limit(dof_plain));
  }
  ci_spec_scratch_free(&sc);
}

/* Greedy verification is the argmax match; the emitted token is the argmax either way. */
static void test_greedy_rule(void **state) {
  (void)state;
  ci_sampler_params params;
  ci_sampler_params_default(&params);
  params.temperature = 0;
  params.has_seed = 1;
  ci_sampler *s = ci_sampler_create(&params, 4);
  ci_spec_scratch sc;
  assert_int_equal(ci_spec_scratch_init(&sc, 4), CI_OK);
  float logits[4] = {0.1f, 2.0f, 1.0f, -1.0f};
  int ok = 0;
  assert_int_equal(ci_spec_verify(s, &sc, logits, NULL, 0, 0, 1, NULL, &ok), 1);
  assert_true(ok);
  float again[4] = {0.1f, 2.0f, 1.0f, -1.0f};
  assert_int_equal(ci_spec_verify(s, &sc, again, NULL, 0, 0, 2, NULL, &ok), 1);
  assert_false(ok);
  ci_spec_scratch_free(&sc);
  ci_sampler_free(s);
}

/* End to end through the engine: the token at output index 1 (the first verified one) of sampled
 * requests (temperature
 * 0.8, top-k 6, 900 seeds) has the same distribution with prompt lookup, with a draft model (the
 * fixture's q8 twin, so q differs from p) and without speculation (two-sample chi-square). */
enum { E2E_SEEDS = 900, E2E_POS = 1 };

static void sample_tokens(ci_model *m, int lookup, ci_model *draft, int *counts, int *drafted) {
  ci_engine_options o;
  ci_engine_options_default(&o);
  o.batch = 8;
  o.ctx_size = 300;
  o.lookup_ngram = lookup;
  o.draft_model = draft;
  o.draft_max = 3;
  ci_engine *e = ci_engine_create(m, &o);
  assert_non_null(e);
  /* every id once (so prompt lookup always finds the last token), then a repeated pattern */
  int32_t prompt[260];
  for (int i = 0; i < 256; i++) prompt[i] = (int32_t)((i * 37) % 256);
  for (int i = 256; i < 260; i++) prompt[i] = (int32_t)(i % 4 + 5);
  ci_engine_request *reqs[64];
  for (int base = 0; base < E2E_SEEDS; base += 64) {
    const int n = E2E_SEEDS - base < 64 ? E2E_SEEDS - base : 64;
    for (int i = 0; i < n; i++) {
      ci_engine_job job;
      memset(&job, 0, sizeof job);
      job.prompt = prompt;
      job.n_prompt = (int)(sizeof prompt / sizeof prompt[0]);
      job.max_tokens = E2E_POS + 2;
      job.kv_plan = CI_KV_PLAN_NONE;
      ci_sampler_params_default(&job.sampling);
      job.sampling.temperature = 0.8f;
      job.sampling.top_k = 6;
      job.sampling.seed = 1000 + (uint64_t)(base + i);
      job.sampling.has_seed = 1;
      assert_int_equal(ci_engine_submit(e, &job, &reqs[i]), CI_ENGINE_SUBMITTED);
    }
    for (int i = 0; i < n; i++) {
      int32_t out[MAX_GEN];
      float lps[MAX_GEN];
      ci_engine_event done;
      const int got = collect(reqs[i], out, lps, &done);
      ci_engine_request_release(reqs[i]);
      assert_int_equal(got, E2E_POS + 2);
      counts[out[E2E_POS]]++;
      *drafted += done.draft_tokens;
    }
  }
  ci_engine_free(e);
}

static void test_engine_sampled_distribution(void **state) {
  (void)state;
  ci_backend *be = ci_cpu_backend_create(1);
  ci_model *m = ci_model_load(CI_FIXTURE_DIR "/llama", be);
  ci_model *draft = ci_model_load(CI_FIXTURE_DIR "/llama-q8g32", be);
  assert_non_null(m);
  assert_non_null(draft);
  const int vocab = m->spec.vocab;
  int *plain = calloc((size_t)vocab, sizeof *plain);
  int *spec = calloc((size_t)vocab, sizeof *spec);
  int drafted = 0;
  sample_tokens(m, 0, NULL, plain, &drafted);
  assert_int_equal(drafted, 0);
  for (int variant = 0; variant < 2; variant++) {
    memset(spec, 0, (size_t)vocab * sizeof *spec);
    drafted = 0;
    sample_tokens(m, variant == 0 ? 2 : 0, variant == 1 ? draft : NULL, spec, &drafted);
    assert_true(drafted > 0);
    /* homogeneity of two samples of equal size: sum (a - b)^2 / (a + b) over cells with
     * a + b >= 10, the rest pooled */
    double chi = 0.0;
    int cells = 0, pooled_a = 0, pooled_b = 0;
    for (int t = 0; t < vocab; t++) {
      const int a = plain[t], b = spec[t];
      if (a + b >= 10) {
        chi += (double)(a - b) * (a - b) / (a + b);
        cells++;
      } else {
        pooled_a += a;
        pooled_b += b;
      }
    }
    if (pooled_a + pooled_b > 0) {
      chi += (double)(pooled_a - pooled_b) * (pooled_a - pooled_b) / (pooled_a + pooled_b);
      cells++;
    }
    fprintf(stderr, "%s: %d drafted, chi2 %.1f (dof %d, limit %.1f)\n",
            variant == 0 ? "prompt lookup" : "draft model", drafted, chi, cells - 1,
            chi_limit(cells - 1));
    assert_true(cells >= 3);
    assert_true(chi < chi_limit(cells - 1));
  }
  free(plain);
  free(spec);
  ci_model_free(draft);
  ci_model_free(m);
  be->ops->destroy(be);
}

/* Sessions (generate, chat): the same tokens and logprobs with and without prompt lookup or a
 * draft model, over two turns where the first is cut short while a round's tokens are still
 * queued, then again after a reset. */
typedef struct {
  int32_t ids[128];
  float lps[128];
  int n;
  int drafted;
} session_run;

static void session_turn(cinfer_session *s, session_run *out, int limit) {
  for (int i = 0; i < limit; i++) {
    int32_t t;
    const cinfer_status st = cinfer_session_step(s, &t);
    if (st == CINFER_DONE) break;
    assert_int_equal(st, CINFER_OK);
    float lp;
    assert_int_equal(cinfer_session_logprobs(s, 0, &lp, NULL, NULL, NULL), CINFER_OK);
    out->ids[out->n] = t;
    out->lps[out->n++] = lp;
  }
  cinfer_timings tm;
  assert_int_equal(cinfer_session_timings(s, &tm), CINFER_OK);
  out->drafted += tm.draft_tokens;
}

static session_run run_session(cinfer_model *model, int lookup, cinfer_model *draft,
                               const char *codec, int64_t start) {
  cinfer_params p;
  cinfer_params_init(&p, model);
  p.temperature = 0;
  p.max_tokens = 30;
  p.lookup_ngram = lookup;
  p.draft_model = draft;
  p.draft_max = 4;
  p.kv_codec = codec;
  p.kv_start = start;
  cinfer_session *s = NULL;
  assert_int_equal(cinfer_session_create(model, &p, &s), CINFER_OK);
  int32_t prompt[64];
  const int n = make_prompt(1, prompt);
  session_run r = {0};
  assert_int_equal(cinfer_session_feed(s, prompt, (size_t)n, NULL, 0), CINFER_OK);
  session_turn(s, &r, 7); /* stops mid-round: the rest of the round is dropped */
  assert_int_equal(cinfer_session_feed(s, prompt + 3, 6, NULL, 0), CINFER_OK);
  session_turn(s, &r, 100);
  /* after a reset the draft starts over with the sequence */
  assert_int_equal(cinfer_session_reset(s), CINFER_OK);
  assert_int_equal(cinfer_session_feed(s, prompt + 2, 9, NULL, 0), CINFER_OK);
  session_turn(s, &r, 100);
  cinfer_session_free(s);
  return r;
}

static void test_session_identical(void **state) {
  (void)state;
  cinfer_model *model = NULL, *draft = NULL;
  assert_int_equal(cinfer_model_load(STARTER, NULL, &model), CINFER_OK);
  assert_int_equal(cinfer_model_load(STARTER_DRAFT, NULL, &draft), CINFER_OK);
  static const struct {
    const char *codec;
    int64_t start;
  } plans2[] = {{"bf16", 0}, {"affine", 0}, {"turbo", 56}};
  for (size_t c = 0; c < sizeof plans2 / sizeof plans2[0]; c++) {
    const session_run plain = run_session(model, 0, NULL, plans2[c].codec, plans2[c].start);
    assert_int_equal(plain.drafted, 0);
    for (int drafter = 0; drafter < 2; drafter++) {
      const session_run spec = run_session(model, drafter ? 0 : 3, drafter ? draft : NULL,
                                           plans2[c].codec, plans2[c].start);
      assert_int_equal(spec.n, plain.n);
      assert_memory_equal(spec.ids, plain.ids, (size_t)plain.n * sizeof(int32_t));
      assert_memory_equal(spec.lps, plain.lps, (size_t)plain.n * sizeof(float));
      assert_true(spec.drafted > 0);
    }
  }
  cinfer_model_free(draft);
  cinfer_model_free(model);
}

/* A sampled session with a draft model speculates (q-based acceptance) and a seeded one gives
 * the same tokens each run; a draft model of another vocabulary is refused by name. */
static void test_session_draft_model_sampled(void **state) {
  (void)state;
  cinfer_model *model = NULL, *draft = NULL, *other = NULL;
  assert_int_equal(cinfer_model_load(STARTER, NULL, &model), CINFER_OK);
  assert_int_equal(cinfer_model_load(STARTER_DRAFT, NULL, &draft), CINFER_OK);
  int32_t prompt[64];
  const int n = make_prompt(2, prompt);
  session_run runs[2];
  for (int run = 0; run < 2; run++) {
    cinfer_params p;
    cinfer_params_init(&p, model);
    p.temperature = 0.8f;
    p.top_k = 20;
    p.seed = 42;
    p.has_seed = 1;
    p.max_tokens = 40;
    p.ignore_eos = 1;
    p.draft_model = draft;
    cinfer_session *s = NULL;
    assert_int_equal(cinfer_session_create(model, &p, &s), CINFER_OK);
    assert_int_equal(cinfer_session_feed(s, prompt, (size_t)n, NULL, 0), CINFER_OK);
    memset(&runs[run], 0, sizeof runs[run]);
    session_turn(s, &runs[run], 100);
    assert_int_equal(runs[run].n, 40);
    assert_true(runs[run].drafted > 0);
    cinfer_session_free(s);
  }
  assert_memory_equal(runs[0].ids, runs[1].ids, sizeof runs[0].ids);
  assert_int_equal(cinfer_model_load(CI_FIXTURE_DIR "/llama", NULL, &other), CINFER_OK);
  assert_int_not_equal(cinfer_model_vocab_size(other), cinfer_model_vocab_size(model));
  cinfer_params p;
  cinfer_params_init(&p, model);
  p.draft_model = other;
  cinfer_session *s = NULL;
  assert_int_equal(cinfer_session_create(model, &p, &s), CINFER_INVALID_ARGUMENT);
  assert_null(s);
  assert_non_null(strstr(cinfer_last_error(), "draft model"));
  cinfer_model_free(other);
  cinfer_model_free(draft);
  cinfer_model_free(model);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lookup),
      cmocka_unit_test(test_greedy_rule),
      cmocka_unit_test(test_sampling_distribution),
      cmocka_unit_test_setup_teardown(test_greedy_identical_lookup, setup, teardown),
      cmocka_unit_test_setup_teardown(test_greedy_identical_draft_model, setup, teardown),
      cmocka_unit_test_setup_teardown(test_draft_model_sampling, setup, teardown),
      cmocka_unit_test_setup_teardown(test_draft_batched, setup, teardown),
      cmocka_unit_test(test_policy_decision),
      cmocka_unit_test_setup_teardown(test_policy_greedy, setup, teardown),
      cmocka_unit_test_setup_teardown(test_policy_seeded_sampling, setup, teardown),
      cmocka_unit_test(test_session_identical),
      cmocka_unit_test(test_session_draft_model_sampled),
      cmocka_unit_test(test_engine_sampled_distribution),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
