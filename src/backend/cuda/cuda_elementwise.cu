/* The CUDA backend's row and element kernels: embedding lookup, RMSNorm (one block per row, a
 * fixed reduction order, so a row never depends on the batch), bias, residual add, the gated
 * activations, scale, softcap, fill, row gather/scatter, RoPE, and f32 -> bf16/f16 conversion
 * of matmul inputs. Each computes what the CPU backend's op computes, in f32. */
#include "backend/cuda/cuda_internal.h"

enum { THREADS = 256 };

static inline unsigned blocks_for(int64_t n) {
  int64_t b = (n + THREADS - 1) / THREADS;
  return (unsigned)(b < 1 ? 1 : (b > 1048576 ? 1048576 : b));
}

/* Grid-stride loop over [0, n). */
#define FOR_EACH(i, n)                                                                             \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                        \
       i += (int64_t)gridDim.x * blockDim.x)

__device__ static inline float load_weight(const void *data, int dtype, int64_t i) {
  if (dtype == CI_BF16) return __bfloat162float(((const __nv_bfloat16 *)data)[i]);
  if (dtype == CI_F16) return __half2float(((const __half *)data)[i]);
  return ((const float *)data)[i];
}

__global__ static void embed_kernel(const void *table, int dtype, int64_t dim, const int32_t *ids,
                                    int64_t n, float *out) {
  ci_grid_begin();
  FOR_EACH(i, n * dim) {
    int64_t r = i / dim, c = i % dim;
    out[i] = load_weight(table, dtype, (int64_t)ids[r] * dim + c);
  }
}

void ci_cuda_embed(ci_cuda *cu, const void *table, int dtype, int64_t dim, const int32_t *ids,
                   int64_t n, float *out) {
  ci_launch(cu, embed_kernel, blocks_for(n * dim), THREADS, 0, table, dtype, dim, ids, n, out);
  ci_cuda_check_launch(cu, "embed");
}

/* 1 / sqrt(mean + eps) of a row from each thread's partial sum of squares: each warp reduces its
 * threads by a fixed shuffle tree, thread 0 adds the warps' sums in order; every thread gets the
 * result. */
__device__ static float block_inverse_rms(float sum, int64_t dim, float eps) {
  __shared__ float warp_sums[THREADS / 32];
  __shared__ float inv_shared;
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int i = 0; i < THREADS / 32; i++) total += warp_sums[i];
    inv_shared = 1.0f / sqrtf(total / (float)dim + eps);
  }
  __syncthreads();
  return inv_shared;
}

/* One block per row: each thread sums a strided slice in order, then block_inverse_rms. */
__global__ static void rmsnorm_kernel(float *out, const float *x, const float *w, int64_t dim,
                                      float eps, float w_offset) {
  ci_grid_begin();
  const float *src = x + blockIdx.x * dim;
  float *dst = out + blockIdx.x * dim;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) sum += src[i] * src[i];
  const float inv = block_inverse_rms(sum, dim, eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    dst[i] = w ? src[i] * inv * (w_offset + w[i]) : src[i] * inv;
}

/* The same for rows of dim % 4 == 0 up to 4 * THREADS * V wide: each thread loads its V float4s
 * of the row at once (one memory round trip, not one per element) and keeps them in registers;
 * the sum runs over a thread's values in order, then block_inverse_rms. */
template <int V>
__global__ static void rmsnorm_vec_kernel(float *out, const float *x, const float *w, int64_t dim,
                                          float eps, float w_offset, __nv_bfloat16 *hi,
                                          __nv_bfloat16 *lo, const float *add) {
  const float4 *src = (const float4 *)(x + blockIdx.x * dim);
  float4 *dst = (float4 *)(out + blockIdx.x * dim);
  const int64_t n4 = dim / 4;
  /* the norm weights (written only at load) load before the wait (cuda_launch.cuh) */
  float4 gw[V];
#pragma unroll
  for (int j = 0; j < V; j++) {
    const int64_t i = threadIdx.x + (int64_t)j * THREADS;
    gw[j] = w && i < n4 ? ((const float4 *)w)[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  ci_grid_begin();
  float4 v[V];
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < V; j++) {
    const int64_t i = threadIdx.x + (int64_t)j * THREADS;
    v[j] = i < n4 ? src[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (add && i < n4) { /* the residual add before the norm: x += add, as add_kernel does it */
      const float4 a = ((const float4 *)(add + blockIdx.x * dim))[i];
      v[j].x += a.x, v[j].y += a.y, v[j].z += a.z, v[j].w += a.w;
      ((float4 *)(const_cast<float *>(x) + blockIdx.x * dim))[i] = v[j];
    }
  }
#pragma unroll
  for (int j = 0; j < V; j++)
    sum += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
  const float inv = block_inverse_rms(sum, dim, eps);
#pragma unroll
  for (int j = 0; j < V; j++) {
    const int64_t i = threadIdx.x + (int64_t)j * THREADS;
    if (i >= n4) break;
    float4 r = v[j];
    if (w) {
      const float4 g = gw[j];
      r.x = r.x * inv * (w_offset + g.x), r.y = r.y * inv * (w_offset + g.y);
      r.z = r.z * inv * (w_offset + g.z), r.w = r.w * inv * (w_offset + g.w);
    } else {
      r.x *= inv, r.y *= inv, r.z *= inv, r.w *= inv;
    }
    dst[i] = r;
    if (hi) { /* the next matmul's input planes, as to_bf16_planes_kernel writes them */
      const int64_t e = blockIdx.x * dim + 4 * i;
      const float f[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
      for (int t = 0; t < 4; t++) {
        const __nv_bfloat16 h = __float2bfloat16_rn(f[t]);
        hi[e + t] = h;
        if (lo) lo[e + t] = __float2bfloat16_rn(f[t] - __bfloat162float(h));
      }
    }
  }
}

/* Float4 blocks per thread of the register-resident norm kernel for these rows, or 0 where the
 * element loop runs (unaligned, dim % 4 != 0, or wider than 8 float4s per thread). */
static int64_t vector_blocks(const void *out, const void *x, const void *w, const void *add,
                             int64_t dim) {
  const int aligned = ((uintptr_t)out | (uintptr_t)x | (uintptr_t)w | (uintptr_t)add) % 16 == 0;
  const int64_t vectors = dim % 4 == 0 && aligned ? (dim / 4 + THREADS - 1) / THREADS : 0;
  return vectors <= 8 ? vectors : 0;
}

int ci_cuda_add_rmsnorm_fusable(const float *out, const float *x, const float *w, const float *add,
                                int64_t dim) {
  return vector_blocks(out, x, w, add, dim) > 0;
}

int ci_cuda_rmsnorm(ci_cuda *cu, float *out, const float *x, const float *w, int64_t n_rows,
                    int64_t dim, float eps, float w_offset, void *planes_dst, int planes,
                    const float *add) {
  if (n_rows <= 0) return 0;
  __nv_bfloat16 *hi = (__nv_bfloat16 *)planes_dst;
  __nv_bfloat16 *lo = hi && planes > 1 ? hi + n_rows * dim : NULL;
  const int64_t vectors = vector_blocks(out, x, w, add, dim);
  const unsigned grid = (unsigned)n_rows;
  if (add && !vectors) {
    ci_cuda_fail(cu, cudaErrorInvalidValue, "add+rmsnorm on rows the fused kernel cannot take");
    return 0;
  }
  if (vectors == 1)
    ci_launch(cu, rmsnorm_vec_kernel<1>, grid, THREADS, 0, out, x, w, dim, eps, w_offset, hi, lo,
              add);
  else if (vectors == 2)
    ci_launch(cu, rmsnorm_vec_kernel<2>, grid, THREADS, 0, out, x, w, dim, eps, w_offset, hi, lo,
              add);
  else if (vectors >= 3 && vectors <= 4)
    ci_launch(cu, rmsnorm_vec_kernel<4>, grid, THREADS, 0, out, x, w, dim, eps, w_offset, hi, lo,
              add);
  else if (vectors >= 5)
    ci_launch(cu, rmsnorm_vec_kernel<8>, grid, THREADS, 0, out, x, w, dim, eps, w_offset, hi, lo,
              add);
  else
    ci_launch(cu, rmsnorm_kernel, grid, THREADS, 0, out, x, w, dim, eps, w_offset);
  ci_cuda_check_launch(cu, "rmsnorm");
  return vectors > 0 && hi != NULL;
}

__global__ static void add_bias_kernel(float *x, const float *bias, int64_t rows, int64_t cols) {
  ci_grid_begin();
  FOR_EACH(i, rows * cols) x[i] += bias[i % cols];
}

void ci_cuda_add_bias(ci_cuda *cu, float *x, const float *bias, int64_t rows, int64_t cols) {
  if (rows * cols <= 0) return;
  ci_launch(cu, add_bias_kernel, blocks_for(rows * cols), THREADS, 0, x, bias, rows, cols);
  ci_cuda_check_launch(cu, "add_bias");
}

__global__ static void add_kernel(float *x, const float *y, int64_t n) {
  ci_grid_begin();
  FOR_EACH(i, n) x[i] += y[i];
}

void ci_cuda_add(ci_cuda *cu, float *x, const float *y, int64_t n) {
  if (n <= 0) return;
  ci_launch(cu, add_kernel, blocks_for(n), THREADS, 0, x, y, n);
  ci_cuda_check_launch(cu, "add");
}

__global__ static void silu_mul_kernel(float *gate, const float *up, int64_t n, __nv_bfloat16 *hi,
                                       __nv_bfloat16 *lo) {
  ci_grid_begin();
  FOR_EACH(i, n) {
    float g = gate[i];
    const float r = g / (1.0f + expf(-g)) * up[i];
    gate[i] = r;
    if (hi) { /* the next matmul's input planes, as to_bf16_planes_kernel writes them */
      const __nv_bfloat16 h = __float2bfloat16_rn(r);
      hi[i] = h;
      if (lo) lo[i] = __float2bfloat16_rn(r - __bfloat162float(h));
    }
  }
}

int ci_cuda_silu_mul(ci_cuda *cu, float *gate, const float *up, int64_t n, void *planes_dst,
                     int planes) {
  if (n <= 0) return 0;
  __nv_bfloat16 *hi = (__nv_bfloat16 *)planes_dst;
  ci_launch(cu, silu_mul_kernel, blocks_for(n), THREADS, 0, gate, up, n, hi,
            hi && planes > 1 ? hi + n : NULL);
  ci_cuda_check_launch(cu, "silu_mul");
  return hi != NULL;
}

__global__ static void gelu_tanh_mul_kernel(float *gate, const float *up, int64_t rows,
                                            int64_t cols, int64_t up_stride) {
  ci_grid_begin();
  const float sqrt_2_over_pi = 0.7978845608028654f;
  FOR_EACH(i, rows * cols) {
    int64_t r = i / cols, c = i % cols;
    float x = gate[i];
    float g = 0.5f * x * (1.0f + tanhf(sqrt_2_over_pi * (x + 0.044715f * powf(x, 3.0f))));
    gate[i] = g * up[r * up_stride + c];
  }
}

void ci_cuda_gelu_tanh_mul(ci_cuda *cu, float *gate, const float *up, int64_t rows, int64_t cols,
                           int64_t up_stride) {
  if (rows * cols <= 0) return;
  ci_launch(cu, gelu_tanh_mul_kernel, blocks_for(rows * cols), THREADS, 0, gate, up, rows, cols,
            up_stride);
  ci_cuda_check_launch(cu, "gelu_tanh_mul");
}

__global__ static void scale_kernel(float *x, float s, int64_t n) {
  ci_grid_begin();
  FOR_EACH(i, n) x[i] *= s;
}

void ci_cuda_scale(ci_cuda *cu, float *x, float s, int64_t n) {
  if (n <= 0) return;
  ci_launch(cu, scale_kernel, blocks_for(n), THREADS, 0, x, s, n);
  ci_cuda_check_launch(cu, "scale");
}

__global__ static void softcap_kernel(float *x, float cap, int64_t n) {
  ci_grid_begin();
  FOR_EACH(i, n) x[i] = cap * tanhf(x[i] / cap);
}

void ci_cuda_softcap(ci_cuda *cu, float *x, float cap, int64_t n) {
  if (n <= 0) return;
  ci_launch(cu, softcap_kernel, blocks_for(n), THREADS, 0, x, cap, n);
  ci_cuda_check_launch(cu, "softcap");
}

__global__ static void fill_kernel(float *x, float value, int64_t n) {
  ci_grid_begin();
  FOR_EACH(i, n) x[i] = value;
}

void ci_cuda_fill(ci_cuda *cu, float *x, float value, int64_t n) {
  if (n <= 0) return;
  ci_launch(cu, fill_kernel, blocks_for(n), THREADS, 0, x, value, n);
  ci_cuda_check_launch(cu, "fill");
}

__global__ static void gather_rows_kernel(float *dst, const float *src, const int32_t *rows,
                                          int64_t m, int64_t dim) {
  ci_grid_begin();
  FOR_EACH(i, m * dim) {
    int64_t r = i / dim, c = i % dim;
    dst[i] = src[(int64_t)rows[r] * dim + c];
  }
}

void ci_cuda_gather_rows(ci_cuda *cu, float *dst, const float *src, const int32_t *rows_dev,
                         int64_t m, int64_t dim) {
  ci_launch(cu, gather_rows_kernel, blocks_for(m * dim), THREADS, 0, dst, src, rows_dev, m, dim);
  ci_cuda_check_launch(cu, "gather_rows");
}

/* Rows may repeat (a token routed to experts in turn), so each column is summed by one thread
 * over the rows in order, as the CPU does. */
__global__ static void scatter_add_rows_kernel(float *dst, const float *src, const int32_t *rows,
                                               const float *weights, int64_t m, int64_t dim) {
  ci_grid_begin();
  FOR_EACH(c, dim) {
    for (int64_t i = 0; i < m; i++)
      dst[(int64_t)rows[i] * dim + c] += weights[i] * src[i * dim + c];
  }
}

void ci_cuda_scatter_add_rows(ci_cuda *cu, float *dst, const float *src, const int32_t *rows_dev,
                              const float *weights_dev, int64_t m, int64_t dim) {
  ci_launch(cu, scatter_add_rows_kernel, blocks_for(dim), THREADS, 0, dst, src, rows_dev,
            weights_dev, m, dim);
  ci_cuda_check_launch(cu, "scatter_add_rows");
}

/* Rotates the heads of x (n_heads per row) and, when x2 is set, of x2 (n_heads2 per row) in one
 * launch: q and k of one layer share the positions and the table, and each element's arithmetic
 * is the same either way. */
__global__ static void rope_kernel(float *x, int n_heads, float *x2, int n_heads2, int64_t n_rows,
                                   const int32_t *pos, const float *inv_freq, int head_dim,
                                   int half, int traditional, float qk_scale) {
  const int heads = n_heads + n_heads2;
  /* the rotation of this thread's first element: from the positions (a step input) and the
   * frequencies (written at load), before the wait (cuda_launch.cuh) */
  const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  float c0 = 1.0f, s0 = 0.0f;
  if (first < n_rows * heads * half) {
    const float angle = (float)pos[first / half / heads] * inv_freq[first % half];
    c0 = cosf(angle), s0 = sinf(angle);
  }
  ci_grid_begin();
  FOR_EACH(i, n_rows * heads * half) {
    int64_t rh = i / half;
    int j = (int)(i % half);
    int64_t r = rh / heads;
    const int h = (int)(rh % heads);
    float *v = h < n_heads ? x + (r * n_heads + h) * head_dim
                           : x2 + (r * n_heads2 + (h - n_heads)) * head_dim;
    float c = c0, s = s0;
    if (i != first) {
      const float angle = (float)pos[r] * inv_freq[j];
      c = cosf(angle), s = sinf(angle);
    }
    int a = traditional ? 2 * j : j;
    int b = traditional ? 2 * j + 1 : j + half;
    float x0 = v[a], x1 = v[b];
    v[a] = (x0 * c - x1 * s) * qk_scale;
    v[b] = (x0 * s + x1 * c) * qk_scale;
  }
}

/* Dims past rot_dim are only scaled. */
__global__ static void rope_tail_scale_kernel(float *x, int64_t n_vecs, int head_dim, int rot_dim,
                                              float qk_scale) {
  ci_grid_begin();
  const int tail = head_dim - rot_dim;
  FOR_EACH(i, n_vecs * tail) x[(i / tail) * head_dim + rot_dim + i % tail] *= qk_scale;
}

void ci_cuda_rope(ci_cuda *cu, float *x, int n_heads, float *x2, int n_heads2, int64_t n_rows,
                  const int32_t *pos, const ci_rope *rope) {
  const int half = rope->rot_dim / 2;
  if (n_rows <= 0) return;
  if (!x2) n_heads2 = 0;
  if (half > 0)
    ci_launch(cu, rope_kernel, blocks_for(n_rows * (n_heads + n_heads2) * half), THREADS, 0, x,
              n_heads, x2, n_heads2, n_rows, pos, rope->inv_freq, rope->head_dim, half,
              rope->traditional, rope->qk_scale);
  if (rope->qk_scale != 1.0f && rope->head_dim > rope->rot_dim) {
    ci_launch(cu, rope_tail_scale_kernel,
              blocks_for(n_rows * n_heads * (rope->head_dim - rope->rot_dim)), THREADS, 0, x,
              n_rows * n_heads, rope->head_dim, rope->rot_dim, rope->qk_scale);
    if (n_heads2 > 0)
      ci_launch(cu, rope_tail_scale_kernel,
                blocks_for(n_rows * n_heads2 * (rope->head_dim - rope->rot_dim)), THREADS, 0, x2,
                n_rows * n_heads2, rope->head_dim, rope->rot_dim, rope->qk_scale);
  }
  ci_cuda_check_launch(cu, "rope");
}

/* dst holds two planes of n values: hi = half(src) and lo = half(src - hi), so hi + lo carries
 * about 16 bits of src's 24-bit mantissa into a half-precision matmul. */
__global__ static void to_bf16_planes_kernel(__nv_bfloat16 *hi, __nv_bfloat16 *lo, const float *src,
                                             int64_t n) {
  ci_grid_begin();
  FOR_EACH(i, n) {
    __nv_bfloat16 h = __float2bfloat16_rn(src[i]);
    hi[i] = h;
    if (lo) lo[i] = __float2bfloat16_rn(src[i] - __bfloat162float(h));
  }
}

__global__ static void to_f16_planes_kernel(__half *hi, __half *lo, const float *src, int64_t n) {
  ci_grid_begin();
  FOR_EACH(i, n) {
    __half h = __float2half_rn(src[i]);
    hi[i] = h;
    if (lo) lo[i] = __float2half_rn(src[i] - __half2float(h));
  }
}

void ci_cuda_to_half(ci_cuda *cu, void *dst, const float *src, int64_t n, int bf16, int planes) {
  if (n <= 0) return;
  if (bf16)
    ci_launch(cu, to_bf16_planes_kernel, blocks_for(n), THREADS, 0, (__nv_bfloat16 *)dst,
              planes > 1 ? (__nv_bfloat16 *)dst + n : NULL, src, n);
  else
    ci_launch(cu, to_f16_planes_kernel, blocks_for(n), THREADS, 0, (__half *)dst,
              planes > 1 ? (__half *)dst + n : NULL, src, n);
  ci_cuda_check_launch(cu, "matmul input conversion");
}

__global__ static void sum_kernel(float *y, const float *a, const float *b, int64_t n) {
  ci_grid_begin();
  FOR_EACH(i, n) y[i] = a[i] + b[i];
}

void ci_cuda_sum(ci_cuda *cu, float *y, const float *a, const float *b, int64_t n) {
  if (n <= 0) return;
  ci_launch(cu, sum_kernel, blocks_for(n), THREADS, 0, y, a, b, n);
  ci_cuda_check_launch(cu, "sum");
}

__global__ static void segment_sum_kernel(float *y, const float *part, int segs, int64_t m,
                                          int64_t n, int planes) {
  ci_grid_begin();
  const int64_t seg_stride = planes * m * n;
  FOR_EACH(i, m * n) {
    float v = part[i];
    for (int s = 1; s < segs; s++) v += part[s * seg_stride + i];
    if (planes == 2) {
      float r = part[m * n + i];
      for (int s = 1; s < segs; s++) r += part[s * seg_stride + m * n + i];
      v = v + r;
    }
    y[i] = v;
  }
}

void ci_cuda_segment_sum(ci_cuda *cu, float *y, const float *part, int segs, int64_t m, int64_t n,
                         int planes) {
  if (m * n <= 0) return;
  ci_launch(cu, segment_sum_kernel, blocks_for(m * n), THREADS, 0, y, part, segs, m, n, planes);
  ci_cuda_check_launch(cu, "segment sum");
}
