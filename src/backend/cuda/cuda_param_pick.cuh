/* Entry p of a kernel-parameter array, by selects. Indexing a kernel parameter with a runtime
 * index makes the compiler copy the whole parameter block to local memory at entry and read it
 * back from there (the small-batch matmul: 13 local stores, then local loads in its copy loops;
 * 2-10% of the kernel's time on the H200); N selects keep every entry in registers. */
#ifndef CI_BACKEND_CUDA_CUDA_PARAM_PICK_CUH
#define CI_BACKEND_CUDA_CUDA_PARAM_PICK_CUH

template <typename T, int N> __device__ static inline T ci_param_pick(const T (&a)[N], int p) {
  T r = a[0];
#pragma unroll
  for (int i = 1; i < N; i++) r = p == i ? a[i] : r;
  return r;
}

#endif
