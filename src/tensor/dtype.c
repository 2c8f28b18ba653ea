/* Data types: the dtype table and scalar half-precision conversions. */
#include "tensor/dtype.h"

#include <string.h>

static const ci_dtype_info dtype_table[CI_DTYPE_COUNT] = {
    [CI_F32] = {"F32", 32, 1, 1}, [CI_F16] = {"F16", 16, 1, 1},  [CI_BF16] = {"BF16", 16, 1, 1},
    [CI_F64] = {"F64", 64, 1, 1}, [CI_BOOL] = {"BOOL", 8, 0, 1}, [CI_U8] = {"U8", 8, 0, 1},
    [CI_I8] = {"I8", 8, 0, 1},    [CI_U16] = {"U16", 16, 0, 1},  [CI_I16] = {"I16", 16, 0, 1},
    [CI_U32] = {"U32", 32, 0, 1}, [CI_I32] = {"I32", 32, 0, 1},  [CI_U64] = {"U64", 64, 0, 1},
    [CI_I64] = {"I64", 64, 0, 1}, [CI_Q8] = {"Q8", 8, 0, 0},     [CI_Q4] = {"Q4", 4, 0, 0},
};

const ci_dtype_info *ci_dtype_get(ci_dtype dtype) {
  return &dtype_table[dtype];
}

int ci_dtype_parse(const char *name, ci_dtype *out) {
  for (int i = 0; i < CI_DTYPE_COUNT; i++) {
    if (dtype_table[i].in_safetensors && strcmp(dtype_table[i].name, name) == 0) {
      *out = (ci_dtype)i;
      return 0;
    }
  }
  return -1;
}

size_t ci_dtype_bytes(ci_dtype dtype, size_t n) {
  return (n * (size_t)dtype_table[dtype].bits + 7) / 8;
}

float ci_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else { /* subnormal: normalise */
      exponent = 127 - 15 + 1;
      while (!(mantissa & 0x400)) {
        mantissa <<= 1;
        exponent--;
      }
      mantissa &= 0x3ff;
      bits = sign | (exponent << 23) | (mantissa << 13);
    }
  } else if (exponent == 31) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  union {
    uint32_t u;
    float f;
  } v = {.u = bits};
  return v.f;
}

uint16_t ci_f32_to_f16(float f) {
  union {
    float f;
    uint32_t u;
  } v = {.f = f};
  uint32_t x = v.u;
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00;  /* NaN */
  if (abs >= 0x477ff000u) return sign | 0x7c00; /* overflow to inf (round-to-nearest) */
  if (abs < 0x38800000u) {                      /* subnormal or zero in f16 */
    if (abs < 0x33000000u) return sign;
    uint32_t mantissa = (abs & 0x7fffff) | 0x800000;
    int shift = 126 - (int)(abs >> 23); /* f16 subnormal unit is 2^-24 */
    uint32_t half = mantissa >> shift;
    uint32_t rem = mantissa & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return sign | (uint16_t)half;
  }
  uint32_t half = ((abs >> 13) - ((127 - 15) << 10));
  uint32_t rem = abs & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++;
  return sign | (uint16_t)half;
}

float ci_float_at(ci_dtype dtype, const void *data, size_t i) {
  switch (dtype) {
  case CI_F32:
    return ((const float *)data)[i];
  case CI_F16:
    return ci_f16_to_f32(((const uint16_t *)data)[i]);
  case CI_BF16:
    return ci_bf16_to_f32(((const uint16_t *)data)[i]);
  default:
    return 0.0f;
  }
}
