/* Public API random-weight models (cinfer_model_write_random, `cinfer init-random`): a model
 * folder for any supported config with seeded random weights, so realistic sizes can be
 * benchmarked without a download. Weights stream to disk row by row. */
#include "api/api_internal.h"

#include "base/error.h"
#include "base/threadpool.h"
#include "io/safetensors_write.h"
#include "model/manifest.h"
#include "tensor/affine_quant.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ==== Deterministic random rows ==== */

static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static uint64_t hash_name(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return h;
}

/* The threads that draw and quantize rows, each with its own scratch row (an 8B model's rows
 * are drawn and quantized in parallel: one thread took minutes for a quantized one). */
typedef struct {
  ci_threadpool *pool;
  int n_threads;
  float **row_f32;                     /* [n_threads][max_cols] */
  uint32_t **row_codes;                /* [n_threads][max_cols * 8 / 32] */
  uint16_t **row_scales, **row_biases; /* [n_threads][max_cols / 32] */
} row_workers;

/* One tensor being written: how its rows are drawn and stored. */
typedef struct {
  uint64_t seed;
  ci_manifest_kind kind;
  int64_t rows, cols;       /* an expert stack is experts*rows rows */
  int bits, group_size;     /* bits 0 = bf16 */
  int part;                 /* quantized: 0 codes, 1 scales, 2 biases */
  float center, half_width; /* values are uniform in center +- half_width */
  const row_workers *workers;
} tensor_source;

/* Whether a tensor kind is stored as rows of `cols` values (else it is one vector). */
static int is_row_major(ci_manifest_kind kind) {
  return kind == CI_MANIFEST_MATRIX || kind == CI_MANIFEST_EXPERTS || kind == CI_MANIFEST_CONV;
}

/* Whether a kind multiplies activations (norm weights, layer and router scales): drawn near 1. */
static int is_gain(ci_manifest_kind kind) {
  return kind == CI_MANIFEST_NORM || kind == CI_MANIFEST_SCALAR;
}

/* Row r of the tensor's f32 values: uniform with std 0.02 for matrices and expert stacks,
 * 1 +- 0.1 for norms and scalars, +-0.035 for biases (see set_distribution). The same (seed, r)
 * always gives the same row. */
static void draw_row(const tensor_source *src, int64_t r, float *out, int64_t n) {
  uint64_t state = src->seed ^ ((uint64_t)r * 0xD1B54A32D192ED03ull);
  const float half_width = src->half_width, center = src->center;
  for (int64_t i = 0; i < n; i += 2) {
    uint64_t bits = splitmix64(&state);
    float u0 = (float)(bits >> 40) * (1.0f / 16777216.0f);
    float u1 = (float)((bits >> 8) & 0xFFFFFF) * (1.0f / 16777216.0f);
    out[i] = center + (2.0f * u0 - 1.0f) * half_width;
    if (i + 1 < n) out[i + 1] = center + (2.0f * u1 - 1.0f) * half_width;
  }
}

/* Writes stored row r of the tensor into dst (row_bytes), with thread `thread`'s scratch. */
static int write_row(const tensor_source *src, int thread, int64_t r, uint8_t *dst,
                     size_t row_bytes) {
  const row_workers *wk = src->workers;
  float *row = wk->row_f32[thread];
  draw_row(src, r, row, src->cols);
  if (src->bits == 0) {
    uint16_t *out = (uint16_t *)dst;
    for (int64_t c = 0; c < src->cols; c++) out[c] = ci_f32_to_bf16(row[c]);
    return 0;
  }
  if (ci_affine_quantize_matrix(row, CI_F32, 1, src->cols, src->bits, src->group_size,
                                wk->row_codes[thread], CI_BF16, wk->row_scales[thread],
                                wk->row_biases[thread]))
    return CI_ERR;
  const void *part = src->part == 0   ? (const void *)wk->row_codes[thread]
                     : src->part == 1 ? (const void *)wk->row_scales[thread]
                                      : (const void *)wk->row_biases[thread];
  memcpy(dst, part, row_bytes);
  return 0;
}

/* Rows [first, first + count) of one fill, cut into tasks of consecutive rows. */
typedef struct {
  const tensor_source *src;
  uint8_t *dst;
  int64_t first, count;
  size_t row_bytes;
  int n_tasks;
  int failed; /* set (atomically) by a task whose quantization failed */
} fill_job;

static void fill_task(void *ctx, int task, int thread) {
  fill_job *job = ctx;
  const int64_t lo = job->count * task / job->n_tasks, hi = job->count * (task + 1) / job->n_tasks;
  for (int64_t i = lo; i < hi; i++)
    if (write_row(job->src, thread, job->first + i, job->dst + (size_t)i * job->row_bytes,
                  job->row_bytes)) {
      __atomic_store_n(&job->failed, 1, __ATOMIC_RELAXED);
      return;
    }
}

static int fill_rows(void *user, void *buf, size_t offset, size_t len) {
  tensor_source *src = user;
  const row_workers *wk = src->workers;
  size_t row_bytes;
  if (src->bits == 0) {
    row_bytes = (size_t)(is_row_major(src->kind) ? src->cols : src->rows) * 2;
  } else if (src->part == 0) {
    row_bytes = (size_t)src->cols * (size_t)src->bits / 8;
  } else {
    row_bytes = (size_t)(src->cols / src->group_size) * 2;
  }
  if (!is_row_major(src->kind)) { /* a vector is one row */
    float *row = wk->row_f32[0];
    draw_row(src, 0, row, src->rows);
    uint16_t *dst = buf;
    for (size_t i = 0; i < len / 2; i++) dst[i] = ci_f32_to_bf16(row[offset / 2 + i]);
    return 0;
  }
  if (offset % row_bytes || len % row_bytes)
    return ci_fail("init-random: row %zu bytes does not fit the write buffer", row_bytes);
  fill_job job = {src, buf, (int64_t)(offset / row_bytes), (int64_t)(len / row_bytes), row_bytes,
                  0,   0};
  const int64_t tasks = (int64_t)wk->n_threads * 4;
  job.n_tasks = (int)(job.count < tasks ? job.count : tasks);
  if (job.n_tasks > 0) ci_threadpool_run(wk->pool, job.n_tasks, fill_task, &job);
  if (__atomic_load_n(&job.failed, __ATOMIC_RELAXED))
    return ci_fail("init-random: quantizing a row failed");
  return 0;
}

/* Creates the pool and every thread's scratch for rows of up to max_cols values. */
static int row_workers_init(row_workers *wk, int64_t max_cols) {
  memset(wk, 0, sizeof *wk);
  wk->n_threads = ci_cpu_count();
  wk->pool = ci_threadpool_create(wk->n_threads);
  if (!wk->pool) return CI_ERR;
  const size_t n = (size_t)wk->n_threads;
  wk->row_f32 = calloc(n, sizeof *wk->row_f32);
  wk->row_codes = calloc(n, sizeof *wk->row_codes);
  wk->row_scales = calloc(n, sizeof *wk->row_scales);
  wk->row_biases = calloc(n, sizeof *wk->row_biases);
  if (!wk->row_f32 || !wk->row_codes || !wk->row_scales || !wk->row_biases)
    return ci_fail("init-random: out of memory");
  for (size_t t = 0; t < n; t++) {
    wk->row_f32[t] = malloc((size_t)max_cols * sizeof(float) + 64);
    wk->row_codes[t] = malloc((size_t)max_cols + 64); /* 8 bits a code at most */
    wk->row_scales[t] = malloc((size_t)(max_cols / 32) * 2 + 64);
    wk->row_biases[t] = malloc((size_t)(max_cols / 32) * 2 + 64);
    if (!wk->row_f32[t] || !wk->row_codes[t] || !wk->row_scales[t] || !wk->row_biases[t])
      return ci_fail("init-random: out of memory");
  }
  return CI_OK;
}

static void row_workers_free(row_workers *wk) {
  for (int t = 0; t < wk->n_threads; t++) {
    if (wk->row_f32) free(wk->row_f32[t]);
    if (wk->row_codes) free(wk->row_codes[t]);
    if (wk->row_scales) free(wk->row_scales[t]);
    if (wk->row_biases) free(wk->row_biases[t]);
  }
  free(wk->row_f32);
  free(wk->row_codes);
  free(wk->row_scales);
  free(wk->row_biases);
  ci_threadpool_free(wk->pool);
}

/* ==== Declaring the tensors ==== */

typedef struct {
  ci_st_writer *writer;
  uint64_t seed;
  int bits, group_size;
  tensor_source *sources; /* grows; one per written tensor */
  int n_sources, cap_sources;
  row_workers workers;
} init_job;

static tensor_source *new_source(init_job *job, const ci_manifest_entry *e, int bits, int part,
                                 const char *name) {
  if (job->n_sources == job->cap_sources) return NULL;
  tensor_source *src = &job->sources[job->n_sources++];
  memset(src, 0, sizeof *src);
  src->seed = job->seed ^ hash_name(e->module);
  src->kind = e->kind;
  src->rows = e->kind == CI_MANIFEST_EXPERTS ? e->experts * e->rows : e->rows;
  src->cols = e->cols;
  src->bits = bits;
  src->group_size = job->group_size;
  src->part = part;
  src->half_width = is_gain(e->kind) ? 0.1f : 0.02f * 1.7320508f;
  src->center = is_gain(e->kind) ? 1.0f : 0.0f;
  /* DeltaNet: decay rates exp(A_log) near 0.05 keep a long memory in the recurrent state; the
   * convolution mixes its taps at full strength */
  const size_t len = strlen(e->module);
  if (len >= 6 && !strcmp(e->module + len - 6, ".A_log")) src->center = -3.0f;
  if (e->kind == CI_MANIFEST_CONV) src->half_width = 0.5f;
  (void)name;
  src->workers = &job->workers;
  return src;
}

/* How each kind is stored: the name suffix (NULL: the bare module name, as the loader binds
 * it) and the number of dimensions. Only matrices are quantized; expert stacks stay bf16. */
static const struct {
  const char *suffix;
  int ndim;
} kind_layout[] = {
    [CI_MANIFEST_MATRIX] = {"weight", 2}, [CI_MANIFEST_NORM] = {"weight", 1},
    [CI_MANIFEST_BIAS] = {"bias", 1},     [CI_MANIFEST_SCALAR] = {NULL, 1},
    [CI_MANIFEST_EXPERTS] = {NULL, 3},    [CI_MANIFEST_CONV] = {"weight", 3},
};

static int declare_entry(void *ctx, const ci_manifest_entry *e) {
  init_job *job = ctx;
  char name[300];
  int64_t shape[3];
  int quantize = e->kind == CI_MANIFEST_MATRIX && job->bits != 0;
  if (quantize && e->cols % job->group_size != 0)
    return ci_fail("%s: input size %lld is not a multiple of group size %d", e->module,
                   (long long)e->cols, job->group_size);
  static const char *const parts[] = {"weight", "scales", "biases"};
  for (int part = 0; part < (quantize ? 3 : 1); part++) {
    const char *suffix = quantize ? parts[part] : kind_layout[e->kind].suffix;
    if (suffix)
      snprintf(name, sizeof name, "%s.%s", e->module, suffix);
    else
      snprintf(name, sizeof name, "%s", e->module);
    tensor_source *src = new_source(job, e, quantize ? job->bits : 0, part, name);
    if (!src) return ci_fail("init-random: out of memory");
    const int ndim = kind_layout[e->kind].ndim;
    ci_dtype dtype = CI_BF16;
    if (e->kind == CI_MANIFEST_EXPERTS) {
      shape[0] = e->experts;
      shape[1] = e->rows;
      shape[2] = e->cols;
    } else if (e->kind == CI_MANIFEST_CONV) { /* the raw checkpoint layout [C, 1, Kc] */
      shape[0] = e->rows;
      shape[1] = 1;
      shape[2] = e->cols;
    } else {
      shape[0] = e->rows;
      if (!quantize) {
        shape[1] = e->cols;
      } else if (part == 0) {
        shape[1] = e->cols * job->bits / 32;
        dtype = CI_U32;
      } else {
        shape[1] = e->cols / job->group_size;
      }
    }
    if (ci_st_writer_add_fill(job->writer, name, dtype, ndim, shape, fill_rows, src)) return CI_ERR;
  }
  return 0;
}

/* The tensors to write and the longest row (or vector) among them. */
typedef struct {
  int tensors;
  int64_t max_cols;
} entry_count;

static int count_entry(void *ctx, const ci_manifest_entry *e) {
  entry_count *count = ctx;
  count->tensors += e->kind == CI_MANIFEST_MATRIX ? 3 : 1;
  const int64_t n = is_row_major(e->kind) ? e->cols : e->rows;
  if (n > count->max_cols) count->max_cols = n;
  return 0;
}

/* Writes config.json into the output folder, adding the quantization map when quantized. */
static int write_config(json_t *config, const char *out_dir, int bits, int group_size) {
  if (bits) {
    json_t *q = json_pack("{s:i, s:i}", "group_size", group_size, "bits", bits);
    json_object_set(config, "quantization", q);
    json_object_set_new(config, "quantization_config", q);
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/config.json", out_dir);
  if (json_dump_file(config, path, JSON_INDENT(2) | JSON_SORT_KEYS))
    return ci_fail("cannot write %s", path);
  return CI_OK;
}

cinfer_status cinfer_model_write_random(const char *config_path, const char *out_dir,
                                        const cinfer_random_model_options *options) {
  if (!config_path || !out_dir)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_model_write_random: NULL path");
  const cinfer_random_model_options defaults = {NULL, 0, 0};
  if (!options) options = &defaults;
  const char *dtype = options->dtype;
  int bits = 0;
  if (dtype && !strcmp(dtype, "q8"))
    bits = 8;
  else if (dtype && !strcmp(dtype, "q4"))
    bits = 4;
  else if (dtype && strcmp(dtype, "bf16"))
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "dtype must be bf16, q8 or q4, got '%s'", dtype);
  const int group_size = options->group_size ? options->group_size : 64;
  if (group_size != 32 && group_size != 64 && group_size != 128)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "group size must be 32, 64 or 128, got %d",
                       options->group_size);
  json_error_t jerr;
  json_t *config = json_load_file(config_path, JSON_REJECT_DUPLICATES, &jerr);
  if (!config && ci_fail_if_unopenable(config_path))
    return ci_api_fail(CINFER_ERROR, "%s", ci_last_error());
  if (!config)
    return ci_api_fail(CINFER_ERROR, "%s: not valid JSON (line %d: %s)", config_path, jerr.line,
                       jerr.text);
  json_object_del(config, "quantization");
  json_object_del(config, "quantization_config");
  ci_model_spec spec;
  if (ci_model_spec_from_json(config, &spec)) {
    const cinfer_status status = ci_api_fail(CINFER_ERROR, "%s: %s", config_path, ci_last_error());
    json_decref(config);
    return status;
  }
  cinfer_status status = CINFER_ERROR;
  init_job job = {.seed = options->seed * 0x9E3779B97F4A7C15ull + 12345u,
                  .bits = bits,
                  .group_size = group_size};
  entry_count count = {0, 0};
  ci_manifest_each(&spec, "model.", !spec.tied, count_entry, &count);
  const int n_tensors = count.tensors;
  job.cap_sources = n_tensors;
  job.sources = calloc((size_t)n_tensors, sizeof *job.sources);
  job.writer = ci_st_writer_new();
  char path[4096];
  snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
  if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) {
    ci_fail("cannot create %s", out_dir);
  } else if (!job.sources || !job.writer) {
    ci_fail("out of memory for %d tensors", n_tensors);
  } else if (row_workers_init(&job.workers, count.max_cols)) {
    /* (the error is set) */
  } else if (!ci_manifest_each(&spec, "model.", !spec.tied, declare_entry, &job) &&
             !ci_st_writer_write(job.writer, path) &&
             !write_config(config, out_dir, bits, group_size)) {
    status = CINFER_OK;
  }
  row_workers_free(&job.workers);
  free(job.sources);
  ci_st_writer_free(job.writer);
  ci_model_spec_free(&spec);
  json_decref(config);
  return status;
}
