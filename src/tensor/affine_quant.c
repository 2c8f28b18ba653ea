/* MLX affine quantization: the per-group rule of docs/models.md §2 in f32, LSB-first u32 packing,
 * and the whole-matrix quantizer (codes + scales + biases). */
#include "tensor/affine_quant.h"

#include "base/error.h"

#include <math.h>
#include <stdlib.h>

uint8_t ci_affine_code(float x, float n) {
  /* clamp(rint(x), 0, n) == clamp(rint(clamp(x, -1, n + 1)), 0, n), and on [-1, 257] adding and
   * subtracting 1.5 * 2^23 rounds to an integer half-to-even exactly like nearbyintf in the
   * default rounding mode (the sum lies in [2^23, 2^24), where the f32 spacing is 1, and the
   * constant is even), without a libm call. NaN goes to -1, hence code 0. */
  if (!(x >= -1.0f)) x = -1.0f;
  if (x > n + 1.0f) x = n + 1.0f;
  const float magic = 12582912.0f;
  float q = (x + magic) - magic;
  if (q < 0.0f) q = 0.0f;
  if (q > n) q = n;
  return (uint8_t)q;
}

int ci_affine_bits_ok(int bits) {
  return bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
}

void ci_affine_quantize_group(const float *w, int g, int bits, uint8_t *codes, float *scale,
                              float *bias) {
  const float n = (float)((1 << bits) - 1);
  float lo = w[0], hi = w[0];
  for (int i = 1; i < g; i++) {
    if (w[i] < lo) lo = w[i];
    if (w[i] > hi) hi = w[i];
  }
  float s = (hi - lo) / n;
  if (s < 1e-7f) s = 1e-7f;
  float edge;
  if (fabsf(lo) > fabsf(hi)) {
    edge = lo;
  } else {
    edge = hi;
    s = -s;
  }
  const float q0 = nearbyintf(edge / s);
  float b = 0.0f;
  if (q0 != 0.0f) {
    s = edge / q0;
    b = edge;
  }
  for (int i = 0; i < g; i++) codes[i] = ci_affine_code((w[i] - b) / s, n);
  *scale = s;
  *bias = b;
}

void ci_affine_quantize_group_bf16(const float *w, int g, int bits, uint8_t *codes, uint16_t *scale,
                                   uint16_t *bias) {
  float s, b;
  ci_affine_quantize_group(w, g, bits, codes, &s, &b);
  *scale = ci_f32_to_bf16(s);
  *bias = ci_f32_to_bf16(b);
}

size_t ci_affine_packed_words(size_t n, int bits) {
  return (n * (size_t)bits + 31) / 32;
}

void ci_affine_pack(const uint8_t *codes, size_t n, int bits, uint32_t *words) {
  const uint64_t mask = (1u << bits) - 1u;
  uint64_t acc = 0;
  int nacc = 0;
  size_t w = 0;
  for (size_t i = 0; i < n; i++) {
    acc |= ((uint64_t)codes[i] & mask) << nacc;
    nacc += bits;
    if (nacc >= 32) {
      words[w++] = (uint32_t)acc;
      acc >>= 32;
      nacc -= 32;
    }
  }
  if (nacc > 0) words[w] = (uint32_t)acc;
}

void ci_affine_unpack(const uint32_t *words, size_t n, int bits, uint8_t *codes) {
  const uint64_t mask = (1u << bits) - 1u;
  uint64_t acc = 0;
  int nacc = 0;
  size_t w = 0;
  for (size_t i = 0; i < n; i++) {
    if (nacc < bits) {
      acc |= (uint64_t)words[w++] << nacc;
      nacc += 32;
    }
    codes[i] = (uint8_t)(acc & mask);
    acc >>= bits;
    nacc -= bits;
  }
}

void ci_affine_dequantize(const uint8_t *codes, size_t n, float scale, float bias, float *out) {
  for (size_t i = 0; i < n; i++) out[i] = scale * (float)codes[i] + bias;
}

/* Stores f32 x as element i of an array of dtype (F32, F16 or BF16). */
static void store_float(ci_dtype dtype, void *dst, size_t i, float x) {
  if (dtype == CI_F32) {
    ((float *)dst)[i] = x;
  } else if (dtype == CI_F16) {
    ((uint16_t *)dst)[i] = ci_f32_to_f16(x);
  } else {
    ((uint16_t *)dst)[i] = ci_f32_to_bf16(x);
  }
}

static int is_float16_or_32(ci_dtype d) {
  return d == CI_F32 || d == CI_F16 || d == CI_BF16;
}

static int check_layout(int64_t cols, int bits, int group_size, ci_dtype scale_dtype) {
  if (!ci_affine_bits_ok(bits)) return ci_fail("affine quant: unsupported bits %d", bits);
  if (group_size < 1) return ci_fail("affine quant: bad group size %d", group_size);
  if (cols < 0 || cols % group_size != 0) {
    return ci_fail("affine quant: %lld columns not a multiple of group size %d", (long long)cols,
                   group_size);
  }
  if ((cols * bits) % 32 != 0) {
    return ci_fail("affine quant: %lld columns x %d bits do not fill whole u32 words",
                   (long long)cols, bits);
  }
  if (!is_float16_or_32(scale_dtype)) {
    return ci_fail("affine quant: scale dtype %s is not F32/F16/BF16",
                   ci_dtype_get(scale_dtype)->name);
  }
  return CI_OK;
}

int ci_affine_quantize_matrix(const void *src, ci_dtype src_dtype, int64_t rows, int64_t cols,
                              int bits, int group_size, uint32_t *codes, ci_dtype scale_dtype,
                              void *scales, void *biases) {
  if (check_layout(cols, bits, group_size, scale_dtype) != CI_OK) return CI_ERR;
  if (!is_float16_or_32(src_dtype)) {
    return ci_fail("affine quant: source dtype %s is not F32/F16/BF16",
                   ci_dtype_get(src_dtype)->name);
  }
  if (rows < 0) return ci_fail("affine quant: negative row count");
  if (rows == 0 || cols == 0) return CI_OK;
  const size_t ncols = (size_t)cols;
  const size_t groups = ncols / (size_t)group_size;
  const size_t words = ci_affine_packed_words(ncols, bits);
  float *row_f32 = malloc(ncols * sizeof(float));
  uint8_t *row_codes = malloc(ncols);
  if (!row_f32 || !row_codes) {
    free(row_f32);
    free(row_codes);
    return ci_fail("affine quant: out of memory for a %zu-column row", ncols);
  }
  for (int64_t r = 0; r < rows; r++) {
    const size_t base = (size_t)r * ncols;
    const float *x;
    if (src_dtype == CI_F32) {
      x = (const float *)src + base;
    } else {
      for (size_t c = 0; c < ncols; c++) row_f32[c] = ci_float_at(src_dtype, src, base + c);
      x = row_f32;
    }
    for (size_t gi = 0; gi < groups; gi++) {
      float s, b;
      const size_t off = gi * (size_t)group_size;
      ci_affine_quantize_group(x + off, group_size, bits, row_codes + off, &s, &b);
      store_float(scale_dtype, scales, (size_t)r * groups + gi, s);
      store_float(scale_dtype, biases, (size_t)r * groups + gi, b);
    }
    ci_affine_pack(row_codes, ncols, bits, codes + (size_t)r * words);
  }
  free(row_f32);
  free(row_codes);
  return CI_OK;
}

int ci_affine_dequantize_row(const uint32_t *codes_row, const void *scales_row,
                             const void *biases_row, ci_dtype scale_dtype, int64_t cols, int bits,
                             int group_size, float *out) {
  if (check_layout(cols, bits, group_size, scale_dtype) != CI_OK) return CI_ERR;
  if (cols == 0) return CI_OK;
  uint8_t *row_codes = malloc((size_t)cols);
  if (!row_codes) return ci_fail("affine dequant: out of memory");
  ci_affine_unpack(codes_row, (size_t)cols, bits, row_codes);
  const size_t groups = (size_t)cols / (size_t)group_size;
  for (size_t gi = 0; gi < groups; gi++) {
    const size_t off = gi * (size_t)group_size;
    ci_affine_dequantize(row_codes + off, (size_t)group_size,
                         ci_float_at(scale_dtype, scales_row, gi),
                         ci_float_at(scale_dtype, biases_row, gi), out + off);
  }
  free(row_codes);
  return CI_OK;
}
