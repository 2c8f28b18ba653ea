/* The CUDA backend's K segments (src/backend/cuda/cuda_matmul.cu, ci_cuda_k_segment): which
 * matrices have their rows summed in segments and how long the segments are, checked on the host
 * without a GPU. What the kernels rely on: a segment is whole 512-column stages of the
 * small-batch kernel (or the whole row), at most four segments, the cut a function of the matrix
 * alone; and the documented cuts of the benchmark geometries (docs/cuda.md, "Batch invariance").
 * Skipped (exit 77) in a build without the CUDA backend. */
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

/* Every format over a grid of shapes: bf16/f16/f32 rows stay whole; an affine cut is whole
 * 512-column stages, shorter than the row, in two to four segments; long affine rows are cut
 * (up to the row bound of the segment counters); rows of 2048 columns or fewer stay whole except
 * q4's exactly-2048-column rows of small matrices. */
static void test_cuts_are_whole_stages(void **state) {
  (void)state;
  const int dtypes[] = {CI_BF16, CI_F16, CI_F32, CI_Q8, CI_Q4};
  const int64_t ns[] = {16, 512, 1024, 4096, 4112, 14336, 128256, 400000};
  const int64_t ks[] = {64, 1152, 2048, 2080, 4096, 4128, 6912, 8192, 8704, 14336, 28672};
  int cut = 0;
  for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
      for (size_t j = 0; j < sizeof ks / sizeof ks[0]; j++) {
        const int dtype = dtypes[d];
        const int64_t n = ns[i], k = ks[j], cols = ci_cuda_k_segment_host(dtype, n, k);
        const int affine = dtype == CI_Q8 || dtype == CI_Q4;
        if (!affine || k < 2048 || n > 300000) {
          assert_int_equal(cols, k);
          continue;
        }
        if (cols == k) {
          /* whole: q8 up to 4096 columns, q4 up to 4096 columns in matrices of more rows */
          assert_true(k <= 4096 && (dtype == CI_Q8 || n > 4096));
          continue;
        }
        cut++;
        const int64_t segs = (k + cols - 1) / cols;
        assert_int_equal(cols % 512, 0);
        assert_true(cols < k && segs >= 2 && segs <= 4);
        assert_true(k - (segs - 1) * cols > 0); /* the last segment is not empty */
        if (k > 4096) assert_true(segs >= 2);
      }
  printf("  %d (format, shape) pairs cut into K segments, each in whole 512-column stages\n", cut);
  assert_true(cut > 0);
}

/* The cuts docs/cuda.md and bench/cuda.md report for the benchmark geometries. */
static void test_benchmark_geometry_cuts(void **state) {
  (void)state;
  static const struct {
    int dtype;
    int64_t n, k, cols;
    const char *what;
  } cases[] = {
      {CI_Q4, 4096, 14336, 3584, "8B down, q4: four segments"},
      {CI_Q8, 4096, 14336, 7168, "8B down, q8: two segments"},
      {CI_Q4, 2048, 8192, 2048, "1B down, q4: four segments"},
      {CI_Q8, 2048, 8192, 2048, "1B down, q8: four segments"},
      {CI_Q4, 4096, 4096, 2048, "8B q / o, q4: two segments"},
      {CI_Q4, 1024, 4096, 2048, "8B k / v, q4: two segments"},
      {CI_Q8, 4096, 4096, 4096, "8B q / o, q8: whole"},
      {CI_Q4, 14336, 4096, 4096, "8B gate / up, q4: whole"},
      {CI_Q4, 2048, 2048, 1024, "1B q / o, q4: two segments"},
      {CI_Q4, 8192, 2048, 2048, "1B gate / up, q4: whole"},
      {CI_BF16, 4096, 14336, 14336, "8B down, bf16: whole"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const int64_t cols = ci_cuda_k_segment_host(cases[i].dtype, cases[i].n, cases[i].k);
    printf("  %-32s %lld columns a segment\n", cases[i].what, (long long)cols);
    assert_int_equal(cols, cases[i].cols);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_cuts_are_whole_stages),
                                     cmocka_unit_test(test_benchmark_geometry_cuts)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}

#else

int main(void) {
  printf("built without the CUDA backend: skipped\n");
  return 77;
}

#endif
