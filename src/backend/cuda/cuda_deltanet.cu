/* Gated DeltaNet (Qwen3.5 linear attention, docs/models.md §5.8) and the sigmoid output gate on
 * the GPU. One op is one command that runs four kernels, each split so that a sequence's results
 * never depend on the other sequences of the step:
 *   1. conv: one thread per (sequence, channel) walks the sequence's rows in order with the
 *      convolution window in registers (the stored tail, then each new input), writes SiLU of
 *      the causal depthwise convolution in place, the tail after each row to the checkpoints of a
 *      speculative round, and the new tail to the state;
 *   2. prepare: one warp per (row, q or k head) L2-normalises the head in place (q also scaled by
 *      Dk^-1/2), the sum of squares by a fixed shuffle tree;
 *   3. recurrence: one block per (sequence, value head, tile of 32 value columns) keeps its
 *      [Dk, 32] slice of the state in registers (four warps, each Dk/4 rows of the key
 *      dimension) and runs the gated delta rule over the sequence's rows one by one —
 *      S <- gamma S;  S <- S + k (beta (v - k S));  y = q S — the reductions over the key
 *      dimension in a fixed order (each thread over its rows, then the four warps in order);
 *      beta = sigmoid(b) and gamma = exp(-exp(A_log) softplus(a + dt_bias)) per row; the next
 *      row's inputs load into registers while a row computes;
 *   4. norm: one warp per (row, value head): the gated RMSNorm y rsqrt(mean(y^2) + eps) w silu(z).
 * Prefill runs the same recurrent form sequentially over a sequence's rows (parallel over value
 * heads and columns), not the CPU's block-parallel chunked form: the same function of the inputs,
 * with exactly the arithmetic of single-row decode steps, so a prompt fed in any chunking gives
 * bit-identical states. The per-sequence table (state, checkpoints, rows) goes through the
 * staging ring; no device memory is allocated and nothing waits for the host. */
#include "backend/cuda/cuda_internal.h"

#include <stdlib.h>
#include <string.h>

enum {
  MAX_CONV_KERNEL = 16, /* as the CPU backend */
  WARPS = 4,            /* recurrence: warps per block, splitting the key dimension */
  COLS = 32,            /* recurrence: value columns per block (one per lane) */
  MAX_KEY_DIM = 256,    /* WARPS * the largest rows-per-thread instantiation */
  THREADS = 256         /* conv, prepare, norm, sigmoid_mul */
};

/* One sequence of a launch, in device memory. */
typedef struct {
  float *state;      /* this layer's part: the tail [K1, C], then [Hv, Dk, Dv] */
  float *checkpoint; /* NULL, or the state after row r at checkpoint + r * checkpoint_stride */
  int32_t first_row, n_rows;
} dn_seq;

__device__ static inline float dn_silu(float x) {
  return x / (1.0f + expf(-x));
}

/* torch.nn.functional.softplus (beta 1, threshold 20), as the CPU. */
__device__ static inline float dn_softplus(float x) {
  return x > 20.0f ? x : log1pf(expf(x));
}

__device__ static inline float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

/* Grid (channel blocks, sequences). */
__global__ static void dn_conv_kernel(const dn_seq *seqs, float *qkv, const float *conv_w, int C,
                                      int Kc, int64_t checkpoint_stride) {
  ci_grid_begin();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const dn_seq s = seqs[blockIdx.y];
  const int K1 = Kc - 1;
  float *rows = qkv + (int64_t)s.first_row * C;
  float w[MAX_CONV_KERNEL], win[MAX_CONV_KERNEL]; /* win[j]: the input j rows back from K1 */
#pragma unroll
  for (int k = 0; k < MAX_CONV_KERNEL; k++) {
    w[k] = k < Kc ? conv_w[(int64_t)c * Kc + k] : 0.0f;
    win[k] = k < K1 ? s.state[(int64_t)k * C + c] : 0.0f;
  }
  for (int t = 0; t < s.n_rows; t++) {
    const float x = rows[(int64_t)t * C + c];
    float acc = 0.0f; /* sum over k of w[k] X(t + k), k in order, as the CPU */
#pragma unroll
    for (int k = 0; k < MAX_CONV_KERNEL; k++) {
      if (k < K1)
        acc += w[k] * win[k];
      else if (k == K1)
        acc += w[k] * x;
    }
#pragma unroll
    for (int k = 0; k + 1 < MAX_CONV_KERNEL; k++)
      if (k + 1 < K1) win[k] = win[k + 1];
#pragma unroll
    for (int k = 0; k < MAX_CONV_KERNEL; k++)
      if (k == K1 - 1) win[k] = x;
    rows[(int64_t)t * C + c] = dn_silu(acc);
    if (s.checkpoint) /* the tail after row t */
#pragma unroll
      for (int k = 0; k < MAX_CONV_KERNEL; k++)
        if (k < K1) s.checkpoint[t * checkpoint_stride + (int64_t)k * C + c] = win[k];
  }
#pragma unroll
  for (int k = 0; k < MAX_CONV_KERNEL; k++)
    if (k < K1) s.state[(int64_t)k * C + c] = win[k];
}

/* Warp-sized grid-stride loop: w takes each of [0, n) in one warp (all its lanes alike). */
#define FOR_EACH_WARP(w, n)                                                                        \
  for (int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; w < (n);                 \
       w += (int64_t)gridDim.x * blockDim.x / 32)

/* One warp per (row, head) of the 2 Hk q and k heads. */
__global__ static void dn_prepare_kernel(float *qkv, int64_t rows, int C, int Hk, int Dk) {
  ci_grid_begin();
  const int lane = threadIdx.x % 32;
  const float q_scale = 1.0f / sqrtf((float)Dk);
  FOR_EACH_WARP(w, rows * 2 * Hk) {
    const int64_t row = w / (2 * Hk);
    const int h = (int)(w % (2 * Hk));
    float *x = qkv + row * C + (int64_t)h * Dk;
    float sum = 0.0f;
    for (int i = lane; i < Dk; i += 32) sum += x[i] * x[i];
    sum = warp_sum(sum);
    const float inv = 1.0f / sqrtf(sum + 1e-6f);
    for (int i = lane; i < Dk; i += 32) {
      float v = x[i] * inv;
      if (h < Hk) v *= q_scale;
      x[i] = v;
    }
  }
}

/* Grid (column tiles, Hv, sequences), WARPS * 32 threads; lane l owns value column
 * blockIdx.x * COLS + l, warp w its key rows [w R, w R + R). Shared: the row's q and k heads
 * [WARPS R] (zero past Dk, so rows past Dk add exact zeros), and the warps' partial sums. */
template <int R>
__global__ static void __launch_bounds__(WARPS * 32)
    dn_recurrence_kernel(const dn_seq *seqs, const float *qkv, const float *b, const float *a,
                         const float *a_log, const float *dt_bias, float *out, int Hk, int Hv,
                         int Dk, int Dv, int64_t conv_floats, int64_t checkpoint_stride) {
  ci_grid_begin();
  __shared__ float sq[WARPS * R], sk[WARPS * R];
  __shared__ float red_m[WARPS * 32], red_y[WARPS * 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int j = blockIdx.x * COLS + lane;
  const int hv = blockIdx.y;
  const dn_seq s = seqs[blockIdx.z];
  const int hk = hv / (Hv / Hk);
  const int64_t Kd = (int64_t)Hk * Dk, Vd = (int64_t)Hv * Dv, C = 2 * Kd + Vd;
  const int64_t head = conv_floats + (int64_t)hv * Dk * Dv; /* this head's S in a state */
  const bool col = j < Dv;
  float *S = s.state + head;
  float st[R]; /* st[i] = S[warp R + i][j] */
#pragma unroll
  for (int i = 0; i < R; i++) {
    const int d = warp * R + i;
    st[i] = col && d < Dk ? S[(int64_t)d * Dv + j] : 0.0f;
  }
  const float A = expf(a_log[hv]), bias = dt_bias[hv];
  /* row t + 1's inputs load into registers while row t computes: thread x holds q and k
   * elements x + l WARPS 32 (l < LOADS), its column's v, and the head's b and a */
  constexpr int LOADS = (WARPS * R + WARPS * 32 - 1) / (WARPS * 32);
  float nq[LOADS], nk[LOADS], nv = 0.0f, nb = 0.0f, na = 0.0f;
  auto load_row = [&](int64_t row) {
    const float *q = qkv + row * C + (int64_t)hk * Dk, *k = q + Kd;
#pragma unroll
    for (int l = 0; l < LOADS; l++) {
      const int i = threadIdx.x + l * WARPS * 32;
      nq[l] = i < Dk ? q[i] : 0.0f;
      nk[l] = i < Dk ? k[i] : 0.0f;
    }
    nv = col ? qkv[row * C + 2 * Kd + (int64_t)hv * Dv + j] : 0.0f;
    nb = b[row * Hv + hv];
    na = a[row * Hv + hv];
  };
  load_row(s.first_row);
  for (int t = 0; t < s.n_rows; t++) {
    const int64_t row = (int64_t)s.first_row + t;
    __syncthreads(); /* the previous row's readers of sq, sk are done */
#pragma unroll
    for (int l = 0; l < LOADS; l++) {
      const int i = threadIdx.x + l * WARPS * 32;
      if (i < WARPS * R) { /* rows past Dk hold the zeros load_row gave them */
        sq[i] = nq[l];
        sk[i] = nk[l];
      }
    }
    const float beta = 1.0f / (1.0f + expf(-nb));
    const float gamma = expf(-A * dn_softplus(na + bias));
    const float v = nv;
    if (t + 1 < s.n_rows) load_row(row + 1);
    __syncthreads();
    float m = 0.0f; /* (k S)[j] over this warp's rows */
#pragma unroll
    for (int i = 0; i < R; i++) {
      st[i] *= gamma;
      m += sk[warp * R + i] * st[i];
    }
    red_m[warp * 32 + lane] = m;
    __syncthreads();
    m = red_m[lane];
#pragma unroll
    for (int w = 1; w < WARPS; w++) m += red_m[w * 32 + lane];
    const float delta = (v - m) * beta;
    float y = 0.0f; /* (q S)[j] over this warp's rows, with the updated S */
#pragma unroll
    for (int i = 0; i < R; i++) {
      st[i] += sk[warp * R + i] * delta;
      y += sq[warp * R + i] * st[i];
    }
    red_y[warp * 32 + lane] = y;
    if (s.checkpoint && col) {
      float *ck = s.checkpoint + t * checkpoint_stride + head;
#pragma unroll
      for (int i = 0; i < R; i++) {
        const int d = warp * R + i;
        if (d < Dk) ck[(int64_t)d * Dv + j] = st[i];
      }
    }
    __syncthreads();
    if (warp == 0 && col) {
      float sum = red_y[lane];
#pragma unroll
      for (int w = 1; w < WARPS; w++) sum += red_y[w * 32 + lane];
      out[row * Vd + (int64_t)hv * Dv + j] = sum;
    }
  }
  if (col)
#pragma unroll
    for (int i = 0; i < R; i++) {
      const int d = warp * R + i;
      if (d < Dk) S[(int64_t)d * Dv + j] = st[i];
    }
}

/* One warp per (row, value head): out = out rsqrt(mean(out^2) + eps) w silu(z). */
__global__ static void dn_norm_kernel(float *out, const float *z, const float *w, int64_t rows,
                                      int Hv, int Dv, float eps) {
  ci_grid_begin();
  const int lane = threadIdx.x % 32;
  FOR_EACH_WARP(rh, rows * Hv) {
    float *y = out + rh * Dv; /* rows are [Hv, Dv]: (row, head) rh starts at rh Dv */
    const float *g = z + rh * Dv;
    float sum = 0.0f;
    for (int i = lane; i < Dv; i += 32) sum += y[i] * y[i];
    sum = warp_sum(sum);
    const float inv = 1.0f / sqrtf(sum / (float)Dv + eps);
    for (int i = lane; i < Dv; i += 32) y[i] = y[i] * inv * w[i] * dn_silu(g[i]);
  }
}

__global__ static void sigmoid_mul_kernel(float *x, const float *gate, int64_t n) {
  ci_grid_begin();
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    x[i] *= 1.0f / (1.0f + expf(-gate[i]));
}

static unsigned blocks_for(int64_t threads) {
  const int64_t b = (threads + THREADS - 1) / THREADS;
  return (unsigned)(b < 1 ? 1 : (b > 1048576 ? 1048576 : b));
}

void ci_cuda_sigmoid_mul_launch(ci_cuda *cu, float *x, const float *gate, int64_t n) {
  if (n <= 0) return;
  ci_launch(cu, sigmoid_mul_kernel, blocks_for(n), THREADS, 0, x, gate, n);
  ci_cuda_check_launch(cu, "sigmoid_mul");
}

void ci_cuda_sigmoid_mul(ci_cuda *cu, float *x, const float *gate, int64_t n) {
  if (n <= 0) return;
  ci_cuda_cmd cmd;
  memset(&cmd, 0, sizeof cmd);
  cmd.kind = CMD_SIGMOID_MUL;
  cmd.a.vec.x = x;
  cmd.a.vec.y = gate;
  cmd.a.vec.n = n;
  ci_cuda_emit(cu, &cmd);
}

int ci_cuda_deltanet_launch(ci_cuda *cu, const ci_cuda_cmd *cmd) {
  const ci_cuda_deltanet_params *p = &cmd->a.deltanet;
  const dn_seq *seqs = (const dn_seq *)p->seqs;
  const int Kd = p->n_k_heads * p->k_head_dim, Vd = p->n_v_heads * p->v_head_dim;
  const int C = 2 * Kd + Vd;
  const int64_t conv_floats = (int64_t)(p->conv_kernel - 1) * C;
  const dim3 conv_grid((unsigned)((C + THREADS - 1) / THREADS), (unsigned)p->n_seqs);
  ci_launch(cu, dn_conv_kernel, conv_grid, THREADS, 0, seqs, p->qkv, p->conv_w, C, p->conv_kernel,
            p->checkpoint_stride);
  ci_launch(cu, dn_prepare_kernel, blocks_for(p->total_rows * 2 * p->n_k_heads * 32), THREADS, 0,
            p->qkv, p->total_rows, C, p->n_k_heads, p->k_head_dim);
  const dim3 grid((unsigned)((p->v_head_dim + COLS - 1) / COLS), (unsigned)p->n_v_heads,
                  (unsigned)p->n_seqs);
  const int per_warp = (p->k_head_dim + WARPS - 1) / WARPS;
#define RECURRENCE(R)                                                                              \
  ci_launch(cu, dn_recurrence_kernel<R>, grid, WARPS * 32, 0, seqs, p->qkv, p->b, p->a, p->a_log,  \
            p->dt_bias, p->out, p->n_k_heads, p->n_v_heads, p->k_head_dim, p->v_head_dim,          \
            conv_floats, p->checkpoint_stride)
  if (per_warp <= 8)
    RECURRENCE(8);
  else if (per_warp <= 16)
    RECURRENCE(16);
  else if (per_warp <= 32)
    RECURRENCE(32);
  else
    RECURRENCE(64);
#undef RECURRENCE
  ci_launch(cu, dn_norm_kernel, blocks_for(p->total_rows * p->n_v_heads * 32), THREADS, 0, p->out,
            p->z, p->norm_w, p->total_rows, p->n_v_heads, p->v_head_dim, p->norm_eps);
  return ci_cuda_check_launch(cu, "gated deltanet");
}

int ci_cuda_gated_deltanet(ci_cuda *cu, const ci_deltanet_args *a) {
  if (a->n_seqs < 1) return CI_OK;
  if (a->n_k_heads < 1 || a->n_v_heads % a->n_k_heads != 0 || a->k_head_dim < 1 ||
      a->v_head_dim < 1 || a->conv_kernel < 1 || a->conv_kernel > MAX_CONV_KERNEL ||
      a->k_head_dim > MAX_KEY_DIM)
    return ci_fail("gated deltanet on CUDA: unsupported geometry (Hk %d, Hv %d, Dk %d, Dv %d, "
                   "kernel %d; the kernel is at most %d and Dk at most %d)",
                   a->n_k_heads, a->n_v_heads, a->k_head_dim, a->v_head_dim, a->conv_kernel,
                   MAX_CONV_KERNEL, MAX_KEY_DIM);
  if (a->n_seqs > 65535)
    return ci_fail("gated deltanet on CUDA: %d sequences in one step (at most 65535)", a->n_seqs);
  const int64_t C =
      2 * (int64_t)a->n_k_heads * a->k_head_dim + (int64_t)a->n_v_heads * a->v_head_dim;
  const int64_t state_floats =
      (int64_t)(a->conv_kernel - 1) * C + (int64_t)a->n_v_heads * a->k_head_dim * a->v_head_dim;
  if (C > INT32_MAX / 2 || state_floats > INT32_MAX)
    return ci_fail("gated deltanet on CUDA: %lld channels are too many", (long long)C);
  int64_t rows = 0;
  for (int i = 0; i < a->n_seqs; i++) {
    if (a->n_rows[i] < 1 || a->first_row[i] != rows)
      return ci_fail("gated deltanet: sequence %d's rows are not contiguous", i);
    rows += a->n_rows[i];
  }
  void *staged = NULL; /* the sequences' table, written straight into the staging ring */
  const size_t table_bytes = (size_t)a->n_seqs * sizeof(dn_seq);
  void *seqs = ci_cuda_stage_reserve(cu, table_bytes, &staged);
  if (!seqs) return CI_ERR;
  dn_seq *host = (dn_seq *)staged;
  for (int i = 0; i < a->n_seqs; i++) {
    host[i].state = a->states[i];
    host[i].checkpoint = a->checkpoints ? a->checkpoints[i] : NULL;
    host[i].first_row = a->first_row[i];
    host[i].n_rows = a->n_rows[i];
  }
  if (ci_cuda_stage_send(cu, seqs, staged, table_bytes)) return CI_ERR;
  ci_cuda_cmd cmd;
  memset(&cmd, 0, sizeof cmd);
  cmd.kind = CMD_DELTANET;
  ci_cuda_deltanet_params *p = &cmd.a.deltanet;
  p->qkv = a->qkv;
  p->z = a->z;
  p->b = a->b;
  p->a = a->a;
  p->out = a->out;
  p->conv_w = a->conv_w;
  p->a_log = a->a_log;
  p->dt_bias = a->dt_bias;
  p->norm_w = a->norm_w;
  p->norm_eps = a->norm_eps;
  p->n_k_heads = a->n_k_heads;
  p->n_v_heads = a->n_v_heads;
  p->k_head_dim = a->k_head_dim;
  p->v_head_dim = a->v_head_dim;
  p->conv_kernel = a->conv_kernel;
  p->n_seqs = a->n_seqs;
  p->total_rows = rows;
  p->seqs = seqs;
  p->checkpoint_stride = a->checkpoint_stride;
  return ci_cuda_emit(cu, &cmd);
}
