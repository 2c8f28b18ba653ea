/* Matmul dispatch: checks the weight, splits the activation rows into parts (a panel part per
 * segment large enough for the panel kernels, merged runs of row-kernel segments), prepares each
 * part's activations in scratch for its precision (group sums, word-lane order, int8 planes,
 * bf16 rows, GEMM panels of f32 or of bf16 pairs, bf16 rows in whole tiles for AMX), and
 * splits the weight rows over the thread pool so that every part uses each chunk of the weights
 * while it is in cache. */
#include "backend/cpu/kernels_impl.h"

#include "base/arena.h"
#include "base/error.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Below this many multiply-adds per task, splitting the work costs more than it saves. */
enum { MIN_MACS_PER_TASK = 1 << 17 };
/* Tasks per thread: enough to balance uneven threads, few enough to be cheap to hand out. */
enum { TASKS_PER_THREAD = 4 };
/* Row chunks of the row kernels are multiples of this (their row blocks are 4). */
enum { GEMV_ROW_UNIT = 16 };
/* The int8 planes of x the affine row kernels multiply in fast precision (exact: 3). One plane
 * (llama.cpp's Q8 activations) moved the starter model's held-out decode by a mean KL of 5e-3
 * nats and its perplexity by 0.5-1%, fifty times the bound fast precision keeps (1e-4, 0.1%);
 * two (16-bit fixed point per group) move it by 1e-7 and 0.002% (bench/numerics.md). */
enum { FAST_X_PLANES = 2 };
_Static_assert(FAST_X_PLANES == 2, "the VNNI row kernels are instantiated for 2 and 3 planes");

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

/* Runs fn over tasks [0, n) on the pool, or one after another on this thread without one. */
static void run_tasks(ci_threadpool *pool, int n, ci_task_fn fn, void *ctx) {
  if (pool)
    ci_threadpool_run(pool, n, fn, ctx);
  else
    for (int t = 0; t < n; t++) fn(ctx, t, 0);
}

/* Panel packing job: x [m, k] into panels of mr rows, [ceil(m/mr)][k][mr], zero past row m;
 * with round_bf16 each value rounded to bf16 (as round_rows_bf16) on the way. */
typedef struct {
  float *dst;
  const float *x;
  int64_t m, k;
  int mr;
  int round_bf16;
} x_panel_packing;

/* Pool task: packs panel `task`. */
static void pack_x_panel(void *ctx, int task, int thread) {
  const x_panel_packing *p = ctx;
  float *panel = p->dst + (int64_t)task * p->k * p->mr;
  for (int r = 0; r < p->mr; r++) {
    int64_t row = (int64_t)task * p->mr + r;
    const float *src = p->x + row * p->k;
    if (row >= p->m)
      for (int64_t c = 0; c < p->k; c++) panel[c * p->mr + r] = 0.0f;
    else if (p->round_bf16)
      for (int64_t c = 0; c < p->k; c++)
        panel[c * p->mr + r] = ci_bf16_to_f32(ci_f32_to_bf16(src[c]));
    else
      for (int64_t c = 0; c < p->k; c++) panel[c * p->mr + r] = src[c];
  }
}

/* Pool task: packs panel `task` of x rounded to bf16 as column pairs (ci_matmul_job.x_pairs). */
static void pack_x_pair_panel(void *ctx, int task, int thread) {
  (void)thread;
  const x_panel_packing *p = ctx;
  const int64_t pairs = (p->k + 1) / 2;
  uint32_t *panel = (uint32_t *)p->dst + (int64_t)task * pairs * p->mr;
  for (int r = 0; r < p->mr; r++) {
    int64_t row = (int64_t)task * p->mr + r;
    const float *src = p->x + row * p->k;
    for (int64_t c = 0; c < pairs; c++) {
      uint32_t lo = 0, hi = 0;
      if (row < p->m) {
        lo = ci_f32_to_bf16(src[2 * c]);
        hi = 2 * c + 1 < p->k ? ci_f32_to_bf16(src[2 * c + 1]) : 0;
      }
      panel[c * p->mr + r] = lo | hi << 16;
    }
  }
}

/* x [m, k] rounded to bf16 (round to nearest even), as f32 values. */
static void round_rows_bf16(float *dst, const float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = ci_bf16_to_f32(ci_f32_to_bf16(x[i]));
}

/* Job of rounding x [m, k] to bf16 rows for the AMX panel kernels: rows [m, padded) are zero. */
typedef struct {
  uint16_t *dst;
  const float *x;
  int64_t m, k, padded;
  void (*to_bf16)(uint16_t *dst, const float *src, int64_t n); /* the ISA's conversion loop */
} x_tile_rounding;

enum { AMX_TILE_ROWS = 16 };

/* Pool task: rounds the 16 rows of x tile `task`. */
static void round_x_tile(void *ctx, int task, int thread) {
  (void)thread;
  const x_tile_rounding *r = ctx;
  for (int64_t row = (int64_t)task * AMX_TILE_ROWS;
       row < (int64_t)(task + 1) * AMX_TILE_ROWS && row < r->padded; row++) {
    if (row < r->m)
      r->to_bf16(r->dst + row * r->k, r->x + row * r->k, r->k);
    else
      memset(r->dst + row * r->k, 0, (size_t)r->k * sizeof *r->dst);
  }
}

/* dst = x with each group of each row rounded to n_planes int8 planes, u_g * round(x / u_g) with
 * u_g = max|x_g| / 127 / 256^(n_planes-1) (the values the fast VNNI kernels multiply, for the
 * kernels without them); a group holding Inf or NaN, or all zero, is copied as is. */
static void round_groups_int8(float *dst, const float *x, int64_t m, int64_t k, int group,
                              int n_planes) {
  for (int64_t g0 = 0; g0 < m * k; g0 += group) {
    const float *src = x + g0;
    float max = 0.0f;
    int finite = 1;
    for (int j = 0; j < group; j++) {
      finite &= isfinite(src[j]) != 0;
      if (fabsf(src[j]) > max) max = fabsf(src[j]);
    }
    if (!finite || max == 0.0f) {
      for (int j = 0; j < group; j++) dst[g0 + j] = src[j];
      continue;
    }
    const double unit = (double)max / 127.0 /
                        (n_planes == 1   ? 1.0
                         : n_planes == 2 ? 256.0
                                         : 65536.0);
    for (int j = 0; j < group; j++) dst[g0 + j] = (float)(unit * rint(src[j] / unit));
  }
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

/* One run of rows computed by one kernel: a panel segment, or consecutive row-kernel
 * segments (the row kernels compute each row on its own, so runs of them merge). */
typedef struct {
  ci_matmul_job job;
  ci_matmul_rows_fn fn;
  int panel; /* 1: panel kernel, 0: row kernel */
} matmul_part;

/* cpu_reserve_scratch sets aside 256 floats per row for a call's descriptors */
_Static_assert(CI_MATMUL_MAX_WEIGHTS * sizeof(matmul_part) + sizeof(int64_t) <= 256 * sizeof(float),
               "the scratch reserved per segment holds the parts of every weight");

/* Per-call state shared by the tasks of one matmul: every task runs every part of its weight
 * over its chunk of that weight's rows, so the chunk is read from memory once for all of them.
 * Weight i's tasks are [first_task[i], first_task[i + 1]). */
typedef struct {
  const matmul_part *parts; /* [n_weights][n_parts] */
  int n_parts;
  int n_weights;
  const int64_t *n;             /* [n_weights] */
  const int64_t *rows_per_task; /* [n_weights] */
  const int *first_task;        /* [n_weights + 1] */
  float *scratch;               /* n_threads * scratch_stride floats */
  size_t scratch_stride;        /* floats per thread, a multiple of 16 */
} matmul_tasks;

/* Pool task: one chunk of output columns (weight rows) of one weight for every part. */
static void run_matmul_task(void *ctx, int task, int thread) {
  const matmul_tasks *tasks = ctx;
  int i = 0;
  while (task >= tasks->first_task[i + 1]) i++;
  int64_t begin = (int64_t)(task - tasks->first_task[i]) * tasks->rows_per_task[i];
  int64_t end = begin + tasks->rows_per_task[i];
  if (end > tasks->n[i]) end = tasks->n[i];
  float *scratch = tasks->scratch ? tasks->scratch + (size_t)thread * tasks->scratch_stride : NULL;
  const matmul_part *parts = tasks->parts + (size_t)i * tasks->n_parts;
  for (int p = 0; p < tasks->n_parts; p++) parts[p].fn(&parts[p].job, begin, end, scratch);
}

/* n floats (at least one) from the scratch arena, or NULL. */
static float *take_floats(ci_arena *scratch, size_t n) {
  return ci_arena_take(scratch, (n ? n : 1) * sizeof(float));
}

/* How a call computes: the kernels of its ISA and which fast-precision variants it uses. */
typedef struct {
  const ci_matmul_kernels *kernels;
  const ci_cpu_vec_kernels *vec; /* the ISA's vector loops (bf16 rounding, bit-exact) */
  int fast;                      /* CI_PRECISION_FAST */
  int int8;                      /* the VNNI int8-plane row kernels (affine formats) */
  int x16;                       /* the 16-bit row kernels (affine formats, fast, without int8) */
  int bf16_dot;                  /* the AVX512_BF16 kernels (fast only) */
  int amx;                       /* the AMX-BF16 panel kernels (fast only, with bf16_dot) */
} matmul_plan;

/* Prepares the activations of one part (rows [0, job->m) of job->x) for its kernel: int8 planes,
 * word-lane order and group sums for the affine row kernels, bf16 rows or panels for the fast
 * kernels, f32 panels for the panel kernels. In fast precision without the kernels made for it,
 * x is rounded (to bf16, or to the grid of FAST_X_PLANES int8 planes per group) and the exact
 * kernels run on it.
 * Returns CI_OK, or CI_ERR when scratch runs out. */
static int prepare_part(ci_threadpool *pool, ci_arena *scratch, const matmul_plan *plan,
                        const ci_tensor *w, matmul_part *part) {
  const ci_matmul_kernels *kernels = plan->kernels;
  ci_matmul_job *job = &part->job;
  const int64_t m = job->m, k = job->k;
  const int affine = ci_dtype_is_affine(w->dtype);
  const int bf16_weight = w->dtype == CI_BF16;
  if (plan->fast && (bf16_weight || (affine && part->panel))) {
    /* bf16 products: tile products, the dot-product kernels, or the exact ones on x rounded to
     * bf16 */
    if (plan->amx && part->panel && kernels->gemm_amx[job->format] && k % 32 == 0) {
      const int64_t padded = (m + AMX_TILE_ROWS - 1) / AMX_TILE_ROWS * AMX_TILE_ROWS;
      uint16_t *rows = ci_arena_take(scratch, (size_t)(padded * k) * sizeof *rows);
      if (!rows) return CI_ERR;
      x_tile_rounding rounding = {.dst = rows,
                                  .x = job->x,
                                  .m = m,
                                  .k = k,
                                  .padded = padded,
                                  .to_bf16 = plan->vec->f32_to_bf16};
      const int n_tiles = (int)(padded / AMX_TILE_ROWS);
      run_tasks(pool, n_tiles, round_x_tile, &rounding);
      job->x_bf16 = rows;
      part->fn = kernels->gemm_amx[job->format];
      return CI_OK;
    }
    if (plan->bf16_dot && part->panel && kernels->gemm_bf16_dot[job->format]) {
      const int mr = kernels->gemm_mr;
      uint32_t *pairs =
          ci_arena_take(scratch, (size_t)((m + mr - 1) / mr * mr * ((k + 1) / 2)) * 4 + 4);
      if (!pairs) return CI_ERR;
      x_panel_packing packing = {.dst = (float *)pairs, .x = job->x, .m = m, .k = k, .mr = mr};
      const int n_panels = (int)((m + mr - 1) / mr);
      run_tasks(pool, n_panels, pack_x_pair_panel, &packing);
      job->x_pairs = pairs;
      part->fn = kernels->gemm_bf16_dot[job->format];
      return CI_OK;
    }
    if (plan->bf16_dot && !part->panel && kernels->gemv_bf16_dot[job->format]) {
      uint16_t *rounded = ci_arena_take(scratch, (size_t)(m * k) * 2 + 2);
      if (!rounded) return CI_ERR;
      plan->vec->f32_to_bf16(rounded, job->x, m * k);
      job->x_bf16 = rounded;
      part->fn = kernels->gemv_bf16_dot[job->format];
      return CI_OK;
    }
    if (!part->panel) {
      float *rounded = take_floats(scratch, (size_t)(m * k));
      if (!rounded) return CI_ERR;
      round_rows_bf16(rounded, job->x, m * k);
      job->x = rounded;
    }
  }
  if (part->panel) {
    /* fast precision without bf16 products: x is rounded while packed, over the pool (rounding
     * it first on this thread made Gemma-3-1B's bf16 prefill 7% slower than exact on AVX2) */
    const int round_bf16 = plan->fast && (bf16_weight || affine);
    const int mr = kernels->gemm_mr;
    float *packed = take_floats(scratch, (size_t)((m + mr - 1) / mr * mr * k));
    if (!packed) return CI_ERR;
    x_panel_packing packing = {
        .dst = packed, .x = job->x, .m = m, .k = k, .mr = mr, .round_bf16 = round_bf16};
    const int n_panels = (int)((m + mr - 1) / mr);
    run_tasks(pool, n_panels, pack_x_panel, &packing);
    job->x_packed = packed;
    part->fn = kernels->gemm[job->format];
    return CI_OK;
  }
  part->fn = kernels->gemv[job->format];
  if (!affine) return CI_OK;
  const int64_t n_groups = k / job->group;
  float *group_sums = take_floats(scratch, (size_t)(m * n_groups));
  if (!group_sums) return CI_ERR;
  /* the bias term meets the exact f32 group sums of x in both precisions */
  sum_groups(group_sums, job->x, m, k, job->group);
  if (plan->int8) {
    const int bits = ci_tensor_bits(w);
    const int64_t cols_per_block = bits == 8 ? 64 : 128;
    const int64_t stride = (k + cols_per_block - 1) / cols_per_block *
                           (bits == 8 ? CI_X_PLANE_BLOCK_Q8 : CI_X_PLANE_BLOCK_Q4);
    int8_t *planes = ci_arena_take(scratch, (size_t)(m * stride)); /* stride: multiple of 64 */
    float *units = take_floats(scratch, (size_t)(m * n_groups));
    if (!planes || !units) return CI_ERR;
    job->x_plane_count = plan->fast ? FAST_X_PLANES : 3;
    kernels->quantize_x_planes(planes, units, job->x, m, k, job->group, bits, stride,
                               job->x_plane_count);
    job->x_planes = planes;
    job->x_plane_stride = stride;
    job->x_plane_units = units;
    part->fn = kernels->gemv_int8[job->format];
    job->x_group_sums = group_sums;
    return CI_OK;
  }
  if (plan->x16) { /* fast precision's 16-bit grid as int16 (the rounding below, in integers) */
    const int64_t stride = (k + 31) / 32 * 32;
    int16_t *x16 = ci_arena_take(scratch, (size_t)(m * stride) * sizeof *x16);
    float *units = take_floats(scratch, (size_t)(m * n_groups));
    if (!x16 || !units) return CI_ERR;
    kernels->quantize_x16(x16, units, job->x, m, k, job->group, ci_tensor_bits(w), stride);
    job->x16 = x16;
    job->x16_stride = stride;
    job->x_plane_units = units;
    part->fn = kernels->gemv_x16[job->format];
    job->x_group_sums = group_sums;
    return CI_OK;
  }
  if (plan->fast) {
    float *rounded = take_floats(scratch, (size_t)(m * k));
    if (!rounded) return CI_ERR;
    round_groups_int8(rounded, job->x, m, k, job->group, FAST_X_PLANES);
    job->x = rounded;
  }
  if (kernels->word_lanes) {
    float *lanes = take_floats(scratch, (size_t)(m * k));
    if (!lanes) return CI_ERR;
    to_word_lane_order(lanes, job->x, m, k, kernels->word_lanes, ci_tensor_bits(w));
    job->x = lanes;
  }
  job->x_group_sums = group_sums;
  return CI_OK;
}

static int64_t gcd64(int64_t a, int64_t b) {
  while (b) {
    const int64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

/* Weights i > 0 of a multi-weight call must share weight 0's layout: then x, prepared once,
 * serves them all. */
static int same_layout(const ci_tensor *a, const ci_tensor *b) {
  return a->dtype == b->dtype && a->shape[1] == b->shape[1] &&
         (!ci_dtype_is_affine(a->dtype) ||
          (a->group_size == b->group_size && a->scale_dtype == b->scale_dtype));
}

int ci_cpu_matmul_segments_multi(ci_threadpool *pool, ci_isa isa, ci_precision precision,
                                 ci_arena *scratch, const ci_tensor *const *ws, int n_weights,
                                 const float *x, int64_t m, float *const *ys,
                                 const ci_row_segments *segments) {
  if (!ws || !ys || n_weights < 1 || n_weights > CI_MATMUL_MAX_WEIGHTS)
    return ci_fail("matmul: %d weights (1 to %d)", n_weights, CI_MATMUL_MAX_WEIGHTS);
  for (int i = 0; i < n_weights; i++)
    if (!ws[i] || (m > 0 && (!x || !ys[i]))) return ci_fail("matmul: NULL argument");
  if ((unsigned)isa >= CI_ISA_COUNT || !ci_isa_supported(isa))
    return ci_fail("matmul: ISA %s not supported on this CPU", ci_isa_name(isa));
  int64_t ns[CI_MATMUL_MAX_WEIGHTS], k = 0;
  ci_weight_format format = CI_WF_F32;
  for (int i = 0; i < n_weights; i++) {
    int64_t ki = 0;
    ci_weight_format fi = CI_WF_F32;
    if (check_weight(ws[i], &ns[i], &ki, &fi) != CI_OK) return CI_ERR;
    if (i == 0) {
      k = ki;
      format = fi;
    } else if (!same_layout(ws[0], ws[i])) {
      return ci_fail("matmul: the weights of one call differ in dtype, width or grouping");
    }
  }
  const ci_tensor *w = ws[0];
  if (m < 0) return ci_fail("matmul: negative row count");
  if (precision != CI_PRECISION_EXACT && precision != CI_PRECISION_FAST)
    return ci_fail("matmul: unknown precision %d", (int)precision);
  const int n_segments = segments && segments->n > 0 ? segments->n : 1;
  if (segments && segments->n > 0) {
    int64_t total = 0;
    for (int s = 0; s < segments->n; s++) {
      if (segments->rows[s] < 0) return ci_fail("matmul: negative segment");
      total += segments->rows[s];
    }
    if (total != m)
      return ci_fail("matmul: segments cover %lld of %lld rows", (long long)total, (long long)m);
  }
  if (m == 0) return CI_OK;

  const ci_matmul_kernels *kernels = kernels_for(isa);
  const int affine = ci_dtype_is_affine(w->dtype);
  const matmul_plan plan = {
      .kernels = kernels,
      .vec = ci_cpu_vec_kernels_get(isa),
      .fast = precision == CI_PRECISION_FAST,
      .int8 = affine && kernels->gemv_int8 && kernels->gemv_int8[format] &&
              kernels->quantize_x_planes && ci_cpu_int8_matmul_enabled(),
      .x16 = affine && precision == CI_PRECISION_FAST && kernels->gemv_x16 &&
             kernels->gemv_x16[format] && kernels->quantize_x16 && ci_cpu_x16_matmul_enabled(),
      .bf16_dot = precision == CI_PRECISION_FAST && kernels->gemv_bf16_dot &&
                  kernels->gemm_bf16_dot && ci_cpu_bf16_dot_enabled(),
      .amx = precision == CI_PRECISION_FAST && kernels->gemm_bf16_dot && kernels->gemm_amx &&
             ci_cpu_bf16_dot_enabled() && ci_cpu_amx_enabled(),
  };
  const ci_matmul_job base = {
      .format = format,
      .n = ns[0],
      .k = k,
      .w = w->data,
      .scales = w->scales,
      .biases = w->biases,
      .group = affine ? w->group_size : 0,
  };
  ci_arena_reset(scratch);
  matmul_part *parts =
      ci_arena_take(scratch, (size_t)n_weights * (size_t)n_segments * sizeof *parts);
  int64_t *part_row = ci_arena_take(scratch, (size_t)n_segments * sizeof *part_row);
  if (!parts || !part_row) return CI_ERR;
  int n_parts = 0, any_panel = 0, any_rows = 0;
  int64_t row = 0;
  for (int s = 0; s < n_segments; s++) {
    const int64_t rows = segments && segments->n > 0 ? segments->rows[s] : m;
    if (rows == 0) continue;
    /* a segment's kernel depends on its own rows only: that keeps it equal to a solo call */
    const int panel = kernels->gemm[format] && rows >= kernels->gemm_min_m[format];
    if (!panel && n_parts && !parts[n_parts - 1].panel) {
      parts[n_parts - 1].job.m += rows; /* extend the open row-kernel run */
    } else {
      parts[n_parts] = (matmul_part){.job = base, .panel = panel};
      parts[n_parts].job.m = rows;
      parts[n_parts].job.x = x + row * k;
      parts[n_parts].job.y = ys[0] + row * ns[0];
      part_row[n_parts] = row;
      n_parts++;
    }
    any_panel |= panel;
    any_rows |= !panel;
    row += rows;
  }
  for (int p = 0; p < n_parts; p++) {
    if (prepare_part(pool, scratch, &plan, w, &parts[p]))
      return ci_fail("matmul: out of memory preparing activations (m=%lld, k=%lld)", (long long)m,
                     (long long)k);
  }
  /* the other weights: the same prepared x and kernels, their own rows and outputs */
  for (int i = 1; i < n_weights; i++)
    for (int p = 0; p < n_parts; p++) {
      matmul_part *part = &parts[(size_t)i * n_parts + p];
      *part = parts[p];
      part->job.n = ns[i];
      part->job.w = ws[i]->data;
      part->job.scales = ws[i]->scales;
      part->job.biases = ws[i]->biases;
      part->job.y = ys[i] + part_row[p] * ns[i];
    }
  int n_threads = pool ? ci_threadpool_size(pool) : 1;
  size_t scratch_stride = any_panel ? (kernels->scratch_floats + 15) & ~(size_t)15 : 0;
  float *thread_scratch = NULL;
  if (scratch_stride) {
    thread_scratch = take_floats(scratch, scratch_stride * (size_t)n_threads);
    if (!thread_scratch) return ci_fail("matmul: out of memory for panel scratch");
  }
  /* chunks of weight rows: whole row blocks of every kernel in use; the bf16 dot-product panel
   * kernel multiplies two panels side by side (a 32-row chunk end takes its narrower, slower tile:
   * the same bits either way) */
  int64_t unit = any_panel ? kernels->gemm_nr * (plan.bf16_dot ? 2 : 1) : GEMV_ROW_UNIT;
  if (any_panel && any_rows) unit = unit / gcd64(unit, GEMV_ROW_UNIT) * GEMV_ROW_UNIT;
  int64_t rows_per_task[CI_MATMUL_MAX_WEIGHTS];
  int first_task[CI_MATMUL_MAX_WEIGHTS + 1] = {0};
  for (int i = 0; i < n_weights; i++) {
    rows_per_task[i] = rows_per_task_for(ns[i], m * k, n_threads, unit);
    first_task[i + 1] =
        first_task[i] + (ns[i] > 0 ? (int)((ns[i] + rows_per_task[i] - 1) / rows_per_task[i]) : 0);
  }
  matmul_tasks tasks = {
      .parts = parts,
      .n_parts = n_parts,
      .n_weights = n_weights,
      .n = ns,
      .rows_per_task = rows_per_task,
      .first_task = first_task,
      .scratch = thread_scratch,
      .scratch_stride = scratch_stride,
  };
  const int n_tasks = first_task[n_weights];
  if (pool && n_tasks > 1)
    ci_threadpool_run(pool, n_tasks, run_matmul_task, &tasks);
  else
    for (int t = 0; t < n_tasks; t++) run_matmul_task(&tasks, t, 0);
  return CI_OK;
}

int ci_cpu_matmul_segments(ci_threadpool *pool, ci_isa isa, ci_precision precision,
                           ci_arena *scratch, const ci_tensor *w, const float *x, int64_t m,
                           float *y, const ci_row_segments *segments) {
  return ci_cpu_matmul_segments_multi(pool, isa, precision, scratch, &w, 1, x, m, &y, segments);
}

int ci_cpu_matmul_with(ci_threadpool *pool, ci_isa isa, ci_precision precision, const ci_tensor *w,
                       const float *x, int64_t m, float *y, int each_row) {
  ci_arena scratch;
  ci_arena_init(&scratch);
  int32_t *ones = NULL;
  ci_row_segments segments = {0};
  if (each_row && m > 0) {
    ones = malloc((size_t)m * sizeof *ones);
    if (!ones) return ci_fail("matmul: out of memory");
    for (int64_t i = 0; i < m; i++) ones[i] = 1;
    segments = (ci_row_segments){.n = (int)m, .rows = ones};
  }
  const int status = ci_cpu_matmul_segments(pool, isa, precision, &scratch, w, x, m, y, &segments);
  free(ones);
  ci_arena_free(&scratch);
  return status;
}

int ci_cpu_matmul(ci_threadpool *pool, ci_isa isa, const ci_tensor *w, const float *x, int64_t m,
                  float *y) {
  return ci_cpu_matmul_with(pool, isa, CI_PRECISION_EXACT, w, x, m, y, 0);
}

int ci_cpu_matmul_rows(ci_threadpool *pool, ci_isa isa, const ci_tensor *w, const float *x,
                       int64_t m, float *y) {
  return ci_cpu_matmul_with(pool, isa, CI_PRECISION_EXACT, w, x, m, y, 1);
}
