/* The CUDA backend's KV codec code (src/backend/cuda/cuda_kv_codec.cuh, compiled for the host
 * through ci_cuda_kv_encode_row_host / ci_cuda_kv_decode_row_host) against the CPU reference
 * (ci_kv_encode_row / ci_kv_decode_row), without a GPU: for every codec, bit width, group size
 * and head_dim the GPU runs, on Gaussian rows, outlier rows, constant rows and zero rows, the
 * encoded bytes are identical and the decoded floats are bit-identical. The kernels run this same
 * code with every operation explicitly rounded (test_cuda checks the GPU's bytes on a GPU); this
 * test pins the codec logic (index math, packing, the quantize rules) on every CI machine.
 * Skipped (exit 77) in a build without the CUDA backend. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "base/error.h"
#include "tensor/kv_format.h"
#include "tensor/turbo_quant.h"
#ifdef CINFER_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef CINFER_CUDA

enum { MAX_D = 512, ROWS = 40 };

static uint64_t rng_state = 0x5851f42d4c957f2dull;
static double uniform(void) {
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return ((rng_state >> 11) + 0.5) / 9007199254740992.0;
}
static float normal(void) {
  return (float)(sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform()));
}

/* Row r of a test set: Gaussian rows of several scales and offsets, one with outliers, a
 * constant row, a zero row and one with a single non-zero. */
static void fill_row(int r, int D, float *x) {
  for (int i = 0; i < D; i++) x[i] = normal() * (0.05f + 0.3f * (float)(r % 7)) + 0.1f * (r % 3);
  if (r % 10 == 4) x[r % D] = 40.0f, x[(r * 7) % D] = -25.0f;
  if (r % 10 == 6)
    for (int i = 0; i < D; i++) x[i] = 0.75f;
  if (r % 10 == 8) memset(x, 0, (size_t)D * sizeof *x);
  if (r % 10 == 9) {
    memset(x, 0, (size_t)D * sizeof *x);
    x[D / 2] = -3.5f;
  }
}

static void check_format(const ci_kv_format *f, int D) {
  char name[32];
  ci_kv_format_name(f, name, sizeof name);
  float signs[MAX_D], x[MAX_D], want_x[MAX_D], got_x[MAX_D];
  uint8_t want[4 * MAX_D], got[4 * MAX_D];
  ci_turbo_signs(5, D, signs);
  for (int value = 0; value < 2; value++) {
    const size_t bytes = ci_kv_row_bytes(f, D, value);
    assert_true(bytes <= sizeof want);
    for (int r = 0; r < ROWS; r++) {
      fill_row(r, D, x);
      memset(want, 0xa5, sizeof want);
      memset(got, 0x5a, sizeof got);
      ci_kv_encode_row(f, value, signs, x, D, want);
      assert_int_equal(ci_cuda_kv_encode_row_host(f, value, signs, x, D, got), CI_OK);
      if (memcmp(want, got, bytes)) {
        size_t at = 0;
        while (want[at] == got[at]) at++;
        fail_msg("%s D %d %s row %d: byte %zu is %02x, the CPU's %02x", name, D, value ? "V" : "K",
                 r, at, got[at], want[at]);
      }
      ci_kv_decode_row(f, value, signs, want, D, want_x);
      assert_int_equal(ci_cuda_kv_decode_row_host(f, value, signs, want, D, got_x), CI_OK);
      if (memcmp(want_x, got_x, (size_t)D * sizeof(float)))
        fail_msg("%s D %d %s row %d: decoded values differ from the CPU's", name, D,
                 value ? "V" : "K", r);
    }
  }
}

static void test_every_codec(void **state) {
  (void)state;
  static const struct {
    const char *codec;
    int bits, value_bits, group;
  } all[] = {
      {"bf16", 0, 0, 0},     {"f32", 0, 0, 0},     {"affine", 8, 0, 32}, {"affine", 8, 0, 64},
      {"affine", 8, 0, 128}, {"affine", 4, 0, 32}, {"affine", 4, 0, 64}, {"affine", 4, 0, 128},
      {"turbo", 2, 2, 0},    {"turbo", 3, 3, 0},   {"turbo", 4, 4, 0},   {"turbo", 4, 3, 0},
      {"turbo", 3, 2, 0},    {"turbo", 2, 4, 0},   {"turbo-v", 8, 2, 0}, {"turbo-v", 8, 3, 0},
      {"turbo-v", 8, 4, 0},  {"turbo-v", 4, 2, 0}, {"turbo-v", 4, 3, 0}, {"turbo-v", 4, 4, 0}};
  const int dims[] = {16, 32, 64, 128, 256, 512};
  int checked = 0;
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++) {
      ci_kv_format f;
      assert_int_equal(
          ci_kv_format_parse(all[i].codec, all[i].bits, all[i].value_bits, all[i].group, &f),
          CI_OK);
      if (ci_kv_format_check(&f, dims[d]) != CI_OK) continue;
      check_format(&f, dims[d]);
      checked++;
    }
  printf("  %d (format, head_dim) pairs: the GPU codec's bytes and values equal the CPU's\n",
         checked);
  assert_true(checked >= 90);
}

static void test_bad_arguments(void **state) {
  (void)state;
  ci_kv_format f;
  assert_int_equal(ci_kv_format_parse("turbo", 4, 3, 0, &f), CI_OK);
  float x[1024] = {0}, signs[1024];
  uint8_t row[4096];
  ci_turbo_signs(0, 1024, signs);
  assert_int_equal(ci_cuda_kv_encode_row_host(&f, 0, signs, x, 1024, row), CI_ERR);
  assert_non_null(strstr(ci_last_error(), "head_dim"));
  assert_int_equal(ci_cuda_kv_encode_row_host(&f, 0, NULL, x, 64, row), CI_ERR);
  assert_non_null(strstr(ci_last_error(), "sign vector"));
  assert_int_equal(ci_cuda_kv_decode_row_host(&f, 1, signs, row, 96, x), CI_ERR);
  assert_non_null(strstr(ci_last_error(), "power of two"));
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_every_codec),
                                     cmocka_unit_test(test_bad_arguments)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}

#else

int main(void) {
  fprintf(stderr, "test_cuda_kv_codec: this build has no CUDA backend\n");
  return 77;
}

#endif
