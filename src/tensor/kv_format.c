/* KV row formats: sizes, names, and the reference encoder/decoder of every codec (docs/kv-cache.md
 * §2). */
#include "tensor/kv_format.h"

#include "base/error.h"
#include "tensor/affine_quant.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"
#include "tensor/turbo_quant.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { TURBO_V_GROUP = 32 };

static const char *const codec_names[CI_KV_CODEC_COUNT] = {"bf16", "f32", "affine", "turbo",
                                                           "turbo-v"};

ci_kv_format ci_kv_format_plain(ci_kv_codec codec) {
  return (ci_kv_format){.codec = codec};
}

int ci_kv_format_equal(const ci_kv_format *a, const ci_kv_format *b) {
  return a->codec == b->codec && a->k_bits == b->k_bits && a->v_bits == b->v_bits &&
         a->group_size == b->group_size;
}

int ci_kv_format_is_quantized(const ci_kv_format *f) {
  return f->codec != CI_KV_BF16 && f->codec != CI_KV_F32;
}

int ci_kv_format_parse(const char *codec, int bits, int value_bits, int group_size,
                       ci_kv_format *out) {
  memset(out, 0, sizeof *out);
  int found = -1;
  for (int c = 0; c < CI_KV_CODEC_COUNT; c++)
    if (strcmp(codec, codec_names[c]) == 0) found = c;
  if (found < 0)
    return ci_fail("unknown KV codec \"%s\" (bf16, f32, affine, turbo, turbo-v)", codec);
  out->codec = (ci_kv_codec)found;
  if (!ci_kv_format_is_quantized(out)) return CI_OK;
  if (value_bits == 0) value_bits = bits;
  switch (out->codec) {
  case CI_KV_AFFINE:
    if (bits != 4 && bits != 8) return ci_fail("affine KV needs --kv-bits 4 or 8 (got %d)", bits);
    if (value_bits != bits) return ci_fail("affine KV stores K and V with the same bits");
    if (group_size == 0) group_size = 64;
    if (group_size != 32 && group_size != 64 && group_size != 128)
      return ci_fail("affine KV group size must be 32, 64 or 128 (got %d)", group_size);
    *out = (ci_kv_format){CI_KV_AFFINE, bits, bits, group_size};
    return CI_OK;
  case CI_KV_TURBO:
    if (bits < 2 || bits > 4 || value_bits < 2 || value_bits > 4)
      return ci_fail("turbo KV needs K and V bits in 2..4 (got %d, %d)", bits, value_bits);
    *out = (ci_kv_format){CI_KV_TURBO, bits, value_bits, 0};
    return CI_OK;
  case CI_KV_TURBO_V:
    if (bits != 4 && bits != 8) return ci_fail("turbo-v KV needs K bits 4 or 8 (got %d)", bits);
    if (value_bits < 2 || value_bits > 4)
      return ci_fail("turbo-v KV needs V bits in 2..4 (got %d)", value_bits);
    *out = (ci_kv_format){CI_KV_TURBO_V, bits, value_bits, TURBO_V_GROUP};
    return CI_OK;
  default:
    return ci_fail("KV codec \"%s\" takes no bits", codec);
  }
}

int ci_kv_format_check(const ci_kv_format *f, int head_dim) {
  char name[32];
  ci_kv_format_name(f, name, sizeof name);
  if ((f->codec == CI_KV_AFFINE || f->codec == CI_KV_TURBO_V) && head_dim % f->group_size != 0)
    return ci_fail("KV codec %s: head_dim %d is not a multiple of its group size %d", name,
                   head_dim, f->group_size);
  if ((f->codec == CI_KV_TURBO || f->codec == CI_KV_TURBO_V) &&
      (head_dim < 2 || (head_dim & (head_dim - 1)) != 0))
    return ci_fail("KV codec %s: head_dim %d is not a power of two (the Hadamard rotation needs "
                   "one)",
                   name, head_dim);
  if (head_dim * 8 % 8 != 0 || (head_dim * f->k_bits) % 8 != 0 || (head_dim * f->v_bits) % 8 != 0)
    return ci_fail("KV codec %s: head_dim %d does not pack into whole bytes", name, head_dim);
  return CI_OK;
}

void ci_kv_format_name(const ci_kv_format *f, char *buf, size_t size) {
  switch (f->codec) {
  case CI_KV_AFFINE:
    snprintf(buf, size, "affine:%d:%d", f->k_bits, f->group_size);
    break;
  case CI_KV_TURBO:
  case CI_KV_TURBO_V:
    snprintf(buf, size, "%s:%d,%d", codec_names[f->codec], f->k_bits, f->v_bits);
    break;
  default:
    snprintf(buf, size, "%s", f->codec < CI_KV_CODEC_COUNT ? codec_names[f->codec] : "?");
  }
}

size_t ci_kv_row_bytes(const ci_kv_format *f, int head_dim, int value) {
  const size_t D = (size_t)head_dim;
  const int bits = value ? f->v_bits : f->k_bits;
  switch (f->codec) {
  case CI_KV_BF16:
    return 2 * D;
  case CI_KV_F32:
    return 4 * D;
  case CI_KV_AFFINE:
    return D * (size_t)bits / 8 + 4 * (D / (size_t)f->group_size);
  case CI_KV_TURBO:
    return D * (size_t)bits / 8 + 2;
  case CI_KV_TURBO_V:
    return D * (size_t)bits / 8 + (value ? 2 : 4) * (D / TURBO_V_GROUP);
  default:
    return 0;
  }
}

size_t ci_kv_bytes_per_token(const ci_kv_format *f, int head_dim) {
  return ci_kv_row_bytes(f, head_dim, 0) + ci_kv_row_bytes(f, head_dim, 1);
}

/* ==== Bit streams ==== */

static void pack_codes(const uint8_t *codes, int n, int bits, uint8_t *out) {
  memset(out, 0, (size_t)n * (size_t)bits / 8);
  for (int i = 0; i < n; i++) {
    unsigned bit = (unsigned)i * (unsigned)bits;
    unsigned v = (unsigned)codes[i] << (bit & 7);
    out[bit >> 3] |= (uint8_t)v;
    if ((bit & 7) + (unsigned)bits > 8) out[(bit >> 3) + 1] |= (uint8_t)(v >> 8);
  }
}

/* ==== Codecs ==== */

static void put_f16(uint8_t *p, float v) {
  uint16_t h = ci_f32_to_f16_saturate(v);
  memcpy(p, &h, 2);
}

static void put_bf16(uint8_t *p, uint16_t v) {
  memcpy(p, &v, 2);
}

/* MLX affine per group (docs/models.md §2): codes | bf16 scales | bf16 biases. */
static void affine_encode(const float *x, int D, int bits, int group, uint8_t *row) {
  uint8_t codes[CI_MAX_HEAD_DIM];
  const int groups = D / group;
  uint8_t *scales = row + (size_t)D * bits / 8, *biases = scales + 2 * groups;
  for (int g = 0; g < groups; g++) {
    uint16_t s, b;
    ci_affine_quantize_group_bf16(x + g * group, group, bits, codes + g * group, &s, &b);
    put_bf16(scales + 2 * g, s);
    put_bf16(biases + 2 * g, b);
  }
  pack_codes(codes, D, bits, row);
}

static void affine_decode(const uint8_t *row, int D, int bits, int group, float *x) {
  const int groups = D / group;
  const uint8_t *scales = row + (size_t)D * bits / 8, *biases = scales + 2 * groups;
  for (int g = 0; g < groups; g++) {
    float s = ci_bf16_load(scales + 2 * g), b = ci_bf16_load(biases + 2 * g);
    for (int i = g * group; i < (g + 1) * group; i++)
      x[i] = s * (float)ci_kv_code_at(row, i, bits) + b;
  }
}

/* TurboQuant (docs/kv-cache.md §2.3): codes of the rotated, renormalised vector | fp16 ν. */
static void turbo_encode(const float *x, int D, int bits, const float *signs, uint8_t *row) {
  float y[CI_MAX_HEAD_DIM];
  uint8_t codes[CI_MAX_HEAD_DIM];
  double norm2 = 0.0;
  for (int i = 0; i < D; i++) norm2 += (double)x[i] * x[i];
  const float gamma = (float)sqrt(norm2);
  float nu = 0.0f;
  if (gamma == 0.0f) {
    memset(codes, 1 << (bits - 1), (size_t)D);
  } else {
    for (int i = 0; i < D; i++) y[i] = signs[i] * x[i];
    ci_fwht(y, D);
    const float unit = sqrtf((float)D) / gamma;
    const float *c = ci_lloyd_max_centroids(bits);
    double decoded2 = 0.0;
    for (int i = 0; i < D; i++) {
      codes[i] = ci_lloyd_max_code(y[i] * unit, bits);
      decoded2 += (double)c[codes[i]] * c[codes[i]];
    }
    nu = (float)(gamma / sqrt(decoded2));
  }
  pack_codes(codes, D, bits, row);
  put_f16(row + (size_t)D * bits / 8, nu);
}

static void turbo_decode(const uint8_t *row, int D, int bits, const float *signs, float *x) {
  const float *c = ci_lloyd_max_centroids(bits);
  const float nu = ci_f16_load(row + (size_t)D * bits / 8);
  for (int i = 0; i < D; i++) x[i] = nu * c[ci_kv_code_at(row, i, bits)];
  ci_fwht(x, D);
  for (int i = 0; i < D; i++) x[i] *= signs[i];
}

/* turbo-v K (docs/kv-cache.md §2.4): asymmetric affine per 32-group, codes | fp16 sc | fp16 zp. */
static void turbo_v_key_encode(const float *x, int D, int bits, uint8_t *row) {
  uint8_t codes[CI_MAX_HEAD_DIM];
  const int groups = D / TURBO_V_GROUP;
  uint8_t *sc_out = row + (size_t)D * bits / 8, *zp_out = sc_out + 2 * groups;
  for (int g = 0; g < groups; g++) {
    const float *v = x + g * TURBO_V_GROUP;
    float lo = v[0], hi = v[0];
    for (int i = 1; i < TURBO_V_GROUP; i++) {
      if (v[i] < lo) lo = v[i];
      if (v[i] > hi) hi = v[i];
    }
    if (lo == hi) { /* widen a constant group to include 0 (the reference's zp overflows) */
      if (lo > 0)
        lo = 0;
      else
        hi = 0;
    }
    float sc, zp;
    int qmin, qmax;
    if (bits == 8) {
      sc = (hi - lo) / 254.0f;
      zp = nearbyintf((hi + lo) / (2.0f * (sc + 1e-8f)));
      qmin = -127, qmax = 127;
    } else {
      qmax = (1 << bits) - 1;
      qmin = 0;
      sc = (hi - lo) / (float)qmax;
      zp = nearbyintf(lo / (sc + 1e-8f));
    }
    for (int i = 0; i < TURBO_V_GROUP; i++) {
      float q = nearbyintf(v[i] / (sc + 1e-8f) - zp);
      if (q < (float)qmin) q = (float)qmin;
      if (q > (float)qmax) q = (float)qmax;
      codes[g * TURBO_V_GROUP + i] = (uint8_t)(int8_t)(int)q;
    }
    put_f16(sc_out + 2 * g, sc);
    put_f16(zp_out + 2 * g, zp);
  }
  pack_codes(codes, D, bits, row);
}

static void turbo_v_key_decode(const uint8_t *row, int D, int bits, float *x) {
  const int groups = D / TURBO_V_GROUP;
  const uint8_t *sc_in = row + (size_t)D * bits / 8, *zp_in = sc_in + 2 * groups;
  for (int g = 0; g < groups; g++) {
    const float sc = ci_f16_load(sc_in + 2 * g), zp = ci_f16_load(zp_in + 2 * g);
    for (int i = g * TURBO_V_GROUP; i < (g + 1) * TURBO_V_GROUP; i++) {
      unsigned code = ci_kv_code_at(row, i, bits);
      float idx = bits == 8 ? (float)(int8_t)(uint8_t)code : (float)code;
      x[i] = (idx + zp) * sc;
    }
  }
}

/* turbo-v V: rotated, per 32-group RMS-normalised Lloyd-Max codes | fp16 r per group. */
static void turbo_v_value_encode(const float *x, int D, int bits, const float *signs,
                                 uint8_t *row) {
  float y[CI_MAX_HEAD_DIM];
  uint8_t codes[CI_MAX_HEAD_DIM];
  for (int i = 0; i < D; i++) y[i] = signs[i] * x[i];
  ci_fwht(y, D);
  uint8_t *r_out = row + (size_t)D * bits / 8;
  for (int g = 0; g < D / TURBO_V_GROUP; g++) {
    const float *v = y + g * TURBO_V_GROUP;
    float sum = 0.0f;
    for (int i = 0; i < TURBO_V_GROUP; i++) sum += v[i] * v[i];
    const float r = sqrtf(sum / TURBO_V_GROUP);
    for (int i = 0; i < TURBO_V_GROUP; i++)
      codes[g * TURBO_V_GROUP + i] = ci_lloyd_max_code(v[i] / (r + 1e-8f), bits);
    put_f16(r_out + 2 * g, r);
  }
  pack_codes(codes, D, bits, row);
}

static void turbo_v_value_decode(const uint8_t *row, int D, int bits, const float *signs,
                                 float *x) {
  const float *c = ci_lloyd_max_centroids(bits);
  const uint8_t *r_in = row + (size_t)D * bits / 8;
  for (int i = 0; i < D; i++)
    x[i] = c[ci_kv_code_at(row, i, bits)] * ci_f16_load(r_in + 2 * (i / TURBO_V_GROUP));
  ci_fwht(x, D);
  for (int i = 0; i < D; i++) x[i] *= signs[i];
}

void ci_kv_encode_row(const ci_kv_format *f, int value, const float *signs, const float *x,
                      int head_dim, void *row) {
  const int bits = value ? f->v_bits : f->k_bits;
  switch (f->codec) {
  case CI_KV_BF16:
    for (int i = 0; i < head_dim; i++) ((uint16_t *)row)[i] = ci_f32_to_bf16(x[i]);
    break;
  case CI_KV_F32:
    memcpy(row, x, (size_t)head_dim * sizeof(float));
    break;
  case CI_KV_AFFINE:
    affine_encode(x, head_dim, bits, f->group_size, row);
    break;
  case CI_KV_TURBO:
    turbo_encode(x, head_dim, bits, signs, row);
    break;
  case CI_KV_TURBO_V:
    if (value)
      turbo_v_value_encode(x, head_dim, bits, signs, row);
    else
      turbo_v_key_encode(x, head_dim, bits, row);
    break;
  default:
    break;
  }
}

void ci_kv_decode_row(const ci_kv_format *f, int value, const float *signs, const void *row,
                      int head_dim, float *x) {
  const int bits = value ? f->v_bits : f->k_bits;
  switch (f->codec) {
  case CI_KV_BF16:
    for (int i = 0; i < head_dim; i++) x[i] = ci_bf16_to_f32(((const uint16_t *)row)[i]);
    break;
  case CI_KV_F32:
    memcpy(x, row, (size_t)head_dim * sizeof(float));
    break;
  case CI_KV_AFFINE:
    affine_decode(row, head_dim, bits, f->group_size, x);
    break;
  case CI_KV_TURBO:
    turbo_decode(row, head_dim, bits, signs, x);
    break;
  case CI_KV_TURBO_V:
    if (value)
      turbo_v_value_decode(row, head_dim, bits, signs, x);
    else
      turbo_v_key_decode(row, head_dim, bits, x);
    break;
  default:
    break;
  }
}
