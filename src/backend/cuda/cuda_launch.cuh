/* Kernel launches with programmatic dependent launch (PDL, compute capability 9.0 and later).
 *
 * A kernel launched through ci_launch may start while the kernel before it on the stream is
 * still running: its blocks become resident as soon as every block of the previous kernel has
 * passed ci_grid_begin, and they wait there until the previous kernel has finished and its
 * writes are visible. Inside a CUDA graph this hides the gap between two kernel nodes (about a
 * microsecond each, hundreds per decode step) and lets a matmul stream its first weight tiles
 * from HBM while the small kernel before it (a norm, RoPE, an add) still runs: the weights never
 * depend on an earlier kernel, everything else does.
 *
 * The rule that keeps this correct: every kernel of the backend calls ci_grid_begin before it
 * reads or writes any memory another kernel touches (its first statement; the small-batch
 * matmul issues only its weight-tile copies before it: weights are written only at load, which
 * synchronises the stream before any step). Then a kernel's completion still implies the
 * completion of everything before it on the stream, as without PDL. Reads of the step's inputs
 * (positions, sequence groups, block tables: uploaded or copied before the step's first kernel,
 * written by no kernel) may come before it too: a kernel's blocks start only once the previous
 * kernel has passed its own wait, so the step's first kernel, and the copies before it, are done.
 * So may reads of weights. The KV kernels look up their rows' blocks there, RoPE works out its
 * angles and RMSNorm loads its weights, off the dependent chain between launches. Kernels of other
 * libraries (cuBLASLt) are launched without the attribute and wait as before. CINFER_CUDA_PDL=0
 * turns the attribute off (every launch then waits for the previous kernel to finish). */
#ifndef CI_BACKEND_CUDA_CUDA_LAUNCH_CUH
#define CI_BACKEND_CUDA_CUDA_LAUNCH_CUH

#include <cuda_runtime.h>
#include <utility>

/* Waits until the previous kernel on the stream has finished and its memory is visible (a no-op
 * when this kernel was launched without PDL). */
__device__ static inline void ci_grid_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Lets the next kernel on the stream start launching its blocks (they wait in their own
 * ci_grid_wait until this kernel has finished). */
__device__ static inline void ci_grid_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* The first statement of every kernel: wait for the previous kernel, then let the next one in. */
__device__ static inline void ci_grid_begin() {
  ci_grid_wait();
  ci_grid_release();
}

/* kernel<<<grid, block, smem, stream>>>(args...), with PDL allowed when `pdl` is set. */
template <typename... Params, typename... Args>
static inline cudaError_t ci_launch_on(cudaStream_t stream, int pdl, void (*kernel)(Params...),
                                       dim3 grid, dim3 block, size_t smem, Args &&...args) {
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = pdl ? 1 : 0;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

#endif
