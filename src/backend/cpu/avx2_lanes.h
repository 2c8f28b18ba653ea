/* Small AVX2 helpers shared by the AVX2 kernel files (matmul_avx2.c, matmul_x16_avx2.c,
 * vec_avx2.c, kv_kernels_avx2.c): widening bf16 to f32, loading 8 elements of a float-format
 * array (f32, f16 or bf16: weights, scales, biases) and the horizontal sum of 8 lanes. Include
 * only from files compiled for AVX2/FMA/F16C. */
#ifndef CI_BACKEND_CPU_AVX2_LANES_H
#define CI_BACKEND_CPU_AVX2_LANES_H

#include "backend/cpu/activation.h"
#include "backend/cpu/kernels_impl.h"

#include <immintrin.h>

#define CI_AVX2_INLINE static inline __attribute__((always_inline))

/* Widens 8 bf16 values to f32. */
CI_AVX2_INLINE __m256 bf16x8_to_f32(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Elements [i, i+8) of a float-format array of dtype dt as f32. */
CI_AVX2_INLINE __m256 load_float8(ci_dtype dt, const void *base, int64_t i) {
  switch (dt) {
  case CI_F16:
    return _mm256_cvtph_ps(
        _mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)base + i)));
  case CI_BF16:
    return bf16x8_to_f32(
        _mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)base + i)));
  default:
    return _mm256_loadu_ps((const float *)base + i);
  }
}

/* Sum of the 8 lanes: the halves added, then pairs, then the last two. */
CI_AVX2_INLINE float sum_lanes(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/* The core of activation.h's exp on 8 lanes, for x already clamped: n = round(x log2(e)),
 * r = x - n ln2 (ln2 in two parts), and the Horner polynomial P0 .. P5 in r, each step an
 * explicit FMA in activation.h's order. Callers finish e^r = p r^2 + r + 1 and scale by 2^n. */
CI_AVX2_INLINE __m256 exp_poly_mm256(__m256 x, __m256 *n_out, __m256 *r_out) {
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(CI_EXP_LOG2E)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-CI_EXP_LN2_HI), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-CI_EXP_LN2_LO), r);
  __m256 p = _mm256_set1_ps(CI_EXP_P0);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(CI_EXP_P1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(CI_EXP_P2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(CI_EXP_P3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(CI_EXP_P4));
  *n_out = n;
  *r_out = r;
  return _mm256_fmadd_ps(p, r, _mm256_set1_ps(CI_EXP_P5));
}

/* 2^n for integral n in [-126, 127] as f32 exponent bits. */
CI_AVX2_INLINE __m256 pow2_mm256(__m256 n) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}

#endif
