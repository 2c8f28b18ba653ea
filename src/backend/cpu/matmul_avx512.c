/* AVX-512 (F/BW/VL/DQ) matmul kernels. Row kernels (small m) stream 4 weight rows at a time
 * and reuse each decoded vector for up to 4 x rows (2 for the affine formats, which decode
 * 16 code words side by side, see affine_block_dot); panel kernels (large m) decode 32 weight
 * rows x 512 columns into an f32 panel and run a 12x32 register-tiled outer-product loop over
 * it. Every kernel is one always-inline template instantiated per weight format. */
#include "backend/cpu/avx512_decode.h"

#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))

enum {
  VW = 16,            /* floats per vector */
  ROW_BLOCK = 4,      /* weight rows per row-kernel block */
  X_BLOCK = 4,        /* x rows per row-kernel block, float formats */
  AFFINE_X_BLOCK = 2, /* x rows per row-kernel block, affine formats */
  GEMM_MR = 12,       /* x rows per register tile (gemm_tile's switch covers 1..12) */
  GEMM_NR = 32,       /* weight rows per panel (two vectors) */
  GEMM_KC = 512,      /* columns per panel; a multiple of every group size */
  SCALE_CHUNK = 2048, /* columns whose scales the row kernels convert to f32 at a time */
  /* How far ahead (bytes) the row kernels prefetch along each weight row's stream; rows of a
   * chunk are contiguous, so short rows prefetch into the following rows. Measured best on
   * Zen 4 with 2 threads streaming from DRAM. */
  FLOAT_PREFETCH_BYTES = 32768,
  AFFINE_PREFETCH_BYTES = 32768,
};
_Static_assert(GEMM_KC *GEMM_NR >= CI_BF16_GEMM_SCRATCH_WORDS,
               "the scratch of the panel kernels holds the bf16 kernels' two panels");

/* ==== Row kernels (small m) ==== */

/* y[i0:i0+xb, r:r+rb] for a float-format weight. rb and xb are compile-time constants after
 * inlining, so the rb*xb accumulators live in registers. */
INLINE void gemv_float_block(const ci_matmul_job *job, ci_dtype dt, int64_t r, int rb, int64_t i0,
                             int xb) {
  const int64_t k = job->k;
  const int64_t elem_bytes = dt == CI_F32 ? 4 : 2;
  const float *x = job->x + i0 * k;
  __m512 acc[ROW_BLOCK][X_BLOCK];
  for (int j = 0; j < rb; j++)
    for (int i = 0; i < xb; i++) acc[j][i] = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + VW <= k; c += VW) {
    __m512 wv[ROW_BLOCK];
    for (int j = 0; j < rb; j++) {
      if (c % 32 == 0)
        _mm_prefetch((const char *)job->w + ((r + j) * k + c) * elem_bytes + FLOAT_PREFETCH_BYTES,
                     _MM_HINT_T1);
      wv[j] = load_float16(dt, job->w, (r + j) * k + c, 0xffff);
    }
    for (int i = 0; i < xb; i++) {
      __m512 xv = _mm512_loadu_ps(x + i * k + c);
      for (int j = 0; j < rb; j++) acc[j][i] = _mm512_fmadd_ps(wv[j], xv, acc[j][i]);
    }
  }
  if (c < k) {
    __mmask16 tail = (__mmask16)((1u << (k - c)) - 1);
    __m512 wv[ROW_BLOCK];
    for (int j = 0; j < rb; j++) wv[j] = load_float16(dt, job->w, (r + j) * k + c, tail);
    for (int i = 0; i < xb; i++) {
      __m512 xv = _mm512_maskz_loadu_ps(tail, x + i * k + c);
      for (int j = 0; j < rb; j++) acc[j][i] = _mm512_fmadd_ps(wv[j], xv, acc[j][i]);
    }
  }
  for (int i = 0; i < xb; i++)
    for (int j = 0; j < rb; j++)
      job->y[(i0 + i) * job->n + r + j] = _mm512_reduce_add_ps(acc[j][i]);
}

/* Per-call constants of the affine row kernels. */
typedef struct {
  __m512i code_mask[8]; /* code t of a word, in place (t < codes per word - 1) */
  __m512i lane_group;   /* lane -> group within a block, when a block spans several */
  int group_shift;      /* log2(group size) */
  int groups_per_block; /* groups in a full block; 1 when a group covers whole blocks */
  int64_t n_groups;     /* groups per row */
} affine_consts;

/* The constants for `bits`-bit codes. */
INLINE affine_consts make_affine_consts(const ci_matmul_job *job, int bits) {
  affine_consts ac;
  const int codes_per_word = 32 / bits;
  for (int t = 0; t < 8; t++)
    ac.code_mask[t] =
        _mm512_set1_epi32((int)(t < codes_per_word - 1 ? ((1u << bits) - 1) << (bits * t) : 0));
  ac.group_shift = __builtin_ctz((unsigned)job->group);
  int block = VW * codes_per_word;
  ac.groups_per_block = job->group >= block ? 1 : block / job->group;
  _Alignas(64) int32_t group_of_lane[VW];
  for (int j = 0; j < VW; j++) group_of_lane[j] = j * codes_per_word / job->group;
  ac.lane_group = _mm512_load_si512(group_of_lane);
  ac.n_groups = job->k / job->group;
  return ac;
}

/* Converts `count` scales (or biases) from index `first` to f32. */
INLINE void scales_to_f32(ci_dtype sdt, const void *p, int64_t first, int64_t count, float *out) {
  for (int64_t g = 0; g < count; g += VW) {
    __mmask16 mask = count - g >= VW ? 0xffff : (__mmask16)((1u << (count - g)) - 1);
    _mm512_mask_storeu_ps(out + g, mask, load_float16(sdt, p, first + g, mask));
  }
}

/* Per-lane scales of a word-lane block whose first group is scales[0] (f32): lane j holds
 * columns c + E*j .. c + E*j + E-1, all in one group. */
INLINE __m512 block_scales(const affine_consts *ac, const float *scales) {
  if (ac->groups_per_block == 1) return _mm512_set1_ps(scales[0]);
  return _mm512_permutexvar_ps(ac->lane_group, _mm512_castps128_ps512(_mm_loadu_ps(scales)));
}

/* sum_g biases[row, g] * x_group_sums[g]: the bias half of the affine factorisation. */
INLINE float bias_dot(const ci_matmul_job *job, ci_dtype sdt, int64_t row, const float *sums) {
  int64_t n_groups = job->k / job->group;
  __m512 acc = _mm512_setzero_ps();
  for (int64_t g = 0; g < n_groups; g += VW) {
    __mmask16 mask = n_groups - g >= VW ? 0xffff : (__mmask16)((1u << (n_groups - g)) - 1);
    __m512 biases = load_float16(sdt, job->biases, row * n_groups + g, mask);
    acc = _mm512_fmadd_ps(biases, _mm512_maskz_loadu_ps(mask, sums + g), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

/* Code t of every lane of w as f32: in place (q * 2^(bits*t)) by a mask, the top code by a
 * shift. */
INLINE __m512 word_lane_codes(const affine_consts *ac, __m512i w, int bits, int t) {
  if (t < 32 / bits - 1) return _mm512_cvtepi32_ps(_mm512_and_si512(w, ac->code_mask[t]));
  return _mm512_cvtepi32_ps(_mm512_srli_epi32(w, 32 - bits));
}

/* One full word-lane block (16 words) of one weight row against xb x rows: per x row, the
 * per-lane sums of code * x over the block, not yet scaled. The x order prescaled code t by
 * 2^-(bits*t), cancelling the in-place codes exactly. Each x row sums in two chains (even and
 * odd codes, which hide the FMA latency) added at the end, the same order whatever xb is, so a
 * row computes alike alone and beside another (batch invariance). */
INLINE void affine_block_dot(const affine_consts *ac, __m512i w, const float *x, int64_t x_stride,
                             int bits, int xb, __m512 dot[AFFINE_X_BLOCK]) {
  const int codes_per_word = 32 / bits;
  __m512 even[AFFINE_X_BLOCK], odd[AFFINE_X_BLOCK];
  const __m512 q0 = word_lane_codes(ac, w, bits, 0), q1 = word_lane_codes(ac, w, bits, 1);
#pragma GCC unroll 2
  for (int i = 0; i < xb; i++) {
    even[i] = _mm512_mul_ps(q0, _mm512_loadu_ps(x + i * x_stride));
    odd[i] = _mm512_mul_ps(q1, _mm512_loadu_ps(x + i * x_stride + VW));
  }
#pragma GCC unroll 8
  for (int t = 2; t < codes_per_word; t += 2) {
    const __m512 qe = word_lane_codes(ac, w, bits, t), qo = word_lane_codes(ac, w, bits, t + 1);
#pragma GCC unroll 2
    for (int i = 0; i < xb; i++) {
      even[i] = _mm512_fmadd_ps(qe, _mm512_loadu_ps(x + i * x_stride + VW * t), even[i]);
      odd[i] = _mm512_fmadd_ps(qo, _mm512_loadu_ps(x + i * x_stride + VW * (t + 1)), odd[i]);
    }
  }
#pragma GCC unroll 2
  for (int i = 0; i < xb; i++) dot[i] = _mm512_add_ps(even[i], odd[i]);
}

/* As affine_block_dot for a last, partial block of `lanes` (< 16) words. */
static inline void affine_partial_block_dot(const affine_consts *ac, const uint32_t *words,
                                            const float *x, int64_t x_stride, int bits, int lanes,
                                            int xb, __m512 dot[AFFINE_X_BLOCK]) {
  __mmask16 mask = (__mmask16)((1u << lanes) - 1);
  __m512i w = _mm512_maskz_loadu_epi32(mask, words);
  for (int i = 0; i < xb; i++) dot[i] = _mm512_setzero_ps();
  for (int t = 0; t < 32 / bits; t++) {
    __m512 q = t < 32 / bits - 1 ? _mm512_cvtepi32_ps(_mm512_and_si512(w, ac->code_mask[t]))
                                 : _mm512_cvtepi32_ps(_mm512_srli_epi32(w, 32 - bits));
    for (int i = 0; i < xb; i++)
      dot[i] =
          _mm512_fmadd_ps(q, _mm512_maskz_loadu_ps(mask, x + i * x_stride + lanes * t), dot[i]);
  }
}

/* y[i0:i0+xb, r:r+rb] for an affine weight, x in word-lane order: per block, each row's
 * code-times-x lane sums are scaled by their groups' scales into a vector total; the biases
 * meet the group sums of x at the end. Scales are converted to f32 a chunk of columns at a
 * time. */
INLINE void gemv_affine_block(const ci_matmul_job *job, int bits, ci_dtype sdt, int64_t r, int rb,
                              int64_t i0, int xb, const affine_consts *ac) {
  const int codes_per_word = 32 / bits;
  const int64_t k = job->k, words_per_row = k / codes_per_word;
  const int64_t block = (int64_t)VW * codes_per_word;
  const float *x = job->x + i0 * k;
  const uint32_t *words[ROW_BLOCK];
  /* f32 scales of the chunk, padded so a block may read 4 */
  _Alignas(64) float scales[ROW_BLOCK][SCALE_CHUNK / 32 + 4];
  __m512 total[ROW_BLOCK][AFFINE_X_BLOCK];
#pragma GCC unroll 4
  for (int j = 0; j < rb; j++) {
    words[j] = (const uint32_t *)job->w + (r + j) * words_per_row;
#pragma GCC unroll 2
    for (int i = 0; i < xb; i++) total[j][i] = _mm512_setzero_ps();
  }
  for (int64_t chunk = 0; chunk < k; chunk += SCALE_CHUNK) {
    int64_t chunk_end = k - chunk < SCALE_CHUNK ? k : chunk + SCALE_CHUNK;
    int64_t first_group = chunk >> ac->group_shift;
    int64_t chunk_groups = (chunk_end - chunk) >> ac->group_shift;
    for (int j = 0; j < rb; j++) {
      scales_to_f32(sdt, job->scales, (r + j) * ac->n_groups + first_group, chunk_groups,
                    scales[j]);
      /* A last, partial block reads scales past the row's end for its empty lanes: make them
       * 0 rather than stale stack (0 * NaN would poison the total). */
      _mm_storeu_ps(scales[j] + chunk_groups, _mm_setzero_ps());
    }
    int64_t c = chunk;
    for (; c + block <= chunk_end; c += block) {
      int64_t group = (c - chunk) >> ac->group_shift;
#pragma GCC unroll 4
      for (int j = 0; j < rb; j++) {
        __m512 dot[AFFINE_X_BLOCK];
        _mm_prefetch((const char *)(words[j] + c / codes_per_word) + AFFINE_PREFETCH_BYTES,
                     _MM_HINT_T1);
        __m512i w = _mm512_loadu_si512(words[j] + c / codes_per_word);
        affine_block_dot(ac, w, x + c, k, bits, xb, dot);
        __m512 lane_scales = block_scales(ac, scales[j] + group);
#pragma GCC unroll 2
        for (int i = 0; i < xb; i++)
          total[j][i] = _mm512_fmadd_ps(dot[i], lane_scales, total[j][i]);
      }
    }
    if (c < chunk_end) { /* last, partial block of the row */
      int lanes = (int)((chunk_end - c) / codes_per_word);
      int64_t group = (c - chunk) >> ac->group_shift;
      for (int j = 0; j < rb; j++) {
        __m512 dot[AFFINE_X_BLOCK];
        affine_partial_block_dot(ac, words[j] + c / codes_per_word, x + c, k, bits, lanes, xb, dot);
        __m512 lane_scales = block_scales(ac, scales[j] + group);
        for (int i = 0; i < xb; i++)
          total[j][i] = _mm512_fmadd_ps(dot[i], lane_scales, total[j][i]);
      }
    }
  }
  for (int i = 0; i < xb; i++)
    for (int j = 0; j < rb; j++) {
      const float *sums = job->x_group_sums + (i0 + i) * ac->n_groups;
      job->y[(i0 + i) * job->n + r + j] =
          _mm512_reduce_add_ps(total[j][i]) + bias_dot(job, sdt, r + j, sums);
    }
}

/* One (row block, x block) of any format; dispatches on the constant format and sizes. */
INLINE void gemv_block(const ci_matmul_job *job, ci_weight_format f, int64_t r, int rb, int64_t i0,
                       int xb, const affine_consts *ac) {
  ci_dtype dt = ci_weight_format_dtype(f), sdt = ci_weight_format_scale_dtype(f);
  if (ci_dtype_is_affine(dt))
    gemv_affine_block(job, dt == CI_Q8 ? 8 : 4, sdt, r, rb, i0, xb, ac);
  else
    gemv_float_block(job, dt, r, rb, i0, xb);
}

/* All x rows against weight rows [r, r+rb), x rows in blocks of X_BLOCK (AFFINE_X_BLOCK). */
INLINE void gemv_row_block(const ci_matmul_job *job, ci_weight_format f, int64_t r, int rb,
                           const affine_consts *ac) {
  int64_t i = 0;
  if (ci_dtype_is_affine(ci_weight_format_dtype(f))) {
    for (; i + AFFINE_X_BLOCK <= job->m; i += AFFINE_X_BLOCK)
      gemv_block(job, f, r, rb, i, AFFINE_X_BLOCK, ac);
    if (i < job->m) gemv_block(job, f, r, rb, i, 1, ac);
    return;
  }
  for (; i + X_BLOCK <= job->m; i += X_BLOCK) gemv_block(job, f, r, rb, i, X_BLOCK, ac);
  switch (job->m - i) {
  case 3:
    gemv_block(job, f, r, rb, i, 3, ac);
    break;
  case 2:
    gemv_block(job, f, r, rb, i, 2, ac);
    break;
  case 1:
    gemv_block(job, f, r, rb, i, 1, ac);
    break;
  default:
    break;
  }
}

/* Row kernel template: weight rows in blocks of ROW_BLOCK, the leftover rows one by one. */
INLINE void gemv_rows(const ci_matmul_job *job, ci_weight_format f, int64_t row_begin,
                      int64_t row_end) {
  ci_dtype dt = ci_weight_format_dtype(f);
  affine_consts ac;
  if (ci_dtype_is_affine(dt)) ac = make_affine_consts(job, dt == CI_Q8 ? 8 : 4);
  int64_t r = row_begin;
  for (; r + ROW_BLOCK <= row_end; r += ROW_BLOCK) gemv_row_block(job, f, r, ROW_BLOCK, &ac);
  for (; r < row_end; r++) gemv_row_block(job, f, r, 1, &ac);
}

/* ==== Panel kernels (large m) ==== */

/* Decodes W[row:row+32, c0:c0+kc) into panel[kc][32] (f32, column-major per 32 rows). */
INLINE void pack_panel(const ci_matmul_job *job, ci_weight_format f, int64_t row, int64_t c0,
                       int64_t kc, float *panel) {
  for (int64_t c = 0; c < kc; c += VW)
    for (int half = 0; half < 2; half++) {
      __m512 v[16];
      decode_16x16(job, f, row + 16 * half, c0 + c, v);
      transpose16x16(v);
      for (int t = 0; t < 16; t++) _mm512_store_ps(panel + (c + t) * GEMM_NR + 16 * half, v[t]);
    }
}

/* y[i0:i0+rows, col:col+cols] (+)= x_panel[kc][MR] @ panel[kc][32], cols <= 32, for a
 * compile-time row count rows <= MR (the accumulators then live in registers). Accumulates
 * into y when `accumulate`, else overwrites. */
INLINE void gemm_tile_rows(int64_t kc, const float *x_panel, const float *panel, float *y,
                           int64_t ldy, int rows, int cols, int accumulate) {
  __m512 acc[GEMM_MR][2];
  for (int i = 0; i < rows; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t c = 0; c < kc; c++) {
    __m512 w0 = _mm512_load_ps(panel + c * GEMM_NR);
    __m512 w1 = _mm512_load_ps(panel + c * GEMM_NR + VW);
    for (int i = 0; i < rows; i++) {
      __m512 xv = _mm512_set1_ps(x_panel[c * GEMM_MR + i]);
      acc[i][0] = _mm512_fmadd_ps(xv, w0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(xv, w1, acc[i][1]);
    }
  }
  __mmask16 mask0 = cols >= VW ? 0xffff : (__mmask16)((1u << cols) - 1);
  __mmask16 mask1 = cols >= 2 * VW ? 0xffff : (__mmask16)((1u << (cols > VW ? cols - VW : 0)) - 1);
  for (int i = 0; i < rows; i++) {
    float *out = y + i * ldy;
    if (accumulate) {
      acc[i][0] = _mm512_add_ps(acc[i][0], _mm512_maskz_loadu_ps(mask0, out));
      acc[i][1] = _mm512_add_ps(acc[i][1], _mm512_maskz_loadu_ps(mask1, out + VW));
    }
    _mm512_mask_storeu_ps(out, mask0, acc[i][0]);
    _mm512_mask_storeu_ps(out + VW, mask1, acc[i][1]);
  }
}

/* gemm_tile_rows for any rows in 1..MR: one instantiation per row count. */
static void gemm_tile(int64_t kc, const float *x_panel, const float *panel, float *y, int64_t ldy,
                      int rows, int cols, int accumulate) {
  switch (rows) {
  case 1:
    gemm_tile_rows(kc, x_panel, panel, y, ldy, 1, cols, accumulate);
    break;
  case 2:
    gemm_tile_rows(kc, x_panel, panel, y, ldy, 2, cols, accumulate);
    break;
  case 3:
    gemm_tile_rows(kc, x_panel, panel, y, ldy, 3, cols, accumulate);
    break;
  case 4:
    gemm_tile_rows(kc, x_panel, panel, y, ldy, 4, cols, accumulate);
    break;
  case 5:
    gemm_tile_rows(kc, x_panel, panel, y, ldy, 5, cols, accumulate);
    break;
  case 6:
    gemm_tile_rows(kc, x_panel, panel, y, ldy, 6, cols, accumulate);
    break;
  case 7:
    gemm_tile_rows(kc, x_panel, panel, y, ldy, 7, cols, accumulate);
    break;
  case 8:
    gemm_tile_rows(kc, x_panel, panel, y, ldy, 8, cols, accumulate);
    break;
  case 9:
    gemm_tile_rows(kc, x_panel, panel, y, ldy, 9, cols, accumulate);
    break;
  case 10:
    gemm_tile_rows(kc, x_panel, panel, y, ldy, 10, cols, accumulate);
    break;
  case 11:
    gemm_tile_rows(kc, x_panel, panel, y, ldy, 11, cols, accumulate);
    break;
  default:
    gemm_tile_rows(kc, x_panel, panel, y, ldy, GEMM_MR, cols, accumulate);
    break;
  }
}

/* Panel kernel template: for each block of GEMM_KC columns, decode each 32-row panel of the
 * chunk once and multiply it by every 12-row tile of x. */
INLINE void gemm_rows(const ci_matmul_job *job, ci_weight_format f, int64_t row_begin,
                      int64_t row_end, float *panel) {
  const int64_t k = job->k, m = job->m;
  for (int64_t c0 = 0; c0 < k; c0 += GEMM_KC) {
    int64_t kc = k - c0 < GEMM_KC ? k - c0 : GEMM_KC;
    for (int64_t row = row_begin; row < row_end; row += GEMM_NR) {
      int cols = row_end - row < GEMM_NR ? (int)(row_end - row) : GEMM_NR;
      pack_panel(job, f, row, c0, kc, panel);
      for (int64_t i0 = 0; i0 < m; i0 += GEMM_MR) {
        const float *x_panel = job->x_packed + i0 * k + c0 * GEMM_MR;
        int rows = m - i0 < GEMM_MR ? (int)(m - i0) : GEMM_MR;
        gemm_tile(kc, x_panel, panel, job->y + i0 * job->n + row, job->n, rows, cols, c0 > 0);
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

const ci_matmul_kernels *ci_matmul_kernels_avx512(void) {
  static const ci_matmul_kernels kernels = {
      .gemv = {gemv_f32, gemv_f16, gemv_bf16, gemv_q8_f32, gemv_q8_f16, gemv_q8_bf16, gemv_q4_f32,
               gemv_q4_f16, gemv_q4_bf16},
      .gemm = {gemm_f32, gemm_f16, gemm_bf16, gemm_q8_f32, gemm_q8_f16, gemm_q8_bf16, gemm_q4_f32,
               gemm_q4_f16, gemm_q4_bf16},
      /* Measured crossovers: the row kernels reuse decoded float rows so well that they win
       * up to m ~ 128 for float formats; decoding codes costs more, so affine formats switch
       * to panels sooner. */
      .gemm_min_m = {128, 128, 128, 24, 24, 24, 24, 24, 24},
      .gemm_mr = GEMM_MR,
      .gemm_nr = GEMM_NR,
      .scratch_floats = GEMM_KC * GEMM_NR > CI_AMX_GEMM_SCRATCH_FLOATS ? GEMM_KC * GEMM_NR
                                                                       : CI_AMX_GEMM_SCRATCH_FLOATS,
      .word_lanes = VW,
      .gemv_int8 = ci_matmul_gemv_int8_avx512_vnni,
      .quantize_x_planes = ci_quantize_x_planes_avx512,
      .gemv_bf16_dot = ci_matmul_gemv_bf16_dot_avx512,
      .gemm_bf16_dot = ci_matmul_gemm_bf16_dot_avx512,
      .gemm_amx = ci_matmul_gemm_amx,
  };
  return &kernels;
}
