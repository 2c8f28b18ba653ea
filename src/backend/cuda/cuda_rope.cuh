/* RoPE's rotation of one pair of a head, shared by the RoPE kernel (cuda_elementwise.cu) and the
 * fused RoPE + KV store (cuda_attention.cu), so that both give the same bits: the products are
 * rounded explicitly, leaving the compiler no contraction to choose per call site. */
#ifndef CI_BACKEND_CUDA_CUDA_ROPE_CUH
#define CI_BACKEND_CUDA_CUDA_ROPE_CUH

#include <cuda_runtime.h>

/* Rotates pair j of the head at v (of rot_dim = 2 * half rotated dims: (j, j + half), or (2j,
 * 2j + 1) when traditional) by angle, then scales both by qk_scale. */
__device__ static inline void ci_rope_rotate(float *v, int j, int half, int traditional,
                                             float angle, float qk_scale) {
  const float c = cosf(angle), s = sinf(angle);
  const int a = traditional ? 2 * j : j;
  const int b = traditional ? 2 * j + 1 : j + half;
  const float x0 = v[a], x1 = v[b];
  v[a] = __fmul_rn(__fmaf_rn(x0, c, -__fmul_rn(x1, s)), qk_scale);
  v[b] = __fmul_rn(__fmaf_rn(x0, s, __fmul_rn(x1, c)), qk_scale);
}

#endif
