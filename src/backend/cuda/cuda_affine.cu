/* MLX affine weights on the CUDA backend: the upload (codes repacked into the tensor-core fragment
 * order and each group's scale and bias packed into one word, see cuda_affine.cuh), the
 * dequantisation of weight rows to bf16 that precedes cuBLASLt for larger batches, and embedding
 * lookups in affine tables. */
#include "backend/cuda/cuda_affine.cuh"
#include "backend/cuda/cuda_internal.h"

#include <stdlib.h>

enum { THREADS = 256 };

/* Thread i writes word i of the repacked codes (cuda_affine.cuh). */
__global__ static void repack_kernel(const uint8_t *raw, int bits, int64_t n, int64_t k,
                                     int64_t words, uint32_t *out) {
  ci_grid_begin();
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < words;
       i += (int64_t)gridDim.x * blockDim.x)
    out[i] = ci_affine_repacked_word(raw, bits, n, k, i);
}

static unsigned grid_for(int64_t n) {
  int64_t b = (n + THREADS - 1) / THREADS;
  return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

/* The codes of t in the device layout: the checkpoint's bytes go up as they are, a kernel
 * repacks them into a weight allocation, the staging copy is freed. */
static void *upload_codes(ci_cuda *cu, const ci_tensor *t, int bits, int64_t n, int64_t k) {
  const size_t raw_bytes = (size_t)(n * k * bits / 8), bytes = ci_affine_code_bytes(n, k, bits);
  void *raw = ci_cuda_malloc(cu, raw_bytes);
  if (!raw) return NULL;
  void *codes = NULL;
  /* on the backend's stream: a copy on the legacy stream is not ordered before the repacking
   * kernel (the stream does not block), which then read codes the copy had not landed yet */
  cudaError_t err = cudaMemcpyAsync(raw, t->data, raw_bytes, cudaMemcpyHostToDevice, cu->stream);
  if (err == cudaSuccess && (codes = ci_cuda_alloc_weight(cu, bytes))) {
    const int64_t words = (int64_t)(bytes / 4);
    ci_launch(cu, repack_kernel, grid_for(words), THREADS, 0, (const uint8_t *)raw, bits, n, k,
              words, (uint32_t *)codes);
    err = cudaGetLastError();
    if (err == cudaSuccess) err = cudaStreamSynchronize(cu->stream);
  }
  cudaFree(raw);
  if (err != cudaSuccess) {
    ci_cuda_fail(cu, err, "weight repacking");
    return NULL;
  }
  return codes;
}

int ci_cuda_affine_upload(ci_cuda *cu, ci_tensor *t) {
  const int bits = ci_tensor_bits(t);
  const int64_t n = t->ndim == 2 ? t->shape[0] : 0, k = t->ndim == 2 ? t->shape[1] : 0;
  if (t->ndim != 2 || n <= 0 || k <= 0)
    return ci_fail("CUDA: MLX %d-bit weights must be matrices", bits);
  if (t->scale_dtype != CI_BF16 && t->scale_dtype != CI_F16)
    return ci_fail("CUDA: MLX %d-bit weights with %s scales are not supported (bf16 or f16 only; "
                   "use --device cpu)",
                   bits, ci_dtype_get(t->scale_dtype)->name);
  const int gs = t->group_size;
  if ((gs != 32 && gs != 64 && gs != 128 && gs != 256) || k % gs)
    return ci_fail("CUDA: MLX weight with %lld columns in groups of %d (the GPU takes groups of "
                   "32, 64, 128 or 256 that divide the row; use --device cpu)",
                   (long long)k, gs);
  const int64_t groups = k / gs, tiles = ci_affine_tiles(n);
  const size_t n_pairs = (size_t)(tiles * groups * 16);
  uint32_t *pairs = (uint32_t *)calloc(n_pairs, sizeof *pairs);
  if (!pairs) return ci_fail("out of memory");
  const uint16_t *scales = (const uint16_t *)t->scales, *biases = (const uint16_t *)t->biases;
  for (int64_t r = 0; r < n; r++)
    for (int64_t g = 0; g < groups; g++)
      pairs[ci_affine_pair_index(r, g, groups)] =
          (uint32_t)scales[r * groups + g] | (uint32_t)biases[r * groups + g] << 16;
  void *codes = upload_codes(cu, t, bits, n, k);
  void *packed = codes ? ci_cuda_upload_weight(cu, pairs, n_pairs * sizeof *pairs) : NULL;
  free(pairs);
  if (!packed) return CI_ERR;
  t->data = codes;
  t->scales = packed;
  t->biases = NULL;
  return CI_OK;
}

/* A block of DQ_STEPS warps per (tile, DQ_STEPS consecutive k-steps): warp w computes its lanes'
 * fragment registers of step w (ci_affine_fragment, as the small-batch kernel does), the block
 * gathers the tile's 16 rows x 16 DQ_STEPS columns in shared memory and writes them to dst
 * ([rows][k] bf16, rows [row0, row0 + rows) of the matrix) in 16-byte row chunks. */
enum { DQ_STEPS = 8, DQ_COLS = 16 * DQ_STEPS, DQ_STRIDE = DQ_COLS + 8 };

template <int BITS>
__global__ static void __launch_bounds__(32 * DQ_STEPS)
    dequant_kernel(const uint8_t *codes, const uint32_t *pairs, int64_t row0, int64_t rows,
                   int64_t k, int group_size, int f16, uint16_t *dst) {
  ci_grid_begin();
  __shared__ __align__(16) uint16_t tile_rows[16 * DQ_STRIDE];
  const int64_t steps = k / 16, quads = ci_affine_quads(k), groups = k / group_size;
  const int64_t tile0 = row0 / 16, tiles = (row0 + rows + 15) / 16 - tile0;
  const int64_t spans = (steps + DQ_STEPS - 1) / DQ_STEPS;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  for (int64_t unit = blockIdx.x; unit < tiles * spans; unit += gridDim.x) {
    const int64_t tile = tile0 + unit / spans, step0 = (unit % spans) * DQ_STEPS;
    const int64_t step = step0 + warp;
    if (step < steps) {
      const int s = (int)(step % 4);
      const uint8_t *block = codes + (tile * quads + step / 4) * ci_affine_quad_bytes(BITS);
      uint32_t words[2];
      if (BITS == 4) {
        words[0] = *(const uint32_t *)(block + lane * 16 + s * 4);
      } else {
        const uint2 v = *(const uint2 *)(block + (s / 2) * 512 + lane * 16 + (s % 2) * 8);
        words[0] = v.x;
        words[1] = v.y;
      }
      const int64_t pair0 = (tile * groups + step * 16 / group_size) * 16;
      const ci_affine_rows rows_of =
          ci_affine_rows_of<BITS>(pairs[pair0 + g], pairs[pair0 + g + 8], f16);
      uint32_t a[4];
      ci_affine_fragment<BITS>(words, rows_of, f16, a);
#pragma unroll
      for (int j = 0; j < 4; j++)
        *(uint32_t *)&tile_rows[(g + 8 * (j & 1)) * DQ_STRIDE + 16 * warp + 8 * (j >> 1) + 2 * t] =
            a[j];
    }
    __syncthreads();
    for (int c = threadIdx.x; c < 16 * (DQ_COLS / 8); c += blockDim.x) {
      const int r = c / (DQ_COLS / 8), chunk = c % (DQ_COLS / 8);
      const int64_t out_row = tile * 16 + r - row0, col = step0 * 16 + 8 * chunk;
      if (out_row >= 0 && out_row < rows && col < k)
        *(uint4 *)&dst[out_row * k + col] = *(const uint4 *)&tile_rows[r * DQ_STRIDE + 8 * chunk];
    }
    __syncthreads();
  }
}

void ci_cuda_affine_dequant(ci_cuda *cu, const ci_cuda_weight *w, int64_t row0, int64_t rows,
                            int64_t k, void *dst) {
  const int64_t units =
      ((row0 + rows + 15) / 16 - row0 / 16) * ((k / 16 + DQ_STEPS - 1) / DQ_STEPS);
  const unsigned grid = (unsigned)(units < 65536 ? units : 65536);
  const uint8_t *codes = (const uint8_t *)w->data;
  const uint32_t *pairs = (const uint32_t *)w->pairs;
  if (w->dtype == CI_Q4)
    ci_launch(cu, dequant_kernel<4>, grid, 32 * DQ_STEPS, 0, codes, pairs, row0, rows, k,
              w->group_size, w->f16_pairs, (uint16_t *)dst);
  else
    ci_launch(cu, dequant_kernel<8>, grid, 32 * DQ_STEPS, 0, codes, pairs, row0, rows, k,
              w->group_size, w->f16_pairs, (uint16_t *)dst);
  ci_cuda_check_launch(cu, "weight dequantisation");
}

__global__ static void affine_embed_kernel(const uint8_t *codes, const uint32_t *pairs, int bits,
                                           int64_t dim, int group_size, int f16, const int32_t *ids,
                                           int64_t n, float *out) {
  ci_grid_begin();
  const int64_t quads = ci_affine_quads(dim), groups = dim / group_size;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * dim;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = ids[i / dim], c = i % dim;
    int shift;
    const int64_t at = ci_affine_code_offset(bits, quads, r, c, &shift);
    const uint32_t q = (codes[at] >> shift) & ((1u << bits) - 1u);
    float s, b;
    ci_affine_unpack(pairs[ci_affine_pair_index(r, c / group_size, groups)], f16, &s, &b);
    out[i] = __fadd_rn(__fmul_rn(s, (float)q), b);
  }
}

void ci_cuda_affine_embed(ci_cuda *cu, const ci_cuda_weight *table, int64_t dim, const int32_t *ids,
                          int64_t n, float *out) {
  const int bits = table->dtype == CI_Q4 ? 4 : 8;
  ci_launch(cu, affine_embed_kernel, grid_for(n * dim), THREADS, 0, (const uint8_t *)table->data,
            (const uint32_t *)table->pairs, bits, dim, table->group_size, table->f16_pairs, ids, n,
            out);
  ci_cuda_check_launch(cu, "embed");
}

extern "C" size_t ci_cuda_affine_code_bytes_host(int64_t n, int64_t k, int bits) {
  return ci_affine_code_bytes(n, k, bits);
}

extern "C" uint32_t ci_cuda_affine_repacked_word_host(const uint8_t *raw, int bits, int64_t n,
                                                      int64_t k, int64_t i) {
  return ci_affine_repacked_word(raw, bits, n, k, i);
}

extern "C" int64_t ci_cuda_affine_code_offset_host(int bits, int64_t k, int64_t r, int64_t c,
                                                   int *shift) {
  return ci_affine_code_offset(bits, ci_affine_quads(k), r, c, shift);
}
