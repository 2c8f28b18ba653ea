/* The greedy pick of each logits row on the GPU (pick_rows, tensor/backend.h's ci_row_pick): a
 * step whose sequences decode greedily downloads a token and its log-probability per row instead
 * of the row's vocab floats (512 KB per row for a 128k vocabulary; 64 rows took ~0.6 ms of PCIe
 * per step on the H200).
 *
 * One block of PICK_THREADS threads per row. Thread t visits ids t, t + PICK_THREADS, ... in
 * order, keeping its largest logit and the first id holding it, then its sum of e^(logit - max)
 * in f32; the threads' results are folded by a fixed tree (ties to the lower id; sums in f64), so
 * a row's pick depends on that row alone, never on the batch. NaN logits never win and are left
 * out of the sum, as the CPU's pick and log-softmax do. */
#include "backend/cuda/cuda_internal.h"

#include <math.h>

/* PICK_BATCH: each thread's loads issued together (the logits sit in L2 after the head's matmul;
 * one load at a time made a 128k row a chain of 250 L2 round trips per pass, ~55 us). */
enum { PICK_THREADS = 512, PICK_BATCH = 16 };

__global__ static void __launch_bounds__(PICK_THREADS)
    pick_rows_kernel(ci_row_pick *picks, const float *logits, int64_t vocab) {
  ci_grid_begin();
  __shared__ float best_value[PICK_THREADS];
  __shared__ int32_t best_id[PICK_THREADS];
  __shared__ double sums[PICK_THREADS];
  const float *z = logits + (int64_t)blockIdx.x * vocab;
  const int t = threadIdx.x;
  float best = -INFINITY;
  int32_t id = -1;
  /* PICK_BATCH loads in flight per thread (the visit order is still t, t + PICK_THREADS, ...) */
  for (int64_t base = t; base < vocab; base += PICK_THREADS * PICK_BATCH) {
    float v[PICK_BATCH];
#pragma unroll
    for (int u = 0; u < PICK_BATCH; u++) {
      const int64_t i = base + (int64_t)u * PICK_THREADS;
      v[u] = i < vocab ? z[i] : -INFINITY;
    }
#pragma unroll
    for (int u = 0; u < PICK_BATCH; u++)
      if (v[u] > best) { /* NaN compares false: never taken; an all -inf row keeps id -1 */
        best = v[u];
        id = (int32_t)(base + (int64_t)u * PICK_THREADS);
      }
  }
  best_value[t] = best;
  best_id[t] = id;
  __syncthreads();
  for (int half = PICK_THREADS / 2; half > 0; half /= 2) {
    if (t < half) {
      const float v = best_value[t + half];
      const int32_t j = best_id[t + half];
      const int32_t i = best_id[t];
      if (j >= 0 && (i < 0 || v > best_value[t] || (v == best_value[t] && j < i))) {
        best_value[t] = v;
        best_id[t] = j;
      }
    }
    __syncthreads();
  }
  const float max = best_value[0];
  const int32_t token = best_id[0];
  if (max == -INFINITY || max == INFINITY) { /* nothing finite to normalise over */
    if (t == 0) {
      picks[blockIdx.x].token = max == INFINITY ? token : -1;
      picks[blockIdx.x].logprob = max == INFINITY ? 0.0f : -INFINITY;
    }
    return;
  }
  float sum = 0.0f;
  for (int64_t base = t; base < vocab; base += PICK_THREADS * PICK_BATCH) {
    float v[PICK_BATCH];
#pragma unroll
    for (int u = 0; u < PICK_BATCH; u++) {
      const int64_t i = base + (int64_t)u * PICK_THREADS;
      v[u] = i < vocab ? z[i] : NAN; /* past the row: left out of the sum, as a NaN is */
    }
#pragma unroll
    for (int u = 0; u < PICK_BATCH; u++)
      if (v[u] == v[u]) sum += expf(v[u] - max);
  }
  sums[t] = sum;
  __syncthreads();
  for (int half = PICK_THREADS / 2; half > 0; half /= 2) {
    if (t < half) sums[t] += sums[t + half];
    __syncthreads();
  }
  if (t == 0) {
    picks[blockIdx.x].token = token;
    const float lse = (float)((double)max + log(sums[0]));
    picks[blockIdx.x].logprob = max - lse;
  }
}

void ci_cuda_pick_rows(ci_cuda *cu, ci_row_pick *picks, const float *logits, int64_t rows,
                       int64_t vocab) {
  if (rows <= 0 || vocab <= 0) return;
  ci_launch(cu, pick_rows_kernel, (unsigned)rows, PICK_THREADS, 0, picks, logits, vocab);
  ci_cuda_check_launch(cu, "pick_rows");
}
