/* Microbenchmark of the CUDA small-batch matmul kernel (src/backend/cuda/cuda_gemv.cu) alone, as
 * the backend launches it: bf16, MLX affine q8 and q4 (group 64, bf16 scales) weights, 1 and 8
 * input rows, on the matrix shapes of the Llama-3.2-1B and Llama-3.1-8B geometries (q|k|v and
 * gate|up as one launch, as the backend runs them). Enough copies of each weight rotate to keep
 * them out of L2, so each launch streams its weights from HBM. Prints microseconds per launch and
 * the share of the given bandwidth (default 4.24e12 B/s, the H200's as step_bench measures it).
 * Zero weights: the kernel's time does not depend on the values.
 *
 * Build and run on the GPU machine, from the repository root after `make build`:
 *   nvcc -DCINFER_CUDA -Isrc -I. -O3 -arch=sm_90a --expt-relaxed-constexpr \
 *     -o build/gemv_bench bench/gemv_bench.cu && build/gemv_bench [BYTES_PER_S] */
#include "../src/backend/cuda/cuda_gemv.cu"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" int ci_fail(const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vfprintf(stderr, fmt, args);
  va_end(args);
  fputc('\n', stderr);
  return CI_ERR;
}

int ci_cuda_check_launch(ci_cuda *cu, const char *what) {
  (void)cu;
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) fprintf(stderr, "launch %s: %s\n", what, cudaGetErrorString(err));
  return err == cudaSuccess ? CI_OK : CI_ERR;
}

typedef struct {
  int parts;
  int64_t n[3];
  int64_t k;
} shape;

static const shape SHAPES[] = {
    {3, {2048, 512, 512}, 2048},  {2, {8192, 8192, 0}, 2048},    {1, {2048, 0, 0}, 8192},
    {1, {128256, 0, 0}, 2048},    {3, {4096, 1024, 1024}, 4096}, {1, {4096, 0, 0}, 4096},
    {2, {14336, 14336, 0}, 4096}, {1, {4096, 0, 0}, 14336},      {1, {128256, 0, 0}, 4096}};

/* Bytes of one part's codes (or bf16 rows) and of its (scale, bias) words. */
static size_t code_bytes(int bits, int64_t n, int64_t k) {
  return bits == 16 ? (size_t)(n * k * 2) : ci_affine_code_bytes(n, k, bits);
}
static size_t pair_bytes(int bits, int64_t n, int64_t k) {
  return bits == 16 ? 0 : (size_t)(ci_affine_tiles(n) * (k / 64) * 16 * 4);
}

int main(int argc, char **argv) {
  const double bandwidth = argc > 1 ? atof(argv[1]) : 4.24e12;
  ci_cuda cu;
  memset(&cu, 0, sizeof cu);
  cudaDeviceGetAttribute(&cu.n_sms, cudaDevAttrMultiProcessorCount, 0);
  if (ci_cuda_gemv_init(&cu)) return 1;
  __nv_bfloat16 *x = NULL;
  float *y = NULL;
  if (cudaMalloc(&x, (size_t)8 * 16384 * 2) || cudaMalloc(&y, (size_t)3 * 8 * 128256 * 4)) return 1;
  cudaMemset(x, 0, (size_t)8 * 16384 * 2);
  float *ys[3] = {y, y + 8 * 128256, y + 16 * 128256};
  const int dtypes[] = {CI_BF16, CI_Q8, CI_Q4};
  for (int d = 0; d < 3; d++)
    for (size_t s = 0; s < sizeof SHAPES / sizeof SHAPES[0]; s++) {
      const shape *sh = &SHAPES[s];
      const int bits = dtypes[d] == CI_BF16 ? 16 : dtypes[d] == CI_Q8 ? 8 : 4;
      size_t bytes = 0;
      for (int p = 0; p < sh->parts; p++)
        bytes += code_bytes(bits, sh->n[p], sh->k) + pair_bytes(bits, sh->n[p], sh->k);
      int copies = (int)((512ull << 20) / bytes);
      copies = copies < 1 ? 1 : copies > 64 ? 64 : copies;
      ci_cuda_weight *w = (ci_cuda_weight *)calloc((size_t)copies * 3, sizeof *w);
      if (!w) return 1;
      for (int c = 0; c < copies; c++)
        for (int p = 0; p < sh->parts; p++) {
          void *data = NULL, *pairs = NULL;
          const size_t cb = code_bytes(bits, sh->n[p], sh->k),
                       pb = pair_bytes(bits, sh->n[p], sh->k);
          if (cudaMalloc(&data, cb) || (pb && cudaMalloc(&pairs, pb))) return 1;
          cudaMemset(data, 0, cb);
          if (pb) cudaMemset(pairs, 0, pb);
          w[c * 3 + p].data = data;
          w[c * 3 + p].pairs = pairs;
          w[c * 3 + p].dtype = dtypes[d];
          w[c * 3 + p].group_size = bits < 16 ? 64 : 0;
        }
      for (int m = 1; m <= 8; m += 7) {
        for (int c = 0; c < copies; c++) /* warm-up */
          ci_cuda_gemv_launch(&cu, sh->parts, &w[c * 3], sh->n, ys, sh->k, x, m, 1);
        cudaEvent_t start, stop;
        cudaEventCreate(&start);
        cudaEventCreate(&stop);
        const int reps = 40;
        cudaEventRecord(start, cu.stream);
        for (int i = 0; i < reps; i++)
          ci_cuda_gemv_launch(&cu, sh->parts, &w[(i % copies) * 3], sh->n, ys, sh->k, x, m, 1);
        cudaEventRecord(stop, cu.stream);
        cudaEventSynchronize(stop);
        float ms = 0.0f;
        cudaEventElapsedTime(&ms, start, stop);
        const double us = ms * 1000.0 / reps;
        printf("%-4s N=%6lld,%5lld,%5lld K=%5lld m=%d: %6.1f MB %7.1f us %3.0f%% of bandwidth\n",
               bits == 16  ? "bf16"
               : bits == 8 ? "q8"
                           : "q4",
               (long long)sh->n[0], (long long)sh->n[1], (long long)sh->n[2], (long long)sh->k, m,
               bytes / 1e6, us, 100.0 * bytes / (us * 1e-6) / bandwidth);
        cudaEventDestroy(start);
        cudaEventDestroy(stop);
      }
      for (int c = 0; c < copies * 3; c++) {
        cudaFree((void *)w[c].data);
        cudaFree((void *)w[c].pairs);
      }
      free(w);
    }
  return 0;
}
