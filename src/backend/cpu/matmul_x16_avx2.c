/* AVX2 row kernels of the affine formats in fast precision, for CPUs without AVX-512 VNNI (Zen 2
 * and 3, Intel before Ice Lake): x as one int16 per element and group (x16, see
 * ci_matmul_kernels.quantize_x16 in kernels_impl.h), the codes widened to int16, and the
 * code-times-x sums of a group exact int32 dot products (vpmaddwd, two products per lane); per
 * group and weight row one conversion and one FMA with s_g * u_g remain, and the biases meet the
 * exact f32 group sums of x at the end. The values multiplied are the 16-bit grid of fast precision
 * that the f32 row kernels are given without this file (round_groups_int8 in matmul.c), so fast
 * precision keeps its meaning; the sums are exact integers where the f32 kernels round each FMA,
 * and a 32-column step costs four vpmaddwd (128-bit) where the f32 kernels widen, convert and
 * multiply every code. The quantizer writing x16 lives here too. */
#include "backend/cpu/avx2_lanes.h"
#include "backend/cpu/kernels_impl.h"
#include "backend/cpu/scale_load.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

enum {
  VW = 8,      /* int32 lanes per vector */
  X_BLOCK = 2, /* x rows per walk of a weight row: its codes decoded once for both */
  /* How far ahead (bytes) each weight row's code stream is prefetched into L1. The rows are
   * walked one at a time, so each thread reads one sequential stream. 1B q4 decode on 2 AVX2
   * EPYC threads, alternating pairs against 4 KiB: 1 KiB -2.4%, 16 KiB -2.6% (q8 -2.3%). Two
   * FMA chains for the groups' totals (even and odd groups) instead of one: -1.5%. */
  PREFETCH_BYTES = 4096,
};

/* 32 columns of one weight row against xb x rows: acc[i] += the int32 lane sums of code * x16.
 * 8-bit codes: 32 bytes in column order; 4-bit: 16 bytes, column 2j in the low nibble of byte j,
 * 2j + 1 in the high one, x16 holding the 16 even columns before the 16 odd ones. In 128-bit
 * halves: on a Zen 1 EPYC the 256-bit form (vpmovzxbw ymm, vpmaddwd ymm) took 6.2 (q4) and 6.5
 * (q8) cycles per 32 columns from L1 where this takes 5.5 and 5.4 (build/avx2_rates), and
 * decode ran 10% (q4) and 5% (q8)
 * slower with it. */
INLINE void step32(const uint8_t *codes, const int16_t *x16, int64_t x_stride, int bits, int xb,
                   __m128i acc[X_BLOCK]) {
  __m128i w[4]; /* the codes as int16, matching x16[0:8), [8:16), [16:24), [24:32) */
  if (bits == 8) {
    for (int h = 0; h < 4; h++)
      w[h] = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)(codes + 8 * h)));
  } else {
    for (int h = 0; h < 2; h++) {
      const __m128i bytes =
          _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)(codes + 8 * h)));
      w[h] = _mm_and_si128(bytes, _mm_set1_epi16(15));
      w[2 + h] = _mm_srli_epi16(bytes, 4);
    }
  }
  for (int i = 0; i < xb; i++) {
    const int16_t *x = x16 + i * x_stride;
    __m128i sum = acc[i];
    for (int h = 0; h < 4; h++)
      sum = _mm_add_epi32(
          sum, _mm_madd_epi16(w[h], _mm_load_si128((const __m128i *)(const void *)(x + 8 * h))));
    acc[i] = sum;
  }
}

/* out[g] = scales[first + g] * units[g] for g < count. */
INLINE void make_factors(ci_dtype sdt, const void *scales, int64_t first, const float *units,
                         int64_t count, float *out) {
  int64_t g = 0;
  for (; g + VW <= count; g += VW)
    _mm256_store_ps(out + g,
                    _mm256_mul_ps(load_float8(sdt, scales, first + g), _mm256_loadu_ps(units + g)));
  for (; g < count; g++) out[g] = load_scale(sdt, scales, first + g) * units[g];
}

/* Groups whose factors s_g * u_g are made at a time (all of a row up to 16k columns). */
enum { FACTOR_CHUNK = 512 };

/* y[i0:i0+xb, row] for one affine weight row: group by group, the exact int32 sums of code * x16
 * (|sum| <= 128 * 255 * 32512 < 2^31 per lane for groups up to 128), converted and scaled by
 * s_g * u_g into the lanes' totals, which take the bias term sum_g b_g * (group sum of x) before
 * their one horizontal sum. BITS, GROUP and XB are compile-time constants after inlining. */
INLINE void gemv_x16_row(const ci_matmul_job *job, ci_dtype sdt, int bits, int group, int64_t row,
                         int64_t i0, int xb) {
  const int64_t k = job->k, n_groups = k / group, row_bytes = k * bits / 8;
  const uint8_t *codes = (const uint8_t *)job->w + row * row_bytes;
  const int64_t x_stride = job->x16_stride;
  const int16_t *x16 = job->x16 + i0 * x_stride;
  const float *units = job->x_plane_units + i0 * n_groups;
  _Alignas(32) float factors[X_BLOCK][FACTOR_CHUNK];
  __m128 total[X_BLOCK]; /* the groups' scaled sums, 4 lanes */
  for (int i = 0; i < xb; i++) total[i] = _mm_setzero_ps();
  for (int64_t g0 = 0; g0 < n_groups; g0 += FACTOR_CHUNK) {
    const int64_t count = n_groups - g0 < FACTOR_CHUNK ? n_groups - g0 : FACTOR_CHUNK;
    for (int i = 0; i < xb; i++)
      make_factors(sdt, job->scales, row * n_groups + g0, units + i * n_groups + g0, count,
                   factors[i]);
    for (int64_t g = 0; g < count; g++) {
      __m128i acc[X_BLOCK];
      for (int i = 0; i < xb; i++) acc[i] = _mm_setzero_si128();
      for (int c = 0; c < group; c += 32) {
        const uint8_t *at = codes + c * bits / 8;
        if (c % 64 == 0) _mm_prefetch((const char *)at + PREFETCH_BYTES, _MM_HINT_T0);
        step32(at, x16 + c, x_stride, bits, xb, acc);
      }
      for (int i = 0; i < xb; i++)
        total[i] =
            _mm_fmadd_ps(_mm_cvtepi32_ps(acc[i]), _mm_broadcast_ss(&factors[i][g]), total[i]);
      codes += group * bits / 8;
      x16 += group;
    }
  }
  for (int i = 0; i < xb; i++) {
    const float *sums = job->x_group_sums + (i0 + i) * n_groups;
    __m256 lanes = _mm256_insertf128_ps(_mm256_setzero_ps(), total[i], 0);
    int64_t g = 0;
    for (; g + VW <= n_groups; g += VW)
      lanes = _mm256_fmadd_ps(load_float8(sdt, job->biases, row * n_groups + g),
                              _mm256_loadu_ps(sums + g), lanes);
    float rest = 0.0f;
    for (; g < n_groups; g++) rest += load_scale(sdt, job->biases, row * n_groups + g) * sums[g];
    job->y[(i0 + i) * job->n + row] = sum_lanes(lanes) + rest;
  }
}

/* Weight rows [row_begin, row_end), each against every x row, X_BLOCK x rows at a time. */
INLINE void gemv_x16_rows_group(const ci_matmul_job *job, ci_weight_format f, int group,
                                int64_t row_begin, int64_t row_end) {
  const ci_dtype sdt = ci_weight_format_scale_dtype(f);
  const int bits = ci_weight_format_dtype(f) == CI_Q8 ? 8 : 4;
  for (int64_t r = row_begin; r < row_end; r++) {
    int64_t i = 0;
    for (; i + X_BLOCK <= job->m; i += X_BLOCK) gemv_x16_row(job, sdt, bits, group, r, i, X_BLOCK);
    if (i < job->m) gemv_x16_row(job, sdt, bits, group, r, i, 1);
  }
}

/* One instantiation per group size (32, 64 or 128, checked by the dispatcher). */
INLINE void gemv_x16_rows(const ci_matmul_job *job, ci_weight_format f, int64_t row_begin,
                          int64_t row_end) {
  switch (job->group) {
  case 32:
    gemv_x16_rows_group(job, f, 32, row_begin, row_end);
    break;
  case 64:
    gemv_x16_rows_group(job, f, 64, row_begin, row_end);
    break;
  default:
    gemv_x16_rows_group(job, f, 128, row_begin, row_end);
    break;
  }
}

/* ==== Activation quantization ==== */

/* Eight values x * inv rounded to the nearest integer (ties to even, as rint), as int32. */
INLINE __m256i round8(__m256 x, __m256 inv) {
  return _mm256_cvtps_epi32(_mm256_mul_ps(x, inv));
}

/* Two vectors of 8 int32 as 16 int16 in order. */
INLINE __m256i pack16(__m256i a, __m256i b) {
  return _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);
}

/* One group of one x row: dst[group] = round(src * inv) in the codes' order. */
INLINE void quantize_group(const float *src, int group, int bits, __m256 inv, int16_t *dst) {
  for (int j = 0; j < group; j += 32) {
    const __m256 v0 = _mm256_loadu_ps(src + j), v1 = _mm256_loadu_ps(src + j + 8);
    const __m256 v2 = _mm256_loadu_ps(src + j + 16), v3 = _mm256_loadu_ps(src + j + 24);
    __m256i first, second;
    if (bits == 8) {
      first = pack16(round8(v0, inv), round8(v1, inv));
      second = pack16(round8(v2, inv), round8(v3, inv));
    } else { /* the 16 even columns, then the 16 odd ones */
      const __m256 e01 = _mm256_castpd_ps(
          _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(v0, v1, 0x88)), 0xD8));
      const __m256 o01 = _mm256_castpd_ps(
          _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(v0, v1, 0xDD)), 0xD8));
      const __m256 e23 = _mm256_castpd_ps(
          _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(v2, v3, 0x88)), 0xD8));
      const __m256 o23 = _mm256_castpd_ps(
          _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(v2, v3, 0xDD)), 0xD8));
      first = pack16(round8(e01, inv), round8(e23, inv));
      second = pack16(round8(o01, inv), round8(o23, inv));
    }
    _mm256_store_si256((__m256i *)(void *)(dst + j), first);
    _mm256_store_si256((__m256i *)(void *)(dst + j + 16), second);
  }
}

/* Writes each group of each x row as int16 t = round(x / u_g) in the codes' order (see
 * ci_matmul_kernels.quantize_x16), u_g = max|x_g| / 127 / 256 as round_groups_int8 in matmul.c
 * computes it (t may differ from its rint(x / u_g) by one where x / u_g lies within an f32
 * rounding of a half): units[g] = u_g, 0 for an all-zero group (t = 0), NaN for a group holding
 * Inf or NaN (t = 0), so that its outputs are NaN as the exact kernels' are. */
void ci_quantize_x16_avx2(int16_t *x16, float *units, const float *x, int64_t m, int64_t k,
                          int group, int bits, int64_t stride) {
  const int64_t n_groups = k / group;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 inf = _mm256_set1_ps(INFINITY);
  for (int64_t i = 0; i < m; i++) {
    for (int64_t g = 0; g < n_groups; g++) {
      const float *src = x + i * k + g * group;
      int16_t *dst = x16 + i * stride + g * group;
      __m256 max = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
      for (int j = 0; j < group; j += VW) {
        const __m256 a = _mm256_and_ps(_mm256_loadu_ps(src + j), abs_mask);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ)); /* Inf or NaN */
        max = _mm256_max_ps(max, a);
      }
      _Alignas(32) float lanes[VW];
      _mm256_store_ps(lanes, max);
      float m_abs = 0.0f;
      for (int j = 0; j < VW; j++) m_abs = lanes[j] > m_abs ? lanes[j] : m_abs;
      if (_mm256_movemask_ps(bad) || m_abs == 0.0f) {
        units[i * n_groups + g] = _mm256_movemask_ps(bad) ? NAN : 0.0f;
        memset(dst, 0, (size_t)group * sizeof *dst);
        continue;
      }
      const double unit = (double)m_abs / 127.0 / 256.0;
      units[i * n_groups + g] = (float)unit;
      if (m_abs < 0x1p-60f) { /* 1 / unit would overflow f32: divide in double */
        for (int j = 0; j < group; j++) {
          const int at = bits == 8 ? j : j / 32 * 32 + (j % 2) * 16 + j % 32 / 2;
          dst[at] = (int16_t)rint(src[j] / unit);
        }
        continue;
      }
      quantize_group(src, group, bits, _mm256_set1_ps((float)(1.0 / unit)), dst);
    }
  }
}

/* ==== Instantiation ==== */

#define DEFINE_X16_KERNEL(suffix, format)                                                          \
  static void gemv_x16_##suffix(const ci_matmul_job *job, int64_t row_begin, int64_t row_end,      \
                                float *scratch) {                                                  \
    (void)scratch;                                                                                 \
    gemv_x16_rows(job, format, row_begin, row_end);                                                \
  }

DEFINE_X16_KERNEL(q8_f32, CI_WF_Q8_F32)
DEFINE_X16_KERNEL(q8_f16, CI_WF_Q8_F16)
DEFINE_X16_KERNEL(q8_bf16, CI_WF_Q8_BF16)
DEFINE_X16_KERNEL(q4_f32, CI_WF_Q4_F32)
DEFINE_X16_KERNEL(q4_f16, CI_WF_Q4_F16)
DEFINE_X16_KERNEL(q4_bf16, CI_WF_Q4_BF16)

const ci_matmul_rows_fn ci_matmul_gemv_x16_avx2[CI_WF_COUNT] = {
    [CI_WF_Q8_F32] = gemv_x16_q8_f32,   [CI_WF_Q8_F16] = gemv_x16_q8_f16,
    [CI_WF_Q8_BF16] = gemv_x16_q8_bf16, [CI_WF_Q4_F32] = gemv_x16_q4_f32,
    [CI_WF_Q4_F16] = gemv_x16_q4_f16,   [CI_WF_Q4_BF16] = gemv_x16_q4_bf16,
};
