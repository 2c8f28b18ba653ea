/* MLX affine weights on the GPU: how a code becomes a weight. Every path that multiplies an
 * affine matrix (the small-batch kernel, the dequantisation ahead of cuBLASLt) turns code q of a
 * group with scale s and bias b into the bf16 weight bf16(fma(s, q, b)), so a row's product has
 * the same bits whichever path runs it. Scales and biases live on the device as one 32-bit word
 * per group (scale in the low half, bias in the high half, both in the checkpoint's 16-bit type),
 * rows padded to a multiple of four words. */
#ifndef CI_BACKEND_CUDA_CUDA_AFFINE_CUH
#define CI_BACKEND_CUDA_CUDA_AFFINE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

/* Words of packed (scale, bias) pairs per row of a [n, k] matrix of group size g. */
static inline __host__ __device__ int64_t ci_affine_pair_words(int64_t k, int group_size) {
  return (k / group_size + 3) / 4 * 4;
}

/* The scale and bias of a packed pair, as f32 (f16: 1, bf16: 0). */
__device__ static inline void ci_affine_unpack(uint32_t pair, int f16, float *s, float *b) {
  const uint16_t lo = (uint16_t)(pair & 0xffffu), hi = (uint16_t)(pair >> 16);
  if (f16) {
    *s = __half2float(__ushort_as_half(lo));
    *b = __half2float(__ushort_as_half(hi));
  } else {
    *s = __bfloat162float(__ushort_as_bfloat16(lo));
    *b = __bfloat162float(__ushort_as_bfloat16(hi));
  }
}

/* Eight codes of one word (q4: nibbles, LSB first) or two words (q8: bytes, LSB first) -> eight
 * bf16 weights, packed two per 32-bit word. bf16 pairs: fma in bf16 pairs (one rounding); f16
 * pairs: fma in f32, then rounded to bf16. */
template <int BITS>
__device__ static inline uint4 ci_affine_dequant8(const uint32_t *codes, uint32_t pair, int f16) {
  uint32_t out[4];
  if (!f16) {
    const __nv_bfloat16 s = __ushort_as_bfloat16((uint16_t)(pair & 0xffffu));
    const __nv_bfloat16 b = __ushort_as_bfloat16((uint16_t)(pair >> 16));
    const __nv_bfloat162 s2 = __halves2bfloat162(s, s), b2 = __halves2bfloat162(b, b);
#pragma unroll
    for (int j = 0; j < 4; j++) {
      __nv_bfloat162 q2;
      if (BITS == 4) { /* 0x4300 | q is the bf16 of 128 + q, exactly */
        const uint32_t t = codes[0] >> (8 * j);
        const uint32_t packed = (t & 0xfu) | ((t & 0xf0u) << 12) | 0x43004300u;
        q2 = __hsub2(*(const __nv_bfloat162 *)&packed, __float2bfloat162_rn(128.0f));
      } else {
        const uint32_t t = codes[j >> 1] >> (16 * (j & 1));
        q2 = __floats2bfloat162_rn((float)(t & 0xffu), (float)((t >> 8) & 0xffu));
      }
      const __nv_bfloat162 w2 = __hfma2(s2, q2, b2);
      out[j] = *(const uint32_t *)&w2;
    }
  } else {
    float s, b;
    ci_affine_unpack(pair, 1, &s, &b);
#pragma unroll
    for (int j = 0; j < 4; j++) {
      uint32_t q0, q1;
      if (BITS == 4) {
        q0 = (codes[0] >> (8 * j)) & 0xfu;
        q1 = (codes[0] >> (8 * j + 4)) & 0xfu;
      } else {
        q0 = (codes[j >> 1] >> (16 * (j & 1))) & 0xffu;
        q1 = (codes[j >> 1] >> (16 * (j & 1) + 8)) & 0xffu;
      }
      const __nv_bfloat162 w2 =
          __floats2bfloat162_rn(__fmaf_rn(s, (float)q0, b), __fmaf_rn(s, (float)q1, b));
      out[j] = *(const uint32_t *)&w2;
    }
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

#endif
