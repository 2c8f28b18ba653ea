/* The batch matmul of MLX affine 8/4-bit weights: y[m, N] = x[m, K] @ W[N, K]^T on tensor cores
 * for more input rows than the small-batch kernel takes (cuda_gemv.cu) and up to
 * CI_CUDA_BATCH_ROWS (planes x rows), the weights dequantised on chip (registers, then a shared
 * fragment buffer) on their way into the tensor cores. Before it these products dequantised each
 * matrix into a bf16 copy for cuBLASLt: two bytes a weight written and read back besides the
 * codes (an 8B q8 decode step of 64 sequences takes 18.4 ms that way, 10.8 ms with this kernel).
 * Larger products (prefill, and 256 rows, where cuBLASLt measured faster) keep that path.
 *
 * A block is eight warps over TILES (4 or 8) 16-row tiles of W (the mma.sync m16n8k16 A operand)
 * and a tile of 8 NT input rows (NT n8 tiles of the B operand). The block streams its tiles' codes
 * (already in fragment order, cuda_affine.cuh), their groups' (scale, bias) words and the input
 * tile through shared memory in stages of 64 columns (one code quad), AG_STAGES deep with
 * cp.async, each thread's copy sources worked out once and stepped by constant strides; the codes
 * of the first stages are requested before the kernel waits for the one before it (weights never
 * depend on an earlier kernel, cuda_launch.cuh). Each stage's TILES x 4 A fragments are
 * dequantised once, each by one warp (ci_affine_fragment, the function every affine path uses),
 * into a shared buffer one stage ahead of their use, so a stage needs one barrier; then warp w
 * multiplies tile w % TILES by its share of the input tile's n8 tiles. Each matrix of a launch
 * (q, k and v; gate and up) has its own row groups; a block is one unit (row group, K segment,
 * input tile), the input tiles of a row group adjacent, so the blocks that read the same codes
 * run together and all but the first find them in L2.
 *
 * Bits: each output is one chain of m16n8k16 products over its K segment in order, from zero, the
 * weights made by ci_affine_fragment as every affine path makes them: exactly what cuBLASLt
 * computes from the dequantised matrix and what the small-batch kernel computes, so a row has the
 * same bits whichever path its step takes (test_batch_kernel). K segments (ci_cuda_k_segment) and
 * exact mode's two input planes write partial products that ci_cuda_segment_sum adds in the order
 * the other paths add them.
 *
 * Measured (H100, 8B geometry, decode steps at 128 tokens of context, fast mode unless said,
 * tok/s, cuBLASLt path -> this kernel, one run): q8 64 sequences 3,477 -> 5,924, 128: 6,267 ->
 * 7,019; q4 64: 3,626 -> 6,853, 128: 6,489 -> 8,243; exact mode (two planes) q8 16: 896 -> 1,518,
 * 64: 3,233 -> 4,105. The kernel's first form (four warps, each dequantising its own tiles for the
 * whole input tile, copy addresses recomputed every stage) reached q8 64 4,887 and exact 16
 * 1,198: at 64 rows its narrow launches gave an SM one block of four warps, a warp a scheduler
 * issuing once per 4 cycles (Nsight Compute, q8 at 64 rows, first form -> this one: q|k|v 81.8 ->
 * 47.8 us, o 81.3 -> 32.3, gate|up 141.8 -> 118.6, down 139.8 -> 79.9). Still far from the bound
 * (the weights-only q8 step at 64 rows 8.1 ms, its codes 2.7 ms at 3 TB/s): a block issues ~1,450
 * warp instructions a 64-column stage, and re-reads the input tile from L2 for every 64 weight
 * rows. At 256 rows the first form lost to cuBLASLt (q4 10,504 -> 9,546, q8 10,218 -> 8,907), so
 * the kernel takes up to 128 rows. The first form with bf16 weights ran at half of cuBLASLt's
 * speed (1B bf16, 16-128 rows: its narrow matrices leave most SMs without a block) and was not
 * kept. */
#include "backend/cuda/cuda_affine.cuh"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_param_pick.cuh"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  AG_WARPS = 8,
  AG_STAGES = 4,
  AG_KC = CI_AFFINE_QUAD_COLS, /* columns a stage: one quad of every tile */
  AG_X_STRIDE = AG_KC + 8,     /* bf16 elements between input rows in shared memory (16 bytes
                                  of padding: ldmatrix rows fall in distinct banks) */
  AG_MAX_GROUPS = AG_KC / 32,  /* (scale, bias) groups a stage of a tile spans at most */
  AG_MAX_PARTS = CI_CUDA_GEMV_MAX_PARTS
};

/* The matrices of one launch (they share the input, the format and the K segments): part p owns
 * row groups [end[p - 1], end[p]) of TILES tiles each. */
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
static constexpr size_t ag_stage_bytes(int bits, int tiles, int nt) {
  return (size_t)tiles * (128 * bits + AG_MAX_GROUPS * 64) + (size_t)8 * nt * AG_X_STRIDE * 2;
}
/* A block's shared memory: the stage ring, then two buffers of a stage's dequantised A fragments
 * ([tiles][4 k-steps][32 lanes] x 16 bytes each). */
static constexpr size_t ag_smem_bytes(int bits, int tiles, int nt) {
  return AG_STAGES * ag_stage_bytes(bits, tiles, nt) + (size_t)2 * tiles * 4 * 512;
}

template <int BITS, bool F16, int TILES, int NT>
__global__ static void __launch_bounds__(32 * AG_WARPS)
    batch_gemm_kernel(const ag_parts P, const __nv_bfloat16 *__restrict__ x, int k, int rows,
                      int input_tiles) {
  constexpr int THREADS = 32 * AG_WARPS, TN = 8 * NT, QB = 128 * BITS;
  constexpr int CODE_BYTES = TILES * QB, PAIR_WORDS = TILES * AG_MAX_GROUPS * 16;
  constexpr size_t STAGE = ag_stage_bytes(BITS, TILES, NT);
  constexpr int FRAGS = TILES * 4;             /* A fragments a stage: 4 k-steps of each tile */
  constexpr int WARP_FRAGS = FRAGS / AG_WARPS; /* ... that each warp dequantises */
  constexpr int WN = NT * TILES / AG_WARPS;    /* n8 tiles of a warp's products */
  constexpr int CODE_CHUNKS = CODE_BYTES / 16, X_CHUNKS = TN * (AG_KC / 8);
  constexpr int CODE_COPIES = (CODE_CHUNKS + THREADS - 1) / THREADS, X_COPIES = X_CHUNKS / THREADS;
  static_assert(FRAGS % AG_WARPS == 0 && WN % 2 == 0 && X_CHUNKS % THREADS == 0 &&
                    TILES * AG_MAX_GROUPS * 4 <= THREADS,
                "block shape");
  extern __shared__ __align__(16) uint8_t smem[];
  uint4 *const fragments = (uint4 *)(smem + AG_STAGES * STAGE); /* [2][FRAGS][32] */

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
  const int tid = threadIdx.x;

  /* each thread's copies, their sources at the segment's first stage (a stage steps them by
   * constant strides): code chunks, one (scale, bias) chunk, input chunks */
  const uint8_t *code_src[CODE_COPIES];
  bool code_live[CODE_COPIES];
#pragma unroll
  for (int c = 0; c < CODE_COPIES; c++) {
    const int i = tid + c * THREADS, t = i / (QB / 16);
    code_live[c] = i < CODE_CHUNKS && tile0 + t < part_tiles;
    code_src[c] = codes + ((size_t)(tile0 + t) * P.quads + k0 / AG_KC) * QB + (i % (QB / 16)) * 16;
  }
  const int pair_chunks = groups_in_stage * 4; /* 16-byte chunks of a tile's words a stage */
  const int pair_t = tid / pair_chunks, pair_c = tid % pair_chunks;
  const bool pair_live = pair_t < TILES && tile0 + pair_t < part_tiles;
  const uint32_t *pair_src = pairs + (size_t)(tile0 + pair_t) * P.groups * 16 + pair_c * 4;
  const __nv_bfloat16 *x_src[X_COPIES];
#pragma unroll
  for (int c = 0; c < X_COPIES; c++) {
    const int i = tid + c * THREADS, r = i / (AG_KC / 8);
    x_src[c] = x + (size_t)min(row0 + r, rows - 1) * k + k0 + (i % (AG_KC / 8)) * 8;
  }

  /* the codes and (scale, bias) words of stage s of the segment into ring slot `slot` */
  auto load_weights = [&](int slot, int s) {
    uint8_t *dst = smem + (size_t)slot * STAGE;
#pragma unroll
    for (int c = 0; c < CODE_COPIES; c++)
      if (code_live[c]) cp_async16_stream(dst + (tid + c * THREADS) * 16, code_src[c] + s * QB);
    if (pair_live)
      cp_async16_stream((uint32_t *)(dst + CODE_BYTES) + pair_t * AG_MAX_GROUPS * 16 + pair_c * 4,
                        pair_src + (size_t)((k0 + s * AG_KC) >> gshift) * 16);
  };
  /* the input rows' columns of stage s (rows past the last repeat it: their products are never
   * stored) */
  auto load_inputs = [&](int slot, int s) {
    __nv_bfloat16 *dst =
        (__nv_bfloat16 *)(smem + (size_t)slot * STAGE + CODE_BYTES + PAIR_WORDS * sizeof(uint32_t));
#pragma unroll
    for (int c = 0; c < X_COPIES; c++) {
      const int i = tid + c * THREADS;
      cp_async16_stream(dst + (i / (AG_KC / 8)) * AG_X_STRIDE + (i % (AG_KC / 8)) * 8,
                        x_src[c] + s * AG_KC);
    }
  };

  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  /* the A fragments of stage s this warp dequantises (fragment f: k-step f % 4 of the block's
   * tile f / 4), into fragment buffer s % 2 */
  auto dequantise = [&](int s) {
    const uint8_t *stage = smem + (size_t)(s % AG_STAGES) * STAGE;
    const uint32_t *stage_pairs = (const uint32_t *)(stage + CODE_BYTES);
    const int col = k0 + s * AG_KC, g0 = col >> gshift;
#pragma unroll
    for (int i = 0; i < WARP_FRAGS; i++) {
      const int f = warp + AG_WARPS * i, tile = f / 4, step = f % 4;
      const int gi = ((col + 16 * step) >> gshift) - g0;
      const uint32_t *pw = stage_pairs + (tile * AG_MAX_GROUPS + gi) * 16;
      const ci_affine_rows rw = ci_affine_rows_of<BITS>(pw[g], pw[g + 8], F16);
      uint32_t words[2], a[4];
      if (BITS == 4) {
        words[0] = *(const uint32_t *)(stage + tile * QB + lane * 16 + step * 4);
        words[1] = 0u;
      } else {
        const uint2 w2 =
            *(const uint2 *)(stage + tile * QB + (step / 2) * 512 + lane * 16 + (step % 2) * 8);
        words[0] = w2.x;
        words[1] = w2.y;
      }
      ci_affine_fragment<BITS>(words, rw, F16, a);
      fragments[((s % 2) * FRAGS + f) * 32 + lane] = make_uint4(a[0], a[1], a[2], a[3]);
    }
  };

  for (int s = 0; s < AG_STAGES - 1; s++)
    if (s < stages) load_weights(s, s);
  ci_grid_begin();
  for (int s = 0; s < AG_STAGES - 1; s++) {
    if (s < stages) load_inputs(s, s);
    cp_async_commit();
  }
  cp_async_wait<AG_STAGES - 2>(); /* stage 0 has landed */
  __syncthreads();
  dequantise(0);

  /* warp w multiplies tile w % TILES of the block by its WN n8 tiles of the input tile */
  const int my_tile = warp % TILES, n0 = (warp / TILES) * WN;
  float acc[WN][4];
#pragma unroll
  for (int j = 0; j < WN; j++)
#pragma unroll
    for (int e = 0; e < 4; e++) acc[j][e] = 0.0f;

  /* one barrier a stage: stage s + 1 has landed and its fragments are dequantised while stage s
   * (dequantised the stage before) is multiplied */
  for (int s = 0; s < stages; s++) {
    cp_async_wait<AG_STAGES - 3>();
    __syncthreads();
    const int next = s + AG_STAGES - 1;
    if (next < stages) {
      load_weights(next % AG_STAGES, next);
      load_inputs(next % AG_STAGES, next);
    }
    cp_async_commit();
    if (s + 1 < stages) dequantise(s + 1);
    const __nv_bfloat16 *xs = (const __nv_bfloat16 *)(smem + (size_t)(s % AG_STAGES) * STAGE +
                                                      CODE_BYTES + PAIR_WORDS * sizeof(uint32_t));
    const uint4 *frag = fragments + ((s % 2) * FRAGS + my_tile * 4) * 32 + lane;
#pragma unroll
    for (int step = 0; step < 4; step++) {
      const uint4 a4 = frag[step * 32];
      const uint32_t a[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
      for (int j = 0; j < WN / 2; j++) {
        uint32_t b[4];
        ldmatrix_x4(b, xs + (8 * n0 + 16 * j + (lane / 16) * 8 + lane % 8) * AG_X_STRIDE +
                           16 * step + ((lane / 8) % 2) * 8);
        mma_bf16(acc[2 * j], a, b[0], b[1]);
        mma_bf16(acc[2 * j + 1], a, b[2], b[3]);
      }
    }
  }
  cp_async_wait<0>();

  float *out = ci_param_pick(P.out, part) + (P.partial ? (size_t)seg * rows * n : 0);
  const int r = (tile0 + my_tile) * 16 + g;
#pragma unroll
  for (int j = 0; j < WN; j++)
#pragma unroll
    for (int e = 0; e < 2; e++) {
      const int row = row0 + 8 * (n0 + j) + 2 * t + e;
      if (row >= rows) continue;
      if (r < n) out[(size_t)row * n + r] = acc[j][e];
      if (r + 8 < n) out[(size_t)row * n + r + 8] = acc[j][2 + e];
    }
}

template <int BITS, bool F16, int TILES, int NT> static cudaError_t ag_set_limit() {
  return cudaFuncSetAttribute(batch_gemm_kernel<BITS, F16, TILES, NT>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                              (int)ag_smem_bytes(BITS, TILES, NT));
}

template <int BITS, bool F16> static cudaError_t ag_set_limits() {
  cudaError_t err = ag_set_limit<BITS, F16, 4, 4>();
  if (err == cudaSuccess) err = ag_set_limit<BITS, F16, 4, 8>();
  if (err == cudaSuccess) err = ag_set_limit<BITS, F16, 8, 4>();
  if (err == cudaSuccess) err = ag_set_limit<BITS, F16, 8, 8>();
  return err;
}

int ci_cuda_batch_gemm_init(ci_cuda *cu) {
  /* CINFER_CUDA_BATCH_ROWS=N: the most input rows (planes x rows) the kernel takes, 0: none (every
   * product above the small-batch kernel's rows dequantises the weights for cuBLASLt), for
   * measuring */
  const char *env = getenv("CINFER_CUDA_BATCH_ROWS");
  cu->batch_rows = env ? atoi(env) : CI_CUDA_BATCH_ROWS;
  /* CINFER_CUDA_BATCH_SHAPE=TILES,NT (4 or 8 each): every launch in that block shape, for
   * measuring */
  const char *shape = getenv("CINFER_CUDA_BATCH_SHAPE");
  int tiles = 0, nt = 0;
  cu->batch_shape = shape && sscanf(shape, "%d,%d", &tiles, &nt) == 2 &&
                            (tiles == 4 || tiles == 8) && (nt == 4 || nt == 8)
                        ? 16 * tiles + nt
                        : -1;
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

/* Row groups of `tiles` tiles over the launch's parts; ends (when given) gets each part's end, the
 * unused parts' INT_MAX. */
static int ag_row_groups(int parts, const int64_t *n, int tiles, int *ends) {
  int groups = 0;
  for (int p = 0; p < AG_MAX_PARTS; p++) {
    groups += p < parts ? (int)((n[p] + 16 * tiles - 1) / (16 * tiles)) : 0;
    if (ends) ends[p] = p < parts ? groups : INT_MAX;
  }
  return groups;
}

/* Units (blocks) of a launch in blocks of `tiles` tiles and 8 nt input rows. */
static int64_t ag_units(const ag_parts &P, int parts, const int64_t *n, int64_t rows, int tiles,
                        int nt) {
  return (int64_t)ag_row_groups(parts, n, tiles, NULL) * P.segs * ((rows + 8 * nt - 1) / (8 * nt));
}

template <int BITS, bool F16, int TILES, int NT>
static void ag_launch_at(ci_cuda *cu, ag_parts P, int parts, const int64_t *n, int64_t k,
                         const __nv_bfloat16 *x, int64_t rows) {
  const int input_tiles = (int)((rows + 8 * NT - 1) / (8 * NT));
  const int units = ag_row_groups(parts, n, TILES, P.end) * P.segs * input_tiles;
  ci_launch(cu, batch_gemm_kernel<BITS, F16, TILES, NT>, dim3((unsigned)units), 32 * AG_WARPS,
            ag_smem_bytes(BITS, TILES, NT), P, x, (int)k, (int)rows, input_tiles);
}

/* The block shape: 32 input rows a block up to 32, 64 above; 8 tiles (128 weight rows) where
 * that still gives every SM two blocks, else 4, and with 4 tiles 32 input rows where 64 would
 * leave SMs without a block. No choice changes a bit of the result. */
template <int BITS, bool F16>
static void ag_launch(ci_cuda *cu, ag_parts P, int parts, const int64_t *n, int64_t k,
                      const __nv_bfloat16 *x, int64_t rows) {
  int nt = rows <= 32 ? 4 : 8;
  int tiles = ag_units(P, parts, n, rows, 8, nt) >= 2 * (int64_t)cu->n_sms ? 8 : 4;
  if (tiles == 4 && nt == 8 && ag_units(P, parts, n, rows, 4, 8) < cu->n_sms) nt = 4;
  if (cu->batch_shape > 0) tiles = cu->batch_shape / 16, nt = cu->batch_shape % 16;
  if (tiles == 8)
    nt == 8 ? ag_launch_at<BITS, F16, 8, 8>(cu, P, parts, n, k, x, rows)
            : ag_launch_at<BITS, F16, 8, 4>(cu, P, parts, n, k, x, rows);
  else
    nt == 8 ? ag_launch_at<BITS, F16, 4, 8>(cu, P, parts, n, k, x, rows)
            : ag_launch_at<BITS, F16, 4, 4>(cu, P, parts, n, k, x, rows);
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
