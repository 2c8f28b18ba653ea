/* The CUDA small-batch kernel's stage shapes for affine weights (src/backend/cuda/cuda_gemv.cu,
 * gv_affine_narrow), checked on the host without a GPU: a product streams the narrow stages
 * (256 columns, four deep) exactly when it has more (row group, segment) units than blocks of
 * the wide shape (512 columns, three deep) fit on the GPU at once; the choices the benchmark
 * geometries' measurements rest on (docs/cuda.md, bench/cuda.md) on the H200. Skipped (exit 77)
 * in a build without the CUDA backend. */
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

/* The 8B and 1B geometries' products at 1 and 8 input rows: units are row tiles of 16 times K
 * segments (the down projection in four, q4's q|k|v and o in two, q8's down in two). */
static void test_benchmark_geometry_shapes(void **state) {
  (void)state;
  static const struct {
    int dtype;
    int64_t units, x_rows;
    int narrow;
    const char *what;
  } cases[] = {
      {CI_Q4, 1792, 1, 1, "8B gate|up, q4, 1 row"},  {CI_Q4, 1024, 1, 0, "8B down, q4, 1 row"},
      {CI_Q4, 768, 1, 0, "8B q|k|v, q4, 1 row"},     {CI_Q4, 512, 1, 0, "8B o, q4, 1 row"},
      {CI_Q4, 768, 8, 1, "8B q|k|v, q4, 8 rows"},    {CI_Q4, 512, 8, 0, "8B o, q4, 8 rows"},
      {CI_Q4, 1024, 8, 1, "8B down, q4, 8 rows"},    {CI_Q4, 1024, 1, 0, "1B gate|up, q4, 1 row"},
      {CI_Q4, 1024, 8, 1, "1B gate|up, q4, 8 rows"}, {CI_Q4, 512, 8, 0, "1B down, q4, 8 rows"},
      {CI_Q8, 1792, 1, 1, "8B gate|up, q8, 1 row"},  {CI_Q8, 512, 1, 0, "8B down, q8, 1 row"},
      {CI_Q8, 384, 8, 0, "8B q|k|v, q8, 8 rows"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const int narrow = ci_cuda_gemv_narrow_host(cases[i].dtype, cases[i].units, cases[i].x_rows,
                                                H200_SMS, H200_SMEM);
    printf("  %-26s %5lld units: %s stages\n", cases[i].what, (long long)cases[i].units,
           narrow ? "narrow" : "wide");
    assert_int_equal(narrow, cases[i].narrow);
  }
}

/* The switch is a threshold in units that falls as input rows (and q8's larger stages) make the
 * wide blocks larger: once narrow, more units stay narrow, and so do more input rows. */
static void test_threshold_in_units(void **state) {
  (void)state;
  const int dtypes[] = {CI_Q4, CI_Q8};
  for (size_t d = 0; d < 2; d++) {
    int64_t previous = 0;
    for (int64_t rows = 1; rows <= 8; rows++) {
      int64_t first = -1;
      for (int64_t units = 1; units <= 8192; units++) {
        const int narrow = ci_cuda_gemv_narrow_host(dtypes[d], units, rows, H200_SMS, H200_SMEM);
        if (first < 0 && narrow) first = units;
        if (first >= 0) assert_true(narrow);
      }
      assert_true(first > H200_SMS); /* a wave of one block an SM never switches */
      if (previous) assert_true(first <= previous);
      previous = first;
    }
    /* q8's stages are larger: its threshold is lower than q4's */
    assert_true(!ci_cuda_gemv_narrow_host(CI_Q4, 1000, 1, H200_SMS, H200_SMEM) &&
                ci_cuda_gemv_narrow_host(CI_Q8, 1000, 1, H200_SMS, H200_SMEM));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_benchmark_geometry_shapes),
      cmocka_unit_test(test_threshold_in_units),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

#else

int main(void) {
  printf("test_cuda_gemv_shapes: built without the CUDA backend: skipped\n");
  return 77;
}

#endif
