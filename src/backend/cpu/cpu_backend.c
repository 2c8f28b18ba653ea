/* CPU backend: the op table over f32 activations, the CPU kernels and a thread pool. */
#include "backend/cpu/cpu_backend.h"

#include "base/error.h"
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

/* Address of (position, kv head) in a block store of `elem_bytes`-sized elements. */
static inline void *kv_row(const ci_paged_kv *kv, uint8_t *base, int64_t position, int head,
                           size_t elem_bytes) {
  int32_t block = kv->block_table[position / kv->block_tokens];
  int64_t slot = position % kv->block_tokens;
  uint8_t *block_start = base + (size_t)block * kv->block_bytes;
  return block_start +
         (size_t)((int64_t)head * kv->block_tokens + slot) * kv->head_dim * elem_bytes;
}

/* How attention and kv_store touch one codec's rows: bf16 rows go through the ISA's vector
 * kernels, f32 rows through plain loops the compiler vectorizes. */
typedef struct {
  ci_kv_codec codec;
  size_t elem_bytes;
  const ci_cpu_vec_kernels *vec;
} codec_loops;

static codec_loops loops_for(const cpu_backend *cpu, ci_kv_codec codec) {
  return (codec_loops){codec, codec == CI_KV_F32 ? 4 : 2, cpu->vec};
}

/* <x, row> */
static inline float row_dot(const codec_loops *l, const float *x, const void *row, int64_t n) {
  if (l->codec == CI_KV_BF16) return l->vec->dot_bf16(x, row, n);
  const float *a = row;
  float sum = 0.0f;
  for (int64_t i = 0; i < n; i++) sum += x[i] * a[i];
  return sum;
}

/* y += alpha * row */
static inline void row_axpy(const codec_loops *l, float *y, float alpha, const void *row,
                            int64_t n) {
  if (l->codec == CI_KV_BF16) {
    l->vec->axpy_bf16(y, alpha, row, n);
    return;
  }
  const float *a = row;
  for (int64_t i = 0; i < n; i++) y[i] += alpha * a[i];
}

/* row = encode(src) */
static inline void row_store(const codec_loops *l, void *row, const float *src, int64_t n) {
  if (l->codec == CI_KV_BF16)
    l->vec->f32_to_bf16(row, src, n);
  else
    memcpy(row, src, (size_t)n * sizeof(float));
}

static int check_codec(const ci_paged_kv *kv, const char *op) {
  if (kv->codec != CI_KV_BF16 && kv->codec != CI_KV_F32)
    return ci_fail("%s: kv codec %d is not supported by the cpu backend", op, kv->codec);
  return CI_OK;
}

static int cpu_kv_store(ci_backend *be, const ci_paged_kv *kv, const float *k, const float *v,
                        const int32_t *pos, int n_rows) {
  cpu_backend *cpu = as_cpu(be);
  if (check_codec(kv, "kv_store")) return CI_ERR;
  codec_loops loops = loops_for(cpu, kv->codec);
  const int64_t row = (int64_t)kv->n_kv_heads * kv->head_dim;
  for (int r = 0; r < n_rows; r++) {
    if (pos[r] / kv->block_tokens >= kv->n_table_entries ||
        kv->block_table[pos[r] / kv->block_tokens] < 0)
      return ci_fail("kv_store: position %d has no block", pos[r]);
    for (int h = 0; h < kv->n_kv_heads; h++) {
      row_store(&loops, kv_row(kv, kv->k_base, pos[r], h, loops.elem_bytes),
                k + r * row + h * kv->head_dim, kv->head_dim);
      row_store(&loops, kv_row(kv, kv->v_base, pos[r], h, loops.elem_bytes),
                v + r * row + h * kv->head_dim, kv->head_dim);
    }
  }
  return CI_OK;
}

typedef struct {
  const ci_attention_args *args;
  codec_loops loops;
  float *scores; /* [threads][max_keys] */
  int64_t max_keys;
} attention_job;

/* One (query row, head): scores over the visible keys, softmax, weighted sum of values. */
static void attention_task(void *ctx, int task, int thread) {
  const attention_job *job = ctx;
  const ci_attention_args *a = job->args;
  const ci_paged_kv *kv = a->kv;
  const size_t eb = job->loops.elem_bytes;
  const int row = task / a->n_heads;
  const int head = task % a->n_heads;
  const int kv_head = head / (a->n_heads / kv->n_kv_heads);
  const int D = kv->head_dim;
  const float *q = a->q + ((int64_t)row * a->n_heads + head) * D;
  float *out = a->out + ((int64_t)row * a->n_heads + head) * D;
  const int64_t p = a->pos[row];
  const int64_t first = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
  float *scores = job->scores + (int64_t)thread * job->max_keys;
  float max_score = -INFINITY;
  for (int64_t j = first; j <= p; j++) {
    float s = row_dot(&job->loops, q, kv_row(kv, kv->k_base, j, kv_head, eb), D) * a->scale;
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
  memset(out, 0, (size_t)D * sizeof *out);
  for (int64_t j = first; j <= p; j++)
    row_axpy(&job->loops, out, scores[j - first] * inv_total,
             kv_row(kv, kv->v_base, j, kv_head, eb), D);
}

static int cpu_attention(ci_backend *be, const ci_attention_args *args) {
  cpu_backend *cpu = as_cpu(be);
  const ci_paged_kv *kv = args->kv;
  if (check_codec(kv, "attention")) return CI_ERR;
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
  attention_job job = {.args = args, .loops = loops_for(cpu, kv->codec), .max_keys = max_keys};
  job.scores = malloc((size_t)threads * (size_t)max_keys * sizeof(float));
  if (!job.scores) return ci_fail("attention: out of memory for %lld keys", (long long)max_keys);
  ci_threadpool_run(cpu->pool, args->n_rows * args->n_heads, attention_task, &job);
  free(job.scores);
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
