/* Decoding weights into AVX-512 registers, shared by the AVX-512 kernel files (matmul_avx512.c,
 * matmul_bf16_avx512.c, matmul_amx.c): scale and element loads of every weight format, code
 * unpacking, a 16x16 transpose, the decode of a 16-row x 16-column block of W to f32, and the
 * bf16 column-pair panels of the bf16 panel kernels. Include only from files compiled for
 * AVX-512 (with AVX512_BF16). */
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

/* Rows per bf16 pair panel (ci_pack_pair_panel). */
enum { CI_PAIR_PANEL_ROWS = 32 };

/* Pairs (v[2t], v[2t+1]) of 16 f32 row-vectors rounded to bf16, as 16 words each: low half the
 * even column. */
CI_AVX512_INLINE __m512i bf16_pair(__m512 even, __m512 odd) {
  const __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(even));
  const __m512i hi = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(odd));
  return _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
}

/* Decodes W[row:row+32, c0:c0+kc) into panel[ceil(kc/2)][32] bf16 column pairs (columns past
 * k are 0; rows past n repeat the last, as decode_16x16 does): word p * 32 + r holds columns
 * c0 + 2p (low half) and c0 + 2p + 1 of row row + r. bf16 weights: a pair of columns is one
 * 32-bit word of the row, so whole 32-column blocks are a 16 x 16 transpose of words, with no
 * round trip through f32. */
CI_AVX512_INLINE void ci_pack_pair_panel(const ci_matmul_job *job, ci_weight_format f, int64_t row,
                                         int64_t c0, int64_t kc, uint32_t *panel) {
  enum { NR = CI_PAIR_PANEL_ROWS };
  int64_t c = 0;
  if (f == CI_WF_BF16) {
    const uint16_t *w = (const uint16_t *)job->w;
    for (; c + 32 <= kc; c += 32)
      for (int half = 0; half < 2; half++) {
        __m512 v[16];
        for (int j = 0; j < 16; j++) {
          const int64_t r = row + 16 * half + j < job->n ? row + 16 * half + j : job->n - 1;
          v[j] = _mm512_castsi512_ps(_mm512_loadu_si512(w + r * job->k + c0 + c));
          /* the next panel's same columns into L2: they are packed after this panel's tiles */
          _mm_prefetch((const char *)(w + (r + NR) * job->k + c0 + c), _MM_HINT_T1);
        }
        transpose16x16(v); /* v[t]: word t (columns c0 + c + 2t, + 1) of the 16 rows */
        for (int t = 0; t < 16; t++)
          _mm512_store_si512(panel + (c / 2 + t) * NR + 16 * half, _mm512_castps_si512(v[t]));
      }
  }
  for (; c < kc; c += 16)
    for (int half = 0; half < 2; half++) {
      __m512 v[16];
      decode_16x16(job, f, row + 16 * half, c0 + c, v);
      transpose16x16(v); /* v[t]: column c0+c+t of the 16 rows */
      for (int t = 0; t < 8; t++)
        _mm512_store_si512(panel + (c / 2 + t) * NR + 16 * half, bf16_pair(v[2 * t], v[2 * t + 1]));
    }
}

#endif
