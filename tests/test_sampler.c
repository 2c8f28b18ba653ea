/* Tests of the sampler (docs/generation.md §4, §5, §11 invariants
 * 1-3): Philox known answers, processors,
 * log-softmax and top logprobs, chi-square goodness of fit of the draw against the exact
 * truncated and renormalised distribution (10^5 draws, fixed seeds, p >= 0.001), determinism,
 * greedy, edge cases, and the partial-selection paths on a 262144-token vocabulary; a device's
 * greedy row pick (backend/cpu/row_pick.h) against the greedy sampler. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "backend/cpu/row_pick.h"
#include "base/error.h"
#include "base/timing.h"
#include "sample/greedy.h"
#include "sample/logprobs.h"
#include "sample/processors.h"
#include "sample/rng.h"
#include "sample/sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TOY_V = 8, DRAWS = 100000, BIG_V = 262144 };

/* Unoptimized sanitizer builds run the 262144-token checks with fewer draws. */
#if defined(__SANITIZE_ADDRESS__) || !defined(__OPTIMIZE__)
enum { BIG_DRAW_DIVISOR = 10 };
#else
enum { BIG_DRAW_DIVISOR = 1 };
#endif

/* The toy distribution: softmax ranks 1, 7, 4, 0, 2, 5, 3, 6 with probabilities .369 .273
 * .183 .082 .041 .030 .015 .007 (no filter threshold below lies near a cumulative mass). */
static const float toy_logits[TOY_V] = {1.0f, 2.5f, 0.3f, -0.7f, 1.8f, 0.0f, -1.5f, 2.2f};

/* ==== Reference implementation of §4.2-4.3 in double, with a full sort ==== */

typedef struct {
  double temperature, top_p, min_p;
  int top_k, min_keep;
  int xtc;              /* apply XTC removal (probability 1) */
  double xtc_threshold; /* its threshold */
  const int32_t *exempt;
  int n_exempt;
} ref_params;

static const double *sort_lp;
static int by_rank(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  if (sort_lp[x] != sort_lp[y]) return sort_lp[x] > sort_lp[y] ? -1 : 1;
  return x - y;
}

/* probs[V] = softmax(lp / T) over the tokens the §4.3 filters keep; z are processed logits. */
static void reference_probs(const float *z, int V, const ref_params *rp, double *probs) {
  double *lp = malloc((size_t)V * sizeof *lp);
  int *order = malloc((size_t)V * sizeof *order);
  char *keep = calloc((size_t)V, 1);
  /* lp is f32 by definition (§4.2): take it from the library (tested on its own above) so that
   * mass cuts agree to the last token; everything after it is double here. */
  float *lp32 = malloc((size_t)V * sizeof *lp32);
  assert_int_equal(ci_log_softmax(z, V, lp32), CI_OK);
  int n = 0;
  for (int i = 0; i < V; i++) {
    lp[i] = lp32[i];
    if (lp32[i] > -INFINITY) order[n++] = i;
  }
  free(lp32);
  sort_lp = lp;
  qsort(order, (size_t)n, sizeof *order, by_rank);
  if (rp->top_p > 0 && rp->top_p < 1) {
    double mass = 0;
    int r = 0;
    while (r < n && (r == 0 || mass < rp->top_p)) mass += exp(lp[order[r++]]);
    n = r;
  }
  if (rp->min_p > 0) {
    double threshold = lp[order[0]] + log(rp->min_p);
    int r = 0;
    while (r < n && lp[order[r]] >= threshold) r++;
    int min_keep = rp->min_keep > 0 ? rp->min_keep : 1;
    n = r > min_keep ? r : (min_keep < n ? min_keep : n);
  }
  for (int r = 0; r < n; r++) keep[order[r]] = 1;
  if (rp->xtc) {
    const double top = lp[order[0]];
    double s = 0, least = INFINITY;
    int above = 0;
    for (int r = 0; r < n; r++) s += exp(lp[order[r]] - top);
    for (int r = 0; r < n; r++) {
      double p = exp(lp[order[r]] - top) / s;
      if (p > rp->xtc_threshold) above++, least = p < least ? p : least;
    }
    if (above >= 2) {
      int kept = 0;
      for (int r = 0; r < n; r++) {
        int t = order[r], exempt = 0;
        for (int e = 0; e < rp->n_exempt; e++) exempt |= rp->exempt[e] == t;
        if (exp(lp[t] - top) / s > least && !exempt) {
          keep[t] = 0;
          continue;
        }
        order[kept++] = t;
      }
      n = kept;
    }
  }
  if (rp->top_k > 0 && rp->top_k < n) {
    for (int r = rp->top_k; r < n; r++) keep[order[r]] = 0;
    n = rp->top_k;
  }
  double total = 0;
  for (int i = 0; i < V; i++) total += probs[i] = keep[i] ? exp(lp[i] / rp->temperature) : 0.0;
  for (int i = 0; i < V; i++) probs[i] /= total;
  free(lp);
  free(order);
  free(keep);
}

/* ==== Chi-square ==== */

/* Regularized upper incomplete gamma Q(a, x) (series / continued fraction). */
static double gamma_q(double a, double x) {
  if (x <= 0) return 1.0;
  const double front = exp(-x + a * log(x) - lgamma(a));
  if (x < a + 1) {
    double ap = a, del = 1.0 / a, sum = del;
    for (int n = 0; n < 10000 && fabs(del) > fabs(sum) * 1e-16; n++) {
      ap += 1;
      del *= x / ap;
      sum += del;
    }
    return 1.0 - sum * front;
  }
  double b = x + 1 - a, c = 1e300, d = 1 / b, h = d;
  for (int i = 1; i < 10000; i++) {
    double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    d = fabs(d) < 1e-300 ? 1e-300 : d;
    c = b + an / c;
    c = fabs(c) < 1e-300 ? 1e-300 : c;
    d = 1 / d;
    h *= d * c;
    if (fabs(d * c - 1) < 1e-16) break;
  }
  return front * h;
}

/* p-value of the counts against probs; a draw of a zero-probability token fails at once. */
static double chi_square_p(const long *counts, const double *probs, int V, long n) {
  double stat = 0;
  int categories = 0;
  for (int i = 0; i < V; i++) {
    if (probs[i] == 0) {
      if (counts[i]) fail_msg("token %d has probability 0 but was drawn %ld times", i, counts[i]);
      continue;
    }
    double expected = probs[i] * (double)n, d = (double)counts[i] - expected;
    stat += d * d / expected;
    categories++;
  }
  if (categories < 2) return 1.0;
  return gamma_q((categories - 1) / 2.0, stat / 2.0);
}

/* Draws DRAWS tokens from the sampler on fresh copies of `logits` with `history`. */
static void draw_counts(const ci_sampler_params *params, const float *logits, int V,
                        const int32_t *history, size_t n_history, long *counts) {
  ci_sampler *s = ci_sampler_create(params, V);
  assert_non_null(s);
  float *z = malloc((size_t)V * sizeof *z);
  memset(counts, 0, (size_t)V * sizeof *counts);
  for (long d = 0; d < DRAWS; d++) {
    memcpy(z, logits, (size_t)V * sizeof *z);
    int32_t t = ci_sampler_next(s, z, history, n_history);
    assert_true(t >= 0 && t < V);
    counts[t]++;
  }
  free(z);
  ci_sampler_free(s);
}

/* Samples DRAWS times with params and checks the fit against the reference for rp, whose
 * processed logits are `processed` (the toy logits when no processor is active). */
static void check_fit(const ci_sampler_params *params, const ref_params *rp, const float *logits,
                      const float *processed, const int32_t *history, size_t n_history,
                      const char *what) {
  long counts[TOY_V];
  double probs[TOY_V];
  draw_counts(params, logits, TOY_V, history, n_history, counts);
  reference_probs(processed, TOY_V, rp, probs);
  double p = chi_square_p(counts, probs, TOY_V, DRAWS);
  if (p < 0.001) {
    for (int i = 0; i < TOY_V; i++)
      fprintf(stderr, "  %d: drawn %ld expected %.1f\n", i, counts[i], probs[i] * DRAWS);
    fail_msg("%s: chi-square p = %g < 0.001", what, p);
  }
}

static ci_sampler_params seeded(uint64_t seed) {
  ci_sampler_params p;
  ci_sampler_params_default(&p);
  p.seed = seed;
  p.has_seed = 1;
  return p;
}

/* ==== RNG ==== */

static void test_philox_known_answers(void **state) {
  (void)state;
  /* Random123 tests/kat_vectors, the three philox4x32 10 lines. */
  static const uint32_t vectors[3][10] = {
      {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
      {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
       0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
      {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
       0x94fdcceb, 0x5001e420, 0x24126ea1}};
  for (int v = 0; v < 3; v++) {
    uint32_t out[4];
    ci_philox4x32_10(vectors[v], vectors[v] + 4, out);
    for (int i = 0; i < 4; i++) assert_int_equal(out[i], vectors[v][6 + i]);
  }
}

static void test_rng_keys_and_uniform(void **state) {
  (void)state;
  ci_rng rng;
  ci_rng_init(&rng, 42);
  assert_true(ci_rng_key(&rng, 0) == (42ull ^ 0x9E3779B97F4A7C15ull));
  assert_true(ci_rng_key(&rng, 1) == (42ull ^ (2 * 0x9E3779B97F4A7C15ull)));
  /* The value an independent Python implementation of §4.4 gives for seed 42, s 0, stream 0,
   * i 0. */
  assert_true(fabs(ci_rng_uniform(ci_rng_key(&rng, 0), 0, 0) - 0.6683869659900665) < 1e-15);
  double lo = 1, hi = 0;
  for (uint64_t i = 0; i < 100000; i++) {
    double u = ci_rng_uniform(0x1234567890abcdefull, 0, i);
    lo = u < lo ? u : lo;
    hi = u > hi ? u : hi;
  }
  assert_true(lo > 0 && lo < 1e-3 && hi < 1 && hi > 1 - 1e-3);
  ci_rng a, b;
  assert_int_equal(ci_rng_init_os(&a), CI_OK);
  assert_int_equal(ci_rng_init_os(&b), CI_OK);
  assert_true(a.seed != b.seed);
}

/* ==== Processors ==== */

static void test_repetition_penalty(void **state) {
  (void)state;
  float z[6] = {2.0f, -2.0f, 3.0f, -1.0f, 4.0f, 5.0f};
  int32_t counts[6] = {0};
  const int32_t history[] = {4, 0, 1, 0, 1, 1, 2}; /* window 0: every distinct id once */
  ci_penalties pen = {2.0f, 0, 0.0f, 20, 0.0f, 20};
  ci_logits_apply_penalties(z, 6, &pen, history, 7, counts);
  assert_true(z[0] == 1.0f && z[1] == -4.0f && z[2] == 1.5f && z[4] == 2.0f);
  assert_true(z[3] == -1.0f && z[5] == 5.0f);
  for (int i = 0; i < 6; i++) assert_int_equal(counts[i], 0);
  /* window 2: only the last two tokens (1, 2) */
  float w[6] = {2.0f, -2.0f, 3.0f, -1.0f, 4.0f, 5.0f};
  pen.repetition_context = 2;
  ci_logits_apply_penalties(w, 6, &pen, history, 7, counts);
  assert_true(w[0] == 2.0f && w[1] == -4.0f && w[2] == 1.5f && w[4] == 4.0f);
  /* p < 1 boosts */
  float b[2] = {2.0f, -2.0f};
  const int32_t h2[] = {0, 1};
  ci_penalties boost = {0.5f, 0, 0.0f, 0, 0.0f, 0};
  ci_logits_apply_penalties(b, 2, &boost, h2, 2, counts);
  assert_true(b[0] == 4.0f && b[1] == -1.0f);
}

static void test_presence_frequency_penalties(void **state) {
  (void)state;
  float z[5] = {0, 0, 0, 0, 0};
  int32_t counts[5] = {0};
  const int32_t history[] = {1, 1, 1, 2, 3, 3, 9 /* out of vocab: ignored */, -1};
  ci_penalties pen = {1.0f, 20, 0.5f, 0, 0.25f, 0};
  ci_logits_apply_penalties(z, 5, &pen, history, 8, counts);
  assert_true(z[0] == 0.0f);
  assert_true(z[1] == -0.5f - 0.75f);
  assert_true(z[2] == -0.5f - 0.25f);
  assert_true(z[3] == -0.5f - 0.5f);
  assert_true(z[4] == 0.0f);
  for (int i = 0; i < 5; i++) assert_int_equal(counts[i], 0);
  /* windows: presence over the last 3 ids (3, 3, 9, -1 -> last 3 = 3, 9, -1), frequency over
   * the last 5 (2, 3, 3, 9, -1); negative values boost. */
  float w[5] = {0, 0, 0, 0, 0};
  ci_penalties win = {1.0f, 20, -1.0f, 3, 1.0f, 5};
  ci_logits_apply_penalties(w, 5, &win, history, 8, counts);
  assert_true(w[1] == 0.0f && w[2] == -1.0f && w[3] == 1.0f - 2.0f);
}

static void test_logit_bias(void **state) {
  (void)state;
  float z[4] = {1, 2, 3, 4};
  ci_logits_apply_bias(z, 4, NULL, 0);
  assert_true(z[0] == 1 && z[1] == 2 && z[2] == 3 && z[3] == 4);
  const ci_logit_bias bias[] = {{2, -INFINITY}, {0, 5.0f}, {0, 1.0f}};
  ci_logits_apply_bias(z, 4, bias, 3);
  assert_true(z[0] == 7.0f && z[1] == 2.0f && isinf(z[2]) && z[2] < 0 && z[3] == 4.0f);
}

/* ==== Log-probabilities ==== */

static void test_log_softmax_and_top(void **state) {
  (void)state;
  float z[5] = {0.0f, logf(2.0f), logf(3.0f), -INFINITY, NAN};
  float lp[5];
  assert_int_equal(ci_log_softmax(z, 5, lp), CI_OK);
  assert_true(fabsf(lp[0] - logf(1.0f / 6)) < 1e-6f && fabsf(lp[2] - logf(0.5f)) < 1e-6f);
  assert_true(isinf(lp[3]) && isinf(lp[4]) && lp[4] < 0);
  const float ties[6] = {-1.0f, -0.5f, -1.0f, -0.5f, -3.0f, -0.25f};
  ci_logprob top[6];
  assert_int_equal(ci_logprobs_top(ties, 6, 4, top), 4);
  const int32_t want[4] = {5, 1, 3, 0};
  for (int i = 0; i < 4; i++) assert_int_equal(top[i].id, want[i]);
  assert_true(top[0].logprob == -0.25f);
  assert_int_equal(ci_logprobs_top(ties, 6, 30, top), 6);
  assert_int_equal(top[5].id, 4);
  assert_int_equal(ci_logprobs_top(ties, 6, 0, top), 0);
  float banned[2] = {-INFINITY, -INFINITY};
  assert_int_equal(ci_log_softmax(banned, 2, lp), CI_ERR);
  float inf[3] = {1.0f, INFINITY, 2.0f};
  assert_int_equal(ci_log_softmax(inf, 3, lp), CI_OK);
  assert_true(lp[1] == 0.0f && isinf(lp[0]) && isinf(lp[2]));
}

/* The sampler exposes lp after the processors, before filters and temperature (§5). */
static void test_sampler_logprobs(void **state) {
  (void)state;
  ci_sampler_params p = seeded(1);
  p.temperature = 0.3f;
  p.top_k = 2;
  const ci_logit_bias bias[] = {{3, 2.0f}};
  p.logit_bias = bias;
  p.n_logit_bias = 1;
  ci_sampler *s = ci_sampler_create(&p, TOY_V);
  assert_non_null(s);
  float z[TOY_V], expect[TOY_V];
  memcpy(z, toy_logits, sizeof z);
  memcpy(expect, toy_logits, sizeof z);
  expect[3] += 2.0f;
  ci_log_softmax(expect, TOY_V, expect);
  assert_true(ci_sampler_next(s, z, NULL, 0) >= 0);
  const float *lp = ci_sampler_logprobs(s);
  for (int i = 0; i < TOY_V; i++) assert_true(lp[i] == expect[i]);
  ci_sampler_free(s);
}

/* ==== Distribution of the draw (chi-square) ==== */

static void test_fit_temperature(void **state) {
  (void)state;
  const float temps[] = {1.0f, 0.5f, 2.0f};
  for (int i = 0; i < 3; i++) {
    ci_sampler_params p = seeded(1000 + (uint64_t)i);
    p.temperature = temps[i];
    ref_params rp = {.temperature = temps[i]};
    char what[32];
    snprintf(what, sizeof what, "temperature %g", (double)temps[i]);
    check_fit(&p, &rp, toy_logits, toy_logits, NULL, 0, what);
  }
}

static void test_fit_top_k(void **state) {
  (void)state;
  ci_sampler_params p = seeded(2000);
  p.temperature = 1.0f;
  p.top_k = 3;
  ref_params rp = {.temperature = 1.0, .top_k = 3};
  check_fit(&p, &rp, toy_logits, toy_logits, NULL, 0, "top_k 3");
}

static void test_fit_top_p(void **state) {
  (void)state;
  const float ps[] = {0.7f, 0.93f, 0.2f};
  for (int i = 0; i < 3; i++) {
    ci_sampler_params p = seeded(3000 + (uint64_t)i);
    p.temperature = 1.0f;
    p.top_p = ps[i];
    ref_params rp = {.temperature = 1.0, .top_p = ps[i]};
    check_fit(&p, &rp, toy_logits, toy_logits, NULL, 0, "top_p");
  }
}

static void test_fit_min_p(void **state) {
  (void)state;
  ci_sampler_params p = seeded(4000);
  p.temperature = 1.0f;
  p.min_p = 0.15f;
  ref_params rp = {.temperature = 1.0, .min_p = 0.15};
  check_fit(&p, &rp, toy_logits, toy_logits, NULL, 0, "min_p 0.15");
  /* min_tokens_to_keep protects the 3 best even though only 1 passes min_p 0.9 */
  p = seeded(4001);
  p.temperature = 1.0f;
  p.min_p = 0.9f;
  p.min_tokens_to_keep = 3;
  ref_params keep = {.temperature = 1.0, .min_p = 0.9, .min_keep = 3};
  check_fit(&p, &keep, toy_logits, toy_logits, NULL, 0, "min_p 0.9 keep 3");
}

static void test_fit_combination(void **state) {
  (void)state;
  ci_sampler_params p = seeded(5000);
  p.temperature = 0.8f;
  p.top_p = 0.93f;
  p.min_p = 0.05f;
  p.top_k = 4;
  ref_params rp = {.temperature = 0.8, .top_p = 0.93, .min_p = 0.05, .top_k = 4};
  check_fit(&p, &rp, toy_logits, toy_logits, NULL, 0, "top_p + min_p + top_k + temperature");
}

static void test_fit_logit_bias(void **state) {
  (void)state;
  ci_sampler_params p = seeded(6000);
  p.temperature = 1.0f;
  const ci_logit_bias bias[] = {{6, 3.0f}, {1, -INFINITY}, {3, -1.5f}};
  p.logit_bias = bias;
  p.n_logit_bias = 3;
  float processed[TOY_V];
  memcpy(processed, toy_logits, sizeof processed);
  ci_logits_apply_bias(processed, TOY_V, bias, 3);
  ref_params rp = {.temperature = 1.0};
  check_fit(&p, &rp, toy_logits, processed, NULL, 0, "logit_bias");
}

static void test_fit_penalties(void **state) {
  (void)state;
  ci_sampler_params p = seeded(7000);
  p.temperature = 1.0f;
  p.penalties = (ci_penalties){1.3f, 4, 0.5f, 0, 0.3f, 0};
  const int32_t history[] = {1, 4, 4, 7, 2, 4, 0, 1};
  float processed[TOY_V];
  int32_t counts[TOY_V] = {0};
  memcpy(processed, toy_logits, sizeof processed);
  ci_logits_apply_penalties(processed, TOY_V, &p.penalties, history, 8, counts);
  ref_params rp = {.temperature = 1.0};
  check_fit(&p, &rp, toy_logits, processed, history, 8, "penalties");
}

static void test_fit_xtc(void **state) {
  (void)state;
  /* probability 1: of the tokens above 0.1 (1, 7, 4) all but the least likely (4) go... */
  ci_sampler_params p = seeded(8000);
  p.temperature = 1.0f;
  p.xtc_probability = 1.0f;
  p.xtc_threshold = 0.1f;
  ref_params rp = {.temperature = 1.0, .xtc = 1, .xtc_threshold = 0.1};
  check_fit(&p, &rp, toy_logits, toy_logits, NULL, 0, "xtc p=1");
  /* ...except exempt ones (EOS, newline) */
  const int32_t exempt[] = {7};
  p = seeded(8001);
  p.temperature = 1.0f;
  p.xtc_probability = 1.0f;
  p.xtc_threshold = 0.1f;
  p.xtc_exempt = exempt;
  p.n_xtc_exempt = 1;
  ref_params rpe = {
      .temperature = 1.0, .xtc = 1, .xtc_threshold = 0.1, .exempt = exempt, .n_exempt = 1};
  check_fit(&p, &rpe, toy_logits, toy_logits, NULL, 0, "xtc p=1 with exempt id");
  /* probability 0.5: an even mixture of the filtered and the plain distribution */
  p = seeded(8002);
  p.temperature = 1.0f;
  p.xtc_probability = 0.5f;
  p.xtc_threshold = 0.1f;
  long counts[TOY_V];
  double with[TOY_V], without[TOY_V], mix[TOY_V];
  draw_counts(&p, toy_logits, TOY_V, NULL, 0, counts);
  ref_params plain = {.temperature = 1.0};
  reference_probs(toy_logits, TOY_V, &rp, with);
  reference_probs(toy_logits, TOY_V, &plain, without);
  for (int i = 0; i < TOY_V; i++) mix[i] = 0.5 * with[i] + 0.5 * without[i];
  assert_true(chi_square_p(counts, mix, TOY_V, DRAWS) >= 0.001);
}

/* The chi-square helper itself: df 7 at its 0.001 critical value 24.322. */
static void test_chi_square_helper(void **state) {
  (void)state;
  assert_true(fabs(gamma_q(3.5, 24.322 / 2) - 0.001) < 2e-6);
  assert_true(fabs(gamma_q(1.0, 2.0) - exp(-2.0)) < 1e-12);
}

/* ==== Determinism, greedy, edge cases ==== */

static void draw_sequence(const ci_sampler_params *p, const float *logits, int V, int n,
                          int32_t *out) {
  ci_sampler *s = ci_sampler_create(p, V);
  assert_non_null(s);
  float *z = malloc((size_t)V * sizeof *z);
  for (int i = 0; i < n; i++) {
    memcpy(z, logits, (size_t)V * sizeof *z);
    out[i] = ci_sampler_next(s, z, NULL, 0);
  }
  free(z);
  ci_sampler_free(s);
}

static void test_seed_determinism(void **state) {
  (void)state;
  enum { N = 200 };
  int32_t a[N], b[N], c[N];
  ci_sampler_params p = seeded(42);
  p.temperature = 1.0f;
  draw_sequence(&p, toy_logits, TOY_V, N, a);
  draw_sequence(&p, toy_logits, TOY_V, N, b);
  assert_memory_equal(a, b, sizeof a);
  /* The same draws an independent Python implementation of §4.3-4.4 gives (seed 42, T 1). */
  const int32_t golden[12] = {5, 1, 7, 7, 2, 4, 0, 2, 4, 1, 4, 7};
  assert_memory_equal(a, golden, sizeof golden);
  p.seed = 12345;
  p.temperature = 0.7f;
  const int32_t golden_t07[12] = {1, 7, 0, 7, 1, 4, 4, 0, 1, 0, 1, 1};
  draw_sequence(&p, toy_logits, TOY_V, 12, c);
  assert_memory_equal(c, golden_t07, sizeof golden_t07);
  p.seed = 43;
  p.temperature = 1.0f;
  draw_sequence(&p, toy_logits, TOY_V, N, c);
  assert_true(memcmp(a, c, sizeof a) != 0);
  /* The token at index s depends only on (seed, s, lp, params): sample_at out of order. */
  p.seed = 42;
  ci_sampler *s = ci_sampler_create(&p, TOY_V);
  float z[TOY_V];
  for (uint64_t i = N; i-- > 0;) {
    memcpy(z, toy_logits, sizeof z);
    assert_int_equal(ci_sampler_sample_at(s, z, NULL, 0, i), a[i]);
  }
  assert_true(ci_sampler_index(s) == 0);
  ci_sampler_free(s);
  /* Unseeded samplers draw distinct seeds from the OS. */
  ci_sampler_params_default(&p);
  ci_sampler *u1 = ci_sampler_create(&p, TOY_V), *u2 = ci_sampler_create(&p, TOY_V);
  assert_true(ci_sampler_seed(u1) != ci_sampler_seed(u2));
  ci_sampler_free(u1);
  ci_sampler_free(u2);
}

static void test_greedy(void **state) {
  (void)state;
  const float ties[5] = {1.0f, 3.0f, 3.0f, 2.0f, -1.0f};
  ci_sampler_params p = seeded(9);
  p.temperature = 0.0f;
  p.top_k = 2; /* ignored at temperature 0 */
  int32_t out[10];
  draw_sequence(&p, ties, 5, 10, out);
  for (int i = 0; i < 10; i++) assert_int_equal(out[i], 1);
  /* top_k = 1 equals greedy at any temperature, including after processors */
  p.temperature = 1.5f;
  p.top_k = 1;
  draw_sequence(&p, toy_logits, TOY_V, 10, out);
  for (int i = 0; i < 10; i++) assert_int_equal(out[i], 1);
  const ci_logit_bias bias[] = {{2, 0.5f}};
  p.logit_bias = bias;
  p.n_logit_bias = 1;
  p.temperature = 0.0f;
  draw_sequence(&p, ties, 5, 3, out);
  assert_int_equal(out[0], 2);
}

/* A greedy sampler without processors takes row picks, and the host pick of a row is its token
 * and its logprob bit for bit: ties to the lowest id, NaN never chosen, +inf, all -inf. */
static void test_row_picks(void **state) {
  (void)state;
  enum { V = 1003 }; /* not a multiple of the 16 lanes */
  float *z = malloc(V * sizeof *z), *work = malloc(V * sizeof *work);
  assert_non_null(z);
  assert_non_null(work);
  ci_sampler_params p = seeded(5);
  p.temperature = 0.0f;
  for (int kind = 0; kind < 6; kind++) {
    uint32_t x = 12345u + (uint32_t)kind;
    for (int i = 0; i < V; i++) {
      x = x * 1664525u + 1013904223u;
      z[i] = (float)(x >> 8) / (float)(1 << 24) * 20.0f - 10.0f;
    }
    if (kind == 1) z[700] = z[40] = 11.0f;                   /* a tie: 40 wins */
    if (kind == 2) z[3] = NAN, z[500] = NAN, z[900] = 12.0f; /* NaN never wins */
    if (kind == 3) z[10] = -INFINITY, z[1002] = 13.0f;       /* -inf, the tail lane */
    if (kind == 4) z[600] = INFINITY, z[80] = INFINITY;      /* +inf: logprob 0 */
    if (kind == 5) z[0] = NAN, z[1] = 10.5f, z[2] = nextafterf(10.5f, 0.0f); /* near tie */
    const ci_row_pick pick = ci_row_pick_of(z, V);
    ci_sampler *s = ci_sampler_create(&p, V);
    assert_non_null(s);
    assert_true(ci_sampler_takes_row_picks(s));
    memcpy(work, z, V * sizeof *z);
    const int32_t token = ci_sampler_next(s, work, NULL, 0);
    assert_int_equal(pick.token, token);
    const float lp = ci_sampler_logprobs(s)[token];
    assert_memory_equal(&pick.logprob, &lp, sizeof lp);
    if (kind == 1) assert_int_equal(token, 40);
    if (kind == 2) assert_int_equal(token, 900);
    if (kind == 3) assert_int_equal(token, 1002);
    if (kind == 4) assert_true(token == 80 && pick.logprob == 0.0f);
    if (kind == 5) assert_int_equal(token, 1);
    ci_sampler_free(s);
  }
  for (int i = 0; i < V; i++) z[i] = i % 2 ? -INFINITY : NAN; /* nothing can be chosen */
  assert_int_equal(ci_row_pick_of(z, V).token, -1);
  /* anything that changes the row or draws from it takes the row */
  const ci_logit_bias bias[] = {{2, 0.5f}};
  ci_sampler_params q = p;
  q.logit_bias = bias;
  q.n_logit_bias = 1;
  ci_sampler_params r = p;
  r.penalties.repetition = 1.1f;
  ci_sampler_params t = p;
  t.temperature = 0.7f;
  const ci_sampler_params *rows[] = {&q, &r, &t};
  for (int i = 0; i < 3; i++) {
    ci_sampler *s = ci_sampler_create(rows[i], V);
    assert_false(ci_sampler_takes_row_picks(s));
    ci_sampler_free(s);
  }
  free(z);
  free(work);
}

static void test_edge_cases(void **state) {
  (void)state;
  enum { N = 300 };
  int32_t base[N], other[N];
  ci_sampler_params p = seeded(77);
  p.temperature = 1.0f;
  draw_sequence(&p, toy_logits, TOY_V, N, base);
  p.top_k = 1000; /* top_k > vocab is off */
  draw_sequence(&p, toy_logits, TOY_V, N, other);
  assert_memory_equal(base, other, sizeof base);
  p.top_k = 0;
  p.top_p = 1.0f; /* top_p 1 (and 0) is off */
  draw_sequence(&p, toy_logits, TOY_V, N, other);
  assert_memory_equal(base, other, sizeof base);
  p.top_p = 0.0f;
  draw_sequence(&p, toy_logits, TOY_V, N, other);
  assert_memory_equal(base, other, sizeof base);
  /* all but one banned */
  ci_logit_bias ban[TOY_V];
  for (int i = 0; i < TOY_V; i++) ban[i] = (ci_logit_bias){i, -INFINITY};
  ban[6].id = 5; /* 6 survives (5 is banned twice) */
  p.logit_bias = ban;
  p.n_logit_bias = TOY_V;
  draw_sequence(&p, toy_logits, TOY_V, N, other);
  for (int i = 0; i < N; i++) assert_int_equal(other[i], 6);
  p.temperature = 0;
  draw_sequence(&p, toy_logits, TOY_V, 5, other);
  assert_int_equal(other[0], 6);
  /* all banned: no token, an error */
  ban[6].id = 6;
  p.temperature = 1.0f;
  ci_sampler *s = ci_sampler_create(&p, TOY_V);
  float z[TOY_V];
  memcpy(z, toy_logits, sizeof z);
  assert_int_equal(ci_sampler_next(s, z, NULL, 0), -1);
  assert_non_null(strstr(ci_last_error(), "banned"));
  assert_true(ci_sampler_index(s) == 0);
  ci_sampler_free(s);
  /* a one-token vocabulary */
  const float one[1] = {0.5f};
  p = seeded(1);
  draw_sequence(&p, one, 1, 3, other);
  assert_int_equal(other[2], 0);
}

static void test_validation(void **state) {
  (void)state;
  const char *fields[6] = {"temperature", "top_p", "min_p", "top_k", "repetition", "logit_bias"};
  ci_sampler_params p[6];
  for (int i = 0; i < 6; i++) p[i] = seeded(1);
  p[0].temperature = -0.1f;
  p[1].top_p = 1.5f;
  p[2].min_p = NAN;
  p[3].top_k = -1;
  p[4].penalties.repetition = 0.0f;
  const ci_logit_bias bad[] = {{TOY_V, 1.0f}};
  p[5].logit_bias = bad;
  p[5].n_logit_bias = 1;
  for (int i = 0; i < 6; i++) {
    assert_null(ci_sampler_create(&p[i], TOY_V));
    assert_non_null(strstr(ci_last_error(), fields[i]));
  }
  ci_sampler_params ok = seeded(1);
  const ci_logit_bias big[] = {{0, 101.0f}};
  ok.logit_bias = big;
  ok.n_logit_bias = 1;
  assert_int_equal(ci_sampler_params_validate(&ok, TOY_V), CI_ERR);
  ok.n_logit_bias = 0;
  assert_int_equal(ci_sampler_params_validate(&ok, TOY_V), CI_OK);
}

/* ==== A 262144-token vocabulary: partial selection paths ==== */

/* Deterministic, roughly normal logits with scale `scale`. */
static float *big_logits(uint64_t seed, float scale) {
  float *z = malloc((size_t)BIG_V * sizeof *z);
  for (int i = 0; i < BIG_V; i++) {
    double sum = 0;
    for (int k = 0; k < 4; k++) {
      seed += 0x9E3779B97F4A7C15ull;
      uint64_t x = seed;
      x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
      x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
      x ^= x >> 31;
      sum += (double)(x >> 11) * 0x1p-53;
    }
    z[i] = (float)((sum - 2.0) * 1.7320508 * scale);
  }
  return z;
}

/* Every draw falls inside the reference survivor set, and the draws vary. */
static void check_support(const ci_sampler_params *p, const ref_params *rp, const float *z,
                          int draws, const char *what) {
  double *probs = malloc((size_t)BIG_V * sizeof *probs);
  reference_probs(z, BIG_V, rp, probs);
  draws = (draws + BIG_DRAW_DIVISOR - 1) / BIG_DRAW_DIVISOR;
  int support = 0;
  for (int i = 0; i < BIG_V; i++) support += probs[i] > 0;
  ci_sampler *s = ci_sampler_create(p, BIG_V);
  float *work = malloc((size_t)BIG_V * sizeof *work);
  int distinct_hits = 0;
  char *seen = calloc(BIG_V, 1);
  double t0 = ci_now_seconds();
  for (int d = 0; d < draws; d++) {
    memcpy(work, z, (size_t)BIG_V * sizeof *work);
    int32_t t = ci_sampler_next(s, work, NULL, 0);
    assert_true(t >= 0);
    if (probs[t] == 0) fail_msg("%s: drew %d outside the %d survivors", what, t, support);
    distinct_hits += !seen[t];
    seen[t] = 1;
  }
  double per_draw = (ci_now_seconds() - t0) / draws;
  fprintf(stderr, "  %s: %d survivors, %d distinct of %d draws, %.2f ms per draw\n", what, support,
          distinct_hits, draws, per_draw * 1e3);
  assert_true(distinct_hits > 1 || support == 1);
  free(seen);
  free(work);
  free(probs);
  ci_sampler_free(s);
}

static void test_big_vocab(void **state) {
  (void)state;
  float *z = big_logits(11, 3.0f);
  ci_sampler_params p = seeded(101);
  p.temperature = 0.8f;
  p.top_k = 40;
  check_support(&p, &(ref_params){.temperature = 0.8, .top_k = 40}, z, 200, "top_k 40");
  p = seeded(102);
  p.temperature = 1.0f;
  p.top_p = 0.9f; /* a nucleus of thousands: the widening path */
  check_support(&p, &(ref_params){.temperature = 1.0, .top_p = 0.9}, z, 100, "top_p 0.9");
  p = seeded(103);
  p.temperature = 1.0f;
  p.min_p = 0.05f;
  check_support(&p, &(ref_params){.temperature = 1.0, .min_p = 0.05}, z, 100, "min_p 0.05");
  p = seeded(104);
  p.min_p = 0.5f;
  p.min_tokens_to_keep = 500;
  check_support(&p, &(ref_params){.temperature = 0.7, .min_p = 0.5, .min_keep = 500}, z, 100,
                "min_p 0.5 keep 500");
  p = seeded(105);
  p.temperature = 1.0f;
  check_support(&p, &(ref_params){.temperature = 1.0}, z, 50, "no filter");

  /* Chi-square on a big vocabulary whose nucleus is 6 planted tokens. */
  for (int i = 0; i < BIG_V; i++) z[i] = z[i] * 0.1f - 12.0f;
  const int32_t planted[6] = {7, 1000, 65536, 131071, 200000, 262143};
  const float planted_z[6] = {3.0f, 2.5f, 2.0f, 2.4f, 1.0f, 3.0f};
  for (int i = 0; i < 6; i++) z[planted[i]] = planted_z[i];
  p = seeded(106);
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  ci_sampler *s = ci_sampler_create(&p, BIG_V);
  float *work = malloc((size_t)BIG_V * sizeof *work);
  double *probs = malloc((size_t)BIG_V * sizeof *probs);
  reference_probs(z, BIG_V, &(ref_params){.temperature = 0.9, .top_p = 0.95}, probs);
  long counts[6] = {0};
  double expected[6];
  for (int i = 0; i < 6; i++) expected[i] = probs[planted[i]];
  enum { BIG_DRAWS = 3000 / BIG_DRAW_DIVISOR };
  for (int d = 0; d < BIG_DRAWS; d++) {
    memcpy(work, z, (size_t)BIG_V * sizeof *work);
    int32_t t = ci_sampler_next(s, work, NULL, 0);
    int hit = -1;
    for (int i = 0; i < 6; i++) hit = planted[i] == t ? i : hit;
    if (hit < 0 || probs[t] == 0) fail_msg("drew %d outside the planted nucleus", t);
    counts[hit]++;
  }
  assert_true(chi_square_p(counts, expected, 6, BIG_DRAWS) >= 0.001);
  free(probs);
  free(work);
  ci_sampler_free(s);
  free(z);
}

/* The survivor set and probabilities of ci_sampler_distribution equal the reference's, on the
 * heap, quickselect, top-p prefix and top-p histogram paths. */
static void test_distribution_matches_reference(void **state) {
  (void)state;
  float *z = big_logits(21, 3.0f);
  float *work = malloc((size_t)BIG_V * sizeof *work);
  float *probs = malloc((size_t)BIG_V * sizeof *probs);
  int32_t *ids = malloc((size_t)BIG_V * sizeof *ids);
  double *want = malloc((size_t)BIG_V * sizeof *want);
  const struct {
    float temperature, top_p, min_p;
    int top_k, min_keep;
  } cases[] = {
      {1.0f, 0.9f, 0, 0, 1},  {0.7f, 0.5f, 0, 0, 1},   {1.3f, 0.99f, 0, 0, 1},
      {1.0f, 0.05f, 0, 0, 1}, {1.0f, 0, 0, 40, 1},     {1.0f, 0, 0, 3000, 1},
      {1.0f, 0, 0.05f, 0, 1}, {1.0f, 0, 0.5f, 0, 700}, {0.8f, 0.97f, 0.01f, 5000, 1},
      {2.0f, 0, 0, 0, 1},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    ci_sampler_params p = seeded(9);
    p.temperature = cases[k].temperature;
    p.top_p = cases[k].top_p;
    p.min_p = cases[k].min_p;
    p.top_k = cases[k].top_k;
    p.min_tokens_to_keep = cases[k].min_keep;
    ref_params rp = {.temperature = p.temperature,
                     .top_p = p.top_p,
                     .min_p = p.min_p,
                     .top_k = p.top_k,
                     .min_keep = p.min_tokens_to_keep};
    reference_probs(z, BIG_V, &rp, want);
    ci_sampler *s = ci_sampler_create(&p, BIG_V);
    memcpy(work, z, (size_t)BIG_V * sizeof *work);
    int n = ci_sampler_distribution(s, work, NULL, 0, 0, ids, probs);
    int support = 0, wrong = 0;
    double total = 0;
    for (int i = 0; i < BIG_V; i++) support += want[i] > 0;
    for (int i = 0; i < n; i++) {
      total += probs[i];
      if (want[ids[i]] == 0 || fabs(probs[i] - want[ids[i]]) > 1e-6 + 1e-4 * want[ids[i]]) wrong++;
    }
    if (n != support || wrong)
      fail_msg("case %zu: %d survivors (reference %d), %d wrong", k, n, support, wrong);
    assert_true(fabs(total - 1.0) < 1e-4);
    ci_sampler_free(s);
  }
  /* temperature 0: the argmax with probability 1 */
  ci_sampler_params p = seeded(9);
  p.temperature = 0;
  ci_sampler *s = ci_sampler_create(&p, BIG_V);
  memcpy(work, z, (size_t)BIG_V * sizeof *work);
  assert_int_equal(ci_sampler_distribution(s, work, NULL, 0, 0, ids, probs), 1);
  assert_int_equal(ids[0], ci_argmax(z, BIG_V));
  ci_sampler_free(s);
  free(want);
  free(ids);
  free(probs);
  free(work);
  free(z);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_philox_known_answers),
      cmocka_unit_test(test_rng_keys_and_uniform),
      cmocka_unit_test(test_repetition_penalty),
      cmocka_unit_test(test_presence_frequency_penalties),
      cmocka_unit_test(test_logit_bias),
      cmocka_unit_test(test_log_softmax_and_top),
      cmocka_unit_test(test_sampler_logprobs),
      cmocka_unit_test(test_chi_square_helper),
      cmocka_unit_test(test_fit_temperature),
      cmocka_unit_test(test_fit_top_k),
      cmocka_unit_test(test_fit_top_p),
      cmocka_unit_test(test_fit_min_p),
      cmocka_unit_test(test_fit_combination),
      cmocka_unit_test(test_fit_logit_bias),
      cmocka_unit_test(test_fit_penalties),
      cmocka_unit_test(test_fit_xtc),
      cmocka_unit_test(test_seed_determinism),
      cmocka_unit_test(test_greedy),
      cmocka_unit_test(test_row_picks),
      cmocka_unit_test(test_edge_cases),
      cmocka_unit_test(test_validation),
      cmocka_unit_test(test_big_vocab),
      cmocka_unit_test(test_distribution_matches_reference),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
