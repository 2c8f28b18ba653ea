/* A fast e^x for x <= 0 in f32 (relative error < 3e-7), written so that gcc vectorizes loops
 * over it at -O2: a softmax sum over a 262144-token vocabulary costs about a third of the libm
 * loop. x <= -87, -inf and NaN give 0 (positive x is taken as -|x|). Shared by the sampler and
 * the CPU backend's row picks. */
#ifndef CI_BASE_FAST_EXP_H
#define CI_BASE_FAST_EXP_H

#include <stdint.h>
#include <string.h>

static inline float ci_exp_nonpositive(float x) {
  /* Clamp |x| to 87 and remember whether it was below, in integer arithmetic on the bits:
   * float compares would keep gcc from vectorizing (they may trap), integer ones do not. */
  uint32_t x_bits;
  memcpy(&x_bits, &x, sizeof x_bits);
  const uint32_t magnitude = x_bits & 0x7FFFFFFFu, magnitude_87 = 0x42AE0000u; /* 87.0f */
  const uint32_t keep = magnitude < magnitude_87 ? 0xFFFFFFFFu : 0u;
  const uint32_t clamped_bits = (magnitude < magnitude_87 ? magnitude : magnitude_87) | 0x80000000u;
  float clamped;
  memcpy(&clamped, &clamped_bits, sizeof clamped);
  /* e^c = 2^n e^r with r = c - n ln2 (ln2 split in two, Cody-Waite), a degree-6 polynomial. */
  const float shifter = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
  const float n = (clamped * 1.44269504088896341f + shifter) - shifter;
  const float r = (clamped - n * 0.693145751953125f) - n * 1.428606765330187045e-06f;
  float p = 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const uint32_t scale_bits = (uint32_t)((int32_t)n + 127) << 23;
  float scale;
  memcpy(&scale, &scale_bits, sizeof scale);
  const float value = p * scale;
  uint32_t value_bits;
  memcpy(&value_bits, &value, sizeof value_bits);
  value_bits &= keep;
  float out;
  memcpy(&out, &value_bits, sizeof out);
  return out;
}

#endif
