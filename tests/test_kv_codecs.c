/* KV codecs against theory and against themselves (docs/kv-cache.md §2, §12): TurboQuant MSE per
 * coordinate on Gaussian vectors within 10% of the Lloyd-Max values, norm preservation, the
 * rotation's orthonormality; affine error within half a step; attention over encoded blocks equal
 * to attention over their decoded values on every kernel path, full and sliding; exact bytes per
 * token; bad formats rejected by name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kv_kernels.h"
#include "base/error.h"
#include "kv/cache.h"
#include "tensor/dtype.h"
#include "tensor/kv_format.h"
#include "tensor/turbo_quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Deterministic standard normal samples (Box-Muller over a 64-bit LCG). */
typedef struct {
  uint64_t state;
} rng;

static double uniform(rng *r) {
  r->state = r->state * 6364136223846793005ULL + 1442695040888963407ULL;
  return ((r->state >> 11) + 0.5) / 9007199254740992.0;
}

static float normal(rng *r) {
  return (float)(sqrt(-2.0 * log(uniform(r))) * cos(6.283185307179586 * uniform(r)));
}

static void test_rotation(void **state) {
  (void)state;
  rng r = {7};
  for (int D = 2; D <= 512; D *= 2) {
    float x[512], y[512], signs[512];
    for (int i = 0; i < D; i++) x[i] = y[i] = normal(&r);
    ci_fwht(y, D);
    double n0 = 0, n1 = 0;
    for (int i = 0; i < D; i++) n0 += x[i] * x[i], n1 += y[i] * y[i];
    assert_true(fabs(n0 - n1) <= 1e-5 * n0); /* orthonormal */
    ci_fwht(y, D);
    for (int i = 0; i < D; i++) assert_true(fabsf(y[i] - x[i]) <= 1e-5f); /* self-inverse */
    ci_turbo_signs(5, D, signs);
    int plus = 0;
    for (int i = 0; i < D; i++) {
      assert_true(signs[i] == 1.0f || signs[i] == -1.0f);
      plus += signs[i] > 0;
    }
    if (D >= 128) assert_true(plus > D / 4 && plus < 3 * D / 4);
  }
  /* Different layers get different sign vectors; the same layer the same one. */
  float a[128], b[128], c[128];
  ci_turbo_signs(0, 128, a);
  ci_turbo_signs(1, 128, b);
  ci_turbo_signs(0, 128, c);
  assert_memory_equal(a, c, sizeof a);
  assert_memory_not_equal(a, b, sizeof a);
}

/* TurboQuant per-coordinate MSE / (|x|^2 / D) within 10% of the codebook's N(0,1) MSE, and
 * |decode(x)| = |x| up to the fp16 rounding of ν. */
static void test_turbo_mse(void **state) {
  (void)state;
  const int D = 128, samples = 2000;
  rng r = {11};
  float signs[128], x[128], y[128];
  uint8_t row[512];
  ci_turbo_signs(3, D, signs);
  for (int bits = 2; bits <= 4; bits++) {
    const ci_kv_format f = {CI_KV_TURBO, bits, bits, 0};
    assert_int_equal(ci_kv_row_bytes(&f, D, 0), (size_t)D * bits / 8 + 2);
    double err = 0.0;
    for (int s = 0; s < samples; s++) {
      const float scale = 0.1f + 3.0f * (float)uniform(&r);
      double norm2 = 0.0;
      for (int i = 0; i < D; i++) {
        x[i] = scale * normal(&r);
        norm2 += (double)x[i] * x[i];
      }
      ci_kv_encode_row(&f, 0, signs, x, D, row);
      ci_kv_decode_row(&f, 0, signs, row, D, y);
      double e = 0.0, decoded2 = 0.0;
      for (int i = 0; i < D; i++) {
        e += (double)(x[i] - y[i]) * (x[i] - y[i]);
        decoded2 += (double)y[i] * y[i];
      }
      err += e / norm2;
      assert_true(fabs(sqrt(decoded2) - sqrt(norm2)) <= 2e-3 * sqrt(norm2));
    }
    /* Mean of e/|x|^2 = per-coordinate MSE in units of |x|^2 / D. */
    const double per_coordinate = err / samples;
    const double want = ci_lloyd_max_mse(bits);
    printf("turbo %d-bit: MSE per coordinate %.6f x |x|^2/D (Lloyd-Max %.6f)\n", bits,
           per_coordinate, want);
    assert_true(fabs(per_coordinate - want) <= 0.10 * want);
  }
  /* A zero vector encodes to the middle code and decodes to zero. */
  const ci_kv_format f = {CI_KV_TURBO, 4, 4, 0};
  memset(x, 0, sizeof x);
  ci_kv_encode_row(&f, 0, signs, x, D, row);
  ci_kv_decode_row(&f, 0, signs, row, D, y);
  for (int i = 0; i < D; i++) assert_true(y[i] == 0.0f);
}

/* Affine rows: every element within half a step of its group (one step at the clamped far end,
 * docs/models.md §2), plus the bf16 rounding of the stored scale and bias. */
static void test_affine_error(void **state) {
  (void)state;
  rng r = {5};
  float x[256], y[256];
  uint8_t row[1024];
  for (int bits = 4; bits <= 8; bits += 4)
    for (int group = 32; group <= 128; group *= 2) {
      const ci_kv_format f = {CI_KV_AFFINE, bits, bits, group};
      const int D = 256;
      for (int s = 0; s < 200; s++) {
        const float offset = normal(&r);
        for (int i = 0; i < D; i++) x[i] = offset + normal(&r) * (0.5f + (float)uniform(&r));
        ci_kv_encode_row(&f, 1, NULL, x, D, row);
        ci_kv_decode_row(&f, 1, NULL, row, D, y);
        const uint8_t *scales = row + D * bits / 8, *biases = scales + 2 * (D / group);
        for (int g = 0; g < D / group; g++) {
          uint16_t sh, bh;
          memcpy(&sh, scales + 2 * g, 2);
          memcpy(&bh, biases + 2 * g, 2);
          const float step = fabsf(ci_bf16_to_f32(sh)), bias = ci_bf16_to_f32(bh);
          const float n = (float)((1 << bits) - 1);
          for (int i = g * group; i < (g + 1) * group; i++) {
            const float err = fabsf(x[i] - y[i]);
            /* Inside the code range: half a step (the float arithmetic adds a few ulps). The
             * rule's rescaled step can leave the far edge up to one step beyond code n. */
            const int inside = fabsf(x[i] - bias) / step <= n + 0.5f;
            /* Codes come from the f32 scale and bias, decoding uses their bf16 roundings. */
            const float storage = (n * step + fabsf(bias)) / 256.0f;
            const float bound = (inside ? 0.5f : 1.0f) * step * 1.0001f + storage + 1e-6f;
            if (!(err <= bound))
              fprintf(stderr, "affine %d/%d: err %g step %g inside %d\n", bits, group, err, step,
                      inside);
            assert_true(err <= bound);
          }
        }
      }
    }
}

/* Bytes per token per KV head, docs/kv-cache.md §2.6. */
static void test_bytes_per_token(void **state) {
  (void)state;
  static const struct {
    ci_kv_format f;
    size_t d128, d256, d512;
  } table[] = {
      {{CI_KV_BF16, 0, 0, 0}, 512, 1024, 2048},   {{CI_KV_AFFINE, 8, 8, 64}, 272, 544, 1088},
      {{CI_KV_AFFINE, 4, 4, 64}, 144, 288, 576},  {{CI_KV_AFFINE, 4, 4, 32}, 160, 320, 640},
      {{CI_KV_TURBO, 4, 4, 0}, 132, 260, 516},    {{CI_KV_TURBO, 4, 3, 0}, 116, 228, 452},
      {{CI_KV_TURBO, 3, 3, 0}, 100, 196, 388},    {{CI_KV_TURBO, 2, 2, 0}, 68, 132, 260},
      {{CI_KV_TURBO_V, 8, 3, 32}, 200, 400, 800}, {{CI_KV_TURBO_V, 4, 4, 32}, 152, 304, 608},
  };
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    assert_int_equal(ci_kv_bytes_per_token(&table[i].f, 128), table[i].d128);
    assert_int_equal(ci_kv_bytes_per_token(&table[i].f, 256), table[i].d256);
    assert_int_equal(ci_kv_bytes_per_token(&table[i].f, 512), table[i].d512);
  }
  /* turbo 4-bit is <= 0.30x bf16 for D >= 64 */
  const ci_kv_format t4 = {CI_KV_TURBO, 4, 4, 0}, bf16 = {CI_KV_BF16, 0, 0, 0};
  for (int D = 64; D <= 512; D *= 2)
    assert_true(ci_kv_bytes_per_token(&t4, D) <= 0.30 * ci_kv_bytes_per_token(&bf16, D));
}

static void test_format_errors(void **state) {
  (void)state;
  ci_kv_format f;
  assert_int_equal(ci_kv_format_parse("affine", 3, 0, 64, &f), CI_ERR);
  assert_non_null(strstr(ci_last_error(), "4 or 8"));
  assert_int_equal(ci_kv_format_parse("turbo", 5, 0, 0, &f), CI_ERR);
  assert_int_equal(ci_kv_format_parse("turbo-v", 8, 5, 0, &f), CI_ERR);
  assert_int_equal(ci_kv_format_parse("q4_0", 4, 0, 0, &f), CI_ERR);
  assert_non_null(strstr(ci_last_error(), "unknown KV codec"));
  assert_int_equal(ci_kv_format_parse("affine", 8, 0, 48, &f), CI_ERR);
  assert_int_equal(ci_kv_format_parse("turbo", 4, 3, 0, &f), CI_OK);
  assert_int_equal(ci_kv_format_check(&f, 96), CI_ERR); /* not a power of two */
  assert_non_null(strstr(ci_last_error(), "power of two"));
  assert_int_equal(ci_kv_format_parse("turbo-v", 8, 3, 0, &f), CI_OK);
  assert_int_equal(ci_kv_format_check(&f, 16), CI_ERR); /* groups of 32 */
  char name[32];
  ci_kv_format_name(&f, name, sizeof name);
  assert_string_equal(name, "turbo-v:8,3");
}

/* A one-layer cache whose sequence holds n random positions in `format`, and a twin sequence in
 * f32 holding the decoded values of those rows. */
typedef struct {
  ci_kv_cache *cache, *ref_cache;
  ci_kv_seq *seq, *ref_seq;
} twin;

static void twin_fill(ci_backend *be, twin *t, const ci_kv_format *format, int window, int heads,
                      int D, int n) {
  const ci_kv_layer_desc desc = {window, heads, D, 0};
  t->cache = ci_kv_cache_create(be, 1, &desc, CI_KV_BF16, 16, 0);
  t->ref_cache = ci_kv_cache_create(be, 1, &desc, CI_KV_F32, 16, 0);
  assert_non_null(t->cache);
  assert_non_null(t->ref_cache);
  t->seq = ci_kv_seq_create(t->cache);
  t->ref_seq = ci_kv_seq_create(t->ref_cache);
  assert_int_equal(ci_kv_seq_set_plan(t->seq, format, 0), CI_OK);
  rng r = {(uint64_t)(D * 131 + n)};
  float *k = malloc((size_t)heads * D * sizeof(float)),
        *v = malloc((size_t)heads * D * sizeof(float));
  float *dk = malloc((size_t)heads * D * sizeof(float)),
        *dv = malloc((size_t)heads * D * sizeof(float));
  for (int p = 0; p < n; p++) {
    const int32_t pos = p;
    for (int i = 0; i < heads * D; i++) {
      k[i] = 1.5f * normal(&r) + 0.3f;
      v[i] = normal(&r);
    }
    /* One token per step: the first is stored in bf16 and converted after it (start 0). */
    assert_int_equal(ci_kv_seq_reserve(t->seq, 1), CI_OK);
    ci_paged_kv kv = ci_kv_seq_view(t->seq, 0);
    const int32_t first_row = 0, one_row = 1;
    const ci_step_kv step = {.n_seqs = 1, .first_row = &first_row, .n_rows = &one_row, .kv = &kv};
    assert_int_equal(be->ops->kv_store(be, &step, k, v, &pos), CI_OK);
    assert_int_equal(ci_kv_seq_commit(t->seq, 1), CI_OK);
    kv = ci_kv_seq_view(t->seq, 0);
    assert_true(ci_kv_format_equal(&kv.format, format));
    for (int h = 0; h < heads; h++) {
      ci_kv_decode_row(&kv.format, 0, kv.signs, ci_kv_row_at(&kv, 0, p, h), D, dk + h * D);
      ci_kv_decode_row(&kv.format, 1, kv.signs, ci_kv_row_at(&kv, 1, p, h), D, dv + h * D);
    }
    assert_int_equal(ci_kv_seq_reserve(t->ref_seq, 1), CI_OK);
    ci_paged_kv ref = ci_kv_seq_view(t->ref_seq, 0);
    const ci_step_kv ref_step = {
        .n_seqs = 1, .first_row = &first_row, .n_rows = &one_row, .kv = &ref};
    assert_int_equal(be->ops->kv_store(be, &ref_step, dk, dv, &pos), CI_OK);
    assert_int_equal(ci_kv_seq_commit(t->ref_seq, 1), CI_OK);
  }
  free(k);
  free(v);
  free(dk);
  free(dv);
}

static void twin_free(twin *t) {
  ci_kv_seq_free(t->seq);
  ci_kv_seq_free(t->ref_seq);
  assert_int_equal(ci_kv_cache_blocks_used(t->cache), 0);
  ci_kv_cache_free(t->cache);
  ci_kv_cache_free(t->ref_cache);
}

/* Plain double-precision attention of one query head over the f32 rows of `ref`. */
static void naive_attention(const ci_paged_kv *ref, const float *q, int kv_head, int64_t p,
                            int window, float scale, float *out) {
  const int D = ref->head_dim;
  const int64_t first = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
  double max = -INFINITY, total = 0.0, acc[256] = {0};
  for (int64_t j = first; j <= p; j++) {
    const float *k = (const float *)(const void *)ci_kv_row_at(ref, 0, j, kv_head);
    double s = 0.0;
    for (int i = 0; i < D; i++) s += (double)q[i] * k[i];
    if (s * scale > max) max = s * scale;
  }
  for (int64_t j = first; j <= p; j++) {
    const float *k = (const float *)(const void *)ci_kv_row_at(ref, 0, j, kv_head);
    const float *v = (const float *)(const void *)ci_kv_row_at(ref, 1, j, kv_head);
    double s = 0.0;
    for (int i = 0; i < D; i++) s += (double)q[i] * k[i];
    const double w = exp(s * scale - max);
    total += w;
    for (int i = 0; i < D; i++) acc[i] += w * v[i];
  }
  for (int i = 0; i < D; i++) out[i] = (float)(acc[i] / total);
}

/* Attention over encoded rows == attention over their decoded values (docs/kv-cache.md §12,
 * invariant 3), both equal to a plain double-precision attention; n_keys long enough splits the key
 * range. */
static void check_attention_shape(ci_backend *be, const ci_kv_format *format, int window, int n,
                                  int rows, int q_heads, int D, float tolerance);

static void check_attention_n(ci_backend *be, const ci_kv_format *format, int window, int n,
                              int rows) {
  check_attention_shape(be, format, window, n, rows, 4, 64, 1e-5f);
}

static void check_attention(ci_backend *be, const ci_kv_format *format, int window) {
  check_attention_n(be, format, window, 77, 5);
}

/* q_heads query heads over 2 KV heads of D dims; outputs within tolerance x max(1, max |out|)
 * of the decoded values' attention, and within twice that of the double-precision one. */
static void check_attention_shape(ci_backend *be, const ci_kv_format *format, int window, int n,
                                  int rows, int q_heads, int D, float tolerance) {
  const int heads = 2;
  twin t;
  twin_fill(be, &t, format, window, heads, D, n);
  rng r = {99};
  float *q = malloc((size_t)rows * q_heads * D * sizeof(float));
  float *out = malloc((size_t)rows * q_heads * D * sizeof(float));
  float *ref_out = malloc((size_t)rows * q_heads * D * sizeof(float));
  for (int i = 0; i < rows * q_heads * D; i++) q[i] = normal(&r);
  int32_t pos[5];
  for (int i = 0; i < rows; i++) pos[i] = n - rows + i;
  ci_paged_kv kv = ci_kv_seq_view(t.seq, 0), ref = ci_kv_seq_view(t.ref_seq, 0);
  const int32_t first_row = 0, n_rows = rows;
  const ci_step_kv step = {.n_seqs = 1, .first_row = &first_row, .n_rows = &n_rows, .kv = &kv};
  const ci_step_kv ref_step = {.n_seqs = 1, .first_row = &first_row, .n_rows = &n_rows, .kv = &ref};
  ci_attention_args args = {.q = q,
                            .out = out,
                            .pos = pos,
                            .n_heads = q_heads,
                            .scale = 0.125f,
                            .window = window,
                            .seqs = &step};
  assert_int_equal(be->ops->attention(be, &args), CI_OK);
  args.out = ref_out;
  args.seqs = &ref_step;
  assert_int_equal(be->ops->attention(be, &args), CI_OK);
  float max_diff = 0.0f, max_abs = 0.0f;
  for (int i = 0; i < rows * q_heads * D; i++) {
    max_diff = fmaxf(max_diff, fabsf(out[i] - ref_out[i]));
    max_abs = fmaxf(max_abs, fabsf(ref_out[i]));
  }
  char name[32];
  ci_kv_format_name(format, name, sizeof name);
  if (!(max_diff <= tolerance * fmaxf(1.0f, max_abs)))
    fprintf(stderr, "%s window %d: max diff %g (max |out| %g)\n", name, window, max_diff, max_abs);
  assert_true(max_diff <= tolerance * fmaxf(1.0f, max_abs));
  float naive[256];
  for (int r = 0; r < rows; r++)
    for (int h = 0; h < q_heads; h++) {
      naive_attention(&ref, q + ((int64_t)r * q_heads + h) * D, h / (q_heads / heads), pos[r],
                      window, 0.125f, naive);
      for (int i = 0; i < D; i++)
        assert_true(fabsf(naive[i] - out[((int64_t)r * q_heads + h) * D + i]) <=
                    2 * tolerance * fmaxf(1.0f, max_abs));
    }
  free(q);
  free(out);
  free(ref_out);
  twin_free(&t);
}

/* The fast loops' shapes for one format and head_dim: GQA groups of 1, 2, 3, 4 and 8 over 2 KV
 * heads, without and with a window, then one decode row over 3000 keys (split over the threads). */
static void check_fast_shapes(ci_backend *be, const ci_kv_format *format, int D, float tolerance) {
  static const int q_heads[] = {2, 4, 6, 8, 16};
  for (size_t i = 0; i < sizeof q_heads / sizeof q_heads[0]; i++) {
    check_attention_shape(be, format, 0, 77, 5, q_heads[i], D, tolerance);
    check_attention_shape(be, format, 20, 77, 5, q_heads[i], D, tolerance);
  }
  check_attention_shape(be, format, 0, 3000, 1, 8, D, tolerance);
}

/* Fast precision on affine rows: with AVX512-VNNI the AVX-512 loop multiplies the codes as int16
 * words by q and by the softmax weights times each key's scale, both quantised to int16 (15 bits;
 * the weights' step is 1/32767 of a block's largest, which bounds the outputs' error near 1e-4 of
 * the values' range); without it the loop dequantises each 16-dim chunk in place (f32 rounding
 * only). For 1 to 4 groups a row, GQA groups of 1, 2, 3, 4 and 8, windows, and a key range split
 * over the threads, within 2e-4 of the attention over the decoded values. */
static void test_attention_fast_affine(void **state) {
  (void)state;
  static const ci_kv_format formats[] = {
      {CI_KV_AFFINE, 8, 8, 64}, {CI_KV_AFFINE, 4, 4, 64},  {CI_KV_AFFINE, 8, 8, 32},
      {CI_KV_AFFINE, 4, 4, 32}, {CI_KV_AFFINE, 4, 4, 128},
  };
  ci_backend *be = ci_cpu_backend_create_with(2, CI_PRECISION_FAST);
  assert_non_null(be);
  for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++)
    for (int D = 64; D <= 128; D *= 2)
      if (D % formats[f].group_size == 0) check_fast_shapes(be, &formats[f], D, 2e-4f);
  be->ops->destroy(be);
}

/* Fast precision on TurboQuant rows: with AVX512-VNNI, 4-bit K or V rows multiply their codebook
 * entries as int16 words (K: x 2^19 / head_dim, V: x 2048) by q and by the softmax weights times
 * each row's norm, both int16 (q within 16383); 3- and 2-bit rows and CPUs without VNNI look the
 * codes up in f32. Within 1e-3 of the attention over the decoded values (measured: 8.2e-4 at
 * max |out| 3.4, head_dim 256): K/V bits 4/4, 4/3, 3/4 and 3/3, head_dim 64, 128 and 256, GQA
 * groups of 1, 2, 3, 4 and 8, windows, a split key range. */
static void test_attention_fast_turbo(void **state) {
  (void)state;
  static const ci_kv_format formats[] = {{CI_KV_TURBO, 4, 4, 0},
                                         {CI_KV_TURBO, 4, 3, 0},
                                         {CI_KV_TURBO, 3, 4, 0},
                                         {CI_KV_TURBO, 3, 3, 0}};
  ci_backend *be = ci_cpu_backend_create_with(2, CI_PRECISION_FAST);
  assert_non_null(be);
  for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++)
    for (int D = 64; D <= 256; D *= 2) check_fast_shapes(be, &formats[f], D, 1e-3f);
  be->ops->destroy(be);
}

/* Fast precision on bf16 rows: q and the softmax weights enter the products as bf16 (vdpbf16ps
 * on AVX512-BF16, the AMX tile loop where the CPU has AMX), so the outputs are within bf16
 * rounding of the f32 attention: GQA groups of 1, 2, 3, 4 and 8, head_dim 64 and 128, windows, a
 * key range that starts and ends inside blocks, and one split over the threads. */
static void test_attention_fast_bf16(void **state) {
  (void)state;
  const ci_kv_format bf16 = {CI_KV_BF16, 0, 0, 0};
  ci_backend *be = ci_cpu_backend_create_with(2, CI_PRECISION_FAST);
  assert_non_null(be);
  static const int q_heads[] = {2, 4, 6, 8, 16}; /* G = 1, 2, 3, 4, 8 over 2 KV heads */
  for (int D = 64; D <= 128; D *= 2)
    for (size_t i = 0; i < sizeof q_heads / sizeof q_heads[0]; i++) {
      check_attention_shape(be, &bf16, 0, 77, 5, q_heads[i], D, 1e-2f);
      check_attention_shape(be, &bf16, 20, 77, 5, q_heads[i], D, 1e-2f);
      check_attention_shape(be, &bf16, 0, 3000, 1, q_heads[i], D, 1e-2f);
    }
  be->ops->destroy(be);
}

static void test_attention_on_encoded_blocks(void **state) {
  (void)state;
  static const ci_kv_format formats[] = {
      {CI_KV_BF16, 0, 0, 0},     {CI_KV_AFFINE, 8, 8, 64},  {CI_KV_AFFINE, 4, 4, 32},
      {CI_KV_AFFINE, 8, 8, 32},  {CI_KV_TURBO, 4, 4, 0},    {CI_KV_TURBO, 4, 3, 0},
      {CI_KV_TURBO, 3, 3, 0},    {CI_KV_TURBO, 2, 2, 0},    {CI_KV_TURBO_V, 8, 3, 32},
      {CI_KV_TURBO_V, 4, 4, 32}, {CI_KV_TURBO_V, 4, 2, 32},
  };
  static const ci_isa isas[] = {CI_ISA_REF, CI_ISA_AVX2, CI_ISA_AVX512};
  for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
    if (!ci_isa_supported(isas[i])) continue;
    setenv("CINFER_ISA", ci_isa_name(isas[i]), 1);
    ci_backend *be = ci_cpu_backend_create(2);
    for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++) {
      check_attention(be, &formats[f], 0);
      check_attention(be, &formats[f], 20); /* sliding: released blocks are never read */
    }
    /* One decode row over 3000 keys: the key range is split over the threads and merged. */
    check_attention_n(be, &formats[0], 0, 3000, 1);
    check_attention_n(be, &formats[4], 0, 3000, 1);
    check_attention_n(be, &formats[4], 1500, 3000, 1);
    be->ops->destroy(be);
  }
  unsetenv("CINFER_ISA");
}

/* Pool bytes per token equal bytes_per_token x Hkv x layers once blocks are full. */
/* The attention loop over a range of KV heads gives each head the bits it gets alone (the backend
 * groups heads per task by the thread count and the rows of the step): every codec's kernels on
 * every ISA, both precisions. */
static void test_attend_heads_independent(void **state) {
  (void)state;
  static const ci_kv_format formats[] = {
      {CI_KV_BF16, 0, 0, 0},     {CI_KV_AFFINE, 8, 8, 64}, {CI_KV_AFFINE, 4, 4, 32},
      {CI_KV_TURBO, 4, 3, 0},    {CI_KV_TURBO, 2, 2, 0},   {CI_KV_TURBO_V, 8, 3, 32},
      {CI_KV_TURBO_V, 4, 4, 32},
  };
  static const ci_isa isas[] = {CI_ISA_REF, CI_ISA_AVX2, CI_ISA_AVX512};
  const int heads = 4, G = 2, D = 64, n = 300;
  ci_backend *be = ci_cpu_backend_create(2);
  assert_non_null(be);
  rng r = {7};
  for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++) {
    twin t;
    twin_fill(be, &t, &formats[f], 0, heads, D, n);
    const ci_paged_kv kv = ci_kv_seq_view(t.seq, 0);
    const size_t out_floats = (size_t)heads * G * (D + 2);
    float *q = malloc((size_t)heads * G * D * sizeof(float));
    float *qp = malloc((size_t)heads * G * D * sizeof(float));
    float *all = malloc(out_floats * sizeof(float)), *one = malloc(out_floats * sizeof(float));
    float *scratch = aligned_alloc(
        64,
        ((size_t)ci_kv_attend_scratch_floats(kv.block_tokens, D, heads * G) * sizeof(float) + 63) /
            64 * 64);
    assert_true(q && qp && all && one && scratch);
    for (int i = 0; i < heads * G * D; i++) q[i] = normal(&r);
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
      if (!ci_isa_supported(isas[i])) continue;
      for (int precision = CI_PRECISION_EXACT; precision <= CI_PRECISION_FAST; precision++) {
        const ci_kv_kernels k = ci_cpu_kv_kernels(isas[i], &kv.format, D, (ci_precision)precision);
        for (int g = 0; g < heads * G; g++) k.prepare(&kv, q + g * D, qp + g * D);
        k.attend(&k, &kv, 0, heads, qp, G, 5, n - 10, 0.125f, 0.0f, scratch, all);
        for (int h = 0; h < heads; h++)
          k.attend(&k, &kv, h, 1, qp + (size_t)h * G * D, G, 5, n - 10, 0.125f, 0.0f, scratch,
                   one + (size_t)h * G * (D + 2));
        if (memcmp(all, one, out_floats * sizeof(float)) != 0) {
          char name[32];
          ci_kv_format_name(&kv.format, name, sizeof name);
          fail_msg("%s on %s, precision %d: heads attended together differ from alone", name,
                   ci_isa_name(isas[i]), precision);
        }
      }
    }
    free(q);
    free(qp);
    free(all);
    free(one);
    free(scratch);
    twin_free(&t);
  }
  be->ops->destroy(be);
}

static void test_pool_bytes(void **state) {
  (void)state;
  ci_backend *be = ci_cpu_backend_create(1);
  const ci_kv_format format = {CI_KV_TURBO, 4, 3, 0};
  twin t;
  twin_fill(be, &t, &format, 0, 2, 64, 64); /* 4 full blocks of 16 */
  assert_int_equal(ci_kv_cache_bytes_used(t.cache),
                   (int64_t)64 * 2 * (int64_t)ci_kv_bytes_per_token(&format, 64));
  twin_free(&t);
  be->ops->destroy(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rotation),
      cmocka_unit_test(test_turbo_mse),
      cmocka_unit_test(test_affine_error),
      cmocka_unit_test(test_bytes_per_token),
      cmocka_unit_test(test_format_errors),
      cmocka_unit_test(test_attention_on_encoded_blocks),
      cmocka_unit_test(test_attention_fast_affine),
      cmocka_unit_test(test_attention_fast_bf16),
      cmocka_unit_test(test_attention_fast_turbo),
      cmocka_unit_test(test_attend_heads_independent),
      cmocka_unit_test(test_pool_bytes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
