/* KV row formats: how one token of one KV head is stored by each codec (docs/kv-cache.md §2) —
 * bf16, f32, MLX affine, TurboQuant and the seed's turbo-v — with exact row sizes, a reference
 * encoder and decoder per codec, and the names the CLI and reports use. */
#ifndef CI_TENSOR_KV_FORMAT_H
#define CI_TENSOR_KV_FORMAT_H

#include <stddef.h>
#include <stdint.h>

/* KV codecs. bf16 is the default; f32 keeps activations exactly (CPU reference runs, like
 * llama.cpp's f32 cache type). */
typedef enum {
  CI_KV_BF16,
  CI_KV_F32,
  CI_KV_AFFINE,  /* MLX per-token affine, bits 4|8, group 32|64|128 */
  CI_KV_TURBO,   /* rotated Lloyd-Max, K and V bits 2|3|4, D a power of two */
  CI_KV_TURBO_V, /* affine K (4|8 bits, groups of 32) + rotated Lloyd-Max V (2|3|4 bits) */
  CI_KV_CODEC_COUNT
} ci_kv_codec;

/* A codec with its parameters. Unused fields are 0. */
typedef struct {
  ci_kv_codec codec;
  int k_bits;
  int v_bits;
  int group_size; /* affine: 32|64|128; turbo-v: 32 (its K groups and V RMS groups) */
} ci_kv_format;

/* The parameterless formats. */
ci_kv_format ci_kv_format_plain(ci_kv_codec codec);

/* 1 if both describe the same storage. */
int ci_kv_format_equal(const ci_kv_format *a, const ci_kv_format *b);

/* 1 for codecs whose rows are quantized (affine, turbo, turbo-v). */
int ci_kv_format_is_quantized(const ci_kv_format *f);

/* Builds a format from CLI-style settings: codec name ("bf16", "f32", "affine", "turbo",
 * "turbo-v"), bits (K bits; affine uses it for both), value_bits (0 = same as bits), group_size
 * (0 = 64 for affine). Returns 0, or -1 with ci_last_error naming the bad setting. */
int ci_kv_format_parse(const char *codec, int bits, int value_bits, int group_size,
                       ci_kv_format *out);

/* Checks that the format can store rows of head_dim D (D % group, power of two for the rotated
 * codecs). Returns 0, or -1 with ci_last_error. */
int ci_kv_format_check(const ci_kv_format *f, int head_dim);

/* Writes a short name: "bf16", "f32", "affine:8:64", "turbo:4,3", "turbo-v:8,3". */
void ci_kv_format_name(const ci_kv_format *f, char *buf, size_t size);

/* Bytes of one stored K row (value 0) or V row (value 1) of head_dim D. */
size_t ci_kv_row_bytes(const ci_kv_format *f, int head_dim, int value);

/* Bytes of one token of one KV head, K and V together (docs/kv-cache.md §2.6). */
size_t ci_kv_bytes_per_token(const ci_kv_format *f, int head_dim);

/* Encodes x[0..D) as a K (value 0) or V (value 1) row. signs is the layer's TurboQuant sign
 * vector (ci_turbo_signs; unused by the other codecs, may be NULL for them). */
void ci_kv_encode_row(const ci_kv_format *f, int value, const float *signs, const float *x,
                      int head_dim, void *row);

/* Decodes a row back to x[0..D) (tests, conversion, reference attention). */
void ci_kv_decode_row(const ci_kv_format *f, int value, const float *signs, const void *row,
                      int head_dim, float *x);

/* Reads code i of an LSB-first bit stream of `bits`-bit codes. */
static inline unsigned ci_kv_code_at(const uint8_t *codes, int i, int bits) {
  if (bits == 8) return codes[i];
  if (bits == 4) return (codes[i >> 1] >> ((i & 1) * 4)) & 15u;
  if (bits == 2) return (codes[i >> 2] >> ((i & 3) * 2)) & 3u;
  unsigned bit = (unsigned)i * (unsigned)bits;
  unsigned word = codes[bit >> 3] | ((unsigned)codes[(bit >> 3) + 1] << 8);
  return (word >> (bit & 7)) & ((1u << bits) - 1);
}

#endif
