/* MLX affine weights on the CUDA backend: the upload (codes as they are, each group's scale and
 * bias packed into one word, see cuda_affine.cuh), the dequantisation of weight rows to bf16 that
 * precedes cuBLASLt for larger batches, and embedding lookups in affine tables. */
#include "backend/cuda/cuda_affine.cuh"
#include "backend/cuda/cuda_internal.h"

#include <stdlib.h>

enum { THREADS = 256 };

int ci_cuda_affine_upload(ci_cuda *cu, ci_tensor *t) {
  const int bits = ci_tensor_bits(t);
  const int64_t n = t->ndim == 2 ? t->shape[0] : 0, k = t->ndim == 2 ? t->shape[1] : 0;
  if (t->ndim != 2 || n <= 0 || k <= 0)
    return ci_fail("CUDA: MLX %d-bit weights must be matrices", bits);
  if (t->scale_dtype != CI_BF16 && t->scale_dtype != CI_F16)
    return ci_fail("CUDA: MLX %d-bit weights with %s scales are not supported (bf16 or f16 only; "
                   "use --device cpu)",
                   bits, ci_dtype_get(t->scale_dtype)->name);
  if (t->group_size <= 0 || k % t->group_size || k % 32)
    return ci_fail("CUDA: MLX weight with %lld columns in groups of %d", (long long)k,
                   t->group_size);
  const int64_t groups = k / t->group_size, words = ci_affine_pair_words(k, t->group_size);
  uint32_t *pairs = (uint32_t *)calloc((size_t)(n * words), sizeof *pairs);
  if (!pairs) return ci_fail("out of memory");
  const uint16_t *scales = (const uint16_t *)t->scales, *biases = (const uint16_t *)t->biases;
  for (int64_t r = 0; r < n; r++)
    for (int64_t g = 0; g < groups; g++)
      pairs[r * words + g] = (uint32_t)scales[r * groups + g] | (uint32_t)biases[r * groups + g]
                                                                    << 16;
  void *codes = ci_cuda_upload_weight(cu, t->data, (size_t)(n * k * bits / 8));
  void *packed =
      codes ? ci_cuda_upload_weight(cu, pairs, (size_t)(n * words) * sizeof *pairs) : NULL;
  free(pairs);
  if (!packed) return CI_ERR;
  t->data = codes;
  t->scales = packed;
  t->biases = NULL;
  return CI_OK;
}

/* One thread per eight weights: dst[r][8i, 8i + 8). */
template <int BITS>
__global__ static void dequant_kernel(const uint8_t *codes, const uint32_t *pairs, int64_t row0,
                                      int64_t rows, int64_t k, int group_size, int64_t pair_words,
                                      int f16, uint4 *dst) {
  const int64_t per_row = k / 8;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * per_row;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = row0 + i / per_row, c8 = i % per_row;
    const uint8_t *src = codes + (r * k + 8 * c8) * BITS / 8;
    uint32_t word[2];
    word[0] = *(const uint32_t *)src;
    if (BITS == 8) word[1] = *(const uint32_t *)(src + 4);
    const uint32_t pair = pairs[r * pair_words + 8 * c8 / group_size];
    dst[i] = ci_affine_dequant8<BITS>(word, pair, f16);
  }
}

static unsigned grid_for(int64_t n) {
  int64_t b = (n + THREADS - 1) / THREADS;
  return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

void ci_cuda_affine_dequant(ci_cuda *cu, const ci_cuda_weight *w, int64_t row0, int64_t rows,
                            int64_t k, void *dst) {
  const int64_t words = ci_affine_pair_words(k, w->group_size), units = rows * (k / 8);
  const uint8_t *codes = (const uint8_t *)w->data;
  const uint32_t *pairs = (const uint32_t *)w->pairs;
  if (w->dtype == CI_Q4)
    dequant_kernel<4><<<grid_for(units), THREADS, 0, cu->stream>>>(
        codes, pairs, row0, rows, k, w->group_size, words, w->f16_pairs, (uint4 *)dst);
  else
    dequant_kernel<8><<<grid_for(units), THREADS, 0, cu->stream>>>(
        codes, pairs, row0, rows, k, w->group_size, words, w->f16_pairs, (uint4 *)dst);
  ci_cuda_check_launch(cu, "weight dequantisation");
}

__global__ static void affine_embed_kernel(const uint8_t *codes, const uint32_t *pairs, int bits,
                                           int64_t dim, int group_size, int64_t pair_words, int f16,
                                           const int32_t *ids, int64_t n, float *out) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * dim;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = ids[i / dim], c = i % dim;
    const int64_t bit = (r * dim + c) * bits;
    const uint32_t q = (codes[bit / 8] >> (bit % 8)) & ((1u << bits) - 1u);
    float s, b;
    ci_affine_unpack(pairs[r * pair_words + c / group_size], f16, &s, &b);
    out[i] = __fadd_rn(__fmul_rn(s, (float)q), b);
  }
}

void ci_cuda_affine_embed(ci_cuda *cu, const ci_cuda_weight *table, int64_t dim, const int32_t *ids,
                          int64_t n, float *out) {
  const int bits = table->dtype == CI_Q4 ? 4 : 8;
  affine_embed_kernel<<<grid_for(n * dim), THREADS, 0, cu->stream>>>(
      (const uint8_t *)table->data, (const uint32_t *)table->pairs, bits, dim, table->group_size,
      ci_affine_pair_words(dim, table->group_size), table->f16_pairs, ids, n, out);
  ci_cuda_check_launch(cu, "embed");
}
