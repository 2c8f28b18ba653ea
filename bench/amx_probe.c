/* AMX probe: whether this CPU and kernel let a process use AMX-BF16 tiles (CPUID, XCR0, the
 * arch_prctl permission), whether TDPBF16PS matches a plain C product on one 16 x 16 x 32 tile,
 * and the single-core rate of TDPBF16PS against AVX512-BF16 vdpbf16ps (independent chains).
 * Build and run on the machine to probe:
 *   gcc -O2 -mavx512f -mavx512bf16 -mamx-tile -mamx-bf16 bench/amx_probe.c -o /tmp/amx_probe
 *   /tmp/amx_probe
 * On the GPU machine's Xeon (family 6 model 207, KVM; 2026-12-05): permission granted, max error
 * 0, TDPBF16PS 6.0 ns each (2.7 TFLOP/s per core), vdpbf16ps 0.95 ns each (67 GFLOP/s); from
 * its first form, the same loops. */
#include <cpuid.h>
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { ARCH_REQ_XCOMP_PERM_CODE = 0x1023, XFEATURE_XTILEDATA_NUMBER = 18 };

typedef struct {
  uint8_t palette, start_row;
  uint8_t reserved[14];
  uint16_t bytes_per_row[16];
  uint8_t rows[16];
} tile_config;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16); /* the test values are exact in bf16 */
}

static float from_bf16(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

int main(void) {
  unsigned a, b, c, d;
  __cpuid_count(7, 0, a, b, c, d);
  printf("cpuid: amx-bf16 %u amx-tile %u amx-int8 %u\n", (d >> 22) & 1, (d >> 24) & 1,
         (d >> 25) & 1);
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  printf("xcr0 %#x: tile config %u, tile data %u\n", lo, (lo >> 17) & 1, (lo >> 18) & 1);
  const long granted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM_CODE, XFEATURE_XTILEDATA_NUMBER);
  printf("arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA): %ld\n", granted);
  if (granted) return 1;
  tile_config config;
  memset(&config, 0, sizeof config);
  config.palette = 1;
  for (int t = 0; t < 8; t++) {
    config.rows[t] = 16;
    config.bytes_per_row[t] = 64;
  }
  _tile_loadconfig(&config);
  static uint16_t A[16 * 32], B[16 * 32];
  static float C[16 * 16];
  for (int i = 0; i < 16 * 32; i++) {
    A[i] = to_bf16((float)((i * 7) % 13 - 6) * 0.25f);
    B[i] = to_bf16((float)((i * 5) % 11 - 5) * 0.5f);
  }
  _tile_zero(0);
  _tile_loadd(1, A, 64);
  _tile_loadd(2, B, 64);
  _tile_dpbf16ps(0, 1, 2);
  _tile_stored(0, C, 64);
  double max_error = 0;
  for (int m = 0; m < 16; m++)
    for (int n = 0; n < 16; n++) {
      float want = 0;
      for (int k = 0; k < 16; k++)
        for (int e = 0; e < 2; e++)
          want += from_bf16(A[m * 32 + 2 * k + e]) * from_bf16(B[k * 32 + 2 * n + e]);
      const double error = C[m * 16 + n] > want ? C[m * 16 + n] - want : want - C[m * 16 + n];
      if (error > max_error) max_error = error;
    }
  printf("TDPBF16PS against C: max error %g\n", max_error);
  const long tiles = 2000000;
  double t0 = now();
  for (long i = 0; i < tiles; i++) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  double seconds = now() - t0;
  _tile_release();
  printf("TDPBF16PS: %.2f ns each, %.1f GFLOP/s per core\n", seconds / (4.0 * tiles) * 1e9,
         4.0 * tiles * 16 * 16 * 32 * 2 / seconds * 1e-9);
  __m512 acc[12];
  for (int i = 0; i < 12; i++) acc[i] = _mm512_setzero_ps();
  const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80),
                 y = (__m512bh)_mm512_set1_epi32(0x3f003f00);
  const long vectors = 50000000;
  t0 = now();
  for (long i = 0; i < vectors; i++)
    for (int j = 0; j < 12; j++) acc[j] = _mm512_dpbf16_ps(acc[j], x, y);
  seconds = now() - t0;
  float sum = 0;
  for (int i = 0; i < 12; i++) sum += _mm512_reduce_add_ps(acc[i]);
  printf("vdpbf16ps: %.3f ns each, %.1f GFLOP/s per core (checksum %g)\n",
         seconds / (12.0 * vectors) * 1e9, 12.0 * vectors * 64 / seconds * 1e-9, sum);
  return 0;
}
