/* AVX-512 KV row decoders: 16 codes per step, codebook lookups with one lane permute
 * (vpermps over a 16-entry table), affine codes widened and fused into one FMA. Bit-identical
 * to the reference decoders in kv_kernels.c (same products, no reassociation). */
#include "backend/cpu/kv_kernels.h"

#include "backend/cpu/avx512_exp.h"

#include "tensor/dtype.h"
#include "tensor/turbo_quant.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

/* 16 four-bit codes (8 bytes, low nibble first) as 32-bit lane indices. */
static inline __m512i nibbles16(const uint8_t *p) {
  __m128i bytes = _mm_loadl_epi64((const __m128i *)(const void *)p);
  __m512i wide = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(bytes, _mm_srli_epi16(bytes, 4)));
  /* unpacklo interleaves byte i with (byte i >> 4): lanes low0, high0, low1, high1, ... */
  return _mm512_and_si512(wide, _mm512_set1_epi32(15));
}

/* 16 two-bit codes (4 bytes) as lane indices. */
static inline __m512i crumbs16(const uint8_t *p) {
  uint32_t word;
  memcpy(&word, p, 4);
  __m512i v = _mm512_set1_epi32((int)word);
  const __m512i shifts =
      _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  return _mm512_and_si512(_mm512_srlv_epi32(v, shifts), _mm512_set1_epi32(3));
}

/* 16 three-bit codes (6 bytes, LSB-first) as lane indices. Reads 8 bytes: a row always has at
 * least 2 bytes (its fp16 norm or scales) after its codes, and one 8-byte load avoids a
 * store-forwarding stall that a 6-byte copy causes. */
static inline __m512i triples16(const uint8_t *p) {
  uint64_t word;
  memcpy(&word, p, 8);
  __m512i v = _mm512_set1_epi64((long long)word);
  const __m512i shifts = _mm512_setr_epi64(0, 3, 6, 9, 12, 15, 18, 21);
  const __m512i shifts_hi = _mm512_setr_epi64(24, 27, 30, 33, 36, 39, 42, 45);
  __m256i lo = _mm512_cvtepi64_epi32(_mm512_srlv_epi64(v, shifts));
  __m256i hi = _mm512_cvtepi64_epi32(_mm512_srlv_epi64(v, shifts_hi));
  __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  return _mm512_and_si512(both, _mm512_set1_epi32(7));
}

static inline __m512i codes16(const uint8_t *codes, int i, int bits) {
  if (bits == 4) return nibbles16(codes + i / 2);
  if (bits == 2) return crumbs16(codes + i / 4);
  return triples16(codes + i / 8 * 3);
}

/* x = scale * table[code] for a Lloyd-Max table of 2^bits entries (padded to 16 lanes). */
static void decode_codebook(const uint8_t *codes, int D, int bits, const float *scales,
                            int scale_group, float *x) {
  float padded[16] = {0};
  memcpy(padded, ci_lloyd_max_centroids(bits), sizeof(float) << bits);
  const __m512 table = _mm512_loadu_ps(padded);
  const int shift = __builtin_ctz((unsigned)scale_group); /* groups are powers of two */
  for (int i = 0; i < D; i += 16) {
    __m512 c = _mm512_permutexvar_ps(codes16(codes, i, bits), table);
    _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_set1_ps(scales[i >> shift]), c));
  }
}

static void decode_turbo_k(const ci_paged_kv *kv, const uint8_t *row, float *x) {
  const int D = kv->head_dim, bits = kv->format.k_bits;
  const float nu = ci_f16_load(row + (size_t)D * bits / 8);
  decode_codebook(row, D, bits, &nu, D, x);
}

static void decode_turbo_v(const ci_paged_kv *kv, const uint8_t *row, float *x) {
  const int D = kv->head_dim, bits = kv->format.v_bits;
  const float nu = ci_f16_load(row + (size_t)D * bits / 8);
  decode_codebook(row, D, bits, &nu, D, x);
}

static void decode_turbo_v_value(const ci_paged_kv *kv, const uint8_t *row, float *x) {
  const int D = kv->head_dim, bits = kv->format.v_bits;
  float scales[CI_MAX_HEAD_DIM / 32];
  const uint8_t *r = row + (size_t)D * bits / 8;
  for (int g = 0; g < D / 32; g++) scales[g] = ci_f16_load(r + 2 * g);
  decode_codebook(row, D, bits, scales, 32, x);
}

/* Affine: x = s_G * code + b_G (one rounding after the product, then the add, like the
 * reference: separate mul and add, no FMA). */
static void decode_affine(const ci_paged_kv *kv, const uint8_t *row, float *x) {
  const int D = kv->head_dim, bits = kv->format.k_bits, group = kv->format.group_size;
  const uint8_t *scales = row + (size_t)D * bits / 8, *biases = scales + 2 * (D / group);
  for (int i = 0; i < D; i += 16) {
    const int g = i / group;
    __m512i codes = bits == 8 ? _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(row + i)))
                              : nibbles16(row + i / 2);
    __m512 prod =
        _mm512_mul_ps(_mm512_set1_ps(ci_bf16_load(scales + 2 * g)), _mm512_cvtepi32_ps(codes));
    _mm512_storeu_ps(x + i, _mm512_add_ps(prod, _mm512_set1_ps(ci_bf16_load(biases + 2 * g))));
  }
}

/* turbo-v K: (idx + zp_G) * sc_G per 32-group, idx signed 8-bit or unsigned 4-bit. */
static void decode_turbo_v_key(const ci_paged_kv *kv, const uint8_t *row, float *x) {
  const int D = kv->head_dim, bits = kv->format.k_bits, groups = D / 32;
  const uint8_t *sc = row + (size_t)D * bits / 8, *zp = sc + 2 * groups;
  for (int i = 0; i < D; i += 16) {
    const int g = i / 32;
    __m512i codes = bits == 8 ? _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row + i)))
                              : nibbles16(row + i / 2);
    __m512 sum = _mm512_add_ps(_mm512_cvtepi32_ps(codes), _mm512_set1_ps(ci_f16_load(zp + 2 * g)));
    _mm512_storeu_ps(x + i, _mm512_mul_ps(sum, _mm512_set1_ps(ci_f16_load(sc + 2 * g))));
  }
}

static void decode_bf16(const ci_paged_kv *kv, const uint8_t *row, float *x) {
  for (int i = 0; i < kv->head_dim; i += 16) {
    __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)(row + 2 * i));
    _mm512_storeu_ps(x + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
  }
}

ci_kv_row_decoder ci_kv_decoder_avx512(const ci_kv_format *format, int value) {
  switch (format->codec) {
  case CI_KV_BF16:
    return decode_bf16;
  case CI_KV_AFFINE:
    return format->k_bits == 8 || format->k_bits == 4 ? decode_affine : NULL;
  case CI_KV_TURBO:
    return value ? decode_turbo_v : decode_turbo_k;
  case CI_KV_TURBO_V:
    return value ? decode_turbo_v_value : decode_turbo_v_key;
  default:
    return NULL;
  }
}

/* ==== The attention loop ==== */

/* The horizontal sums of 16 vectors at once: vector n's sum lands in lane 4 (n % 4) + n / 4.
 * Each sum pairs the lanes exactly as _mm512_reduce_add_ps does (lane i with i + 8, then i + 4,
 * i + 2, i + 1), so every sum is bit-identical to a reduce of its own, at about a quarter of the
 * instructions (15 shuffle pairs and adds for 16 sums). */
static inline __m512 reduce_add16(const __m512 v[16]) {
  __m512 l1[8], l2[4], l3[2];
  for (int p = 0; p < 8; p++)
    l1[p] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0x44),
                          _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0xEE));
  for (int p = 0; p < 4; p++)
    l2[p] = _mm512_add_ps(_mm512_shuffle_f32x4(l1[2 * p], l1[2 * p + 1], 0x88),
                          _mm512_shuffle_f32x4(l1[2 * p], l1[2 * p + 1], 0xDD));
  for (int p = 0; p < 2; p++)
    l3[p] = _mm512_add_ps(_mm512_shuffle_ps(l2[2 * p], l2[2 * p + 1], 0x44),
                          _mm512_shuffle_ps(l2[2 * p], l2[2 * p + 1], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_ps(l3[0], l3[1], 0x88),
                       _mm512_shuffle_ps(l3[0], l3[1], 0xDD));
}

/* reduce_add16 for int32 lanes (integer sums: any order gives the same value). */
static inline __m512i reduce_add16_epi32(const __m512i v[16]) {
  __m512i l1[8], l2[4], l3[2];
  for (int p = 0; p < 8; p++)
    l1[p] = _mm512_add_epi32(_mm512_shuffle_i32x4(v[2 * p], v[2 * p + 1], 0x44),
                             _mm512_shuffle_i32x4(v[2 * p], v[2 * p + 1], 0xEE));
  for (int p = 0; p < 4; p++)
    l2[p] = _mm512_add_epi32(_mm512_shuffle_i32x4(l1[2 * p], l1[2 * p + 1], 0x88),
                             _mm512_shuffle_i32x4(l1[2 * p], l1[2 * p + 1], 0xDD));
  for (int p = 0; p < 2; p++) {
    const __m512 a = _mm512_castsi512_ps(l2[2 * p]), b = _mm512_castsi512_ps(l2[2 * p + 1]);
    l3[p] = _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(a, b, 0x44)),
                             _mm512_castps_si512(_mm512_shuffle_ps(a, b, 0xEE)));
  }
  const __m512 a = _mm512_castsi512_ps(l3[0]), b = _mm512_castsi512_ps(l3[1]);
  return _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(a, b, 0x88)),
                          _mm512_castps_si512(_mm512_shuffle_ps(a, b, 0xDD)));
}

/* ---- Affine and 4-bit TurboQuant rows as integers (k->int_dots) ----
 * A row's codes are read 32 bytes (a "unit") at a time and widened to 16-bit words: at 8 bits
 * one unit is 32 dims in order; at 4 bits it is 64 dims, the low nibbles (the even dims) as one
 * 32-word vector and the high nibbles (the odd dims) as another. TurboQuant's codes then become
 * their codebook entries times a power of two as int16 (one vpermw). The queries are int16 in the
 * same word order, so q . codes is a chain of vpdpwssd per (key, query head); with each key's
 * scale s and bias b per group (TurboQuant: the row's norm over the codebook's factor, no bias), a
 * score is the sum over groups of s * delta * (q16 . codes) + b * (sum of the group's q). */

/* TurboQuant's int16 codebooks (|entry| <= 2.7326 x the factor) keep every int32 sum in range:
 * for K rows a vpdpwssd lane sums D / 16 products of q16 (within TURBO_Q_MAX) and entries of the
 * factor 2^19 / D (D / 16 x 16383 x 2.7326 x 2^19 / D = 1.47e9 at every head_dim), for V rows a
 * block of up to 64 keys sums its words times the weights (at most 2^31 / (keys rounded up to
 * even x 5596), 23,983 at 16 keys). The split between q's and the codebook's bits was measured
 * (test_attention_fast_turbo: 2.5e-4 / 5.3e-4 / 8.2e-4 largest differences at head_dim 64 / 128 /
 * 256; 32767 and half the factor gave 3.8e-4 / 5.8e-4 / 8.2e-4). */
static inline float turbo_k_factor(int D) {
  return 524288.0f / (float)D;
}
#define TURBO_Q_MAX 16383
#define TURBO_V_FACTOR 2048.0f
#define TURBO_V_ENTRY_MAX 5596

/* The 4-bit codebook x factor as 32 words (entries 0-15, twice). */
static inline __m512i turbo_table_words(float factor) {
  const float *centroids = ci_lloyd_max_centroids(4);
  int16_t words[32];
  for (int i = 0; i < 32; i++) words[i] = (int16_t)lrintf(centroids[i % 16] * factor);
  return _mm512_loadu_si512(words);
}

/* The number of 32-word vectors of a unit: 1 at 8 bits, 2 (even dims, odd dims) at 4 bits. */
#define AFFINE_WORD_VECTORS(bits) ((bits) == 8 ? 1 : 2)

/* Unit u of a row as words (AFFINE_WORD_VECTORS(bits) vectors): the codes, or with `turbo` (4-bit
 * TurboQuant) their entries of `table` (turbo_table_words). */
static inline void code_unit_words(const uint8_t *row, int u, int bits, int turbo, __m512i table,
                                   __m512i words[2]) {
  const __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)(row + 32 * u));
  if (bits == 8) {
    words[0] = _mm512_cvtepu8_epi16(x);
    return;
  }
  const __m256i low = _mm256_set1_epi8(15);
  words[0] = _mm512_cvtepu8_epi16(_mm256_and_si256(x, low));
  words[1] = _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srli_epi16(x, 4), low));
  if (turbo) {
    words[0] = _mm512_permutexvar_epi16(words[0], table);
    words[1] = _mm512_permutexvar_epi16(words[1], table);
  }
}

/* Each key's scale and bias per group as f32, for the `count` rows of a block from `rows` (stride
 * bytes apart): scales[group][r], biases[group][r], zero for r in [count, count rounded up to 16
 * plus 16). Two gathers per group and 16 keys; a bias is read as the high half of the 4 bytes
 * ending with it (the 4 bytes from it could pass the row's end). With turbo_factor > 0 (4-bit
 * TurboQuant, one group): the row's fp16 norm / turbo_factor, read the same way, and no bias. */
static inline void code_row_params(const uint8_t *rows, size_t stride, int count, int D, int bits,
                                   float turbo_factor, int groups, float scales[8][80],
                                   float biases[8][80]) {
  const uint8_t *first_scale = rows + (size_t)D * bits / 8;
  const int padded = (count + 15) / 16 * 16;
  for (int r = 0; r < padded + 16; r += 16) {
    const __mmask16 mask = r >= count        ? 0
                           : count - r >= 16 ? 0xffff
                                             : (__mmask16)((1u << (count - r)) - 1);
    const __m512i at = _mm512_mullo_epi32(
        _mm512_add_epi32(_mm512_set1_epi32(r),
                         _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)),
        _mm512_set1_epi32((int)stride));
    if (turbo_factor > 0.0f) {
      const __m512i n =
          _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mask, at, first_scale - 2, 1);
      const __m512 norm = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(n, 16)));
      _mm512_storeu_ps(scales[0] + r, _mm512_mul_ps(norm, _mm512_set1_ps(1.0f / turbo_factor)));
      _mm512_storeu_ps(biases[0] + r, _mm512_setzero_ps());
      continue;
    }
    for (int g = 0; g < groups; g++) {
      const __m512i s =
          _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mask, at, first_scale + 2 * g, 1);
      const __m512i b = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mask, at,
                                                    first_scale + 2 * groups + 2 * g - 2, 1);
      _mm512_storeu_ps(scales[g] + r, _mm512_castsi512_ps(_mm512_slli_epi32(s, 16)));
      _mm512_storeu_ps(biases[g] + r, _mm512_castsi512_ps(_mm512_and_si512(
                                          b, _mm512_set1_epi32((int)0xffff0000u))));
    }
  }
}

/* The n_q prepared queries (D floats each) as int16 for the integer scores: q16[i][D] in the
 * rows' word order, q ~ delta * q16 with delta = max |q| / qmax (rounded to nearest), and
 * meta[i][0] = delta, meta[i][1 + group] = delta * (the group's sum of q16). */
static void quantize_queries_i16(const float *qp, int n_q, int D, int bits, int group, int qmax,
                                 int16_t *q16, float *meta) {
  for (int i = 0; i < n_q; i++) {
    const float *q = qp + (size_t)i * D;
    __m512 peak = _mm512_setzero_ps();
    for (int d = 0; d < D; d += 16)
      peak = _mm512_max_ps(peak, _mm512_abs_ps(_mm512_loadu_ps(q + d)));
    const float amax = _mm512_reduce_max_ps(peak);
    const float delta = amax > 0.0f ? amax / (float)qmax : 1.0f;
    const __m512 inv = _mm512_set1_ps(amax > 0.0f ? (float)qmax / amax : 0.0f);
    int16_t ordered[256];
    for (int d = 0; d < D; d += 16)
      _mm256_storeu_si256(
          (__m256i *)(void *)(ordered + d),
          _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(q + d), inv))));
    float *m = meta + (size_t)i * 16;
    m[0] = delta;
    for (int g = 0; g < D / group; g++) {
      int sum = 0;
      for (int d = g * group; d < (g + 1) * group; d++) sum += ordered[d];
      m[1 + g] = delta * (float)sum;
    }
    int16_t *out = q16 + (size_t)i * D;
    if (bits == 8) {
      memcpy(out, ordered, (size_t)D * sizeof *out);
    } else {
      for (int u = 0; u < D / 64; u++)
        for (int w = 0; w < 32; w++) {
          out[64 * u + w] = ordered[64 * u + 2 * w];
          out[64 * u + 32 + w] = ordered[64 * u + 2 * w + 1];
        }
    }
  }
}

/* Rows [0, count) of a block decoded into tile[count][D] by the row decoder (the rows the loop
 * does not read in place). */
static inline void decode_rows(ci_kv_row_decoder decode, const ci_paged_kv *kv, const uint8_t *row,
                               size_t row_bytes, int count, float *tile) {
  for (int r = 0; r < count; r++) decode(kv, row + r * row_bytes, tile + (size_t)r * kv->head_dim);
}

/* How the attention loop reads a block's rows: decoded into the f32 tile first (ROWS_TILE), or
 * straight from the block, widening bf16 (ROWS_BF16), dequantising affine 8/4-bit codes
 * (ROWS_AFFINE8/4) or looking TurboQuant codes of 2-4 bits up in their codebook (ROWS_TURBO +
 * bits) chunk by chunk into the same f32 values the decoders write. */
enum {
  ROWS_TILE,
  ROWS_BF16,
  ROWS_AFFINE8,
  ROWS_AFFINE4,
  ROWS_TURBO = 8,          /* + bits: TurboQuant K or V rows (codebook x the row's norm) */
  ROWS_TURBO_V_VALUE = 16, /* + bits: turbo-v V rows (codebook x a scale per 32 dims) */
  ROWS_TURBO_V_KEY8 = 24,  /* turbo-v K rows: (code + zero point) x scale per 32 dims */
  ROWS_TURBO_V_KEY4 = 25,
};

static int rows_mode(ci_kv_row_decoder decode, const ci_paged_kv *kv) {
  if (decode == decode_bf16) return ROWS_BF16;
  if (decode == decode_affine && kv->format.group_size >= 16)
    return kv->format.k_bits == 8 ? ROWS_AFFINE8 : ROWS_AFFINE4;
  if (decode == decode_turbo_k) return ROWS_TURBO + kv->format.k_bits;
  if (decode == decode_turbo_v) return ROWS_TURBO + kv->format.v_bits;
  if (decode == decode_turbo_v_value) return ROWS_TURBO_V_VALUE + kv->format.v_bits;
  if (decode == decode_turbo_v_key && (kv->format.k_bits == 8 || kv->format.k_bits == 4))
    return kv->format.k_bits == 8 ? ROWS_TURBO_V_KEY8 : ROWS_TURBO_V_KEY4;
  return ROWS_TILE;
}

/* Whether rows of `mode` can run the integer products (k->int_dots). */
#define INT_ROWS(mode)                                                                             \
  ((mode) == ROWS_AFFINE8 || (mode) == ROWS_AFFINE4 || (mode) == ROWS_TURBO + 4)

/* The codebook of a codebook row mode in 16 lanes (zeros past its entries; any vector for the
 * other modes). */
static inline __m512 mode_codebook(int mode) {
  if (mode < ROWS_TURBO || mode >= ROWS_TURBO_V_KEY8) return _mm512_setzero_ps();
  const int bits = mode < ROWS_TURBO_V_VALUE ? mode - ROWS_TURBO : mode - ROWS_TURBO_V_VALUE;
  return _mm512_maskz_loadu_ps((__mmask16)((1u << (1 << bits)) - 1), ci_lloyd_max_centroids(bits));
}

/* An f16 value at an unaligned address, as f32 (exact). */
static inline float f16_at(const uint8_t *p) {
  uint16_t h;
  memcpy(&h, p, sizeof h);
  return _cvtsh_ss(h);
}

/* Element chunk c (16 values) of row r: from the decoded tile, or straight from the block (the
 * same f32 values as decode_bf16 / decode_affine / decode_turbo_k and _v, without the tile's
 * store and reload). codebook: mode_codebook(mode). */
static inline __m512 row_chunk(const float *tile, const ci_paged_kv *kv, const uint8_t *rows,
                               size_t row_bytes, int D, int r, int c, int mode, __m512 codebook) {
  const uint8_t *row = rows + r * row_bytes;
  if (mode >= ROWS_TURBO && mode < ROWS_TURBO_V_VALUE) { /* nu * table[code], nu the row's norm */
    const int bits = mode - ROWS_TURBO;
    return _mm512_mul_ps(_mm512_set1_ps(f16_at(row + (size_t)D * bits / 8)),
                         _mm512_permutexvar_ps(codes16(row, 16 * c, bits), codebook));
  }
  if (mode >= ROWS_TURBO_V_VALUE && mode < ROWS_TURBO_V_KEY8) { /* scale_G * table[code] */
    const int bits = mode - ROWS_TURBO_V_VALUE;
    return _mm512_mul_ps(_mm512_set1_ps(f16_at(row + (size_t)D * bits / 8 + 2 * (16 * c / 32))),
                         _mm512_permutexvar_ps(codes16(row, 16 * c, bits), codebook));
  }
  if (mode == ROWS_TURBO_V_KEY8 || mode == ROWS_TURBO_V_KEY4) { /* (code + zp_G) * sc_G */
    const int bits = mode == ROWS_TURBO_V_KEY8 ? 8 : 4, g = 16 * c / 32;
    const uint8_t *sc = row + (size_t)D * bits / 8, *zp = sc + 2 * (D / 32);
    const __m512i codes =
        bits == 8
            ? _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(row + 16 * c)))
            : nibbles16(row + 8 * c);
    const __m512 sum = _mm512_add_ps(_mm512_cvtepi32_ps(codes), _mm512_set1_ps(f16_at(zp + 2 * g)));
    return _mm512_mul_ps(sum, _mm512_set1_ps(f16_at(sc + 2 * g)));
  }
  if (mode == ROWS_BF16)
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(row + 32 * c))),
        16));
  if (mode == ROWS_AFFINE8 || mode == ROWS_AFFINE4) {
    const int bits = mode == ROWS_AFFINE8 ? 8 : 4, group = kv->format.group_size;
    const uint8_t *scales = row + (size_t)D * bits / 8, *biases = scales + 2 * (D / group);
    const int g = 16 * c / group;
    const __m512i codes =
        bits == 8
            ? _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(row + 16 * c)))
            : nibbles16(row + 8 * c);
    const __m512 prod =
        _mm512_mul_ps(_mm512_set1_ps(ci_bf16_load(scales + 2 * g)), _mm512_cvtepi32_ps(codes));
    return _mm512_add_ps(prod, _mm512_set1_ps(ci_bf16_load(biases + 2 * g)));
  }
  return _mm512_loadu_ps(tile + (size_t)r * D + 16 * c);
}

/* out[g] = out[g] * rescale[g] + sum_r p[g][r] V[r] for the `count` bf16 V rows of a block (row
 * stride kv->v_row_bytes from vrow), with the weights p (scores, f32) rounded to bf16: keys in
 * pairs (r, r + 1) through vdpbf16ps, each 32-dim chunk of the two rows interleaved word by word
 * (unpacklo/hi), so the accumulators hold the dims of each 128-bit lane in two halves (lo: the
 * lane's first 4 dims, hi: the next 4), permuted to and from the output's order once per block.
 * An odd last key pairs with a zero row and weight. G and C compile-time constants after
 * inlining (G * 2 * chunks <= 16 accumulators). */
static inline __attribute__((always_inline)) void
weigh_values_bf16(const ci_paged_kv *kv, const uint8_t *vrow, const int G, const int C, int count,
                  float scores[8][64], const float *rescale, float *out) {
  const int D = 16 * C;
  /* the weights as bf16, a pair (r, r + 1) one 32-bit word, zero past count */
  _Alignas(64) uint16_t p[8][64 + 32];
  for (int g = 0; g < G; g++) {
    for (int r = 0; r < count; r += 16) {
      const __mmask16 mask = count - r >= 16 ? 0xffff : (__mmask16)((1u << (count - r)) - 1);
      _mm256_storeu_si256((__m256i *)(void *)(p[g] + r),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, scores[g] + r)));
    }
    p[g][count] = 0;
  }
  /* output order <-> lo/hi halves of a 32-dim chunk (n0: dims 0-15, n1: dims 16-31) */
  const __m512i to_lo = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
  const __m512i to_hi = _mm512_add_epi32(to_lo, _mm512_set1_epi32(4));
  const __m512i to_n0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i to_n1 = _mm512_add_epi32(to_n0, _mm512_set1_epi32(8));
  const int per_pass = G <= 4 ? 2 : 1; /* 32-dim chunks per pass: 2 G per_pass accumulators */
  for (int c0 = 0; c0 < C / 2; c0 += per_pass) {
    const int cn = C / 2 - c0 < per_pass ? C / 2 - c0 : per_pass;
    __m512 acc[16]; /* [g][c][lo, hi] */
    for (int g = 0; g < G; g++)
      for (int c = 0; c < cn; c++) {
        const float *o = out + g * (D + 2) + 2 + 32 * (c0 + c);
        const __m512 n0 = _mm512_loadu_ps(o), n1 = _mm512_loadu_ps(o + 16);
        const __m512 w = _mm512_set1_ps(rescale[g]);
        acc[(g * cn + c) * 2] = _mm512_mul_ps(_mm512_permutex2var_ps(n0, to_lo, n1), w);
        acc[(g * cn + c) * 2 + 1] = _mm512_mul_ps(_mm512_permutex2var_ps(n0, to_hi, n1), w);
      }
    for (int r = 0; r < count; r += 2) {
      __m512i lo[2], hi[2];
      for (int c = 0; c < cn; c++) {
        const uint8_t *at = vrow + (size_t)r * kv->v_row_bytes + 64 * (c0 + c);
        const __m512i va = _mm512_loadu_si512(at);
        const __m512i vb =
            r + 1 < count ? _mm512_loadu_si512(at + kv->v_row_bytes) : _mm512_setzero_si512();
        lo[c] = _mm512_unpacklo_epi16(va, vb);
        hi[c] = _mm512_unpackhi_epi16(va, vb);
      }
      for (int g = 0; g < G; g++) {
        uint32_t pair;
        memcpy(&pair, p[g] + r, sizeof pair);
        const __m512bh w = (__m512bh)_mm512_set1_epi32((int)pair);
        for (int c = 0; c < cn; c++) {
          acc[(g * cn + c) * 2] = _mm512_dpbf16_ps(acc[(g * cn + c) * 2], (__m512bh)lo[c], w);
          acc[(g * cn + c) * 2 + 1] =
              _mm512_dpbf16_ps(acc[(g * cn + c) * 2 + 1], (__m512bh)hi[c], w);
        }
      }
    }
    for (int g = 0; g < G; g++)
      for (int c = 0; c < cn; c++) {
        float *o = out + g * (D + 2) + 2 + 32 * (c0 + c);
        const __m512 lo = acc[(g * cn + c) * 2], hi = acc[(g * cn + c) * 2 + 1];
        _mm512_storeu_ps(o, _mm512_permutex2var_ps(lo, to_n0, hi));
        _mm512_storeu_ps(o + 16, _mm512_permutex2var_ps(lo, to_n1, hi));
      }
  }
}

/* weigh_values_bf16 for affine V rows of `bits` or 4-bit TurboQuant V rows (`turbo`;
 * k->int_dots): per unit of the rows, the weights of each query head times each key's scale of
 * the unit's group, quantised to int16 per block (delta = their max |w| / wq, wq 32767, or less
 * for TurboQuant's larger words: code_unit_words), multiply the codes' words, keys in pairs
 * through vpdpwssd (the lo/hi word order of weigh_values_bf16); out = out * rescale + delta *
 * sums + the weights times the keys' biases. An odd last key pairs with a zero weight and row. */
static inline __attribute__((always_inline)) void
weigh_values_int(const ci_paged_kv *kv, const uint8_t *vrow, const int G, const int C,
                 const int bits, const int turbo, __m512i table, int count, float scores[8][64],
                 const float *rescale, float *out) {
  const int D = 16 * C, group = turbo ? D : kv->format.group_size, groups = D / group;
  const int unit_dims = bits == 8 ? 32 : 64, vectors = AFFINE_WORD_VECTORS(bits);
  const size_t stride = kv->v_row_bytes;
  const int pairs = (count + 1) / 2;
  const int turbo_wq = 2147483647 / (2 * pairs * TURBO_V_ENTRY_MAX);
  const float wq = turbo && turbo_wq < 32767 ? (float)turbo_wq : 32767.0f;
  float scales[8][80], biases[8][80];
  code_row_params(vrow, stride, count, D, bits, turbo ? TURBO_V_FACTOR : 0.0f, groups, scales,
                  biases);
  _Alignas(64) int16_t w16[8][64 + 32];
  float delta[8], beta[8];
  const __m512i to_n0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i to_n1 = _mm512_add_epi32(to_n0, _mm512_set1_epi32(8));
  /* even dims (a) and odd dims (b) interleaved: first 8 of each, then the next 8 */
  const __m512i mix_lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i mix_hi = _mm512_add_epi32(mix_lo, _mm512_set1_epi32(8));
  int weights_group = -1;
  for (int u = 0; u < D / unit_dims; u++) {
    const int grp = u * unit_dims / group;
    if (grp != weights_group) {
      weights_group = grp;
      for (int g = 0; g < G; g++) {
        __m512 peak = _mm512_setzero_ps(), bias_sum = _mm512_setzero_ps();
        for (int r = 0; r < count; r += 16) {
          const __mmask16 mask = count - r >= 16 ? 0xffff : (__mmask16)((1u << (count - r)) - 1);
          const __m512 p = _mm512_maskz_loadu_ps(mask, scores[g] + r);
          peak = _mm512_max_ps(peak,
                               _mm512_abs_ps(_mm512_mul_ps(p, _mm512_loadu_ps(scales[grp] + r))));
          if (!turbo) bias_sum = _mm512_fmadd_ps(p, _mm512_loadu_ps(biases[grp] + r), bias_sum);
        }
        const float wmax = _mm512_reduce_max_ps(peak);
        delta[g] = wmax / wq;
        beta[g] = turbo ? 0.0f : _mm512_reduce_add_ps(bias_sum);
        const __m512 inv = _mm512_set1_ps(wmax > 0.0f ? wq / wmax : 0.0f);
        for (int r = 0; r < count; r += 16) {
          const __mmask16 mask = count - r >= 16 ? 0xffff : (__mmask16)((1u << (count - r)) - 1);
          const __m512 w = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, scores[g] + r),
                                         _mm512_loadu_ps(scales[grp] + r));
          _mm256_store_si256((__m256i *)(void *)(w16[g] + r),
                             _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(w, inv))));
        }
      }
    }
    for (int g0 = 0; g0 < G; g0 += 4) {
      const int gn = G - g0 < 4 ? G - g0 : 4;
      __m512i acc[16]; /* [g][vector][lo, hi] */
      for (int a = 0; a < 8 * vectors; a++) acc[a] = _mm512_setzero_si512();
      for (int r = 0; r < count; r += 2) {
        const uint8_t *at = vrow + (size_t)r * stride;
        __m512i wa[2], wb[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()}, lo[2], hi[2];
        code_unit_words(at, u, bits, turbo, table, wa);
        if (r + 1 < count) code_unit_words(at + stride, u, bits, turbo, table, wb);
        for (int v = 0; v < vectors; v++) {
          lo[v] = _mm512_unpacklo_epi16(wa[v], wb[v]);
          hi[v] = _mm512_unpackhi_epi16(wa[v], wb[v]);
        }
        for (int g = 0; g < gn; g++) {
          int32_t pair;
          memcpy(&pair, w16[g0 + g] + r, sizeof pair);
          const __m512i w = _mm512_set1_epi32(pair);
          for (int v = 0; v < vectors; v++) {
            acc[(g * vectors + v) * 2] = _mm512_dpwssd_epi32(acc[(g * vectors + v) * 2], lo[v], w);
            acc[(g * vectors + v) * 2 + 1] =
                _mm512_dpwssd_epi32(acc[(g * vectors + v) * 2 + 1], hi[v], w);
          }
        }
      }
      for (int g = 0; g < gn; g++) {
        const int head = g0 + g;
        float *o = out + head * (D + 2) + 2 + unit_dims * u;
        __m512 words[2][2]; /* [vector][words 0-15, 16-31] */
        for (int v = 0; v < vectors; v++) {
          const __m512 lo = _mm512_cvtepi32_ps(acc[(g * vectors + v) * 2]);
          const __m512 hi = _mm512_cvtepi32_ps(acc[(g * vectors + v) * 2 + 1]);
          words[v][0] = _mm512_permutex2var_ps(lo, to_n0, hi);
          words[v][1] = _mm512_permutex2var_ps(lo, to_n1, hi);
        }
        __m512 dims[4];
        if (bits == 8) {
          dims[0] = words[0][0], dims[1] = words[0][1];
        } else {
          dims[0] = _mm512_permutex2var_ps(words[0][0], mix_lo, words[1][0]);
          dims[1] = _mm512_permutex2var_ps(words[0][0], mix_hi, words[1][0]);
          dims[2] = _mm512_permutex2var_ps(words[0][1], mix_lo, words[1][1]);
          dims[3] = _mm512_permutex2var_ps(words[0][1], mix_hi, words[1][1]);
        }
        const __m512 d = _mm512_set1_ps(delta[head]), b = _mm512_set1_ps(beta[head]);
        const __m512 rs = _mm512_set1_ps(rescale[head]);
        for (int c = 0; c < unit_dims / 16; c++)
          _mm512_storeu_ps(o + 16 * c, _mm512_fmadd_ps(_mm512_loadu_ps(o + 16 * c), rs,
                                                       _mm512_fmadd_ps(dims[c], d, b)));
      }
    }
  }
}

/* One block of keys [j, end) for the G query heads of one KV head: scores, the online softmax's
 * update of out[g] = {max, sum, unnormalised output}, and the weighted values. q_bf16 is the
 * head's queries rounded to bf16 (G x C/2 vectors) when bf16_scores. Always inlined: called with
 * constant G and C for the common shapes, so that the accumulator arrays below (indexed by
 * unrolled loop counters) live in registers instead of on the stack. */
static inline __attribute__((always_inline)) void
attend_block(const ci_kv_kernels *k, const ci_paged_kv *kv, int kv_head, const float *qp,
             const __m512i *q_bf16, const int G, const int C, int64_t j, int count, float scale,
             float softcap, int mode_k, int mode_v, int bf16_scores, int bf16_values,
             const __m512i *q16, const float *q16_meta, int int_scores, int int_values,
             __m512i k_table, __m512i v_table, float *tile, float *out, const uint8_t *next_k,
             const uint8_t *next_v) {
  const int D = 16 * C, T = kv->block_tokens;
  float *ktile = tile, *vtile = tile + (size_t)T * D;
  float scores[8][64];
  const uint8_t *krow = ci_kv_row_at(kv, 0, j, kv_head), *vrow = ci_kv_row_at(kv, 1, j, kv_head);
  const __m512 codebook_k = mode_codebook(mode_k), codebook_v = mode_codebook(mode_v);
  if (mode_k == ROWS_TILE) decode_rows(k->decode_k, kv, krow, kv->k_row_bytes, count, ktile);
  if (mode_v == ROWS_TILE) decode_rows(k->decode_v, kv, vrow, kv->v_row_bytes, count, vtile);
  /* Scores: for each key, the G query heads as independent FMA chains over D, 16 / G keys at
   * a time so that one reduce_add16 sums all their chains (unused chains stay zero), the chain of
   * (key kk, head g) placed so that its sum lands in lane g * 16 / G + kk: head-major lanes. */
  const int keys_per_batch = 16 / G, chunk = keys_per_batch * G; /* chunk <= 16 */
  /* integer scores: each key's scale and bias per group; per lane (head g, key kk) of a batch,
   * the head's delta and group sums of q, and the key of the lane */
  const int k_bits = mode_k == ROWS_AFFINE8 ? 8 : 4, k_turbo = mode_k == ROWS_TURBO + 4;
  const int k_group = k_turbo ? D : kv->format.group_size;
  const int k_groups = int_scores ? D / k_group : 1;
  float k_scales[8][80], k_biases[8][80];
  __m512 delta_lanes = _mm512_setzero_ps(), qsum_lanes[8];
  __m512i key_of_lane = _mm512_setzero_si512();
  if (int_scores) {
    code_row_params(krow, kv->k_row_bytes, count, D, k_bits, k_turbo ? turbo_k_factor(D) : 0.0f,
                    k_groups, k_scales, k_biases);
    int32_t meta_of[16], key_of[16];
    for (int l = 0; l < 16; l++)
      meta_of[l] = l / keys_per_batch * 16, key_of[l] = l % keys_per_batch;
    key_of_lane = _mm512_loadu_si512(key_of);
    const __m512i meta_at = _mm512_loadu_si512(meta_of);
    const __mmask16 used = (__mmask16)((1u << (keys_per_batch * G)) - 1);
    delta_lanes = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), used, meta_at, q16_meta, 4);
    for (int grp = 0; grp < k_groups; grp++)
      qsum_lanes[grp] =
          _mm512_mask_i32gather_ps(_mm512_setzero_ps(), used, meta_at, q16_meta + 1 + grp, 4);
  }
  __m512 block_max[8]; /* lane-wise maxima of each head's scores */
  for (int g = 0; g < G; g++) block_max[g] = _mm512_set1_ps(out[g * (D + 2)]);
  for (int c0 = 0; c0 < count; c0 += chunk) {
    __m512 sums[8]; /* batch b of this chunk: keys c0 + b * keys_per_batch ... */
    for (int b = 0; b < G; b++) {
      const int r0 = c0 + b * keys_per_batch;
      const int nk = count - r0 < keys_per_batch ? count - r0 : keys_per_batch;
      sums[b] = _mm512_setzero_ps();
      if (nk <= 0) continue;
      if (next_k) { /* the same rows of this head's next block, into L1 */
        for (size_t at = r0 * kv->k_row_bytes; at < (r0 + nk) * kv->k_row_bytes; at += 64)
          _mm_prefetch((const char *)next_k + at, _MM_HINT_T0);
        for (size_t at = r0 * kv->v_row_bytes; at < (r0 + nk) * kv->v_row_bytes; at += 64)
          _mm_prefetch((const char *)next_v + at, _MM_HINT_T0);
      }
      __m512 acc[16];
      for (int a = 0; a < 16; a++) acc[a] = _mm512_setzero_ps();
#define CHAIN(kk, g) (4 * (((g)*keys_per_batch + (kk)) % 4) + ((g)*keys_per_batch + (kk)) / 4)
      if (bf16_scores) {
        for (int c2 = 0; c2 < C / 2; c2++)
          for (int kk = 0; kk < keys_per_batch; kk++) {
            if (kk >= nk) break;
            const __m512i k32 = _mm512_loadu_si512(krow + (r0 + kk) * kv->k_row_bytes + 64 * c2);
            for (int g = 0; g < G; g++)
              acc[CHAIN(kk, g)] = _mm512_dpbf16_ps(
                  acc[CHAIN(kk, g)], (__m512bh)q_bf16[g * (C / 2) + c2], (__m512bh)k32);
          }
      } else if (int_scores) {
        const int unit_dims = k_bits == 8 ? 32 : 64, vectors = AFFINE_WORD_VECTORS(k_bits);
        const int units_per_group = k_group / unit_dims;
        __m512 total = _mm512_setzero_ps();
        for (int grp = 0; grp < k_groups; grp++) {
          __m512i iacc[16];
          for (int a = 0; a < 16; a++) iacc[a] = _mm512_setzero_si512();
          for (int u = grp * units_per_group; u < (grp + 1) * units_per_group; u++)
            for (int kk = 0; kk < keys_per_batch; kk++) {
              if (kk >= nk) break;
              __m512i words[2];
              code_unit_words(krow + (r0 + kk) * kv->k_row_bytes, u, k_bits, k_turbo, k_table,
                              words);
              for (int g = 0; g < G; g++)
                for (int v = 0; v < vectors; v++)
                  iacc[CHAIN(kk, g)] =
                      _mm512_dpwssd_epi32(iacc[CHAIN(kk, g)], words[v],
                                          _mm512_loadu_si512(q16 + g * (D / 32) + u * vectors + v));
            }
          __m512 dot;
          if (k_turbo) { /* the chains' sums can pass int32: summed in f32 */
            __m512 chains[16];
            for (int a = 0; a < 16; a++) chains[a] = _mm512_cvtepi32_ps(iacc[a]);
            dot = reduce_add16(chains);
          } else {
            dot = _mm512_cvtepi32_ps(reduce_add16_epi32(iacc));
          }
          const __m512 s = _mm512_permutexvar_ps(key_of_lane, _mm512_loadu_ps(k_scales[grp] + r0));
          total = _mm512_fmadd_ps(_mm512_mul_ps(dot, delta_lanes), s, total);
          if (!k_turbo) {
            const __m512 b =
                _mm512_permutexvar_ps(key_of_lane, _mm512_loadu_ps(k_biases[grp] + r0));
            total = _mm512_fmadd_ps(b, qsum_lanes[grp], total);
          }
        }
        acc[0] = total; /* the sums, not chains: reduce_add16 below is skipped */
      } else {
        for (int c = 0; c < C; c++)
          for (int kk = 0; kk < keys_per_batch; kk++) {
            if (kk >= nk) break;
            const __m512 k16 =
                row_chunk(ktile, kv, krow, kv->k_row_bytes, D, r0 + kk, c, mode_k, codebook_k);
            for (int g = 0; g < G; g++)
              acc[CHAIN(kk, g)] =
                  _mm512_fmadd_ps(_mm512_loadu_ps(qp + g * D + 16 * c), k16, acc[CHAIN(kk, g)]);
          }
      }
#undef CHAIN
      sums[b] = _mm512_mul_ps(int_scores ? acc[0] : reduce_add16(acc), _mm512_set1_ps(scale));
    }
    const int left = count - c0 < 16 ? count - c0 : 16;
    const __mmask16 mask = left == 16 ? 0xffff : (__mmask16)((1u << left) - 1);
    if ((G == 1 || G == 2 || G == 4) && softcap <= 0.0f) {
      /* head g's 16 keys in order: lane block g of each batch (a 4 x 4 transpose of 128-bit
       * blocks for G = 4, halves for G = 2) */
      __m512 head[4];
      if (G == 1) {
        head[0] = sums[0];
      } else if (G == 2) {
        head[0] = _mm512_shuffle_f32x4(sums[0], sums[1], 0x44);
        head[1] = _mm512_shuffle_f32x4(sums[0], sums[1], 0xEE);
      } else {
        const __m512 lo01 = _mm512_shuffle_f32x4(sums[0], sums[1], 0x44);
        const __m512 hi01 = _mm512_shuffle_f32x4(sums[0], sums[1], 0xEE);
        const __m512 lo23 = _mm512_shuffle_f32x4(sums[2], sums[3], 0x44);
        const __m512 hi23 = _mm512_shuffle_f32x4(sums[2], sums[3], 0xEE);
        head[0] = _mm512_shuffle_f32x4(lo01, lo23, 0x88);
        head[1] = _mm512_shuffle_f32x4(lo01, lo23, 0xDD);
        head[2] = _mm512_shuffle_f32x4(hi01, hi23, 0x88);
        head[3] = _mm512_shuffle_f32x4(hi01, hi23, 0xDD);
      }
      for (int g = 0; g < G; g++) {
        _mm512_storeu_ps(scores[g] + c0, head[g]);
        block_max[g] = _mm512_mask_max_ps(block_max[g], mask, block_max[g], head[g]);
      }
      continue;
    }
    for (int b = 0; b < G; b++) {
      float lanes[16];
      _mm512_storeu_ps(lanes, sums[b]);
      for (int kk = 0; kk < keys_per_batch && c0 + b * keys_per_batch + kk < count; kk++)
        for (int g = 0; g < G; g++) {
          float sv = lanes[g * keys_per_batch + kk];
          if (softcap > 0.0f) sv = softcap * tanhf(sv / softcap);
          const int r = c0 + b * keys_per_batch + kk;
          scores[g][r] = sv;
          block_max[g] = _mm512_mask_max_ps(block_max[g], 1, block_max[g], _mm512_set1_ps(sv));
        }
    }
  }
  float rescale[8];
  for (int g = 0; g < G; g++) {
    float *o = out + g * (D + 2);
    /* the running maximum moves only when a score passed it (rarely, once the walk is under
     * way): the reduction and expf only then (the same values as always reducing) */
    float head_max = o[0];
    rescale[g] = o[1] > 0.0f ? 1.0f : 0.0f;
    if (_mm512_cmp_ps_mask(block_max[g], _mm512_set1_ps(o[0]), _CMP_GT_OQ)) {
      head_max = _mm512_reduce_max_ps(block_max[g]);
      rescale[g] = o[1] > 0.0f ? expf(o[0] - head_max) : 0.0f;
    }
    float sum = o[1] * rescale[g];
    for (int r = 0; r < count; r += 16) {
      const __mmask16 mask = count - r >= 16 ? 0xffff : (__mmask16)((1u << (count - r)) - 1);
      const __m512 e = ci_exp16(
          _mm512_sub_ps(_mm512_maskz_loadu_ps(mask, scores[g] + r), _mm512_set1_ps(head_max)));
      _mm512_mask_storeu_ps(scores[g] + r, mask, e);
      sum += _mm512_mask_reduce_add_ps(mask, e);
    }
    o[0] = head_max;
    o[1] = sum;
  }
  if (bf16_values) {
    weigh_values_bf16(kv, vrow, G, C, count, scores, rescale, out);
    return;
  }
  if (int_values) {
    weigh_values_int(kv, vrow, G, C, mode_v == ROWS_AFFINE8 ? 8 : 4, mode_v == ROWS_TURBO + 4,
                     v_table, count, scores, rescale, out);
    return;
  }
  /* Weighted values: each output chunk of each head one FMA chain over the keys in order;
   * every head's chunks at once, so that each V chunk is widened once for all G heads and the
   * G x cn chains run side by side. */
  const int chunks = G <= 4 ? 4 : 2;
  for (int c0 = 0; c0 < C; c0 += chunks) {
    const int cn = C - c0 < chunks ? C - c0 : chunks;
    __m512 acc[16];
    for (int g = 0; g < G; g++)
      for (int c = 0; c < cn; c++)
        acc[g * cn + c] = _mm512_mul_ps(_mm512_loadu_ps(out + g * (D + 2) + 2 + 16 * (c0 + c)),
                                        _mm512_set1_ps(rescale[g]));
    for (int r = 0; r < count; r++) {
      __m512 v[4];
      for (int c = 0; c < cn; c++)
        v[c] = row_chunk(vtile, kv, vrow, kv->v_row_bytes, D, r, c0 + c, mode_v, codebook_v);
      for (int g = 0; g < G; g++) {
        const __m512 w = _mm512_set1_ps(scores[g][r]);
        for (int c = 0; c < cn; c++) acc[g * cn + c] = _mm512_fmadd_ps(w, v[c], acc[g * cn + c]);
      }
    }
    for (int g = 0; g < G; g++)
      for (int c = 0; c < cn; c++)
        _mm512_storeu_ps(out + g * (D + 2) + 2 + 16 * (c0 + c), acc[g * cn + c]);
  }
}

/* The attention loop for KV heads [head0, head0 + n_heads), G query heads each, of D = 16 C
 * dims: block by block, every head of a block before the next block (a block's K rows of
 * consecutive heads are one contiguous run, likewise V), and while a head scores its keys, the
 * same rows of its next block are prefetched into L1, a few lines per batch of keys. One head at a
 * time over its whole range with a burst of prefetches a block and four blocks ahead (before
 * 2026-12-05) read the cache slower: at 16,384 positions (Llama-3.2-1B geometry, q4, 2 Zen 4
 * threads) decode 21.4 -> 29.7 tok/s (bench/cpu.md). Each head's result is the same bits either
 * way. With k->bf16_dots (fast precision, bf16 K/V rows) the scores are vdpbf16ps of q rounded to
 * bf16 against the stored rows, 32 dims per instruction and no widening, and the V rows are
 * weighed by weigh_values_bf16. */
static inline __attribute__((always_inline)) void
attend_impl(const ci_kv_kernels *k, const ci_paged_kv *kv, int head0, int n_heads, const float *qp,
            const int G, const int C, const int mode_k, const int mode_v, int64_t lo, int64_t hi,
            float scale, float softcap, float *scratch, float *out) {
  const int D = 16 * C, T = kv->block_tokens;
  for (int g = 0; g < n_heads * G; g++) {
    float *o = out + g * (D + 2);
    o[0] = -INFINITY;
    o[1] = 0.0f;
    memset(o + 2, 0, (size_t)D * sizeof(float));
  }
  /* q rounded to bf16, 32 dims a vector, for the bf16 dot-product scores */
  const int bf16_scores = k->bf16_dots && mode_k == ROWS_BF16 && C % 2 == 0;
  const int bf16_values = k->bf16_dots && mode_v == ROWS_BF16 && C % 2 == 0;
  const int int_scores = k->int_dots && INT_ROWS(mode_k),
            int_values = k->int_dots && INT_ROWS(mode_v);
  const __m512i k_table = int_scores && mode_k == ROWS_TURBO + 4
                              ? turbo_table_words(turbo_k_factor(D))
                              : _mm512_setzero_si512();
  const __m512i v_table = int_values && mode_v == ROWS_TURBO + 4 ? turbo_table_words(TURBO_V_FACTOR)
                                                                 : _mm512_setzero_si512();
  float *tile = scratch;
  __m512i *q_bf16 = (__m512i *)(void *)(scratch + ci_kv_attend_tile_floats(kv));
  /* or the queries as int16 (the same bytes), then 16 floats a query head: delta, group sums */
  float *q16_meta = scratch + ci_kv_attend_tile_floats(kv) + (int64_t)n_heads * G * D / 2;
  if (int_scores) {
    const int turbo = mode_k == ROWS_TURBO + 4;
    quantize_queries_i16(qp, n_heads * G, D, mode_k == ROWS_AFFINE8 ? 8 : 4,
                         turbo ? D : kv->format.group_size, turbo ? TURBO_Q_MAX : 32767,
                         (int16_t *)(void *)q_bf16, q16_meta);
  }
  for (int g = 0; g < n_heads * G && bf16_scores; g++)
    for (int c2 = 0; c2 < C / 2; c2++)
      _mm512_store_si512(q_bf16 + g * (C / 2) + c2,
                         (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(qp + g * D + 32 * c2 + 16),
                                                      _mm512_loadu_ps(qp + g * D + 32 * c2)));
  for (int64_t j = lo; j < hi;) {
    const int64_t end = (j / T + 1) * T < hi ? (j / T + 1) * T : hi;
    for (int h = 0; h < n_heads; h++)
      attend_block(k, kv, head0 + h, qp + (size_t)h * G * D, q_bf16 + h * G * (C / 2), G, C, j,
                   (int)(end - j), scale, softcap, mode_k, mode_v, bf16_scores, bf16_values,
                   q_bf16 + h * G * (C / 2), q16_meta + (size_t)h * G * 16, int_scores, int_values,
                   k_table, v_table, tile, out + (size_t)h * G * (D + 2),
                   end < hi ? ci_kv_row_at(kv, 0, end, head0 + h) : NULL,
                   end < hi ? ci_kv_row_at(kv, 1, end, head0 + h) : NULL);
    j = end;
  }
}

/* The common shapes with constant G and C: groups of 4 (Llama 3, Mistral, Qwen3-8B, Gemma 3 1B)
 * and 2 (Qwen3-0.6B to 4B, Gemma 2) at head_dim 64, 128 and 256; any other shape as variables. */
#define ATTEND_SHAPES(mk, mv)                                                                      \
  do {                                                                                             \
    const int C = kv->head_dim / 16;                                                               \
    ATTEND_SHAPE(4, 4, mk, mv)                                                                     \
    ATTEND_SHAPE(4, 8, mk, mv)                                                                     \
    ATTEND_SHAPE(4, 16, mk, mv)                                                                    \
    ATTEND_SHAPE(2, 4, mk, mv)                                                                     \
    ATTEND_SHAPE(2, 8, mk, mv)                                                                     \
    ATTEND_SHAPE(2, 16, mk, mv)                                                                    \
    attend_impl(k, kv, head0, n_heads, qp, G, C, mk, mv, lo, hi, scale, softcap, scratch, out);    \
  } while (0)
#define ATTEND_SHAPE(g, c, mk, mv)                                                                 \
  if (G == g && C == c) {                                                                          \
    attend_impl(k, kv, head0, n_heads, qp, g, c, mk, mv, lo, hi, scale, softcap, scratch, out);    \
    return;                                                                                        \
  }
#define ATTEND_ARGS                                                                                \
  const ci_kv_kernels *k, const ci_paged_kv *kv, int head0, int n_heads, const float *qp, int G,   \
      int64_t lo, int64_t hi, float scale, float softcap, float *scratch, float *out

/* The in-place affine, TurboQuant and turbo-v modes (the common bit pairs) with the row modes
 * constants too, each in a function of its own: a mode tested inside the chunk
 * loops kept their values off registers (affine 8-bit 29.5 -> 16 ns per key and KV head alone,
 * bench/attend_bench), and the same code inlined beside the bf16 loop slowed the bf16 decode at
 * depth by ~5%. */
static __attribute__((noinline)) void attend_affine8(ATTEND_ARGS) {
  ATTEND_SHAPES(ROWS_AFFINE8, ROWS_AFFINE8);
}
static __attribute__((noinline)) void attend_affine4(ATTEND_ARGS) {
  ATTEND_SHAPES(ROWS_AFFINE4, ROWS_AFFINE4);
}
static __attribute__((noinline)) void attend_turbo44(ATTEND_ARGS) {
  ATTEND_SHAPES(ROWS_TURBO + 4, ROWS_TURBO + 4);
}
static __attribute__((noinline)) void attend_turbo43(ATTEND_ARGS) {
  ATTEND_SHAPES(ROWS_TURBO + 4, ROWS_TURBO + 3);
}
static __attribute__((noinline)) void attend_turbo33(ATTEND_ARGS) {
  ATTEND_SHAPES(ROWS_TURBO + 3, ROWS_TURBO + 3);
}
static __attribute__((noinline)) void attend_turbo_v83(ATTEND_ARGS) {
  ATTEND_SHAPES(ROWS_TURBO_V_KEY8, ROWS_TURBO_V_VALUE + 3);
}
static __attribute__((noinline)) void attend_turbo_v44(ATTEND_ARGS) {
  ATTEND_SHAPES(ROWS_TURBO_V_KEY4, ROWS_TURBO_V_VALUE + 4);
}

void ci_kv_attend_avx512(ATTEND_ARGS) {
  if (G > 8 || kv->block_tokens > 64) {
    ci_kv_attend_ref(k, kv, head0, n_heads, qp, G, lo, hi, scale, softcap, scratch, out);
    return;
  }
  const int mode_k = rows_mode(k->decode_k, kv), mode_v = rows_mode(k->decode_v, kv);
  if (mode_k == ROWS_AFFINE8 && mode_v == ROWS_AFFINE8) {
    attend_affine8(k, kv, head0, n_heads, qp, G, lo, hi, scale, softcap, scratch, out);
    return;
  }
  if (mode_k == ROWS_AFFINE4 && mode_v == ROWS_AFFINE4) {
    attend_affine4(k, kv, head0, n_heads, qp, G, lo, hi, scale, softcap, scratch, out);
    return;
  }
  if (mode_k == ROWS_TURBO + 4 && (mode_v == ROWS_TURBO + 4 || mode_v == ROWS_TURBO + 3)) {
    (mode_v == ROWS_TURBO + 4 ? attend_turbo44 : attend_turbo43)(k, kv, head0, n_heads, qp, G, lo,
                                                                 hi, scale, softcap, scratch, out);
    return;
  }
  if (mode_k == ROWS_TURBO + 3 && mode_v == ROWS_TURBO + 3) {
    attend_turbo33(k, kv, head0, n_heads, qp, G, lo, hi, scale, softcap, scratch, out);
    return;
  }
  if (mode_k == ROWS_TURBO_V_KEY8 && mode_v == ROWS_TURBO_V_VALUE + 3) {
    attend_turbo_v83(k, kv, head0, n_heads, qp, G, lo, hi, scale, softcap, scratch, out);
    return;
  }
  if (mode_k == ROWS_TURBO_V_KEY4 && mode_v == ROWS_TURBO_V_VALUE + 4) {
    attend_turbo_v44(k, kv, head0, n_heads, qp, G, lo, hi, scale, softcap, scratch, out);
    return;
  }
  ATTEND_SHAPES(mode_k, mode_v);
}
#undef ATTEND_ARGS
#undef ATTEND_SHAPE
#undef ATTEND_SHAPES
