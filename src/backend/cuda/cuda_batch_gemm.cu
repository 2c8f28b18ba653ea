/* The batch matmul of MLX affine 8/4-bit weights: y[m, N] = x[m, K] @ W[N, K]^T on tensor cores
 * for more input rows than the small-batch kernel takes (cuda_gemv.cu) and up to
 * CI_CUDA_BATCH_ROWS (planes x rows), the weights dequantised in registers on their way into the
 * tensor cores. Before it these products dequantised each matrix into a bf16 copy for cuBLASLt:
 * two bytes a weight written and read back besides the codes (an 8B q8 decode step of 64
 * sequences took 18.6 ms; 13.1 ms with this kernel). Larger products (prefill, and 256 rows, where
 * cuBLASLt measured faster) keep that path.
 *
 * A block is four warps. Warp w owns CH consecutive 16-row tiles of W (the mma.sync m16n8k16 A
 * operand) and multiplies them with the block's tile of 8 NT input rows (the B operand, n8 tiles),
 * so each dequantised A fragment feeds NT products. The block streams its tiles' codes (already in
 * fragment order, cuda_affine.cuh), their groups' (scale, bias) words and the input tile through
 * shared memory in stages of 64 columns (one code quad), AG_STAGES deep with cp.async; the codes of
 * the first stages are requested before the kernel waits for the one before it (weights never
 * depend on an earlier kernel, cuda_launch.cuh). Each matrix of a launch (q, k and v; gate and up)
 * has its own row groups; a block is one unit (row group, K segment, input tile), the input tiles
 * of a row group adjacent, so the blocks that read the same codes run together and all but the
 * first find them in L2.
 *
 * Bits: each output is one chain of m16n8k16 products over its K segment in order, from zero, the
 * weights made by ci_affine_fragment as every affine path makes them: exactly what cuBLASLt
 * computes from the dequantised matrix and what the small-batch kernel computes, so a row has the
 * same bits whichever path its step takes (test_batch_kernel). K segments (ci_cuda_k_segment) and
 * exact mode's two input planes write partial products that ci_cuda_segment_sum adds in the order
 * the other paths add them.
 *
 * Measured (H100, 8B geometry, decode steps at 128 tokens of context, tok/s, cuBLASLt path ->
 * this kernel): q4 64 sequences 3,610 -> 6,847, 128: 6,453 -> 7,912, 256: 10,504 -> 9,546; q8
 * 64: 3,448 -> 4,887, 128: 6,290 -> 6,603, 256: 10,218 -> 8,907; exact mode (two planes) q8 16:
 * 894 -> 1,198, 64: 3,222 -> 3,601. It is far from the bandwidth bound (weights-only 8B q8 step at
 * 64 rows 9.5 ms, the codes alone 2.7 ms at 3 TB/s): each block re-reads the input tile from L2
 * for 128 weight rows (as many bytes as the q8 codes) and one 64-column stage feeds only four
 * k-steps a barrier. The same kernel with bf16 weights ran at half of cuBLASLt's speed (1B bf16,
 * 16-128 rows: the 1B's narrow matrices leave most SMs without a block) and was not kept. */
#include "backend/cuda/cuda_affine.cuh"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_param_pick.cuh"

#include <limits.h>
#include <string.h>

enum {
  AG_WARPS = 4,
  AG_STAGES = 4,
  AG_KC = CI_AFFINE_QUAD_COLS, /* columns a stage: one quad of every tile */
  AG_X_STRIDE = AG_KC + 8,     /* bf16 elements between input rows in shared memory (16 bytes
                                  of padding: ldmatrix rows fall in distinct banks) */
  AG_MAX_GROUPS = AG_KC / 32,  /* (scale, bias) groups a stage of a tile spans at most */
  AG_MAX_PARTS = CI_CUDA_GEMV_MAX_PARTS
};

/* The matrices of one launch (they share the input, the format and the K segments): part p owns
 * row groups [end[p - 1], end[p]) of AG_WARPS * CH tiles each. */
typedef struct {
  const uint8_t *codes[AG_MAX_PARTS];
  const uint32_t *pairs[AG_MAX_PARTS];
  float *out[AG_MAX_PARTS]; /* y, or with partials the part's [segs][rows][n] floats */
  int n[AG_MAX_PARTS];
  int end[AG_MAX_PARTS]; /* unused parts: INT_MAX */
  int segs, seg_cols;    /* K segments: seg_cols columns each, the last the rest of K */
  int partial;           /* 1: out holds partials (segments or two planes), 0: y */
  int quads, groups;     /* code quads and (scale, bias) groups a row */
  int gshift;            /* log2 of the group size */
} ag_parts;

/* Bytes of one stage of a block: codes [tiles][quad bytes], pairs [tiles][AG_MAX_GROUPS][16]
 * words, inputs [8 NT][AG_X_STRIDE] bf16. */
static constexpr size_t ag_stage_bytes(int bits, int ch, int nt) {
  return (size_t)AG_WARPS * ch * (128 * bits + AG_MAX_GROUPS * 64) +
         (size_t)8 * nt * AG_X_STRIDE * 2;
}

template <int BITS, bool F16, int CH, int NT>
__global__ static void __launch_bounds__(32 * AG_WARPS)
    batch_gemm_kernel(const ag_parts P, const __nv_bfloat16 *__restrict__ x, int k, int rows,
                      int input_tiles) {
  constexpr int TILES = AG_WARPS * CH, TN = 8 * NT, QB = 128 * BITS;
  constexpr int CODE_BYTES = TILES * QB, PAIR_WORDS = TILES * AG_MAX_GROUPS * 16;
  constexpr size_t STAGE = ag_stage_bytes(BITS, CH, NT);
  extern __shared__ __align__(16) uint8_t smem[];

  const int unit = blockIdx.x;
  const int input_tile = unit % input_tiles, seg = (unit / input_tiles) % P.segs;
  const int group = unit / input_tiles / P.segs;
  int part = 0;
#pragma unroll
  for (int p = 0; p < AG_MAX_PARTS - 1; p++) part += group >= P.end[p];
  const int group0 = part ? ci_param_pick(P.end, part - 1) : 0;
  const int n = ci_param_pick(P.n, part), part_tiles = (n + 15) / 16;
  const int tile0 = (group - group0) * TILES;
  const uint8_t *codes = ci_param_pick(P.codes, part);
  const uint32_t *pairs = ci_param_pick(P.pairs, part);
  const int k0 = seg * P.seg_cols, k1 = min(k, k0 + P.seg_cols), stages = (k1 - k0) / AG_KC;
  const int row0 = input_tile * TN;
  const int gshift = P.gshift, groups_in_stage = AG_KC >> gshift ? AG_KC >> gshift : 1;

  /* the codes and (scale, bias) words of stage s of the segment into ring slot `slot` */
  auto load_weights = [&](int slot, int s) {
    uint8_t *dst = smem + (size_t)slot * STAGE;
    uint32_t *pair_dst = (uint32_t *)(dst + CODE_BYTES);
    const int col = k0 + s * AG_KC, quad = col / AG_KC, g0 = col >> gshift;
    for (int i = threadIdx.x; i < CODE_BYTES / 16; i += 32 * AG_WARPS) {
      const int t = i / (QB / 16), tile = tile0 + t;
      if (tile < part_tiles)
        cp_async16_stream(dst + i * 16,
                          codes + ((size_t)tile * P.quads + quad) * QB + (i % (QB / 16)) * 16);
    }
    const int chunks = groups_in_stage * 4; /* 16-byte chunks of a tile's words */
    for (int i = threadIdx.x; i < TILES * chunks; i += 32 * AG_WARPS) {
      const int t = i / chunks, c = i % chunks, tile = tile0 + t;
      if (tile < part_tiles)
        cp_async16_stream(pair_dst + t * AG_MAX_GROUPS * 16 + c * 4,
                          pairs + ((size_t)tile * P.groups + g0) * 16 + c * 4);
    }
  };
  /* the input rows' columns of stage s (rows past the last repeat it: their products are never
   * stored) */
  auto load_inputs = [&](int slot, int s) {
    __nv_bfloat16 *dst =
        (__nv_bfloat16 *)(smem + (size_t)slot * STAGE + CODE_BYTES + PAIR_WORDS * sizeof(uint32_t));
    const int col = k0 + s * AG_KC;
    for (int i = threadIdx.x; i < TN * (AG_KC / 8); i += 32 * AG_WARPS) {
      const int r = i / (AG_KC / 8), c = i % (AG_KC / 8), src = min(row0 + r, rows - 1);
      cp_async16_stream(dst + r * AG_X_STRIDE + c * 8, x + (size_t)src * k + col + c * 8);
    }
  };

  for (int s = 0; s < AG_STAGES - 1; s++)
    if (s < stages) load_weights(s, s);
  ci_grid_begin();
  for (int s = 0; s < AG_STAGES - 1; s++) {
    if (s < stages) load_inputs(s, s);
    cp_async_commit();
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const bool busy = tile0 + warp * CH < part_tiles; /* the warp has a tile of the matrix */
  float acc[CH][NT][4];
#pragma unroll
  for (int c = 0; c < CH; c++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[c][j][e] = 0.0f;

  for (int s = 0; s < stages; s++) {
    cp_async_wait<AG_STAGES - 2>();
    __syncthreads();
    const int next = s + AG_STAGES - 1;
    if (next < stages) {
      load_weights(next % AG_STAGES, next);
      load_inputs(next % AG_STAGES, next);
    }
    cp_async_commit();
    if (!busy) continue;
    const uint8_t *stage = smem + (size_t)(s % AG_STAGES) * STAGE;
    const uint32_t *stage_pairs = (const uint32_t *)(stage + CODE_BYTES);
    const __nv_bfloat16 *xs =
        (const __nv_bfloat16 *)(stage + CODE_BYTES + PAIR_WORDS * sizeof(uint32_t));
    const int col = k0 + s * AG_KC, g0 = col >> gshift;
    uint4 lane_codes[CH][BITS / 4]; /* the lane's 16 bytes of each tile's quad (q8: two halves) */
#pragma unroll
    for (int c = 0; c < CH; c++)
#pragma unroll
      for (int h = 0; h < BITS / 4; h++)
        lane_codes[c][h] = *(const uint4 *)(stage + (warp * CH + c) * QB + h * 512 + lane * 16);
#pragma unroll
    for (int step = 0; step < 4; step++) {
      const int gi = ((col + 16 * step) >> gshift) - g0;
      uint32_t a[CH][4];
#pragma unroll
      for (int c = 0; c < CH; c++) {
        const uint32_t *pw = stage_pairs + ((warp * CH + c) * AG_MAX_GROUPS + gi) * 16;
        const ci_affine_rows rw = ci_affine_rows_of<BITS>(pw[g], pw[g + 8], F16);
        const uint4 &q = lane_codes[c][BITS == 8 ? step / 2 : 0];
        uint32_t words[2];
        if (BITS == 4) {
          words[0] = step == 0 ? q.x : step == 1 ? q.y : step == 2 ? q.z : q.w;
          words[1] = 0u;
        } else {
          words[0] = step % 2 ? q.z : q.x;
          words[1] = step % 2 ? q.w : q.y;
        }
        ci_affine_fragment<BITS>(words, rw, F16, a[c]);
      }
#pragma unroll
      for (int j = 0; j < NT / 2; j++) {
        uint32_t b[4];
        ldmatrix_x4(b, xs + (16 * j + (lane / 16) * 8 + lane % 8) * AG_X_STRIDE + 16 * step +
                           ((lane / 8) % 2) * 8);
#pragma unroll
        for (int c = 0; c < CH; c++) {
          mma_bf16(acc[c][2 * j], a[c], b[0], b[1]);
          mma_bf16(acc[c][2 * j + 1], a[c], b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait<0>();
  if (!busy) return;

  float *out = ci_param_pick(P.out, part) + (P.partial ? (size_t)seg * rows * n : 0);
#pragma unroll
  for (int c = 0; c < CH; c++) {
    const int r = (tile0 + warp * CH + c) * 16 + g;
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int row = row0 + 8 * j + 2 * t + e;
        if (row >= rows) continue;
        if (r < n) out[(size_t)row * n + r] = acc[c][j][e];
        if (r + 8 < n) out[(size_t)row * n + r + 8] = acc[c][j][2 + e];
      }
  }
}

template <int BITS, bool F16, int CH, int NT> static cudaError_t ag_set_limit() {
  return cudaFuncSetAttribute(batch_gemm_kernel<BITS, F16, CH, NT>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                              (int)(AG_STAGES * ag_stage_bytes(BITS, CH, NT)));
}

template <int BITS, bool F16> static cudaError_t ag_set_limits() {
  cudaError_t err = ag_set_limit<BITS, F16, 1, 4>();
  if (err == cudaSuccess) err = ag_set_limit<BITS, F16, 1, 8>();
  if (err == cudaSuccess) err = ag_set_limit<BITS, F16, 2, 4>();
  if (err == cudaSuccess) err = ag_set_limit<BITS, F16, 2, 8>();
  return err;
}

int ci_cuda_batch_gemm_init(ci_cuda *cu) {
  /* CINFER_CUDA_BATCH_ROWS=N: the most input rows (planes x rows) the kernel takes, 0: none (every
   * product above the small-batch kernel's rows dequantises the weights for cuBLASLt), for
   * measuring */
  const char *env = getenv("CINFER_CUDA_BATCH_ROWS");
  cu->batch_rows = env ? atoi(env) : CI_CUDA_BATCH_ROWS;
  cudaError_t err = ag_set_limits<4, false>();
  if (err == cudaSuccess) err = ag_set_limits<4, true>();
  if (err == cudaSuccess) err = ag_set_limits<8, false>();
  if (err == cudaSuccess) err = ag_set_limits<8, true>();
  return err == cudaSuccess ? CI_OK
                            : ci_fail("CUDA: batch matmul setup: %s", cudaGetErrorString(err));
}

int ci_cuda_batch_gemm_fits(const ci_cuda *cu, int dtype, int group_size, int64_t k, int64_t rows) {
  return (dtype == CI_Q4 || dtype == CI_Q8) && group_size >= 32 && rows >= 1 &&
         rows <= cu->batch_rows && k % AG_KC == 0 && k <= ((int64_t)1 << 24) &&
         rows * k < ((int64_t)1 << 31);
}

template <int BITS, bool F16, int CH, int NT>
static void ag_launch_at(ci_cuda *cu, const ag_parts &P, int units, int64_t k,
                         const __nv_bfloat16 *x, int64_t rows, int input_tiles) {
  ci_launch(cu, batch_gemm_kernel<BITS, F16, CH, NT>, dim3((unsigned)units), 32 * AG_WARPS,
            AG_STAGES * ag_stage_bytes(BITS, CH, NT), P, x, (int)k, (int)rows, input_tiles);
}

/* Two tiles a warp where that still gives every SM two blocks; 32 input rows a block up to 32,
 * 64 above. No choice changes a bit of the result. */
template <int BITS, bool F16>
static void ag_launch(ci_cuda *cu, ag_parts P, int parts, const int64_t *n, int64_t k,
                      const __nv_bfloat16 *x, int64_t rows) {
  const int nt = rows <= 32 ? 4 : 8, input_tiles = (int)((rows + 8 * nt - 1) / (8 * nt));
  int64_t tiles_ch2 = 0;
  for (int p = 0; p < parts; p++) tiles_ch2 += (n[p] + 16 * AG_WARPS * 2 - 1) / (16 * AG_WARPS * 2);
  const int ch = tiles_ch2 * P.segs * input_tiles >= 2 * (int64_t)cu->n_sms ? 2 : 1;
  int groups = 0;
  for (int p = 0; p < AG_MAX_PARTS; p++) {
    groups += p < parts ? (int)((n[p] + 16 * AG_WARPS * ch - 1) / (16 * AG_WARPS * ch)) : 0;
    P.end[p] = p < parts ? groups : INT_MAX;
  }
  const int units = groups * P.segs * input_tiles;
  if (ch == 2)
    nt == 8 ? ag_launch_at<BITS, F16, 2, 8>(cu, P, units, k, x, rows, input_tiles)
            : ag_launch_at<BITS, F16, 2, 4>(cu, P, units, k, x, rows, input_tiles);
  else
    nt == 8 ? ag_launch_at<BITS, F16, 1, 8>(cu, P, units, k, x, rows, input_tiles)
            : ag_launch_at<BITS, F16, 1, 4>(cu, P, units, k, x, rows, input_tiles);
}

void ci_cuda_batch_gemm_launch(ci_cuda *cu, int parts, const ci_cuda_weight *w, const int64_t *n,
                               float *const *out, int partial, int64_t k, const void *x,
                               int64_t rows, int64_t seg_cols) {
  ag_parts P;
  memset(&P, 0, sizeof P);
  for (int p = 0; p < parts; p++) {
    P.codes[p] = (const uint8_t *)w[p].data;
    P.pairs[p] = (const uint32_t *)w[p].pairs;
    P.out[p] = out[p];
    P.n[p] = (int)n[p];
  }
  P.segs = (int)((k + seg_cols - 1) / seg_cols);
  P.seg_cols = (int)seg_cols;
  P.partial = partial;
  P.quads = (int)ci_affine_quads(k);
  P.groups = (int)(k / w[0].group_size);
  P.gshift = __builtin_ctz((unsigned)w[0].group_size);
  const __nv_bfloat16 *xb = (const __nv_bfloat16 *)x;
  const bool f16 = w[0].f16_pairs;
  if (w[0].dtype == CI_Q4)
    f16 ? ag_launch<4, true>(cu, P, parts, n, k, xb, rows)
        : ag_launch<4, false>(cu, P, parts, n, k, xb, rows);
  else
    f16 ? ag_launch<8, true>(cu, P, parts, n, k, xb, rows)
        : ag_launch<8, false>(cu, P, parts, n, k, xb, rows);
  ci_cuda_check_launch(cu, "matmul (batch kernel)");
}
