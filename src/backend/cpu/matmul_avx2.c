/* AVX2/FMA/F16C matmul kernels, the same designs as matmul_avx512.c at 8 lanes. Row kernels
 * (small m) stream 4 weight rows at a time (float formats reuse each decoded vector for 2 x
 * rows; affine formats decode 8 code words side by side, see affine_block_dot); panel kernels
 * (large m) decode 16 weight rows x 256 columns into an f32 panel and run a 6x16
 * register-tiled outer-product loop over it. Every kernel is one always-inline template
 * instantiated per weight format. */
#include "backend/cpu/avx2_lanes.h"
#include "backend/cpu/kernels_impl.h"
#include "backend/cpu/scale_load.h"

#include <immintrin.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

enum {
  VW = 8,          /* floats per vector */
  ROW_BLOCK = 4,   /* weight rows per row-kernel block */
  X_BLOCK = 2,     /* x rows per row-kernel block (16 registers: 8 accumulators) */
  GEMM_MR = 6,     /* x rows per register tile */
  GEMM_NR = 16,    /* weight rows per panel (two vectors) */
  GEMM_KC = 256,   /* columns per panel; a multiple of every group size */
  GEMM_PANELS = 4, /* panels decoded before the x tiles pass over them */
  /* How far ahead (bytes) the row kernels prefetch along each weight row's stream; rows of a
   * chunk are contiguous, so short rows prefetch into the following rows. */
  FLOAT_PREFETCH_BYTES = 4096,
  AFFINE_PREFETCH_BYTES = 8192,
};

/* ==== Loading and decoding weights ==== */

/* Elements [i, i+count) of a float-format array as f32, count < 8, the other lanes 0. */
INLINE __m256 load_float_partial(ci_dtype dt, const void *base, int64_t i, int64_t count) {
  size_t element = dt == CI_F32 ? 4 : 2;
  _Alignas(32) uint8_t copy[32] = {0};
  memcpy(copy, (const uint8_t *)base + i * element, (size_t)count * element);
  return load_float8(dt, copy, 0);
}

/* x[i, i+count), count < 8, the other lanes 0. */
INLINE __m256 load_x_partial(const float *x, int64_t count) {
  _Alignas(32) float copy[8] = {0};
  memcpy(copy, x, (size_t)count * sizeof(float));
  return _mm256_load_ps(copy);
}

/* 8 8-bit codes as f32. */
INLINE __m256 q8_codes(const uint8_t *p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* 8 consecutive 4-bit codes (one word) as f32: each lane shifts its nibble down. */
INLINE __m256 q4_codes(const uint8_t *p) {
  uint32_t word;
  memcpy(&word, p, sizeof word);
  __m256i codes = _mm256_srlv_epi32(_mm256_set1_epi32((int)word),
                                    _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
  return _mm256_cvtepi32_ps(_mm256_and_si256(codes, _mm256_set1_epi32(15)));
}

/* ==== Row kernels (small m) ==== */

/* y[i0:i0+xb, r:r+rb] for a float-format weight; rb and xb are constants after inlining. */
INLINE void gemv_float_block(const ci_matmul_job *job, ci_dtype dt, int64_t r, int rb, int64_t i0,
                             int xb) {
  const int64_t k = job->k;
  const int64_t elem_bytes = dt == CI_F32 ? 4 : 2;
  const float *x = job->x + i0 * k;
  __m256 acc[ROW_BLOCK][X_BLOCK];
  for (int j = 0; j < rb; j++)
    for (int i = 0; i < xb; i++) acc[j][i] = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + VW <= k; c += VW) {
    __m256 wv[ROW_BLOCK];
    for (int j = 0; j < rb; j++) {
      if (c % 32 == 0)
        _mm_prefetch((const char *)job->w + ((r + j) * k + c) * elem_bytes + FLOAT_PREFETCH_BYTES,
                     _MM_HINT_T0);
      wv[j] = load_float8(dt, job->w, (r + j) * k + c);
    }
    for (int i = 0; i < xb; i++) {
      __m256 xv = _mm256_loadu_ps(x + i * k + c);
      for (int j = 0; j < rb; j++) acc[j][i] = _mm256_fmadd_ps(wv[j], xv, acc[j][i]);
    }
  }
  if (c < k) {
    __m256 wv[ROW_BLOCK];
    for (int j = 0; j < rb; j++) wv[j] = load_float_partial(dt, job->w, (r + j) * k + c, k - c);
    for (int i = 0; i < xb; i++) {
      __m256 xv = load_x_partial(x + i * k + c, k - c);
      for (int j = 0; j < rb; j++) acc[j][i] = _mm256_fmadd_ps(wv[j], xv, acc[j][i]);
    }
  }
  for (int i = 0; i < xb; i++)
    for (int j = 0; j < rb; j++) job->y[(i0 + i) * job->n + r + j] = sum_lanes(acc[j][i]);
}

/* Per-lane scales of the word-lane block of `lanes` words starting at column c of `row`:
 * lane j holds columns c + E*j .. c + E*j + E-1, all in group (c + E*j) / group. A block
 * spans at most two groups (q4 with group 32). */
INLINE __m256 block_scales(const ci_matmul_job *job, ci_dtype sdt, int group_shift, int64_t row,
                           int64_t c, int codes_per_word, int lanes) {
  int64_t n_groups = job->k >> group_shift, first = row * n_groups + (c >> group_shift);
  float low = load_scale(sdt, job->scales, first);
  if (job->group >= VW * codes_per_word || lanes * codes_per_word <= job->group)
    return _mm256_set1_ps(low);
  float high = load_scale(sdt, job->scales, first + 1);
  return _mm256_setr_m128(_mm_set1_ps(low), _mm_set1_ps(high));
}

/* sum_g biases[row, g] * x_group_sums[g]: the bias half of the affine factorisation. */
INLINE float bias_dot(const ci_matmul_job *job, ci_dtype sdt, int64_t row, const float *sums) {
  int64_t n_groups = job->k / job->group, g = 0;
  __m256 acc = _mm256_setzero_ps();
  for (; g + VW <= n_groups; g += VW)
    acc = _mm256_fmadd_ps(load_float8(sdt, job->biases, row * n_groups + g),
                          _mm256_loadu_ps(sums + g), acc);
  float sum = sum_lanes(acc);
  for (; g < n_groups; g++) sum += load_scale(sdt, job->biases, row * n_groups + g) * sums[g];
  return sum;
}

/* One word-lane block of one weight row against one x row: the per-lane sums of code * x over
 * the block (not yet scaled). `lanes` words (8 except in a last, partial block) hold
 * lanes * E codes; code t of every word is isolated in place by an AND (value q * 2^(bits*t),
 * which the x order prescaled to cancel exactly) or, for the top code, by a shift. */
INLINE __m256 affine_block_dot(const uint32_t *words, const float *x, int bits, int lanes) {
  const int codes_per_word = 32 / bits;
  __m256i mask =
      _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  __m256i w = lanes == VW ? _mm256_loadu_si256((const __m256i *)words)
                          : _mm256_maskload_epi32((const int *)words, mask);
  __m256 dot = _mm256_setzero_ps(), dot_odd = _mm256_setzero_ps(); /* two latency chains */
  for (int t = 0; t < codes_per_word; t++) {
    __m256i code;
    if (t < codes_per_word - 1)
      code = _mm256_and_si256(w, _mm256_set1_epi32((int)(((1u << bits) - 1) << (bits * t))));
    else
      code = _mm256_srli_epi32(w, 32 - bits);
    __m256 q = _mm256_cvtepi32_ps(code);
    __m256 xv =
        lanes == VW ? _mm256_loadu_ps(x + lanes * t) : _mm256_maskload_ps(x + lanes * t, mask);
    if (t % 2)
      dot_odd = _mm256_fmadd_ps(q, xv, dot_odd);
    else
      dot = _mm256_fmadd_ps(q, xv, dot);
  }
  return _mm256_add_ps(dot, dot_odd);
}

/* y[i0, r:r+rb] for an affine weight and one x row, x in word-lane order (see
 * affine_block_dot): per block, each row's code-times-x lane sums are scaled by their groups'
 * scales into a vector total; the biases meet the group sums of x at the end. */
INLINE void gemv_affine_block(const ci_matmul_job *job, int bits, ci_dtype sdt, int64_t r, int rb,
                              int64_t i0) {
  const int codes_per_word = 32 / bits, group_shift = __builtin_ctz((unsigned)job->group);
  const int64_t k = job->k, words_per_row = k / codes_per_word, n_groups = k >> group_shift;
  const int64_t block = (int64_t)VW * codes_per_word;
  const float *x = job->x + i0 * k;
  __m256 total[ROW_BLOCK];
  for (int j = 0; j < rb; j++) total[j] = _mm256_setzero_ps();
  for (int64_t c = 0; c < k; c += block) {
    int lanes = k - c >= block ? VW : (int)((k - c) / codes_per_word);
    for (int j = 0; j < rb; j++) {
      const uint32_t *words =
          (const uint32_t *)job->w + (r + j) * words_per_row + c / codes_per_word;
      if (c % (2 * block) == 0)
        _mm_prefetch((const char *)words + AFFINE_PREFETCH_BYTES, _MM_HINT_T0);
      __m256 dot = lanes == VW ? affine_block_dot(words, x + c, bits, VW)
                               : affine_block_dot(words, x + c, bits, lanes);
      __m256 scales = block_scales(job, sdt, group_shift, r + j, c, codes_per_word, lanes);
      total[j] = _mm256_fmadd_ps(dot, scales, total[j]);
    }
  }
  const float *sums = job->x_group_sums + i0 * n_groups;
  for (int j = 0; j < rb; j++)
    job->y[i0 * job->n + r + j] = sum_lanes(total[j]) + bias_dot(job, sdt, r + j, sums);
}

/* One (row block, x block) of any format; dispatches on the constant format and sizes. The
 * affine kernels take one x row at a time (16 registers leave no room for more). */
INLINE void gemv_block(const ci_matmul_job *job, ci_weight_format f, int64_t r, int rb, int64_t i0,
                       int xb) {
  ci_dtype dt = ci_weight_format_dtype(f), sdt = ci_weight_format_scale_dtype(f);
  if (!ci_dtype_is_affine(dt)) {
    gemv_float_block(job, dt, r, rb, i0, xb);
    return;
  }
  for (int i = 0; i < xb; i++) gemv_affine_block(job, dt == CI_Q8 ? 8 : 4, sdt, r, rb, i0 + i);
}

/* All x rows against weight rows [r, r+rb), x rows in blocks of X_BLOCK. */
INLINE void gemv_row_block(const ci_matmul_job *job, ci_weight_format f, int64_t r, int rb) {
  int64_t i = 0;
  for (; i + X_BLOCK <= job->m; i += X_BLOCK) gemv_block(job, f, r, rb, i, X_BLOCK);
  if (i < job->m) gemv_block(job, f, r, rb, i, 1);
}

/* Row kernel template: weight rows in blocks of ROW_BLOCK, the leftover rows one by one. */
INLINE void gemv_rows(const ci_matmul_job *job, ci_weight_format f, int64_t row_begin,
                      int64_t row_end) {
  int64_t r = row_begin;
  for (; r + ROW_BLOCK <= row_end; r += ROW_BLOCK) gemv_row_block(job, f, r, ROW_BLOCK);
  for (; r < row_end; r++) gemv_row_block(job, f, r, 1);
}

/* ==== Panel kernels (large m) ==== */

/* Transposes an 8x8 block held as 8 row vectors, in place. */
INLINE void transpose8x8(__m256 v[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; i++) {
    t[2 * i] = _mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]);
  }
  for (int i = 0; i < 2; i++) {
    u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  /* u[4a+b] holds, in 128-bit lane l, column 4l+b of rows 4a..4a+3. */
  for (int b = 0; b < 4; b++) {
    v[b] = _mm256_permute2f128_ps(u[b], u[4 + b], 0x20);
    v[4 + b] = _mm256_permute2f128_ps(u[b], u[4 + b], 0x31);
  }
}

/* Decodes W[rows, c:c+8) of 8 rows (row indices clamped to < n) into 8 vectors, columns in
 * natural order. Columns >= k read 0. */
INLINE void decode_8x8(const ci_matmul_job *job, ci_weight_format f, int64_t row, int64_t c,
                       __m256 v[8]) {
  ci_dtype dt = ci_weight_format_dtype(f), sdt = ci_weight_format_scale_dtype(f);
  const int64_t k = job->k;
  for (int j = 0; j < 8; j++) {
    int64_t r = row + j < job->n ? row + j : job->n - 1;
    if (!ci_dtype_is_affine(dt)) {
      v[j] = k - c >= VW ? load_float8(dt, job->w, r * k + c)
                         : load_float_partial(dt, job->w, r * k + c, k - c);
      continue;
    }
    int group_shift = __builtin_ctz((unsigned)job->group);
    int64_t n_groups = k >> group_shift, g = c >> group_shift;
    __m256 scale = _mm256_set1_ps(load_scale(sdt, job->scales, r * n_groups + g));
    __m256 bias = _mm256_set1_ps(load_scale(sdt, job->biases, r * n_groups + g));
    const uint8_t *codes = (const uint8_t *)job->w + r * (k * (dt == CI_Q8 ? 8 : 4) / 8);
    __m256 q = dt == CI_Q8 ? q8_codes(codes + c) : q4_codes(codes + c / 2);
    v[j] = _mm256_fmadd_ps(q, scale, bias);
  }
}

/* Decodes W[row:row+16, c0:c0+kc) into panel[kc][16] (f32, column-major per 16 rows). */
INLINE void pack_panel(const ci_matmul_job *job, ci_weight_format f, int64_t row, int64_t c0,
                       int64_t kc, float *panel) {
  for (int64_t c = 0; c < kc; c += VW)
    for (int half = 0; half < 2; half++) {
      __m256 v[8];
      decode_8x8(job, f, row + 8 * half, c0 + c, v);
      transpose8x8(v);
      for (int t = 0; t < 8; t++) _mm256_store_ps(panel + (c + t) * GEMM_NR + 8 * half, v[t]);
    }
}

/* Lane mask of the first n lanes (n may exceed 8). */
INLINE __m256i first_lanes(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* y[i0:i0+rows, col:col+cols] (+)= x_panel[kc][MR] @ panel[kc][16], rows <= MR, cols <= 16.
 * Accumulates into y when `accumulate`, else overwrites. */
static void gemm_tile(int64_t kc, const float *x_panel, const float *panel, float *y, int64_t ldy,
                      int rows, int cols, int accumulate) {
  __m256 acc[GEMM_MR][2];
  for (int i = 0; i < GEMM_MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t c = 0; c < kc; c++) {
    __m256 w0 = _mm256_load_ps(panel + c * GEMM_NR);
    __m256 w1 = _mm256_load_ps(panel + c * GEMM_NR + VW);
    for (int i = 0; i < GEMM_MR; i++) {
      __m256 xv = _mm256_broadcast_ss(x_panel + c * GEMM_MR + i);
      acc[i][0] = _mm256_fmadd_ps(xv, w0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(xv, w1, acc[i][1]);
    }
  }
  if (cols == GEMM_NR) {
    for (int i = 0; i < GEMM_MR && i < rows; i++) {
      float *out = y + i * ldy;
      if (accumulate) {
        acc[i][0] = _mm256_add_ps(acc[i][0], _mm256_loadu_ps(out));
        acc[i][1] = _mm256_add_ps(acc[i][1], _mm256_loadu_ps(out + VW));
      }
      _mm256_storeu_ps(out, acc[i][0]);
      _mm256_storeu_ps(out + VW, acc[i][1]);
    }
    return;
  }
  __m256i mask0 = first_lanes(cols), mask1 = first_lanes(cols - VW);
  for (int i = 0; i < GEMM_MR && i < rows; i++) {
    float *out = y + i * ldy;
    if (accumulate) {
      acc[i][0] = _mm256_add_ps(acc[i][0], _mm256_maskload_ps(out, mask0));
      acc[i][1] = _mm256_add_ps(acc[i][1], _mm256_maskload_ps(out + VW, mask1));
    }
    _mm256_maskstore_ps(out, mask0, acc[i][0]);
    _mm256_maskstore_ps(out + VW, mask1, acc[i][1]);
  }
}

/* Panel kernel template: for each block of GEMM_KC columns, decode each 16-row panel of the
 * chunk once and multiply it by every 6-row tile of x. */
INLINE void gemm_rows(const ci_matmul_job *job, ci_weight_format f, int64_t row_begin,
                      int64_t row_end, float *panels) {
  const int64_t k = job->k, m = job->m;
  for (int64_t c0 = 0; c0 < k; c0 += GEMM_KC) {
    int64_t kc = k - c0 < GEMM_KC ? k - c0 : GEMM_KC;
    for (int64_t row0 = row_begin; row0 < row_end; row0 += GEMM_PANELS * GEMM_NR) {
      const int64_t span =
          row_end - row0 < GEMM_PANELS * GEMM_NR ? row_end - row0 : GEMM_PANELS * GEMM_NR;
      for (int64_t p = 0; p * GEMM_NR < span; p++)
        pack_panel(job, f, row0 + p * GEMM_NR, c0, kc, panels + p * GEMM_KC * GEMM_NR);
      for (int64_t i0 = 0; i0 < m; i0 += GEMM_MR) {
        const float *x_panel = job->x_packed + i0 * k + c0 * GEMM_MR;
        int rows = m - i0 < GEMM_MR ? (int)(m - i0) : GEMM_MR;
        for (int64_t p = 0; p * GEMM_NR < span; p++) {
          const int cols = span - p * GEMM_NR < GEMM_NR ? (int)(span - p * GEMM_NR) : GEMM_NR;
          gemm_tile(kc, x_panel, panels + p * GEMM_KC * GEMM_NR,
                    job->y + i0 * job->n + row0 + p * GEMM_NR, job->n, rows, cols, c0 > 0);
        }
      }
    }
  }
}

/* ==== Instantiation ==== */

#define DEFINE_FORMAT_KERNELS(suffix, format)                                                      \
  static void gemv_##suffix(const ci_matmul_job *job, int64_t row_begin, int64_t row_end,          \
                            float *scratch) {                                                      \
    gemv_rows(job, format, row_begin, row_end);                                                    \
  }                                                                                                \
  static void gemm_##suffix(const ci_matmul_job *job, int64_t row_begin, int64_t row_end,          \
                            float *scratch) {                                                      \
    gemm_rows(job, format, row_begin, row_end, scratch);                                           \
  }

DEFINE_FORMAT_KERNELS(f32, CI_WF_F32)
DEFINE_FORMAT_KERNELS(f16, CI_WF_F16)
DEFINE_FORMAT_KERNELS(bf16, CI_WF_BF16)
DEFINE_FORMAT_KERNELS(q8_f32, CI_WF_Q8_F32)
DEFINE_FORMAT_KERNELS(q8_f16, CI_WF_Q8_F16)
DEFINE_FORMAT_KERNELS(q8_bf16, CI_WF_Q8_BF16)
DEFINE_FORMAT_KERNELS(q4_f32, CI_WF_Q4_F32)
DEFINE_FORMAT_KERNELS(q4_f16, CI_WF_Q4_F16)
DEFINE_FORMAT_KERNELS(q4_bf16, CI_WF_Q4_BF16)

const ci_matmul_kernels *ci_matmul_kernels_avx2(void) {
  static const ci_matmul_kernels kernels = {
      .gemv = {gemv_f32, gemv_f16, gemv_bf16, gemv_q8_f32, gemv_q8_f16, gemv_q8_bf16, gemv_q4_f32,
               gemv_q4_f16, gemv_q4_bf16},
      .gemm = {gemm_f32, gemm_f16, gemm_bf16, gemm_q8_f32, gemm_q8_f16, gemm_q8_bf16, gemm_q4_f32,
               gemm_q4_f16, gemm_q4_bf16},
      /* The AVX-512 table's thresholds, so that a call of a given row count takes the same kind
       * of kernel on either ISA: a multi-row call that stays on the row kernels gives each row
       * the bits of a one-row call, which speculative verification (a draft of up to 16 tokens
       * checked in one call against one-token decode), prompt-cache reuse and chunked feeds
       * rely on (test_speculative, test_prompt_cache, test_session, test_kv_delayed; with 24 and
       * 6, measured as the crossovers on Zen 4, they failed on an AVX2-only EPYC). Panels still
       * take every prompt chunk of 128 rows (affine: 24) and more. */
      .gemm_min_m = {128, 128, 128, 24, 24, 24, 24, 24, 24},
      .gemm_mr = GEMM_MR,
      .gemm_nr = GEMM_NR,
      .scratch_floats = GEMM_PANELS * GEMM_KC * GEMM_NR,
      .word_lanes = VW,
      .gemv_x16 = ci_matmul_gemv_x16_avx2,
      .quantize_x16 = ci_quantize_x16_avx2,
  };
  return &kernels;
}
