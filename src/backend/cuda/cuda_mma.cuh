/* Tensor-core building blocks shared by the CUDA kernels that use mma.sync: the bf16 m16n8k16
 * multiply-accumulate (f32 accumulators), ldmatrix loads of 8x8 bf16 tiles from shared memory,
 * and 16-byte cp.async copies from global to shared memory. */
#ifndef CI_BACKEND_CUDA_CUDA_MMA_CUH
#define CI_BACKEND_CUDA_CUDA_MMA_CUH

#include <stdint.h>

/* c += a b for one m16n8k16 tile: a is the row-major 16x16 A fragment, (b0, b1) the column-major
 * 16x8 B fragment, as mma.sync distributes them over the warp's lanes. */
__device__ static inline void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
               "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Four 8x8 tiles; lane l gives the address of row l % 8 of tile l / 8. */
__device__ static inline void ldmatrix_x4(uint32_t r[4], const void *smem) {
  const unsigned address = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

__device__ static inline void ldmatrix_x4_trans(uint32_t r[4], const void *smem) {
  const unsigned address = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

/* Two 8x8 tiles; lanes 0-15 give the row addresses (the others are ignored). */
__device__ static inline void ldmatrix_x2(uint32_t r[2], const void *smem) {
  const unsigned address = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(address));
}

/* 16 bytes global -> shared, bypassing L1 (streamed weights) or through it (reused inputs). */
__device__ static inline void cp_async16_stream(void *smem, const void *global) {
  const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(global));
}

__device__ static inline void cp_async16_cached(void *smem, const void *global) {
  const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(global));
}

/* 8 bytes global -> shared, through L1. */
__device__ static inline void cp_async8_cached(void *smem, const void *global) {
  const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(global));
}

__device__ static inline void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}

/* Waits until at most `pending` committed groups of this thread are still in flight. */
template <int pending> __device__ static inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
}

#endif
