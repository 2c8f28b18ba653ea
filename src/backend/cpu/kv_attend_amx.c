/* The attention loop on AMX-BF16 tiles, for bf16 K/V rows in fast precision (Intel AMX,
 * Sapphire Rapids and later; used when ci_cpu_amx_enabled()).
 *
 * The AVX-512 loop (kv_kernels_avx512.c) spends most of its instructions on the scores: two
 * vdpbf16ps per (key, query head) at head_dim 64 and a 16-way horizontal sum for each. Here a
 * 16-key chunk of one KV head's rows is an A tile as it lies in the block (16 rows, 32 dims a
 * tile, the row stride of the cache) and the G queries of the head, rounded to bf16, are the B
 * tile (their dim pairs as rows): S^T = K Q^T in one TDPBF16PS per 32 dims, each score one chain
 * over the dims in order with f32 sums. The softmax runs on AVX-512 as in the other loop (per
 * chunk: the running maximum, the rescale of what came before, exp of the scores), and the
 * weights P, rounded to bf16, multiply the V rows in place too: a V chunk of 32 dims is a B tile
 * of 16 rows (the keys) by 16 dim pairs, and P enters twice as the A tile, once with each weight
 * in the low half of a pair and zero in the high half (the even dims' sums) and once the other
 * way round (the odd dims'). So neither K nor V is copied or reordered; the unnormalised output
 * is accumulated in its tiles straight in `out`, even dims and odd dims of each 32-dim chunk in
 * two runs of 16, put back in order when the call ends.
 *
 * A row's result depends on its own query and keys only (batch invariance): the chunks are fixed
 * 16-key ranges of the blocks, walked in order. A chunk with fewer than 16 keys of the range (the
 * range's ends, blocks of other sizes) is copied into a zero-padded scratch first, so that the
 * tiles never read a row outside the range (a released or unwritten row could hold NaN bits,
 * and 0 x NaN is NaN). Softcaps, more than 8 query heads per KV head, head_dim not a multiple of
 * 32 or above 256, and blocks under 16 keys go to the AVX-512 loop. */
#include "backend/cpu/amx_tiles.h"
#include "backend/cpu/avx512_exp.h"
#include "backend/cpu/kv_kernels.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

enum { CHUNK = 16, MAX_G = 8, MAX_D = 256 };

/* Tile registers (literal numbers: the intrinsics paste them into the instruction). */
#define T_S 0  /* scores: 16 keys x G heads, f32 */
#define T_K 1  /* 16 K rows x 32 dims (16 pairs), bf16 */
#define T_Q 2  /* 16 dim pairs x G heads, bf16 pairs */
#define T_PE 3 /* G heads x 16 (weight, 0) pairs */
#define T_PO 4 /* G heads x 16 (0, weight) pairs */
#define T_V 5  /* 16 V rows x 32 dims (16 pairs) */
#define T_OE 6 /* G heads x 16 even dims of a 32-dim chunk, f32 */
#define T_OO 7 /* G heads x 16 odd dims */

static void configure_tiles(int G) {
  ci_amx_tile_config config = ci_amx_config_empty();
  ci_amx_config_set(&config, T_S, CHUNK, 4 * G);
  ci_amx_config_set(&config, T_K, CHUNK, 64);
  ci_amx_config_set(&config, T_Q, CHUNK, 4 * G);
  ci_amx_config_set(&config, T_PE, G, 64);
  ci_amx_config_set(&config, T_PO, G, 64);
  ci_amx_config_set(&config, T_V, CHUNK, 64);
  ci_amx_config_set(&config, T_OE, G, 64);
  ci_amx_config_set(&config, T_OO, G, 64);
  ci_amx_load_config(&config);
}

/* The scratch (floats): the queries as B tiles at the offset the AVX-512 loop keeps its bf16
 * queries, and in the tile area the score tile, the two P tiles and the padded K and V chunks. */
typedef struct {
  uint32_t *q_tiles; /* [head][D / 32][16 pairs][G] */
  float *scores;     /* [16][G] */
  uint32_t *p_even;  /* [G][16] */
  uint32_t *p_odd;   /* [G][16] */
  uint16_t *k_pad;   /* [16][D] */
  uint16_t *v_pad;   /* [16][D] */
} scratch_layout;

static scratch_layout lay_out_scratch(const ci_paged_kv *kv, float *scratch) {
  /* the tile area holds 2 x block_tokens x D floats (block_tokens >= 16, D >= 32: the caller's
   * shapes), and this takes 3 x 128 + 16 D of them */
  const int D = kv->head_dim;
  scratch_layout s;
  s.q_tiles = (uint32_t *)(void *)(scratch + ci_kv_attend_tile_floats(kv));
  s.scores = scratch;
  s.p_even = (uint32_t *)(void *)(scratch + CHUNK * MAX_G);
  s.p_odd = s.p_even + MAX_G * CHUNK;
  s.k_pad = (uint16_t *)(void *)(s.p_odd + MAX_G * CHUNK);
  s.v_pad = s.k_pad + CHUNK * D;
  return s;
}

/* Scores of one chunk in head-major order: head[g] lane r = the score of key r for query head g
 * (scores stored as [16 keys][G]). */
static inline void scores_by_head(const float *scores, int G, __m512 head[MAX_G]) {
  if (G == 1) {
    head[0] = _mm512_loadu_ps(scores);
  } else if (G == 2) {
    const __m512 a = _mm512_loadu_ps(scores), b = _mm512_loadu_ps(scores + 16);
    const __m512i even =
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    head[0] = _mm512_permutex2var_ps(a, even, b);
    head[1] = _mm512_permutex2var_ps(a, _mm512_add_epi32(even, _mm512_set1_epi32(1)), b);
  } else if (G == 4) {
    /* v[i] holds keys 4i .. 4i + 3; t01 = heads {0, 1} (or {2, 3}) of keys 0-7, t23 of 8-15 */
    const __m512 v0 = _mm512_loadu_ps(scores), v1 = _mm512_loadu_ps(scores + 16);
    const __m512 v2 = _mm512_loadu_ps(scores + 32), v3 = _mm512_loadu_ps(scores + 48);
    const __m512i lo = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(2));
    const __m512 a01 = _mm512_permutex2var_ps(v0, lo, v1), b01 = _mm512_permutex2var_ps(v2, lo, v3);
    const __m512 a23 = _mm512_permutex2var_ps(v0, hi, v1), b23 = _mm512_permutex2var_ps(v2, hi, v3);
    head[0] = _mm512_shuffle_f32x4(a01, b01, 0x44);
    head[1] = _mm512_shuffle_f32x4(a01, b01, 0xEE);
    head[2] = _mm512_shuffle_f32x4(a23, b23, 0x44);
    head[3] = _mm512_shuffle_f32x4(a23, b23, 0xEE);
  } else {
    const __m512i rows =
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32(G));
    for (int g = 0; g < G; g++) head[g] = _mm512_i32gather_ps(rows, scores + g, 4);
  }
}

/* The next block's rows of the same head (what this head reads once the block's other heads are
 * done), prefetched into L2 a few lines at a time between the steps of a chunk's work (a double
 * share before the scores, one per query head's softmax, one per 32 dims of the values): issued
 * in one burst per chunk they wait for fill buffers and stall the loop. One thread at 16,384
 * positions (bench/attend_bench, Intel Xeon with AMX): 28 ns per key and KV head with one burst,
 * 24 in four groups, 21-22 spread like this, against 17 for the bytes alone at this core's read
 * rate and 9.7 for the arithmetic alone (rows in cache). */
typedef struct {
  const char *k, *v;       /* NULL: nothing to prefetch */
  size_t k_lines, v_lines; /* lines of K, then of V */
  size_t next;             /* the next line to prefetch */
  size_t per_step;         /* lines per step */
} prefetch_cursor;

static inline void prefetch_step(prefetch_cursor *c) {
  if (!c->k) return;
  for (size_t i = 0; i < c->per_step && c->next < c->k_lines + c->v_lines; i++, c->next++)
    _mm_prefetch(c->next < c->k_lines ? c->k + 64 * c->next : c->v + 64 * (c->next - c->k_lines),
                 _MM_HINT_T1);
}

/* One chunk of n <= 16 keys (rows krow / vrow on, strides k_stride / v_stride) for the G query
 * heads of one KV head: scores, the online softmax's update of out[g] = {max, sum, output in
 * even/odd order}, and the weighted values. */
static inline __attribute__((always_inline)) void
attend_chunk(const scratch_layout *s, const uint32_t *q_tiles, const int G, const int D,
             const uint8_t *krow, size_t k_stride, const uint8_t *vrow, size_t v_stride, int n,
             float scale, float *out, prefetch_cursor *ahead) {
  prefetch_step(ahead);
  prefetch_step(ahead);
  _tile_zero(T_S);
  for (int c = 0; c < D / 32; c++) {
    _tile_loadd(T_K, krow + 64 * c, k_stride);
    _tile_loadd(T_Q, q_tiles + c * CHUNK * G, 4 * G);
    _tile_dpbf16ps(T_S, T_K, T_Q);
  }
  _tile_stored(T_S, s->scores, 4 * G);
  __m512 head[MAX_G];
  scores_by_head(s->scores, G, head);
  const __mmask16 valid = n == CHUNK ? 0xffff : (__mmask16)((1u << n) - 1);
  int rescaled = 0;
  float rescale[MAX_G];
  for (int g = 0; g < G; g++) {
    prefetch_step(ahead);
    float *o = out + g * (D + 2);
    const __m512 sc = _mm512_mul_ps(head[g], _mm512_set1_ps(scale));
    /* the running maximum moves only when a score passes it (rarely, once the walk is under way):
     * a compare, and the reduction and expf only then (the same values as max + expf always) */
    const __mmask16 above = _mm512_mask_cmp_ps_mask(valid, sc, _mm512_set1_ps(o[0]), _CMP_GT_OQ);
    float new_max = o[0];
    rescale[g] = o[1] > 0.0f ? 1.0f : 0.0f;
    if (above) {
      new_max = _mm512_mask_reduce_max_ps(above, sc);
      rescale[g] = o[1] > 0.0f ? expf(o[0] - new_max) : 0.0f;
    }
    const __m512 e =
        _mm512_maskz_mov_ps(valid, ci_exp16(_mm512_sub_ps(sc, _mm512_set1_ps(new_max))));
    o[1] = o[1] * rescale[g] + _mm512_reduce_add_ps(e);
    o[0] = new_max;
    /* the weights as bf16 in the low (even) or high (odd) half of each pair */
    const __m512i p = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(e));
    _mm512_storeu_si512(s->p_even + g * CHUNK, p);
    _mm512_storeu_si512(s->p_odd + g * CHUNK, _mm512_slli_epi32(p, 16));
    rescaled |= rescale[g] != 1.0f;
  }
  if (rescaled)
    for (int g = 0; g < G; g++) {
      float *acc = out + g * (D + 2) + 2;
      const __m512 w = _mm512_set1_ps(rescale[g]);
      for (int d = 0; d < D; d += 16)
        _mm512_storeu_ps(acc + d, _mm512_mul_ps(_mm512_loadu_ps(acc + d), w));
    }
  _tile_loadd(T_PE, s->p_even, 64);
  _tile_loadd(T_PO, s->p_odd, 64);
  const size_t out_stride = (size_t)(D + 2) * sizeof(float);
  for (int c = 0; c < D / 32; c++) {
    float *acc = out + 2 + 32 * c;
    _tile_loadd(T_OE, acc, out_stride);
    _tile_loadd(T_OO, acc + 16, out_stride);
    _tile_loadd(T_V, vrow + 64 * c, v_stride);
    _tile_dpbf16ps(T_OE, T_PE, T_V);
    _tile_dpbf16ps(T_OO, T_PO, T_V);
    _tile_stored(T_OE, acc, out_stride);
    _tile_stored(T_OO, acc + 16, out_stride);
    prefetch_step(ahead);
  }
}

/* n rows of bf16 (row_bytes apart) into a dense [16][D] chunk, zero past n. */
static void pad_rows(const uint8_t *rows, size_t row_bytes, int n, int D, uint16_t *dst) {
  for (int r = 0; r < CHUNK; r++) {
    if (r < n)
      memcpy(dst + (size_t)r * D, rows + r * row_bytes, (size_t)D * 2);
    else
      memset(dst + (size_t)r * D, 0, (size_t)D * 2);
  }
}

static inline __attribute__((always_inline)) void
attend_amx(const ci_paged_kv *kv, int head0, int n_heads, const float *qp, const int G, const int D,
           int64_t lo, int64_t hi, float scale, float *scratch, float *out) {
  const int T = kv->block_tokens;
  const scratch_layout s = lay_out_scratch(kv, scratch);
  for (int g = 0; g < n_heads * G; g++) {
    float *o = out + g * (D + 2);
    o[0] = -INFINITY;
    o[1] = 0.0f;
    memset(o + 2, 0, (size_t)D * sizeof(float));
  }
  /* the queries rounded to bf16 as B tiles: per KV head and 32 dims, row p = dim pair p of
   * each of the G query heads */
  for (int h = 0; h < n_heads; h++)
    for (int g = 0; g < G; g++)
      for (int c = 0; c < D / 32; c++) {
        const float *q = qp + (size_t)(h * G + g) * D + 32 * c;
        uint32_t pairs[16];
        _mm512_storeu_si512(
            pairs, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(q + 16), _mm512_loadu_ps(q)));
        uint32_t *tile = s.q_tiles + ((size_t)h * (D / 32) + c) * CHUNK * G;
        for (int p = 0; p < 16; p++) tile[p * G + g] = pairs[p];
      }
  configure_tiles(G);
  for (int64_t j = lo; j < hi;) {
    const int64_t end = (j / T + 1) * T < hi ? (j / T + 1) * T : hi;
    for (int h = 0; h < n_heads; h++) {
      const uint8_t *krow = ci_kv_row_at(kv, 0, j, head0 + h);
      const uint8_t *vrow = ci_kv_row_at(kv, 1, j, head0 + h);
      const uint8_t *next_k = end < hi ? ci_kv_row_at(kv, 0, end, head0 + h) : NULL;
      const uint8_t *next_v = end < hi ? ci_kv_row_at(kv, 1, end, head0 + h) : NULL;
      const uint32_t *q_tiles = s.q_tiles + (size_t)h * (D / 32) * CHUNK * G;
      float *o = out + (size_t)h * G * (D + 2);
      for (int r0 = 0; r0 < end - j; r0 += CHUNK) {
        const int n = end - j - r0 < CHUNK ? (int)(end - j - r0) : CHUNK;
        prefetch_cursor ahead = {0};
        if (next_k) {
          ahead.k = (const char *)next_k + r0 * kv->k_row_bytes;
          ahead.v = (const char *)next_v + r0 * kv->v_row_bytes;
          ahead.k_lines = (n * kv->k_row_bytes + 63) / 64;
          ahead.v_lines = (n * kv->v_row_bytes + 63) / 64;
          const size_t steps = 2 + G + D / 32; /* prefetch_step calls in attend_chunk */
          ahead.per_step = (ahead.k_lines + ahead.v_lines + steps - 1) / steps;
        }
        const uint8_t *kc = krow + r0 * kv->k_row_bytes, *vc = vrow + r0 * kv->v_row_bytes;
        if (n == CHUNK) {
          attend_chunk(&s, q_tiles, G, D, kc, kv->k_row_bytes, vc, kv->v_row_bytes, n, scale, o,
                       &ahead);
        } else {
          pad_rows(kc, kv->k_row_bytes, n, D, s.k_pad);
          pad_rows(vc, kv->v_row_bytes, n, D, s.v_pad);
          attend_chunk(&s, q_tiles, G, D, (const uint8_t *)s.k_pad, (size_t)D * 2,
                       (const uint8_t *)s.v_pad, (size_t)D * 2, n, scale, o, &ahead);
        }
      }
    }
    j = end;
  }
  _tile_release();
  /* each 32-dim chunk from (16 even dims, 16 odd dims) back to dim order */
  const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i second = _mm512_add_epi32(first, _mm512_set1_epi32(8));
  for (int g = 0; g < n_heads * G; g++)
    for (int c = 0; c < D / 32; c++) {
      float *acc = out + g * (D + 2) + 2 + 32 * c;
      const __m512 even = _mm512_loadu_ps(acc), odd = _mm512_loadu_ps(acc + 16);
      _mm512_storeu_ps(acc, _mm512_permutex2var_ps(even, first, odd));
      _mm512_storeu_ps(acc + 16, _mm512_permutex2var_ps(even, second, odd));
    }
}

void ci_kv_attend_amx(const ci_kv_kernels *k, const ci_paged_kv *kv, int head0, int n_heads,
                      const float *qp, int G, int64_t lo, int64_t hi, float scale, float softcap,
                      float *scratch, float *out) {
  const int D = kv->head_dim;
  if (softcap > 0.0f || G > MAX_G || D % 32 || D > MAX_D || kv->block_tokens < CHUNK) {
    ci_kv_attend_avx512(k, kv, head0, n_heads, qp, G, lo, hi, scale, softcap, scratch, out);
    return;
  }
  /* constant shapes for the common cases (the loops over G and D unrolled) */
  if (G == 4 && D == 64)
    attend_amx(kv, head0, n_heads, qp, 4, 64, lo, hi, scale, scratch, out);
  else if (G == 4 && D == 128)
    attend_amx(kv, head0, n_heads, qp, 4, 128, lo, hi, scale, scratch, out);
  else if (G == 2 && D == 128)
    attend_amx(kv, head0, n_heads, qp, 2, 128, lo, hi, scale, scratch, out);
  else
    attend_amx(kv, head0, n_heads, qp, G, D, lo, hi, scale, scratch, out);
}
