/* AVX2 multiply rates of this CPU, one thread, data in L1: how many 256-bit vfmadd231ps,
 * vpmaddwd and vpmaddubsw issue per cycle (12 independent chains each, and vpmaddwd beside FMA),
 * the f32 6x16 register tile of the AVX2 panel GEMM against the same tile in int16 vpmaddwd, and
 * the q4/q8 32-column steps of the 16-bit row kernels (matmul_x16_avx2.c) in their 256-bit and
 * 128-bit forms. The clock is estimated from a chain of dependent integer adds (one per cycle).
 * Prints one JSON object. Usage: avx2_rates (exits 2 on a CPU without AVX2/FMA). */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define AVX2 __attribute__((target("avx2,fma"), noinline))

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

enum { CHAINS = 12, ITERS = 50000000 };

/* Cycles per second: a loop of dependent adds runs one add per cycle. */
static double clock_hz(void) {
  uint64_t v = 0;
  const long n = 500000000;
  const double t = now();
  for (long i = 0; i < n; i++) __asm__ volatile("add $1, %0" : "+r"(v));
  return (double)n / (now() - t);
}

/* Seconds for ITERS rounds of CHAINS independent FMAs. */
AVX2 static double time_fma(float *sink) {
  __m256 a[CHAINS];
  for (int i = 0; i < CHAINS; i++) a[i] = _mm256_set1_ps((float)i * 1e-3f);
  const __m256 b = _mm256_set1_ps(0.9999f), c = _mm256_set1_ps(1e-6f);
  const double t = now();
  for (long n = 0; n < ITERS; n++) {
    for (int i = 0; i < CHAINS; i++) a[i] = _mm256_fmadd_ps(a[i], b, c);
  }
  const double s = now() - t;
  for (int i = 0; i < CHAINS; i++) *sink += _mm256_cvtss_f32(a[i]);
  return s;
}

/* Seconds for ITERS rounds of CHAINS independent vpmaddwd (bytes = 0) or vpmaddubsw (1). */
AVX2 static double time_madd(int bytes, int *sink) {
  __m256i a[CHAINS];
  for (int i = 0; i < CHAINS; i++) a[i] = _mm256_set1_epi16((short)i);
  const __m256i b = _mm256_set1_epi16(3);
  const double t = now();
  if (bytes)
    for (long n = 0; n < ITERS; n++) {
      for (int i = 0; i < CHAINS; i++) a[i] = _mm256_maddubs_epi16(a[i], b);
    }
  else
    for (long n = 0; n < ITERS; n++) {
      for (int i = 0; i < CHAINS; i++) a[i] = _mm256_madd_epi16(a[i], b);
    }
  const double s = now() - t;
  for (int i = 0; i < CHAINS; i++) *sink += _mm256_extract_epi32(a[i], 0);
  return s;
}

/* Seconds for ITERS rounds of 6 vpmaddwd beside 6 FMAs (independent chains). */
AVX2 static double time_mixed(int *sink) {
  __m256i a[6];
  __m256 f[6];
  for (int i = 0; i < 6; i++) a[i] = _mm256_set1_epi16((short)i), f[i] = _mm256_set1_ps(1e-3f * i);
  const __m256i b = _mm256_set1_epi16(3);
  const __m256 fb = _mm256_set1_ps(0.9999f), fc = _mm256_set1_ps(1e-6f);
  const double t = now();
  for (long n = 0; n < ITERS; n++) {
    for (int i = 0; i < 6; i++) {
      a[i] = _mm256_madd_epi16(a[i], b);
      f[i] = _mm256_fmadd_ps(f[i], fb, fc);
    }
  }
  const double s = now() - t;
  for (int i = 0; i < 6; i++) *sink += _mm256_extract_epi32(a[i], 0) + (int)_mm256_cvtss_f32(f[i]);
  return s;
}

enum { KC = 256, MR = 6, NR = 16, TILE_REPS = 400000 };

/* The panel GEMM's tile: out[MR][NR] += x[KC][MR] (broadcast) x w[KC][NR], f32 FMA. */
AVX2 static void tile_f32(const float *x, const float *w, float *out) {
  __m256 acc[MR][2];
  for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int c = 0; c < KC; c++) {
    const __m256 w0 = _mm256_load_ps(w + c * NR), w1 = _mm256_load_ps(w + c * NR + 8);
    for (int i = 0; i < MR; i++) {
      const __m256 xv = _mm256_broadcast_ss(x + c * MR + i);
      acc[i][0] = _mm256_fmadd_ps(xv, w0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(xv, w1, acc[i][1]);
    }
  }
  for (int i = 0; i < MR; i++) {
    _mm256_store_ps(out + i * NR, _mm256_add_ps(acc[i][0], _mm256_load_ps(out + i * NR)));
    _mm256_store_ps(out + i * NR + 8, _mm256_add_ps(acc[i][1], _mm256_load_ps(out + i * NR + 8)));
  }
}

/* The same tile in int16: column pairs (x broadcast as one int32, w as [KC/2][NR][2]) through
 * vpmaddwd into int32 sums per group of 64 columns, converted and scaled once per group. */
AVX2 static void tile_int16(const int16_t *x, const int16_t *w, const float *scales, float *out) {
  __m256 total[MR][2];
  for (int i = 0; i < MR; i++) total[i][0] = total[i][1] = _mm256_setzero_ps();
  for (int g = 0; g < KC / 64; g++) {
    __m256i acc[MR][2];
    for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
    for (int p = 0; p < 32; p++) {
      const int pair = g * 32 + p;
      const __m256i w0 = _mm256_load_si256((const __m256i *)(const void *)(w + pair * 2 * NR));
      const __m256i w1 = _mm256_load_si256((const __m256i *)(const void *)(w + pair * 2 * NR + 16));
      for (int i = 0; i < MR; i++) {
        int32_t xp;
        __builtin_memcpy(&xp, x + (pair * MR + i) * 2, sizeof xp);
        const __m256i xv = _mm256_set1_epi32(xp);
        acc[i][0] = _mm256_add_epi32(acc[i][0], _mm256_madd_epi16(xv, w0));
        acc[i][1] = _mm256_add_epi32(acc[i][1], _mm256_madd_epi16(xv, w1));
      }
    }
    const __m256 s0 = _mm256_load_ps(scales + g * NR), s1 = _mm256_load_ps(scales + g * NR + 8);
    for (int i = 0; i < MR; i++) {
      const __m256 u = _mm256_broadcast_ss(scales + 64 + g * MR + i);
      total[i][0] =
          _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[i][0]), _mm256_mul_ps(s0, u), total[i][0]);
      total[i][1] =
          _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[i][1]), _mm256_mul_ps(s1, u), total[i][1]);
    }
  }
  for (int i = 0; i < MR; i++) {
    _mm256_store_ps(out + i * NR, _mm256_add_ps(total[i][0], _mm256_load_ps(out + i * NR)));
    _mm256_store_ps(out + i * NR + 8, _mm256_add_ps(total[i][1], _mm256_load_ps(out + i * NR + 8)));
  }
}

enum { ROW = 2048, ROWS = 8, STEP_REPS = 40000 };

/* One weight row of ROW columns against x16, group 64: the exact int32 group sums in the
 * 256-bit form (wide = 1) or in 128-bit halves (wide = 0), q4 (bits 4) or q8. */
AVX2 static float step_row(const uint8_t *codes, const int16_t *x16, const float *factors, int bits,
                           int wide) {
  __m256 total = _mm256_setzero_ps();
  for (int g = 0; g < ROW / 64; g++) {
    const uint8_t *c = codes + g * 64 * bits / 8;
    const int16_t *x = x16 + g * 64;
    __m256 sum;
    if (wide) {
      __m256i acc = _mm256_setzero_si256();
      for (int s = 0; s < 2; s++) {
        __m256i lo, hi;
        if (bits == 8) {
          lo = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(c + 32 * s)));
          hi = _mm256_cvtepu8_epi16(
              _mm_loadu_si128((const __m128i *)(const void *)(c + 32 * s + 16)));
        } else {
          const __m256i b =
              _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(c + 16 * s)));
          lo = _mm256_and_si256(b, _mm256_set1_epi16(15));
          hi = _mm256_srli_epi16(b, 4);
        }
        const __m256i a =
            _mm256_madd_epi16(lo, _mm256_load_si256((const __m256i *)(const void *)(x + 32 * s)));
        const __m256i d = _mm256_madd_epi16(
            hi, _mm256_load_si256((const __m256i *)(const void *)(x + 32 * s + 16)));
        acc = _mm256_add_epi32(acc, _mm256_add_epi32(a, d));
      }
      sum = _mm256_cvtepi32_ps(acc);
    } else {
      __m128i acc = _mm_setzero_si128();
      for (int s32 = 0; s32 < 2; s32++) { /* as step32 in matmul_x16_avx2.c */
        const uint8_t *c32 = c + 32 * s32 * bits / 8;
        __m128i w[4];
        if (bits == 8) {
          for (int h = 0; h < 4; h++)
            w[h] = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)(c32 + 8 * h)));
        } else {
          for (int h = 0; h < 2; h++) {
            const __m128i b =
                _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)(c32 + 8 * h)));
            w[h] = _mm_and_si128(b, _mm_set1_epi16(15));
            w[2 + h] = _mm_srli_epi16(b, 4);
          }
        }
        for (int h = 0; h < 4; h++)
          acc = _mm_add_epi32(
              acc, _mm_madd_epi16(w[h], _mm_load_si128((
                                            const __m128i *)(const void *)(x + 32 * s32 + 8 * h))));
      }
      sum = _mm256_castps128_ps256(_mm_cvtepi32_ps(acc));
    }
    total = _mm256_fmadd_ps(sum, _mm256_broadcast_ss(factors + g), total);
  }
  return _mm256_cvtss_f32(total);
}

int main(void) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    fprintf(stderr, "avx2_rates: this CPU has no AVX2/FMA\n");
    return 2;
  }
  const double hz = clock_hz();
  float fsink = 0.0f;
  int isink = 0;
  const double per_s = (double)ITERS * CHAINS;
  const double fma_s = time_fma(&fsink), madd_s = time_madd(0, &isink),
               maddubs_s = time_madd(1, &isink), mixed_s = time_mixed(&isink);

  float *xf = aligned_alloc(64, KC * MR * sizeof(float));
  float *wf = aligned_alloc(64, KC * NR * sizeof(float));
  int16_t *xi = aligned_alloc(64, KC * MR * sizeof(int16_t));
  int16_t *wi = aligned_alloc(64, KC * NR * sizeof(int16_t));
  float *scales = aligned_alloc(64, 256 * sizeof(float));
  float *out = aligned_alloc(64, MR * NR * sizeof(float));
  uint8_t *codes = aligned_alloc(64, ROWS * ROW);
  int16_t *x16 = aligned_alloc(64, ROW * sizeof(int16_t));
  float *factors = aligned_alloc(64, ROW / 64 * sizeof(float));
  if (!xf || !wf || !xi || !wi || !scales || !out || !codes || !x16 || !factors) return 1;
  for (int i = 0; i < KC * MR; i++) xf[i] = 1e-3f * (float)i, xi[i] = (int16_t)i;
  for (int i = 0; i < KC * NR; i++) wf[i] = 1.0f, wi[i] = 3;
  for (int i = 0; i < 256; i++) scales[i] = 1e-6f;
  for (int i = 0; i < MR * NR; i++) out[i] = 0.0f;
  for (int i = 0; i < ROWS * ROW; i++) codes[i] = (uint8_t)(i * 7);
  for (int i = 0; i < ROW; i++) x16[i] = (int16_t)(i - ROW / 2);
  for (int i = 0; i < ROW / 64; i++) factors[i] = 1e-6f;

  double t = now();
  for (int r = 0; r < TILE_REPS; r++) tile_f32(xf, wf, out);
  const double tile_f32_s = now() - t;
  t = now();
  for (int r = 0; r < TILE_REPS; r++) tile_int16(xi, wi, scales, out);
  const double tile_int16_s = now() - t;
  const double tile_macs = (double)TILE_REPS * KC * MR * NR;

  double step_cycles[2][2]; /* [q8?][wide?] cycles per 32 columns */
  for (int q8 = 0; q8 < 2; q8++)
    for (int wide = 0; wide < 2; wide++) {
      t = now();
      for (int r = 0; r < STEP_REPS; r++)
        for (int row = 0; row < ROWS; row++)
          fsink += step_row(codes + row * ROW / 2 * (q8 ? 2 : 1), x16, factors, q8 ? 8 : 4, wide);
      step_cycles[q8][wide] = (now() - t) * hz / ((double)STEP_REPS * ROWS * ROW / 32);
    }

  printf("{\"clock_ghz\": %.2f, \"fma_ymm_per_cycle\": %.2f, \"vpmaddwd_ymm_per_cycle\": %.2f, "
         "\"vpmaddubsw_ymm_per_cycle\": %.2f, \"vpmaddwd_beside_fma_ymm_per_cycle\": %.2f, "
         "\"tile_f32_gmac_s\": %.1f, \"tile_int16_gmac_s\": %.1f, \"fma_peak_gmac_s\": %.1f, "
         "\"q4_step_cycles_256bit\": %.2f, \"q4_step_cycles_128bit\": %.2f, "
         "\"q8_step_cycles_256bit\": %.2f, \"q8_step_cycles_128bit\": %.2f, \"sink\": %g}\n",
         hz / 1e9, per_s / fma_s / hz, per_s / madd_s / hz, per_s / maddubs_s / hz,
         (double)ITERS * 12 / mixed_s / hz, tile_macs / tile_f32_s / 1e9,
         tile_macs / tile_int16_s / 1e9, per_s * 8 / fma_s / 1e9, step_cycles[0][1],
         step_cycles[0][0], step_cycles[1][1], step_cycles[1][0], (double)fsink + isink);
  free(xf), free(wf), free(xi), free(wi), free(scales), free(out), free(codes), free(x16),
      free(factors);
  return 0;
}
