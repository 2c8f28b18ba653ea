/* AVX-512 vector loops over bf16 rows (KV cache rows): 16 lanes per step, masked tails; and the
 * gated activations of activation.h on 16 lanes.
 * Uses AVX-512F/BW only (no AVX512-BF16: its conversion flushes denormals, which would break
 * bit-exactness with ci_f32_to_bf16). */
#include "backend/cpu/activation.h"
#include "backend/cpu/kernels_impl.h"

#include <immintrin.h>

/* Widens 16 bf16 values to f32. */
static inline __m512 bf16x16_to_f32(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Mask of the first n (< 16) lanes. */
static inline __mmask16 first_lanes(int64_t n) {
  return (__mmask16)((1u << n) - 1);
}

/* sum_i x[i] * bf16(a[i]), two accumulators to hide the FMA latency. */
static float dot_bf16_avx512(const float *x, const uint16_t *a, int64_t n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i),
                           bf16x16_to_f32(_mm256_loadu_si256((const __m256i *)(a + i))), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16),
                           bf16x16_to_f32(_mm256_loadu_si256((const __m256i *)(a + i + 16))), acc1);
  }
  for (; i < n; i += 16) {
    __mmask16 mask = n - i >= 16 ? 0xffff : first_lanes(n - i);
    acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, x + i),
                           bf16x16_to_f32(_mm256_maskz_loadu_epi16(mask, a + i)), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

/* y[i] += alpha * bf16(a[i]). */
static void axpy_bf16_avx512(float *y, float alpha, const uint16_t *a, int64_t n) {
  __m512 alpha_v = _mm512_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 av = bf16x16_to_f32(_mm256_loadu_si256((const __m256i *)(a + i)));
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(alpha_v, av, _mm512_loadu_ps(y + i)));
  }
  if (i < n) {
    __mmask16 mask = first_lanes(n - i);
    __m512 av = bf16x16_to_f32(_mm256_maskz_loadu_epi16(mask, a + i));
    _mm512_mask_storeu_ps(y + i, mask,
                          _mm512_fmadd_ps(alpha_v, av, _mm512_maskz_loadu_ps(mask, y + i)));
  }
}

/* 16 f32 bit patterns to bf16 (in the low half of each lane), exactly as ci_f32_to_bf16:
 * round to nearest even by adding 0x7fff + lsb, NaN kept quiet as (u >> 16) | 0x40. */
static inline __m512i round_to_bf16(__m512i u) {
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  __m512i quiet_nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  __mmask16 is_nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                             _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_blend_epi32(is_nan, rounded, quiet_nan);
}

/* dst[i] = bf16(src[i]). */
static void f32_to_bf16_avx512(uint16_t *dst, const float *src, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512i h = round_to_bf16(_mm512_castps_si512(_mm512_loadu_ps(src + i)));
    _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtepi32_epi16(h));
  }
  if (i < n) {
    __mmask16 mask = first_lanes(n - i);
    __m512i h = round_to_bf16(_mm512_castps_si512(_mm512_maskz_loadu_ps(mask, src + i)));
    _mm512_mask_cvtepi32_storeu_epi16(dst + i, mask, h);
  }
}

/* sum_i x[i] * a[i], two accumulators. */
static float dot_f32_avx512(const float *x, const float *a, int64_t n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(a + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(a + i + 16), acc1);
  }
  for (; i < n; i += 16) {
    __mmask16 mask = n - i >= 16 ? 0xffff : first_lanes(n - i);
    acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, x + i), _mm512_maskz_loadu_ps(mask, a + i),
                           acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

static void axpy_f32_avx512(float *y, float alpha, const float *a, int64_t n) {
  __m512 alpha_v = _mm512_set1_ps(alpha);
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 mask = n - i >= 16 ? 0xffff : first_lanes(n - i);
    _mm512_mask_storeu_ps(y + i, mask,
                          _mm512_fmadd_ps(alpha_v, _mm512_maskz_loadu_ps(mask, a + i),
                                          _mm512_maskz_loadu_ps(mask, y + i)));
  }
}

static void bf16_to_f32_avx512(float *dst, const uint16_t *a, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 mask = n - i >= 16 ? 0xffff : first_lanes(n - i);
    _mm512_mask_storeu_ps(dst + i, mask, bf16x16_to_f32(_mm256_maskz_loadu_epi16(mask, a + i)));
  }
}

/* 1 + exp(x) on 16 lanes, operation for operation as ci_one_plus_exp (activation.h). */
static inline __m512 one_plus_exp_mm512(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(CI_EXP_MIN)), _mm512_set1_ps(CI_EXP_MAX));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(CI_EXP_LOG2E)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-CI_EXP_LN2_HI), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-CI_EXP_LN2_LO), r);
  __m512 p = _mm512_set1_ps(CI_EXP_P0);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(CI_EXP_P1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(CI_EXP_P2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(CI_EXP_P3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(CI_EXP_P4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(CI_EXP_P5));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
  p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
  const __m512i bits =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_fmadd_ps(p, _mm512_castsi512_ps(bits), _mm512_set1_ps(1.0f));
}

static inline __m512 silu_mul_mm512(__m512 g, __m512 up) {
  return _mm512_mul_ps(
      _mm512_div_ps(g, one_plus_exp_mm512(_mm512_castsi512_ps(_mm512_xor_si512(
                           _mm512_castps_si512(g), _mm512_set1_epi32(INT32_MIN))))),
      up);
}

static inline __m512 gelu_tanh_mul_mm512(__m512 g, __m512 up) {
  const __m512 inner =
      _mm512_fmadd_ps(_mm512_set1_ps(CI_GELU_A), _mm512_mul_ps(_mm512_mul_ps(g, g), g), g);
  const __m512 u = _mm512_mul_ps(_mm512_set1_ps(CI_GELU_C), inner);
  const __m512 den = one_plus_exp_mm512(_mm512_mul_ps(_mm512_set1_ps(-2.0f), u));
  return _mm512_mul_ps(_mm512_div_ps(g, den), up);
}

/* g[i] = silu(g[i]) * up[i], the tail masked. */
static void silu_mul_avx512(float *g, const float *up, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = n - i >= 16 ? 0xffff : first_lanes(n - i);
    _mm512_mask_storeu_ps(
        g + i, mask,
        silu_mul_mm512(_mm512_maskz_loadu_ps(mask, g + i), _mm512_maskz_loadu_ps(mask, up + i)));
  }
}

/* g[i] = gelu_tanh(g[i]) * up[i], the tail masked. */
static void gelu_tanh_mul_avx512(float *g, const float *up, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = n - i >= 16 ? 0xffff : first_lanes(n - i);
    _mm512_mask_storeu_ps(g + i, mask,
                          gelu_tanh_mul_mm512(_mm512_maskz_loadu_ps(mask, g + i),
                                              _mm512_maskz_loadu_ps(mask, up + i)));
  }
}

const ci_cpu_vec_kernels *ci_vec_kernels_avx512(void) {
  static const ci_cpu_vec_kernels kernels = {
      dot_bf16_avx512, axpy_bf16_avx512,   f32_to_bf16_avx512, dot_f32_avx512,
      axpy_f32_avx512, bf16_to_f32_avx512, silu_mul_avx512,    gelu_tanh_mul_avx512};
  return &kernels;
}
