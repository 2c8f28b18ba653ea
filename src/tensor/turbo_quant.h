/* TurboQuant primitives (docs/kv-cache.md §2.3-2.5): the per-layer random sign vector, the
 * normalised Walsh-Hadamard transform, the Lloyd-Max codebooks for N(0,1), and scalar quantization
 * against them. The KV row formats built on these live in kv_format.c. */
#ifndef CI_TENSOR_TURBO_QUANT_H
#define CI_TENSOR_TURBO_QUANT_H

#include <stdint.h>

/* Fills signs[0..D) with the ±1 sign vector s_ℓ of cache layer `layer` for head dim D (the
 * normative splitmix64 generator of docs/kv-cache.md §2.3). */
void ci_turbo_signs(int layer, int head_dim, float *signs);

/* In place x <- H_D x with H_D[i][j] = (-1)^popcount(i & j) / sqrt(D): log2(D) butterfly stages
 * then one 1/sqrt(D) scale. D must be a power of two. H_D is symmetric and its own inverse. */
void ci_fwht(float *x, int head_dim);

/* The 2^bits Lloyd-Max centroids for N(0,1) in ascending order (bits 2, 3 or 4), and the
 * 2^bits - 1 thresholds between them (midpoints). */
const float *ci_lloyd_max_centroids(int bits);
const float *ci_lloyd_max_thresholds(int bits);

/* Code of u: the number of thresholds strictly below u (a value equal to a threshold takes the
 * lower code). */
uint8_t ci_lloyd_max_code(float u, int bits);

/* Per-coordinate mean squared error of the codebook for N(0,1) (the table of docs/kv-cache.md
 * §2.5). */
double ci_lloyd_max_mse(int bits);

/* f32 -> f16, round to nearest even, saturating at ±65504 (the KV codecs store ν and scales in
 * fp16). */
uint16_t ci_f32_to_f16_saturate(float f);

#endif
