/* Tests for the MLX affine quantize rule and packing: hand-computed golden groups, error-bound
 * and edge-exactness properties on random groups, and pack/unpack round trips for every b. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "base/error.h"
#include "tensor/affine_quant.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const int all_bits[] = {2, 3, 4, 5, 6, 8};
enum { N_BITS = sizeof(all_bits) / sizeof(all_bits[0]) };

/* xorshift64*: deterministic test data without global state. */
static uint64_t rng_next(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}

static float rng_uniform(uint64_t *s, float a, float b) {
  return a + (b - a) * (float)((rng_next(s) >> 40) * (1.0 / 16777216.0));
}

typedef struct {
  float w[4];
  int bits;
  uint8_t codes[4];
  float scale, bias;
} golden_group;

/* Each case worked through the rule by hand (and cross-checked with numpy float32):
 *  {0,1,2,3} b2: n=3, s=1, |lo|<=|hi| -> edge=3, s=-1, q0=-3, s=3/-3=-1, bias=3,
 *                codes=rint((w-3)/-1) = 3,2,1,0.
 *  {-4,0,1,2} b2: s=6/3=2, edge=lo=-4, q0=-2, s=2, bias=-4; (1+4)/2=2.5 rounds to even 2.
 *  {-1,.5,.25,.75} b2: s0=1.75/3, edge=-1, q0=rint(-1.714)=-2, s=0.5, bias=-1;
 *                codes 0, 3, rint(2.5)=2, rint(3.5)=4 clamped to 3.
 *  {0,0,0,0} b2: s=max(0,1e-7) -> edge=hi=0, s=-1e-7, q0=0 -> bias 0, codes 0.
 *  {-.5,.25,1,0} b4: s0=1.5/15=0.1f, edge=hi=1, s=-0.1f, q0=-10, s=-0.1f, bias=1;
 *                codes rint(15.0)=15, rint(7.5)=8, 0, rint(10.0)=10.
 *  {-10,-9.5,-9,-9.25} b2 (all negative): s0=1/3, edge=-10, q0=-30, s=1/3 (f32), bias=-10;
 *                codes 0, rint(1.5)=2, rint(3)=3, rint(2.25)=2.
 *  {0,1,2,255} b8: s=-1, bias=255, codes 255,254,253,0.
 *  {1e-8,-2e-8,0,3e-8} b4: s=1e-7 floor, edge=3e-8, q0=rint(-0.3)=0 -> bias 0, codes all 0.
 *  {-1,.99,0,.5} b2: s0=1.99/3, edge=-1, q0=rint(-1.51)=-2, s=0.5, bias=-1; .99 -> rint(3.98)=4
 *                clamped to 3: the error 0.49 exceeds |s|/2 (q0 rounded away from 0).
 *  {5,5,5,5} b4: edge=5, s=-1e-7, q0=rint(-5e7)!=0, s=5/q0, bias=5, codes 0. */
static const golden_group goldens[] = {
    {{0, 1, 2, 3}, 2, {3, 2, 1, 0}, -1.0f, 3.0f},
    {{-4, 0, 1, 2}, 2, {0, 2, 2, 3}, 2.0f, -4.0f},
    {{-1, 0.5f, 0.25f, 0.75f}, 2, {0, 3, 2, 3}, 0.5f, -1.0f},
    {{0, 0, 0, 0}, 2, {0, 0, 0, 0}, -1e-7f, 0.0f},
    {{-0.5f, 0.25f, 1.0f, 0.0f}, 4, {15, 8, 0, 10}, -0.1f, 1.0f},
    {{-10, -9.5f, -9, -9.25f}, 2, {0, 2, 3, 2}, 1.0f / 3.0f, -10.0f},
    {{0, 1, 2, 255}, 8, {255, 254, 253, 0}, -1.0f, 255.0f},
    {{1e-8f, -2e-8f, 0, 3e-8f}, 4, {0, 0, 0, 0}, -1e-7f, 0.0f},
    {{-1, 0.99f, 0, 0.5f}, 2, {0, 3, 2, 3}, 0.5f, -1.0f},
    {{5, 5, 5, 5}, 4, {0, 0, 0, 0}, 5.0f / -5e7f, 5.0f},
};

static void test_golden_groups(void **state) {
  (void)state;
  for (size_t k = 0; k < sizeof(goldens) / sizeof(goldens[0]); k++) {
    const golden_group *gg = &goldens[k];
    uint8_t codes[4];
    float s, b;
    ci_affine_quantize_group(gg->w, 4, gg->bits, codes, &s, &b);
    assert_memory_equal(codes, gg->codes, 4);
    assert_true(s == gg->scale);
    assert_true(b == gg->bias);
    uint16_t sb, bb;
    uint8_t codes2[4];
    ci_affine_quantize_group_bf16(gg->w, 4, gg->bits, codes2, &sb, &bb);
    assert_memory_equal(codes2, gg->codes, 4);
    assert_int_equal(sb, ci_f32_to_bf16(gg->scale));
    assert_int_equal(bb, ci_f32_to_bf16(gg->bias));
  }
}

/* Checks the rule's guarantees on one group: codes in range, the larger-magnitude edge exact
 * (q0 != 0), error <= |s|/2 inside the range the codes span and <= |s| outside it (the far end
 * can fall outside when rint(edge/s) rounded away from zero), and <= |s|/2 everywhere when the
 * group has a single sign. */
static void check_group(const float *w, int g, int bits) {
  uint8_t codes[256];
  float deq[256];
  float s, b;
  ci_affine_quantize_group(w, g, bits, codes, &s, &b);
  const int n = (1 << bits) - 1;
  float lo = w[0], hi = w[0];
  for (int i = 0; i < g; i++) {
    assert_true(codes[i] <= n);
    lo = fminf(lo, w[i]);
    hi = fmaxf(hi, w[i]);
  }
  ci_affine_dequantize(codes, (size_t)g, s, b, deq);
  const float edge = fabsf(lo) > fabsf(hi) ? lo : hi;
  if (b != 0.0f) {
    assert_true(b == edge);
    for (int i = 0; i < g; i++) {
      if (w[i] == edge) assert_true(deq[i] == edge);
    }
  }
  const float as = fabsf(s);
  const float far = b + (float)n * s;
  const float cov_lo = fminf(b, far), cov_hi = fmaxf(b, far);
  const float eps = 8 * FLT_EPSILON * (fabsf(b) + (float)n * as) + 1e-30f;
  const int one_sign = lo >= 0 || hi <= 0;
  for (int i = 0; i < g; i++) {
    const float err = fabsf(deq[i] - w[i]);
    if (one_sign || (w[i] >= cov_lo && w[i] <= cov_hi)) {
      assert_true(err <= 0.5f * as + eps);
    } else {
      assert_true(err <= as + eps);
    }
  }
}

static void test_random_groups(void **state) {
  (void)state;
  uint64_t rng = 0x9e3779b97f4a7c15ull;
  static const int sizes[] = {32, 64, 128};
  float w[128];
  for (int bi = 0; bi < N_BITS; bi++) {
    for (int si = 0; si < 3; si++) {
      for (int trial = 0; trial < 300; trial++) {
        const int g = sizes[si];
        const int kind = trial % 5;
        for (int i = 0; i < g; i++) {
          switch (kind) {
          case 0:
            w[i] = rng_uniform(&rng, -1, 1);
            break;
          case 1:
            w[i] = rng_uniform(&rng, 0.5f, 3);
            break; /* all positive */
          case 2:
            w[i] = rng_uniform(&rng, -7, -2);
            break; /* all negative */
          case 3:
            w[i] = rng_uniform(&rng, -4, 0.3f);
            break; /* negative-dominant */
          default:
            w[i] = rng_uniform(&rng, -1e-3f, 5e-2f);
            break; /* small, positive-heavy */
          }
        }
        check_group(w, g, all_bits[bi]);
      }
    }
  }
}

static void test_special_groups(void **state) {
  (void)state;
  float w[64];
  uint8_t codes[64];
  float s, b;
  for (int bi = 0; bi < N_BITS; bi++) {
    const int bits = all_bits[bi];
    /* all zero: scale -1e-7 (the floor, sign flipped), bias 0, codes 0 */
    memset(w, 0, sizeof(w));
    ci_affine_quantize_group(w, 64, bits, codes, &s, &b);
    assert_true(s == -1e-7f && b == 0.0f);
    for (int i = 0; i < 64; i++) assert_int_equal(codes[i], 0);
    /* constants: reproduced exactly through the bias */
    static const float consts[] = {1.0f, -2.5f, 1e-3f, -65504.0f, 0.1f};
    for (int k = 0; k < 5; k++) {
      for (int i = 0; i < 64; i++) w[i] = consts[k];
      ci_affine_quantize_group(w, 64, bits, codes, &s, &b);
      assert_true(b == consts[k]);
      for (int i = 0; i < 64; i++) {
        assert_int_equal(codes[i], 0);
        assert_true(s * (float)codes[i] + b == consts[k]);
      }
    }
    /* negative-dominant: the minimum is the edge, the scale is positive */
    for (int i = 0; i < 64; i++) w[i] = (float)(i % 7) * 0.1f - 2.0f;
    ci_affine_quantize_group(w, 64, bits, codes, &s, &b);
    assert_true(b == -2.0f);
    assert_true(s > 0.0f);
    check_group(w, 64, bits);
    /* positive-dominant: the maximum is the edge, the scale is negative */
    for (int i = 0; i < 64; i++) w[i] = 2.0f - (float)(i % 7) * 0.1f;
    ci_affine_quantize_group(w, 64, bits, codes, &s, &b);
    assert_true(b == 2.0f);
    assert_true(s < 0.0f);
    check_group(w, 64, bits);
    /* ties |lo| == |hi| pick hi */
    for (int i = 0; i < 64; i++) w[i] = (i & 1) ? 1.0f : -1.0f;
    ci_affine_quantize_group(w, 64, bits, codes, &s, &b);
    assert_true(b == 1.0f && s < 0.0f);
  }
  /* NaN does not crash and keeps codes in range */
  for (int i = 0; i < 64; i++) w[i] = (float)i;
  w[5] = NAN;
  ci_affine_quantize_group(w, 64, 4, codes, &s, &b);
  for (int i = 0; i < 64; i++) assert_true(codes[i] <= 15);
}

/* The reference of ci_affine_code: the rule's clamp(rint(x), 0, n) with libm's nearbyintf. */
static uint8_t code_ref(float x, float n) {
  float q = nearbyintf(x);
  if (!(q >= 0.0f)) q = 0.0f;
  if (q > n) q = n;
  return (uint8_t)q;
}

static void test_code_matches_nearbyintf(void **state) {
  (void)state;
  uint64_t rng = 99;
  for (int bi = 0; bi < N_BITS; bi++) {
    const float n = (float)((1 << all_bits[bi]) - 1);
    for (int k = -4; k <= 300; k++) { /* integers, exact ties and their float neighbours */
      const float xs[] = {(float)k,
                          (float)k + 0.5f,
                          nextafterf((float)k + 0.5f, -1e9f),
                          nextafterf((float)k + 0.5f, 1e9f),
                          (float)k + 0.25f,
                          (float)k - 0.75f};
      for (size_t j = 0; j < sizeof(xs) / sizeof(xs[0]); j++) {
        assert_int_equal(ci_affine_code(xs[j], n), code_ref(xs[j], n));
      }
    }
    for (int t = 0; t < 200000; t++) {
      const float x = rng_uniform(&rng, -2.0f, n + 2.0f) * ((t % 7 == 0) ? 1e4f : 1.0f);
      assert_int_equal(ci_affine_code(x, n), code_ref(x, n));
    }
    const float specials[] = {INFINITY, -INFINITY, NAN,    -0.0f, 0.0f, 1e-45f,
                              -1e-45f,  1e30f,     -1e30f, -0.5f, 0.5f, n + 0.5f,
                              n - 0.5f, n + 1.0f,  -1.0f,  -1.5f};
    for (size_t j = 0; j < sizeof(specials) / sizeof(specials[0]); j++) {
      assert_int_equal(ci_affine_code(specials[j], n), code_ref(specials[j], n));
    }
  }
}

static void test_pack_known_words(void **state) {
  (void)state;
  uint32_t words[4];
  const uint8_t c4[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  ci_affine_pack(c4, 8, 4, words);
  assert_int_equal(words[0], 0x87654321u);
  const uint8_t c8[4] = {0x11, 0x22, 0x33, 0x44};
  ci_affine_pack(c8, 4, 8, words);
  assert_int_equal(words[0], 0x44332211u);
  const uint8_t c3[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  ci_affine_pack(c3, 8, 3, words);
  assert_int_equal(words[0], 0x00fac688u);
  /* b=5: code 6 straddles the first word (bits 30..34) */
  const uint8_t c5[7] = {31, 1, 2, 3, 4, 5, 6};
  ci_affine_pack(c5, 7, 5, words);
  assert_int_equal(words[0], 0x8a41883fu);
  assert_int_equal(words[1], 0x1u);
  const uint8_t c2[16] = {3, 0, 1, 2, 3, 3, 3, 3, 0, 0, 0, 0, 1, 1, 1, 1};
  ci_affine_pack(c2, 16, 2, words);
  assert_int_equal(words[0], 0x5500ff93u);
}

static void test_pack_roundtrip(void **state) {
  (void)state;
  uint64_t rng = 12345;
  enum { MAXN = 1000 };
  uint8_t codes[MAXN], back[MAXN];
  uint32_t words[MAXN / 4 + 2];
  static const size_t lens[] = {1, 7, 31, 32, 33, 64, 96, 100, 999, 1000};
  for (int bi = 0; bi < N_BITS; bi++) {
    const int bits = all_bits[bi];
    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
      const size_t n = lens[li];
      for (size_t i = 0; i < n; i++) codes[i] = (uint8_t)(rng_next(&rng) & ((1u << bits) - 1));
      const size_t nw = ci_affine_packed_words(n, bits);
      assert_int_equal(nw, (n * (size_t)bits + 31) / 32);
      memset(words, 0xa5, sizeof(words));
      ci_affine_pack(codes, n, bits, words);
      assert_int_equal(words[nw], 0xa5a5a5a5u); /* wrote exactly nw words */
      /* the stream rule, bit by bit */
      for (size_t i = 0; i < n; i++) {
        for (int k = 0; k < bits; k++) {
          const size_t bit = i * (size_t)bits + (size_t)k;
          assert_int_equal((words[bit / 32] >> (bit % 32)) & 1u, (codes[i] >> k) & 1u);
        }
      }
      if ((n * (size_t)bits) % 32) { /* padding bits are zero */
        assert_int_equal(words[nw - 1] >> ((n * (size_t)bits) % 32), 0);
      }
      ci_affine_unpack(words, n, bits, back);
      assert_memory_equal(codes, back, n);
    }
  }
}

static void test_matrix(void **state) {
  (void)state;
  uint64_t rng = 777;
  enum { ROWS = 5, COLS = 256 };
  static const int groups[] = {32, 64, 128};
  static const ci_dtype sdts[] = {CI_BF16, CI_F16, CI_F32};
  float *w = malloc(sizeof(float) * ROWS * COLS);
  uint16_t *wbf = malloc(sizeof(uint16_t) * ROWS * COLS);
  uint32_t *codes = malloc(sizeof(uint32_t) * ROWS * COLS);
  float *scales = malloc(sizeof(float) * ROWS * COLS);
  float *biases = malloc(sizeof(float) * ROWS * COLS);
  float row[COLS];
  uint8_t gc[COLS], rc[COLS];
  assert_non_null(w);
  for (int i = 0; i < ROWS * COLS; i++) {
    w[i] = rng_uniform(&rng, -0.2f, 0.3f);
    wbf[i] = ci_f32_to_bf16(w[i]);
  }
  for (int bi = 0; bi < N_BITS; bi++) {
    for (int gi = 0; gi < 3; gi++) {
      for (int di = 0; di < 3; di++) {
        const int bits = all_bits[bi], g = groups[gi];
        const ci_dtype sd = sdts[di];
        const int from_bf16 = (bi + gi + di) & 1;
        const size_t words = (size_t)COLS * (size_t)bits / 32;
        assert_int_equal(ci_affine_quantize_matrix(from_bf16 ? (const void *)wbf : w,
                                                   from_bf16 ? CI_BF16 : CI_F32, ROWS, COLS, bits,
                                                   g, codes, sd, scales, biases),
                         CI_OK);
        for (int r = 0; r < ROWS; r++) {
          const size_t ng = COLS / (size_t)g;
          const size_t esz = sd == CI_F32 ? 4 : 2;
          const uint8_t *srow = (const uint8_t *)scales + (size_t)r * ng * esz;
          const uint8_t *brow = (const uint8_t *)biases + (size_t)r * ng * esz;
          ci_affine_unpack(codes + (size_t)r * words, COLS, bits, rc);
          for (size_t k = 0; k < ng; k++) {
            float src[128], s, b;
            for (int i = 0; i < g; i++) {
              const size_t idx = (size_t)r * COLS + k * (size_t)g + (size_t)i;
              src[i] = from_bf16 ? ci_bf16_to_f32(wbf[idx]) : w[idx];
            }
            ci_affine_quantize_group(src, g, bits, gc, &s, &b);
            assert_memory_equal(gc, rc + k * (size_t)g, (size_t)g);
            float ss = ci_float_at(sd, srow, k), bb = ci_float_at(sd, brow, k);
            if (sd == CI_F32) {
              assert_true(ss == s && bb == b);
            } else if (sd == CI_BF16) {
              assert_true(ss == ci_bf16_to_f32(ci_f32_to_bf16(s)));
              assert_true(bb == ci_bf16_to_f32(ci_f32_to_bf16(b)));
            } else {
              assert_true(ss == ci_f16_to_f32(ci_f32_to_f16(s)));
            }
          }
          assert_int_equal(ci_affine_dequantize_row(codes + (size_t)r * words, srow, brow, sd, COLS,
                                                    bits, g, row),
                           CI_OK);
          for (int c = 0; c < COLS; c++) {
            const float ss = ci_float_at(sd, srow, (size_t)(c / g));
            const float bb = ci_float_at(sd, brow, (size_t)(c / g));
            assert_true(row[c] == ss * (float)rc[c] + bb);
            /* stored-dtype rounding adds at most a few bf16 ulps of the range */
            const float x = from_bf16 ? ci_bf16_to_f32(wbf[r * COLS + c]) : w[r * COLS + c];
            assert_true(fabsf(row[c] - x) <= fabsf(ss) + 0.02f);
          }
        }
      }
    }
  }
  free(w);
  free(wbf);
  free(codes);
  free(scales);
  free(biases);
}

static void test_matrix_errors(void **state) {
  (void)state;
  float w[96] = {0};
  uint32_t codes[96];
  uint16_t s[8], b[8];
  assert_int_equal(ci_affine_quantize_matrix(w, CI_F32, 1, 96, 4, 64, codes, CI_BF16, s, b),
                   CI_ERR);
  assert_non_null(strstr(ci_last_error(), "group size"));
  assert_int_equal(ci_affine_quantize_matrix(w, CI_F32, 1, 64, 7, 64, codes, CI_BF16, s, b),
                   CI_ERR);
  assert_non_null(strstr(ci_last_error(), "bits"));
  assert_int_equal(ci_affine_quantize_matrix(w, CI_F32, 1, 4, 2, 4, codes, CI_BF16, s, b),
                   CI_ERR); /* 4 x 2 bits is not a whole u32 */
  assert_int_equal(ci_affine_quantize_matrix(w, CI_U32, 1, 64, 4, 64, codes, CI_BF16, s, b),
                   CI_ERR);
  assert_int_equal(ci_affine_quantize_matrix(w, CI_F32, 1, 64, 4, 64, codes, CI_I32, s, b), CI_ERR);
  assert_int_equal(ci_affine_quantize_matrix(w, CI_F32, 0, 64, 4, 64, codes, CI_BF16, s, b), CI_OK);
  assert_true(ci_affine_bits_ok(3) && !ci_affine_bits_ok(7) && !ci_affine_bits_ok(1));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_golden_groups),    cmocka_unit_test(test_random_groups),
      cmocka_unit_test(test_special_groups),   cmocka_unit_test(test_code_matches_nearbyintf),
      cmocka_unit_test(test_pack_known_words), cmocka_unit_test(test_pack_roundtrip),
      cmocka_unit_test(test_matrix),           cmocka_unit_test(test_matrix_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
