/* Decoding weights into AVX-512 registers, shared by the AVX-512 kernel files (matmul_avx512.c,
 * matmul_bf16_avx512.c): scale and element loads of every weight format, code unpacking, a 16x16
 * transpose, and the decode of a 16-row x 16-column block of W to f32. Include only from files
 * compiled for AVX-512. */
#ifndef CI_BACKEND_CPU_AVX512_DECODE_H
#define CI_BACKEND_CPU_AVX512_DECODE_H

#include "backend/cpu/kernels_impl.h"
#include "backend/cpu/scale_load.h"

#include <immintrin.h>

#define CI_AVX512_INLINE static inline __attribute__((always_inline))

/* Widens 16 bf16 values to f32. */
CI_AVX512_INLINE __m512 bf16x16_to_f32(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Elements [i, i+16) of a float-format array as f32; lanes outside `mask` read as 0. */
CI_AVX512_INLINE __m512 load_float16(ci_dtype dt, const void *base, int64_t i, __mmask16 mask) {
  switch (dt) {
  case CI_F16:
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, (const uint16_t *)base + i));
  case CI_BF16:
    return bf16x16_to_f32(_mm256_maskz_loadu_epi16(mask, (const uint16_t *)base + i));
  default:
    return _mm512_maskz_loadu_ps(mask, (const float *)base + i);
  }
}

/* 16 8-bit codes as f32. */
CI_AVX512_INLINE __m512 q8_codes(const uint8_t *p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

/* 16 consecutive 4-bit codes (8 bytes) as f32: each lane picks its word, shifts its nibble
 * down and masks it. */
CI_AVX512_INLINE __m512 q4_codes(const uint8_t *p) {
  const __m512i word_of_lane = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __m512i shift_of_lane =
      _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
  __m512i words = _mm512_castsi128_si512(_mm_loadl_epi64((const __m128i *)p));
  __m512i codes = _mm512_srlv_epi32(_mm512_permutexvar_epi32(word_of_lane, words), shift_of_lane);
  return _mm512_cvtepi32_ps(_mm512_and_si512(codes, _mm512_set1_epi32(15)));
}

/* Transposes a 16x16 block held as 16 row vectors, in place. */
CI_AVX512_INLINE void transpose16x16(__m512 v[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]);
  }
  for (int i = 0; i < 4; i++) {
    v[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    v[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    v[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    v[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  /* v[4a+b] now holds, in 128-bit lane l, column 4l+b of rows 4a..4a+3. */
  for (int a = 0; a < 2; a++)
    for (int b = 0; b < 4; b++) {
      t[8 * a + b] = _mm512_shuffle_f32x4(v[8 * a + b], v[8 * a + 4 + b], 0x88);
      t[8 * a + 4 + b] = _mm512_shuffle_f32x4(v[8 * a + b], v[8 * a + 4 + b], 0xdd);
    }
  /* t[8a+b]: lanes (l0 rows 8a.., l2 rows 8a.., l0 rows 8a+4.., l2 rows 8a+4..) of column
   * b, ... ; combine the two row halves. */
  for (int b = 0; b < 4; b++) {
    v[b] = _mm512_shuffle_f32x4(t[b], t[8 + b], 0x88);
    v[8 + b] = _mm512_shuffle_f32x4(t[b], t[8 + b], 0xdd);
    v[4 + b] = _mm512_shuffle_f32x4(t[4 + b], t[12 + b], 0x88);
    v[12 + b] = _mm512_shuffle_f32x4(t[4 + b], t[12 + b], 0xdd);
  }
}

/* Decodes W[rows, c:c+16) of 16 rows (row indices clamped to < n) into 16 vectors, columns in
 * natural order. Columns >= k read 0. */
CI_AVX512_INLINE void decode_16x16(const ci_matmul_job *job, ci_weight_format f, int64_t row,
                                   int64_t c, __m512 v[16]) {
  ci_dtype dt = ci_weight_format_dtype(f), sdt = ci_weight_format_scale_dtype(f);
  const int64_t k = job->k;
  for (int j = 0; j < 16; j++) {
    int64_t r = row + j < job->n ? row + j : job->n - 1;
    if (!ci_dtype_is_affine(dt)) {
      __mmask16 mask = k - c >= 16 ? 0xffff : (__mmask16)((1u << (k - c)) - 1);
      v[j] = load_float16(dt, job->w, r * k + c, mask);
      continue;
    }
    int group_shift = __builtin_ctz((unsigned)job->group);
    int64_t n_groups = k >> group_shift, g = c >> group_shift;
    __m512 scale = _mm512_set1_ps(load_scale(sdt, job->scales, r * n_groups + g));
    __m512 bias = _mm512_set1_ps(load_scale(sdt, job->biases, r * n_groups + g));
    const uint8_t *codes = (const uint8_t *)job->w + r * (k * (dt == CI_Q8 ? 8 : 4) / 8);
    __m512 q = dt == CI_Q8 ? q8_codes(codes + c) : q4_codes(codes + c / 2);
    v[j] = _mm512_fmadd_ps(q, scale, bias);
  }
}

#endif
