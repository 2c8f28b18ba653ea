/* CPU backend: the op table over f32 activations, the CPU kernels and a thread pool. */
#include "backend/cpu/cpu_backend.h"

#include "base/error.h"
#include "backend/cpu/deltanet.h"
#include "backend/cpu/kv_kernels.h"
#include "backend/cpu/row_pick.h"
#include "base/threadpool.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* The cos/sin of one step's rows for one RoPE table, kept while the same rows come back: every
 * layer of a step rotates q and k at the same positions, so the sines are taken once per step
 * rather than twice per layer. Keyed by content (the frequencies and the positions), so a hit
 * gives exactly the values a fresh computation gives. */
typedef struct rope_table {
  int64_t n_rows, capacity_rows;
  int half, capacity_half;
  float inv_freq[CI_MAX_HEAD_DIM / 2];
  int32_t *pos;     /* [capacity_rows] */
  float *cos, *sin; /* [capacity_rows][half] */
  int64_t last_use;
} rope_table;

enum { ROPE_TABLES = 2 }; /* Gemma: one for sliding and one for global layers */

typedef struct {
  ci_backend base;
  ci_threadpool *pool;
  rope_table ropes[ROPE_TABLES];
  int64_t rope_uses;
  ci_isa isa;
  ci_precision precision; /* of every matmul */
  const ci_cpu_vec_kernels *vec;
  ci_arena scratch;    /* buffers of the op running now (ops run one at a time) */
  int64_t allocations; /* alloc calls */
} cpu_backend;

static cpu_backend *as_cpu(ci_backend *be) {
  return (cpu_backend *)be;
}

ci_isa ci_cpu_backend_isa(const ci_backend *be) {
  return ((const cpu_backend *)be)->isa;
}

/* ==== Parallel loops over independent items ==== */

/* Work (about one flop per unit) below which an op runs on the calling thread: a pool job costs
 * microseconds, more than a decode step's norms and adds. */
enum { PARALLEL_MIN_WORK = 1 << 15 };

typedef void (*range_fn)(void *ctx, int64_t begin, int64_t end);

typedef struct {
  range_fn fn;
  void *ctx;
  int64_t n, per_task;
} range_job;

static void range_task(void *ctx, int task, int thread) {
  (void)thread;
  const range_job *job = ctx;
  const int64_t begin = (int64_t)task * job->per_task;
  const int64_t end = begin + job->per_task < job->n ? begin + job->per_task : job->n;
  job->fn(job->ctx, begin, end);
}

/* Runs fn over the items [0, n), each `cost` work units, split into tasks over the pool (four per
 * thread, for an even finish) when the total pays for a job, else on the calling thread. Items
 * are independent and each is computed the same way wherever it runs, so results do not depend
 * on the split. */
static void for_range(ci_backend *be, int64_t n, int64_t cost, range_fn fn, void *ctx) {
  const int threads = ci_threadpool_size(as_cpu(be)->pool);
  if (threads <= 1 || n < 2 || n * cost < PARALLEL_MIN_WORK) {
    fn(ctx, 0, n);
    return;
  }
  const int64_t tasks = (int64_t)threads * 4 < n ? (int64_t)threads * 4 : n;
  range_job job = {fn, ctx, n, (n + tasks - 1) / tasks};
  ci_threadpool_run(as_cpu(be)->pool, (int)((n + job.per_task - 1) / job.per_task), range_task,
                    &job);
}

/* Arguments of the row and element loops below. */
typedef struct {
  float *out, *x;
  const float *src, *w, *y;
  int64_t dim, stride;
  float a, b;
  const int32_t *pos;
  const ci_rope *rope;
  int n_heads;
  const ci_cpu_vec_kernels *vec;
  const ci_tensor *table;
  const int32_t *ids;
  const struct rope_table *table_rope;
} loop_args;

/* ==== Memory ==== */

enum { HUGE_PAGE = 2 << 20 };

/* A 64-byte aligned block; from 2 MiB up (the KV arena or its slabs, large scratch) 2 MiB
 * aligned and advised for transparent huge pages. Attention walks the KV cache block by block,
 * a few KiB of each block per (layer, head), a new 4 KiB page each time. NULL with
 * ci_last_error. */
static void *allocate(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  if (!rounded) rounded = 64;
  void *p;
  if (rounded >= HUGE_PAGE) {
    rounded = (rounded + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    p = aligned_alloc(HUGE_PAGE, rounded);
    if (p) madvise(p, rounded, MADV_HUGEPAGE); /* advice only: 4 KiB pages still work */
  } else {
    p = aligned_alloc(64, rounded);
  }
  if (!p) ci_fail("out of memory allocating %zu bytes", bytes);
  return p;
}

static void *cpu_alloc(ci_backend *be, size_t bytes) {
  as_cpu(be)->allocations++;
  void *p = allocate(bytes);
  if (p) memset(p, 0, bytes);
  return p;
}

static void *cpu_alloc_uninitialized(ci_backend *be, size_t bytes) {
  as_cpu(be)->allocations++;
  return allocate(bytes);
}

static void cpu_copy_bytes(ci_backend *be, void *dst, const void *src, size_t bytes) {
  (void)be;
  memmove(dst, src, bytes);
}

static void cpu_upload(ci_backend *be, void *dst, const void *host_src, size_t bytes) {
  (void)be;
  if (dst != host_src) memcpy(dst, host_src, bytes);
}

static void cpu_fill(ci_backend *be, float *x, float value, int64_t n) {
  (void)be;
  for (int64_t i = 0; i < n; i++) x[i] = value;
}

static int cpu_step_begin(ci_backend *be, void *desc, const void *host_desc, size_t bytes) {
  cpu_upload(be, desc, host_desc, bytes);
  return CI_OK;
}

/* CPU ops run synchronously and report errors as they return: only the copies are left. */
static int cpu_step_end(ci_backend *be, const ci_download *downloads, int n) {
  for (int i = 0; i < n; i++)
    if (downloads[i].host && downloads[i].device && downloads[i].bytes)
      cpu_upload(be, downloads[i].host, downloads[i].device, downloads[i].bytes);
  return CI_OK;
}

static void cpu_pick_rows(ci_backend *be, ci_row_pick *picks, const float *logits, int64_t rows,
                          int64_t vocab) {
  (void)be;
  for (int64_t r = 0; r < rows; r++) picks[r] = ci_row_pick_of(logits + r * vocab, vocab);
}

static void cpu_release(ci_backend *be, void *ptr) {
  (void)be;
  free(ptr);
}

static int64_t cpu_allocation_count(ci_backend *be) {
  cpu_backend *cpu = as_cpu(be);
  return cpu->allocations + cpu->scratch.allocations;
}

/* Scratch floats per thread of one attention task (see attention_task). */
static int64_t attention_thread_floats(int query_heads, int head_dim, int block_tokens) {
  const int64_t floats = ci_kv_attend_scratch_floats(block_tokens, head_dim, query_heads) +
                         (int64_t)query_heads * head_dim + (int64_t)query_heads * (head_dim + 2);
  return (floats + 15) / 16 * 16; /* each thread's scratch 64-byte aligned */
}

/* The most scratch a step of max_rows rows can take: the larger of a matmul's preparation (one
 * of panels, word lanes or int8 planes for every row, with group sums and units, the per-thread
 * panel scratch and the descriptors of every segment) and attention's partials of every row and
 * head with its per-thread buffers. A step that needs more still runs: the arena grows once, and
 * the count shows it. */
static int cpu_reserve_scratch(ci_backend *be, int64_t max_rows, int64_t max_k, int max_heads,
                               int max_head_dim) {
  cpu_backend *cpu = as_cpu(be);
  const int64_t threads = ci_threadpool_size(cpu->pool);
  const int64_t rows = max_rows + 64; /* panel padding */
  /* (256 floats per row: the per-segment descriptors of up to CI_MATMUL_MAX_WEIGHTS weights) */
  const int64_t matmul = rows * max_k + rows * max_k / 8 + threads * 512 * 32 + 4096 + rows * 256;
  const int64_t d = max_head_dim + 2;
  const int64_t attention = (rows * max_heads + 4 * threads * max_heads) * d +
                            threads * attention_thread_floats(max_heads, max_head_dim, 64) + 4096;
  const int64_t floats = matmul > attention ? matmul : attention;
  return ci_arena_reserve(&cpu->scratch, (size_t)floats * sizeof(float)) ? CI_ERR : CI_OK;
}

/* The CPU reads weights where the file is mapped. */
static int cpu_prepare_weight(ci_backend *be, ci_tensor *t) {
  (void)be;
  (void)t;
  return CI_OK;
}

/* Host memory is the CPU's own: nothing to pin. */
static int cpu_pin_host(ci_backend *be, void *host, size_t bytes) {
  (void)be;
  (void)host;
  (void)bytes;
  return CI_OK;
}

static void cpu_unpin_host(ci_backend *be, void *host) {
  (void)be;
  (void)host;
}

/* ==== Dense ops ==== */

static int cpu_matmul(ci_backend *be, const ci_tensor *w, const float *x, int64_t m, float *y,
                      const ci_row_segments *segments) {
  cpu_backend *cpu = as_cpu(be);
  return ci_cpu_matmul_segments(cpu->pool, cpu->isa, cpu->precision, &cpu->scratch, w, x, m, y,
                                segments);
}

static int cpu_matmul_multi(ci_backend *be, const ci_tensor *const *ws, int n_weights,
                            const float *x, int64_t m, float *const *ys,
                            const ci_row_segments *segments) {
  cpu_backend *cpu = as_cpu(be);
  return ci_cpu_matmul_segments_multi(cpu->pool, cpu->isa, cpu->precision, &cpu->scratch, ws,
                                      n_weights, x, m, ys, segments);
}

/* Bits [c*b, c*b+b) of a row's LSB-first stream of u32 words (b divides 32). */
static inline unsigned affine_code(const uint32_t *row, int64_t c, int bits) {
  int64_t bit = c * bits;
  return (row[bit >> 5] >> (bit & 31)) & ((1u << bits) - 1u);
}

/* Rows [begin, end) of an embedding lookup. */
static void embed_rows(void *ctx, int64_t begin, int64_t end) {
  const loop_args *a = ctx;
  const ci_tensor *table = a->table;
  const int32_t *ids = a->ids;
  float *out = a->out;
  const int64_t dim = table->shape[1];
  for (int64_t r = begin; r < end; r++) {
    float *dst = out + r * dim;
    int64_t id = ids[r];
    if (ci_dtype_is_affine(table->dtype)) {
      int bits = ci_tensor_bits(table);
      int64_t groups = dim / table->group_size;
      const uint32_t *codes = (const uint32_t *)table->data + id * (dim * bits / 32);
      for (int64_t g = 0; g < groups; g++) {
        float scale = ci_float_at(table->scale_dtype, table->scales, (size_t)(id * groups + g));
        float bias = ci_float_at(table->scale_dtype, table->biases, (size_t)(id * groups + g));
        for (int64_t c = g * table->group_size; c < (g + 1) * table->group_size; c++)
          dst[c] = scale * (float)affine_code(codes, c, bits) + bias;
      }
    } else {
      for (int64_t c = 0; c < dim; c++)
        dst[c] = ci_float_at(table->dtype, table->data, (size_t)(id * dim + c));
    }
  }
}

static int cpu_embed(ci_backend *be, const ci_tensor *table, const int32_t *ids, int64_t n,
                     float *out) {
  loop_args a = {.out = out, .table = table, .ids = ids};
  for_range(be, n, 4 * table->shape[1], embed_rows, &a);
  return CI_OK;
}

static void rmsnorm_rows(void *ctx, int64_t begin, int64_t end) {
  const loop_args *a = ctx;
  const int64_t dim = a->dim;
  for (int64_t r = begin; r < end; r++) {
    const float *src = a->src + r * dim;
    float *dst = a->out + r * dim;
    double sum = 0.0;
    for (int64_t i = 0; i < dim; i++) sum += (double)src[i] * src[i];
    float inv = 1.0f / sqrtf((float)(sum / (double)dim) + a->a);
    if (a->w) {
      for (int64_t i = 0; i < dim; i++) dst[i] = src[i] * inv * (a->b + a->w[i]);
    } else {
      for (int64_t i = 0; i < dim; i++) dst[i] = src[i] * inv;
    }
  }
}

static void cpu_rmsnorm(ci_backend *be, float *out, const float *x, const float *w, int64_t n_rows,
                        int64_t dim, float eps, float w_offset) {
  loop_args a = {.out = out, .src = x, .w = w, .dim = dim, .a = eps, .b = w_offset};
  for_range(be, n_rows, 3 * dim, rmsnorm_rows, &a);
}

static void add_bias_rows(void *ctx, int64_t begin, int64_t end) {
  const loop_args *a = ctx;
  for (int64_t r = begin; r < end; r++)
    for (int64_t c = 0; c < a->dim; c++) a->x[r * a->dim + c] += a->y[c];
}

static void cpu_add_bias(ci_backend *be, float *x, const float *bias, int64_t rows, int64_t cols) {
  loop_args a = {.x = x, .y = bias, .dim = cols};
  for_range(be, rows, cols, add_bias_rows, &a);
}

static void add_elements(void *ctx, int64_t begin, int64_t end) {
  const loop_args *a = ctx;
  for (int64_t i = begin; i < end; i++) a->x[i] += a->y[i];
}

static void cpu_add(ci_backend *be, float *x, const float *y, int64_t n) {
  loop_args a = {.x = x, .y = y};
  for_range(be, n, 1, add_elements, &a);
}

/* The gated activations run the vector kernels of activation.h: each element is computed the
 * same way wherever a task's range starts or ends. */
static void silu_mul_elements(void *ctx, int64_t begin, int64_t end) {
  const loop_args *a = ctx;
  a->vec->silu_mul(a->x + begin, a->y + begin, end - begin);
}

static void cpu_silu_mul(ci_backend *be, float *gate, const float *up, int64_t n) {
  loop_args a = {.x = gate, .y = up, .vec = as_cpu(be)->vec};
  for_range(be, n, 4, silu_mul_elements, &a);
}

static void sigmoid_mul_elements(void *ctx, int64_t begin, int64_t end) {
  const loop_args *a = ctx;
  for (int64_t i = begin; i < end; i++) a->x[i] *= 1.0f / (1.0f + expf(-a->y[i]));
}

static void cpu_sigmoid_mul(ci_backend *be, float *x, const float *gate, int64_t n) {
  loop_args a = {.x = x, .y = gate};
  for_range(be, n, 16, sigmoid_mul_elements, &a);
}

/* GELU with the tanh approximation (docs/models.md §3), as x * sigmoid(2u) (activation.h). */
static void gelu_mul_rows(void *ctx, int64_t begin, int64_t end) {
  const loop_args *a = ctx;
  for (int64_t r = begin; r < end; r++)
    a->vec->gelu_tanh_mul(a->x + r * a->dim, a->y + r * a->stride, a->dim);
}

static void cpu_gelu_tanh_mul(ci_backend *be, float *gate, const float *up, int64_t rows,
                              int64_t cols, int64_t up_stride) {
  loop_args a = {.x = gate, .y = up, .dim = cols, .stride = up_stride, .vec = as_cpu(be)->vec};
  for_range(be, rows, 4 * cols, gelu_mul_rows, &a);
}

static void scale_elements(void *ctx, int64_t begin, int64_t end) {
  const loop_args *a = ctx;
  for (int64_t i = begin; i < end; i++) a->x[i] *= a->a;
}

static void cpu_scale(ci_backend *be, float *x, float s, int64_t n) {
  loop_args a = {.x = x, .a = s};
  for_range(be, n, 1, scale_elements, &a);
}

static void softcap_elements(void *ctx, int64_t begin, int64_t end) {
  const loop_args *a = ctx;
  for (int64_t i = begin; i < end; i++) a->x[i] = a->a * tanhf(a->x[i] / a->a);
}

static void cpu_softcap(ci_backend *be, float *x, float cap, int64_t n) {
  loop_args a = {.x = x, .a = cap};
  for_range(be, n, 16, softcap_elements, &a);
}

static void cpu_copy(ci_backend *be, float *dst, const float *src, int64_t n) {
  (void)be;
  memmove(dst, src, (size_t)n * sizeof *dst);
}

static void gather_rows_range(void *ctx, int64_t begin, int64_t end) {
  const loop_args *a = ctx;
  for (int64_t i = begin; i < end; i++)
    memcpy(a->out + i * a->dim, a->src + (int64_t)a->ids[i] * a->dim,
           (size_t)a->dim * sizeof(float));
}

static void cpu_gather_rows(ci_backend *be, float *dst, const float *src, const int32_t *rows,
                            int64_t m, int64_t dim) {
  loop_args a = {.out = dst, .src = src, .ids = rows, .dim = dim};
  for_range(be, m, dim, gather_rows_range, &a);
}

static void cpu_scatter_add_rows(ci_backend *be, float *dst, const float *src, const int32_t *rows,
                                 const float *weights, int64_t m, int64_t dim) {
  (void)be;
  for (int64_t i = 0; i < m; i++) {
    float *d = dst + (int64_t)rows[i] * dim;
    const float *s = src + i * dim;
    for (int64_t c = 0; c < dim; c++) d[c] += weights[i] * s[c];
  }
}

/* ==== RoPE ==== */

/* Rows [begin, end) of a table: cos and sin of pos * inv_freq, as the rotation used them. */
static void rope_table_rows(void *ctx, int64_t begin, int64_t end) {
  const rope_table *t = ctx;
  for (int64_t r = begin; r < end; r++)
    for (int j = 0; j < t->half; j++) {
      const float angle = (float)t->pos[r] * t->inv_freq[j];
      t->cos[r * t->half + j] = cosf(angle);
      t->sin[r * t->half + j] = sinf(angle);
    }
}

/* The table of `rope` at the n_rows positions `pos`: a kept one when frequencies and positions
 * match, else the least recently used one refilled. NULL when out of memory. */
static const rope_table *rope_table_for(ci_backend *be, const ci_rope *rope, const int32_t *pos,
                                        int64_t n_rows) {
  cpu_backend *cpu = as_cpu(be);
  const int half = rope->rot_dim / 2;
  if (n_rows < 1 || half < 1) return NULL;
  rope_table *victim = &cpu->ropes[0];
  for (int i = 0; i < ROPE_TABLES; i++) {
    rope_table *t = &cpu->ropes[i];
    if (t->half == half && t->n_rows == n_rows &&
        !memcmp(t->inv_freq, rope->inv_freq, (size_t)half * sizeof(float)) &&
        !memcmp(t->pos, pos, (size_t)n_rows * sizeof *pos)) {
      t->last_use = ++cpu->rope_uses;
      return t;
    }
    if (t->last_use < victim->last_use) victim = t;
  }
  rope_table *t = victim;
  if (n_rows > t->capacity_rows || half > t->capacity_half) {
    const int64_t rows = n_rows > t->capacity_rows ? n_rows : t->capacity_rows;
    const int cols = half > t->capacity_half ? half : t->capacity_half;
    free(t->pos);
    free(t->cos);
    free(t->sin);
    t->pos = malloc((size_t)rows * sizeof *t->pos);
    t->cos = malloc((size_t)(rows * cols) * sizeof(float));
    t->sin = malloc((size_t)(rows * cols) * sizeof(float));
    t->capacity_rows = t->pos && t->cos && t->sin ? rows : 0;
    t->capacity_half = t->capacity_rows ? cols : 0;
    t->n_rows = 0;
    if (!t->capacity_rows) return NULL;
  }
  t->half = half;
  t->n_rows = n_rows;
  memcpy(t->inv_freq, rope->inv_freq, (size_t)half * sizeof(float));
  memcpy(t->pos, pos, (size_t)n_rows * sizeof *pos);
  t->last_use = ++cpu->rope_uses;
  for_range(be, n_rows, 40 * (int64_t)half, rope_table_rows, t);
  return t;
}

static void rope_rows(void *ctx, int64_t begin, int64_t end) {
  const loop_args *a = ctx;
  const ci_rope *rope = a->rope;
  const int half = rope->rot_dim / 2;
  const rope_table *t = a->table_rope;
  float cos_row[CI_MAX_HEAD_DIM / 2], sin_row[CI_MAX_HEAD_DIM / 2];
  for (int64_t r = begin; r < end; r++) {
    const float *cos_table = cos_row, *sin_table = sin_row;
    if (t) {
      cos_table = t->cos + r * half;
      sin_table = t->sin + r * half;
    } else {
      for (int j = 0; j < half; j++) {
        float angle = (float)a->pos[r] * rope->inv_freq[j];
        cos_row[j] = cosf(angle);
        sin_row[j] = sinf(angle);
      }
    }
    for (int h = 0; h < a->n_heads; h++) {
      float *v = a->x + (r * a->n_heads + h) * rope->head_dim;
      for (int j = 0; j < half; j++) {
        int i0 = rope->traditional ? 2 * j : j;
        int i1 = rope->traditional ? 2 * j + 1 : j + half;
        float x0 = v[i0], x1 = v[i1];
        v[i0] = x0 * cos_table[j] - x1 * sin_table[j];
        v[i1] = x0 * sin_table[j] + x1 * cos_table[j];
      }
      if (rope->qk_scale != 1.0f)
        for (int i = 0; i < rope->head_dim; i++) v[i] *= rope->qk_scale;
    }
  }
}

/* Rotates with the step's table (the sines computed by the row when its memory is short). */
static void cpu_rope(ci_backend *be, float *x, int64_t n_rows, int n_heads, const int32_t *pos,
                     const ci_rope *rope) {
  loop_args a = {.x = x,
                 .pos = pos,
                 .rope = rope,
                 .n_heads = n_heads,
                 .table_rope = rope_table_for(be, rope, pos, n_rows)};
  for_range(be, n_rows,
            (a.table_rope ? 0 : 40 * (rope->rot_dim / 2)) + 4 * (int64_t)n_heads * rope->head_dim,
            rope_rows, &a);
}

/* ==== Paged KV ==== */

/* One sequence's KV write, its rows split over the pool (positions checked beforehand). */
typedef struct {
  ci_isa isa;
  const ci_paged_kv *kv;
  const float *k, *v;
  const int32_t *pos;
} kv_store_job;

static void kv_store_rows(void *ctx, int64_t begin, int64_t end) {
  const kv_store_job *job = ctx;
  const int64_t width = (int64_t)job->kv->n_kv_heads * job->kv->head_dim;
  (void)ci_cpu_kv_store(job->isa, job->kv, job->k + begin * width, job->v + begin * width,
                        job->pos + begin, (int)(end - begin));
}

static int cpu_kv_store(ci_backend *be, const ci_step_kv *seqs, const float *k, const float *v,
                        const int32_t *pos) {
  for (int i = 0; i < seqs->n_seqs; i++) {
    const ci_paged_kv *kv = &seqs->kv[i];
    const int64_t width = (int64_t)kv->n_kv_heads * kv->head_dim, r0 = seqs->first_row[i];
    for (int r = 0; r < seqs->n_rows[i]; r++) {
      const int32_t p = pos[r0 + r];
      if (p < 0 || p / kv->block_tokens >= kv->n_table_entries ||
          kv->block_table[p / kv->block_tokens] < 0)
        return ci_fail("kv_store: position %d has no block", p);
    }
    kv_store_job job = {as_cpu(be)->isa, kv, k + r0 * width, v + r0 * width, pos + r0};
    for_range(be, seqs->n_rows[i], 8 * width, kv_store_rows, &job);
  }
  return CI_OK;
}

static int cpu_kv_convert_block(ci_backend *be, const ci_paged_kv *src, int32_t src_block,
                                const ci_paged_kv *dst, int32_t dst_block, int live_tokens) {
  (void)be;
  const int D = src->head_dim;
  if (D > CI_MAX_HEAD_DIM || dst->head_dim != D || dst->n_kv_heads != src->n_kv_heads)
    return ci_fail("kv conversion: mismatched geometry");
  float row[CI_MAX_HEAD_DIM];
  for (int h = 0; h < src->n_kv_heads; h++)
    for (int t = 0; t < live_tokens; t++)
      for (int value = 0; value < 2; value++) {
        ci_kv_decode_row(&src->format, value, src->signs,
                         ci_kv_block_row(src, value, src_block, t, h), D, row);
        ci_kv_encode_row(&dst->format, value, dst->signs, row, D,
                         ci_kv_block_row(dst, value, dst_block, t, h));
      }
  return CI_OK;
}

/* Attention work is split into tasks of (query row, group of KV heads, key range): each task
 * scores its keys for every query head of its KV heads (each stored row is decoded once and used
 * G times), the heads of a block one after another (one contiguous run of the cache), and leaves
 * a partial softmax (max, sum, unnormalised output) per query head that merge_task combines. A
 * task takes every KV head and splits the keys while the sequence's rows alone would leave
 * threads idle, and halves its heads when the context is too short to split; both depend on
 * that sequence only, so its result does not depend on the other sequences of the step. The
 * tasks of every sequence run in one pool run. */
enum { SPLIT_MIN_KEYS = 512 };

/* One sequence of an attention call. */
typedef struct {
  const ci_paged_kv *kv;
  ci_kv_kernels kernels;
  int first_row, n_rows;
  int heads_per_task; /* KV heads per task, dividing n_kv_heads */
  int splits;         /* key ranges per (row, head group) */
  int first_task;     /* its attention tasks: [first_task, first_task + n_rows*groups*splits) */
  int first_merge;    /* its merge tasks: [first_merge, first_merge + n_rows*Hq) */
  int64_t partial0;   /* floats: its partials start here */
} attention_seq;

typedef struct {
  const ci_attention_args *args;
  const attention_seq *seqs;
  int n_seqs;
  int group;                  /* G = query heads per KV head */
  int64_t scratch_per_thread; /* floats: the kernel's scratch, prepared queries, partials */
  float *scratch;             /* [threads][scratch_per_thread] */
  float *partial;             /* per sequence [rows][Hq][splits][D + 2]: max, sum, output */
} attention_job;

/* Visible keys [first, last] of query row r. */
static void visible_keys(const ci_attention_args *a, int r, int64_t *first, int64_t *last) {
  const int64_t p = a->pos[r];
  *first = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
  *last = p;
}

/* The sequence whose tasks (merge: 0 attention, 1 merge) include `task`. */
static const attention_seq *seq_of_task(const attention_job *job, int task, int merge) {
  int lo = 0, hi = job->n_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    const int first = merge ? job->seqs[mid].first_merge : job->seqs[mid].first_task;
    if (first <= task)
      lo = mid;
    else
      hi = mid - 1;
  }
  return &job->seqs[lo];
}

static void attention_task(void *ctx, int task, int thread) {
  const attention_job *job = ctx;
  const ci_attention_args *a = job->args;
  const attention_seq *s = seq_of_task(job, task, 0);
  const ci_paged_kv *kv = s->kv;
  const ci_kv_kernels *k = &s->kernels;
  const int D = kv->head_dim, G = job->group, splits = s->splits, heads = s->heads_per_task;
  const int local = task - s->first_task;
  const int split = local % splits;
  const int head0 = local / splits % (kv->n_kv_heads / heads) * heads;
  const int row_in_seq = local / splits / (kv->n_kv_heads / heads);
  const int row = s->first_row + row_in_seq;
  int64_t first, last;
  visible_keys(a, row, &first, &last);
  const int64_t n_keys = last - first + 1;
  const int64_t lo = first + n_keys * split / splits, hi = first + n_keys * (split + 1) / splits;
  float *scratch = job->scratch + (int64_t)thread * job->scratch_per_thread;
  float *qp = scratch + ci_kv_attend_scratch_floats(kv->block_tokens, D, a->n_heads);
  float *out = qp + (int64_t)heads * G * D;
  for (int g = 0; g < heads * G; g++)
    k->prepare(kv, a->q + ((int64_t)row * a->n_heads + head0 * G + g) * D, qp + (int64_t)g * D);
  k->attend(k, kv, head0, heads, qp, G, lo, hi, a->scale, a->softcap, scratch, out);
  for (int g = 0; g < heads * G; g++)
    memcpy(job->partial + s->partial0 +
               (((int64_t)row_in_seq * a->n_heads + head0 * G + g) * splits + split) * (D + 2),
           out + (int64_t)g * (D + 2), (size_t)(D + 2) * sizeof(float));
}

/* Combines the key ranges of one (row, query head) and maps the result to the model basis. */
static void merge_task(void *ctx, int task, int thread) {
  const attention_job *job = ctx;
  const ci_attention_args *a = job->args;
  const attention_seq *s = seq_of_task(job, task, 1);
  const int local = task - s->first_merge; /* row_in_seq * Hq + head */
  const int D = s->kv->head_dim, splits = s->splits;
  const float *parts = job->partial + s->partial0 + (int64_t)local * splits * (D + 2);
  float *acc = job->scratch + (int64_t)thread * job->scratch_per_thread;
  float max = -INFINITY;
  for (int sp = 0; sp < splits; sp++)
    if (parts[sp * (D + 2) + 1] > 0.0f && parts[sp * (D + 2)] > max) max = parts[sp * (D + 2)];
  float total = 0.0f;
  memset(acc, 0, (size_t)D * sizeof *acc);
  for (int sp = 0; sp < splits; sp++) {
    const float *part = parts + sp * (D + 2);
    if (!(part[1] > 0.0f)) continue; /* an empty range */
    const float w = splits == 1 ? 1.0f : expf(part[0] - max);
    total += w * part[1];
    s->kernels.vec->axpy_f32(acc, w, part + 2, D);
  }
  const float inv = 1.0f / total;
  for (int i = 0; i < D; i++) acc[i] *= inv;
  s->kernels.finish(s->kv, acc, a->out + ((int64_t)s->first_row * a->n_heads + local) * D);
}

static int cpu_attention(ci_backend *be, const ci_attention_args *args) {
  cpu_backend *cpu = as_cpu(be);
  const ci_step_kv *step = args->seqs;
  if (step->n_seqs < 1) return CI_OK;
  const ci_paged_kv *kv0 = &step->kv[0];
  if (args->n_heads % kv0->n_kv_heads != 0)
    return ci_fail("attention: %d query heads do not group over %d kv heads", args->n_heads,
                   kv0->n_kv_heads);
  const int G = args->n_heads / kv0->n_kv_heads, D = kv0->head_dim;
  if (G > CI_MAX_GQA_GROUP)
    return ci_fail("attention: %d query heads per kv head (at most %d)", G, CI_MAX_GQA_GROUP);
  const int threads = ci_threadpool_size(cpu->pool);
  ci_arena_reset(&cpu->scratch);
  attention_seq *seqs = ci_arena_take(&cpu->scratch, (size_t)step->n_seqs * sizeof *seqs);
  if (!seqs) return CI_ERR;
  int n_tasks = 0, n_merges = 0;
  int64_t partial_floats = 0;
  for (int i = 0; i < step->n_seqs; i++) {
    const ci_paged_kv *kv = &step->kv[i];
    const int first_row = step->first_row[i], n_rows = step->n_rows[i];
    if (kv->n_kv_heads != kv0->n_kv_heads || kv->head_dim != D ||
        kv->block_tokens != kv0->block_tokens)
      return ci_fail("attention: the sequences of a step differ in KV geometry");
    int64_t max_keys = 1;
    for (int r = first_row; r < first_row + n_rows; r++) {
      int64_t first, last;
      visible_keys(args, r, &first, &last);
      if (last - first + 1 > max_keys) max_keys = last - first + 1;
      if (args->pos[r] / kv->block_tokens >= kv->n_table_entries)
        return ci_fail("attention: position %d is beyond the stored KV", args->pos[r]);
    }
    int heads_per_task = kv->n_kv_heads, splits = 1;
    while (n_rows * (kv->n_kv_heads / heads_per_task) * splits < 2 * threads) {
      if (max_keys / (splits * 2) >= SPLIT_MIN_KEYS)
        splits *= 2;
      else if (heads_per_task % 2 == 0)
        heads_per_task /= 2;
      else
        break;
    }
    seqs[i] =
        (attention_seq){.kv = kv,
                        .kernels = ci_cpu_kv_kernels(cpu->isa, &kv->format, D, cpu->precision),
                        .first_row = first_row,
                        .n_rows = n_rows,
                        .heads_per_task = heads_per_task,
                        .splits = splits,
                        .first_task = n_tasks,
                        .first_merge = n_merges,
                        .partial0 = partial_floats};
    n_tasks += n_rows * (kv->n_kv_heads / heads_per_task) * splits;
    n_merges += n_rows * args->n_heads;
    partial_floats += (int64_t)n_rows * args->n_heads * splits * (D + 2);
  }
  attention_job job = {.args = args,
                       .seqs = seqs,
                       .n_seqs = step->n_seqs,
                       .group = G,
                       .scratch_per_thread =
                           attention_thread_floats(args->n_heads, D, kv0->block_tokens)};
  job.scratch = ci_arena_take(&cpu->scratch,
                              (size_t)threads * (size_t)job.scratch_per_thread * sizeof(float));
  job.partial = ci_arena_take(&cpu->scratch, (size_t)partial_floats * sizeof(float));
  if (!job.scratch || !job.partial) return ci_fail("attention: out of memory for its scratch");
  ci_threadpool_run(cpu->pool, n_tasks, attention_task, &job);
  ci_threadpool_run(cpu->pool, n_merges, merge_task, &job);
  return CI_OK;
}

static int cpu_gated_deltanet(ci_backend *be, const ci_deltanet_args *args) {
  cpu_backend *cpu = as_cpu(be);
  return ci_cpu_gated_deltanet(cpu->pool, &cpu->scratch, cpu->vec, args);
}

/* ==== Life cycle ==== */

static void cpu_destroy(ci_backend *be) {
  cpu_backend *cpu = as_cpu(be);
  ci_threadpool_free(cpu->pool);
  ci_arena_free(&cpu->scratch);
  for (int i = 0; i < ROPE_TABLES; i++) {
    free(cpu->ropes[i].pos);
    free(cpu->ropes[i].cos);
    free(cpu->ropes[i].sin);
  }
  free(cpu);
}

/* Ranks on CPU backends share host memory: the host collectives move the data themselves. */
static int cpu_all_reduce(ci_backend *be, ci_rank_collective *comm, int rank, float *buf,
                          int64_t n) {
  (void)be;
  return ci_rank_collective_all_reduce(comm, rank, buf, n);
}

static int cpu_gather_cols(ci_backend *be, ci_rank_collective *comm, int rank, float *dst,
                           const float *src, int64_t rows, int64_t cols, int64_t col0,
                           int64_t dst_cols) {
  (void)be;
  return ci_rank_collective_gather_cols(comm, rank, dst, src, rows, cols, col0, dst_cols);
}

static const ci_backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .alloc_uninitialized = cpu_alloc_uninitialized,
    .release = cpu_release,
    .copy_bytes = cpu_copy_bytes,
    .upload = cpu_upload,
    .download = cpu_upload,
    .fill = cpu_fill,
    .step_begin = cpu_step_begin,
    .step_end = cpu_step_end,
    .pick_rows = cpu_pick_rows,
    .kv_convert_block = cpu_kv_convert_block,
    .allocation_count = cpu_allocation_count,
    .reserve_scratch = cpu_reserve_scratch,
    .matmul = cpu_matmul,
    .matmul_multi = cpu_matmul_multi,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .add_bias = cpu_add_bias,
    .add = cpu_add,
    .silu_mul = cpu_silu_mul,
    .gelu_tanh_mul = cpu_gelu_tanh_mul,
    .scale = cpu_scale,
    .softcap = cpu_softcap,
    .copy = cpu_copy,
    .gather_rows = cpu_gather_rows,
    .scatter_add_rows = cpu_scatter_add_rows,
    .moe_route = ci_cpu_moe_route,
    .prepare_weight = cpu_prepare_weight,
    .pin_host = cpu_pin_host,
    .unpin_host = cpu_unpin_host,
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .sigmoid_mul = cpu_sigmoid_mul,
    .gated_deltanet = cpu_gated_deltanet,
    .all_reduce = cpu_all_reduce,
    .gather_cols = cpu_gather_cols,
};

ci_backend *ci_cpu_backend_create(int n_threads) {
  return ci_cpu_backend_create_with(n_threads, CI_PRECISION_EXACT);
}

ci_precision ci_cpu_backend_precision(const ci_backend *be) {
  return ((const cpu_backend *)be)->precision;
}

ci_backend *ci_cpu_backend_create_with(int n_threads, ci_precision precision) {
  if (precision != CI_PRECISION_EXACT && precision != CI_PRECISION_FAST) {
    ci_fail("unknown precision %d (expected fast or exact)", (int)precision);
    return NULL;
  }
  if (n_threads <= 0) n_threads = ci_cpu_count();
  cpu_backend *cpu = calloc(1, sizeof *cpu);
  if (!cpu) {
    ci_fail("out of memory");
    return NULL;
  }
  cpu->base.ops = &cpu_ops;
  cpu->base.host_visible = 1;
  ci_arena_init(&cpu->scratch);
  cpu->isa = ci_cpu_detect_isa();
  cpu->precision = precision;
  cpu->vec = ci_cpu_vec_kernels_get(cpu->isa);
  cpu->pool = ci_threadpool_create(n_threads);
  if (!cpu->pool) {
    free(cpu);
    return NULL;
  }
  return &cpu->base;
}
