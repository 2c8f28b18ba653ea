/* CPU kernels: weight-format matmuls and the vector loops attention needs, in a plain-C
 * reference version and AVX2 / AVX-512 versions picked at run time from CPUID. Tests compare
 * every SIMD version against the reference. */
#ifndef CI_BACKEND_CPU_KERNELS_H
#define CI_BACKEND_CPU_KERNELS_H

#include "base/arena.h"
#include "base/threadpool.h"
#include "tensor/backend.h"
#include "tensor/tensor.h"

#include <stdint.h>

typedef enum { CI_ISA_REF, CI_ISA_AVX2, CI_ISA_AVX512, CI_ISA_COUNT } ci_isa;

/* The best ISA this CPU supports (CPUID + OS XSAVE check). The environment variable
 * CINFER_ISA=ref|avx2|avx512 may lower (never raise) the choice. */
ci_isa ci_cpu_detect_isa(void);

/* 1 if this CPU can run kernels of `isa`. */
int ci_isa_supported(ci_isa isa);

/* "ref", "avx2", "avx512". */
const char *ci_isa_name(ci_isa isa);

/* y[m, N] = x[m, K] @ W[N, K]^T, W of dtype F32, F16, BF16, Q8 or Q4 (MLX affine, any group
 * size 32/64/128, scales/biases F32/F16/BF16), x and y f32, accumulation in f32. Never expands
 * the whole weight. Work is split over `pool` (NULL = calling thread only). Returns CI_OK, or
 * CI_ERR with ci_last_error for an unsupported dtype or an allocation failure. */
int ci_cpu_matmul(ci_threadpool *pool, ci_isa isa, const ci_tensor *w, const float *x, int64_t m,
                  float *y);

/* As ci_cpu_matmul, but every row of y is computed exactly as a one-row call computes it (the
 * row kernels only, whatever m). */
int ci_cpu_matmul_rows(ci_threadpool *pool, ci_isa isa, const ci_tensor *w, const float *x,
                       int64_t m, float *y);

/* ci_cpu_matmul (each_row 0) or ci_cpu_matmul_rows (each_row 1) in `precision` (those two are
 * CI_PRECISION_EXACT). */
int ci_cpu_matmul_with(ci_threadpool *pool, ci_isa isa, ci_precision precision, const ci_tensor *w,
                       const float *x, int64_t m, float *y, int each_row);

/* The matmul of a step in `precision`: rows [0, m) split into `segments` (NULL or n = 0: one
 * segment), each computed exactly as a matmul of that segment alone computes it (its kernel
 * chosen by its own row count), while the weights are read once for all of them. Buffers come
 * from `scratch` (reset by the call). */
int ci_cpu_matmul_segments(ci_threadpool *pool, ci_isa isa, ci_precision precision,
                           ci_arena *scratch, const ci_tensor *w, const float *x, int64_t m,
                           float *y, const ci_row_segments *segments);

/* The most weights of one ci_cpu_matmul_segments_multi call. */
#define CI_MATMUL_MAX_WEIGHTS 4

/* ci_cpu_matmul_segments of n_weights weights on the same x in one call: ys[i] = x @ ws[i]^T,
 * each exactly as a call of that weight alone computes it, with x prepared once and the rows of
 * every weight split over one pool job (fewer, larger jobs per layer: q|k|v, gate|up). The
 * weights must share dtype, width (K) and grouping; their row counts may differ. */
int ci_cpu_matmul_segments_multi(ci_threadpool *pool, ci_isa isa, ci_precision precision,
                                 ci_arena *scratch, const ci_tensor *const *ws, int n_weights,
                                 const float *x, int64_t m, float *const *ys,
                                 const ci_row_segments *segments);

/* Vector loops over bf16 rows (KV cache rows), f32 accumulation, and the gated activations. */
typedef struct {
  /* sum_i x[i] * bf16(a[i]) */
  float (*dot_bf16)(const float *x, const uint16_t *a, int64_t n);
  /* y[i] += alpha * bf16(a[i]) */
  void (*axpy_bf16)(float *y, float alpha, const uint16_t *a, int64_t n);
  /* dst[i] = bf16(src[i]), round to nearest even */
  void (*f32_to_bf16)(uint16_t *dst, const float *src, int64_t n);
  /* sum_i x[i] * a[i] */
  float (*dot_f32)(const float *x, const float *a, int64_t n);
  /* y[i] += alpha * a[i] */
  void (*axpy_f32)(float *y, float alpha, const float *a, int64_t n);
  /* dst[i] = bf16(a[i]) widened to f32 */
  void (*bf16_to_f32)(float *dst, const uint16_t *a, int64_t n);
  /* g[i] = silu(g[i]) * up[i] (activation.h: the same bits on every ISA) */
  void (*silu_mul)(float *g, const float *up, int64_t n);
  /* g[i] = gelu_tanh(g[i]) * up[i] (activation.h) */
  void (*gelu_tanh_mul)(float *g, const float *up, int64_t n);
} ci_cpu_vec_kernels;

/* The vector kernels for `isa` (must be supported). */
const ci_cpu_vec_kernels *ci_cpu_vec_kernels_get(ci_isa isa);

/* MoE routing (the backend's moe_route op; see tensor/backend.h). */
void ci_cpu_moe_route(ci_backend *be, const float *scores, int64_t n, int n_experts, int top_k,
                      const float *expert_scale, int32_t *expert_ids, float *expert_weights);

#endif
