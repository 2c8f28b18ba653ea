/* Survey of cuBLASLt's algorithms for the batched-decode products of the bf16 CUDA path: for each
 * matrix of the Llama-3.1-8B and Llama-3.2-1B geometries (q|k|v and gate|up as one matrix, as the
 * backend runs them) and each row count, every algorithm the heuristic offers under the backend's
 * preferences (no workspace, no split-K reduction), timed with enough weight copies rotating to
 * stream the weights from HBM, and checked bit for bit against the heuristic's first choice (the
 * one the backend takes) on random bf16 inputs. Prints one line per (shape, rows): the first
 * choice's time and bandwidth, and the fastest bit-identical algorithm's.
 *
 * Build and run on the GPU machine from the repository root:
 *   nvcc -O3 -arch=sm_90a -o build/lt_algos bench/lt_algos.cu -lcublasLt && build/lt_algos */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define CHECK_CUDA(x)                                                                              \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));                  \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)
#define CHECK_LT(x)                                                                                \
  do {                                                                                             \
    cublasStatus_t s_ = (x);                                                                       \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                             \
      fprintf(stderr, "%s:%d: cuBLASLt status %d\n", __FILE__, __LINE__, (int)s_);                 \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

/* Random bf16 values in about [-1, 1) from a hash of the index. */
__global__ static void fill_kernel(__nv_bfloat16 *x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    x[i] = __float2bfloat16((float)(h & 0xffff) / 32768.0f - 1.0f);
  }
}

typedef struct {
  const char *name;
  int64_t n, k;
} shape;

int main(void) {
  const shape shapes[] = {{"8B q|k|v", 6144, 4096},    {"8B o", 4096, 4096},
                          {"8B gate|up", 28672, 4096}, {"8B down", 4096, 14336},
                          {"1B q|k|v", 3072, 2048},    {"1B o", 2048, 2048},
                          {"1B gate|up", 16384, 2048}, {"1B down", 2048, 8192}};
  const int rows[] = {16, 64, 128, 256};
  enum { MAX_ALGOS = 32, REPS = 20 };
  cublasLtHandle_t lt;
  CHECK_LT(cublasLtCreate(&lt));
  cublasLtMatmulPreference_t pref;
  CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
  size_t workspace = 0;
  uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
  CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &workspace, sizeof workspace));
  CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                &reduction, sizeof reduction));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  printf("| matrix | rows | first choice us | first TB/s | algos offered | bit-identical | best "
         "bit-identical us | best TB/s | speed-up |\n|---|---|---|---|---|---|---|---|---|\n");
  for (const shape &s : shapes) {
    const size_t w_bytes = (size_t)s.n * s.k * 2;
    const int copies = (int)(400e6 / (double)w_bytes) + 1;
    std::vector<__nv_bfloat16 *> w(copies);
    for (int c = 0; c < copies; c++) {
      CHECK_CUDA(cudaMalloc(&w[c], w_bytes));
      fill_kernel<<<1024, 256>>>(w[c], (size_t)s.n * s.k, 17u + (uint32_t)c);
    }
    for (int m : rows) {
      __nv_bfloat16 *x;
      float *y, *y_ref;
      CHECK_CUDA(cudaMalloc(&x, (size_t)m * s.k * 2));
      CHECK_CUDA(cudaMalloc(&y, (size_t)m * s.n * 4));
      CHECK_CUDA(cudaMalloc(&y_ref, (size_t)m * s.n * 4));
      fill_kernel<<<256, 256>>>(x, (size_t)m * s.k, 99u);
      cublasLtMatmulDesc_t desc;
      CHECK_LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
      CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
      CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
      cublasLtMatrixLayout_t la, lb, lc;
      CHECK_LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s.k, s.n, s.k));
      CHECK_LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.k, m, s.k));
      CHECK_LT(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, s.n, m, s.n));
      cublasLtMatmulHeuristicResult_t res[MAX_ALGOS];
      int found = 0;
      CHECK_LT(
          cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, MAX_ALGOS, res, &found));
      const float one = 1.0f, zero = 0.0f;
      std::vector<float> ref((size_t)m * s.n), out((size_t)m * s.n);
      double first_us = 0, best_us = 1e30;
      int identical = 0;
      for (int a = 0; a < found; a++) {
        float *dst = a == 0 ? y_ref : y;
        if (cublasLtMatmul(lt, desc, &one, w[0], la, x, lb, &zero, dst, lc, dst, lc, &res[a].algo,
                           NULL, 0, 0) != CUBLAS_STATUS_SUCCESS) {
          if (a == 0) break; /* no reference to compare the others with */
          continue;
        }
        CHECK_CUDA(cudaDeviceSynchronize());
        if (a == 0) {
          CHECK_CUDA(cudaMemcpy(ref.data(), y_ref, ref.size() * 4, cudaMemcpyDeviceToHost));
        } else {
          CHECK_CUDA(cudaMemcpy(out.data(), y, out.size() * 4, cudaMemcpyDeviceToHost));
          if (memcmp(out.data(), ref.data(), ref.size() * 4) != 0) continue;
        }
        identical++;
        for (int warm = 0; warm < 2; warm++)
          cublasLtMatmul(lt, desc, &one, w[warm % copies], la, x, lb, &zero, y, lc, y, lc,
                         &res[a].algo, NULL, 0, 0);
        CHECK_CUDA(cudaEventRecord(start));
        for (int r = 0; r < REPS; r++)
          cublasLtMatmul(lt, desc, &one, w[r % copies], la, x, lb, &zero, y, lc, y, lc,
                         &res[a].algo, NULL, 0, 0);
        CHECK_CUDA(cudaEventRecord(stop));
        CHECK_CUDA(cudaEventSynchronize(stop));
        float ms = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
        const double us = ms * 1e3 / REPS;
        if (a == 0) first_us = us;
        if (us < best_us) best_us = us;
      }
      if (first_us == 0) {
        printf("| %s | %d | no algorithm ran | | %d | | | | |\n", s.name, m, found);
      } else {
        printf("| %s | %d | %.1f | %.2f | %d | %d | %.1f | %.2f | %.2f |\n", s.name, m, first_us,
               w_bytes / first_us / 1e6, found, identical, best_us, w_bytes / best_us / 1e6,
               first_us / best_us);
      }
      fflush(stdout);
      cublasLtMatrixLayoutDestroy(la);
      cublasLtMatrixLayoutDestroy(lb);
      cublasLtMatrixLayoutDestroy(lc);
      cublasLtMatmulDescDestroy(desc);
      cudaFree(x);
      cudaFree(y);
      cudaFree(y_ref);
    }
    for (int c = 0; c < copies; c++) cudaFree(w[c]);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtDestroy(lt);
  return 0;
}
