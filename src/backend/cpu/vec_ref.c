/* Reference vector loops over bf16 rows (KV cache rows) and the gated activations in plain C:
 * the definition the SIMD versions are tested against. */
#include "backend/cpu/activation.h"
#include "backend/cpu/kernels_impl.h"

/* sum_i x[i] * bf16(a[i]), accumulated in order. */
static float dot_bf16_ref(const float *x, const uint16_t *a, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; i++) sum += x[i] * ci_bf16_to_f32(a[i]);
  return sum;
}

/* y[i] += alpha * bf16(a[i]). */
static void axpy_bf16_ref(float *y, float alpha, const uint16_t *a, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] += alpha * ci_bf16_to_f32(a[i]);
}

/* dst[i] = bf16(src[i]) with round-to-nearest-even; NaN stays NaN. */
static void f32_to_bf16_ref(uint16_t *dst, const float *src, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = ci_f32_to_bf16(src[i]);
}

/* sum_i x[i] * a[i], accumulated in order. */
static float dot_f32_ref(const float *x, const float *a, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; i++) sum += x[i] * a[i];
  return sum;
}

static void axpy_f32_ref(float *y, float alpha, const float *a, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] += alpha * a[i];
}

static void bf16_to_f32_ref(float *dst, const uint16_t *a, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = ci_bf16_to_f32(a[i]);
}

static void silu_mul_ref(float *g, const float *up, int64_t n) {
  for (int64_t i = 0; i < n; i++) g[i] = ci_silu_mul_one(g[i], up[i]);
}

static void gelu_tanh_mul_ref(float *g, const float *up, int64_t n) {
  for (int64_t i = 0; i < n; i++) g[i] = ci_gelu_tanh_mul_one(g[i], up[i]);
}

const ci_cpu_vec_kernels *ci_vec_kernels_ref(void) {
  static const ci_cpu_vec_kernels kernels = {dot_bf16_ref, axpy_bf16_ref,    f32_to_bf16_ref,
                                             dot_f32_ref,  axpy_f32_ref,     bf16_to_f32_ref,
                                             silu_mul_ref, gelu_tanh_mul_ref};
  return &kernels;
}

const ci_cpu_vec_kernels *ci_cpu_vec_kernels_get(ci_isa isa) {
  switch (isa) {
  case CI_ISA_AVX2:
    return ci_vec_kernels_avx2();
  case CI_ISA_AVX512:
    return ci_vec_kernels_avx512();
  default:
    return ci_vec_kernels_ref();
  }
}
