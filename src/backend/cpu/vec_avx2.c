/* AVX2 vector loops over bf16 rows (KV cache rows): 8 lanes per step, scalar tails; and the
 * gated activations of activation.h on 8 lanes. */
#include "backend/cpu/activation.h"
#include "backend/cpu/avx2_lanes.h"
#include "backend/cpu/kernels_impl.h"

#include <immintrin.h>

/* sum_i x[i] * bf16(a[i]), two accumulators to hide the FMA latency. */
static float dot_bf16_avx2(const float *x, const uint16_t *a, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i),
                           bf16x8_to_f32(_mm_loadu_si128((const __m128i *)(a + i))), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8),
                           bf16x8_to_f32(_mm_loadu_si128((const __m128i *)(a + i + 8))), acc1);
  }
  for (; i + 8 <= n; i += 8)
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i),
                           bf16x8_to_f32(_mm_loadu_si128((const __m128i *)(a + i))), acc0);
  float sum = sum_lanes(_mm256_add_ps(acc0, acc1));
  for (; i < n; i++) sum += x[i] * ci_bf16_to_f32(a[i]);
  return sum;
}

/* y[i] += alpha * bf16(a[i]). */
static void axpy_bf16_avx2(float *y, float alpha, const uint16_t *a, int64_t n) {
  __m256 alpha_v = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 av = bf16x8_to_f32(_mm_loadu_si128((const __m128i *)(a + i)));
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(alpha_v, av, _mm256_loadu_ps(y + i)));
  }
  for (; i < n; i++) y[i] = __builtin_fmaf(alpha, ci_bf16_to_f32(a[i]), y[i]);
}

/* 8 f32 bit patterns to bf16 (in the low half of each lane), exactly as ci_f32_to_bf16:
 * round to nearest even by adding 0x7fff + lsb, NaN kept quiet as (u >> 16) | 0x40. */
static inline __m256i round_to_bf16(__m256i u) {
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  /* |u| <= 0x7fffffff, so a signed compare is exact. */
  __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                      _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
}

/* dst[i] = bf16(src[i]). */
static void f32_to_bf16_avx2(uint16_t *dst, const float *src, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i h = round_to_bf16(_mm256_castps_si256(_mm256_loadu_ps(src + i)));
    /* Lanes hold values <= 0xffff, so the unsigned-saturating pack is exact. */
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08);
    _mm_storeu_si128((__m128i *)(dst + i), _mm256_castsi256_si128(packed));
  }
  for (; i < n; i++) dst[i] = ci_f32_to_bf16(src[i]);
}

/* sum_i x[i] * a[i] (8 lanes, scalar tail). */
static float dot_f32_avx2(const float *x, const float *a, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(a + i), acc);
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  float sum = _mm_cvtss_f32(lo);
  for (; i < n; i++) sum += x[i] * a[i];
  return sum;
}

static void axpy_f32_avx2(float *y, float alpha, const float *a, int64_t n) {
  __m256 alpha_v = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i,
                     _mm256_fmadd_ps(alpha_v, _mm256_loadu_ps(a + i), _mm256_loadu_ps(y + i)));
  for (; i < n; i++) y[i] += alpha * a[i];
}

static void bf16_to_f32_avx2(float *dst, const uint16_t *a, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(a + i)));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
  }
  for (; i < n; i++) dst[i] = ci_bf16_to_f32(a[i]);
}

/* 1 + exp(x) on 8 lanes, operation for operation as ci_one_plus_exp (activation.h). */
static inline __m256 one_plus_exp_mm256(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(CI_EXP_MIN)), _mm256_set1_ps(CI_EXP_MAX));
  __m256 n, r;
  __m256 p = exp_poly_mm256(x, &n, &r);
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
  p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
  return _mm256_fmadd_ps(p, pow2_mm256(n), _mm256_set1_ps(1.0f));
}

static inline __m256 silu_mul_mm256(__m256 g, __m256 up) {
  return _mm256_mul_ps(
      _mm256_div_ps(g, one_plus_exp_mm256(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f)))), up);
}

static inline __m256 gelu_tanh_mul_mm256(__m256 g, __m256 up) {
  const __m256 inner =
      _mm256_fmadd_ps(_mm256_set1_ps(CI_GELU_A), _mm256_mul_ps(_mm256_mul_ps(g, g), g), g);
  const __m256 u = _mm256_mul_ps(_mm256_set1_ps(CI_GELU_C), inner);
  const __m256 den = one_plus_exp_mm256(_mm256_mul_ps(_mm256_set1_ps(-2.0f), u));
  return _mm256_mul_ps(_mm256_div_ps(g, den), up);
}

/* g[i] = silu(g[i]) * up[i]; the tail goes through the same lanes. */
static void silu_mul_avx2(float *g, const float *up, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(g + i, silu_mul_mm256(_mm256_loadu_ps(g + i), _mm256_loadu_ps(up + i)));
  if (i < n) {
    float gt[8] = {0}, ut[8] = {0};
    for (int64_t j = i; j < n; j++) {
      gt[j - i] = g[j];
      ut[j - i] = up[j];
    }
    _mm256_storeu_ps(gt, silu_mul_mm256(_mm256_loadu_ps(gt), _mm256_loadu_ps(ut)));
    for (int64_t j = i; j < n; j++) g[j] = gt[j - i];
  }
}

/* g[i] = gelu_tanh(g[i]) * up[i]; the tail goes through the same lanes. */
static void gelu_tanh_mul_avx2(float *g, const float *up, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(g + i, gelu_tanh_mul_mm256(_mm256_loadu_ps(g + i), _mm256_loadu_ps(up + i)));
  if (i < n) {
    float gt[8] = {0}, ut[8] = {0};
    for (int64_t j = i; j < n; j++) {
      gt[j - i] = g[j];
      ut[j - i] = up[j];
    }
    _mm256_storeu_ps(gt, gelu_tanh_mul_mm256(_mm256_loadu_ps(gt), _mm256_loadu_ps(ut)));
    for (int64_t j = i; j < n; j++) g[j] = gt[j - i];
  }
}

const ci_cpu_vec_kernels *ci_vec_kernels_avx2(void) {
  static const ci_cpu_vec_kernels kernels = {dot_bf16_avx2, axpy_bf16_avx2,    f32_to_bf16_avx2,
                                             dot_f32_avx2,  axpy_f32_avx2,     bf16_to_f32_avx2,
                                             silu_mul_avx2, gelu_tanh_mul_avx2};
  return &kernels;
}
