/* The small-batch bf16 matmul: y[m, N] = x[m, K] @ W[N, K]^T for up to 8 input rows (4 in exact
 * mode, whose inputs are two bf16 planes), near the HBM bandwidth.
 *
 * One warp owns 8 or 16 output columns (rows of W) and every input row. It streams its W rows and
 * the input rows through shared memory in stages of GV_KC columns (cp.async, GV_STAGES deep) and
 * multiplies them with mma.sync m16n8k16: the inputs are the A operand (16 rows), W the B operand
 * (8 rows per accumulator chain), accumulating in f32.
 *
 * Bit-identical to cuBLASLt: each output element is one chain of m16n8k16 products over K in
 * order, from zero, with no split of K. That is exactly how cuBLASLt (no workspace, no reduction
 * scheme) computes it for every row count — checked bitwise on the H200 for the shapes of the
 * benchmark models at 1 to 2048 rows — so a row gives the same bits whether its step runs here
 * (up to 8 rows) or in cuBLASLt (more rows): batch invariance holds across the switch. Exact
 * mode adds the two planes' products as the cuBLASLt path does (value + remainder).
 *
 * One launch may take up to GV_MAX_PARTS matrices that multiply the same input (q, k and v; gate
 * and up): their row groups form one list, so the small ones do not each pay a launch and a
 * pipeline fill, and every SM has chains to run. */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_mma.cuh"

#include <limits.h>

enum {
  GV_KC = 256,           /* K columns per stage */
  GV_STAGES = 4,         /* stages in flight per warp */
  GV_STRIDE = GV_KC + 8, /* bf16 elements per staged row: rows 16 bytes apart in the banks */
  GV_MAX_X_ROWS = 8,     /* input rows (planes x rows) one warp multiplies; more run faster in
                            cuBLASLt, which reuses each staged W tile over them */
  GV_MAX_PARTS = CI_CUDA_GEMV_MAX_PARTS
};

/* The matrices of one launch: part p owns groups [end[p - 1], end[p]) of CHAINS * 8 rows. */
typedef struct {
  const __nv_bfloat16 *w[GV_MAX_PARTS];
  float *y[GV_MAX_PARTS];
  int n[GV_MAX_PARTS];
  int end[GV_MAX_PARTS]; /* unused parts: INT_MAX */
} gv_parts;

/* The part of group index `group` and the group's first W row within that part. */
__device__ static inline int gv_part_of(const gv_parts &P, int group, int chains, int *row0) {
  int p = 0;
#pragma unroll
  for (int i = 0; i + 1 < GV_MAX_PARTS; i++) p += group >= P.end[i];
  *row0 = (group - (p ? P.end[p - 1] : 0)) * chains * 8;
  return p;
}

static constexpr size_t gv_smem_bytes(int stages, int chains, int x_rows) {
  return ((size_t)stages * (chains * 8 + x_rows) + 1) * GV_STRIDE * sizeof(__nv_bfloat16);
}

/* One warp per block. Warp b takes the groups of CHAINS * 8 W rows b, b + gridDim.x, ... and
 * streams their stages one after the other through a STAGES-deep cp.async pipeline, so the next
 * group's first stages load while the current one finishes. PLANES 1 (bf16 inputs) or 2 (value
 * and remainder planes, [plane][m][K]). */
template <int CHAINS, int PLANES, int STAGES>
__global__ static void __launch_bounds__(32)
    gemv_bf16_kernel(const gv_parts P, const __nv_bfloat16 *__restrict__ x, int groups, int k,
                     int m) {
  extern __shared__ uint4 gv_smem[];
  const int lane = threadIdx.x;
  const int x_rows = PLANES * m;
  __nv_bfloat16 *sw = (__nv_bfloat16 *)gv_smem;             /* [stage][CHAINS * 8][GV_STRIDE] */
  __nv_bfloat16 *sx = sw + STAGES * CHAINS * 8 * GV_STRIDE; /* [stage][x_rows][GV_STRIDE] */
  __nv_bfloat16 *zero_row = sx + STAGES * x_rows * GV_STRIDE;
  for (int i = lane; i < GV_STRIDE / 8; i += 32) ((uint4 *)zero_row)[i] = make_uint4(0, 0, 0, 0);

  if ((int)blockIdx.x >= groups) return;
  const int my_groups = (groups - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
  const int k_stages = (k + GV_KC - 1) / GV_KC;
  const int total = my_groups * k_stages;
  /* a warp copies one staged row per instruction: lane c takes the row's 16-byte chunk c */
  int load_group = 0, load_k = 0; /* the next stage to load: my group index, k stage */
  auto load_next = [&](int slot) {
    const int k0 = load_k * GV_KC;
    const int chunks = min(GV_KC, k - k0) / 8;
    if (lane < chunks) {
      int row0;
      const int part = gv_part_of(P, (int)blockIdx.x + load_group * (int)gridDim.x, CHAINS, &row0);
      __nv_bfloat16 *dw = sw + slot * CHAINS * 8 * GV_STRIDE + lane * 8;
      const __nv_bfloat16 *src = P.w[part] + (size_t)row0 * k + k0 + lane * 8;
#pragma unroll
      for (int r = 0; r < CHAINS * 8; r++)
        cp_async16_stream(dw + r * GV_STRIDE, src + (size_t)r * k);
      __nv_bfloat16 *dx = sx + slot * x_rows * GV_STRIDE + lane * 8;
      for (int r = 0; r < x_rows; r++)
        cp_async16_cached(dx + r * GV_STRIDE, x + (size_t)r * k + k0 + lane * 8);
    }
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

  /* ldmatrix rows: A (inputs) tile i = lane / 8 covers rows (i & 1) * 8.., columns (i >> 1) * 8;
   * staged input row of A row r: plane 0 rows first; missing rows read the zero row */
  const int tile = lane >> 3, tile_row = lane & 7;
  const int a_row = (tile & 1) * 8 + tile_row;
  int x_row;
  if (PLANES == 1)
    x_row = a_row < m ? a_row : -1;
  else /* A rows 0-7: values of rows 0-7, A rows 8-15: their remainders */
    x_row = a_row < 8 ? (a_row < m ? a_row : -1) : (a_row - 8 < m ? m + a_row - 8 : -1);
  const int a_col = (tile >> 1) * 8;
  /* B (W): with two chains tile i covers W rows (i >> 1) * 8.., columns (i & 1) * 8; with one
   * chain an x2 load of tiles 0 and 1 */
  const int b_row = CHAINS == 2 ? (tile >> 1) * 8 + tile_row : tile_row;
  const int b_col = (tile & 1) * 8;
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
    const __nv_bfloat16 *a_base =
        (x_row >= 0 ? sx + (slot * x_rows + x_row) * GV_STRIDE : zero_row) + a_col;
    const __nv_bfloat16 *b_base = sw + (slot * CHAINS * 8 + b_row) * GV_STRIDE + b_col;
    if (kn == GV_KC) {
      /* every fragment of the stage first, so the shared-memory loads overlap and the mma chain
       * (one dependent product per 16 columns) runs back to back */
      uint32_t a[GV_KC / 16][4], b[GV_KC / 16][2 * CHAINS];
#pragma unroll
      for (int i = 0; i < GV_KC / 16; i++) {
        ldmatrix_x4(a[i], a_base + i * 16);
        if (CHAINS == 2)
          ldmatrix_x4(b[i], b_base + i * 16);
        else
          ldmatrix_x2(b[i], b_base + i * 16);
      }
#pragma unroll
      for (int i = 0; i < GV_KC / 16; i++) {
        mma_bf16(c[0], a[i], b[i][0], b[i][1]);
        if (CHAINS == 2) mma_bf16(c[CHAINS - 1], a[i], b[i][2 * CHAINS - 2], b[i][2 * CHAINS - 1]);
      }
    } else {
      for (int kk = 0; kk < kn; kk += 16) {
        uint32_t a[4], b[2 * CHAINS];
        ldmatrix_x4(a, a_base + kk);
        if (CHAINS == 2)
          ldmatrix_x4(b, b_base + kk);
        else
          ldmatrix_x2(b, b_base + kk);
        mma_bf16(c[0], a, b[0], b[1]);
        if (CHAINS == 2) mma_bf16(c[CHAINS - 1], a, b[2 * CHAINS - 2], b[2 * CHAINS - 1]);
      }
    }
    __syncwarp(); /* every lane is done with the slot the next load overwrites */
    if (s + STAGES - 1 < total) load_next((s + STAGES - 1) % STAGES);
    cp_async_commit();
    if (++ks == k_stages) { /* the group is done: write it, start the next from zero */
      int n0;
      const int part = gv_part_of(P, (int)blockIdx.x + group * (int)gridDim.x, CHAINS, &n0);
      float *y = P.y[part];
      const int n = P.n[part];
      /* accumulator (j, lane): A rows g and g + 8, W rows n0 + 8j + 2t and + 1 */
#pragma unroll
      for (int j = 0; j < CHAINS; j++) {
        const int col = n0 + j * 8 + 2 * t;
        if (PLANES == 1) {
          if (g < m) *(float2 *)(y + (size_t)g * n + col) = make_float2(c[j][0], c[j][1]);
          if (g + 8 < m) *(float2 *)(y + (size_t)(g + 8) * n + col) = make_float2(c[j][2], c[j][3]);
        } else if (g < m) {
          *(float2 *)(y + (size_t)g * n + col) = make_float2(c[j][0] + c[j][2], c[j][1] + c[j][3]);
        }
        c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.0f;
      }
      ks = 0;
      group++;
    }
  }
  cp_async_wait<0>();
}

template <int CHAINS, int PLANES, int STAGES> static cudaError_t gv_set_limit() {
  return cudaFuncSetAttribute(gemv_bf16_kernel<CHAINS, PLANES, STAGES>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                              (int)gv_smem_bytes(STAGES, CHAINS, GV_MAX_X_ROWS));
}

int ci_cuda_gemv_init(ci_cuda *cu) {
  cudaError_t err = gv_set_limit<1, 1, GV_STAGES>();
  if (err == cudaSuccess) err = gv_set_limit<2, 1, GV_STAGES>();
  if (err == cudaSuccess) err = gv_set_limit<1, 2, GV_STAGES>();
  if (err == cudaSuccess) err = gv_set_limit<2, 2, GV_STAGES>();
  int smem = 0;
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, cu->device);
  cu->smem_per_sm = smem;
  return err == cudaSuccess ? CI_OK
                            : ci_fail("CUDA: matmul kernel setup: %s", cudaGetErrorString(err));
}

int ci_cuda_gemv_fits(int dtype, int64_t n, int64_t k, int64_t m, int planes) {
  return dtype == CI_BF16 && m >= 1 && planes * m <= GV_MAX_X_ROWS && n % 8 == 0 && k % 16 == 0 &&
         n <= ((int64_t)1 << 24) && k <= ((int64_t)1 << 24);
}

/* How many one-warp blocks fit on an SM (shared memory, and the 32-block limit, less one KB of
 * shared memory the runtime reserves per block). */
static int gv_blocks_per_sm(const ci_cuda *cu, size_t smem) {
  const int by_smem = (int)((size_t)cu->smem_per_sm / (smem + 1024));
  return by_smem < 1 ? 1 : by_smem > 32 ? 32 : by_smem;
}

void ci_cuda_gemv_launch(ci_cuda *cu, int parts, const void *const *w, const int64_t *n,
                         float *const *y, int64_t k, const void *x, int64_t m, int planes) {
  /* two chains per warp where that still leaves two warps per SM */
  int64_t rows = 0;
  int even = 1;
  for (int p = 0; p < parts; p++) {
    rows += n[p];
    even &= n[p] % 16 == 0;
  }
  const int chains = even && rows / 16 >= 2 * (int64_t)cu->n_sms ? 2 : 1;
  gv_parts P;
  int groups = 0;
  for (int p = 0; p < GV_MAX_PARTS; p++) {
    const int used = p < parts;
    P.w[p] = used ? (const __nv_bfloat16 *)w[p] : NULL;
    P.y[p] = used ? y[p] : NULL;
    P.n[p] = used ? (int)n[p] : 0;
    groups += used ? (int)(n[p] / (chains * 8)) : 0;
    P.end[p] = used ? groups : INT_MAX;
  }
  const size_t smem = gv_smem_bytes(GV_STAGES, chains, (int)(planes * m));
  const int64_t resident = (int64_t)cu->n_sms * gv_blocks_per_sm(cu, smem);
  const dim3 grid((unsigned)(groups < resident ? groups : resident));
  const __nv_bfloat16 *xb = (const __nv_bfloat16 *)x;
  if (chains == 2 && planes == 1)
    gemv_bf16_kernel<2, 1, GV_STAGES>
        <<<grid, 32, smem, cu->stream>>>(P, xb, groups, (int)k, (int)m);
  else if (chains == 2)
    gemv_bf16_kernel<2, 2, GV_STAGES>
        <<<grid, 32, smem, cu->stream>>>(P, xb, groups, (int)k, (int)m);
  else if (planes == 1)
    gemv_bf16_kernel<1, 1, GV_STAGES>
        <<<grid, 32, smem, cu->stream>>>(P, xb, groups, (int)k, (int)m);
  else
    gemv_bf16_kernel<1, 2, GV_STAGES>
        <<<grid, 32, smem, cu->stream>>>(P, xb, groups, (int)k, (int)m);
  ci_cuda_check_launch(cu, "matmul (small batch)");
}
