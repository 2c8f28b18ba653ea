/* Greedy selection: the highest logit wins (ties go to the lowest id). Temperature-0 decoding
 * and benchmarks use it; the full sampler builds on the same logits rows. */
#ifndef CI_SAMPLE_GREEDY_H
#define CI_SAMPLE_GREEDY_H

/* Index of the largest of n logits (n >= 1); NaNs never win. */
int ci_argmax(const float *logits, int n);

#endif
