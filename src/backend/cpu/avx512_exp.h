/* exp over 16 f32 lanes for the AVX-512 softmax loops (kv_kernels_avx512.c, kv_attend_amx.c):
 * x = n ln2 + r with |r| <= ln2/2 (ln2 split in two for exactness), a degree-6 Taylor/minimax
 * polynomial for e^r and 2^n by exponent arithmetic; relative error about 2 ulp, inputs below
 * -87 flush to 0 (softmax arguments are <= 0). Include only from files compiled for AVX-512. */
#ifndef CI_BACKEND_CPU_AVX512_EXP_H
#define CI_BACKEND_CPU_AVX512_EXP_H

#include <immintrin.h>

static inline __m512 ci_exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

#endif
