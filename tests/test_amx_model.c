/* The AMX panel kernels (src/backend/cpu/matmul_amx.c) on any CPU with AVX512-BF16: the kernel
 * source is compiled here against a C model of the tile instructions it uses (palette 1, Intel
 * SDM semantics of TILELOADD, TILESTORED, TILEZERO and TDPBF16PS), so that its data movement —
 * x tiles of padded rows, the weight panels as B tiles, partial output tiles staged through
 * scratch, chains carried through y across 512-column blocks, task row ranges — is checked
 * bit for bit against a plain C product in the model's order, and every tile load and store is
 * a memcpy that AddressSanitizer checks. On a CPU with AMX the real instructions run the same
 * kernels in test_kernels (test_fast_matmul_error_bound, test_panel_rows_independent). Exits 77
 * (skipped) where AVX512-BF16 is missing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vnni,avx2,fma,f16c")
#include <immintrin.h>

/* The kernel's table under another name, so that it cannot stand in for the library's. */
#define ci_matmul_gemm_amx model_matmul_gemm_amx

/* The tile register file of the model: 8 tiles of 16 rows x 64 bytes (the only shape the
 * kernels configure). State of this test's one thread, as the registers are of a core's. */
typedef struct {
  uint8_t bytes[16][64];
} model_tile;
static model_tile model_tiles[8];
static int model_configured;

static void model_loadconfig(const void *config) {
  const uint8_t *c = config;
  uint16_t bytes_per_row[16];
  memcpy(bytes_per_row, c + 16, sizeof bytes_per_row);
  assert_int_equal(c[0], 1); /* palette 1 */
  for (int t = 0; t < 8; t++) {
    assert_int_equal(c[48 + t], 16);
    assert_int_equal(bytes_per_row[t], 64);
  }
  model_configured = 1;
}

static void model_release(void) {
  model_configured = 0;
}

static void model_loadd(int t, const void *base, long stride) {
  assert_true(model_configured);
  for (int r = 0; r < 16; r++) memcpy(model_tiles[t].bytes[r], (const char *)base + r * stride, 64);
}

static void model_stored(int t, void *base, long stride) {
  assert_true(model_configured);
  for (int r = 0; r < 16; r++) memcpy((char *)base + r * stride, model_tiles[t].bytes[r], 64);
}

static void model_zero(int t) {
  assert_true(model_configured);
  memset(&model_tiles[t], 0, sizeof model_tiles[t]);
}

static float bf16_value(uint16_t h) {
  const uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* c[m][n] += a[m][2k] b[k][2n] + a[m][2k+1] b[k][2n+1], k ascending, even product first. */
static void model_dpbf16ps(int c, int a, int b) {
  assert_true(model_configured);
  for (int m = 0; m < 16; m++) {
    float acc[16];
    memcpy(acc, model_tiles[c].bytes[m], sizeof acc);
    uint16_t arow[32];
    memcpy(arow, model_tiles[a].bytes[m], sizeof arow);
    for (int k = 0; k < 16; k++) {
      uint16_t brow[32];
      memcpy(brow, model_tiles[b].bytes[k], sizeof brow);
      for (int n = 0; n < 16; n++) {
        acc[n] += bf16_value(arow[2 * k]) * bf16_value(brow[2 * n]);
        acc[n] += bf16_value(arow[2 * k + 1]) * bf16_value(brow[2 * n + 1]);
      }
    }
    memcpy(model_tiles[c].bytes[m], acc, sizeof acc);
  }
}

#undef _tile_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbf16ps
#define _tile_loadconfig(config) model_loadconfig(config)
#define _tile_release() model_release()
#define _tile_loadd(t, base, stride) model_loadd(t, base, (long)(stride))
#define _tile_stored(t, base, stride) model_stored(t, base, (long)(stride))
#define _tile_zero(t) model_zero(t)
#define _tile_dpbf16ps(c, a, b) model_dpbf16ps(c, a, b)

#include "../src/backend/cpu/matmul_amx.c"
#pragma GCC pop_options

#include "backend/cpu/kernels_impl.h"

/* xorshift64 */
typedef struct {
  uint64_t s;
} test_rng;

static uint64_t next_u64(test_rng *r) {
  r->s ^= r->s << 13;
  r->s ^= r->s >> 7;
  r->s ^= r->s << 17;
  return r->s;
}

/* A bf16 of modest magnitude (about +-2). */
static uint16_t random_bf16(test_rng *r) {
  const float f = (float)((double)(next_u64(r) % 20001) / 5000.0 - 2.0);
  return ci_f32_to_bf16(f);
}

/* Round to nearest even, as vcvtneps2bf16 (finite values). */
static float round_bf16(float f) {
  return bf16_value(ci_f32_to_bf16(f));
}

/* The weight of one test: bf16 elements, or affine codes with bf16 scales and biases. */
typedef struct {
  ci_weight_format format;
  int64_t n, k;
  int group;
  void *w;
  uint16_t *scales, *biases;
} test_weight;

static test_weight make_weight(test_rng *r, ci_weight_format format, int64_t n, int64_t k) {
  test_weight t = {.format = format, .n = n, .k = k, .group = 64};
  if (format == CI_WF_BF16) {
    uint16_t *w = malloc((size_t)(n * k) * sizeof *w);
    for (int64_t i = 0; i < n * k; i++) w[i] = random_bf16(r);
    t.w = w;
    return t;
  }
  const int bits = format == CI_WF_Q8_BF16 ? 8 : 4;
  uint8_t *codes = malloc((size_t)(n * k * bits / 8));
  for (int64_t i = 0; i < n * k * bits / 8; i++) codes[i] = (uint8_t)next_u64(r);
  t.w = codes;
  const int64_t groups = n * k / t.group;
  t.scales = malloc((size_t)groups * sizeof *t.scales);
  t.biases = malloc((size_t)groups * sizeof *t.biases);
  for (int64_t g = 0; g < groups; g++) {
    t.scales[g] = ci_f32_to_bf16(bf16_value(random_bf16(r)) / 64.0f);
    t.biases[g] = random_bf16(r);
  }
  return t;
}

static void free_weight(test_weight *t) {
  free(t->w);
  free(t->scales);
  free(t->biases);
}

/* W[row, c] as the kernels' panels hold it: bf16, or the affine value s q + b (one FMA in f32,
 * as decode_16x16) rounded to bf16. */
static float weight_value(const test_weight *t, int64_t row, int64_t c) {
  if (t->format == CI_WF_BF16) return bf16_value(((const uint16_t *)t->w)[row * t->k + c]);
  const uint8_t *codes = t->w;
  const int64_t g = row * (t->k / t->group) + c / t->group;
  float q;
  if (t->format == CI_WF_Q8_BF16)
    q = codes[row * t->k + c];
  else
    q = (float)((codes[row * t->k / 2 + c / 2] >> (4 * (c % 2))) & 15);
  return round_bf16(fmaf(q, bf16_value(t->scales[g]), bf16_value(t->biases[g])));
}

/* One check: every task chunk of 64 rows (and a partial last one) of an m x n x k product,
 * bit-identical to the model-order sum, and nothing written outside [0, m) x [0, n). */
static void check_product(test_rng *r, ci_weight_format format, int64_t m, int64_t n, int64_t k) {
  test_weight t = make_weight(r, format, n, k);
  const int64_t padded = (m + 15) / 16 * 16;
  uint16_t *x = calloc((size_t)(padded * k), sizeof *x);
  for (int64_t i = 0; i < m * k; i++) x[i] = random_bf16(r);
  enum { GUARD = 64 };
  float *y = malloc((size_t)(m * n + GUARD) * sizeof *y);
  for (int64_t i = 0; i < m * n + GUARD; i++) y[i] = -7.0f;
  float *scratch = aligned_alloc(64, CI_AMX_GEMM_SCRATCH_FLOATS * sizeof(float));
  const ci_matmul_job job = {
      .format = format,
      .n = n,
      .k = k,
      .w = t.w,
      .scales = t.scales,
      .biases = t.biases,
      .group = t.group,
      .m = m,
      .x_bf16 = x,
      .y = y,
  };
  const ci_matmul_rows_fn fn = model_matmul_gemm_amx[format];
  assert_non_null(fn);
  for (int64_t row = 0; row < n; row += 64) fn(&job, row, row + 64 < n ? row + 64 : n, scratch);
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      float want = 0.0f;
      for (int64_t c = 0; c < k; c += 2) {
        want += bf16_value(x[i * k + c]) * weight_value(&t, j, c);
        want += bf16_value(x[i * k + c + 1]) * weight_value(&t, j, c + 1);
      }
      if (y[i * n + j] != want)
        fail_msg("format %d m=%lld n=%lld k=%lld: y[%lld][%lld] = %.9g, want %.9g", (int)format,
                 (long long)m, (long long)n, (long long)k, (long long)i, (long long)j, y[i * n + j],
                 want);
    }
  for (int i = 0; i < GUARD; i++) assert_true(y[m * n + i] == -7.0f);
  /* one task's rows alone: the other columns stay as they were */
  if (n > 64) {
    for (int64_t i = 0; i < m * n; i++) y[i] = -7.0f;
    const int64_t end = n < 128 ? n : 128;
    fn(&job, 64, end, scratch);
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++)
        if (j < 64 || j >= end) assert_true(y[i * n + j] == -7.0f);
  }
  free(scratch);
  free(y);
  free(x);
  free_weight(&t);
}

static void test_amx_kernels_match_model_order(void **state) {
  (void)state;
  test_rng r = {0x9e3779b97f4a7c15ull};
  const ci_weight_format formats[] = {CI_WF_BF16, CI_WF_Q8_BF16, CI_WF_Q4_BF16};
  /* m: one tile, one row past a tile pair, uneven tiles; n: partial tiles and panels; k: one
   * step, a chain across two 512-column blocks */
  const int64_t shapes[][3] = {{1, 5, 64},    {16, 32, 64},    {17, 37, 576},
                               {33, 64, 128}, {50, 130, 1088}, {32, 75, 512}};
  for (size_t f = 0; f < sizeof formats / sizeof *formats; f++)
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
      check_product(&r, formats[f], shapes[s][0], shapes[s][1], shapes[s][2]);
}

int main(void) {
  if (!ci_isa_supported(CI_ISA_AVX512) || !ci_cpu_bf16_dot_enabled()) {
    printf("test_amx_model: skipped (no AVX512-BF16 on this CPU)\n");
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_amx_kernels_match_model_order),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
