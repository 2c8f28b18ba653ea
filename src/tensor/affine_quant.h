/* MLX affine quantization: the bit-exact per-group quantize rule of docs/models.md §2, the
 * LSB-first u32 bit-stream packing of the codes, and a whole-matrix quantizer built from the two.
 */
#ifndef CI_TENSOR_AFFINE_QUANT_H
#define CI_TENSOR_AFFINE_QUANT_H

#include "tensor/dtype.h"

#include <stddef.h>
#include <stdint.h>

/* 1 if b is a bit width the quantizer and packer handle: 2, 3, 4, 5, 6 or 8. */
int ci_affine_bits_ok(int bits);

/* One code of the rule: clamp(rint(x), 0, n) with rint = nearbyintf (round half to even, default
 * rounding mode), computed without a libm call; NaN gives 0. n = 2^b - 1 <= 255. */
uint8_t ci_affine_code(float x, float n);

/* Quantizes one group of g (>= 1) f32 values w with b = bits per code (see ci_affine_bits_ok),
 * exactly as docs/models.md §2, all arithmetic in f32:
 *   n = 2^b - 1; lo = min(w); hi = max(w); s = max((hi - lo) / n, 1e-7)
 *   if |lo| > |hi|: edge = lo  else: edge = hi, s = -s
 *   q0 = rint(edge / s)                      (rint = nearbyintf: round half to even)
 *   if q0 != 0: s = edge / q0, bias = edge   else: bias = 0
 *   code[i] = clamp(rint((w[i] - bias) / s), 0, n)
 * Writes the g codes (each in [0, n]) to codes and the f32 scale and bias, before any storage
 * rounding, to *scale and *bias. Dequantization is w'[i] = scale * code[i] + bias; when q0 != 0
 * the larger-magnitude edge is reproduced exactly. The scale may be negative. NaN inputs give
 * unspecified (but in-range) codes. */
void ci_affine_quantize_group(const float *w, int g, int bits, uint8_t *codes, float *scale,
                              float *bias);

/* Same rule, with scale and bias returned rounded to bf16 (round to nearest even): the codes
 * still come from the f32 scale and bias, as the rule prescribes. */
void ci_affine_quantize_group_bf16(const float *w, int g, int bits, uint8_t *codes, uint16_t *scale,
                                   uint16_t *bias);

/* Number of u32 words that hold n codes of b bits: ceil(n * b / 32). */
size_t ci_affine_packed_words(size_t n, int bits);

/* Packs n codes of b bits (each < 2^b) into an LSB-first bit stream of u32 words: code i
 * occupies stream bits [i*b, i*b + b), bit k of the stream being bit (k % 32) of word k / 32.
 * Writes exactly ci_affine_packed_words(n, bits) words (unused high bits are zero). Words are
 * host-endian u32 values; on a little-endian host the bytes are those of MLX's layout. */
void ci_affine_pack(const uint8_t *codes, size_t n, int bits, uint32_t *words);

/* Inverse of ci_affine_pack: reads n codes of b bits from the bit stream in words. */
void ci_affine_unpack(const uint32_t *words, size_t n, int bits, uint8_t *codes);

/* Dequantizes n codes (one group or part of one): out[i] = scale * codes[i] + bias, in f32. */
void ci_affine_dequantize(const uint8_t *codes, size_t n, float scale, float bias, float *out);

/* Quantizes a row-major [rows, cols] matrix to the MLX affine layout of docs/models.md §2:
 *   src:    rows*cols elements of src_dtype (CI_F32, CI_F16 or CI_BF16), read as f32;
 *   codes:  [rows, cols*bits/32] u32 words, each row its own LSB-first bit stream;
 *   scales, biases: [rows, cols/group_size] elements of scale_dtype (CI_F32, CI_F16 or CI_BF16),
 *           the f32 scale/bias rounded once to that dtype.
 * Requires group_size >= 1, cols % group_size == 0, (cols * bits) % 32 == 0, bits valid.
 * Returns CI_OK, or CI_ERR with ci_last_error set (nothing is written on a bad argument).
 * Single-threaded; callers parallelise over row ranges (rows are independent). */
int ci_affine_quantize_matrix(const void *src, ci_dtype src_dtype, int64_t rows, int64_t cols,
                              int bits, int group_size, uint32_t *codes, ci_dtype scale_dtype,
                              void *scales, void *biases);

/* Dequantizes one row of the layout above back to f32 (cols values into out); scale_dtype as
 * for ci_affine_quantize_matrix. Same argument requirements; returns CI_OK or CI_ERR. */
int ci_affine_dequantize_row(const uint32_t *codes_row, const void *scales_row,
                             const void *biases_row, ci_dtype scale_dtype, int64_t cols, int bits,
                             int group_size, float *out);

#endif
