/* The small-batch matmul: y[m, N] = x[m, K] @ W[N, K]^T for up to 8 input rows (4 in exact mode,
 * whose inputs are two bf16 planes) with bf16 weights or MLX affine 8/4-bit weights, near the HBM
 * bandwidth.
 *
 * One warp owns 16 or 32 output columns (rows of W) and every input row. It streams its W rows and
 * the input rows through shared memory in stages of GV_KC columns (cp.async, GV_STAGES deep) and
 * multiplies them with mma.sync m16n8k16: W is the A operand (16 rows per accumulator chain), the
 * inputs the B operand (8 columns), accumulating in f32. Affine stages hold the codes and the
 * groups' (scale, bias) pairs; the warp turns them into the stage's bf16 W tile
 * (ci_affine_dequant8) before the products.
 *
 * Bit-identical to cuBLASLt: each output element is one chain of m16n8k16 products over K in
 * order, from zero, with no split of K. That is exactly how cuBLASLt (no workspace, no reduction
 * scheme) computes it for every row count — checked bitwise on the H200 for the shapes of the
 * benchmark models at 1 to 2048 rows and with either operand order — so a row gives the same bits
 * whether its step runs here (up to 8 rows) or in cuBLASLt (more rows; affine weights are first
 * dequantised to bf16 by the same function): batch invariance holds across the switch. Exact
 * mode adds the two planes' products as the cuBLASLt path does (value + remainder).
 *
 * One launch may take up to GV_MAX_PARTS matrices that multiply the same input (q, k and v; gate
 * and up): their row groups form one list, so the small ones do not each pay a launch and a
 * pipeline fill, and every SM has chains to run. */
#include "backend/cuda/cuda_affine.cuh"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_mma.cuh"

#include <limits.h>

enum {
  GV_KC = 256,           /* K columns per stage */
  GV_STAGES = 4,         /* stages in flight per warp */
  GV_STRIDE = GV_KC + 8, /* bf16 elements per staged row: rows 16 bytes apart in the banks */
  GV_MAX_X_ROWS = 8,     /* input rows (planes x rows) one warp multiplies; more run faster in
                            cuBLASLt, which reuses each staged W tile over them */
  GV_MAX_PARTS = CI_CUDA_GEMV_MAX_PARTS,
  GV_PAIR_BYTES = 4 * (GV_KC / 32) /* (scale, bias) words of a row's stage, at group size 32 */
};

/* The matrices of one launch: part p owns groups [end[p - 1], end[p]) of CHAINS * 16 rows. */
typedef struct {
  const void *w[GV_MAX_PARTS];         /* bf16 rows, or affine codes */
  const uint32_t *pairs[GV_MAX_PARTS]; /* affine: (scale, bias) words, pair_words per row */
  float *y[GV_MAX_PARTS];
  int n[GV_MAX_PARTS];
  int end[GV_MAX_PARTS]; /* unused parts: INT_MAX */
  int group_size, pair_words, f16_pairs;
} gv_parts;

/* Shared memory of one warp: the input ring [STAGES][x_rows][GV_STRIDE] bf16, the W ring (bf16:
 * [STAGES][R][GV_STRIDE]; affine: codes [STAGES][R][GV_KC * BITS / 8] bytes and pairs
 * [STAGES][R][GV_PAIR_BYTES], then one bf16 tile [R][GV_STRIDE]), a zero row. */
static constexpr size_t gv_smem_bytes(int bits, int stages, int chains, int x_rows) {
  const size_t rows = (size_t)chains * 16, bf16_row = GV_STRIDE * sizeof(__nv_bfloat16);
  const size_t w = bits == 16
                       ? stages * rows * bf16_row
                       : stages * rows * (GV_KC * bits / 8 + GV_PAIR_BYTES) + rows * bf16_row;
  return w + ((size_t)stages * x_rows + 1) * bf16_row;
}

/* The part of group index `group` and the group's first W row within that part. */
__device__ static inline int gv_part_of(const gv_parts &P, int group, int chains, int *row0) {
  int p = 0;
#pragma unroll
  for (int i = 0; i + 1 < GV_MAX_PARTS; i++) p += group >= P.end[i];
  *row0 = (group - (p ? P.end[p - 1] : 0)) * chains * 16;
  return p;
}

/* One warp per block. Warp b takes the groups of CHAINS * 16 W rows b, b + gridDim.x, ... and
 * streams their stages one after the other through a STAGES-deep cp.async pipeline, so the next
 * group's first stages load while the current one finishes. BITS 16 (bf16 W), 8 or 4 (affine);
 * PLANES 1 (bf16 inputs) or 2 (value and remainder planes, [plane][m][K]). */
template <int BITS, int CHAINS, int PLANES, int STAGES>
__global__ static void __launch_bounds__(32)
    gemv_kernel(const gv_parts P, const __nv_bfloat16 *__restrict__ x, int groups, int k, int m) {
  constexpr int R = CHAINS * 16, CODE_BYTES = GV_KC * BITS / 8;
  extern __shared__ uint4 gv_smem[];
  const int lane = threadIdx.x;
  const int x_rows = PLANES * m;
  uint8_t *ring = (uint8_t *)gv_smem;
  /* bf16: the W ring; affine: codes ring, pairs ring, the dequantised tile */
  uint8_t *codes = ring, *pairs = ring + STAGES * R * CODE_BYTES;
  __nv_bfloat16 *tile =
      BITS == 16 ? (__nv_bfloat16 *)ring : (__nv_bfloat16 *)(pairs + STAGES * R * GV_PAIR_BYTES);
  __nv_bfloat16 *sx = BITS == 16 ? tile + STAGES * R * GV_STRIDE : tile + R * GV_STRIDE;
  __nv_bfloat16 *zero_row = sx + STAGES * x_rows * GV_STRIDE;
  for (int i = lane; i < GV_STRIDE / 8; i += 32) ((uint4 *)zero_row)[i] = make_uint4(0, 0, 0, 0);

  if ((int)blockIdx.x >= groups) return;
  const int my_groups = (groups - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
  const int k_stages = (k + GV_KC - 1) / GV_KC;
  const int total = my_groups * k_stages;
  int load_group = 0, load_k = 0; /* the next stage to load: my group index, k stage */
  auto load_next = [&](int slot) {
    const int k0 = load_k * GV_KC, kn = min(GV_KC, k - k0);
    int row0;
    const int part = gv_part_of(P, (int)blockIdx.x + load_group * (int)gridDim.x, CHAINS, &row0);
    if (BITS == 16) { /* a warp copies one row per instruction: lane c takes 16-byte chunk c */
      if (lane < kn / 8) {
        __nv_bfloat16 *dw = tile + slot * R * GV_STRIDE + lane * 8;
        const __nv_bfloat16 *src =
            (const __nv_bfloat16 *)P.w[part] + (size_t)row0 * k + k0 + lane * 8;
#pragma unroll
        for (int r = 0; r < R; r++) cp_async16_stream(dw + r * GV_STRIDE, src + (size_t)r * k);
      }
    } else {
      const int chunks = kn * BITS / 128; /* 16-byte chunks of a row's codes */
      const uint8_t *src = (const uint8_t *)P.w[part] + ((size_t)row0 * k + k0) * BITS / 8;
      uint8_t *dc = codes + slot * R * CODE_BYTES;
      for (int c = lane; c < R * chunks; c += 32) {
        const int r = c / chunks, ch = c % chunks;
        cp_async16_stream(dc + r * CODE_BYTES + ch * 16, src + (size_t)r * k * BITS / 8 + ch * 16);
      }
      /* the stage's (scale, bias) words, 8 bytes at a time (rows are padded to 16 bytes) */
      const int words = (kn + P.group_size - 1) / P.group_size, units = (words + 1) / 2;
      const uint32_t *ps = P.pairs[part] + (size_t)row0 * P.pair_words + k0 / P.group_size;
      uint8_t *dp = pairs + slot * R * GV_PAIR_BYTES;
      for (int c = lane; c < R * units; c += 32) {
        const int r = c / units, u = c % units;
        cp_async8_cached(dp + r * GV_PAIR_BYTES + u * 8, ps + (size_t)r * P.pair_words + 2 * u);
      }
    }
    __nv_bfloat16 *dx = sx + slot * x_rows * GV_STRIDE + lane * 8;
    if (lane < kn / 8)
      for (int r = 0; r < x_rows; r++)
        cp_async16_cached(dx + r * GV_STRIDE, x + (size_t)r * k + k0 + lane * 8);
    if (++load_k == k_stages) {
      load_k = 0;
      load_group++;
    }
  };
#pragma unroll
  for (int s = 0; s < STAGES - 1; s++) {
    if (s < total) load_next(s);
    cp_async_commit();
  }

  /* ldmatrix rows: A (W) tile i = lane / 8 covers rows (i & 1) * 8.., columns (i >> 1) * 8 of a
   * chain's 16 rows; B (inputs): an x2 load of the 8 input columns, lanes 0-7 columns 0-7 of k,
   * lanes 8-15 k 8-15. Input column c: plane 1: row c; plane 2: column 2j the value of row j,
   * 2j + 1 its remainder. Missing columns read the zero row. */
  const int tile_id = lane >> 3, tile_row = lane & 7;
  const int a_row = (tile_id & 1) * 8 + tile_row, a_col = (tile_id >> 1) * 8;
  int x_row;
  if (PLANES == 1)
    x_row = tile_row < m ? tile_row : -1;
  else
    x_row = (tile_row >> 1) < m ? (tile_row & 1) * m + (tile_row >> 1) : -1;
  const int b_col = (tile_id & 1) * 8;
  const int g = lane >> 2, t = lane & 3;

  float c[CHAINS][4];
#pragma unroll
  for (int j = 0; j < CHAINS; j++) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.0f;
  __syncwarp();

  int group = 0, ks = 0;
  for (int s = 0; s < total; s++) {
    cp_async_wait<STAGES - 2>();
    __syncwarp();
    const int slot = s % STAGES;
    const int kn = min(GV_KC, k - ks * GV_KC);
    const __nv_bfloat16 *w_tile = tile + (BITS == 16 ? slot * R * GV_STRIDE : 0);
    if (BITS != 16) { /* dequantise the stage: lane l takes columns [8l, 8l + 8) of every row */
      if (8 * lane < kn) {
        const uint8_t *cs = codes + slot * R * CODE_BYTES + lane * BITS;
        const uint32_t *pw = (const uint32_t *)(pairs + slot * R * GV_PAIR_BYTES);
        const int pair_index = 8 * lane / P.group_size;
#pragma unroll 4
        for (int r = 0; r < R; r++) {
          uint32_t word[2];
          if (BITS == 4) {
            word[0] = *(const uint32_t *)(cs + r * CODE_BYTES);
          } else {
            const uint2 v = *(const uint2 *)(cs + r * CODE_BYTES);
            word[0] = v.x;
            word[1] = v.y;
          }
          const uint32_t pair = pw[r * (GV_PAIR_BYTES / 4) + pair_index];
          *(uint4 *)(tile + r * GV_STRIDE + 8 * lane) =
              ci_affine_dequant8<BITS>(word, pair, P.f16_pairs);
        }
      }
      __syncwarp();
    }
    const __nv_bfloat16 *a_base = w_tile + a_row * GV_STRIDE + a_col;
    const __nv_bfloat16 *b_base =
        (x_row >= 0 ? sx + (slot * x_rows + x_row) * GV_STRIDE : zero_row) + b_col;
    if (kn == GV_KC) {
#pragma unroll
      for (int i = 0; i < GV_KC / 16; i++) {
        uint32_t a[CHAINS][4], b[2];
        ldmatrix_x2(b, b_base + i * 16);
#pragma unroll
        for (int j = 0; j < CHAINS; j++) ldmatrix_x4(a[j], a_base + j * 16 * GV_STRIDE + i * 16);
#pragma unroll
        for (int j = 0; j < CHAINS; j++) mma_bf16(c[j], a[j], b[0], b[1]);
      }
    } else {
      for (int kk = 0; kk < kn; kk += 16) {
        uint32_t a[CHAINS][4], b[2];
        ldmatrix_x2(b, b_base + kk);
#pragma unroll
        for (int j = 0; j < CHAINS; j++) ldmatrix_x4(a[j], a_base + j * 16 * GV_STRIDE + kk);
#pragma unroll
        for (int j = 0; j < CHAINS; j++) mma_bf16(c[j], a[j], b[0], b[1]);
      }
    }
    __syncwarp(); /* every lane is done with the slot (and tile) the next load overwrites */
    if (s + STAGES - 1 < total) load_next((s + STAGES - 1) % STAGES);
    cp_async_commit();
    if (++ks == k_stages) { /* the group is done: write it, start the next from zero */
      int n0;
      const int part = gv_part_of(P, (int)blockIdx.x + group * (int)gridDim.x, CHAINS, &n0);
      float *y = P.y[part];
      const int n = P.n[part];
      /* accumulator (j, lane): W rows n0 + 16j + g and + 8, input columns 2t and 2t + 1 */
#pragma unroll
      for (int j = 0; j < CHAINS; j++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
          const int col = n0 + 16 * j + g + 8 * h;
          if (PLANES == 1) {
            if (2 * t < m) y[(size_t)(2 * t) * n + col] = c[j][2 * h];
            if (2 * t + 1 < m) y[(size_t)(2 * t + 1) * n + col] = c[j][2 * h + 1];
          } else if (t < m) {
            y[(size_t)t * n + col] = c[j][2 * h] + c[j][2 * h + 1];
          }
        }
        c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.0f;
      }
      ks = 0;
      group++;
    }
  }
  cp_async_wait<0>();
}

template <int BITS, int CHAINS, int PLANES> static cudaError_t gv_set_limit() {
  return cudaFuncSetAttribute(gemv_kernel<BITS, CHAINS, PLANES, GV_STAGES>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                              (int)gv_smem_bytes(BITS, GV_STAGES, CHAINS, GV_MAX_X_ROWS));
}

template <int BITS> static cudaError_t gv_set_limits() {
  cudaError_t err = gv_set_limit<BITS, 1, 1>();
  if (err == cudaSuccess) err = gv_set_limit<BITS, 2, 1>();
  if (err == cudaSuccess) err = gv_set_limit<BITS, 1, 2>();
  if (err == cudaSuccess) err = gv_set_limit<BITS, 2, 2>();
  return err;
}

int ci_cuda_gemv_init(ci_cuda *cu) {
  cudaError_t err = gv_set_limits<16>();
  if (err == cudaSuccess) err = gv_set_limits<8>();
  if (err == cudaSuccess) err = gv_set_limits<4>();
  int smem = 0;
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, cu->device);
  cu->smem_per_sm = smem;
  return err == cudaSuccess ? CI_OK
                            : ci_fail("CUDA: matmul kernel setup: %s", cudaGetErrorString(err));
}

int ci_cuda_gemv_fits(int dtype, int64_t n, int64_t k, int64_t m, int planes) {
  const int bits = dtype == CI_BF16 ? 16 : dtype == CI_Q8 ? 8 : dtype == CI_Q4 ? 4 : 0;
  return bits && m >= 1 && planes * m <= GV_MAX_X_ROWS && n % 16 == 0 &&
         k % (bits == 16 ? 16 : 32) == 0 && n <= ((int64_t)1 << 24) && k <= ((int64_t)1 << 24);
}

/* How many one-warp blocks fit on an SM (shared memory, and the 32-block limit, less one KB of
 * shared memory the runtime reserves per block). */
static int gv_blocks_per_sm(const ci_cuda *cu, size_t smem) {
  const int by_smem = (int)((size_t)cu->smem_per_sm / (smem + 1024));
  return by_smem < 1 ? 1 : by_smem > 32 ? 32 : by_smem;
}

template <int BITS>
static void gv_launch(ci_cuda *cu, const gv_parts &P, int chains, int groups, int64_t k,
                      const __nv_bfloat16 *x, int64_t m, int planes) {
  const size_t smem = gv_smem_bytes(BITS, GV_STAGES, chains, (int)(planes * m));
  const int64_t resident = (int64_t)cu->n_sms * gv_blocks_per_sm(cu, smem);
  const dim3 grid((unsigned)(groups < resident ? groups : resident));
  if (chains == 2 && planes == 1)
    gemv_kernel<BITS, 2, 1, GV_STAGES>
        <<<grid, 32, smem, cu->stream>>>(P, x, groups, (int)k, (int)m);
  else if (chains == 2)
    gemv_kernel<BITS, 2, 2, GV_STAGES>
        <<<grid, 32, smem, cu->stream>>>(P, x, groups, (int)k, (int)m);
  else if (planes == 1)
    gemv_kernel<BITS, 1, 1, GV_STAGES>
        <<<grid, 32, smem, cu->stream>>>(P, x, groups, (int)k, (int)m);
  else
    gemv_kernel<BITS, 1, 2, GV_STAGES>
        <<<grid, 32, smem, cu->stream>>>(P, x, groups, (int)k, (int)m);
}

void ci_cuda_gemv_launch(ci_cuda *cu, int parts, const ci_cuda_weight *w, const int64_t *n,
                         float *const *y, int64_t k, const void *x, int64_t m, int planes) {
  /* two chains per warp where that still leaves two warps per SM */
  int64_t rows = 0;
  int even = 1;
  for (int p = 0; p < parts; p++) {
    rows += n[p];
    even &= n[p] % 32 == 0;
  }
  const int chains = even && rows / 32 >= 2 * (int64_t)cu->n_sms ? 2 : 1;
  gv_parts P;
  memset(&P, 0, sizeof P);
  int groups = 0;
  for (int p = 0; p < GV_MAX_PARTS; p++) {
    const int used = p < parts;
    P.w[p] = used ? w[p].data : NULL;
    P.pairs[p] = used ? (const uint32_t *)w[p].pairs : NULL;
    P.y[p] = used ? y[p] : NULL;
    P.n[p] = used ? (int)n[p] : 0;
    groups += used ? (int)(n[p] / (chains * 16)) : 0;
    P.end[p] = used ? groups : INT_MAX;
  }
  P.group_size = w[0].group_size;
  P.pair_words = (int)ci_affine_pair_words(k, w[0].group_size > 0 ? w[0].group_size : 1);
  P.f16_pairs = w[0].f16_pairs;
  const __nv_bfloat16 *xb = (const __nv_bfloat16 *)x;
  if (w[0].dtype == CI_Q4)
    gv_launch<4>(cu, P, chains, groups, k, xb, m, planes);
  else if (w[0].dtype == CI_Q8)
    gv_launch<8>(cu, P, chains, groups, k, xb, m, planes);
  else
    gv_launch<16>(cu, P, chains, groups, k, xb, m, planes);
  ci_cuda_check_launch(cu, "matmul (small batch)");
}
