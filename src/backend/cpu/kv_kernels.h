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

#endif
