/* Internals shared by the CUDA backend's files: the backend struct, error checking, the staging
 * ring for small host arrays, and the launchers each .cu file exports to cuda_backend.cu. */
#ifndef CI_BACKEND_CUDA_CUDA_INTERNAL_H
#define CI_BACKEND_CUDA_CUDA_INTERNAL_H

extern "C" {
#include "backend/cuda/cuda_backend.h"
#include "base/error.h"
#include "tensor/backend.h"
}

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

struct ci_cuda_blas; /* cuda_matmul.cu */

/* A host-to-device staging ring: small host arrays an op needs on the device (row lists) are
 * written to pinned host memory and copied asynchronously into the device twin at the same
 * offset. Both halves are reset when the stream is idle (step end). */
typedef struct {
  uint8_t *host;   /* pinned, [bytes] */
  uint8_t *device; /* [bytes] */
  size_t bytes, used;
} ci_cuda_ring;

/* The backend. Every op enqueues on `stream`; step_end waits for it. */
typedef struct {
  ci_backend base;
  int device;
  cudaStream_t stream;
  int n_threads;
  int64_t allocations; /* cudaMalloc calls so far */
  int *error_flag;     /* device int: kernels set it when they meet bad data */
  ci_cuda_ring ring;
  /* scratch: [0] half-precision copies of matmul inputs, [1] f32 products of both planes */
  void *scratch[2];
  size_t scratch_bytes[2];
  int input_planes; /* 2: matmul inputs as bf16 hi + lo planes (about 16 mantissa bits); 1: bf16 */
  float *host_scores; /* pinned host copy of MoE router scores */
  size_t host_scores_bytes;
  /* weights copied to the device at load, freed at destroy */
  void **weights;
  int n_weights, cap_weights;
  struct ci_cuda_blas *blas;
  int sticky_error; /* a CUDA failure was met; reported by step_end */
  char sticky_message[256];
} ci_cuda;

static inline ci_cuda *ci_as_cuda(ci_backend *be) {
  return (ci_cuda *)be;
}

/* Records a CUDA failure on the backend (reported by the next step_end) and as the thread's
 * error. Returns CI_ERR. */
int ci_cuda_fail(ci_cuda *cu, cudaError_t err, const char *what);

/* Checks the last launch; returns CI_OK or ci_cuda_fail. */
int ci_cuda_check_launch(ci_cuda *cu, const char *what);

/* Device memory of `bytes` (counted), or NULL with ci_last_error. */
void *ci_cuda_malloc(ci_cuda *cu, size_t bytes);

/* Copies n bytes of host memory to the device through the ring; returns the device address
 * (valid until the next step end), or NULL with ci_last_error. */
void *ci_cuda_stage(ci_cuda *cu, const void *host, size_t bytes);

/* Device scratch buffer `slot` (0 or 1) of at least `bytes` (grown when needed, counted). NULL
 * on failure. */
void *ci_cuda_scratch(ci_cuda *cu, int slot, size_t bytes);

/* ==== cuda_matmul.cu ==== */
int ci_cuda_blas_create(ci_cuda *cu);
void ci_cuda_blas_destroy(ci_cuda *cu);
int ci_cuda_matmul(ci_cuda *cu, const ci_tensor *w, const float *x, int64_t m, float *y);

/* ==== cuda_elementwise.cu ==== */
int ci_cuda_embed(ci_cuda *cu, const ci_tensor *table, const int32_t *ids, int64_t n, float *out);
void ci_cuda_rmsnorm(ci_cuda *cu, float *out, const float *x, const float *w, int64_t n_rows,
                     int64_t dim, float eps, float w_offset);
void ci_cuda_add_bias(ci_cuda *cu, float *x, const float *bias, int64_t rows, int64_t cols);
void ci_cuda_add(ci_cuda *cu, float *x, const float *y, int64_t n);
void ci_cuda_silu_mul(ci_cuda *cu, float *gate, const float *up, int64_t n);
void ci_cuda_gelu_tanh_mul(ci_cuda *cu, float *gate, const float *up, int64_t rows, int64_t cols,
                           int64_t up_stride);
void ci_cuda_scale(ci_cuda *cu, float *x, float s, int64_t n);
void ci_cuda_softcap(ci_cuda *cu, float *x, float cap, int64_t n);
void ci_cuda_fill(ci_cuda *cu, float *x, float value, int64_t n);
void ci_cuda_gather_rows(ci_cuda *cu, float *dst, const float *src, const int32_t *rows_dev,
                         int64_t m, int64_t dim);
void ci_cuda_scatter_add_rows(ci_cuda *cu, float *dst, const float *src, const int32_t *rows_dev,
                              const float *weights_dev, int64_t m, int64_t dim);
void ci_cuda_rope(ci_cuda *cu, float *x, int64_t n_rows, int n_heads, const int32_t *pos,
                  const ci_rope *rope);
/* dst = half-precision copy of n floats (bf16 or f16); with planes 2 a second plane follows at
 * dst + n holding the rounding remainder. */
void ci_cuda_to_half(ci_cuda *cu, void *dst, const float *src, int64_t n, int bf16, int planes);
/* y[i] = a[i] + b[i]. */
void ci_cuda_sum(ci_cuda *cu, float *y, const float *a, const float *b, int64_t n);

/* ==== cuda_attention.cu ==== */
int ci_cuda_kv_store(ci_cuda *cu, const ci_step_kv *seqs, const float *k, const float *v,
                     const int32_t *pos);
int ci_cuda_attention(ci_cuda *cu, const ci_attention_args *args);
int ci_cuda_kv_convert_block(ci_cuda *cu, const ci_paged_kv *src, int32_t src_block,
                             const ci_paged_kv *dst, int32_t dst_block, int live_tokens);

#endif
