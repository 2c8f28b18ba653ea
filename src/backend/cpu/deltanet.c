/* Gated DeltaNet on the CPU (docs/models.md §5.8). Three passes over a step's rows, each split
 * so that a sequence's results never depend on the other sequences of the step:
 *   1. per (sequence, channel block): the causal depthwise convolution over the sequence's
 *      stored tail and its new rows, then SiLU, in place; the tail is updated;
 *   2. per row: q and k L2-normalised (q also scaled by Dk^-1/2), beta = sigmoid(b) and the
 *      log decay g = -exp(A_log) softplus(a + dt_bias);
 *   3. per (sequence, value head): the gated delta rule — one recurrent step when the sequence
 *      has a single row (or row by row, keeping a checkpoint after each, in a speculative
 *      round), else the block-parallel form over chunks of CI_DELTANET_CHUNK rows (the WY/UT
 *      form the reference's prefill uses) — then the gated RMSNorm of each row.
 * The state of a value head is S [Dk, Dv]: y = q S, and a step is
 * S <- gamma S;  S <- S + k (beta (v - k S)). */
#include "backend/cpu/deltanet.h"

#include "base/error.h"

#include <math.h>
#include <string.h>

enum { CONV_BLOCK = 256, MAX_CONV_KERNEL = 16 };

typedef struct {
  const ci_deltanet_args *a;
  const ci_cpu_vec_kernels *vec; /* dot and axpy of the CPU's ISA */
  int C, Kd, Vd, K1;             /* channels, key width, value width, tail rows */
  int conv_blocks;               /* channel blocks per sequence */
  int64_t conv_floats;           /* floats of a state's convolution tail */
  float *beta, *decay;           /* [rows, Hv] */
  float *scratch;                /* per thread: scratch_per_thread floats */
  int64_t scratch_per_thread;
} dn_job;

static inline float silu(float x) {
  return x / (1.0f + expf(-x));
}

/* torch.nn.functional.softplus (beta 1, threshold 20). */
static inline float softplus(float x) {
  return x > 20.0f ? x : log1pf(expf(x));
}

/* Pass 1: channels [c0, c1) of sequence `seq`. */
static void conv_task(void *ctx, int task, int thread) {
  (void)thread;
  const dn_job *job = ctx;
  const ci_deltanet_args *a = job->a;
  const int seq = task / job->conv_blocks, block = task % job->conv_blocks;
  const int C = job->C, K1 = job->K1, Kc = a->conv_kernel;
  const int c0 = block * CONV_BLOCK, c1 = c0 + CONV_BLOCK < C ? c0 + CONV_BLOCK : C;
  const int n = a->n_rows[seq];
  float *rows = a->qkv + (int64_t)a->first_row[seq] * C;
  float *tail = a->states[seq]; /* [K1, C] */
  /* X = concat(tail, rows): X[r] is tail row r for r < K1, else row r - K1 */
#define X_AT(r, c) ((r) < K1 ? tail[(int64_t)(r)*C + (c)] : rows[(int64_t)((r)-K1) * C + (c)])
  /* checkpoints: the tail after row t is X[t + 1 .. t + K1] */
  float *ck = a->checkpoints ? a->checkpoints[seq] : NULL;
  for (int t = 0; ck && t < n; t++)
    for (int j = 0; j < K1; j++)
      for (int c = c0; c < c1; c++)
        ck[t * a->checkpoint_stride + (int64_t)j * C + c] = X_AT(t + 1 + j, c);
  float new_tail[(MAX_CONV_KERNEL - 1) * CONV_BLOCK];
  for (int j = 0; j < K1; j++)
    for (int c = c0; c < c1; c++) new_tail[j * CONV_BLOCK + (c - c0)] = X_AT(n + j, c);
  /* backwards, so that the rows a later output reads are still the inputs */
  for (int t = n - 1; t >= 0; t--) {
    float *out = rows + (int64_t)t * C;
    for (int c = c0; c < c1; c++) {
      const float *w = a->conv_w + (int64_t)c * Kc;
      float acc = 0.0f;
      for (int k = 0; k < Kc; k++) acc += w[k] * X_AT(t + k, c);
      out[c] = silu(acc);
    }
  }
#undef X_AT
  for (int j = 0; j < K1; j++)
    memcpy(tail + (int64_t)j * C + c0, new_tail + j * CONV_BLOCK,
           (size_t)(c1 - c0) * sizeof(float));
}

/* Pass 2: row `task` of the step. */
static void prepare_task(void *ctx, int task, int thread) {
  (void)thread;
  const dn_job *job = ctx;
  const ci_deltanet_args *a = job->a;
  const int Dk = a->k_head_dim, Hv = a->n_v_heads;
  float *row = a->qkv + (int64_t)task * job->C;
  const float q_scale = 1.0f / sqrtf((float)Dk);
  for (int h = 0; h < 2 * a->n_k_heads; h++) { /* the q heads, then the k heads */
    float *x = row + (int64_t)h * Dk;
    const float inv = 1.0f / sqrtf(job->vec->dot_f32(x, x, Dk) + 1e-6f);
    for (int i = 0; i < Dk; i++) x[i] *= inv;
    if (h < a->n_k_heads)
      for (int i = 0; i < Dk; i++) x[i] *= q_scale;
  }
  for (int h = 0; h < Hv; h++) {
    const int64_t i = (int64_t)task * Hv + h;
    job->beta[i] = 1.0f / (1.0f + expf(-a->b[i]));
    job->decay[i] = -expf(a->a_log[h]) * softplus(a->a[i] + a->dt_bias[h]);
  }
}

/* One recurrent step of value head hv: row `row`, state S [Dk, Dv], y [Dv]; m scratch [Dv]. */
static void recurrent_step(const dn_job *job, int hv, int64_t row, float *restrict S,
                           float *restrict y, float *restrict m) {
  const ci_deltanet_args *a = job->a;
  const int Dk = a->k_head_dim, Dv = a->v_head_dim;
  const int hk = hv / (a->n_v_heads / a->n_k_heads);
  const float *q = a->qkv + row * job->C + (int64_t)hk * Dk;
  const float *k = q + job->Kd;
  const float *v = a->qkv + row * job->C + 2 * (int64_t)job->Kd + (int64_t)hv * Dv;
  const float gamma = expf(job->decay[row * a->n_v_heads + hv]);
  const float beta = job->beta[row * a->n_v_heads + hv];
  for (int64_t i = 0; i < (int64_t)Dk * Dv; i++) S[i] *= gamma;
  memset(m, 0, (size_t)Dv * sizeof *m);
  for (int d = 0; d < Dk; d++) job->vec->axpy_f32(m, k[d], S + (int64_t)d * Dv, Dv);
  for (int j = 0; j < Dv; j++) m[j] = (v[j] - m[j]) * beta; /* delta */
  for (int d = 0; d < Dk; d++) job->vec->axpy_f32(S + (int64_t)d * Dv, k[d], m, Dv);
  memset(y, 0, (size_t)Dv * sizeof *y);
  for (int d = 0; d < Dk; d++) job->vec->axpy_f32(y, q[d], S + (int64_t)d * Dv, Dv);
}

/* Rows [first, first + L) of value head hv in the block-parallel form: with cum the running
 * sum of g inside the chunk and A[i][j] = beta_i <k_i, k_j> e^(cum_i - cum_j) (j < i),
 * U = (I + A)^-1 (beta v), W = (I + A)^-1 (beta e^cum k), V' = U - W S;
 * y_i = e^cum_i q_i S + sum_{j <= i} <q_i, k_j> e^(cum_i - cum_j) V'_j;
 * S <- e^cum_last S + sum_j (e^(cum_last - cum_j) k_j) V'_j. */
static void chunk_block(const dn_job *job, int hv, int64_t first, int L, float *restrict S,
                        float *scratch) {
  const ci_deltanet_args *a = job->a;
  const int Dk = a->k_head_dim, Dv = a->v_head_dim, Hv = a->n_v_heads;
  const int hk = hv / (Hv / a->n_k_heads);
  const int64_t C = job->C;
  const int N = CI_DELTANET_CHUNK;
  float *cum = scratch;           /* [N] */
  float *A = cum + N;             /* [N, N] */
  float *U = A + (int64_t)N * N;  /* [N, Dv] */
  float *W = U + (int64_t)N * Dv; /* [N, Dk] */
#define Q_OF(i) (a->qkv + (first + (i)) * C + (int64_t)hk * Dk)
#define K_OF(i) (Q_OF(i) + job->Kd)
#define V_OF(i) (a->qkv + (first + (i)) * C + 2 * (int64_t)job->Kd + (int64_t)hv * Dv)
  for (int i = 0; i < L; i++) cum[i] = (i ? cum[i - 1] : 0.0f) + job->decay[(first + i) * Hv + hv];
  for (int i = 0; i < L; i++) {
    const float beta = job->beta[(first + i) * Hv + hv];
    const float *ki = K_OF(i), *vi = V_OF(i);
    float *u = U + (int64_t)i * Dv, *w = W + (int64_t)i * Dk;
    const float e = expf(cum[i]);
    for (int j = 0; j < Dv; j++) u[j] = vi[j] * beta;
    for (int d = 0; d < Dk; d++) w[d] = ki[d] * beta * e;
    for (int j = 0; j < i; j++) {
      const float c = beta * job->vec->dot_f32(ki, K_OF(j), Dk) * expf(cum[i] - cum[j]);
      job->vec->axpy_f32(u, -c, U + (int64_t)j * Dv, Dv);
      job->vec->axpy_f32(w, -c, W + (int64_t)j * Dk, Dk);
    }
  }
  /* V' = U - W S (in U), with the old state */
  for (int i = 0; i < L; i++)
    for (int d = 0; d < Dk; d++)
      job->vec->axpy_f32(U + (int64_t)i * Dv, -W[(int64_t)i * Dk + d], S + (int64_t)d * Dv, Dv);
  for (int i = 0; i < L; i++) {
    float *y = a->out + (first + i) * (int64_t)job->Vd + (int64_t)hv * Dv;
    const float *qi = Q_OF(i);
    const float e = expf(cum[i]);
    memset(y, 0, (size_t)Dv * sizeof *y);
    for (int d = 0; d < Dk; d++) job->vec->axpy_f32(y, qi[d] * e, S + (int64_t)d * Dv, Dv);
    for (int j = 0; j <= i; j++)
      job->vec->axpy_f32(y, job->vec->dot_f32(qi, K_OF(j), Dk) * expf(cum[i] - cum[j]),
                         U + (int64_t)j * Dv, Dv);
  }
  const float last = cum[L - 1], e_last = expf(last);
  for (int64_t i = 0; i < (int64_t)Dk * Dv; i++) S[i] *= e_last;
  for (int j = 0; j < L; j++) {
    const float *kj = K_OF(j);
    const float e = expf(last - cum[j]);
    for (int d = 0; d < Dk; d++)
      job->vec->axpy_f32(S + (int64_t)d * Dv, kj[d] * e, U + (int64_t)j * Dv, Dv);
  }
#undef Q_OF
#undef K_OF
#undef V_OF
}

/* Pass 3: value head task % Hv of sequence task / Hv. */
static void head_task(void *ctx, int task, int thread) {
  const dn_job *job = ctx;
  const ci_deltanet_args *a = job->a;
  const int Hv = a->n_v_heads, Dk = a->k_head_dim, Dv = a->v_head_dim;
  const int seq = task / Hv, hv = task % Hv;
  const int n = a->n_rows[seq];
  const int64_t first = a->first_row[seq];
  float *S = a->states[seq] + job->conv_floats + (int64_t)hv * Dk * Dv;
  float *scratch = job->scratch + (int64_t)thread * job->scratch_per_thread;
  float *ck = a->checkpoints ? a->checkpoints[seq] : NULL;
  if (ck) { /* row by row, keeping the state after each */
    const int64_t offset = job->conv_floats + (int64_t)hv * Dk * Dv;
    for (int r = 0; r < n; r++) {
      recurrent_step(job, hv, first + r, S, a->out + (first + r) * job->Vd + (int64_t)hv * Dv,
                     scratch);
      memcpy(ck + r * a->checkpoint_stride + offset, S, (size_t)Dk * Dv * sizeof(float));
    }
  } else if (n == 1) {
    recurrent_step(job, hv, first, S, a->out + first * job->Vd + (int64_t)hv * Dv, scratch);
  } else {
    for (int c = 0; c < n; c += CI_DELTANET_CHUNK) {
      const int L = n - c < CI_DELTANET_CHUNK ? n - c : CI_DELTANET_CHUNK;
      chunk_block(job, hv, first + c, L, S, scratch);
    }
  }
  /* gated RMSNorm: (y rsqrt(mean(y^2) + eps)) w silu(z) */
  for (int64_t r = first; r < first + n; r++) {
    float *y = a->out + r * job->Vd + (int64_t)hv * Dv;
    const float *z = a->z + r * job->Vd + (int64_t)hv * Dv;
    const float inv = 1.0f / sqrtf(job->vec->dot_f32(y, y, Dv) / (float)Dv + a->norm_eps);
    for (int j = 0; j < Dv; j++) y[j] = y[j] * inv * a->norm_w[j] * silu(z[j]);
  }
}

int ci_cpu_gated_deltanet(ci_threadpool *pool, ci_arena *scratch, const ci_cpu_vec_kernels *vec,
                          const ci_deltanet_args *a) {
  if (a->n_seqs < 1) return CI_OK;
  if (a->n_k_heads < 1 || a->n_v_heads % a->n_k_heads != 0 || a->k_head_dim < 1 ||
      a->v_head_dim < 1 || a->conv_kernel < 1 || a->conv_kernel > MAX_CONV_KERNEL)
    return ci_fail("gated deltanet: unsupported geometry (Hk %d, Hv %d, Dk %d, Dv %d, kernel "
                   "%d; the kernel is at most %d)",
                   a->n_k_heads, a->n_v_heads, a->k_head_dim, a->v_head_dim, a->conv_kernel,
                   MAX_CONV_KERNEL);
  dn_job job = {.a = a,
                .vec = vec,
                .Kd = a->n_k_heads * a->k_head_dim,
                .Vd = a->n_v_heads * a->v_head_dim,
                .K1 = a->conv_kernel - 1};
  job.C = 2 * job.Kd + job.Vd;
  job.conv_blocks = (job.C + CONV_BLOCK - 1) / CONV_BLOCK;
  job.conv_floats = (int64_t)job.K1 * job.C;
  int64_t rows = 0;
  for (int i = 0; i < a->n_seqs; i++) {
    if (a->n_rows[i] < 1 || a->first_row[i] != rows)
      return ci_fail("gated deltanet: sequence %d's rows are not contiguous", i);
    rows += a->n_rows[i];
  }
  const int N = CI_DELTANET_CHUNK, threads = ci_threadpool_size(pool);
  job.scratch_per_thread = N + (int64_t)N * N + (int64_t)N * (a->v_head_dim + a->k_head_dim);
  ci_arena_reset(scratch);
  job.beta = ci_arena_take(scratch, (size_t)rows * a->n_v_heads * sizeof(float));
  job.decay = ci_arena_take(scratch, (size_t)rows * a->n_v_heads * sizeof(float));
  job.scratch =
      ci_arena_take(scratch, (size_t)threads * (size_t)job.scratch_per_thread * sizeof(float));
  if (!job.beta || !job.decay || !job.scratch)
    return ci_fail("gated deltanet: out of memory for its scratch");
  ci_threadpool_run(pool, a->n_seqs * job.conv_blocks, conv_task, &job);
  ci_threadpool_run(pool, (int)rows, prepare_task, &job);
  ci_threadpool_run(pool, a->n_seqs * a->n_v_heads, head_task, &job);
  return CI_OK;
}
