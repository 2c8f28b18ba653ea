/* One f32 value of a weight's scale or bias array (f16, bf16 or f32), shared by the SIMD kernel
 * files. Needs F16C (_cvtsh_ss): include only from files compiled for AVX2 or AVX-512. */
#ifndef CI_BACKEND_CPU_SCALE_LOAD_H
#define CI_BACKEND_CPU_SCALE_LOAD_H

#include "backend/cpu/kernels_impl.h"

#include <immintrin.h>

/* f32 value i of a scale/bias array of dtype sdt. */
static inline __attribute__((always_inline)) float load_scale(ci_dtype sdt, const void *p,
                                                              int64_t i) {
  switch (sdt) {
  case CI_F16:
    return _cvtsh_ss(((const uint16_t *)p)[i]);
  case CI_BF16:
    return ci_bf16_to_f32(((const uint16_t *)p)[i]);
  default:
    return ((const float *)p)[i];
  }
}

#endif
