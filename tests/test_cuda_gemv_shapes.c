/* The CUDA small-batch kernel's stage shapes for affine weights (src/backend/cuda/cuda_gemv.cu,
 * gv_affine_shape), checked on the host without a GPU: a product streams the first of 512 x 3,
 * 256 x 4 and 256 x 3 (columns x depth) whose blocks, one a (row group, segment) unit, all fit on
 * the GPU at once, and 512 x 3 when none does; the choices the benchmark geometries' measurements
 * rest on (docs/cuda.md, bench/cuda.md) on the H200. Skipped (exit 77) in a build without the
 * CUDA backend. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#ifdef CINFER_CUDA
#include "backend/cuda/cuda_backend.h"
#include "tensor/dtype.h"
#endif

#include <stdio.h>

#ifdef CINFER_CUDA

enum { H200_SMS = 132, H200_SMEM = 233472 }; /* SMs, shared memory bytes per SM */

/* The 8B and 1B geometries' products (groups of 64) at 1 and 8 input rows: units are row tiles of
 * 16 times K segments (the down projection in four, q4's q|k|v and o in two, q8's down in two). */
static void test_benchmark_geometry_shapes(void **state) {
  (void)state;
  enum { W = CI_CUDA_GEMV_512x3, N4 = CI_CUDA_GEMV_256x4, N3 = CI_CUDA_GEMV_256x3 };
  static const struct {
    int dtype;
    int64_t units, x_rows;
    int shape;
    const char *what;
  } cases[] = {
      {CI_Q4, 1792, 1, N4, "8B gate|up, q4, 1 row"},  {CI_Q4, 1024, 1, W, "8B down, q4, 1 row"},
      {CI_Q4, 768, 1, W, "8B q|k|v, q4, 1 row"},      {CI_Q4, 512, 1, W, "8B o, q4, 1 row"},
      {CI_Q4, 8016, 1, W, "8B head, q4, 1 row"},      {CI_Q4, 768, 8, N4, "8B q|k|v, q4, 8 rows"},
      {CI_Q4, 512, 8, W, "8B o, q4, 8 rows"},         {CI_Q4, 1024, 8, N4, "8B down, q4, 8 rows"},
      {CI_Q4, 1792, 8, N4, "8B gate|up, q4, 8 rows"}, {CI_Q4, 1024, 1, W, "1B gate|up, q4, 1 row"},
      {CI_Q4, 1024, 8, N4, "1B gate|up, q4, 8 rows"}, {CI_Q4, 512, 8, W, "1B down, q4, 8 rows"},
      {CI_Q8, 1792, 1, N3, "8B gate|up, q8, 1 row"},  {CI_Q8, 512, 1, W, "8B down, q8, 1 row"},
      {CI_Q8, 384, 8, W, "8B q|k|v, q8, 8 rows"},     {CI_Q8, 8016, 1, W, "8B head, q8, 1 row"},
  };
  static const char *names[] = {"512x3", "256x4", "256x3"};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const int shape = ci_cuda_gemv_shape_host(cases[i].dtype, cases[i].units, cases[i].x_rows, 64,
                                              H200_SMS, H200_SMEM);
    printf("  %-26s %5lld units: %s stages\n", cases[i].what, (long long)cases[i].units,
           names[shape]);
    assert_int_equal(shape, cases[i].shape);
  }
}

/* In units the shapes form bands: 512 x 3 up to what its blocks hold at once, then 256 x 4, then
 * 256 x 3 (each holding more blocks than the one before), then, past what any shape holds at once,
 * 256 x 4 for q4 with several input rows and 512 x 3 otherwise; a wave of one block an SM is
 * always 512 x 3, more input rows only narrow the bands, and q8's larger stages make them narrower
 * than q4's. */
static void test_bands_in_units(void **state) {
  (void)state;
  const int dtypes[] = {CI_Q4, CI_Q8};
  int64_t band_end[2][9][3] = {{{0}}}; /* [dtype][rows][shape]: the last unit count of the band */
  for (size_t d = 0; d < 2; d++) {
    for (int64_t rows = 1; rows <= 8; rows++) {
      const int beyond = dtypes[d] == CI_Q4 && rows > 1 ? CI_CUDA_GEMV_256x4 : CI_CUDA_GEMV_512x3;
      int previous = CI_CUDA_GEMV_512x3, past_all = 0;
      for (int64_t units = 1; units <= 8192; units++) {
        const int shape = ci_cuda_gemv_shape_host(dtypes[d], units, rows, 64, H200_SMS, H200_SMEM);
        if (units <= H200_SMS) assert_int_equal(shape, CI_CUDA_GEMV_512x3);
        if (past_all) assert_int_equal(shape, beyond);
        if (!past_all && shape != previous) {
          /* the order 512x3 -> 256x4 -> 256x3 -> beyond, never back */
          if (previous == CI_CUDA_GEMV_512x3) assert_int_equal(shape, CI_CUDA_GEMV_256x4);
          if (previous == CI_CUDA_GEMV_256x4) assert_int_equal(shape, CI_CUDA_GEMV_256x3);
          if (previous == CI_CUDA_GEMV_256x3) {
            assert_int_equal(shape, beyond);
            past_all = 1;
          }
        }
        if (!past_all) band_end[d][rows][shape] = units;
        previous = shape;
      }
      assert_true(past_all);
      if (rows > 1)
        for (int sh = 0; sh < 3; sh++)
          assert_true(band_end[d][rows][sh] <= band_end[d][rows - 1][sh]);
    }
  }
  for (int sh = 0; sh < 3; sh++) assert_true(band_end[1][1][sh] < band_end[0][1][sh]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_benchmark_geometry_shapes),
      cmocka_unit_test(test_bands_in_units),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

#else

int main(void) {
  printf("test_cuda_gemv_shapes: built without the CUDA backend: skipped\n");
  return 77;
}

#endif
