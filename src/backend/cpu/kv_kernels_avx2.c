/* The AVX2 attention loop (8 lanes), for CPUs without AVX-512: the AVX-512 loop's design
 * (kv_kernels_avx512.c) at half the width. bf16 and f32 K/V rows are read in place (bf16 widened
 * by a shift); rows of the other codecs are decoded into the f32 tile first by the codec's row
 * decoder. Per block of keys and KV head: the scores of the G query heads as independent FMA
 * chains over D, 8 / G keys at a time so that one 8-way horizontal sum finishes all their chains;
 * the online softmax with a vector exp; the values weighed with each V chunk widened once for all
 * G heads. Each head's result depends on its own queries and rows only. */
#include "backend/cpu/kv_kernels.h"

#include "backend/cpu/avx2_lanes.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

enum {
  VW = 8,        /* floats per vector */
  MAX_G = 8,     /* query heads per KV head this loop takes (more: the reference loop) */
  MAX_BLOCK = 64 /* block tokens this loop takes */
};

/* How a block's rows are read: in place (bf16 or f32) or from the decoded tile. */
enum { ROWS_TILE, ROWS_BF16, ROWS_F32 };

/* Elements [8c, 8c + 8) of row r as f32. */
INLINE __m256 row_chunk(const float *tile, const uint8_t *rows, size_t row_bytes, int D, int r,
                        int c, int mode) {
  const uint8_t *row = rows + (size_t)r * row_bytes;
  if (mode == ROWS_BF16)
    return bf16x8_to_f32(_mm_loadu_si128((const __m128i *)(const void *)(row + 16 * c)));
  if (mode == ROWS_F32) return _mm256_loadu_ps((const float *)(const void *)row + VW * c);
  return _mm256_loadu_ps(tile + (size_t)r * D + VW * c);
}

/* The sums of 8 vectors: lane i holds the sum of v[i]'s lanes. */
INLINE __m256 reduce_add8(const __m256 v[8]) {
  const __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  /* u0: lane l (< 4) holds the low-half sum of v[l], lane 4 + l its high-half sum; u1 for v[4+] */
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* exp(x) for 8 lanes, x <= 0 (softmax arguments): the Cody-Waite reduction and degree-6
 * polynomial of activation.h (its constants), 2^n from exponent bits, inputs clamped to -87 (the
 * weights of such keys, about e^-87, vanish beside the maximum's 1). */
INLINE __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  __m256 n, r;
  const __m256 p = exp_poly_mm256(x, &n, &r);
  /* 2^n: -126 <= n <= 0 */
  return _mm256_mul_ps(
      _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f))),
      pow2_mm256(n));
}

/* One block of keys [j, j + count) for the G query heads of one KV head: scores, the online
 * softmax's update of out[g] = {max, sum, unnormalised output}, and the weighted values. G is a
 * compile-time constant after inlining (the accumulators below stay in registers). */
INLINE void attend_block(const ci_kv_kernels *k, const ci_paged_kv *kv, int kv_head,
                         const float *qp, const int G, int64_t j, int count, float scale,
                         float softcap, int mode_k, int mode_v, float *tile, float *out) {
  const int D = kv->head_dim, C = D / VW, T = kv->block_tokens;
  float *ktile = tile, *vtile = tile + (size_t)T * D;
  _Alignas(32) float scores[MAX_G][MAX_BLOCK + VW];
  const uint8_t *krow = ci_kv_row_at(kv, 0, j, kv_head), *vrow = ci_kv_row_at(kv, 1, j, kv_head);
  if (mode_k == ROWS_TILE)
    for (int r = 0; r < count; r++)
      k->decode_k(kv, krow + (size_t)r * kv->k_row_bytes, ktile + (size_t)r * D);
  if (mode_v == ROWS_TILE)
    for (int r = 0; r < count; r++)
      k->decode_v(kv, vrow + (size_t)r * kv->v_row_bytes, vtile + (size_t)r * D);
  /* Scores: chain (key kk, head g) in accumulator g * kb + kk, kb keys a batch */
  const int kb = VW / G;
  for (int r0 = 0; r0 < count; r0 += kb) {
    const int nk = count - r0 < kb ? count - r0 : kb;
    __m256 acc[VW];
    for (int a = 0; a < VW; a++) acc[a] = _mm256_setzero_ps();
    for (int c = 0; c < C; c++)
      for (int kk = 0; kk < kb; kk++) {
        if (kk >= nk) break;
        const __m256 key = row_chunk(ktile, krow, kv->k_row_bytes, D, r0 + kk, c, mode_k);
        for (int g = 0; g < G; g++)
          acc[g * kb + kk] =
              _mm256_fmadd_ps(_mm256_loadu_ps(qp + g * D + VW * c), key, acc[g * kb + kk]);
      }
    _Alignas(32) float sums[VW];
    _mm256_store_ps(sums, _mm256_mul_ps(reduce_add8(acc), _mm256_set1_ps(scale)));
    for (int g = 0; g < G; g++)
      for (int kk = 0; kk < nk; kk++) {
        float s = sums[g * kb + kk];
        if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
        scores[g][r0 + kk] = s;
      }
  }
  for (int g = 0; g < G; g++) /* the lanes past count of the last vector, read below */
    for (int r = count; r < (count + VW - 1) / VW * VW; r++) scores[g][r] = 0.0f;
  /* Softmax: each head's block maximum, its rescale of what came before, the weights */
  float rescale[MAX_G];
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int g = 0; g < G; g++) {
    float *o = out + g * (D + 2);
    float block_max = o[0];
    for (int r = 0; r < count; r++) block_max = scores[g][r] > block_max ? scores[g][r] : block_max;
    /* expf(0) = 1 when the maximum did not move (most blocks, once the walk is under way) */
    rescale[g] = o[1] > 0.0f ? (block_max > o[0] ? expf(o[0] - block_max) : 1.0f) : 0.0f;
    __m256 sum = _mm256_setzero_ps();
    for (int r = 0; r < count; r += VW) {
      const __m256 valid =
          _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(count - r), lane));
      const __m256 e = _mm256_and_ps(
          exp8(_mm256_sub_ps(_mm256_load_ps(scores[g] + r), _mm256_set1_ps(block_max))), valid);
      _mm256_store_ps(scores[g] + r, e);
      sum = _mm256_add_ps(sum, e);
    }
    o[0] = block_max;
    o[1] = o[1] * rescale[g] + sum_lanes(sum);
  }
  /* Weighted values: cn output chunks of every head at once, one FMA chain each over the keys */
  const int chunks = G <= 2 ? 4 : G <= 4 ? 2 : 1;
  for (int c0 = 0; c0 < C; c0 += chunks) {
    const int cn = C - c0 < chunks ? C - c0 : chunks;
    __m256 acc[VW];
    for (int g = 0; g < G; g++)
      for (int c = 0; c < cn; c++)
        acc[g * chunks + c] = _mm256_mul_ps(_mm256_loadu_ps(out + g * (D + 2) + 2 + VW * (c0 + c)),
                                            _mm256_set1_ps(rescale[g]));
    for (int r = 0; r < count; r++) {
      __m256 v[4];
      for (int c = 0; c < cn; c++)
        v[c] = row_chunk(vtile, vrow, kv->v_row_bytes, D, r, c0 + c, mode_v);
      for (int g = 0; g < G; g++) {
        const __m256 w = _mm256_broadcast_ss(&scores[g][r]);
        for (int c = 0; c < cn; c++)
          acc[g * chunks + c] = _mm256_fmadd_ps(w, v[c], acc[g * chunks + c]);
      }
    }
    for (int g = 0; g < G; g++)
      for (int c = 0; c < cn; c++)
        _mm256_storeu_ps(out + g * (D + 2) + 2 + VW * (c0 + c), acc[g * chunks + c]);
  }
}

/* Block by block, every KV head of a block before the next block (a block's rows of consecutive
 * heads are one contiguous run). */
INLINE void attend_impl(const ci_kv_kernels *k, const ci_paged_kv *kv, int head0, int n_heads,
                        const float *qp, const int G, int mode_k, int mode_v, int64_t lo,
                        int64_t hi, float scale, float softcap, float *scratch, float *out) {
  const int D = kv->head_dim, T = kv->block_tokens;
  for (int g = 0; g < n_heads * G; g++) {
    float *o = out + g * (D + 2);
    o[0] = -INFINITY;
    o[1] = 0.0f;
    memset(o + 2, 0, (size_t)D * sizeof(float));
  }
  for (int64_t j = lo; j < hi;) {
    const int64_t end = (j / T + 1) * T < hi ? (j / T + 1) * T : hi;
    for (int h = 0; h < n_heads; h++)
      attend_block(k, kv, head0 + h, qp + (size_t)h * G * D, G, j, (int)(end - j), scale, softcap,
                   mode_k, mode_v, scratch, out + (size_t)h * G * (D + 2));
    j = end;
  }
}

#define ATTEND_G(g)                                                                                \
  static __attribute__((noinline)) void attend_g##g(                                               \
      const ci_kv_kernels *k, const ci_paged_kv *kv, int head0, int n_heads, const float *qp,      \
      int mode_k, int mode_v, int64_t lo, int64_t hi, float scale, float softcap, float *scratch,  \
      float *out) {                                                                                \
    attend_impl(k, kv, head0, n_heads, qp, g, mode_k, mode_v, lo, hi, scale, softcap, scratch,     \
                out);                                                                              \
  }
ATTEND_G(1)
ATTEND_G(2)
ATTEND_G(4)
ATTEND_G(8)
#undef ATTEND_G

static int rows_mode(const ci_paged_kv *kv) {
  switch (kv->format.codec) {
  case CI_KV_BF16:
    return ROWS_BF16;
  case CI_KV_F32:
    return ROWS_F32;
  default:
    return ROWS_TILE;
  }
}

void ci_kv_attend_avx2(const ci_kv_kernels *k, const ci_paged_kv *kv, int head0, int n_heads,
                       const float *qp, int G, int64_t lo, int64_t hi, float scale, float softcap,
                       float *scratch, float *out) {
  if (G > MAX_G || kv->block_tokens > MAX_BLOCK || kv->head_dim % VW) {
    ci_kv_attend_ref(k, kv, head0, n_heads, qp, G, lo, hi, scale, softcap, scratch, out);
    return;
  }
  const int mode = rows_mode(kv);
  switch (G) {
  case 1:
    attend_g1(k, kv, head0, n_heads, qp, mode, mode, lo, hi, scale, softcap, scratch, out);
    return;
  case 2:
    attend_g2(k, kv, head0, n_heads, qp, mode, mode, lo, hi, scale, softcap, scratch, out);
    return;
  case 4:
    attend_g4(k, kv, head0, n_heads, qp, mode, mode, lo, hi, scale, softcap, scratch, out);
    return;
  case 8:
    attend_g8(k, kv, head0, n_heads, qp, mode, mode, lo, hi, scale, softcap, scratch, out);
    return;
  default:
    attend_impl(k, kv, head0, n_heads, qp, G, mode, mode, lo, hi, scale, softcap, scratch, out);
  }
}
