/* AVX512_BF16 matmul kernels of fast precision: bf16 products with f32 accumulation through
 * vdpbf16ps (two products of bf16 pairs added to each f32 lane, exactly). Row kernels (small m,
 * bf16 weights) read x rounded to bf16 and stream 4 weight rows at a time against up to 4 x
 * rows; panel kernels (large m, every weight format) decode 32 weight rows x 512 columns into a
 * panel of bf16 column pairs (quantized weights dequantized to f32, then rounded to bf16) and run
 * a 12x32 register-tiled loop over it, one vdpbf16ps per pair of columns where the f32 panel
 * kernels need two FMAs. Each x row's sum runs in one fixed order whatever the other rows are
 * (batch invariance). Called only when ci_cpu_bf16_dot_enabled(). */
#include "backend/cpu/avx512_decode.h"

#define INLINE CI_AVX512_INLINE

enum {
  VW = 16,       /* f32 lanes per vector; a vector holds 32 bf16 */
  ROW_BLOCK = 4, /* weight rows per row-kernel block */
  X_BLOCK = 4,   /* x rows per row-kernel block */
  GEMM_MR = 12,  /* x rows per register tile: as the f32 panel kernels (x_pairs layout) */
  GEMM_NR = CI_PAIR_PANEL_ROWS,      /* weight rows per panel */
  GEMM_KC = 2 * CI_BF16_PANEL_PAIRS, /* columns per panel (256 pairs) */
  /* Rows of at most SHORT_ROW_COLS columns, against at most SHORT_ROW_MAX_M x rows, are walked
   * one weight row at a time (one sequential stream per thread) with each line prefetched
   * SHORT_ROW_PREFETCH bytes ahead into L1, instead of four rows side by side. Measured with
   * bench/matmul_bench (weights in huge pages, the two walks alternating in one process, 2-core
   * AMD EPYC; old time / new time): rows of 1,152 columns 1.11-1.15 at 1 x row, 1.34-1.41 at 2-8
   * rows, 0.82 at 16 and 0.45 at 32; rows of 2,048 columns and more mostly 0.66-0.96 at 1-8 rows
   * (their four streams already run at the DRAM rate). Gemma-3-1B geometry bf16 decode +7%. Each
   * output's sum is the same chain either way (same bits). */
  SHORT_ROW_COLS = 1536,
  SHORT_ROW_MAX_M = 8,
  SHORT_ROW_PREFETCH = 8192,
};

/* 32 bf16 as the operand type of vdpbf16ps. */
INLINE __m512bh as_bh(__m512i v) {
  return (__m512bh)v;
}

/* ==== Row kernels (bf16 weights, small m) ==== */

/* y[i0:i0+xb, r:r+rb] = x_bf16 rows . W rows, 32 columns per vdpbf16ps; rb and xb are
 * compile-time constants after inlining. Four weight rows stream without software
 * prefetches: the hardware prefetchers follow four sequential streams, and a prefetch per cache
 * line measured equal or slower (llama1b bf16 on this project's 2-core AMD EPYC: batch 1
 * 22.2-23.8 vs 22.5-26.3 tok/s without, batch 4 59.7-59.8 vs 64.1-64.6). With `prefetch` (one
 * short row, SHORT_ROW_COLS) each weight line is prefetched SHORT_ROW_PREFETCH bytes ahead. */
INLINE void gemv_block(const ci_matmul_job *job, int64_t r, int rb, int64_t i0, int xb,
                       int prefetch) {
  const int64_t k = job->k;
  const uint16_t *x = job->x_bf16 + i0 * k;
  const uint16_t *w = (const uint16_t *)job->w;
  __m512 acc[ROW_BLOCK][X_BLOCK];
  for (int j = 0; j < rb; j++)
    for (int i = 0; i < xb; i++) acc[j][i] = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 2 * VW <= k; c += 2 * VW) {
    __m512i wv[ROW_BLOCK];
    for (int j = 0; j < rb; j++) {
      const uint16_t *p = w + (r + j) * k + c;
      wv[j] = _mm512_loadu_si512(p);
      if (prefetch) _mm_prefetch((const char *)p + SHORT_ROW_PREFETCH, _MM_HINT_T0);
    }
    for (int i = 0; i < xb; i++) {
      const __m512i xv = _mm512_loadu_si512(x + i * k + c);
      for (int j = 0; j < rb; j++) acc[j][i] = _mm512_dpbf16_ps(acc[j][i], as_bh(wv[j]), as_bh(xv));
    }
  }
  if (c < k) {
    const __mmask32 tail = (__mmask32)((1ull << (k - c)) - 1);
    __m512i wv[ROW_BLOCK];
    for (int j = 0; j < rb; j++) wv[j] = _mm512_maskz_loadu_epi16(tail, w + (r + j) * k + c);
    for (int i = 0; i < xb; i++) {
      const __m512i xv = _mm512_maskz_loadu_epi16(tail, x + i * k + c);
      for (int j = 0; j < rb; j++) acc[j][i] = _mm512_dpbf16_ps(acc[j][i], as_bh(wv[j]), as_bh(xv));
    }
  }
  for (int i = 0; i < xb; i++)
    for (int j = 0; j < rb; j++)
      job->y[(i0 + i) * job->n + r + j] = _mm512_reduce_add_ps(acc[j][i]);
}

/* All x rows against weight rows [r, r+rb), x rows in blocks of X_BLOCK; the first block
 * prefetches the weight lines when `prefetch`. */
INLINE void gemv_row_block(const ci_matmul_job *job, int64_t r, int rb, int prefetch) {
  int64_t i = 0;
  for (; i + X_BLOCK <= job->m; i += X_BLOCK) gemv_block(job, r, rb, i, X_BLOCK, prefetch && !i);
  switch (job->m - i) {
  case 3:
    gemv_block(job, r, rb, i, 3, prefetch && !i);
    break;
  case 2:
    gemv_block(job, r, rb, i, 2, prefetch && !i);
    break;
  case 1:
    gemv_block(job, r, rb, i, 1, prefetch && !i);
    break;
  default:
    break;
  }
}

/* Row kernel of bf16 weights: short rows against few x rows one at a time, prefetched (see
 * SHORT_ROW_COLS); otherwise rows in blocks of ROW_BLOCK, the leftover rows one by one. */
static void gemv_bf16(const ci_matmul_job *job, int64_t row_begin, int64_t row_end,
                      float *scratch) {
  (void)scratch;
  int64_t r = row_begin;
  if (job->k <= SHORT_ROW_COLS && job->m <= SHORT_ROW_MAX_M) {
    for (; r < row_end; r++) gemv_row_block(job, r, 1, 1);
    return;
  }
  for (; r + ROW_BLOCK <= row_end; r += ROW_BLOCK) gemv_row_block(job, r, ROW_BLOCK, 0);
  for (; r < row_end; r++) gemv_row_block(job, r, 1, 0);
}

/* ==== Panel kernels (every format, large m) ==== */

/* y[i0:i0+rows, col:col+cols] (+)= x pairs . panel pairs over `pairs` column pairs, cols <= 32,
 * rows <= MR a compile-time constant. Accumulates into y when `accumulate`, else overwrites. */
INLINE void gemm_tile_rows(int64_t pairs, const uint32_t *x_panel, const uint32_t *panel, float *y,
                           int64_t ldy, int rows, int cols, int accumulate) {
  __m512 acc[GEMM_MR][2];
  for (int i = 0; i < rows; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; p++) {
    const __m512i w0 = _mm512_load_si512(panel + p * GEMM_NR);
    const __m512i w1 = _mm512_load_si512(panel + p * GEMM_NR + VW);
    for (int i = 0; i < rows; i++) {
      const __m512i xv = _mm512_set1_epi32((int)x_panel[p * GEMM_MR + i]);
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], as_bh(w0), as_bh(xv));
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], as_bh(w1), as_bh(xv));
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
static void gemm_tile(int64_t pairs, const uint32_t *x_panel, const uint32_t *panel, float *y,
                      int64_t ldy, int rows, int cols, int accumulate) {
  switch (rows) {
#define TILE_CASE(n)                                                                               \
  case n:                                                                                          \
    gemm_tile_rows(pairs, x_panel, panel, y, ldy, n, cols, accumulate);                            \
    break;
    TILE_CASE(1)
    TILE_CASE(2)
    TILE_CASE(3)
    TILE_CASE(4)
    TILE_CASE(5)
    TILE_CASE(6)
    TILE_CASE(7)
    TILE_CASE(8)
    TILE_CASE(9)
    TILE_CASE(10)
    TILE_CASE(11)
#undef TILE_CASE
  default:
    gemm_tile_rows(pairs, x_panel, panel, y, ldy, GEMM_MR, cols, accumulate);
    break;
  }
}

/* y[i0:i0+rows, col:col+cols] (+)= x pairs . the pairs of two panels side by side (columns 0-31
 * from pa, 32-63 from pb), 32 < cols <= 64, rows <= MR / 2 a compile-time constant: four weight
 * vectors per broadcast x pair instead of two. Each output is the same chain of vdpbf16ps over
 * the pairs as in gemm_tile_rows. */
INLINE void gemm_tile64_rows(int64_t pairs, const uint32_t *x_panel, const uint32_t *pa,
                             const uint32_t *pb, float *y, int64_t ldy, int rows, int cols,
                             int accumulate) {
  __m512 acc[GEMM_MR / 2][4];
  for (int i = 0; i < rows; i++)
    for (int v = 0; v < 4; v++) acc[i][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; p++) {
    const __m512i w[4] = {
        _mm512_load_si512(pa + p * GEMM_NR), _mm512_load_si512(pa + p * GEMM_NR + VW),
        _mm512_load_si512(pb + p * GEMM_NR), _mm512_load_si512(pb + p * GEMM_NR + VW)};
    for (int i = 0; i < rows; i++) {
      const __m512i xv = _mm512_set1_epi32((int)x_panel[p * GEMM_MR + i]);
      for (int v = 0; v < 4; v++) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], as_bh(w[v]), as_bh(xv));
    }
  }
  __mmask16 mask[4];
  for (int v = 0; v < 4; v++) {
    const int left = cols - VW * v;
    mask[v] = left >= VW ? 0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
  }
  for (int i = 0; i < rows; i++) {
    float *out = y + i * ldy;
    for (int v = 0; v < 4; v++) {
      if (accumulate)
        acc[i][v] = _mm512_add_ps(acc[i][v], _mm512_maskz_loadu_ps(mask[v], out + VW * v));
      _mm512_mask_storeu_ps(out + VW * v, mask[v], acc[i][v]);
    }
  }
}

/* gemm_tile64_rows for any rows in 1..MR / 2. */
static void gemm_tile64(int64_t pairs, const uint32_t *x_panel, const uint32_t *pa,
                        const uint32_t *pb, float *y, int64_t ldy, int rows, int cols,
                        int accumulate) {
  switch (rows) {
#define TILE_CASE(n)                                                                               \
  case n:                                                                                          \
    gemm_tile64_rows(pairs, x_panel, pa, pb, y, ldy, n, cols, accumulate);                         \
    break;
    TILE_CASE(1)
    TILE_CASE(2)
    TILE_CASE(3)
    TILE_CASE(4)
    TILE_CASE(5)
#undef TILE_CASE
  default:
    gemm_tile64_rows(pairs, x_panel, pa, pb, y, ldy, GEMM_MR / 2, cols, accumulate);
    break;
  }
}

/* Panel kernel template: for each block of GEMM_KC columns, decode the chunk's 32-row panels two
 * at a time into bf16 pairs and multiply them by every 12-row tile of x (as two 6-row tiles over
 * both panels). */
INLINE void gemm_rows(const ci_matmul_job *job, ci_weight_format f, int64_t row_begin,
                      int64_t row_end, float *scratch) {
  const int64_t k = job->k, m = job->m, x_pairs = (k + 1) / 2;
  uint32_t *panel = (uint32_t *)scratch;
  uint32_t *panel_b = panel + GEMM_KC / 2 * GEMM_NR; /* the scratch holds two panels */
  for (int64_t c0 = 0; c0 < k; c0 += GEMM_KC) {
    const int64_t kc = k - c0 < GEMM_KC ? k - c0 : GEMM_KC;
    const int64_t pairs = (kc + 1) / 2;
    for (int64_t row = row_begin; row < row_end; row += 2 * GEMM_NR) {
      const int cols = row_end - row < 2 * GEMM_NR ? (int)(row_end - row) : 2 * GEMM_NR;
      ci_pack_pair_panel(job, f, row, c0, kc, panel);
      if (cols > GEMM_NR) ci_pack_pair_panel(job, f, row + GEMM_NR, c0, kc, panel_b);
      for (int64_t i0 = 0; i0 < m; i0 += GEMM_MR) {
        const uint32_t *x_panel = job->x_pairs + i0 * x_pairs + c0 / 2 * GEMM_MR;
        const int rows = m - i0 < GEMM_MR ? (int)(m - i0) : GEMM_MR;
        float *y = job->y + i0 * job->n + row;
        if (cols <= GEMM_NR) {
          gemm_tile(pairs, x_panel, panel, y, job->n, rows, cols, c0 > 0);
          continue;
        }
        const int first = rows < GEMM_MR / 2 ? rows : GEMM_MR / 2;
        gemm_tile64(pairs, x_panel, panel, panel_b, y, job->n, first, cols, c0 > 0);
        if (rows > first)
          gemm_tile64(pairs, x_panel + first, panel, panel_b, y + first * job->n, job->n,
                      rows - first, cols, c0 > 0);
      }
    }
  }
}

#define DEFINE_GEMM(suffix, format)                                                                \
  static void gemm_##suffix(const ci_matmul_job *job, int64_t row_begin, int64_t row_end,          \
                            float *scratch) {                                                      \
    gemm_rows(job, format, row_begin, row_end, scratch);                                           \
  }

DEFINE_GEMM(bf16, CI_WF_BF16)
DEFINE_GEMM(q8_f32, CI_WF_Q8_F32)
DEFINE_GEMM(q8_f16, CI_WF_Q8_F16)
DEFINE_GEMM(q8_bf16, CI_WF_Q8_BF16)
DEFINE_GEMM(q4_f32, CI_WF_Q4_F32)
DEFINE_GEMM(q4_f16, CI_WF_Q4_F16)
DEFINE_GEMM(q4_bf16, CI_WF_Q4_BF16)

const ci_matmul_rows_fn ci_matmul_gemv_bf16_dot_avx512[CI_WF_COUNT] = {[CI_WF_BF16] = gemv_bf16};

const ci_matmul_rows_fn ci_matmul_gemm_bf16_dot_avx512[CI_WF_COUNT] = {
    [CI_WF_BF16] = gemm_bf16,       [CI_WF_Q8_F32] = gemm_q8_f32, [CI_WF_Q8_F16] = gemm_q8_f16,
    [CI_WF_Q8_BF16] = gemm_q8_bf16, [CI_WF_Q4_F32] = gemm_q4_f32, [CI_WF_Q4_F16] = gemm_q4_f16,
    [CI_WF_Q4_BF16] = gemm_q4_bf16,
};
