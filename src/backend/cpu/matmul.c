/* Matmul dispatch: checks the weight, prepares the activations once per call (group sums,
 * word-lane order, int8 planes, GEMM panels), picks the ISA's row or panel kernel, and splits
 * the output rows over the thread pool. */
#include "backend/cpu/kernels_impl.h"

#include "base/error.h"

#include <math.h>
#include <stdlib.h>

/* Below this many multiply-adds per task, splitting the work costs more than it saves. */
enum { MIN_MACS_PER_TASK = 1 << 17 };
/* Tasks per thread: enough to balance uneven threads, few enough to be cheap to hand out. */
enum { TASKS_PER_THREAD = 4 };
/* Row chunks of the row kernels are multiples of this (their row blocks are 4). */
enum { GEMV_ROW_UNIT = 16 };

/* Per-call state shared by the tasks of one matmul. */
typedef struct {
  const ci_matmul_job *job;
  ci_matmul_rows_fn rows_fn;
  int64_t rows_per_task;
  float *scratch;        /* n_threads * scratch_stride floats */
  size_t scratch_stride; /* floats per thread, a multiple of 16 */
} matmul_tasks;

/* Pool task: one chunk of output rows. */
static void run_matmul_task(void *ctx, int task, int thread) {
  const matmul_tasks *tasks = ctx;
  int64_t begin = (int64_t)task * tasks->rows_per_task;
  int64_t end = begin + tasks->rows_per_task;
  if (end > tasks->job->n) end = tasks->job->n;
  float *scratch = tasks->scratch ? tasks->scratch + (size_t)thread * tasks->scratch_stride : NULL;
  tasks->rows_fn(tasks->job, begin, end, scratch);
}

/* The kernel table of an ISA. */
static const ci_matmul_kernels *kernels_for(ci_isa isa) {
  switch (isa) {
  case CI_ISA_AVX2:
    return ci_matmul_kernels_avx2();
  case CI_ISA_AVX512:
    return ci_matmul_kernels_avx512();
  default:
    return ci_matmul_kernels_ref();
  }
}

/* Checks the weight tensor; fills n, k and the format. Returns CI_OK or CI_ERR. */
static int check_weight(const ci_tensor *w, int64_t *n, int64_t *k, ci_weight_format *format) {
  if (w->ndim < 2 || w->ndim > CI_MAX_DIMS) return ci_fail("matmul: weight must be 2-D");
  int64_t rows = 1;
  for (int d = 0; d < w->ndim - 1; d++) rows *= w->shape[d];
  *n = rows;
  *k = w->shape[w->ndim - 1];
  if (*n < 0 || *k < 1) return ci_fail("matmul: bad weight shape");
  int f = ci_weight_format_of(w->dtype, w->scale_dtype);
  if (f < 0) {
    if (ci_dtype_is_affine(w->dtype))
      return ci_fail("matmul: unsupported scale dtype %s", ci_dtype_get(w->scale_dtype)->name);
    return ci_fail("matmul: unsupported weight dtype %s", ci_dtype_get(w->dtype)->name);
  }
  *format = (ci_weight_format)f;
  if (!w->data) return ci_fail("matmul: weight has no data");
  if (ci_dtype_is_affine(w->dtype)) {
    if (w->group_size != 32 && w->group_size != 64 && w->group_size != 128)
      return ci_fail("matmul: unsupported group size %d", w->group_size);
    if (*k % w->group_size)
      return ci_fail("matmul: K %lld not a multiple of group size %d", (long long)*k,
                     w->group_size);
    if (!w->scales || !w->biases) return ci_fail("matmul: affine weight lacks scales/biases");
  }
  return CI_OK;
}

/* Writes x in word-lane order (see ci_matmul_kernels.word_lanes) for `bits`-bit codes. */
static void to_word_lane_order(float *dst, const float *x, int64_t m, int64_t k, int lanes,
                               int bits) {
  int codes_per_word = 32 / bits;
  int64_t block = (int64_t)lanes * codes_per_word;
  float code_scale[8]; /* 2^-(bits*t), exact; 1 for the top code */
  for (int t = 0; t < codes_per_word; t++)
    code_scale[t] = t < codes_per_word - 1 ? ldexpf(1.0f, -bits * t) : 1.0f;
  for (int64_t i = 0; i < m; i++) {
    const float *src = x + i * k;
    float *out = dst + i * k;
    for (int64_t c = 0; c < k; c += block) {
      int64_t block_lanes = k - c >= block ? lanes : (k - c) / codes_per_word;
      for (int64_t j = 0; j < block_lanes; j++)
        for (int t = 0; t < codes_per_word; t++)
          out[c + block_lanes * t + j] = src[c + codes_per_word * j + t] * code_scale[t];
    }
  }
}

/* sums[i, g] = sum of group g of x row i, in 8 interleaved partial sums (a serial sum would
 * be latency-bound; group sizes are multiples of 8). */
static void sum_groups(float *sums, const float *x, int64_t m, int64_t k, int group) {
  int64_t n_groups = k / group;
  for (int64_t i = 0; i < m * n_groups; i++) {
    const float *g = x + i * group;
    float partial[8] = {0};
    for (int j = 0; j < group; j += 8)
      for (int l = 0; l < 8; l++) partial[l] += g[j + l];
    sums[i] = ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
              ((partial[4] + partial[5]) + (partial[6] + partial[7]));
  }
}

/* Panel packing job: x [m, k] into panels of mr rows, [ceil(m/mr)][k][mr], zero past row m. */
typedef struct {
  float *dst;
  const float *x;
  int64_t m, k;
  int mr;
} x_panel_packing;

/* Pool task: packs panel `task`. */
static void pack_x_panel(void *ctx, int task, int thread) {
  const x_panel_packing *p = ctx;
  float *panel = p->dst + (int64_t)task * p->k * p->mr;
  for (int r = 0; r < p->mr; r++) {
    int64_t row = (int64_t)task * p->mr + r;
    const float *src = p->x + row * p->k;
    for (int64_t c = 0; c < p->k; c++) panel[c * p->mr + r] = row < p->m ? src[c] : 0.0f;
  }
}

/* 64-byte aligned allocation of n floats (at least one), or NULL. */
static float *alloc_floats(size_t n) {
  size_t bytes = (n * sizeof(float) + 63) & ~(size_t)63;
  return aligned_alloc(64, bytes ? bytes : 64);
}

/* Chooses the row chunk per task: a multiple of `unit`, about TASKS_PER_THREAD chunks per
 * thread, none smaller than MIN_MACS_PER_TASK of work. */
static int64_t rows_per_task_for(int64_t n, int64_t macs_per_row, int n_threads, int64_t unit) {
  if (n_threads <= 1) return n > 0 ? n : 1;
  int64_t units = (n + unit - 1) / unit;
  int64_t n_tasks = (int64_t)n_threads * TASKS_PER_THREAD;
  int64_t by_work = n * macs_per_row / MIN_MACS_PER_TASK;
  if (n_tasks > by_work) n_tasks = by_work;
  if (n_tasks > units) n_tasks = units;
  if (n_tasks < 1) n_tasks = 1;
  int64_t units_per_task = (units + n_tasks - 1) / n_tasks;
  return units_per_task * unit;
}

/* The matmul, with the panel (GEMM) kernels allowed or not. */
static int matmul(ci_threadpool *pool, ci_isa isa, const ci_tensor *w, const float *x, int64_t m,
                  float *y, int allow_panels) {
  if (!w || (m > 0 && (!x || !y))) return ci_fail("matmul: NULL argument");
  if ((unsigned)isa >= CI_ISA_COUNT || !ci_isa_supported(isa))
    return ci_fail("matmul: ISA %s not supported on this CPU", ci_isa_name(isa));
  int64_t n = 0, k = 0;
  ci_weight_format format = CI_WF_F32;
  if (check_weight(w, &n, &k, &format) != CI_OK) return CI_ERR;
  if (m < 0) return ci_fail("matmul: negative row count");
  if (m == 0 || n == 0) return CI_OK;

  const ci_matmul_kernels *kernels = kernels_for(isa);
  ci_dtype dtype = w->dtype;
  int affine = ci_dtype_is_affine(dtype);
  ci_matmul_rows_fn gemm =
      allow_panels && m >= kernels->gemm_min_m[format] ? kernels->gemm[format] : NULL;
  int int8 = affine && !gemm && kernels->gemv_int8 && kernels->gemv_int8[format] &&
             kernels->quantize_x_planes && ci_cpu_int8_matmul_enabled();
  ci_matmul_rows_fn gemv_int8 = int8 ? kernels->gemv_int8[format] : NULL;
  ci_matmul_job job = {
      .format = format,
      .n = n,
      .k = k,
      .w = w->data,
      .scales = w->scales,
      .biases = w->biases,
      .group = affine ? w->group_size : 0,
      .m = m,
      .x = x,
      .y = y,
  };

  /* Activation preparation, each buffer O(m*k): tiny next to the O(m*n*k) product. */
  float *x_word_lanes = NULL, *group_sums = NULL, *x_packed = NULL, *scratch = NULL;
  float *plane_units = NULL;
  int8_t *x_planes = NULL;
  int n_threads = pool ? ci_threadpool_size(pool) : 1;
  size_t scratch_stride = (kernels->scratch_floats + 15) & ~(size_t)15;
  int status = CI_OK;
  if (gemv_int8) {
    int bits = ci_tensor_bits(w);
    int64_t cols_per_block = bits == 8 ? 64 : 128;
    int64_t stride = (k + cols_per_block - 1) / cols_per_block *
                     (bits == 8 ? CI_X_PLANE_BLOCK_Q8 : CI_X_PLANE_BLOCK_Q4);
    x_planes = aligned_alloc(64, (size_t)(m * stride)); /* stride is a multiple of 64 */
    plane_units = alloc_floats((size_t)(m * (k / job.group)));
    if (!x_planes || !plane_units) goto out_of_memory;
    kernels->quantize_x_planes(x_planes, plane_units, x, m, k, job.group, bits, stride);
    job.x_planes = x_planes;
    job.x_plane_stride = stride;
    job.x_plane_units = plane_units;
  } else if (affine && kernels->word_lanes && !gemm) {
    x_word_lanes = alloc_floats((size_t)(m * k));
    if (!x_word_lanes) goto out_of_memory;
    to_word_lane_order(x_word_lanes, x, m, k, kernels->word_lanes, ci_tensor_bits(w));
    job.x = x_word_lanes;
  }
  if (affine && !gemm) { /* the panel kernels dequantize, so need no group sums */
    group_sums = alloc_floats((size_t)(m * (k / job.group)));
    if (!group_sums) goto out_of_memory;
    sum_groups(group_sums, x, m, k, job.group);
    job.x_group_sums = group_sums;
  }
  if (gemm) {
    int mr = kernels->gemm_mr;
    x_packed = alloc_floats((size_t)((m + mr - 1) / mr * mr * k));
    if (!x_packed) goto out_of_memory;
    x_panel_packing packing = {.dst = x_packed, .x = x, .m = m, .k = k, .mr = mr};
    int n_panels = (int)((m + mr - 1) / mr);
    if (pool)
      ci_threadpool_run(pool, n_panels, pack_x_panel, &packing);
    else
      for (int p = 0; p < n_panels; p++) pack_x_panel(&packing, p, 0);
    job.x_packed = x_packed;
  }
  if (gemm && scratch_stride) {
    scratch = alloc_floats(scratch_stride * (size_t)n_threads);
    if (!scratch) goto out_of_memory;
  }

  matmul_tasks tasks = {
      .job = &job,
      .rows_fn = gemm        ? gemm
                 : gemv_int8 ? gemv_int8
                             : kernels->gemv[format],
      .rows_per_task =
          rows_per_task_for(n, m * k, n_threads, gemm ? kernels->gemm_nr : GEMV_ROW_UNIT),
      .scratch = scratch,
      .scratch_stride = scratch_stride,
  };
  int n_tasks = (int)((n + tasks.rows_per_task - 1) / tasks.rows_per_task);
  if (pool && n_tasks > 1)
    ci_threadpool_run(pool, n_tasks, run_matmul_task, &tasks);
  else
    for (int t = 0; t < n_tasks; t++) run_matmul_task(&tasks, t, 0);
  goto done;

out_of_memory:
  status = ci_fail("matmul: out of memory preparing activations (m=%lld, k=%lld)", (long long)m,
                   (long long)k);
done:
  free(x_word_lanes);
  free(x_planes);
  free(plane_units);
  free(group_sums);
  free(x_packed);
  free(scratch);
  return status;
}

int ci_cpu_matmul(ci_threadpool *pool, ci_isa isa, const ci_tensor *w, const float *x, int64_t m,
                  float *y) {
  return matmul(pool, isa, w, x, m, y, 1);
}

int ci_cpu_matmul_rows(ci_threadpool *pool, ci_isa isa, const ci_tensor *w, const float *x,
                       int64_t m, float *y) {
  return matmul(pool, isa, w, x, m, y, 0);
}
