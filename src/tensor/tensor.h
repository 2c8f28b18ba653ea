/* Tensor: a typed, shaped view of memory owned elsewhere (an mmap'd weight file, a backend
 * buffer). Row-major and contiguous; the last dimension varies fastest. */
#ifndef CI_TENSOR_TENSOR_H
#define CI_TENSOR_TENSOR_H

#include "tensor/dtype.h"

#include <stdint.h>

enum { CI_MAX_DIMS = 4, CI_MAX_HEAD_DIM = 4096 };
/* Most query heads sharing one KV head (grouped-query attention). */
enum { CI_MAX_GQA_GROUP = 64 };

typedef struct {
  ci_dtype dtype;
  int ndim;
  int64_t shape[CI_MAX_DIMS]; /* logical shape in elements: a linear weight is [out, in] */
  const void *data;           /* float elements, or for CI_Q8/CI_Q4 the packed u32 codes
                                 [out, in*bits/32], each row an LSB-first bit stream */
  /* MLX affine formats only (dtype CI_Q8 / CI_Q4): W[r,c] = scales[r,c/g]*q[r,c] + biases[r,c/g] */
  const void *scales;   /* [out, in/group_size] of scale_dtype */
  const void *biases;   /* [out, in/group_size] of scale_dtype */
  ci_dtype scale_dtype; /* CI_F32, CI_F16 or CI_BF16 */
  int group_size;       /* 32, 64 or 128 */
} ci_tensor;

/* Number of elements (product of the shape). */
static inline int64_t ci_tensor_numel(const ci_tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

/* Bits per element of the stored codes/elements (4 for CI_Q4, 16 for BF16, ...). */
static inline int ci_tensor_bits(const ci_tensor *t) {
  return ci_dtype_get(t->dtype)->bits;
}

static inline int ci_dtype_is_affine(ci_dtype d) {
  return d == CI_Q8 || d == CI_Q4;
}

#endif
