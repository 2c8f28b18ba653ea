/* Logits processors (docs/generation.md §4.2), applied in place to the raw f32 logits z[V] of the
 * position being sampled, in this exact order: logit_bias, repetition, presence, frequency
 * (then the grammar mask, which lives with the grammar). Each processor's window is the last c
 * tokens of the history h = prompt + every token sampled so far (c = its context size; 0 = all).
 * History ids outside [0, V) are ignored. */
#ifndef CI_SAMPLE_PROCESSORS_H
#define CI_SAMPLE_PROCESSORS_H

#include <stddef.h>
#include <stdint.h>

/* One logit_bias entry: z[id] += bias (bias may be -INFINITY to ban the token). */
typedef struct {
  int32_t id;
  float bias;
} ci_logit_bias;

/* Penalties with their windows; a penalty at its off value (repetition 1, presence 0,
 * frequency 0) costs nothing. */
typedef struct {
  float repetition;       /* p > 0: z <- z*p if z < 0 else z/p, once per distinct token */
  int repetition_context; /* c >= 0, 0 = whole history */
  float presence;         /* alpha: z -= alpha once per distinct token */
  int presence_context;
  float frequency; /* beta: z -= beta * count in the window */
  int frequency_context;
} ci_penalties;

/* z[id] += bias for each entry (ids must be in [0, V); entries are applied in order, so a
 * repeated id accumulates). */
void ci_logits_apply_bias(float *z, int vocab, const ci_logit_bias *bias, int n_bias);

/* Repetition, presence and frequency penalties in that order over their windows of
 * history[0..n_history). `counts` is caller scratch of `vocab` int32 that must be all zero on
 * entry; it is all zero again on return. */
void ci_logits_apply_penalties(float *z, int vocab, const ci_penalties *pen, const int32_t *history,
                               size_t n_history, int32_t *counts);

#endif
