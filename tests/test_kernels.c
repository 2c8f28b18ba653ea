/* CPU kernel tests: the reference matmul against a naive double-precision dequantize-then-dot,
 * every SIMD matmul the CPU supports against the reference (odd shapes, all formats, group
 * sizes and scale dtypes; the AVX-512 affine row kernels with and without int8 x planes, the
 * int8 ones also within their quantization bound on awkward activations), threaded against
 * single-threaded, and the bf16 vector loops. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backend/cpu/kernels.h"
#include "base/error.h"
#include "base/threadpool.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==== Deterministic random numbers ==== */

/* xorshift64* state; each test owns one. */
typedef struct {
  uint64_t state;
} test_rng;

/* Next 32 random bits. */
static uint32_t rng_u32(test_rng *rng) {
  rng->state ^= rng->state >> 12;
  rng->state ^= rng->state << 25;
  rng->state ^= rng->state >> 27;
  return (uint32_t)((rng->state * 0x2545F4914F6CDD1DULL) >> 32);
}

/* Uniform in [lo, hi). */
static float rng_uniform(test_rng *rng, float lo, float hi) {
  return lo + (hi - lo) * (float)(rng_u32(rng) >> 8) * (1.0f / 16777216.0f);
}

/* ==== Test weights ==== */

/* A weight tensor that owns its buffers. */
typedef struct {
  ci_tensor t;
  void *data, *scales, *biases;
} test_weight;

/* Stores f as element i of a float array of dtype dt. Values that would be f16 subnormals
 * are stored as 0 (the f16 encoder in dtype.c is not the subject here). */
static void store_float(ci_dtype dt, void *base, size_t i, float f) {
  if (dt == CI_F32)
    ((float *)base)[i] = f;
  else if (dt == CI_F16)
    ((uint16_t *)base)[i] = ci_f32_to_f16(fabsf(f) < 1e-4f ? 0.0f : f);
  else
    ((uint16_t *)base)[i] = ci_f32_to_bf16(f);
}

/* A random [n, k] weight of `dtype`; affine formats get random codes, scales of both signs and
 * biases, stored as scale_dtype with the given group size. */
static test_weight make_weight(test_rng *rng, ci_dtype dtype, int64_t n, int64_t k,
                               ci_dtype scale_dtype, int group) {
  test_weight w;
  memset(&w, 0, sizeof w);
  w.t.dtype = dtype;
  w.t.ndim = 2;
  w.t.shape[0] = n;
  w.t.shape[1] = k;
  size_t count = (size_t)(n * k);
  if (ci_dtype_is_affine(dtype)) {
    int bits = dtype == CI_Q8 ? 8 : 4;
    size_t words = count * (size_t)bits / 32;
    uint32_t *codes = malloc(words * sizeof *codes);
    for (size_t i = 0; i < words; i++) codes[i] = rng_u32(rng);
    size_t n_groups = count / (size_t)group;
    size_t scale_bytes = ci_dtype_bytes(scale_dtype, n_groups);
    w.scales = malloc(scale_bytes);
    w.biases = malloc(scale_bytes);
    for (size_t g = 0; g < n_groups; g++) {
      store_float(scale_dtype, w.scales, g, rng_uniform(rng, -0.02f, 0.02f));
      store_float(scale_dtype, w.biases, g, rng_uniform(rng, -0.1f, 0.1f));
    }
    w.data = codes;
    w.t.scales = w.scales;
    w.t.biases = w.biases;
    w.t.scale_dtype = scale_dtype;
    w.t.group_size = group;
  } else {
    w.data = malloc(ci_dtype_bytes(dtype, count));
    for (size_t i = 0; i < count; i++) store_float(dtype, w.data, i, rng_uniform(rng, -1, 1));
  }
  w.t.data = w.data;
  return w;
}

/* Frees a test weight's buffers. */
static void free_weight(test_weight *w) {
  free(w->data);
  free(w->scales);
  free(w->biases);
}

/* Random activations. */
static float *make_x(test_rng *rng, int64_t m, int64_t k) {
  float *x = malloc((size_t)(m * k) * sizeof *x);
  for (int64_t i = 0; i < m * k; i++) x[i] = rng_uniform(rng, -2, 2);
  return x;
}

/* W[r, c] of a test weight, dequantized in double, straight from the format definition. */
static double naive_weight(const ci_tensor *w, int64_t r, int64_t c, double *term_scale,
                           double *term_bias) {
  int64_t k = w->shape[1];
  if (!ci_dtype_is_affine(w->dtype)) {
    double v = ci_float_at(w->dtype, w->data, (size_t)(r * k + c));
    *term_scale = v;
    *term_bias = 0;
    return v;
  }
  int bits = w->dtype == CI_Q8 ? 8 : 4;
  const uint8_t *bytes = w->data;
  uint64_t bit = (uint64_t)(r * k + c) * (uint64_t)bits; /* rows are whole bytes */
  unsigned q = (bytes[bit / 8] >> (bit % 8)) & ((1u << bits) - 1);
  size_t g = (size_t)(r * (k / w->group_size) + c / w->group_size);
  double s = ci_float_at(w->scale_dtype, w->scales, g);
  double b = ci_float_at(w->scale_dtype, w->biases, g);
  *term_scale = s * q;
  *term_bias = b;
  return s * q + b;
}

/* y = x @ W^T in double, and sum of |terms| per output (the error scale of f32 sums). Each
 * weight row is dequantized once, then dotted with every x row. */
static void naive_matmul(const ci_tensor *w, const float *x, int64_t m, double *y,
                         double *abs_sum) {
  int64_t n = w->shape[0], k = w->shape[1];
  double *row = malloc((size_t)k * sizeof *row);
  double *magnitude = malloc((size_t)k * sizeof *magnitude);
  for (int64_t r = 0; r < n; r++) {
    for (int64_t c = 0; c < k; c++) {
      double ts, tb;
      row[c] = naive_weight(w, r, c, &ts, &tb);
      magnitude[c] = fabs(ts) + fabs(tb);
    }
    for (int64_t i = 0; i < m; i++) {
      double sum = 0, mag = 0;
      for (int64_t c = 0; c < k; c++) {
        sum += row[c] * x[i * k + c];
        mag += magnitude[c] * fabs(x[i * k + c]);
      }
      y[i * n + r] = sum;
      abs_sum[i * n + r] = mag;
    }
  }
  free(row);
  free(magnitude);
}

/* ==== Matmul shape tables ==== */

static const ci_dtype float_dtypes[] = {CI_F32, CI_F16, CI_BF16};
static const ci_dtype scale_dtypes[] = {CI_F32, CI_F16, CI_BF16};
static const int group_sizes[] = {32, 64, 128};
/* Small m runs the row kernels; 30 and 131 reach the panel kernels (their thresholds differ
 * per ISA and format). */
static const int64_t m_values[] = {1, 2, 3, 5, 17, 30, 131};
static const int64_t float_k_values[] = {1, 7, 16, 33, 100, 300, 600};
static const int64_t n_values[] = {1, 3, 37};

/* Output buffer with guard values past the end, to catch writes outside y[m, n]. */
enum { GUARD = 64 };
static const float GUARD_VALUE = -12345.0f;

/* Allocates y[m*n + GUARD], guard filled. */
static float *make_y(int64_t m, int64_t n) {
  float *y = malloc((size_t)(m * n + GUARD) * sizeof *y);
  for (int64_t i = 0; i < m * n + GUARD; i++) y[i] = GUARD_VALUE;
  return y;
}

/* Checks the guard after y[m*n]. */
static void check_guard(const float *y, int64_t m, int64_t n) {
  for (int64_t i = m * n; i < m * n + GUARD; i++) assert_true(y[i] == GUARD_VALUE);
}

/* Runs one matmul of `isa` on w and compares it with `expected` (from another ISA or the
 * naive double product) within 1e-5 of the sum of |terms|. */
static void check_matmul(ci_isa isa, const test_weight *w, const float *x, int64_t m,
                         const double *expected, const double *abs_sum, const char *what) {
  int64_t n = w->t.shape[0];
  float *y = make_y(m, n);
  assert_int_equal(ci_cpu_matmul(NULL, isa, &w->t, x, m, y), CI_OK);
  check_guard(y, m, n);
  for (int64_t i = 0; i < m * n; i++) {
    double tolerance = 1e-5 * abs_sum[i] + 1e-30;
    if (!(fabs(y[i] - expected[i]) <= tolerance)) {
      print_error("%s isa=%s dtype=%s scale=%s g=%d m=%lld n=%lld k=%lld: y[%lld]=%.9g "
                  "expected %.9g (tolerance %.3g)\n",
                  what, ci_isa_name(isa), ci_dtype_get(w->t.dtype)->name,
                  ci_dtype_get(w->t.scale_dtype)->name, w->t.group_size, (long long)m, (long long)n,
                  (long long)w->t.shape[1], (long long)i, y[i], expected[i], tolerance);
      fail();
    }
  }
  free(y);
}

/* Compares `isa` against `baseline` (or against the naive product when baseline is -1) on one
 * weight and every m. */
static void check_weight_all_m(test_rng *rng, ci_isa isa, int baseline, const test_weight *w) {
  int64_t n = w->t.shape[0], k = w->t.shape[1];
  size_t n_m = sizeof m_values / sizeof *m_values;
  if (n != n_values[sizeof n_values / sizeof *n_values - 1]) n_m--; /* large m: one n only */
  for (size_t mi = 0; mi < n_m; mi++) {
    int64_t m = m_values[mi];
    float *x = make_x(rng, m, k);
    double *expected = malloc((size_t)(m * n) * sizeof *expected);
    double *abs_sum = malloc((size_t)(m * n) * sizeof *abs_sum);
    naive_matmul(&w->t, x, m, expected, abs_sum);
    if (baseline >= 0) {
      float *y = make_y(m, n);
      assert_int_equal(ci_cpu_matmul(NULL, (ci_isa)baseline, &w->t, x, m, y), CI_OK);
      for (int64_t i = 0; i < m * n; i++) expected[i] = y[i];
      free(y);
    }
    check_matmul(isa, w, x, m, expected, abs_sum, baseline >= 0 ? "vs ref" : "vs naive");
    free(x);
    free(expected);
    free(abs_sum);
  }
}

/* Every format and shape from the tables: `isa` against `baseline` (-1: the naive product). */
static void check_isa_all_formats(ci_isa isa, int baseline, uint64_t seed) {
  test_rng rng = {seed};
  for (size_t ni = 0; ni < sizeof n_values / sizeof *n_values; ni++) {
    int64_t n = n_values[ni];
    for (size_t di = 0; di < 3; di++)
      for (size_t ki = 0; ki < sizeof float_k_values / sizeof *float_k_values; ki++) {
        test_weight w = make_weight(&rng, float_dtypes[di], n, float_k_values[ki], CI_F32, 0);
        check_weight_all_m(&rng, isa, baseline, &w);
        free_weight(&w);
      }
    for (int q = 0; q < 2; q++)
      for (size_t si = 0; si < 3; si++)
        for (size_t gi = 0; gi < 3; gi++) {
          int group = group_sizes[gi];
          /* One group; three whole 128-column blocks; and more than one 512-column panel
           * block ending in a partial vector block where the group size allows it. */
          static const int64_t long_k[] = {672, 704, 640};
          int64_t k = ni == 0 ? group : ni == 1 ? 384 : long_k[gi];
          test_weight w = make_weight(&rng, q ? CI_Q4 : CI_Q8, n, k, scale_dtypes[si], group);
          check_weight_all_m(&rng, isa, baseline, &w);
          free_weight(&w);
        }
  }
}

/* ==== Matmul tests ==== */

/* The reference kernels agree with the naive double-precision product. */
static void test_ref_matches_naive(void **state) {
  (void)state;
  check_isa_all_formats(CI_ISA_REF, -1, 1);
}

/* Sets CINFER_INT8 (NULL: unsets it); returns a copy of the old value for restore_int8. */
static char *set_int8(const char *value) {
  const char *saved = getenv("CINFER_INT8");
  char *copy = saved ? strdup(saved) : NULL;
  if (value)
    setenv("CINFER_INT8", value, 1);
  else
    unsetenv("CINFER_INT8");
  return copy;
}

/* Restores CINFER_INT8 from set_int8's copy and frees it. */
static void restore_int8(char *saved) {
  if (saved)
    setenv("CINFER_INT8", saved, 1);
  else
    unsetenv("CINFER_INT8");
  free(saved);
}

/* Every SIMD ISA the CPU supports agrees with the reference; AVX-512 both with its int8-plane
 * affine row kernels (where the CPU has VNNI) and with the f32 ones (CINFER_INT8=0). */
static void test_simd_matches_ref(void **state) {
  (void)state;
  for (int isa = CI_ISA_REF + 1; isa < CI_ISA_COUNT; isa++) {
    if (!ci_isa_supported((ci_isa)isa)) {
      print_message("skipping %s: not supported here\n", ci_isa_name((ci_isa)isa));
      continue;
    }
    check_isa_all_formats((ci_isa)isa, CI_ISA_REF, 100 + (uint64_t)isa);
    if (isa == CI_ISA_AVX512) {
      char *saved = set_int8("0");
      check_isa_all_formats((ci_isa)isa, CI_ISA_REF, 200 + (uint64_t)isa);
      restore_int8(saved);
    }
  }
}

/* ==== Int8 x planes ==== */

/* Activations whose groups take turns being random, all zero, random with one huge outlier,
 * constant, and random at a tiny scale; `salt` shifts the pattern between rows. */
static float *make_awkward_x(test_rng *rng, int64_t m, int64_t k, int group, int salt) {
  float *x = make_x(rng, m, k);
  for (int64_t i = 0; i < m; i++)
    for (int64_t g = 0; g < k / group; g++) {
      float *v = x + i * k + g * group;
      switch ((g + i + salt) % 5) {
      case 1:
        memset(v, 0, (size_t)group * sizeof *v);
        break;
      case 2:
        v[rng_u32(rng) % (uint32_t)group] = rng_u32(rng) & 1 ? 3.0e4f : -3.0e4f;
        break;
      case 3: {
        float constant = rng_uniform(rng, -2, 2);
        for (int j = 0; j < group; j++) v[j] = constant;
        break;
      }
      case 4:
        for (int j = 0; j < group; j++) v[j] *= 1e-20f;
        break;
      default:
        break;
      }
    }
  return x;
}

/* Per output, the quantization bound of the int8 x planes: sum_c |s_g q_c| * step_g / 131072,
 * with step_g = max|x_g| / 127 (24-bit fixed point: each x element is off by at most
 * step_g / 2^17; the biases meet exact group sums, so only the s*q half of the weight sees
 * the error). */
static void int8_plane_bound(const ci_tensor *w, const float *x, int64_t m, double *bound) {
  int64_t n = w->shape[0], k = w->shape[1];
  int group = w->group_size;
  for (int64_t i = 0; i < m; i++) {
    const float *xi = x + i * k;
    for (int64_t r = 0; r < n; r++) {
      double sum = 0;
      for (int64_t g0 = 0; g0 < k; g0 += group) {
        double max = 0, weight = 0;
        for (int64_t c = g0; c < g0 + group; c++) {
          double ts, tb;
          naive_weight(w, r, c, &ts, &tb);
          max = fmax(max, fabs(xi[c]));
          weight += fabs(ts);
        }
        sum += weight * (max / 127) / 131072;
      }
      bound[i * n + r] = sum;
    }
  }
}

/* The AVX-512 affine row kernels (int8 x planes where the CPU has VNNI) agree with the
 * reference within the planes' quantization bound plus f32 rounding (2e-6 of the sum of
 * |terms|, tighter than the 1e-5 elsewhere, so that a lost plane shows), on awkward activations:
 * every group size and scale dtype, odd n, m in {1, 2, 3, 5}, K with partial code blocks and
 * longer than one factor chunk. */
static void test_int8_planes_within_bound(void **state) {
  (void)state;
  if (!ci_isa_supported(CI_ISA_AVX512)) {
    print_message("skipping: AVX-512 not supported here\n");
    return;
  }
  test_rng rng = {17};
  const int64_t ms[] = {1, 2, 3, 5};
  double worst_ratio = 0; /* largest |error| / tolerance seen, for the log */
  for (int q = 0; q < 2; q++)
    for (size_t si = 0; si < 3; si++)
      for (size_t gi = 0; gi < 3; gi++) {
        int group = group_sizes[gi];
        /* odd multiples of the group: partial 64-byte code blocks for g < 128 */
        const int64_t ks[] = {group, 11 * group, 4096 + 3 * group};
        for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++) {
          int64_t n = ki == 2 ? 5 : 37, k = ks[ki];
          test_weight w = make_weight(&rng, q ? CI_Q4 : CI_Q8, n, k, scale_dtypes[si], group);
          for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++) {
            int64_t m = ms[mi];
            float *x = make_awkward_x(&rng, m, k, group, (int)(ki + mi));
            double *expected = malloc((size_t)(m * n) * sizeof *expected);
            double *abs_sum = malloc((size_t)(m * n) * sizeof *abs_sum);
            double *bound = malloc((size_t)(m * n) * sizeof *bound);
            naive_matmul(&w.t, x, m, expected, abs_sum);
            int8_plane_bound(&w.t, x, m, bound);
            float *y_ref = make_y(m, n), *y = make_y(m, n);
            assert_int_equal(ci_cpu_matmul(NULL, CI_ISA_REF, &w.t, x, m, y_ref), CI_OK);
            assert_int_equal(ci_cpu_matmul(NULL, CI_ISA_AVX512, &w.t, x, m, y), CI_OK);
            check_guard(y, m, n);
            for (int64_t i = 0; i < m * n; i++) {
              double tolerance = bound[i] + 2e-6 * abs_sum[i] + 1e-30;
              double error = fabs((double)y[i] - y_ref[i]);
              worst_ratio = fmax(worst_ratio, error / tolerance);
              if (!(error <= tolerance)) {
                print_error("int8 %s scale=%s g=%d m=%lld n=%lld k=%lld: y[%lld]=%.9g ref %.9g "
                            "(bound %.3g, tolerance %.3g)\n",
                            q ? "q4" : "q8", ci_dtype_get(scale_dtypes[si])->name, group,
                            (long long)m, (long long)n, (long long)k, (long long)i, y[i], y_ref[i],
                            bound[i], tolerance);
                fail();
              }
            }
            free(x);
            free(expected);
            free(abs_sum);
            free(bound);
            free(y_ref);
            free(y);
          }
          free_weight(&w);
        }
      }
  print_message("int8 planes: worst |error| / tolerance %.3g\n", worst_ratio);
}

/* An Inf or NaN in x gives non-finite outputs on the int8 path, as on the f32 one. */
static void test_int8_planes_non_finite(void **state) {
  (void)state;
  if (!ci_isa_supported(CI_ISA_AVX512)) return;
  test_rng rng = {19};
  const float specials[] = {INFINITY, NAN};
  for (int q = 0; q < 2; q++)
    for (size_t s = 0; s < 2; s++) {
      test_weight w = make_weight(&rng, q ? CI_Q4 : CI_Q8, 5, 256, CI_BF16, 64);
      float *x = make_x(&rng, 1, 256);
      x[70] = specials[s];
      float *y = make_y(1, 5);
      assert_int_equal(ci_cpu_matmul(NULL, CI_ISA_AVX512, &w.t, x, 1, y), CI_OK);
      for (int r = 0; r < 5; r++) assert_false(isfinite(y[r]));
      free(x);
      free(y);
      free_weight(&w);
    }
}

/* Compares `isa` with the naive product on one weight for m = 1..max_m. */
static void check_vs_naive(test_rng *rng, ci_isa isa, const test_weight *w, int64_t max_m) {
  int64_t n = w->t.shape[0], k = w->t.shape[1];
  for (int64_t m = 1; m <= max_m; m++) {
    float *x = make_x(rng, m, k);
    double *expected = malloc((size_t)(m * n) * sizeof *expected);
    double *abs_sum = malloc((size_t)(m * n) * sizeof *abs_sum);
    naive_matmul(&w->t, x, m, expected, abs_sum);
    check_matmul(isa, w, x, m, expected, abs_sum, "vs naive");
    free(x);
    free(expected);
    free(abs_sum);
  }
}

/* Rows longer than the row kernels' scale-conversion chunk (2048 columns), every format. */
static void test_long_rows(void **state) {
  (void)state;
  test_rng rng = {5};
  for (int isa = CI_ISA_REF + 1; isa < CI_ISA_COUNT; isa++) {
    if (!ci_isa_supported((ci_isa)isa)) continue;
    for (size_t d = 0; d < 3; d++) {
      test_weight w = make_weight(&rng, float_dtypes[d], 5, 4099, CI_F32, 0);
      check_vs_naive(&rng, (ci_isa)isa, &w, 3);
      free_weight(&w);
    }
    for (int q = 0; q < 2; q++)
      for (size_t gi = 0; gi < 3; gi++) {
        int group = group_sizes[gi];
        test_weight w = make_weight(&rng, q ? CI_Q4 : CI_Q8, 5, 4096 + 3 * group, CI_BF16, group);
        check_vs_naive(&rng, (ci_isa)isa, &w, 3);
        free_weight(&w);
      }
  }
}

/* A threaded matmul gives bit-identical results to a single-threaded one, for the row and
 * panel kernels of every ISA, in both precisions. */
static void test_threaded_matches_single(void **state) {
  (void)state;
  test_rng rng = {7};
  ci_threadpool *pool = ci_threadpool_create(3);
  assert_non_null(pool);
  const ci_dtype dtypes[] = {CI_F32, CI_F16, CI_BF16, CI_Q8, CI_Q4};
  for (int isa = 0; isa < CI_ISA_COUNT; isa++) {
    if (!ci_isa_supported((ci_isa)isa)) continue;
    for (size_t d = 0; d < sizeof dtypes / sizeof *dtypes; d++) {
      int64_t n = 517, k = 1024;
      test_weight w = make_weight(&rng, dtypes[d], n, k, CI_BF16, 64);
      const int64_t ms[] = {1, 4, 30, 131}; /* row and panel kernels of every format */
      for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++) {
        int64_t m = ms[mi];
        if (isa == CI_ISA_REF && m > 4) continue; /* slow and has a single path */
        float *x = make_x(&rng, m, k);
        float *y_single = make_y(m, n), *y_threaded = make_y(m, n);
        for (int p = 0; p < 2; p++) {
          const ci_precision precision = p ? CI_PRECISION_FAST : CI_PRECISION_EXACT;
          assert_int_equal(
              ci_cpu_matmul_with(NULL, (ci_isa)isa, precision, &w.t, x, m, y_single, 0), CI_OK);
          assert_int_equal(
              ci_cpu_matmul_with(pool, (ci_isa)isa, precision, &w.t, x, m, y_threaded, 0), CI_OK);
          assert_memory_equal(y_single, y_threaded, (size_t)(m * n + GUARD) * sizeof(float));
        }
        free(x);
        free(y_single);
        free(y_threaded);
      }
      free_weight(&w);
    }
  }
  ci_threadpool_free(pool);
}

/* The panel kernels compute each x row from its own values only: the first rows of a call
 * are bit-identical to a call of those rows alone, in both precisions, for every ISA (with AMX
 * where the CPU has it: its padded x tiles must not leak into real rows). */
static void test_panel_rows_independent(void **state) {
  (void)state;
  test_rng rng = {29};
  ci_threadpool *pool = ci_threadpool_create(2);
  assert_non_null(pool);
  const ci_dtype dtypes[] = {CI_BF16, CI_Q8, CI_Q4};
  for (int isa = 1; isa < CI_ISA_COUNT; isa++) { /* the reference has no panel kernels */
    if (!ci_isa_supported((ci_isa)isa)) continue;
    for (size_t d = 0; d < sizeof dtypes / sizeof *dtypes; d++) {
      const int64_t n = 75, k = 576, m_few = 133, m_many = 150;
      test_weight w = make_weight(&rng, dtypes[d], n, k, CI_BF16, 64);
      float *x = make_x(&rng, m_many, k);
      float *y_few = make_y(m_few, n), *y_many = make_y(m_many, n);
      for (int p = 0; p < 2; p++) {
        const ci_precision precision = p ? CI_PRECISION_FAST : CI_PRECISION_EXACT;
        assert_int_equal(ci_cpu_matmul_with(pool, (ci_isa)isa, precision, &w.t, x, m_few, y_few, 0),
                         CI_OK);
        assert_int_equal(
            ci_cpu_matmul_with(pool, (ci_isa)isa, precision, &w.t, x, m_many, y_many, 0), CI_OK);
        assert_memory_equal(y_few, y_many, (size_t)(m_few * n) * sizeof(float));
        check_guard(y_few, m_few, n);
      }
      free(x);
      free(y_few);
      free(y_many);
      free_weight(&w);
    }
  }
  ci_threadpool_free(pool);
}

/* ci_cpu_matmul_rows: every row of a many-row call (threaded, below and above the panel
 * kernels' threshold) is bit-identical to a one-row call on that row alone, in both
 * precisions. */
static void test_matmul_rows_batch_invariant(void **state) {
  (void)state;
  test_rng rng = {11};
  ci_threadpool *pool = ci_threadpool_create(2);
  assert_non_null(pool);
  const ci_dtype dtypes[] = {CI_F32, CI_F16, CI_BF16, CI_Q8, CI_Q4};
  for (int isa = 0; isa < CI_ISA_COUNT; isa++) {
    if (!ci_isa_supported((ci_isa)isa)) continue;
    for (size_t d = 0; d < sizeof dtypes / sizeof *dtypes; d++) {
      const int64_t n = 259, k = 512;
      test_weight w = make_weight(&rng, dtypes[d], n, k, CI_BF16, 64);
      const int64_t ms[] = {3, 40, 150};
      for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++) {
        const int64_t m = ms[mi];
        float *x = make_x(&rng, m, k);
        float *y = make_y(m, n), *y_one = make_y(1, n);
        assert_int_equal(ci_cpu_matmul_rows(pool, (ci_isa)isa, &w.t, x, m, y), CI_OK);
        for (int64_t i = 0; i < m; i++) {
          assert_int_equal(ci_cpu_matmul(pool, (ci_isa)isa, &w.t, x + i * k, 1, y_one), CI_OK);
          assert_memory_equal(y + i * n, y_one, (size_t)n * sizeof(float));
        }
        assert_int_equal(ci_cpu_matmul_with(pool, (ci_isa)isa, CI_PRECISION_FAST, &w.t, x, m, y, 1),
                         CI_OK);
        for (int64_t i = 0; i < m; i++) {
          assert_int_equal(ci_cpu_matmul_with(pool, (ci_isa)isa, CI_PRECISION_FAST, &w.t, x + i * k,
                                              1, y_one, 0),
                           CI_OK);
          assert_memory_equal(y + i * n, y_one, (size_t)n * sizeof(float));
        }
        free(x);
        free(y);
        free(y_one);
      }
      free_weight(&w);
    }
  }
  ci_threadpool_free(pool);
}

/* ci_cpu_matmul_segments_multi: three weights of different row counts on the same x, in one
 * threaded call with two segments (a panel one and a row one), give each weight's output bit for
 * bit as a call of that weight alone, in both precisions; weights of different layouts are
 * refused by name. */
static void test_matmul_multi_matches_single(void **state) {
  (void)state;
  test_rng rng = {19};
  ci_threadpool *pool = ci_threadpool_create(3);
  assert_non_null(pool);
  ci_arena scratch;
  ci_arena_init(&scratch);
  const ci_dtype dtypes[] = {CI_F32, CI_BF16, CI_Q8, CI_Q4};
  for (int isa = 0; isa < CI_ISA_COUNT; isa++) {
    if (!ci_isa_supported((ci_isa)isa)) continue;
    for (size_t d = 0; d < sizeof dtypes / sizeof *dtypes; d++) {
      const int64_t k = 256, ns[3] = {320, 64, 72};
      test_weight w[3];
      const ci_tensor *ws[3];
      for (int i = 0; i < 3; i++) {
        w[i] = make_weight(&rng, dtypes[d], ns[i], k, CI_BF16, 64);
        ws[i] = &w[i].t;
      }
      const int64_t ms[] = {1, 3, 40};
      for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++) {
        const int64_t m = ms[mi];
        int seg_rows[2] = {(int)(m > 1 ? m - 1 : m), 1};
        const ci_row_segments segs = {.n = m > 1 ? 2 : 1, .rows = seg_rows};
        float *x = make_x(&rng, m, k);
        for (int p = 0; p < 2; p++) {
          const ci_precision precision = p ? CI_PRECISION_FAST : CI_PRECISION_EXACT;
          float *ys[3], *one[3];
          for (int i = 0; i < 3; i++) {
            ys[i] = make_y(m, ns[i]);
            one[i] = make_y(m, ns[i]);
            assert_int_equal(ci_cpu_matmul_segments(pool, (ci_isa)isa, precision, &scratch, ws[i],
                                                    x, m, one[i], &segs),
                             CI_OK);
          }
          assert_int_equal(ci_cpu_matmul_segments_multi(pool, (ci_isa)isa, precision, &scratch, ws,
                                                        3, x, m, ys, &segs),
                           CI_OK);
          for (int i = 0; i < 3; i++) {
            assert_memory_equal(ys[i], one[i], (size_t)(m * ns[i] + GUARD) * sizeof(float));
            free(ys[i]);
            free(one[i]);
          }
        }
        free(x);
      }
      for (int i = 0; i < 3; i++) free_weight(&w[i]);
    }
  }
  /* a bf16 and an f32 weight cannot share one prepared x */
  test_weight a = make_weight(&rng, CI_BF16, 8, 64, CI_BF16, 64);
  test_weight b = make_weight(&rng, CI_F32, 8, 64, CI_BF16, 64);
  const ci_tensor *mixed[2] = {&a.t, &b.t};
  float *x = make_x(&rng, 1, 64), *y0 = make_y(1, 8), *y1 = make_y(1, 8);
  float *ys[2] = {y0, y1};
  assert_int_equal(ci_cpu_matmul_segments_multi(pool, CI_ISA_REF, CI_PRECISION_EXACT, &scratch,
                                                mixed, 2, x, 1, ys, NULL),
                   CI_ERR);
  assert_non_null(strstr(ci_last_error(), "differ"));
  free(x);
  free(y0);
  free(y1);
  free_weight(&a);
  free_weight(&b);
  ci_arena_free(&scratch);
  ci_threadpool_free(pool);
}

/* Fast precision against the double product of the unrounded operands: bf16 products (x and,
 * for quantized prefill, W rounded to bf16: at most 2^-8 relative each) and 16-bit x planes stay
 * within 1e-2 of the sum of |terms|, and they do move the result (fast is not exact), for the row
 * and panel kernels of every ISA and, on AVX-512, with and without the bf16 dot-product and VNNI
 * kernels. */
static void test_fast_matmul_error_bound(void **state) {
  (void)state;
  test_rng rng = {23};
  const ci_dtype dtypes[] = {CI_BF16, CI_Q8, CI_Q4};
  /* CINFER_BF16, INT8, AMX (AMX only where the CPU has it, else the first row again) */
  const char *const toggles[][3] = {
      {"1", "1", "1"}, {"0", "1", "1"}, {"1", "0", "1"}, {"1", "1", "0"}};
  for (int isa = 0; isa < CI_ISA_COUNT; isa++) {
    if (!ci_isa_supported((ci_isa)isa)) continue;
    /* AVX2: with and without its 16-bit row kernels (CINFER_INT8) */
    for (size_t t = 0; t < (isa == CI_ISA_AVX512 ? 4u : isa == CI_ISA_AVX2 ? 3u : 1u); t++) {
      if (isa == CI_ISA_AVX2 && t == 1) continue;
      setenv("CINFER_BF16", toggles[t][0], 1);
      setenv("CINFER_INT8", toggles[t][1], 1);
      setenv("CINFER_AMX", toggles[t][2], 1);
      for (size_t d = 0; d < sizeof dtypes / sizeof *dtypes; d++) {
        const int64_t ks[] = {7, 101, 640};
        for (size_t ki = 0; ki < 3; ki++) {
          const int64_t n = 37, k = ks[ki];
          if (dtypes[d] != CI_BF16 && k % 64) continue;
          test_weight w = make_weight(&rng, dtypes[d], n, k, CI_BF16, 64);
          const int64_t ms[] = {1, 3, 30, 131};
          for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++) {
            const int64_t m = ms[mi];
            float *x = make_x(&rng, m, k);
            double *want = malloc((size_t)(m * n) * sizeof *want);
            double *abs_sum = malloc((size_t)(m * n) * sizeof *abs_sum);
            naive_matmul(&w.t, x, m, want, abs_sum);
            float *y = make_y(m, n), *y_exact = make_y(m, n);
            assert_int_equal(
                ci_cpu_matmul_with(NULL, (ci_isa)isa, CI_PRECISION_FAST, &w.t, x, m, y, 0), CI_OK);
            assert_int_equal(ci_cpu_matmul(NULL, (ci_isa)isa, &w.t, x, m, y_exact), CI_OK);
            check_guard(y, m, n);
            int moved = 0;
            for (int64_t i = 0; i < m * n; i++) {
              if (!(fabs(y[i] - want[i]) <= 1e-2 * abs_sum[i] + 1e-30))
                fail_msg("fast isa=%s bf16=%s int8=%s amx=%s dtype=%s m=%lld k=%lld: y[%lld]=%.9g, "
                         "want %.9g (sum of |terms| %.3g)",
                         ci_isa_name((ci_isa)isa), toggles[t][0], toggles[t][1], toggles[t][2],
                         ci_dtype_get(w.t.dtype)->name, (long long)m, (long long)k, (long long)i,
                         y[i], want[i], abs_sum[i]);
              moved |= y[i] != y_exact[i];
            }
            assert_true(moved);
            free(x);
            free(want);
            free(abs_sum);
            free(y);
            free(y_exact);
          }
          free_weight(&w);
        }
      }
    }
  }
  unsetenv("CINFER_BF16");
  unsetenv("CINFER_INT8");
  unsetenv("CINFER_AMX");
}

/* Fast precision on AVX2: the 16-bit row kernels (integer sums of codes times x16) multiply the
 * same grid of x as the f32 row kernels given x rounded to it (CINFER_INT8=0), so the two agree
 * within f32 rounding (1e-5 of the sum of |terms|; an element exactly between two grid points
 * may round either way), for q8 and q4 with every scale dtype, groups of 32, 64 and 128, rows
 * longer than a chunk of factors, and 1 to 3 x rows; an Inf or NaN in a group gives non-finite
 * outputs. */
static void test_x16_matches_rounded(void **state) {
  (void)state;
  if (!ci_isa_supported(CI_ISA_AVX2)) return;
  test_rng rng = {31};
  const ci_dtype scale_dtypes[] = {CI_F32, CI_F16, CI_BF16};
  const int groups[] = {32, 64, 128};
  for (int q = 0; q < 2; q++)
    for (size_t gi = 0; gi < 3; gi++)
      for (size_t si = 0; si < 3; si++) {
        const int group = groups[gi];
        const int64_t n = 19, k = gi == 0 && si == 0 ? 512 * 32 + 3 * 32 : 5 * group + 256;
        test_weight w = make_weight(&rng, q ? CI_Q4 : CI_Q8, n, k, scale_dtypes[si], group);
        for (int64_t m = 1; m <= 3; m++) {
          float *x = make_x(&rng, m, k);
          double *want = malloc((size_t)(m * n) * sizeof *want);
          double *abs_sum = malloc((size_t)(m * n) * sizeof *abs_sum);
          naive_matmul(&w.t, x, m, want, abs_sum);
          float *y16 = make_y(m, n), *y_rounded = make_y(m, n);
          setenv("CINFER_INT8", "1", 1);
          assert_int_equal(
              ci_cpu_matmul_with(NULL, CI_ISA_AVX2, CI_PRECISION_FAST, &w.t, x, m, y16, 0), CI_OK);
          setenv("CINFER_INT8", "0", 1);
          assert_int_equal(
              ci_cpu_matmul_with(NULL, CI_ISA_AVX2, CI_PRECISION_FAST, &w.t, x, m, y_rounded, 0),
              CI_OK);
          check_guard(y16, m, n);
          int differ = 0; /* exact integer sums against rounded f32 FMAs: the paths did differ */
          for (int64_t i = 0; i < m * n; i++) differ |= y16[i] != y_rounded[i];
          assert_true(differ);
          for (int64_t i = 0; i < m * n; i++)
            if (!(fabs((double)y16[i] - y_rounded[i]) <= 1e-5 * abs_sum[i] + 1e-30))
              fail_msg("x16 %s group %d scales %s m=%lld: y[%lld] = %.9g, rounded-x kernels %.9g "
                       "(sum of |terms| %.3g)",
                       q ? "q4" : "q8", group, ci_dtype_get(scale_dtypes[si])->name, (long long)m,
                       (long long)i, y16[i], y_rounded[i], abs_sum[i]);
          x[(m - 1) * k + k / 2] = m == 2 ? NAN : INFINITY;
          setenv("CINFER_INT8", "1", 1);
          assert_int_equal(
              ci_cpu_matmul_with(NULL, CI_ISA_AVX2, CI_PRECISION_FAST, &w.t, x, m, y16, 0), CI_OK);
          for (int64_t r = 0; r < n; r++) assert_false(isfinite(y16[(m - 1) * n + r]));
          free(x);
          free(want);
          free(abs_sum);
          free(y16);
          free(y_rounded);
        }
        free_weight(&w);
      }
  unsetenv("CINFER_INT8");
}

/* Bad arguments fail with a message instead of computing garbage. */
static void test_matmul_rejects_bad_weights(void **state) {
  (void)state;
  test_rng rng = {3};
  float x[64] = {0}, y[4];
  test_weight w = make_weight(&rng, CI_Q4, 2, 64, CI_F16, 64);
  w.t.group_size = 48;
  assert_int_equal(ci_cpu_matmul(NULL, CI_ISA_REF, &w.t, x, 1, y), CI_ERR);
  assert_non_null(strstr(ci_last_error(), "group size"));
  w.t.group_size = 64;
  w.t.scale_dtype = CI_I32;
  assert_int_equal(ci_cpu_matmul(NULL, CI_ISA_REF, &w.t, x, 1, y), CI_ERR);
  w.t.scale_dtype = CI_F16;
  w.t.dtype = CI_I32;
  assert_int_equal(ci_cpu_matmul(NULL, CI_ISA_REF, &w.t, x, 1, y), CI_ERR);
  assert_non_null(strstr(ci_last_error(), "I32"));
  w.t.dtype = CI_Q4;
  assert_int_equal(ci_cpu_matmul(NULL, CI_ISA_REF, &w.t, x, 0, NULL), CI_OK);
  assert_int_equal(ci_cpu_matmul(NULL, CI_ISA_REF, &w.t, x, 1, y), CI_OK);
  free_weight(&w);
}

/* ISA detection: names, and CINFER_ISA lowers but never raises the choice. */
static void test_isa_detection(void **state) {
  (void)state;
  assert_string_equal(ci_isa_name(CI_ISA_REF), "ref");
  assert_string_equal(ci_isa_name(CI_ISA_AVX2), "avx2");
  assert_string_equal(ci_isa_name(CI_ISA_AVX512), "avx512");
  assert_true(ci_isa_supported(CI_ISA_REF));
  const char *saved = getenv("CINFER_ISA");
  char *saved_copy = saved ? strdup(saved) : NULL;
  unsetenv("CINFER_ISA");
  ci_isa best = ci_cpu_detect_isa();
  assert_true(ci_isa_supported(best));
  for (int isa = 0; isa < CI_ISA_COUNT; isa++)
    assert_int_equal(ci_isa_supported((ci_isa)isa), isa <= (int)best);
  setenv("CINFER_ISA", "ref", 1);
  assert_int_equal(ci_cpu_detect_isa(), CI_ISA_REF);
  setenv("CINFER_ISA", "avx512", 1);
  assert_int_equal(ci_cpu_detect_isa(), best);
  setenv("CINFER_ISA", "nonsense", 1);
  assert_int_equal(ci_cpu_detect_isa(), best);
  if (saved_copy)
    setenv("CINFER_ISA", saved_copy, 1);
  else
    unsetenv("CINFER_ISA");
  free(saved_copy);
}

/* ==== Vector kernel tests ==== */

/* dot_bf16 and axpy_bf16 of every supported ISA agree with the reference. */
static void test_vec_dot_axpy(void **state) {
  (void)state;
  test_rng rng = {11};
  const ci_cpu_vec_kernels *ref = ci_cpu_vec_kernels_get(CI_ISA_REF);
  for (int isa = 0; isa < CI_ISA_COUNT; isa++) {
    if (!ci_isa_supported((ci_isa)isa)) continue;
    const ci_cpu_vec_kernels *vk = ci_cpu_vec_kernels_get((ci_isa)isa);
    for (int64_t n = 0; n <= 140; n += (n < 40 ? 1 : 17)) {
      float *x = make_x(&rng, 1, n + 1), *y_ref = make_x(&rng, 1, n + 1);
      float *y = malloc((size_t)(n + 1) * sizeof *y);
      memcpy(y, y_ref, (size_t)(n + 1) * sizeof *y);
      uint16_t *a = malloc((size_t)(n + 1) * sizeof *a);
      double mag = 0;
      for (int64_t i = 0; i < n; i++) {
        a[i] = ci_f32_to_bf16(rng_uniform(&rng, -3, 3));
        mag += fabs(x[i] * ci_bf16_to_f32(a[i]));
      }
      assert_true(fabs(vk->dot_bf16(x, a, n) - ref->dot_bf16(x, a, n)) <= 1e-5 * mag + 1e-30);
      float alpha = rng_uniform(&rng, -1, 1);
      vk->axpy_bf16(y, alpha, a, n);
      ref->axpy_bf16(y_ref, alpha, a, n);
      for (int64_t i = 0; i < n; i++) {
        double scale = fabs(y_ref[i]) + fabs(alpha * ci_bf16_to_f32(a[i]));
        assert_true(fabs(y[i] - y_ref[i]) <= 1e-6 * scale + 1e-30);
      }
      assert_true(y[n] == y_ref[n]); /* untouched past n */
      free(x);
      free(y);
      free(y_ref);
      free(a);
    }
  }
}

/* f32 with the given bit pattern. */
static float float_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* f32_to_bf16 of every supported ISA is bit-exact with ci_f32_to_bf16: specials, ties, random
 * bit patterns, every tail length. */
static void test_vec_f32_to_bf16(void **state) {
  (void)state;
  test_rng rng = {13};
  static const uint32_t specials[] = {
      0x00000000, 0x80000000, 0x7f800000, 0xff800000, /* zeros, infinities */
      0x7fc00000, 0xffc00000, 0x7f800001, 0xff800001, /* quiet and signalling NaNs */
      0x7fffffff, 0xffffffff, 0x7f80ffff, 0x7fbf0000, /* NaN payloads */
      0x3f808000, 0x3f818000, 0x3f807fff, 0x3f808001, /* ties to even, just below/above */
      0x00008000, 0x00018000, 0x00000001, 0x807fffff, /* denormals */
      0x7f7fffff, 0xff7fffff, 0x7f7f8000, 0x7f7f7fff, /* near overflow: rounds to inf or not */
  };
  enum { COUNT = 1000 };
  float *src = malloc(COUNT * sizeof *src);
  uint16_t *dst = malloc((COUNT + 1) * sizeof *dst);
  size_t n_specials = sizeof specials / sizeof *specials;
  for (size_t i = 0; i < COUNT; i++) {
    uint32_t bits = i < n_specials ? specials[i] : rng_u32(&rng);
    if (i % 5 == 0 && i >= n_specials) bits = (bits & 0xffff0000u) | 0x8000u; /* a tie */
    src[i] = float_from_bits(bits);
  }
  for (int isa = 0; isa < CI_ISA_COUNT; isa++) {
    if (!ci_isa_supported((ci_isa)isa)) continue;
    const ci_cpu_vec_kernels *vk = ci_cpu_vec_kernels_get((ci_isa)isa);
    for (int64_t n = 0; n <= 40; n++) { /* every tail length, offset start */
      dst[n] = 0xabcd;
      vk->f32_to_bf16(dst, src + 3, n);
      for (int64_t i = 0; i < n; i++) assert_int_equal(dst[i], ci_f32_to_bf16(src[3 + i]));
      assert_int_equal(dst[n], 0xabcd);
    }
    vk->f32_to_bf16(dst, src, COUNT);
    for (size_t i = 0; i < COUNT; i++) {
      if (dst[i] != ci_f32_to_bf16(src[i])) {
        uint32_t bits;
        memcpy(&bits, &src[i], sizeof bits);
        print_error("%s: f32 %08x -> %04x, expected %04x\n", ci_isa_name((ci_isa)isa), bits, dst[i],
                    ci_f32_to_bf16(src[i]));
        fail();
      }
    }
  }
  free(src);
  free(dst);
}

/* The gated activations in double precision, as docs/models.md §3 defines them. */
static double silu_exact(double g) {
  return g / (1.0 + exp(-g));
}

/* 0.5 g (1 + tanh(u)) written as g sigmoid(2u), which keeps its digits where 1 + tanh(u)
 * cancels (g < -5 or so) even in double. */
static double gelu_tanh_exact(double g) {
  return g / (1.0 + exp(-2.0 * 0.7978845608028654 * (g + 0.044715 * g * g * g)));
}

/* silu_mul and gelu_tanh_mul of every supported ISA give the reference's bits for every element
 * wherever a call starts and ends (so a split of the rows over threads cannot change them), and
 * the reference stays within a few f32 roundings of the definition, over [-100, 100] and the far
 * tails. */
static void test_vec_gated_activations(void **state) {
  (void)state;
  test_rng rng = {17};
  enum { COUNT = 4099 };
  float *g = malloc(COUNT * sizeof *g), *up = malloc(COUNT * sizeof *up);
  float *want = malloc(COUNT * sizeof *want), *got = malloc((COUNT + 1) * sizeof *got);
  assert_non_null(g);
  assert_non_null(up);
  assert_non_null(want);
  assert_non_null(got);
  static const float specials[] = {0.0f,  -0.0f,  1e-30f, -1e-30f, 1e-7f, 87.0f,  -87.0f,
                                   88.5f, -88.5f, 200.0f, -200.0f, 1e30f, -1e30f, 3.0f};
  const size_t n_specials = sizeof specials / sizeof *specials;
  for (size_t i = 0; i < COUNT; i++) {
    g[i] = i < n_specials ? specials[i]
           : i % 3 == 0   ? rng_uniform(&rng, -100, 100)
                          : rng_uniform(&rng, -8, 8);
    up[i] = rng_uniform(&rng, -2, 2);
  }
  const ci_cpu_vec_kernels *ref = ci_cpu_vec_kernels_get(CI_ISA_REF);
  for (int act = 0; act < 2; act++) {
    memcpy(want, g, COUNT * sizeof *g);
    (act ? ref->gelu_tanh_mul : ref->silu_mul)(want, up, COUNT);
    for (size_t i = 0; i < COUNT; i++) {
      const double exact = (act ? gelu_tanh_exact(g[i]) : silu_exact(g[i])) * up[i];
      /* a few roundings, plus those of GELU's argument, which exp amplifies by its size; tiny
       * results are off by at most |g| / 2^127 (exp's clamp) */
      const double arg = act ? 1.6 * fabs(g[i] + 0.044715 * g[i] * g[i] * g[i]) : 0.0;
      const double tol =
          (6.0 + 4.0 * arg) * 1.2e-7 * fabs(exact) + fabs((double)g[i] * up[i]) * 1e-38 + 1e-37;
      if (!(fabs(want[i] - exact) <= tol)) {
        print_error("%s(%g) * %g = %.9g, expected %.9g\n", act ? "gelu_tanh" : "silu", g[i], up[i],
                    want[i], exact);
        fail();
      }
    }
    for (int isa = 0; isa < CI_ISA_COUNT; isa++) {
      if (!ci_isa_supported((ci_isa)isa)) continue;
      const ci_cpu_vec_kernels *vk = ci_cpu_vec_kernels_get((ci_isa)isa);
      /* pieces of every length up to 40 from varying starts, then the whole array */
      for (int64_t start = 0, n = 0; start < COUNT; start += n, n = (n + 1) % 41) {
        const int64_t len = start + n <= COUNT ? n : COUNT - start;
        memcpy(got + start, g + start, (size_t)len * sizeof *got);
        got[start + len] = -777.0f;
        (act ? vk->gelu_tanh_mul : vk->silu_mul)(got + start, up + start, len);
        assert_true(got[start + len] == -777.0f); /* untouched past n */
      }
      for (size_t i = 0; i < COUNT; i++)
        if (memcmp(&got[i], &want[i], sizeof *got)) {
          print_error("%s %s(%g): %.9g, reference %.9g\n", ci_isa_name((ci_isa)isa),
                      act ? "gelu_tanh" : "silu", g[i], got[i], want[i]);
          fail();
        }
    }
  }
  free(g);
  free(up);
  free(want);
  free(got);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_isa_detection),
      cmocka_unit_test(test_ref_matches_naive),
      cmocka_unit_test(test_simd_matches_ref),
      cmocka_unit_test(test_long_rows),
      cmocka_unit_test(test_int8_planes_within_bound),
      cmocka_unit_test(test_int8_planes_non_finite),
      cmocka_unit_test(test_threaded_matches_single),
      cmocka_unit_test(test_matmul_rows_batch_invariant),
      cmocka_unit_test(test_matmul_multi_matches_single),
      cmocka_unit_test(test_fast_matmul_error_bound),
      cmocka_unit_test(test_x16_matches_rounded),
      cmocka_unit_test(test_panel_rows_independent),
      cmocka_unit_test(test_matmul_rejects_bad_weights),
      cmocka_unit_test(test_vec_dot_axpy),
      cmocka_unit_test(test_vec_f32_to_bf16),
      cmocka_unit_test(test_vec_gated_activations),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
