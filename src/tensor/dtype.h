/* Data types: the element types safetensors can hold plus cinfer's MLX-affine weight formats,
 * described by one lookup table. */
#ifndef CI_TENSOR_DTYPE_H
#define CI_TENSOR_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum {
  CI_F32,
  CI_F16,
  CI_BF16,
  CI_F64,
  CI_BOOL,
  CI_U8,
  CI_I8,
  CI_U16,
  CI_I16,
  CI_U32,
  CI_I32,
  CI_U64,
  CI_I64,
  /* MLX affine-quantized weights: codes packed LSB-first in u32 words, per-group scales and
   * biases in separate tensors (see ci_tensor). Never stored in safetensors under these names. */
  CI_Q8,
  CI_Q4,
  CI_DTYPE_COUNT
} ci_dtype;

typedef struct {
  const char *name;   /* safetensors spelling ("F32", "BF16", ...); "Q8"/"Q4" for affine */
  int bits;           /* bits per element */
  int is_float;       /* 1 for F32/F16/BF16/F64 */
  int in_safetensors; /* 1 if a safetensors header may name it */
} ci_dtype_info;

/* Properties of a dtype (never NULL for a valid enum value). */
const ci_dtype_info *ci_dtype_get(ci_dtype dtype);

/* Parses a safetensors dtype name. Returns 0 and sets *out, or -1 if unknown. */
int ci_dtype_parse(const char *name, ci_dtype *out);

/* Bytes taken by n elements (rounded up to whole bytes). */
size_t ci_dtype_bytes(ci_dtype dtype, size_t n);

/* ==== Scalar conversions ==== */

static inline float ci_bf16_to_f32(uint16_t h) {
  union {
    uint32_t u;
    float f;
  } v = {.u = (uint32_t)h << 16};
  return v.f;
}

/* Round-to-nearest-even f32 -> bf16; NaN stays NaN. */
static inline uint16_t ci_f32_to_bf16(float f) {
  union {
    float f;
    uint32_t u;
  } v = {.f = f};
  if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);
  uint32_t rounding = 0x7fffu + ((v.u >> 16) & 1u);
  return (uint16_t)((v.u + rounding) >> 16);
}

float ci_f16_to_f32(uint16_t h);
uint16_t ci_f32_to_f16(float f);

/* A bf16 / f16 value stored at an unaligned address (packed KV rows), as f32. */
static inline float ci_bf16_load(const void *p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return ci_bf16_to_f32(h);
}

static inline float ci_f16_load(const void *p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return ci_f16_to_f32(h);
}

/* Reads element i of a float array of dtype F32, F16 or BF16 as f32. */
float ci_float_at(ci_dtype dtype, const void *data, size_t i);

#endif
