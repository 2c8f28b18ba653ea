/* Reference matmul kernels in plain C: the definition every SIMD kernel is tested against.
 * Straightforward loops, f32 accumulation, affine formats through the per-group factorisation
 * s_g * sum(q*x) + b_g * sum(x). */
#include "backend/cpu/kernels_impl.h"

/* Code c of a packed row of `bits`-bit codes (LSB-first bit stream in u32 words). */
static inline uint32_t packed_code(const uint32_t *row, int bits, int64_t c) {
  int64_t bit = c * bits;
  return (row[bit >> 5] >> (bit & 31)) & ((1u << bits) - 1);
}

/* sum_c x[c] * W[r, c] for a float-format row. */
static float dot_float_row(ci_dtype dtype, const void *w, int64_t r, const float *x, int64_t k) {
  float sum = 0.0f;
  for (int64_t c = 0; c < k; c++) sum += x[c] * ci_float_at(dtype, w, (size_t)(r * k + c));
  return sum;
}

/* sum_c x[c] * W[r, c] for an affine row, one group at a time. */
static float dot_affine_row(const ci_matmul_job *job, int bits, ci_dtype scale_dtype, int64_t r,
                            const float *x, const float *x_group_sums) {
  int64_t words_per_row = job->k * bits / 32;
  const uint32_t *row = (const uint32_t *)job->w + r * words_per_row;
  int64_t n_groups = job->k / job->group;
  float sum = 0.0f;
  for (int64_t g = 0; g < n_groups; g++) {
    float codes_dot_x = 0.0f;
    for (int64_t c = g * job->group; c < (g + 1) * job->group; c++)
      codes_dot_x += (float)packed_code(row, bits, c) * x[c];
    float scale = ci_float_at(scale_dtype, job->scales, (size_t)(r * n_groups + g));
    float bias = ci_float_at(scale_dtype, job->biases, (size_t)(r * n_groups + g));
    sum += scale * codes_dot_x + bias * x_group_sums[g];
  }
  return sum;
}

/* y[:, row_begin:row_end] for any format, one (x row, weight row) pair at a time. */
static void ref_rows(const ci_matmul_job *job, int64_t row_begin, int64_t row_end, float *scratch) {
  ci_dtype dtype = ci_weight_format_dtype(job->format);
  ci_dtype scale_dtype = ci_weight_format_scale_dtype(job->format);
  int64_t n_groups = ci_dtype_is_affine(dtype) ? job->k / job->group : 0;
  for (int64_t i = 0; i < job->m; i++) {
    const float *x = job->x + i * job->k;
    for (int64_t r = row_begin; r < row_end; r++) {
      float value;
      if (ci_dtype_is_affine(dtype))
        value = dot_affine_row(job, dtype == CI_Q8 ? 8 : 4, scale_dtype, r, x,
                               job->x_group_sums + i * n_groups);
      else
        value = dot_float_row(dtype, job->w, r, x, job->k);
      job->y[i * job->n + r] = value;
    }
  }
}

const ci_matmul_kernels *ci_matmul_kernels_ref(void) {
  static const ci_matmul_kernels kernels = {
      .gemv = {ref_rows, ref_rows, ref_rows, ref_rows, ref_rows, ref_rows, ref_rows, ref_rows,
               ref_rows},
      .gemm = {0},
      .gemm_min_m = {INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX,
                     INT64_MAX, INT64_MAX},
      .word_lanes = 0,
  };
  return &kernels;
}
