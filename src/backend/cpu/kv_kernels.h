/* Attention inner loops over stored KV rows, one set per codec (docs/kv-cache.md §2). Each stored
 * row is decoded into a D-float register tile inside the kernel (never a decoded copy of the
 * cache) and scored against every query head of its GQA group (or accumulated for each), so a row
 * is read and decoded once per step. Rotated codecs stay in the rotated basis: the query is rotated
 * once in `prepare` and the output un-rotated once in `finish`. */
#ifndef CI_BACKEND_CPU_KV_KERNELS_H
#define CI_BACKEND_CPU_KV_KERNELS_H

#include "backend/cpu/kernels.h"

typedef struct ci_kv_kernels ci_kv_kernels;

/* Attends the G query heads of each KV head in [head0, head0 + n_heads) over keys [lo, hi)
 * with an online softmax, block by block: qp[n_heads][G][D] are the prepared queries; scratch is
 * ci_kv_attend_scratch_floats floats, 64-byte aligned. Writes out[h][g] = {max score, sum of
 * exp(score - max), unnormalised output[D]} in the accumulation basis. Each head's result
 * does not depend on head0 and n_heads. */
typedef void (*ci_kv_attend_fn)(const ci_kv_kernels *k, const ci_paged_kv *kv, int head0,
                                int n_heads, const float *qp, int G, int64_t lo, int64_t hi,
                                float scale, float softcap, float *scratch, float *out);

/* The decoded K and V tile of one block (the first floats of the scratch). */
static inline int64_t ci_kv_attend_tile_floats(const ci_paged_kv *kv) {
  return 2 * (int64_t)kv->block_tokens * kv->head_dim;
}

/* Scratch of an attend call over query_heads = n_heads x G query heads: the tile, the queries
 * rounded to bf16 (or as int16, the same bytes) and 16 floats a query head (the int16 queries'
 * scale and group sums). */
static inline int64_t ci_kv_attend_scratch_floats(int block_tokens, int head_dim, int query_heads) {
  return 2 * (int64_t)block_tokens * head_dim + (int64_t)query_heads * head_dim / 2 +
         (int64_t)query_heads * 16 + 16;
}

struct ci_kv_kernels {
  const ci_cpu_vec_kernels *vec; /* the ISA's f32/bf16 loops */
  ci_kv_attend_fn attend;        /* the ISA's attention loop */
  /* qp[0 .. D) = the query in the basis K rows decode to. */
  void (*prepare)(const ci_paged_kv *kv, const float *q, float *qp);
  /* x[0 .. D) = a K row in the scoring basis. */
  void (*decode_k)(const ci_paged_kv *kv, const uint8_t *row, float *x);
  /* x[0 .. D) = a V row in the accumulation basis. */
  void (*decode_v)(const ci_paged_kv *kv, const uint8_t *row, float *x);
  /* out = acc mapped back to the model basis (acc may be clobbered). */
  void (*finish)(const ci_paged_kv *kv, float *acc, float *out);
  /* Fast precision, bf16 K/V rows, AVX512-BF16 and D a multiple of 32: the AVX-512 loop scores
   * q rounded to bf16 against the stored K rows and weighs the stored V rows by the softmax
   * weights rounded to bf16, both with vdpbf16ps (the products exact, f32 sums), about half the
   * instructions of widening each row to f32. */
  int bf16_dots;
  /* Fast precision, AVX512-VNNI, D <= 256, and affine 8-bit rows (groups of 32 or more) or 4-bit
   * rows (groups of 64 or more, D a multiple of 64), or TurboQuant with 4-bit K or V rows (D a
   * multiple of 64): the AVX-512 loop multiplies the codes (TurboQuant: their codebook entries x
   * 2048) as 16-bit integers (vpdpwssd) by q and by the softmax weights, each quantised to int16
   * (15 bits, more than bf16's 8), and applies each key's scale and bias (its norm) to the
   * integer sums. */
  int int_dots;
};

/* The kernels for `format` rows of head_dim D on `isa` in `precision`. */
ci_kv_kernels ci_cpu_kv_kernels(ci_isa isa, const ci_kv_format *format, int head_dim,
                                ci_precision precision);

/* AVX-512 row decoders for the formats that have one (NULL otherwise); used by
 * ci_cpu_kv_kernels. */
typedef void (*ci_kv_row_decoder)(const ci_paged_kv *kv, const uint8_t *row, float *x);
ci_kv_row_decoder ci_kv_decoder_avx512(const ci_kv_format *format, int value);

/* The attention loops: plain C (any D), AVX2 (D a multiple of 8, G <= 8, blocks of up to 64
 * tokens; bf16/f32 rows in place, the other codecs through their row decoders) and AVX-512 (D a
 * multiple of 16, G <= 8). Outside its shapes each falls back to the plain-C loop. */
void ci_kv_attend_ref(const ci_kv_kernels *k, const ci_paged_kv *kv, int head0, int n_heads,
                      const float *qp, int G, int64_t lo, int64_t hi, float scale, float softcap,
                      float *scratch, float *out);
void ci_kv_attend_avx2(const ci_kv_kernels *k, const ci_paged_kv *kv, int head0, int n_heads,
                       const float *qp, int G, int64_t lo, int64_t hi, float scale, float softcap,
                       float *scratch, float *out);
void ci_kv_attend_avx512(const ci_kv_kernels *k, const ci_paged_kv *kv, int head0, int n_heads,
                         const float *qp, int G, int64_t lo, int64_t hi, float scale, float softcap,
                         float *scratch, float *out);

/* The AMX-BF16 loop for bf16 K/V rows in fast precision (kv_attend_amx.c); shapes it does not
 * take (softcaps, G > 8, D not a multiple of 32 or above 256, blocks under 16 keys) go to the
 * AVX-512 loop. */
void ci_kv_attend_amx(const ci_kv_kernels *k, const ci_paged_kv *kv, int head0, int n_heads,
                      const float *qp, int G, int64_t lo, int64_t hi, float scale, float softcap,
                      float *scratch, float *out);

/* Encodes n_rows K/V rows into the paged KV at positions pos (the kv_store op); bf16 uses the
 * ISA's conversion loop. Returns CI_OK, or CI_ERR for a position without a block. */
int ci_cpu_kv_store(ci_isa isa, const ci_paged_kv *kv, const float *k, const float *v,
                    const int32_t *pos, int n_rows);

#endif
