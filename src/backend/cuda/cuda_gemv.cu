/* The small-batch matmul: y[m, N] = x[m, K] @ W[N, K]^T for up to 8 input rows with bf16 weights
 * and up to 16 with MLX affine 8/4-bit weights (half that in exact mode, whose inputs are two bf16
 * planes), near the HBM bandwidth.
 *
 * One warp owns 16 or 32 output columns (rows of W) and every input row. It streams its W rows and
 * the input rows through shared memory in stages of gv_kc columns (cp.async, 3-4 deep) and
 * multiplies them with mma.sync m16n8k16: W is the A operand (16 rows per accumulator chain), the
 * inputs the B operand (8 columns, or two groups of 8 that share each A fragment: XG), accumulating
 * in f32. Affine stages hold the codes, already in fragment order (cuda_affine.cuh), and the
 * groups' (scale, bias) pairs: each lane reads its own codes with one 16-byte load per 64 columns
 * and dequantises them in registers straight into its A fragments, so no bf16 tile is written or
 * read back. An affine k-step is bound by instruction issue (dequantisation: ~22 instructions per
 * mma for q4), not bytes, so where one-warp blocks would leave an SM few warps to issue from
 * (gv_affine_warps), affine blocks are two warps that share the staged tiles: warp h dequantises
 * only the tile's rows 8h..8h+7 (ci_affine_half_fragment) into its fragment's rows 0-7, rows 8-15
 * zero. Each output is still one chain over K; twice the warps issue the work.
 *
 * Bit-identical to cuBLASLt: each output element is one chain of m16n8k16 products over K in
 * order, from zero, with no split of K. That is exactly how cuBLASLt (no workspace, no reduction
 * scheme) computes it for every row count — checked bitwise on the H200 for the shapes of the
 * benchmark models at 1 to 2048 rows and with either operand order — so a row gives the same bits
 * whether its step runs here (up to 8 rows) or in cuBLASLt (more rows; affine weights are first
 * dequantised to bf16 by the same function): batch invariance holds across the switch. Exact
 * mode adds the two planes' products as the cuBLASLt path does (value + remainder). Affine rows
 * longer than 4096 columns are the one exception, for both paths alike (ci_cuda_k_segment): a
 * chain from zero over each K segment, the segments' sums added in order; here each (row group,
 * segment) is a unit of its own block, and the group's last unit to finish adds the partials.
 *
 * One launch may take up to GV_MAX_PARTS matrices that multiply the same input (q, k and v; gate
 * and up): their row groups form one list, so the small ones do not each pay a launch and a
 * pipeline fill, and every SM has chains to run. */
#include "backend/cuda/cuda_affine.cuh"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_param_pick.cuh"

#include <limits.h>
#include <stdlib.h>

enum {
  GV_STAGES = 4,     /* stages in flight per warp */
  GV_MAX_X_ROWS = 8, /* input rows (planes x rows) one warp multiplies with bf16 weights; more
                        run faster in cuBLASLt, which reuses each staged W tile over them */
  GV_MAX_X_ROWS_AFFINE = 16, /* with affine weights: two column groups of 8 per mma chain, which
                                beats dequantising the matrix to bf16 for cuBLASLt */
  GV_MAX_PARTS = CI_CUDA_GEMV_MAX_PARTS
};

/* K columns per stage: bf16 rows 256 (8 KB per 16 rows), affine 512 (q4: 4 KB per 16 rows); with
 * two column groups of inputs (XG 2) 256, which keeps four warps per SM. */
static constexpr int gv_kc(int bits, int xg = 1) {
  return bits == 16 || xg == 2 ? 256 : 512;
}

/* Affine weights times up to 8 input rows (one column group) stream in one of three stage shapes:
 * 512 columns three deep, 256 four deep or 256 three deep; the narrower ones let an SM hold more
 * blocks, at more stage bookkeeping per k-step (gv_affine_shape picks one). Nsight Compute on the
 * 8B q4 gate|up launch at batch 1 (256 x 4, 11.5 warps an SM): a warp issues once per 5.5 cycles,
 * its stalls a third on fixed-latency dependencies between the dequantising instructions and a
 * fifth issuing; 48% of issue slots used, DRAM 52% busy. H200, q4, one launch (us, 512x4 / 512x3
 * / 256x4), 8B gate|up (1,792 units) 34.2 / 33.4 / 30.7, down (1,024) 19.8 / 19.2 / 22.3, q|k|v
 * (768) 13.6 / 13.3 / 14.9, o (512) 11.2 / 10.7 / 13.0 (before the pairs ring held only the
 * groups a stage has). 128-column stages, four or six deep, measured slower on every launch (8B q4
 * batch 1 ~290 tok/s against ~345). */
enum { GV_AFFINE_STAGES = 3, GV_NARROW_KC = 256, GV_NARROW_STAGES = 4, GV_SHALLOW_STAGES = 3 };
/* Decode steps against 512 x 4 for every launch (H200, tok/s, batch 1 / 2 / 4 / 8): 8B q4 312 ->
 * 327 / 549 -> 645 / 940 -> 1,131 / 1,736 -> 2,068; 1B q4 1,039 -> 1,061 / 1,870 -> 2,064 /
 * 3,576 -> 4,041 / 7,000 -> 7,378; 8B q8 225 -> 226 / 430 -> 443 / 841 -> 898 / 1,349 -> 1,608;
 * 1B q8 824 -> 891 / 1,654 -> 1,731 / 3,279 -> 3,424 / 5,365 -> 5,994. */

/* bf16 weights times one or two input rows (batch 1, or exact batch 1's two planes) stream in
 * wider, shallower stages: 512 columns (1 KB of each W row, 16 KB per 16 rows), three deep. On
 * the H200 this beats 256 x 4 at batch 1 (8B weights-only step 4.47 -> 4.26 ms, decode 181 -> 190
 * tok/s; 1B 675 -> 723) and 2 (8B 354 -> 368, 1B 1,332 -> 1,408), ties at 4 and loses at 8 rows
 * (8B 1,283 -> 1,247 tok/s), where the input tiles grow with it. */
enum { GV_WIDE_KC = 512, GV_WIDE_STAGES = 3, GV_WIDE_MAX_X_ROWS = 2 };

/* The matrices of one launch: part p owns groups [end[p - 1], end[p]) of CHAINS * 16 rows. */
typedef struct {
  const void *w[GV_MAX_PARTS];         /* bf16 rows, or affine codes (cuda_affine.cuh) */
  const uint32_t *pairs[GV_MAX_PARTS]; /* affine: (scale, bias) words */
  float *y[GV_MAX_PARTS];
  int n[GV_MAX_PARTS];
  int end[GV_MAX_PARTS]; /* unused parts: INT_MAX */
  int group_shift;       /* affine: log2 of the group size */
  /* K segments (ci_cuda_k_segment): segs of seg_cols columns (the last: the rest of K); with more
   * than one, unit u of the launch is row group u / segs, segment u % segs, and its chains go to
   * partial[u][rows][planes * m]; the last of a group's units to finish (count[group] reaching
   * segs - 1) adds them in order into y and resets the count */
  int segs, seg_cols;
  float *partial;
  unsigned *count;
} gv_parts;

/* Shared memory of one warp: the W ring (bf16: [STAGES][R][KC + 8] elements, rows 16 bytes apart
 * in the banks; affine: codes [STAGES][CHAINS][16 KC BITS / 8] bytes, then pairs
 * [STAGES][CHAINS][KC / group groups x 16 words], groups of 32 where the kernel does not know the
 * group size), the input ring [STAGES][x_rows][KC + 8] bf16 and a
 * zero row. */
static constexpr size_t gv_smem_bytes(int bits, int kc, int stages, int chains, int x_rows,
                                      int gshift = 0) {
  const size_t rows = (size_t)chains * 16, bf16_row = (size_t)(kc + 8) * sizeof(__nv_bfloat16);
  const size_t w = bits == 16 ? stages * rows * bf16_row
                              : (size_t)stages * chains *
                                    (16 * kc * bits / 8 + (kc >> (gshift ? gshift : 5)) * 64);
  return w + ((size_t)stages * x_rows + 1) * bf16_row;
}

/* The part of group index `group` and the group's first W row within that part. */
__device__ static inline int gv_part_of(const gv_parts &P, int group, int chains, int *row0) {
  int p = 0, first = 0;
#pragma unroll
  for (int i = 0; i + 1 < GV_MAX_PARTS; i++)
    if (group >= P.end[i]) {
      p = i + 1;
      first = P.end[i];
    }
  *row0 = (group - first) * chains * 16;
  return p;
}

/* WARPS warps per block (bf16: one; affine: one, or two that each take half of every 16 rows,
 * gv_affine_warps). Block b takes the groups of CHAINS * 16 W rows b, b + gridDim.x, ... and
 * streams their stages one after the other through a STAGES-deep cp.async pipeline, so the next
 * group's first stages load while the current one finishes. BITS 16 (bf16 W: A fragments by
 * ldmatrix from the staged rows), 8 or 4 (affine: each lane reads its fragments' codes from the
 * staged tile, cuda_affine.cuh, and dequantises them in registers); PLANES 1 (bf16 inputs) or 2
 * (value and remainder planes, [plane][m][K]); F16: affine scales and biases in f16, not bf16 (a
 * template argument: a branch inside the unrolled k-steps would keep the compiler from overlapping
 * one step's loads with the previous step's products); GSHIFT: log2 of the affine group size
 * when it is a compile-time constant (6: groups of 64, MLX's default), else 0 (P.group_shift: the
 * pairs' addressing then shifts by a register; a constant saved 1-10% of the q4/q8 kernels' time
 * on the H200). */
template <int BITS, int CHAINS, int PLANES, int STAGES, int KC, bool F16, int XG, int WARPS,
          int GSHIFT = 0, bool SEG = false>
__global__ static void __launch_bounds__(32 * WARPS)
    gemv_kernel(const gv_parts P, const __nv_bfloat16 *__restrict__ x, int groups, int k, int m) {
  constexpr int R = CHAINS * 16, STRIDE = KC + 8;
  /* bytes, words (pairs: 16 a group; with the group size unknown, as many as groups of 32 need) */
  constexpr int TILE_CODES = 16 * KC * BITS / 8, TILE_PAIRS = (KC >> (GSHIFT ? GSHIFT : 5)) * 16;
  constexpr int QUAD_BYTES = 128 * BITS;
  constexpr int NT = 32 * WARPS;
  static_assert(BITS == 16 || CHAINS == 1, "affine blocks run one chain of 16 rows");
  extern __shared__ uint4 gv_smem[];
  const int tid = threadIdx.x, lane = tid & 31;
  const int half = WARPS == 2 ? tid >> 5 : 0; /* two warps: the warp's 8 rows of each tile */
  /* every thread's copies of a stage visible to the block, and every thread done reading one */
  auto sync = [&]() {
    if (NT == 32)
      __syncwarp();
    else
      __syncthreads();
  };
  const int x_rows = PLANES * m;
  uint8_t *ring = (uint8_t *)gv_smem;
  /* bf16: the W ring; affine: the codes ring, then the pairs ring */
  uint8_t *codes = ring;
  uint32_t *pairs = (uint32_t *)(ring + STAGES * CHAINS * TILE_CODES);
  __nv_bfloat16 *w_ring = (__nv_bfloat16 *)ring;
  __nv_bfloat16 *sx = BITS == 16 ? w_ring + STAGES * R * STRIDE
                                 : (__nv_bfloat16 *)(pairs + STAGES * CHAINS * TILE_PAIRS);
  __nv_bfloat16 *zero_row = sx + STAGES * x_rows * STRIDE;
  for (int i = tid; i < STRIDE / 8; i += NT) ((uint4 *)zero_row)[i] = make_uint4(0, 0, 0, 0);

  const int segs = SEG ? P.segs : 1, units = groups * segs;
  if ((int)blockIdx.x >= units) { /* (the grid never exceeds the units) */
    ci_grid_begin();
    return;
  }
  const int my_units = (units - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
  const int last_cols = k - (segs - 1) * P.seg_cols;
  const int seg_stages = P.seg_cols / KC, last_stages = (last_cols + KC - 1) / KC;
  const int group_shift = GSHIFT ? GSHIFT : P.group_shift;
  const int quads = (k + 63) / 64, k_groups = k >> group_shift;
  /* my i-th unit: its index, row group, K columns [first, end) and stages (worked out once a
   * unit: a division by the runtime segment count in every stage cost the uncut q4 kernel ~4%) */
  struct unit_info {
    int unit, group, first, end, stages;
    const uint8_t *codes;  /* the group's first tile's codes (bf16: rows) from column `first` on */
    const uint32_t *pairs; /* affine: its (scale, bias) words from column `first` on */
  };
  auto info_of = [&](int i) {
    unit_info u;
    u.unit = (int)blockIdx.x + i * (int)gridDim.x;
    const int seg = segs == 1 ? 0 : u.unit % segs;
    u.group = segs == 1 ? u.unit : u.unit / segs;
    u.first = seg * P.seg_cols;
    u.end = seg == segs - 1 ? k : u.first + P.seg_cols;
    u.stages = seg == segs - 1 ? last_stages : seg_stages;
    /* the part's pointers once a unit, not once a stage (bf16: the group's first row at column
     * `first`) */
    int row0;
    const int part = gv_part_of(P, u.group, CHAINS, &row0);
    if (BITS == 16) {
      u.codes = (const uint8_t *)ci_param_pick(P.w, part) + ((size_t)row0 * k + u.first) * 2;
    } else {
      const size_t tile = (size_t)(row0 / 16);
      u.codes =
          (const uint8_t *)ci_param_pick(P.w, part) + (tile * quads + u.first / 64) * QUAD_BYTES;
      u.pairs = ci_param_pick(P.pairs, part) + (tile * k_groups + (u.first >> group_shift)) * 16;
    }
    return u;
  };
  int load_i = 0, load_k = 0; /* the next stage to load: my unit index, k stage within it */
  unit_info load_u = info_of(0);
  /* the W part of stage lk of unit u into ring slot `slot` */
  auto load_w = [&](int slot, const unit_info &u, int lk) {
    const int k0 = u.first + lk * KC, kn = min(KC, u.end - k0);
    if (BITS == 16) { /* a warp copies 32 16-byte chunks of a row per instruction */
      const __nv_bfloat16 *src = (const __nv_bfloat16 *)u.codes + lk * KC;
      if (kn == KC) { /* a whole stage: the chunk count known at compile time */
#pragma unroll
        for (int i = 0; i < KC / 8 / 32; i++) {
          const int c = lane + 32 * i;
          __nv_bfloat16 *dw = w_ring + slot * R * STRIDE + c * 8;
#pragma unroll
          for (int r = 0; r < R; r++)
            cp_async16_stream(dw + r * STRIDE, src + (size_t)r * k + c * 8);
        }
        return;
      }
      for (int c = lane; c < kn / 8; c += 32) {
        __nv_bfloat16 *dw = w_ring + slot * R * STRIDE + c * 8;
#pragma unroll
        for (int r = 0; r < R; r++) cp_async16_stream(dw + r * STRIDE, src + (size_t)r * k + c * 8);
      }
    } else { /* each tile's stage is one contiguous run of codes, and one of pairs (affine
              * blocks run one chain: CHAINS is 1) */
      const uint8_t *src = u.codes + (size_t)(lk * KC / 64) * QUAD_BYTES;
      const uint32_t *ps = u.pairs + (size_t)((lk * KC) >> group_shift) * 16;
      uint8_t *dc = codes + slot * TILE_CODES;
      uint32_t *dp = pairs + slot * TILE_PAIRS;
      if (kn == KC) { /* a whole stage: copy counts known at compile time */
        constexpr int CODE_CHUNKS = KC / 64 * QUAD_BYTES / 16;
#pragma unroll
        for (int i = 0; i < CODE_CHUNKS / NT; i++)
          cp_async16_stream(dc + (tid + i * NT) * 16, src + (tid + i * NT) * 16);
        if (GSHIFT) {
          constexpr int PAIR_CHUNKS = GSHIFT ? (KC >> GSHIFT) * 4 : 1;
#pragma unroll
          for (int i = 0; i < (PAIR_CHUNKS + NT - 1) / NT; i++)
            if (PAIR_CHUNKS % NT == 0 || tid + i * NT < PAIR_CHUNKS)
              cp_async16_stream(dp + (tid + i * NT) * 4, ps + (tid + i * NT) * 4);
          return;
        }
      } else {
        const int code_chunks = (kn + 63) / 64 * QUAD_BYTES / 16;
        for (int c = tid; c < code_chunks; c += NT) cp_async16_stream(dc + c * 16, src + c * 16);
      }
      const int pair_chunks = (kn >> group_shift) * 4;
      for (int c = tid; c < pair_chunks; c += NT) cp_async16_stream(dp + c * 4, ps + c * 4);
    }
  };
  /* the input part of stage lk of unit u into ring slot `slot` */
  auto load_x = [&](int slot, const unit_info &u, int lk) {
    const int k0 = u.first + lk * KC, kn = min(KC, u.end - k0);
    __nv_bfloat16 *dx = sx + slot * x_rows * STRIDE;
    if (kn == KC) { /* a whole stage: the chunk count known at compile time */
      constexpr int X_CHUNKS = KC / 8;
#pragma unroll
      for (int i = 0; i < (X_CHUNKS + NT - 1) / NT; i++) {
        const int c = tid + i * NT;
        if (X_CHUNKS % NT == 0 || c < X_CHUNKS)
          for (int r = 0; r < x_rows; r++)
            cp_async16_cached(dx + r * STRIDE + c * 8, x + (size_t)r * k + k0 + c * 8);
      }
      return;
    }
    for (int c = tid; c < kn / 8; c += NT)
      for (int r = 0; r < x_rows; r++)
        cp_async16_cached(dx + r * STRIDE + c * 8, x + (size_t)r * k + k0 + c * 8);
  };
  auto advance = [&]() {
    if (++load_k == load_u.stages) {
      load_k = 0;
      if (++load_i < my_units) load_u = info_of(load_i);
    }
  };
  /* The weights never depend on an earlier kernel: the first stages' W tiles load before the
   * wait for the previous kernel (cuda_launch.cuh), the inputs after it. The first commit group
   * then holds those W tiles and stage 0's inputs, so waiting for it still covers stage 0. */
  {
    unit_info u = load_u;
    for (int s = 0, li = 0, lk = 0; s < STAGES - 1 && li < my_units; s++) {
      load_w(s, u, lk);
      if (++lk == u.stages) {
        lk = 0;
        if (++li < my_units) u = info_of(li);
      }
    }
  }
  ci_grid_begin();
#pragma unroll
  for (int s = 0; s < STAGES - 1; s++) {
    if (load_i < my_units) {
      load_x(s, load_u, load_k);
      advance();
    }
    cp_async_commit();
  }

  /* ldmatrix rows: A (bf16 W) tile i = lane / 8 covers rows (i & 1) * 8.., columns (i >> 1) * 8
   * of a chain's 16 rows; B (inputs): an x2 load of the 8 input columns, lanes 0-7 columns 0-7 of
   * k, lanes 8-15 k 8-15. Input column c: plane 1: row c; plane 2: column 2j the value of row j,
   * 2j + 1 its remainder. Missing columns read the zero row. */
  const int tile_id = lane >> 3, tile_row = lane & 7;
  const int a_row = (tile_id & 1) * 8 + tile_row, a_col = (tile_id >> 1) * 8;
  int x_row[XG]; /* column group cg holds input columns 8 cg .. 8 cg + 7 */
#pragma unroll
  for (int cg = 0; cg < XG; cg++) {
    const int col = 8 * cg + tile_row;
    if (PLANES == 1)
      x_row[cg] = col < m ? col : -1;
    else
      x_row[cg] = (col >> 1) < m ? (col & 1) * m + (col >> 1) : -1;
  }
  const int b_col = (tile_id & 1) * 8;
  const int g = lane >> 2, t = lane & 3;

  float c[CHAINS][XG][4];
#pragma unroll
  for (int j = 0; j < CHAINS; j++)
#pragma unroll
    for (int cg = 0; cg < XG; cg++) c[j][cg][0] = c[j][cg][1] = c[j][cg][2] = c[j][cg][3] = 0.0f;
  sync();

  /* The lane's codes of one quad (64 columns) of the stage, and its rows' scales and biases for
   * the quad's two halves (a group holds 32 columns or a multiple, so each half is in one). */
  struct quad_regs {
    uint4 v[CHAINS][2];
    ci_affine_rows rows[CHAINS][2];
  };
  auto load_quad = [&](int slot, int q, quad_regs &Q) {
#pragma unroll
    for (int j = 0; j < CHAINS; j++) {
      const uint8_t *cq = codes + (slot * CHAINS + j) * TILE_CODES + q * QUAD_BYTES + lane * 16;
      Q.v[j][0] = *(const uint4 *)cq;
      if (BITS == 8) Q.v[j][1] = *(const uint4 *)(cq + 512);
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const uint32_t *pw =
            pairs + (slot * CHAINS + j) * TILE_PAIRS + ((q * 64 + h * 32) >> group_shift) * 16;
        Q.rows[j][h] = WARPS == 2 ? ci_affine_rows_of<BITS>(pw[g + 8 * half], pw[g + 8 * half], F16)
                                  : ci_affine_rows_of<BITS>(pw[g], pw[g + 8], F16);
      }
    }
  };
  /* k-step i of the stage in `slot`: A fragments of every chain, one mma each (s = i % 4 must be
   * a compile-time constant: the quad registers are picked by it) */
  auto step = [&](int slot, int i, int s, const __nv_bfloat16 *const *b_base, const quad_regs &Q) {
    uint32_t a[CHAINS][4], b[XG][2];
#pragma unroll
    for (int cg = 0; cg < XG; cg++) ldmatrix_x2(b[cg], b_base[cg] + i * 16);
    if (BITS == 16) {
      const __nv_bfloat16 *a_base = w_ring + slot * R * STRIDE + a_row * STRIDE + a_col;
#pragma unroll
      for (int j = 0; j < CHAINS; j++) ldmatrix_x4(a[j], a_base + j * 16 * STRIDE + i * 16);
    } else {
#pragma unroll
      for (int j = 0; j < CHAINS; j++) {
        uint32_t words[2];
        if (BITS == 4) {
          const uint4 v = Q.v[j][0];
          words[0] = s == 0 ? v.x : s == 1 ? v.y : s == 2 ? v.z : v.w;
        } else {
          const uint4 h = Q.v[j][s >> 1];
          words[0] = (s & 1) ? h.z : h.x;
          words[1] = (s & 1) ? h.w : h.y;
        }
        if (WARPS == 2)
          ci_affine_half_fragment<BITS>(words, half, Q.rows[j][s >> 1], F16, a[j]);
        else
          ci_affine_fragment<BITS>(words, Q.rows[j][s >> 1], F16, a[j]);
      }
    }
#pragma unroll
    for (int j = 0; j < CHAINS; j++)
#pragma unroll
      for (int cg = 0; cg < XG; cg++) mma_bf16(c[j][cg], a[j], b[cg][0], b[cg][1]);
  };

  __shared__ int gv_last; /* the block finishes its row group's last segment */
  int cur = 0, ks = 0;
  unit_info cur_u = info_of(0);
  for (int s = 0; cur < my_units; s++) {
    cp_async_wait<STAGES - 2>();
    sync();
    const int slot = s % STAGES;
    const int kn = min(KC, cur_u.end - cur_u.first - ks * KC);
    const __nv_bfloat16 *b_base[XG];
#pragma unroll
    for (int cg = 0; cg < XG; cg++)
      b_base[cg] = (x_row[cg] >= 0 ? sx + (slot * x_rows + x_row[cg]) * STRIDE : zero_row) + b_col;
    quad_regs Q;
    if (kn == KC) {
#pragma unroll
      for (int i = 0; i < KC / 16; i++) {
        if (BITS != 16 && (i & 3) == 0) load_quad(slot, i >> 2, Q);
        step(slot, i, i & 3, b_base, Q);
      }
    } else if (BITS == 16) {
      for (int i = 0; i < kn / 16; i++) step(slot, i, 0, b_base, Q);
    } else { /* a last quad may hold only 32 columns (K is a multiple of 32) */
      for (int q = 0; q < (kn + 63) / 64; q++) {
        load_quad(slot, q, Q);
#pragma unroll
        for (int s4 = 0; s4 < 4; s4++)
          if (s4 < 2 || q * 64 + 32 < kn) step(slot, 4 * q + s4, s4, b_base, Q);
      }
    }
    sync(); /* every thread is done with the slot the next load overwrites */
    if (load_i < my_units) {
      const int slot_next = (s + STAGES - 1) % STAGES;
      load_w(slot_next, load_u, load_k);
      load_x(slot_next, load_u, load_k);
      advance();
    }
    cp_async_commit();
    if (++ks == cur_u.stages) { /* the unit is done: write it, start the next from zero */
      const int unit = cur_u.unit, group = cur_u.group;
      int n0;
      const int part = gv_part_of(P, group, CHAINS, &n0);
      float *y = ci_param_pick(P.y, part);
      const int n = ci_param_pick(P.n, part);
      if (SEG) { /* this segment's chains into its partial; the group's last unit sums */
        float *mine = P.partial + (size_t)unit * R * x_rows;
#pragma unroll
        for (int j = 0; j < CHAINS; j++)
#pragma unroll
          for (int cg = 0; cg < XG; cg++)
#pragma unroll
            for (int h = 0; h < (WARPS == 2 ? 1 : 2); h++)
#pragma unroll
              for (int e = 0; e < 2; e++) {
                const int col = 8 * cg + 2 * t + e; /* input column */
                const int xr = PLANES == 1 ? col : (col & 1) * m + (col >> 1);
                if ((PLANES == 1 ? col : col >> 1) < m)
                  mine[(16 * j + g + 8 * (h + half)) * x_rows + xr] = c[j][cg][2 * h + e];
              }
        __threadfence();
        sync();
        if (tid == 0) gv_last = atomicAdd(&P.count[group], 1u) == (unsigned)(segs - 1);
        sync();
        if (gv_last) {
          __threadfence();
          const float *first_part = P.partial + (size_t)group * segs * R * x_rows;
          const int unit_floats = R * x_rows;
          /* the block's threads share the group's outputs: R rows of m inputs (two planes: the
           * values' sum plus the remainders' sum) */
#pragma unroll 1
          for (int o = tid; o < R * m; o += NT) {
            const int row = o / m, r = o - row * m;
            const float *at = first_part + row * x_rows + r;
            float v = __ldcg(at);
#pragma unroll 1
            for (int q = 1; q < segs; q++) v += __ldcg(at + q * unit_floats);
            if (PLANES == 2) {
              float rem = __ldcg(at + m);
#pragma unroll 1
              for (int q = 1; q < segs; q++) rem += __ldcg(at + q * unit_floats + m);
              v = v + rem;
            }
            y[(size_t)r * n + n0 + row] = v;
          }
          if (tid == 0) P.count[group] = 0;
        }
      } else {
        /* accumulator (j, cg, lane): W rows n0 + 16j + g and + 8 (affine: the warp's rows
         * n0 + 16j + 8 half + g, as the mma's rows g), input columns 8 cg + 2t and 8 cg + 2t + 1
         * (two planes: both columns are input row 4 cg + t) */
#pragma unroll
        for (int j = 0; j < CHAINS; j++) {
#pragma unroll
          for (int cg = 0; cg < XG; cg++) {
#pragma unroll
            for (int h = 0; h < (WARPS == 2 ? 1 : 2); h++) {
              const int col = n0 + 16 * j + g + 8 * (h + half);
              const float *acc = c[j][cg];
              if (PLANES == 1) {
                const int r = 8 * cg + 2 * t;
                if (r < m) y[(size_t)r * n + col] = acc[2 * h];
                if (r + 1 < m) y[(size_t)(r + 1) * n + col] = acc[2 * h + 1];
              } else if (4 * cg + t < m) {
                y[(size_t)(4 * cg + t) * n + col] = acc[2 * h] + acc[2 * h + 1];
              }
            }
          }
        }
      }
#pragma unroll
      for (int j = 0; j < CHAINS; j++)
#pragma unroll
        for (int cg = 0; cg < XG; cg++)
          c[j][cg][0] = c[j][cg][1] = c[j][cg][2] = c[j][cg][3] = 0.0f;
      ks = 0;
      if (++cur < my_units) cur_u = info_of(cur);
    }
  }
  cp_async_wait<0>();
}

/* Shared memory limits of an affine stage shape: the runtime group size and groups of 64, each
 * with and without K segments. */
template <int BITS, int CHAINS, int PLANES, bool F16, int XG, int WARPS, int STAGES, int KC>
static cudaError_t gv_set_affine_limit() {
  const int bytes =
      (int)gv_smem_bytes(BITS, KC, STAGES, CHAINS, XG == 2 ? GV_MAX_X_ROWS_AFFINE : GV_MAX_X_ROWS);
  const cudaFuncAttribute a = cudaFuncAttributeMaxDynamicSharedMemorySize;
  cudaError_t err =
      cudaFuncSetAttribute(gemv_kernel<BITS, CHAINS, PLANES, STAGES, KC, F16, XG, WARPS>, a, bytes);
  if (err == cudaSuccess)
    err = cudaFuncSetAttribute(gemv_kernel<BITS, CHAINS, PLANES, STAGES, KC, F16, XG, WARPS, 6>, a,
                               bytes);
  if (err == cudaSuccess)
    err = cudaFuncSetAttribute(
        gemv_kernel<BITS, CHAINS, PLANES, STAGES, KC, F16, XG, WARPS, 0, true>, a, bytes);
  if (err == cudaSuccess)
    err = cudaFuncSetAttribute(
        gemv_kernel<BITS, CHAINS, PLANES, STAGES, KC, F16, XG, WARPS, 6, true>, a, bytes);
  return err;
}

template <int BITS, int CHAINS, int PLANES, bool F16, int XG, int WARPS>
static cudaError_t gv_set_limit() {
  if constexpr (BITS == 16) {
    cudaError_t err = cudaFuncSetAttribute(
        gemv_kernel<BITS, CHAINS, PLANES, GV_STAGES, gv_kc(BITS, XG), F16, XG, WARPS>,
        cudaFuncAttributeMaxDynamicSharedMemorySize,
        (int)gv_smem_bytes(BITS, gv_kc(BITS, XG), GV_STAGES, CHAINS, GV_MAX_X_ROWS));
    if (err == cudaSuccess)
      err = cudaFuncSetAttribute(
          gemv_kernel<BITS, CHAINS, PLANES, GV_WIDE_STAGES, GV_WIDE_KC, F16, XG, WARPS>,
          cudaFuncAttributeMaxDynamicSharedMemorySize,
          (int)gv_smem_bytes(BITS, GV_WIDE_KC, GV_WIDE_STAGES, CHAINS, GV_WIDE_MAX_X_ROWS));
    return err;
  } else if constexpr (XG == 2) { /* every stage shape of affine weights */
    return gv_set_affine_limit<BITS, CHAINS, PLANES, F16, XG, WARPS, GV_STAGES, gv_kc(BITS, XG)>();
  } else {
    cudaError_t err = gv_set_affine_limit<BITS, CHAINS, PLANES, F16, XG, WARPS, GV_AFFINE_STAGES,
                                          gv_kc(BITS, XG)>();
    if (err == cudaSuccess)
      err = gv_set_affine_limit<BITS, CHAINS, PLANES, F16, XG, WARPS, GV_NARROW_STAGES,
                                GV_NARROW_KC>();
    if (err == cudaSuccess)
      err = gv_set_affine_limit<BITS, CHAINS, PLANES, F16, XG, WARPS, GV_SHALLOW_STAGES,
                                GV_NARROW_KC>();
    return err;
  }
}

template <int BITS, bool F16> static cudaError_t gv_set_limits() {
  cudaError_t err = cudaSuccess;
  if constexpr (BITS == 16) {
    err = gv_set_limit<BITS, 1, 1, F16, 1, 1>();
    if (err == cudaSuccess) err = gv_set_limit<BITS, 1, 2, F16, 1, 1>();
    if (err == cudaSuccess) err = gv_set_limit<BITS, 2, 1, F16, 1, 1>();
    if (err == cudaSuccess) err = gv_set_limit<BITS, 2, 2, F16, 1, 1>();
  } else {
    if (err == cudaSuccess) err = gv_set_limit<BITS, 1, 1, F16, 1, 1>();
    if (err == cudaSuccess) err = gv_set_limit<BITS, 1, 2, F16, 1, 1>();
    if (err == cudaSuccess) err = gv_set_limit<BITS, 1, 1, F16, 2, 1>();
    if (err == cudaSuccess) err = gv_set_limit<BITS, 1, 2, F16, 2, 1>();
    if (err == cudaSuccess) err = gv_set_limit<BITS, 1, 1, F16, 1, 2>();
    if (err == cudaSuccess) err = gv_set_limit<BITS, 1, 2, F16, 1, 2>();
    if (err == cudaSuccess) err = gv_set_limit<BITS, 1, 1, F16, 2, 2>();
    if (err == cudaSuccess) err = gv_set_limit<BITS, 1, 2, F16, 2, 2>();
  }
  return err;
}

int ci_cuda_gemv_init(ci_cuda *cu) {
  cu->gemv_counts = (unsigned *)ci_cuda_malloc(cu, CI_CUDA_GEMV_COUNTS * sizeof(unsigned));
  if (!cu->gemv_counts) return CI_ERR;
  cudaError_t err = cudaMemset(cu->gemv_counts, 0, CI_CUDA_GEMV_COUNTS * sizeof(unsigned));
  /* CINFER_CUDA_K_SEGMENTS=N[,ABOVE[,SHORT]]: N segments for affine rows longer than ABOVE
   * columns (q8 too; by default q8 takes as many as give ~512 units, at most N), SHORT for q4
   * rows of 2048 to ABOVE columns in matrices of up to 4096 rows (default 4,4096,2; 0 or 1:
   * none), for measuring and for tests that cut small models */
  const char *seg_env = getenv("CINFER_CUDA_K_SEGMENTS");
  cu->k_rule = ci_cuda_k_rule_default();
  if (seg_env) {
    char *end = NULL;
    cu->k_rule.segments = (int)strtol(seg_env, &end, 10);
    if (end && *end == ',') cu->k_rule.above = (int)strtol(end + 1, &end, 10);
    if (end && *end == ',') cu->k_rule.short_segments = (int)strtol(end + 1, NULL, 10);
    cu->k_rule.q8_units = 0; /* N applies to q8 too */
  }
  /* CINFER_CUDA_GEMV_SHAPE=512x3|256x4|256x3: every affine launch of up to 8 input rows streams
   * that stage shape (gv_affine_shape), for measuring */
  const char *shape_env = getenv("CINFER_CUDA_GEMV_SHAPE");
  cu->gemv_shape = !shape_env                    ? -1
                   : !strcmp(shape_env, "256x4") ? CI_CUDA_GEMV_256x4
                   : !strcmp(shape_env, "256x3") ? CI_CUDA_GEMV_256x3
                                                 : CI_CUDA_GEMV_512x3;
  if (err == cudaSuccess) err = gv_set_limits<16, false>();
  if (err == cudaSuccess) err = gv_set_limits<8, false>();
  if (err == cudaSuccess) err = gv_set_limits<8, true>();
  if (err == cudaSuccess) err = gv_set_limits<4, false>();
  if (err == cudaSuccess) err = gv_set_limits<4, true>();
  int smem = 0;
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, cu->device);
  cu->smem_per_sm = smem;
  return err == cudaSuccess ? CI_OK
                            : ci_fail("CUDA: matmul kernel setup: %s", cudaGetErrorString(err));
}

void ci_cuda_gemv_destroy(ci_cuda *cu) {
  if (cu->gemv_counts) cudaFree(cu->gemv_counts);
  cu->gemv_counts = NULL;
}

int ci_cuda_gemv_fits(int dtype, int64_t n, int64_t k, int64_t m, int planes) {
  const int bits = dtype == CI_BF16 ? 16 : dtype == CI_Q8 ? 8 : dtype == CI_Q4 ? 4 : 0;
  const int max_rows = bits == 16 ? GV_MAX_X_ROWS : GV_MAX_X_ROWS_AFFINE;
  return bits && m >= 1 && planes * m <= max_rows && n % 16 == 0 &&
         k % (bits == 16 ? 16 : 32) == 0 && n <= ((int64_t)1 << 24) && k <= ((int64_t)1 << 24);
}

/* How many blocks fit on an SM (shared memory, and the 32-block limit, less one KB of shared
 * memory the runtime reserves per block). */
static int gv_blocks_per_sm_of(int smem_per_sm, size_t smem) {
  const int by_smem = (int)((size_t)smem_per_sm / (smem + 1024));
  return by_smem < 1 ? 1 : by_smem > 32 ? 32 : by_smem;
}
static int gv_blocks_per_sm(const ci_cuda *cu, size_t smem) {
  return gv_blocks_per_sm_of(cu->smem_per_sm, smem);
}

/* The stage shape of an affine launch of `units` (row group, segment) units times x_rows input
 * rows (one column group), GSHIFT as the kernel's: the first of 512 x 3, 256 x 4 and 256 x 3 whose
 * blocks all fit on the GPU at once (one block a unit, so the launch runs as one wave). Where none
 * does, each block walks several units either way: 256 x 4 for q4 times several input rows, else
 * 512 x 3 (measured, H200, 8B geometry: the q4 head at one row 92 us in 512 x 3, 105 in 256 x 4;
 * q4 at 8 rows, gate|up and head in 256 x 4 decode 2,250-2,280 tok/s, in 512 x 3 1,910-1,930;
 * q8 at 8 rows 1,760-1,780 in 512 x 3, 1,650-1,660 in 256 x 4). */
static int gv_affine_shape(int bits, int64_t units, int64_t x_rows, int gshift, int n_sms,
                           int smem_per_sm) {
  static const int shapes[][3] = {{CI_CUDA_GEMV_512x3, gv_kc(8), GV_AFFINE_STAGES},
                                  {CI_CUDA_GEMV_256x4, GV_NARROW_KC, GV_NARROW_STAGES},
                                  {CI_CUDA_GEMV_256x3, GV_NARROW_KC, GV_SHALLOW_STAGES}};
  for (const auto &sh : shapes) {
    const size_t smem = gv_smem_bytes(bits, sh[1], sh[2], 1, (int)x_rows, gshift);
    if (units <= (int64_t)n_sms * gv_blocks_per_sm_of(smem_per_sm, smem)) return sh[0];
  }
  return bits == 4 && x_rows > 1 ? CI_CUDA_GEMV_256x4 : CI_CUDA_GEMV_512x3;
}

extern "C" int ci_cuda_gemv_shape_host(int dtype, int64_t units, int64_t x_rows, int group,
                                       int n_sms, int smem_per_sm) {
  const int gshift = group == 64 ? 6 : 0; /* as gv_launch_affine picks the kernel */
  return gv_affine_shape(dtype == CI_Q8 ? 8 : 4, units, x_rows, gshift, n_sms, smem_per_sm);
}

template <int BITS, bool F16, int XG, int STAGES, int KC, int WARPS, int GSHIFT = 0>
static void gv_launch_at(ci_cuda *cu, const gv_parts &P, int chains, int groups, int64_t k,
                         const __nv_bfloat16 *x, int64_t m, int planes, dim3 grid, size_t smem) {
  if constexpr (BITS == 16) { /* affine weights run one chain per warp */
    if (chains == 2 && planes == 1) {
      ci_launch(cu, gemv_kernel<BITS, 2, 1, STAGES, KC, F16, XG, WARPS>, grid, 32 * WARPS, smem, P,
                x, groups, (int)k, (int)m);
      return;
    }
    if (chains == 2) {
      ci_launch(cu, gemv_kernel<BITS, 2, 2, STAGES, KC, F16, XG, WARPS>, grid, 32 * WARPS, smem, P,
                x, groups, (int)k, (int)m);
      return;
    }
  }
  if constexpr (BITS != 16) { /* affine weights may be cut into K segments */
    if (P.segs > 1) {
      if (planes == 1)
        ci_launch(cu, gemv_kernel<BITS, 1, 1, STAGES, KC, F16, XG, WARPS, GSHIFT, true>, grid,
                  32 * WARPS, smem, P, x, groups, (int)k, (int)m);
      else
        ci_launch(cu, gemv_kernel<BITS, 1, 2, STAGES, KC, F16, XG, WARPS, GSHIFT, true>, grid,
                  32 * WARPS, smem, P, x, groups, (int)k, (int)m);
      return;
    }
  }
  if (planes == 1)
    ci_launch(cu, gemv_kernel<BITS, 1, 1, STAGES, KC, F16, XG, WARPS, GSHIFT>, grid, 32 * WARPS,
              smem, P, x, groups, (int)k, (int)m);
  else
    ci_launch(cu, gemv_kernel<BITS, 1, 2, STAGES, KC, F16, XG, WARPS, GSHIFT>, grid, 32 * WARPS,
              smem, P, x, groups, (int)k, (int)m);
}

/* Whether affine blocks run as two warps that split each tile's rows. The affine k-step is bound
 * by instruction issue, so two warps pay where one-warp blocks would give an SM fewer than 7
 * warps to issue from (few tiles, or few resident blocks: q8's larger stages). Where they already
 * give it 7 or 8, the second warp only repeats the first's loads of codes and inputs and its
 * half-empty products. With two column groups of inputs (XG 2) every fragment already feeds two
 * products, so two warps pay only where block slots would stay empty. H200, one launch, us
 * (one warp / two): q4 batch 1, 8B gate|up (1,792 tiles, 8 blocks an SM) 39.3 / 46.1, 1B gate|up
 * (1,024) 14.5 / 16.5, 8B down (256) 47.9 / 39.8; q8 (5 blocks an SM) 8B gate|up 60.1 / 57.5, head
 * 235 / 214; q4 16 rows, 1B gate|up 31.0 / 32.2, 8B down 86.4 / 79.0. */
static int gv_affine_warps(const ci_cuda *cu, int64_t units, int64_t resident, int xg) {
  if (xg == 2) return units < resident ? 2 : 1;
  const int64_t busy = units < resident ? units : resident; /* one-warp blocks at once */
  return busy < 7 * (int64_t)cu->n_sms ? 2 : 1;
}

/* Affine weights in stages of KC columns, STAGES deep: the grid and the warps of a block. */
template <int BITS, bool F16, int XG, int STAGES, int KC, int GSHIFT>
static void gv_launch_affine_shape(ci_cuda *cu, const gv_parts &P, int groups, int64_t k,
                                   const __nv_bfloat16 *x, int64_t m, int planes) {
  const size_t smem = gv_smem_bytes(BITS, KC, STAGES, 1, (int)(planes * m), GSHIFT);
  const int64_t resident = (int64_t)cu->n_sms * gv_blocks_per_sm(cu, smem);
  const int64_t units = (int64_t)groups * P.segs;
  const dim3 grid((unsigned)(units < resident ? units : resident));
  if (gv_affine_warps(cu, units, resident, XG) == 2)
    gv_launch_at<BITS, F16, XG, STAGES, KC, 2, GSHIFT>(cu, P, 1, groups, k, x, m, planes, grid,
                                                       smem);
  else
    gv_launch_at<BITS, F16, XG, STAGES, KC, 1, GSHIFT>(cu, P, 1, groups, k, x, m, planes, grid,
                                                       smem);
}

/* The grid is the groups, at most one wave of resident blocks (each then walks several groups).
 * The stage shape and the warps of a block never change a bit of the result: each output is the
 * same chain over K. */
template <int BITS, bool F16, int XG, int GSHIFT = 0>
static void gv_launch(ci_cuda *cu, const gv_parts &P, int chains, int groups, int64_t k,
                      const __nv_bfloat16 *x, int64_t m, int planes) {
  if constexpr (BITS == 16) {
    const bool wide = planes * m <= GV_WIDE_MAX_X_ROWS;
    const size_t smem =
        wide ? gv_smem_bytes(BITS, GV_WIDE_KC, GV_WIDE_STAGES, chains, (int)(planes * m))
             : gv_smem_bytes(BITS, gv_kc(BITS, XG), GV_STAGES, chains, (int)(planes * m));
    const int64_t resident = (int64_t)cu->n_sms * gv_blocks_per_sm(cu, smem);
    const int64_t units = (int64_t)groups * P.segs;
    const dim3 grid((unsigned)(units < resident ? units : resident));
    if (wide)
      gv_launch_at<BITS, F16, XG, GV_WIDE_STAGES, GV_WIDE_KC, 1>(cu, P, chains, groups, k, x, m,
                                                                 planes, grid, smem);
    else
      gv_launch_at<BITS, F16, XG, GV_STAGES, gv_kc(BITS, XG), 1>(cu, P, chains, groups, k, x, m,
                                                                 planes, grid, smem);
  } else if constexpr (XG == 2) {
    gv_launch_affine_shape<BITS, F16, XG, GV_STAGES, gv_kc(BITS, XG), GSHIFT>(cu, P, groups, k, x,
                                                                              m, planes);
  } else {
    int shape = cu->gemv_shape; /* CINFER_CUDA_GEMV_SHAPE, for measuring */
    if (shape < 0)
      shape = gv_affine_shape(BITS, (int64_t)groups * P.segs, planes * m, GSHIFT, cu->n_sms,
                              cu->smem_per_sm);
    if (shape == CI_CUDA_GEMV_256x4)
      gv_launch_affine_shape<BITS, F16, XG, GV_NARROW_STAGES, GV_NARROW_KC, GSHIFT>(
          cu, P, groups, k, x, m, planes);
    else if (shape == CI_CUDA_GEMV_256x3)
      gv_launch_affine_shape<BITS, F16, XG, GV_SHALLOW_STAGES, GV_NARROW_KC, GSHIFT>(
          cu, P, groups, k, x, m, planes);
    else
      gv_launch_affine_shape<BITS, F16, XG, GV_AFFINE_STAGES, gv_kc(BITS, XG), GSHIFT>(
          cu, P, groups, k, x, m, planes);
  }
}

/* Affine weights: one column group of inputs up to 8 input rows (planes x rows), two above;
 * groups of 64 with the group size a constant of the kernel. */
template <int BITS, bool F16>
static void gv_launch_affine(ci_cuda *cu, const gv_parts &P, int groups, int64_t k,
                             const __nv_bfloat16 *x, int64_t m, int planes) {
  const bool wide = planes * m > GV_MAX_X_ROWS;
  if (P.group_shift == 6)
    wide ? gv_launch<BITS, F16, 2, 6>(cu, P, 1, groups, k, x, m, planes)
         : gv_launch<BITS, F16, 1, 6>(cu, P, 1, groups, k, x, m, planes);
  else
    wide ? gv_launch<BITS, F16, 2>(cu, P, 1, groups, k, x, m, planes)
         : gv_launch<BITS, F16, 1>(cu, P, 1, groups, k, x, m, planes);
}

void ci_cuda_gemv_launch(ci_cuda *cu, int parts, const ci_cuda_weight *w, const int64_t *n,
                         float *const *y, int64_t k, const void *x, int64_t m, int planes,
                         int64_t seg_cols, float *partial) {
  /* two chains per warp where that still leaves two warps per SM */
  int64_t rows = 0;
  int even = 1;
  for (int p = 0; p < parts; p++) {
    rows += n[p];
    even &= n[p] % 32 == 0;
  }
  /* affine weights: one chain per warp always (their k-steps cost more instructions than a bf16
   * step, so twice the warps beat two interleaved chains) */
  const int chains = even && rows / 32 >= 2 * (int64_t)cu->n_sms && w[0].dtype == CI_BF16 ? 2 : 1;
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
  P.group_shift = w[0].group_size > 0 ? __builtin_ctz((unsigned)w[0].group_size) : 0;
  P.segs = (int)((k + seg_cols - 1) / seg_cols);
  P.seg_cols = (int)seg_cols;
  P.partial = partial;
  P.count = cu->gemv_counts;
  const __nv_bfloat16 *xb = (const __nv_bfloat16 *)x;
  const bool f16 = w[0].f16_pairs;
  if (w[0].dtype == CI_Q4 && f16)
    gv_launch_affine<4, true>(cu, P, groups, k, xb, m, planes);
  else if (w[0].dtype == CI_Q4)
    gv_launch_affine<4, false>(cu, P, groups, k, xb, m, planes);
  else if (w[0].dtype == CI_Q8 && f16)
    gv_launch_affine<8, true>(cu, P, groups, k, xb, m, planes);
  else if (w[0].dtype == CI_Q8)
    gv_launch_affine<8, false>(cu, P, groups, k, xb, m, planes);
  else
    gv_launch<16, false, 1>(cu, P, chains, groups, k, xb, m, planes);
  ci_cuda_check_launch(cu, "matmul (small batch)");
}
