/* The gated activations of the MLP (SiLU and GELU-tanh times the up projection) on one
 * element, in plain C: the definition that the AVX2 and AVX-512 loops (vec_avx2.c,
 * vec_avx512.c) follow operation for operation, so that every ISA gives the same bits and an
 * element's result does not depend on where a vector loop's tail falls.
 *
 * exp is a Cody-Waite range reduction with a degree-6 polynomial (the Cephes expf scheme, about
 * 1 ulp; inputs clamped to [-87.3, 88.3], the range where 2^n is a normal float). Both
 * activations are x * sigmoid(k(x)) = x / (1 + exp(-k(x))): SiLU with k(x) = x, GELU-tanh with
 * k(x) = 2 * sqrt(2/pi) * (x + 0.044715 x^3), since 0.5 (1 + tanh(u)) = sigmoid(2u). */
#ifndef CI_BACKEND_CPU_ACTIVATION_H
#define CI_BACKEND_CPU_ACTIVATION_H

#include <math.h>

#define CI_EXP_MIN (-87.3f)
#define CI_EXP_MAX 88.3f
#define CI_EXP_LOG2E 1.44269504088896341f
#define CI_EXP_LN2_HI 0.693359375f
#define CI_EXP_LN2_LO (-2.12194440e-4f)
#define CI_EXP_P0 1.9875691500e-4f
#define CI_EXP_P1 1.3981999507e-3f
#define CI_EXP_P2 8.3334519073e-3f
#define CI_EXP_P3 4.1665795894e-2f
#define CI_EXP_P4 1.6666665459e-1f
#define CI_EXP_P5 5.0000001201e-1f
#define CI_GELU_C 0.7978845608028654f /* sqrt(2/pi) */
#define CI_GELU_A 0.044715f

/* 1 + exp(x), exp clamped to the normal range. Every product that meets a sum is an explicit
 * fma, so that compilers that contract a * b + c (gcc's default outside ISO mode) cannot make
 * one ISA's loop differ from another's. */
static inline float ci_one_plus_exp(float x) {
  x = fminf(fmaxf(x, CI_EXP_MIN), CI_EXP_MAX);
  const float n = rintf(x * CI_EXP_LOG2E);
  float r = fmaf(n, -CI_EXP_LN2_HI, x);
  r = fmaf(n, -CI_EXP_LN2_LO, r);
  float p = CI_EXP_P0;
  p = fmaf(p, r, CI_EXP_P1);
  p = fmaf(p, r, CI_EXP_P2);
  p = fmaf(p, r, CI_EXP_P3);
  p = fmaf(p, r, CI_EXP_P4);
  p = fmaf(p, r, CI_EXP_P5);
  p = fmaf(p, r * r, r);
  p = p + 1.0f;
  union {
    unsigned u;
    float f;
  } scale = {.u = (unsigned)((int)n + 127) << 23};
  return fmaf(p, scale.f, 1.0f);
}

/* silu(g) * up */
static inline float ci_silu_mul_one(float g, float up) {
  return g / ci_one_plus_exp(-g) * up;
}

/* gelu_tanh(g) * up */
static inline float ci_gelu_tanh_mul_one(float g, float up) {
  const float inner = fmaf(CI_GELU_A, g * g * g, g);
  const float u = CI_GELU_C * inner;
  return g / ci_one_plus_exp(-2.0f * u) * up;
}

#endif
