/* RoPE's rotation of one pair of a head's dims, the one definition that the RoPE kernel and the
 * fused RoPE + KV write kernel both run, so a row's rotated q and k carry the same bits whichever
 * of the two computed them (a solo step fuses where a step mixing KV codecs does not). Every
 * product and sum is rounded explicitly, so the compiler cannot contract them differently in the
 * two kernels. */
#ifndef CI_BACKEND_CUDA_CUDA_ROPE_CUH
#define CI_BACKEND_CUDA_CUDA_ROPE_CUH

#include <cuda_runtime.h>

/* Pair j of head x at `position`: dims a = 2j, b = 2j + 1 (traditional) or j, j + half, rotated
 * by position * inv_freq[j] and multiplied by qk_scale, into (*r0, *r1). */
__device__ static inline void ci_rope_pair(const float *x, int j, float position,
                                           const float *inv_freq, int half, int traditional,
                                           float qk_scale, int *a, int *b, float *r0, float *r1) {
  const float angle = __fmul_rn(position, inv_freq[j]);
  const float c = cosf(angle), s = sinf(angle);
  *a = traditional ? 2 * j : j;
  *b = traditional ? 2 * j + 1 : j + half;
  const float x0 = x[*a], x1 = x[*b];
  *r0 = __fmul_rn(__fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)), qk_scale);
  *r1 = __fmul_rn(__fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c)), qk_scale);
}

#endif
