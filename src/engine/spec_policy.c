/* The speculation policy: step-time table, acceptance estimate and the per-step decision (see
 * spec_policy.h). */
#include "engine/spec_policy.h"

#include <math.h>
#include <string.h>

/* Weight of a new sample in a running mean once the bucket has a few (an exponential mean, so
 * that the table follows a machine whose speed changes). */
#define EMA_WEIGHT 0.1

void ci_spec_policy_init(ci_spec_policy *p) {
  memset(p, 0, sizeof *p);
  p->accept = 0.5;
}

int ci_spec_policy_bucket(int rows) {
  int b = 0;
  for (int r = rows > 1 ? rows - 1 : 0; r > 0 && b < CI_SPEC_POLICY_BUCKETS - 1; r >>= 1) b++;
  return b;
}

/* Folds x into a running mean of n samples so far. */
static double fold(double mean, int n, double x) {
  const double w = n < 1 ? 1.0 : n < 1.0 / EMA_WEIGHT ? 1.0 / (n + 1) : EMA_WEIGHT;
  return mean + w * (x - mean);
}

void ci_spec_policy_observe_step(ci_spec_policy *p, int rows, double ms) {
  if (rows < 1 || !(ms >= 0)) return;
  const int b = ci_spec_policy_bucket(rows);
  p->ms[b] = fold(p->ms[b], p->n[b], ms);
  p->rows[b] = fold(p->rows[b], p->n[b], rows);
  if (p->n[b] < 1 << 20) p->n[b]++;
}

void ci_spec_policy_observe_draft(ci_spec_policy *p, int steps, double ms) {
  if (steps < 1 || !(ms >= 0)) return;
  p->draft_ms = fold(p->draft_ms, p->draft_n, ms / steps);
  if (p->draft_n < 1 << 20) p->draft_n++;
}

void ci_spec_policy_observe_accept(ci_spec_policy *p, int drafted, int accepted) {
  if (drafted < 1) return;
  p->accept = fold(p->accept, p->accept_n, (double)accepted / drafted);
  if (p->accept_n < 1 << 20) p->accept_n++;
}

double ci_spec_policy_step_ms(const ci_spec_policy *p, int rows) {
  int lo = -1, hi = -1; /* the measured buckets whose mean rows are nearest below / above */
  for (int b = 0; b < CI_SPEC_POLICY_BUCKETS; b++) {
    if (p->n[b] == 0) continue;
    if (p->rows[b] <= rows && (lo < 0 || p->rows[b] > p->rows[lo])) lo = b;
    if (p->rows[b] >= rows && (hi < 0 || p->rows[b] < p->rows[hi])) hi = b;
  }
  if (lo < 0 && hi < 0) return -1;
  if (lo >= 0 && hi >= 0) {
    const double span = p->rows[hi] - p->rows[lo];
    if (span <= 0) return p->ms[lo];
    return p->ms[lo] + (p->ms[hi] - p->ms[lo]) * (rows - p->rows[lo]) / span;
  }
  if (hi >= 0) return p->ms[hi];         /* fewer rows than any measured: no cheaper than those */
  return p->ms[lo] * rows / p->rows[lo]; /* more rows than any measured: proportional */
}

double ci_spec_policy_expected_tokens(double a, int k) {
  double sum = 1, term = 1;
  for (int j = 0; j < k; j++) sum += term *= a;
  return sum;
}

int ci_spec_policy_decide(ci_spec_policy *p, int base_rows, int n_decode, const int *k,
                          const double *accept, int n_spec, int draft_steps) {
  int spec_rows = base_rows;
  for (int i = 0; i < n_spec; i++) spec_rows += k[i];
  if (n_spec == 0 || spec_rows == base_rows) return 0;
  const int b_plain = ci_spec_policy_bucket(base_rows), b_spec = ci_spec_policy_bucket(spec_rows);
  /* explore: a bucket without enough samples is measured first (speculation first) */
  int decision;
  if (p->n[b_spec] < CI_SPEC_POLICY_MIN_SAMPLES ||
      (draft_steps > 0 && p->draft_n < CI_SPEC_POLICY_MIN_SAMPLES))
    decision = 1;
  else if (p->n[b_plain] < CI_SPEC_POLICY_MIN_SAMPLES)
    decision = 0;
  else if (p->plain_run >= CI_SPEC_POLICY_REPROBE)
    decision = 1;
  else {
    double tokens = n_decode - n_spec; /* the decoding sequences that do not draft */
    for (int i = 0; i < n_spec; i++)
      tokens += ci_spec_policy_expected_tokens(accept ? accept[i] : p->accept, k[i]);
    const double t_spec = ci_spec_policy_step_ms(p, spec_rows) + draft_steps * p->draft_ms;
    const double t_plain = ci_spec_policy_step_ms(p, base_rows);
    /* tokens / t_spec > n_decode / t_plain, without dividing by a time of 0 */
    decision = tokens * t_plain > n_decode * t_spec;
  }
  p->plain_run = decision ? 0 : p->plain_run + 1;
  return decision;
}
