/* AMX panel kernels of fast precision (Intel AMX-BF16, Sapphire Rapids and later): the weight
 * rows of a task are decoded, 512 columns at a time, into the bf16 column-pair panels of the
 * AVX512_BF16 panel kernels (ci_pack_pair_panel), which are the B operand of TDPBF16PS as they
 * stand (tile row p: the 16 weight rows' column pair p), and multiplied by 16-row tiles of x
 * rounded to bf16 (row-major, rows padded to a multiple of 16 with zeros). Each output is one
 * chain of tile products over its columns in order, 32 at a time, with f32 accumulation; the
 * chain is kept across the 512-column blocks through y (exact f32), so an x row's result depends
 * on its own values only (batch invariance). One TDPBF16PS (16 x 16 outputs, 32 columns) took
 * 6 ns on the GPU machine's Xeon where a vdpbf16ps (16 outputs, 2 columns) took ~1 ns: ~40x the
 * products per second of the AVX512_BF16 kernels (bench/amx_probe.c measures both). Called only
 * when ci_cpu_amx_enabled() says the CPU and OS run AMX and the process may use its tile state. */
#include "backend/cpu/amx_tiles.h"
#include "backend/cpu/avx512_decode.h"

#include <string.h>

#define INLINE CI_AVX512_INLINE

enum {
  TILE = 16,                    /* rows (and f32 columns) of a tile */
  NR = CI_PAIR_PANEL_ROWS,      /* weight rows per panel: two tiles */
  KC = 2 * CI_BF16_PANEL_PAIRS, /* columns per panel */
  STAGE_FLOATS = TILE * TILE,   /* an output tile staged for partial stores */
  PANEL_WORDS = CI_BF16_PANEL_PAIRS * NR,
};
/* Tile registers (literal numbers: the intrinsics paste them into the instruction): C[i][j] =
 * 2 i + j for x tile i and weight tile j, then the x tiles and the weight tiles. */
#define T_C00 0
#define T_C01 1
#define T_C10 2
#define T_C11 3
#define T_X0 4
#define T_X1 5
#define T_W0 6
#define T_W1 7
_Static_assert(CI_AMX_GEMM_SCRATCH_FLOATS >= 2 * PANEL_WORDS + STAGE_FLOATS,
               "the per-thread scratch holds two panels and a staged tile");

/* Every tile used is 16 rows of 64 bytes: 16 f32 outputs, or 16 bf16 pairs. */
static void configure_tiles(void) {
  ci_amx_tile_config config = ci_amx_config_empty();
  for (int t = 0; t <= T_W1; t++) ci_amx_config_set(&config, t, TILE, 64);
  ci_amx_load_config(&config);
}

/* Where an output tile lives: straight in y (a whole 16 x 16 block), or in the stage with
 * `rows` x `cols` of it copied from and back to y. */
typedef struct {
  float *y;
  int64_t ldy;
  int rows, cols;
  float *stage;
} out_tile;

INLINE int out_is_whole(const out_tile *o) {
  return o->rows == TILE && o->cols == TILE;
}

/* The memory a tile loads its partial sums from: y, or the stage filled from y. */
INLINE const float *out_source(const out_tile *o) {
  if (out_is_whole(o)) return o->y;
  memset(o->stage, 0, STAGE_FLOATS * sizeof(float));
  for (int r = 0; r < o->rows; r++)
    memcpy(o->stage + r * TILE, o->y + r * o->ldy, (size_t)o->cols * sizeof(float));
  return o->stage;
}

/* Copies the valid part of a staged tile back to y. */
INLINE void out_finish(const out_tile *o) {
  if (out_is_whole(o)) return;
  for (int r = 0; r < o->rows; r++)
    memcpy(o->y + r * o->ldy, o->stage + r * TILE, (size_t)o->cols * sizeof(float));
}

INLINE int64_t out_stride(const out_tile *o) {
  return (out_is_whole(o) ? o->ldy : TILE) * (int64_t)sizeof(float);
}

/* Tile t from an output (zero when `first`: the block starts the chain). */
#define LOAD_OUT(t, o, first)                                                                      \
  do {                                                                                             \
    if (first)                                                                                     \
      _tile_zero(t);                                                                               \
    else                                                                                           \
      _tile_loadd(t, out_source(o), out_stride(o));                                                \
  } while (0)

/* Tile t to an output. */
#define STORE_OUT(t, o)                                                                            \
  do {                                                                                             \
    _tile_stored(t, out_is_whole(o) ? (o)->y : (o)->stage, out_stride(o));                         \
    out_finish(o);                                                                                 \
  } while (0)

/* y[i0 : i0 + 16 x_tiles, row : row + 32] (+)= x . panel over `steps` groups of 32 columns
 * starting at column c0: x_tiles (1 or 2) tiles of x against the panel's two weight tiles.
 * Outputs past m or past the task's rows are staged and dropped. Separate tile stages so that
 * C[i][j] uses each operand twice per step. */
static void multiply_panel(const ci_matmul_job *job, const uint32_t *panel, int64_t steps,
                           int64_t c0, int64_t i0, int x_tiles, int64_t row, int cols, float *stage,
                           int first) {
  const int64_t k = job->k, m = job->m;
  const uint16_t *x = job->x_bf16 + i0 * k + c0;
  const int64_t x_stride = k * (int64_t)sizeof(uint16_t);
  out_tile out[2][2];
  for (int i = 0; i < x_tiles; i++)
    for (int j = 0; j < 2; j++) {
      const int64_t rows_left = m - (i0 + TILE * i), cols_left = cols - TILE * j;
      out[i][j] = (out_tile){
          .y = job->y + (i0 + TILE * i) * job->n + row + TILE * j,
          .ldy = job->n,
          .rows = rows_left >= TILE ? TILE : (int)rows_left,
          .cols = cols_left >= TILE ? TILE
                  : cols_left > 0   ? (int)cols_left
                                    : 0,
          .stage = stage,
      };
    }
  if (x_tiles == 2) {
    LOAD_OUT(T_C00, &out[0][0], first);
    LOAD_OUT(T_C01, &out[0][1], first);
    LOAD_OUT(T_C10, &out[1][0], first);
    LOAD_OUT(T_C11, &out[1][1], first);
    for (int64_t s = 0; s < steps; s++) {
      _tile_loadd(T_X0, x + 32 * s, x_stride);
      _tile_loadd(T_X1, x + TILE * k + 32 * s, x_stride);
      _tile_loadd(T_W0, panel + s * TILE * NR, NR * sizeof(uint32_t));
      _tile_loadd(T_W1, panel + s * TILE * NR + TILE, NR * sizeof(uint32_t));
      _tile_dpbf16ps(T_C00, T_X0, T_W0);
      _tile_dpbf16ps(T_C01, T_X0, T_W1);
      _tile_dpbf16ps(T_C10, T_X1, T_W0);
      _tile_dpbf16ps(T_C11, T_X1, T_W1);
    }
    STORE_OUT(T_C00, &out[0][0]);
    STORE_OUT(T_C01, &out[0][1]);
    STORE_OUT(T_C10, &out[1][0]);
    STORE_OUT(T_C11, &out[1][1]);
    return;
  }
  LOAD_OUT(T_C00, &out[0][0], first);
  LOAD_OUT(T_C01, &out[0][1], first);
  for (int64_t s = 0; s < steps; s++) {
    _tile_loadd(T_X0, x + 32 * s, x_stride);
    _tile_loadd(T_W0, panel + s * TILE * NR, NR * sizeof(uint32_t));
    _tile_loadd(T_W1, panel + s * TILE * NR + TILE, NR * sizeof(uint32_t));
    _tile_dpbf16ps(T_C00, T_X0, T_W0);
    _tile_dpbf16ps(T_C01, T_X0, T_W1);
  }
  STORE_OUT(T_C00, &out[0][0]);
  STORE_OUT(T_C01, &out[0][1]);
}

/* Panel kernel template: for each block of KC columns, the task's rows 64 at a time as two
 * panels, each multiplied by every pair of x tiles. Needs k a multiple of 32 and x_bf16 padded
 * to a multiple of 16 rows (the dispatcher sees to both). */
INLINE void gemm_amx_rows(const ci_matmul_job *job, ci_weight_format f, int64_t row_begin,
                          int64_t row_end, float *scratch) {
  const int64_t k = job->k, m = job->m;
  uint32_t *panels[2] = {(uint32_t *)scratch, (uint32_t *)scratch + PANEL_WORDS};
  float *stage = scratch + 2 * PANEL_WORDS;
  configure_tiles();
  for (int64_t c0 = 0; c0 < k; c0 += KC) {
    const int64_t kc = k - c0 < KC ? k - c0 : KC;
    for (int64_t row = row_begin; row < row_end; row += 2 * NR) {
      const int64_t left = row_end - row;
      const int n_panels = left > NR ? 2 : 1;
      for (int p = 0; p < n_panels; p++)
        ci_pack_pair_panel(job, f, row + NR * p, c0, kc, panels[p]);
      for (int p = 0; p < n_panels; p++) {
        const int cols = left - NR * p >= NR ? NR : (int)(left - NR * p);
        for (int64_t i0 = 0; i0 < m; i0 += 2 * TILE)
          multiply_panel(job, panels[p], kc / 32, c0, i0, m - i0 > TILE ? 2 : 1, row + NR * p, cols,
                         stage, c0 == 0);
      }
    }
  }
  _tile_release();
}

#define DEFINE_GEMM(suffix, format)                                                                \
  static void gemm_amx_##suffix(const ci_matmul_job *job, int64_t row_begin, int64_t row_end,      \
                                float *scratch) {                                                  \
    gemm_amx_rows(job, format, row_begin, row_end, scratch);                                       \
  }

DEFINE_GEMM(bf16, CI_WF_BF16)
DEFINE_GEMM(q8_f32, CI_WF_Q8_F32)
DEFINE_GEMM(q8_f16, CI_WF_Q8_F16)
DEFINE_GEMM(q8_bf16, CI_WF_Q8_BF16)
DEFINE_GEMM(q4_f32, CI_WF_Q4_F32)
DEFINE_GEMM(q4_f16, CI_WF_Q4_F16)
DEFINE_GEMM(q4_bf16, CI_WF_Q4_BF16)

const ci_matmul_rows_fn ci_matmul_gemm_amx[CI_WF_COUNT] = {
    [CI_WF_BF16] = gemm_amx_bf16,       [CI_WF_Q8_F32] = gemm_amx_q8_f32,
    [CI_WF_Q8_F16] = gemm_amx_q8_f16,   [CI_WF_Q8_BF16] = gemm_amx_q8_bf16,
    [CI_WF_Q4_F32] = gemm_amx_q4_f32,   [CI_WF_Q4_F16] = gemm_amx_q4_f16,
    [CI_WF_Q4_BF16] = gemm_amx_q4_bf16,
};
