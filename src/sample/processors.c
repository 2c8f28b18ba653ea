/* Logits processors: logit_bias and the windowed repetition/presence/frequency penalties
 * (see processors.h). */
#include "sample/processors.h"

void ci_logits_apply_bias(float *z, int vocab, const ci_logit_bias *bias, int n_bias) {
  for (int i = 0; i < n_bias; i++)
    if (bias[i].id >= 0 && bias[i].id < vocab) z[bias[i].id] += bias[i].bias;
}

/* The last `context` tokens of the history (all of it when context is 0). */
static const int32_t *window_of(const int32_t *history, size_t n_history, int context,
                                size_t *n_window) {
  size_t n = context > 0 && (size_t)context < n_history ? (size_t)context : n_history;
  *n_window = n;
  return history + (n_history - n);
}

static int in_vocab(int32_t id, int vocab) {
  return id >= 0 && id < vocab;
}

/* Repetition: once per distinct token of the window, divide positive and multiply negative
 * logits by p (so p > 1 always lowers the token). */
static void apply_repetition(float *z, int vocab, float p, const int32_t *w, size_t n,
                             int32_t *counts) {
  for (size_t i = 0; i < n; i++) {
    int32_t t = w[i];
    if (!in_vocab(t, vocab) || counts[t]++) continue;
    z[t] = z[t] < 0 ? z[t] * p : z[t] / p;
  }
  for (size_t i = 0; i < n; i++)
    if (in_vocab(w[i], vocab)) counts[w[i]] = 0;
}

/* Presence: z -= alpha once per distinct token of the window. */
static void apply_presence(float *z, int vocab, float alpha, const int32_t *w, size_t n,
                           int32_t *counts) {
  for (size_t i = 0; i < n; i++) {
    int32_t t = w[i];
    if (in_vocab(t, vocab) && !counts[t]++) z[t] -= alpha;
  }
  for (size_t i = 0; i < n; i++)
    if (in_vocab(w[i], vocab)) counts[w[i]] = 0;
}

/* Frequency: z -= beta * (occurrences in the window); the second pass applies each distinct
 * token once and clears its count. */
static void apply_frequency(float *z, int vocab, float beta, const int32_t *w, size_t n,
                            int32_t *counts) {
  for (size_t i = 0; i < n; i++)
    if (in_vocab(w[i], vocab)) counts[w[i]]++;
  for (size_t i = 0; i < n; i++) {
    int32_t t = w[i];
    if (!in_vocab(t, vocab) || !counts[t]) continue;
    z[t] -= beta * (float)counts[t];
    counts[t] = 0;
  }
}

void ci_logits_apply_penalties(float *z, int vocab, const ci_penalties *pen, const int32_t *history,
                               size_t n_history, int32_t *counts) {
  size_t n;
  const int32_t *w;
  if (pen->repetition != 1.0f) {
    w = window_of(history, n_history, pen->repetition_context, &n);
    apply_repetition(z, vocab, pen->repetition, w, n, counts);
  }
  if (pen->presence != 0.0f) {
    w = window_of(history, n_history, pen->presence_context, &n);
    apply_presence(z, vocab, pen->presence, w, n, counts);
  }
  if (pen->frequency != 0.0f) {
    w = window_of(history, n_history, pen->frequency_context, &n);
    apply_frequency(z, vocab, pen->frequency, w, n, counts);
  }
}
