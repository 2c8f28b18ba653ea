/* AVX-512 VNNI row kernels for the affine formats (small m): x arrives as three int8 planes
 * per group (24-bit fixed point, x ~ u_g * (65536 h + 256 m + l), see CI_X_PLANE_BLOCK_Q8), or
 * in fast precision as the first two (16-bit) or only the first (8-bit), so
 * the code-times-x sums of a group are exact integer dot products (vpdpbusd: u8 codes x s8
 * planes, 4 products per int32 lane); per group and weight row only the combination of the
 * three sums, a conversion to f32 and one FMA with s_g * u_g remain, and the biases meet the
 * exact f32 group sums of x at the end. The quantizer writing the planes lives here too. */
#include "backend/cpu/kernels_impl.h"

#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))

enum {
  VW = 16,       /* floats (int32 lanes) per vector */
  ROW_BLOCK = 4, /* weight rows per block: factors made and prefetched together */
  X_BLOCK = 2,   /* x rows per block */
  /* Columns whose factors s_g * u_g are made at a time (all of a row up to Llama-8B-size down
   * projections): each chunk after the first stalls its row on the fresh factors; with 2048, q4
   * rows of 6912 and 8192 columns took 10-25% longer in cache on one Zen 4 core. */
  SCALE_CHUNK = 16384,
  /* How far ahead (bytes) each thread's weight stream is prefetched (prefetcht0: one stream per
   * thread since the rows run one at a time). Measured on Zen 4 streaming from DRAM with 2
   * threads, 1B geometry decode: with four interleaved row streams, 8 KiB into L1 reached ~22
   * GB/s and 32 KiB into L2 ~30-32 GB/s; with one stream, 32 KiB ahead with prefetcht0 against
   * prefetcht1: q8 +12% (34.5-37.2 against 31.6-33.8 tok/s, four alternating pairs), q4 level
   * (50.4-56.8 against 54.6-57.0); 16 KiB and 64 KiB alike within the drift, 128 KiB slower, no
   * prefetch -30% (q4) / -50% (q8), a prefetch on every other line about as slow as none, two per
   * line (L1 and L2 distances) 4-18% slower. */
  PREFETCH_BYTES = 32768,
};

/* Per-call constants. */
typedef struct {
  __m512i lane_group;   /* int32 lane -> group within a super block, when it spans several */
  int bits;             /* 8 or 4 */
  int n_planes;         /* x planes read: 3 (exact), 2 or 1 (fast) */
  int group_shift;      /* log2(group size) */
  int cols_per_block;   /* columns per 64 bytes of codes: 64 or 128 */
  int blocks_per_super; /* code blocks per super block (one group, or one block) */
  int super_cols;       /* columns per super block */
  int groups_per_super; /* groups in a super block (1 when a group covers it) */
  int64_t plane_block;  /* bytes of x planes per code block */
  int64_t n_groups;     /* groups per row */
} int8_consts;

/* The constants of a job with `bits`-bit codes and groups of `group` (both compile-time
 * constants after inlining, so the block loops unroll fully). */
INLINE int8_consts make_consts(const ci_matmul_job *job, int bits, int group, int n_planes) {
  int8_consts kc;
  kc.bits = bits;
  kc.n_planes = n_planes;
  kc.group_shift = group == 32 ? 5 : group == 64 ? 6 : 7;
  kc.cols_per_block = bits == 8 ? 64 : 128;
  kc.blocks_per_super = group > kc.cols_per_block ? group / kc.cols_per_block : 1;
  kc.super_cols = kc.blocks_per_super * kc.cols_per_block;
  kc.groups_per_super = kc.super_cols / group;
  kc.plane_block = bits == 8 ? CI_X_PLANE_BLOCK_Q8 : CI_X_PLANE_BLOCK_Q4;
  kc.n_groups = job->k >> kc.group_shift;
  /* int32 lane j sums bytes 4j..4j+3 of a code block: columns 4j.. (8-bit codes) or, in both
   * nibble planes, 8j.. (4-bit codes); groups are multiples of 8 columns */
  _Alignas(64) int32_t group_of_lane[VW];
  for (int j = 0; j < VW; j++) group_of_lane[j] = j * (bits == 8 ? 4 : 8) / group;
  kc.lane_group = _mm512_load_si512(group_of_lane);
  return kc;
}

/* Elements [i, i+16) of a scale/bias array of dtype sdt as f32; lanes outside `mask` read 0. */
INLINE __m512 load_scales16(ci_dtype sdt, const void *base, int64_t i, __mmask16 mask) {
  switch (sdt) {
  case CI_F16:
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, (const uint16_t *)base + i));
  case CI_BF16:
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, (const uint16_t *)base + i)), 16));
  default:
    return _mm512_maskz_loadu_ps(mask, (const float *)base + i);
  }
}

/* out[g] = scales[first + g] * units[g] for g < count, then 4 zeros (a partial super block
 * reads factors past the end for its empty lanes: 0, not stale stack, as 0 * NaN = NaN). */
INLINE void make_factors(ci_dtype sdt, const void *scales, int64_t first, const float *units,
                         int64_t count, float *out) {
  for (int64_t g = 0; g < count; g += VW) {
    __mmask16 mask = count - g >= VW ? 0xffff : (__mmask16)((1u << (count - g)) - 1);
    __m512 s = load_scales16(sdt, scales, first + g, mask);
    if (count - g >= VW)
      _mm512_storeu_ps(out + g, _mm512_mul_ps(s, _mm512_loadu_ps(units + g)));
    else
      _mm512_mask_storeu_ps(out + g, mask,
                            _mm512_mul_ps(s, _mm512_maskz_loadu_ps(mask, units + g)));
  }
  _mm_storeu_ps(out + count, _mm_setzero_ps());
}

/* acc + lanes of sum_g biases[row, g] * sums[g]: the bias half of the affine factorisation, exact
 * f32, joined to the row's lane sums before their one horizontal sum. */
INLINE __m512 add_bias_dot(const ci_matmul_job *job, ci_dtype sdt, int64_t row, const float *sums,
                           int64_t n_groups, __m512 acc) {
  for (int64_t g = 0; g < n_groups; g += VW) {
    __mmask16 mask = n_groups - g >= VW ? 0xffff : (__mmask16)((1u << (n_groups - g)) - 1);
    __m512 biases = load_scales16(sdt, job->biases, row * n_groups + g, mask);
    acc = _mm512_fmadd_ps(biases, _mm512_maskz_loadu_ps(mask, sums + g), acc);
  }
  return acc;
}

/* Per-lane factors of a super block whose first group's factor is f[0]. */
INLINE __m512 lane_factors(const int8_consts *kc, const float *f) {
  if (kc->groups_per_super == 1) return _mm512_set1_ps(f[0]);
  return _mm512_permutexvar_ps(kc->lane_group, _mm512_castps128_ps512(_mm_loadu_ps(f)));
}

/* One super block (a group, or a 64-byte code block holding several groups) of one weight row
 * (its codes at w) against xb x rows: total[i] += lane sums of code * x, scaled by the groups'
 * factors. `bytes` < 64 loads a last, partial code block under a mask (then blocks_per_super
 * is 1); the planes past k are 0. */
INLINE void super_block(const int8_consts *kc, const uint8_t *w, const int8_t *planes,
                        int64_t plane_stride, int xb, int bytes, float *const factors[X_BLOCK],
                        int64_t group, __m512 total[X_BLOCK]) {
  const int n_nibbles = kc->bits == 8 ? 1 : 2; /* 4-bit: low and high nibble vectors */
  const int64_t plane_bytes = kc->plane_block / 3;
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  __m512i acc[X_BLOCK][3]; /* per x row, the h, m and l plane sums */
#pragma GCC unroll 2
  for (int i = 0; i < xb; i++) acc[i][0] = acc[i][1] = acc[i][2] = _mm512_setzero_si512();
#pragma GCC unroll 2
  for (int b = 0; b < kc->blocks_per_super; b++) {
    const uint8_t *p = w + 64 * b;
    __m512i raw;
    if (bytes == 64) {
      _mm_prefetch((const char *)p + PREFETCH_BYTES, _MM_HINT_T0);
      raw = _mm512_loadu_si512(p);
    } else {
      raw = _mm512_maskz_loadu_epi8(((__mmask64)1 << bytes) - 1, p);
    }
    __m512i codes[2];
    if (kc->bits == 8) {
      codes[0] = raw;
    } else {
      codes[0] = _mm512_and_si512(raw, nibble);
      codes[1] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nibble);
    }
    const int8_t *block = planes + b * kc->plane_block;
#pragma GCC unroll 2
    for (int q = 0; q < n_nibbles; q++)
#pragma GCC unroll 2
      for (int i = 0; i < xb; i++)
#pragma GCC unroll 3
        for (int p3 = 0; p3 < kc->n_planes; p3++)
          acc[i][p3] = _mm512_dpbusd_epi32(
              acc[i][p3], codes[q],
              _mm512_load_si512(block + i * plane_stride + p3 * plane_bytes + 64 * q));
  }
#pragma GCC unroll 2
  for (int i = 0; i < xb; i++) {
    __m512 dot;
    if (kc->n_planes == 1) {
      dot = _mm512_cvtepi32_ps(acc[i][0]);
    } else if (kc->n_planes == 2) {
      dot = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(acc[i][0], 8), acc[i][1]));
    } else if (kc->bits == 4) {
      /* |sum| <= 8 * 15 * 128 per lane, so 65536 h + 256 m + l fits in int32 */
      __m512i hm = _mm512_add_epi32(_mm512_slli_epi32(acc[i][0], 8), acc[i][1]);
      dot = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(hm, 8), acc[i][2]));
    } else {
      /* |sum| <= 8 * 255 * 128 per lane (two blocks): 256 h + m fits in int32, l joins in
       * f32 (256 * t is exact) */
      __m512i hm = _mm512_add_epi32(_mm512_slli_epi32(acc[i][0], 8), acc[i][1]);
      dot = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hm), _mm512_set1_ps(256.0f),
                            _mm512_cvtepi32_ps(acc[i][2]));
    }
    total[i] = _mm512_fmadd_ps(dot, lane_factors(kc, factors[i] + group), total[i]);
  }
}

/* y[i0:i0+xb, r:r+rb] for an affine weight from the int8 x planes. Factors s_g * u_g are made
 * a chunk of columns at a time; the bias term is added per output at the end. */
INLINE void gemv_int8_block(const ci_matmul_job *job, ci_dtype sdt, int64_t r, int rb, int64_t i0,
                            int xb, const int8_consts *kc) {
  const int64_t k = job->k, row_bytes = k * kc->bits / 8;
  const int8_t *planes = job->x_planes + i0 * job->x_plane_stride;
  _Alignas(64) float factor_store[ROW_BLOCK][X_BLOCK][SCALE_CHUNK / 32 + 4];
  float *factors[ROW_BLOCK][X_BLOCK];
  __m512 total[ROW_BLOCK][X_BLOCK];
  /* the first chunk's factors of every row before any row's walk, so that the walk's first loads
   * of them do not wait on the stores that made them (made right before each row's walk, q4 rows
   * of 1152 and 2048 columns took 14-18% longer in cache on one Zen 4 core; the full vectors are
   * stored unmasked for the same reason: masked stores do not forward to loads) */
  const int64_t first_chunk_groups = (k < SCALE_CHUNK ? k : SCALE_CHUNK) >> kc->group_shift;
  for (int j = 0; j < rb; j++)
    for (int i = 0; i < xb; i++) {
      factors[j][i] = factor_store[j][i];
      make_factors(sdt, job->scales, (r + j) * kc->n_groups,
                   job->x_plane_units + (i0 + i) * kc->n_groups, first_chunk_groups, factors[j][i]);
    }
  const int64_t super_bytes = (int64_t)kc->super_cols * kc->bits / 8;
  const int64_t super_planes = kc->blocks_per_super * kc->plane_block;
#pragma GCC unroll 4
  for (int j = 0; j < rb; j++) {
    /* one row at a time, each row's chunks in order, so that its codes are one sequential stream
     * (the rows' 64-byte blocks interleaved, four streams, decoded 1B q4 at 44-45 tok/s and q8 at
     * 26-28 on 2 Zen 4 cores; row by row 48-50 and 31-35; a row of more than SCALE_CHUNK columns
     * walked chunk by chunk over the four rows, the down projections read at ~30-35 GB/s against
     * ~40-47 for the others); each row's sums keep their order, so the bits are the same.
     * The walk carries its pointers (codes, planes, group index): computed from the column,
     * the addresses took a third of the loop's instructions (34 -> 22 per q4 block). */
#pragma GCC unroll 2
    for (int i = 0; i < xb; i++) total[j][i] = _mm512_setzero_ps();
    const uint8_t *codes = (const uint8_t *)job->w + (r + j) * row_bytes;
    for (int64_t chunk = 0; chunk < k; chunk += SCALE_CHUNK) {
      int64_t chunk_end = k - chunk < SCALE_CHUNK ? k : chunk + SCALE_CHUNK;
      int64_t first_group = chunk >> kc->group_shift;
      int64_t chunk_groups = (chunk_end - chunk) >> kc->group_shift;
      if (chunk > 0)
        for (int i = 0; i < xb; i++)
          make_factors(sdt, job->scales, (r + j) * kc->n_groups + first_group,
                       job->x_plane_units + (i0 + i) * kc->n_groups + first_group, chunk_groups,
                       factors[j][i]);
      const int8_t *block_planes = planes + chunk / kc->cols_per_block * kc->plane_block;
      const int64_t n_full = (chunk_end - chunk) / kc->super_cols;
      int64_t group = 0;
      /* two super blocks an iteration: by count from the source, the loop's pointer and counter
       * updates are ~4 of a q4 block's ~19 instructions (fast precision, 2 Zen 4 threads,
       * alternating pairs: 1B q4 decode +8.3%, Gemma q4 +5%, q8 +4.8%; same bits) */
#pragma GCC unroll 2
      for (int64_t s = 0; s < n_full; s++) {
        super_block(kc, codes, block_planes, job->x_plane_stride, xb, 64, factors[j], group,
                    total[j]);
        codes += super_bytes;
        block_planes += super_planes;
        group += kc->groups_per_super;
      }
      const int64_t c = chunk + n_full * kc->super_cols;
      if (c < chunk_end) { /* last, partial code block of the row (SCALE_CHUNK is whole blocks) */
        super_block(kc, codes, block_planes, job->x_plane_stride, xb,
                    (int)((chunk_end - c) * kc->bits / 8), factors[j], group, total[j]);
        codes += (chunk_end - c) * kc->bits / 8;
      }
    }
  }
  for (int i = 0; i < xb; i++)
    for (int j = 0; j < rb; j++) {
      const float *sums = job->x_group_sums + (i0 + i) * kc->n_groups;
      job->y[(i0 + i) * job->n + r + j] =
          _mm512_reduce_add_ps(add_bias_dot(job, sdt, r + j, sums, kc->n_groups, total[j][i]));
    }
}

/* Prefetches the scales and biases of weight rows [r, r + rb) into L1. They are streams of
 * their own, read once per row at the start (factors) and the end (bias term) of the row's
 * work, so without this each row block waits on their misses: 20% of a q4 decode's time on
 * Zen 4 (perf, llama1b q4, 2 threads). */
INLINE void prefetch_row_factors(const ci_matmul_job *job, ci_dtype sdt, int64_t r, int rb,
                                 int64_t n_groups) {
  const int64_t size = sdt == CI_F32 ? 4 : 2, bytes = rb * n_groups * size;
  const char *scales = (const char *)job->scales + r * n_groups * size;
  const char *biases = (const char *)job->biases + r * n_groups * size;
  for (int64_t b = 0; b < bytes; b += 64) {
    _mm_prefetch(scales + b, _MM_HINT_T0);
    _mm_prefetch(biases + b, _MM_HINT_T0);
  }
}

/* All x rows against weight rows [r, r+rb), x rows in blocks of X_BLOCK. */
INLINE void gemv_int8_row_block(const ci_matmul_job *job, ci_dtype sdt, int64_t r, int rb,
                                const int8_consts *kc) {
  int64_t i = 0;
  for (; i + X_BLOCK <= job->m; i += X_BLOCK) gemv_int8_block(job, sdt, r, rb, i, X_BLOCK, kc);
  if (i < job->m) gemv_int8_block(job, sdt, r, rb, i, 1, kc);
}

/* Prefetches the first PREFETCH_BYTES of the codes of rows [row_begin, row_end) into L1: the
 * walk prefetches PREFETCH_BYTES ahead of itself, so without this a task's first 32 KiB (half of
 * a 64 KiB task, all of a 16-row one) waits on its misses one demand load at a time. On 2 Zen 4
 * cores, 1B geometry decode (8 tasks per matrix, the K and V projections 64 KiB each): q4 +2 to
 * +13% (six alternating pairs), q8 level; into L2 instead of L1 about half the q4 gain. */
INLINE void prefetch_task_head(const ci_matmul_job *job, int bits, int64_t row_begin,
                               int64_t row_end) {
  const int64_t row_bytes = job->k * bits / 8;
  int64_t head = (row_end - row_begin) * row_bytes;
  if (head > PREFETCH_BYTES) head = PREFETCH_BYTES;
  const char *start = (const char *)job->w + row_begin * row_bytes;
  for (int64_t b = 0; b < head; b += 64) _mm_prefetch(start + b, _MM_HINT_T0);
}

/* Weight rows [row_begin, row_end) in blocks of ROW_BLOCK, the leftover rows one by one, for
 * a compile-time format and group size. */
INLINE void gemv_int8_rows_planes(const ci_matmul_job *job, ci_weight_format f, int group,
                                  int n_planes, int64_t row_begin, int64_t row_end) {
  ci_dtype sdt = ci_weight_format_scale_dtype(f);
  const int8_consts kc =
      make_consts(job, ci_weight_format_dtype(f) == CI_Q8 ? 8 : 4, group, n_planes);
  int64_t r = row_begin;
  prefetch_task_head(job, kc.bits, row_begin, row_end);
  if (r + ROW_BLOCK <= row_end) prefetch_row_factors(job, sdt, r, ROW_BLOCK, kc.n_groups);
  for (; r + ROW_BLOCK <= row_end; r += ROW_BLOCK) {
    /* the next block's factors load while this block streams its codes */
    if (r + 2 * ROW_BLOCK <= row_end)
      prefetch_row_factors(job, sdt, r + ROW_BLOCK, ROW_BLOCK, kc.n_groups);
    gemv_int8_row_block(job, sdt, r, ROW_BLOCK, &kc);
  }
  for (; r < row_end; r++) gemv_int8_row_block(job, sdt, r, 1, &kc);
}

/* gemv_int8_rows_planes for the job's plane count (2 or 3), as a compile-time constant. (A
 * one-plane instantiation is not built: fast precision uses two, see FAST_X_PLANES in matmul.c,
 * and every instantiation multiplies this file's compile time.) */
INLINE void gemv_int8_rows_group(const ci_matmul_job *job, ci_weight_format f, int group,
                                 int64_t row_begin, int64_t row_end) {
  if (job->x_plane_count == 2)
    gemv_int8_rows_planes(job, f, group, 2, row_begin, row_end);
  else
    gemv_int8_rows_planes(job, f, group, 3, row_begin, row_end);
}

/* Row kernel template: one instantiation per group size (32, 64 or 128, checked by the
 * dispatcher). */
INLINE void gemv_int8_rows(const ci_matmul_job *job, ci_weight_format f, int64_t row_begin,
                           int64_t row_end) {
  switch (job->group) {
  case 32:
    gemv_int8_rows_group(job, f, 32, row_begin, row_end);
    break;
  case 64:
    gemv_int8_rows_group(job, f, 64, row_begin, row_end);
    break;
  default:
    gemv_int8_rows_group(job, f, 128, row_begin, row_end);
    break;
  }
}

/* ==== Activation quantization ==== */

/* Splits 16 values into the h, m, l planes (16 bytes each): p = x * inv with |p| <= 127
 * (+ rounding), h = round(p), then the remainder (exact through the FMA, to 2^-25) in two
 * rounded steps of 1/256; a rounded step of +128 carries into the plane above so that every
 * plane fits in int8. */
INLINE void split16(__m512 x, __m512 inv, __m128i out[3]) {
  enum { nearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC };
  const __m512 c256 = _mm512_set1_ps(256.0f), c128 = _mm512_set1_ps(128.0f);
  const __m512 one = _mm512_set1_ps(1.0f);
  __m512 h = _mm512_roundscale_ps(_mm512_mul_ps(x, inv), nearest);
  __m512 r = _mm512_mul_ps(_mm512_fmsub_ps(x, inv, h), c256); /* in [-128, 128] */
  __m512 mid = _mm512_roundscale_ps(r, nearest);
  __m512 l = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_sub_ps(r, mid), c256), nearest);
  __mmask16 carry = _mm512_cmp_ps_mask(l, c128, _CMP_EQ_OQ);
  l = _mm512_mask_sub_ps(l, carry, l, c256);
  mid = _mm512_mask_add_ps(mid, carry, mid, one);
  carry = _mm512_cmp_ps_mask(mid, c128, _CMP_EQ_OQ); /* then r > 0, so h <= 126 */
  mid = _mm512_mask_sub_ps(mid, carry, mid, c256);
  h = _mm512_mask_add_ps(h, carry, h, one);
  out[0] = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(h));
  out[1] = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(mid));
  out[2] = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(l));
}

/* The h plane alone of 16 values: round(x * inv), |x * inv| <= 127. */
INLINE __m128i round16(__m512 x, __m512 inv) {
  enum { nearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC };
  return _mm512_cvtepi32_epi8(
      _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(x, inv), nearest)));
}

/* The n_planes (1, 2 or 3) planes of 16 values. */
INLINE void planes16(__m512 x, __m512 inv, int n_planes, __m128i out[3]) {
  if (n_planes == 1)
    out[0] = round16(x, inv);
  else
    split16(x, inv, out); /* 2 planes: h and m of the three, l dropped */
}

/* Writes one group (columns c0..c0+group of the row whose planes start at row_planes) in
 * n_planes planes and returns its unit: 0 for an all-zero group, NaN for one holding Inf or NaN
 * (planes 0). */
INLINE float quantize_group(const float *x, int group, int64_t c0, int bits, int8_t *row_planes,
                            int n_planes) {
  __m512 max = _mm512_setzero_ps();
  __mmask16 finite = 0xffff;
  for (int j = 0; j < group; j += VW) {
    __m512 a = _mm512_abs_ps(_mm512_loadu_ps(x + j));
    finite &= _mm512_cmp_ps_mask(a, _mm512_set1_ps(__builtin_inff()), _CMP_LT_OQ);
    max = _mm512_max_ps(max, a);
  }
  if (finite != 0xffff) return __builtin_nanf("");
  float m = _mm512_reduce_max_ps(max);
  if (m == 0.0f) return 0.0f;
  /* scale tiny groups up (exactly) so that 127 / max stays finite */
  float pre = m < 0x1p-60f ? 0x1p100f : 1.0f;
  float inv_s = 127.0f / (m * pre);
  __m512 inv = _mm512_set1_ps(inv_s), prev = _mm512_set1_ps(pre);
  int64_t block_bytes = bits == 8 ? CI_X_PLANE_BLOCK_Q8 : CI_X_PLANE_BLOCK_Q4;
  int64_t plane_bytes = block_bytes / 3;
  if (bits == 8) {
    for (int j = 0; j < group; j += VW) {
      int64_t c = c0 + j;
      int8_t *at = row_planes + c / 64 * block_bytes + c % 64;
      __m128i out[3];
      planes16(_mm512_mul_ps(_mm512_loadu_ps(x + j), prev), inv, n_planes, out);
      for (int p = 0; p < n_planes; p++)
        _mm_storeu_si128((__m128i *)(at + p * plane_bytes), out[p]);
    }
  } else {
    const __m512i even =
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    for (int j = 0; j < group; j += 2 * VW) { /* 32 columns: 16 low and 16 high nibbles */
      int64_t c = c0 + j;
      int8_t *at = row_planes + c / 128 * block_bytes + c % 128 / 2;
      __m512 a = _mm512_mul_ps(_mm512_loadu_ps(x + j), prev);
      __m512 b = _mm512_mul_ps(_mm512_loadu_ps(x + j + VW), prev);
      __m128i lo[3], hi[3];
      planes16(_mm512_permutex2var_ps(a, even, b), inv, n_planes, lo);
      planes16(_mm512_permutex2var_ps(a, odd, b), inv, n_planes, hi);
      for (int p = 0; p < n_planes; p++) {
        _mm_storeu_si128((__m128i *)(at + p * plane_bytes), lo[p]);
        _mm_storeu_si128((__m128i *)(at + p * plane_bytes + 64), hi[p]);
      }
    }
  }
  /* x ~ (h + m/256 + l/65536) / (inv_s * pre), or h / (inv_s * pre) */
  return (float)(1.0 / ((double)inv_s * pre *
                        (n_planes == 1   ? 1.0
                         : n_planes == 2 ? 256.0
                                         : 65536.0)));
}

/* The AVX-512 quantizer of ci_matmul_kernels.quantize_x_planes (uses no VNNI itself). */
void ci_quantize_x_planes_avx512(int8_t *planes, float *units, const float *x, int64_t m, int64_t k,
                                 int group, int bits, int64_t stride, int n_planes) {
  int64_t n_groups = k / group;
  for (int64_t i = 0; i < m; i++) {
    int8_t *row = planes + i * stride;
    __builtin_memset(row, 0, (size_t)stride); /* padding, and groups left 0 */
    for (int64_t g = 0; g < n_groups; g++)
      units[i * n_groups + g] =
          n_planes == 1   ? quantize_group(x + i * k + g * group, group, g * group, bits, row, 1)
          : n_planes == 2 ? quantize_group(x + i * k + g * group, group, g * group, bits, row, 2)
                          : quantize_group(x + i * k + g * group, group, g * group, bits, row, 3);
  }
}

/* ==== Instantiation ==== */

#define DEFINE_INT8_KERNEL(suffix, format)                                                         \
  static void gemv_int8_##suffix(const ci_matmul_job *job, int64_t row_begin, int64_t row_end,     \
                                 float *scratch) {                                                 \
    gemv_int8_rows(job, format, row_begin, row_end);                                               \
  }

DEFINE_INT8_KERNEL(q8_f32, CI_WF_Q8_F32)
DEFINE_INT8_KERNEL(q8_f16, CI_WF_Q8_F16)
DEFINE_INT8_KERNEL(q8_bf16, CI_WF_Q8_BF16)
DEFINE_INT8_KERNEL(q4_f32, CI_WF_Q4_F32)
DEFINE_INT8_KERNEL(q4_f16, CI_WF_Q4_F16)
DEFINE_INT8_KERNEL(q4_bf16, CI_WF_Q4_BF16)

const ci_matmul_rows_fn ci_matmul_gemv_int8_avx512_vnni[CI_WF_COUNT] = {
    [CI_WF_Q8_F32] = gemv_int8_q8_f32,   [CI_WF_Q8_F16] = gemv_int8_q8_f16,
    [CI_WF_Q8_BF16] = gemv_int8_q8_bf16, [CI_WF_Q4_F32] = gemv_int8_q4_f32,
    [CI_WF_Q4_F16] = gemv_int8_q4_f16,   [CI_WF_Q4_BF16] = gemv_int8_q4_bf16,
};
