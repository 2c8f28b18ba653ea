/* The speculation policy (docs/generation.md "Speculative decoding"): whether a step speculates,
 * decided per step from measurements. A verify step of k + 1 rows per sequence costs more than a
 * plain step when the step is compute-bound (a CPU, or a GPU at a large batch), so speculation
 * pays only when the tokens it is expected to add outweigh the time it adds. The policy keeps a
 * running estimate of a step's time as a function of its row count (a table of mean times per
 * row-count bucket, learned online from every step), of the draft model's time per drafting step,
 * and of the acceptance rate; a step speculates when its expected tokens per second with the
 * planned drafts beat those without. Buckets without enough samples are explored first, and a
 * long run of plain steps is broken by one speculative step to re-measure. The decision only
 * changes draft lengths (to 0 or not), never which tokens come out under greedy decoding. */
#ifndef CI_ENGINE_SPEC_POLICY_H
#define CI_ENGINE_SPEC_POLICY_H

enum {
  CI_SPEC_POLICY_BUCKETS = 16, /* rows 1, 2, 3-4, 5-8, ... 16385+ */
  CI_SPEC_POLICY_MIN_SAMPLES = 3,
  CI_SPEC_POLICY_REPROBE = 64 /* plain steps in a row before a speculative one re-measures */
};

typedef struct {
  double ms[CI_SPEC_POLICY_BUCKETS];   /* running mean step time of the bucket */
  double rows[CI_SPEC_POLICY_BUCKETS]; /* running mean row count of its steps */
  int n[CI_SPEC_POLICY_BUCKETS];       /* samples (saturating) */
  double draft_ms;                     /* running mean time of one draft-model step */
  int draft_n;
  double accept; /* running acceptance rate of a drafted token */
  int accept_n;
  int plain_run; /* steps in a row the policy kept plain */
} ci_spec_policy;

/* Empty estimates (every bucket unexplored, acceptance 0.5 until measured). */
void ci_spec_policy_init(ci_spec_policy *p);

/* The bucket of a row count. */
int ci_spec_policy_bucket(int rows);

/* A step of `rows` rows took `ms` milliseconds (any step: plain, speculative, prefill). */
void ci_spec_policy_observe_step(ci_spec_policy *p, int rows, double ms);

/* `steps` draft-model steps took `ms` milliseconds in all. */
void ci_spec_policy_observe_draft(ci_spec_policy *p, int steps, double ms);

/* A round drafted `drafted` tokens of which `accepted` were accepted. */
void ci_spec_policy_observe_accept(ci_spec_policy *p, int drafted, int accepted);

/* The estimated time of a step of `rows` rows: piecewise linear between the measured buckets
 * around it, proportional to the rows beyond the last one; < 0 when nothing is measured. */
double ci_spec_policy_step_ms(const ci_spec_policy *p, int rows);

/* Tokens a sequence is expected to emit in a round of k drafts at acceptance rate a (each draft
 * accepted with probability a while the ones before it were): 1 + a + a^2 + ... + a^k. */
double ci_spec_policy_expected_tokens(double a, int k);

/* Whether a step speculates: base_rows rows without speculation (decode rows and prefill
 * chunks), n_decode of them decoding sequences, of which n_spec would draft k[0..n_spec) tokens
 * with per-sequence acceptance rates accept[i] (NULL: the running rate), and draft_steps
 * draft-model steps to make them (0 for prompt lookup). 1 = speculate, 0 = a plain step. */
int ci_spec_policy_decide(ci_spec_policy *p, int base_rows, int n_decode, const int *k,
                          const double *accept, int n_spec, int draft_steps);

#endif
