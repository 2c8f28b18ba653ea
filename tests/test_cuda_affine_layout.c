/* The GPU's layout of MLX affine codes (src/backend/cuda/cuda_affine.cuh: 16-row tiles, 64-column
 * quads, each lane's mma.sync A-fragment codes together), checked on the host through the
 * backend's host builds of its index functions, without a GPU: every code of random q4 and q8
 * matrices (row counts not a multiple of 16, column counts a multiple of 32 but not of 64) is
 * found where ci_cuda_affine_code_offset_host says, each lane's words hold the codes of its
 * fragment registers as the header documents them, and the padding rows and columns are zero.
 * Skipped (exit 77) in a build without the CUDA backend. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#ifdef CINFER_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef CINFER_CUDA

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32(void) {
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(rng_state >> 33);
}

/* The code the layout documents for lane l's register j, element e of k-step `step` of tile
 * `tile` (0 outside the matrix). */
static uint32_t documented_code(const uint8_t *codes, int64_t n, int64_t k, int64_t tile,
                                int64_t step, int lane, int j, int e) {
  const int64_t r = tile * 16 + lane / 4 + 8 * (j & 1);
  const int64_t c = step * 16 + 2 * (lane % 4) + 8 * (j >> 1) + e;
  return r < n && c < k ? codes[r * k + c] : 0;
}

static void check_shape(int bits, int64_t n, int64_t k) {
  uint8_t *codes = malloc((size_t)(n * k));
  uint8_t *raw = calloc((size_t)(n * k * bits / 8), 1);
  assert_non_null(codes);
  assert_non_null(raw);
  for (int64_t r = 0; r < n; r++)
    for (int64_t c = 0; c < k; c++) {
      const uint8_t q = (uint8_t)(next_u32() & ((1u << bits) - 1u));
      codes[r * k + c] = q;
      if (bits == 4)
        raw[(r * k + c) / 2] |= (uint8_t)(q << (4 * (c % 2)));
      else
        raw[r * k + c] = q;
    }
  const size_t bytes = ci_cuda_affine_code_bytes_host(n, k, bits);
  const int64_t tiles = (n + 15) / 16, quads = (k + 63) / 64;
  assert_int_equal(bytes, (size_t)(tiles * quads * 128 * bits));
  uint32_t *words = malloc(bytes);
  assert_non_null(words);
  for (int64_t i = 0; i < (int64_t)(bytes / 4); i++)
    words[i] = ci_cuda_affine_repacked_word_host(raw, bits, n, k, i);
  const uint8_t *packed = (const uint8_t *)words;

  int wrong_offset = 0, wrong_fragment = 0;
  for (int64_t r = 0; r < n; r++)
    for (int64_t c = 0; c < k; c++) {
      int shift = 0;
      const int64_t at = ci_cuda_affine_code_offset_host(bits, k, r, c, &shift);
      wrong_offset += at < 0 || at >= (int64_t)bytes ||
                      ((packed[at] >> shift) & ((1u << bits) - 1u)) != codes[r * k + c];
    }
  /* the kernels' reading: q4 word s of the lane's 16 bytes, register j's codes at bits 4j
   * (e = 0) and 16 + 4j (e = 1); q8 half s / 2, words 2 (s % 2) + j / 2, bytes 2 (j % 2) + e */
  for (int64_t tile = 0; tile < tiles; tile++)
    for (int64_t step = 0; step < quads * 4; step++)
      for (int lane = 0; lane < 32; lane++) {
        const int s = (int)(step % 4);
        const uint8_t *block = packed + (tile * quads + step / 4) * 128 * bits;
        for (int j = 0; j < 4; j++)
          for (int e = 0; e < 2; e++) {
            uint32_t got;
            if (bits == 4) {
              uint32_t w;
              memcpy(&w, block + lane * 16 + s * 4, 4);
              got = (w >> (4 * j + 16 * e)) & 0xfu;
            } else {
              got = block[(s / 2) * 512 + lane * 16 + ((s % 2) * 2 + j / 2) * 4 + (j % 2) * 2 + e];
            }
            wrong_fragment += got != documented_code(codes, n, k, tile, step, lane, j, e);
          }
      }
  printf("  q%d %3lld x %4lld: %d codes misplaced, %d fragment codes wrong\n", bits, (long long)n,
         (long long)k, wrong_offset, wrong_fragment);
  assert_int_equal(wrong_offset, 0);
  assert_int_equal(wrong_fragment, 0);
  free(words);
  free(raw);
  free(codes);
}

static void test_affine_layout(void **state) {
  (void)state;
  static const int64_t shapes[][2] = {{16, 64}, {40, 160}, {33, 1152}, {7, 96}, {48, 2048}};
  for (int bits = 4; bits <= 8; bits += 4)
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
      check_shape(bits, shapes[i][0], shapes[i][1]);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_affine_layout)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}

#else

int main(void) {
  printf("test_cuda_affine_layout: built without the CUDA backend, skipped\n");
  return 77;
}

#endif
