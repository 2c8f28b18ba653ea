/* CPU backend: the op table over f32 activations, the CPU kernels and a thread pool. */
#include "backend/cpu/cpu_backend.h"

#include "base/error.h"
#include "backend/cpu/kv_kernels.h"
#include "base/threadpool.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  ci_backend base;
  ci_threadpool *pool;
  ci_isa isa;
  const ci_cpu_vec_kernels *vec;
} cpu_backend;

static cpu_backend *as_cpu(ci_backend *be) {
  return (cpu_backend *)be;
}

ci_isa ci_cpu_backend_isa(const ci_backend *be) {
  return ((const cpu_backend *)be)->isa;
}

/* ==== Memory ==== */

static void *cpu_alloc(ci_backend *be, size_t bytes) {
  (void)be;
  size_t rounded = (bytes + 63) / 64 * 64;
  void *p = aligned_alloc(64, rounded ? rounded : 64);
  if (!p) {
    ci_fail("out of memory allocating %zu bytes", bytes);
    return NULL;
  }
  memset(p, 0, rounded ? rounded : 64);
  return p;
}

static void cpu_release(ci_backend *be, void *ptr) {
  (void)be;
  free(ptr);
}

/* ==== Dense ops ==== */

static int cpu_matmul(ci_backend *be, const ci_tensor *w, const float *x, int64_t m, float *y) {
  cpu_backend *cpu = as_cpu(be);
  return ci_cpu_matmul(cpu->pool, cpu->isa, w, x, m, y);
}

/* Bits [c*b, c*b+b) of a row's LSB-first stream of u32 words (b divides 32). */
static inline unsigned affine_code(const uint32_t *row, int64_t c, int bits) {
  int64_t bit = c * bits;
  return (row[bit >> 5] >> (bit & 31)) & ((1u << bits) - 1u);
}

static int cpu_embed(ci_backend *be, const ci_tensor *table, const int32_t *ids, int64_t n,
                     float *out) {
  (void)be;
  const int64_t dim = table->shape[1];
  for (int64_t r = 0; r < n; r++) {
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
  return CI_OK;
}

static void cpu_rmsnorm(ci_backend *be, float *out, const float *x, const float *w, int64_t n_rows,
                        int64_t dim, float eps, float w_offset) {
  (void)be;
  for (int64_t r = 0; r < n_rows; r++) {
    const float *src = x + r * dim;
    float *dst = out + r * dim;
    double sum = 0.0;
    for (int64_t i = 0; i < dim; i++) sum += (double)src[i] * src[i];
    float inv = 1.0f / sqrtf((float)(sum / (double)dim) + eps);
    if (w) {
      for (int64_t i = 0; i < dim; i++) dst[i] = src[i] * inv * (w_offset + w[i]);
    } else {
      for (int64_t i = 0; i < dim; i++) dst[i] = src[i] * inv;
    }
  }
}

static void cpu_add_bias(ci_backend *be, float *x, const float *bias, int64_t rows, int64_t cols) {
  (void)be;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) x[r * cols + c] += bias[c];
}

static void cpu_add(ci_backend *be, float *x, const float *y, int64_t n) {
  (void)be;
  for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

static void cpu_silu_mul(ci_backend *be, float *gate, const float *up, int64_t n) {
  (void)be;
  for (int64_t i = 0; i < n; i++) {
    float g = gate[i];
    gate[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

/* GELU with the tanh approximation, x^3 as a power (model.md §3). */
static inline float gelu_tanh(float x) {
  const float sqrt_2_over_pi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + tanhf(sqrt_2_over_pi * (x + 0.044715f * powf(x, 3.0f))));
}

static void cpu_gelu_tanh_mul(ci_backend *be, float *gate, const float *up, int64_t rows,
                              int64_t cols, int64_t up_stride) {
  (void)be;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++)
      gate[r * cols + c] = gelu_tanh(gate[r * cols + c]) * up[r * up_stride + c];
}

static void cpu_scale(ci_backend *be, float *x, float s, int64_t n) {
  (void)be;
  for (int64_t i = 0; i < n; i++) x[i] *= s;
}

static void cpu_softcap(ci_backend *be, float *x, float cap, int64_t n) {
  (void)be;
  for (int64_t i = 0; i < n; i++) x[i] = cap * tanhf(x[i] / cap);
}

static void cpu_copy(ci_backend *be, float *dst, const float *src, int64_t n) {
  (void)be;
  memmove(dst, src, (size_t)n * sizeof *dst);
}

static void cpu_gather_rows(ci_backend *be, float *dst, const float *src, const int32_t *rows,
                            int64_t m, int64_t dim) {
  (void)be;
  for (int64_t i = 0; i < m; i++)
    memcpy(dst + i * dim, src + (int64_t)rows[i] * dim, (size_t)dim * sizeof *dst);
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

static void cpu_rope(ci_backend *be, float *x, int64_t n_rows, int n_heads, const int32_t *pos,
                     const ci_rope *rope) {
  (void)be;
  const int half = rope->rot_dim / 2;
  float cos_table[CI_MAX_HEAD_DIM / 2], sin_table[CI_MAX_HEAD_DIM / 2];
  for (int64_t r = 0; r < n_rows; r++) {
    for (int j = 0; j < half; j++) {
      float angle = (float)pos[r] * rope->inv_freq[j];
      cos_table[j] = cosf(angle);
      sin_table[j] = sinf(angle);
    }
    for (int h = 0; h < n_heads; h++) {
      float *v = x + (r * n_heads + h) * rope->head_dim;
      for (int j = 0; j < half; j++) {
        int a = rope->traditional ? 2 * j : j;
        int b = rope->traditional ? 2 * j + 1 : j + half;
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * cos_table[j] - x1 * sin_table[j];
        v[b] = x0 * sin_table[j] + x1 * cos_table[j];
      }
      if (rope->qk_scale != 1.0f)
        for (int i = 0; i < rope->head_dim; i++) v[i] *= rope->qk_scale;
    }
  }
}

/* ==== Paged KV ==== */

static int cpu_kv_store(ci_backend *be, const ci_paged_kv *kv, const float *k, const float *v,
                        const int32_t *pos, int n_rows) {
  return ci_cpu_kv_store(as_cpu(be)->isa, kv, k, v, pos, n_rows);
}

typedef struct {
  const ci_attention_args *args;
  ci_kv_kernels kernels;
  float *scratch; /* [threads][max_keys + 4 * head_dim]: scores, prepared query, accumulator */
  int64_t max_keys;
} attention_job;

/* One (query row, head): scores over the visible keys read in their stored form, softmax,
 * weighted sum of the stored values. */
static void attention_task(void *ctx, int task, int thread) {
  const attention_job *job = ctx;
  const ci_attention_args *a = job->args;
  const ci_paged_kv *kv = a->kv;
  const ci_kv_kernels *kern = &job->kernels;
  const int row = task / a->n_heads;
  const int head = task % a->n_heads;
  const int kv_head = head / (a->n_heads / kv->n_kv_heads);
  const int D = kv->head_dim;
  const float *q = a->q + ((int64_t)row * a->n_heads + head) * D;
  float *out = a->out + ((int64_t)row * a->n_heads + head) * D;
  const int64_t p = a->pos[row];
  const int64_t first = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
  float *scores = job->scratch + (int64_t)thread * (job->max_keys + 4 * D);
  float *qp = scores + job->max_keys, *acc = qp + 2 * D;
  kern->prepare(kern, kv, q, qp);
  float max_score = -INFINITY;
  for (int64_t j = first; j <= p; j++) {
    float s = kern->dot(kern, kv, qp, ci_kv_row_at(kv, 0, j, kv_head)) * a->scale;
    if (a->softcap > 0.0f) s = a->softcap * tanhf(s / a->softcap);
    scores[j - first] = s;
    if (s > max_score) max_score = s;
  }
  float total = 0.0f;
  for (int64_t j = 0; j <= p - first; j++) {
    scores[j] = expf(scores[j] - max_score);
    total += scores[j];
  }
  float inv_total = 1.0f / total;
  memset(acc, 0, (size_t)D * sizeof *acc);
  for (int64_t j = first; j <= p; j++)
    kern->axpy(kern, kv, acc, scores[j - first] * inv_total, ci_kv_row_at(kv, 1, j, kv_head));
  kern->finish(kern, kv, acc, out);
}

static int cpu_attention(ci_backend *be, const ci_attention_args *args) {
  cpu_backend *cpu = as_cpu(be);
  const ci_paged_kv *kv = args->kv;
  if (args->n_heads % kv->n_kv_heads != 0)
    return ci_fail("attention: %d query heads do not group over %d kv heads", args->n_heads,
                   kv->n_kv_heads);
  int64_t max_keys = 1;
  for (int r = 0; r < args->n_rows; r++) {
    int64_t keys =
        args->window > 0 && args->pos[r] + 1 > args->window ? args->window : args->pos[r] + 1;
    if (keys > max_keys) max_keys = keys;
    if (args->pos[r] / kv->block_tokens >= kv->n_table_entries)
      return ci_fail("attention: position %d is beyond the stored KV", args->pos[r]);
  }
  int threads = ci_threadpool_size(cpu->pool);
  attention_job job = {
      .args = args, .kernels = ci_cpu_kv_kernels(cpu->isa, &kv->format), .max_keys = max_keys};
  job.scratch = malloc((size_t)threads * (size_t)(max_keys + 4 * kv->head_dim) * sizeof(float));
  if (!job.scratch) return ci_fail("attention: out of memory for %lld keys", (long long)max_keys);
  ci_threadpool_run(cpu->pool, args->n_rows * args->n_heads, attention_task, &job);
  free(job.scratch);
  return CI_OK;
}

/* ==== Life cycle ==== */

static void cpu_destroy(ci_backend *be) {
  cpu_backend *cpu = as_cpu(be);
  ci_threadpool_free(cpu->pool);
  free(cpu);
}

static const ci_backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .matmul = cpu_matmul,
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
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
};

ci_backend *ci_cpu_backend_create(int n_threads) {
  if (n_threads <= 0) n_threads = ci_cpu_count();
  cpu_backend *cpu = calloc(1, sizeof *cpu);
  if (!cpu) {
    ci_fail("out of memory");
    return NULL;
  }
  cpu->base.ops = &cpu_ops;
  cpu->isa = ci_cpu_detect_isa();
  cpu->vec = ci_cpu_vec_kernels_get(cpu->isa);
  cpu->pool = ci_threadpool_create(n_threads);
  if (!cpu->pool) {
    free(cpu);
    return NULL;
  }
  return &cpu->base;
}
