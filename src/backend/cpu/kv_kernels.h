/* Attention inner loops over stored KV rows, one set per codec (kv.md §2): scores against
 * encoded K rows and weighted sums of encoded V rows, computed on the encoded form — never a
 * decoded copy of the cache. Rotated codecs score in the rotated basis (the query is rotated once
 * in `prepare`) and un-rotate the output once in `finish`. */
#ifndef CI_BACKEND_CPU_KV_KERNELS_H
#define CI_BACKEND_CPU_KV_KERNELS_H

#include "backend/cpu/kernels.h"

typedef struct ci_kv_kernels ci_kv_kernels;

struct ci_kv_kernels {
  const ci_cpu_vec_kernels *vec; /* the ISA's bf16 loops */
  /* qp[0 .. 2D) = the query prepared for `dot` (copy, group sums, or rotation). */
  void (*prepare)(const ci_kv_kernels *k, const ci_paged_kv *kv, const float *q, float *qp);
  /* <q, decoded K row> from the prepared query. */
  float (*dot)(const ci_kv_kernels *k, const ci_paged_kv *kv, const float *qp, const uint8_t *row);
  /* acc += a * decoded V row (in the rotated basis for rotated V codecs). */
  void (*axpy)(const ci_kv_kernels *k, const ci_paged_kv *kv, float *acc, float a,
               const uint8_t *row);
  /* out = acc mapped back to the model basis (acc may be clobbered). */
  void (*finish)(const ci_kv_kernels *k, const ci_paged_kv *kv, float *acc, float *out);
};

/* The kernels for kv->format on `isa`. */
ci_kv_kernels ci_cpu_kv_kernels(ci_isa isa, const ci_kv_format *format);

/* Encodes n_rows K/V rows into the paged KV at positions pos (the kv_store op); bf16 uses the
 * ISA's conversion loop. Returns CI_OK, or CI_ERR for a position without a block. */
int ci_cpu_kv_store(ci_isa isa, const ci_paged_kv *kv, const float *k, const float *v,
                    const int32_t *pos, int n_rows);

/* Address of the stored row of (position, kv head). */
static inline uint8_t *ci_kv_row_at(const ci_paged_kv *kv, int value, int64_t position, int head) {
  const int32_t block = kv->block_table[position / kv->block_tokens];
  const int64_t slot = position % kv->block_tokens;
  uint8_t *base = value ? kv->v_base : kv->k_base;
  const size_t block_bytes = value ? kv->v_block_bytes : kv->k_block_bytes;
  const size_t row_bytes = value ? kv->v_row_bytes : kv->k_row_bytes;
  return base + (size_t)block * block_bytes +
         (size_t)((int64_t)head * kv->block_tokens + slot) * row_bytes;
}

#endif
