/* Internal contract between the matmul dispatcher (matmul.c) and the per-ISA kernel files:
 * the description of one matmul call, the weight-format index kernels are specialised on, and
 * each ISA's table of kernels. Nothing outside src/backend/cpu/ includes this. */
#ifndef CI_BACKEND_CPU_KERNELS_IMPL_H
#define CI_BACKEND_CPU_KERNELS_IMPL_H

#include "backend/cpu/kernels.h"

#include <stddef.h>
#include <stdint.h>

/* A weight format: the element dtype and, for the MLX affine formats, the dtype of the
 * scales and biases. Kernels are instantiated once per format. */
typedef enum {
  CI_WF_F32,
  CI_WF_F16,
  CI_WF_BF16,
  CI_WF_Q8_F32,
  CI_WF_Q8_F16,
  CI_WF_Q8_BF16,
  CI_WF_Q4_F32,
  CI_WF_Q4_F16,
  CI_WF_Q4_BF16,
  CI_WF_COUNT
} ci_weight_format;

/* One matmul call, y[m, n] = x[m, k] @ W[n, k]^T, as the kernels see it. Read-only while the
 * job runs; every task writes a disjoint set of y columns. */
typedef struct {
  ci_weight_format format;
  int64_t n;                  /* rows of W (outputs) */
  int64_t k;                  /* columns of W (inputs) */
  const void *w;              /* elements, or packed codes (row stride k*bits/32 words) */
  const void *scales;         /* [n, k/group] (affine formats) */
  const void *biases;         /* [n, k/group] (affine formats) */
  int group;                  /* group size (affine formats) */
  int64_t m;                  /* rows of x and y */
  const float *x;             /* [m, k]; for the affine formats in the row kernels' order
                                 (see word_lanes in ci_matmul_kernels) */
  const float *x_group_sums;  /* [m, k/group] sum of each group of x (affine formats, row
                                 kernels only) */
  const float *x_packed;      /* panel kernels: x in panels of gemm_mr rows, [m/mr][k][mr],
                                 natural column order, rows past m zero */
  const int8_t *x_planes;     /* int8 row kernels: x as planes, see CI_X_PLANE_BLOCK_Q8 */
  int x_plane_count;          /* planes of x_planes in use: 3 (exact) or the first 2 (fast) */
  int64_t x_plane_stride;     /* bytes per x row of x_planes */
  const float *x_plane_units; /* [m, k/group]: the value of one unit of the planes (or of x16) */
  const int16_t *x16;         /* 16-bit row kernels: x as int16 per group, see quantize_x16 */
  int64_t x16_stride;         /* elements per x row of x16 (a multiple of 32) */
  const uint16_t *x_bf16;     /* bf16-dot row kernels: x rounded to bf16, [m, k] */
  const uint32_t *x_pairs;    /* bf16-dot panel kernels: x rounded to bf16 in panels of gemm_mr
                                 rows of column pairs, [m/mr][ceil(k/2)][mr] (low half: the even
                                 column), rows past m and a last odd column's partner zero */
  float *y;                   /* [m, n] */
} ci_matmul_job;

/* Int8 x planes (the AVX-512 VNNI row kernels of the affine formats). Fast precision writes and
 * reads only the first two planes, x ~ u_g (256 h + m) (16-bit fixed point), or only the first,
 * x ~ u_g h with u_g = max|x_g| / 127 (one int8 per element, as llama.cpp's Q8 activations),
 * u_g scaled to match. Each group g of each x
 * row is written in 24-bit fixed point relative to its largest element, as three int8 planes:
 * x[c] ~ u_g * (65536 h[c] + 256 m[c] + l[c]) with u_g = max|x_g| / 127 / 65536 (0 for an
 * all-zero group; NaN when the group holds an Inf or NaN), h in [-127, 127], m and l in
 * [-128, 127]: the error is at most 65536 u_g / 131072 per element. (16 bits, h and l only, is
 * not enough: the q4/q8 parity fixtures then drift by 4e-3 in the logits.) The planes are laid
 * out in blocks matching 64 bytes of packed codes, CI_X_PLANE_BLOCK_Q8/Q4 bytes each, one
 * third per plane in the order h, m, l: for 8-bit codes (64 columns) each plane is the 64
 * columns in order; for 4-bit codes (128 columns) it is the even columns (low nibbles), then
 * the odd columns (high nibbles). A row has ceil(k / columns per block) blocks; columns past k
 * are 0. */
enum { CI_X_PLANE_BLOCK_Q8 = 192, CI_X_PLANE_BLOCK_Q4 = 384 };

/* Computes y[:, row_begin:row_end] for every x row. For the panel kernels, scratch holds the
 * table's scratch_floats floats, private to the calling thread, 64-byte aligned; the row
 * kernels get NULL. */
typedef void (*ci_matmul_rows_fn)(const ci_matmul_job *job, int64_t row_begin, int64_t row_end,
                                  float *scratch);

/* One ISA's matmul kernels. */
typedef struct {
  /* Row-at-a-time kernels for small m: each block of weight rows is decoded once and reused
   * for every x row. */
  ci_matmul_rows_fn gemv[CI_WF_COUNT];
  /* Panel kernels for large m (NULL where absent): W is decoded panel by panel into f32 scratch
   * and multiplied by register-blocked tiles of x. */
  ci_matmul_rows_fn gemm[CI_WF_COUNT];
  int64_t gemm_min_m[CI_WF_COUNT]; /* use gemm when m >= this */
  int gemm_mr;                     /* x rows per panel of x_packed */
  int gemm_nr;                     /* row chunks handed to gemm are multiples of this */
  size_t scratch_floats; /* per-thread scratch the gemm kernels need (row kernels: none) */
  /* Affine formats, row kernels: 0 if they read x in natural order, else the number of
   * 32-bit code words they decode side by side in one vector ("word-lane order"): within
   * each block of lanes*E columns (E = 32/bits codes per word; a last, partial block has
   * fewer lanes), code t of word j sits at block offset lanes*t + j, and for t < E-1 is
   * multiplied by 2^-(bits*t) (exact) so that a code masked in place (q * 2^(bits*t)) needs
   * no shift. */
  int word_lanes;
  /* Row kernels of the affine formats reading x_planes instead of x (NULL where absent); used
   * instead of gemv when ci_cpu_int8_matmul_enabled() says the CPU can run them. */
  const ci_matmul_rows_fn *gemv_int8;
  /* Writes x [m, k] as int8 planes (row stride `stride` bytes, zero-padded, see
   * CI_X_PLANE_BLOCK_Q8) and their units [m, k/group] for `bits`-bit codes; with gemv_int8. */
  void (*quantize_x_planes)(int8_t *planes, float *units, const float *x, int64_t m, int64_t k,
                            int group, int bits, int64_t stride, int n_planes);
  /* Fast precision's row kernels of the affine formats for CPUs without gemv_int8 (NULL where
   * absent; used when ci_cpu_x16_matmul_enabled()): they read x16, written by quantize_x16, and
   * x_plane_units. Each group g of each x row is one int16 per element, t = round(x / u_g) with
   * u_g = max|x_g| / 127 / 256 (|t| <= 32512; the grid the f32 row kernels are given in fast
   * precision without these kernels), u_g 0 for an all-zero group and NaN for one holding Inf or
   * NaN (its t 0); in column order for 8-bit codes, and for 4-bit codes per 32 columns the 16
   * even ones (the low nibbles) before the 16 odd ones. Rows are `stride` elements apart, x16
   * 32-byte aligned. */
  const ci_matmul_rows_fn *gemv_x16;
  void (*quantize_x16)(int16_t *x16, float *units, const float *x, int64_t m, int64_t k, int group,
                       int bits, int64_t stride);
  /* Fast precision with bf16 dot products (AVX512_BF16 vdpbf16ps; NULL where absent, used when
   * ci_cpu_bf16_dot_enabled()): row kernels reading x_bf16 (indexed by format, NULL for formats
   * without one) and panel kernels reading x_pairs, which decode W to bf16 column pairs. Same
   * gemm_mr, gemm_nr, gemm_min_m and scratch as the f32 panel kernels. */
  const ci_matmul_rows_fn *gemv_bf16_dot;
  const ci_matmul_rows_fn *gemm_bf16_dot;
  /* Fast precision with AMX-BF16 tile products (NULL where absent, used for panels instead of
   * gemm_bf16_dot when ci_cpu_amx_enabled() and k is a multiple of 32): panel kernels reading
   * x_bf16 with its rows padded to a multiple of 16 (zeros), decoding W as gemm_bf16_dot does.
   * Same gemm_nr and gemm_min_m; scratch_floats >= CI_AMX_GEMM_SCRATCH_FLOATS. */
  const ci_matmul_rows_fn *gemm_amx;
} ci_matmul_kernels;

/* Each ISA's kernel tables: static and immutable, safe to share between threads. The SIMD
 * ones may only be called when ci_isa_supported says so. */
const ci_matmul_kernels *ci_matmul_kernels_ref(void);
const ci_matmul_kernels *ci_matmul_kernels_avx2(void);
const ci_matmul_kernels *ci_matmul_kernels_avx512(void);

/* The AVX-512 VNNI int8-plane row kernels, indexed by weight format (NULL for float formats),
 * and their activation quantizer (see ci_matmul_kernels.quantize_x_planes). */
extern const ci_matmul_rows_fn ci_matmul_gemv_int8_avx512_vnni[CI_WF_COUNT];
void ci_quantize_x_planes_avx512(int8_t *planes, float *units, const float *x, int64_t m, int64_t k,
                                 int group, int bits, int64_t stride, int n_planes);

/* The AVX2 16-bit row kernels of fast precision and their quantizer (see
 * ci_matmul_kernels.gemv_x16). */
extern const ci_matmul_rows_fn ci_matmul_gemv_x16_avx2[CI_WF_COUNT];
void ci_quantize_x16_avx2(int16_t *x16, float *units, const float *x, int64_t m, int64_t k,
                          int group, int bits, int64_t stride);

/* The AVX512_BF16 kernels of fast precision (see ci_matmul_kernels.gemv_bf16_dot). The panel
 * kernels decode two panels of CI_BF16_PANEL_PAIRS column pairs by 32 rows into the per-thread
 * scratch: the table's scratch_floats must hold CI_BF16_GEMM_SCRATCH_WORDS. */
enum { CI_BF16_PANEL_PAIRS = 256, CI_BF16_GEMM_SCRATCH_WORDS = 2 * CI_BF16_PANEL_PAIRS * 32 };
extern const ci_matmul_rows_fn ci_matmul_gemv_bf16_dot_avx512[CI_WF_COUNT];
extern const ci_matmul_rows_fn ci_matmul_gemm_bf16_dot_avx512[CI_WF_COUNT];

/* The AMX-BF16 panel kernels (see ci_matmul_kernels.gemm_amx): two bf16 pair panels and a
 * staged 16 x 16 output tile per thread. */
enum { CI_AMX_GEMM_SCRATCH_FLOATS = CI_BF16_GEMM_SCRATCH_WORDS + 256 };
extern const ci_matmul_rows_fn ci_matmul_gemm_amx[CI_WF_COUNT];

/* 1 when the CPU runs AVX512_BF16 and AMX-BF16, the OS has granted this process the AMX tile
 * state, and the environment variable CINFER_AMX is not "0": fast precision's panel kernels may
 * then use tile products. */
int ci_cpu_amx_enabled(void);

/* 1 when the CPU runs AVX-512 with AVX512_BF16 and the environment variable CINFER_BF16 is not
 * "0": fast precision may then use the bf16 dot-product kernels. */
int ci_cpu_bf16_dot_enabled(void);

/* 1 when the CPU runs AVX-512 with AVX512_VNNI and the environment variable CINFER_INT8 is not
 * "0": the affine row kernels may then use int8 x planes. */
int ci_cpu_int8_matmul_enabled(void);

/* 1 when the CPU runs AVX2 and the environment variable CINFER_INT8 is not "0": fast precision's
 * affine row kernels may then use 16-bit x (ci_matmul_kernels.gemv_x16). */
int ci_cpu_x16_matmul_enabled(void);

const ci_cpu_vec_kernels *ci_vec_kernels_ref(void);
const ci_cpu_vec_kernels *ci_vec_kernels_avx2(void);
const ci_cpu_vec_kernels *ci_vec_kernels_avx512(void);

/* ==== Helpers shared by the kernel files ==== */

/* The weight format of (element dtype, scale dtype); -1 when unsupported. */
static inline int ci_weight_format_of(ci_dtype dtype, ci_dtype scale_dtype) {
  int scale_index = scale_dtype == CI_F32    ? 0
                    : scale_dtype == CI_F16  ? 1
                    : scale_dtype == CI_BF16 ? 2
                                             : -1;
  switch (dtype) {
  case CI_F32:
    return CI_WF_F32;
  case CI_F16:
    return CI_WF_F16;
  case CI_BF16:
    return CI_WF_BF16;
  case CI_Q8:
    return scale_index < 0 ? -1 : CI_WF_Q8_F32 + scale_index;
  case CI_Q4:
    return scale_index < 0 ? -1 : CI_WF_Q4_F32 + scale_index;
  default:
    return -1;
  }
}

/* Element dtype of a weight format. */
static inline ci_dtype ci_weight_format_dtype(ci_weight_format f) {
  static const ci_dtype element[CI_WF_COUNT] = {CI_F32, CI_F16, CI_BF16, CI_Q8, CI_Q8,
                                                CI_Q8,  CI_Q4,  CI_Q4,   CI_Q4};
  return element[f];
}

/* Dtype of the scales and biases of an affine weight format (F32 for the float formats). */
static inline ci_dtype ci_weight_format_scale_dtype(ci_weight_format f) {
  static const ci_dtype scale[CI_WF_COUNT] = {CI_F32,  CI_F32, CI_F32, CI_F32, CI_F16,
                                              CI_BF16, CI_F32, CI_F16, CI_BF16};
  return scale[f];
}

#endif
