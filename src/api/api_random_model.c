/* Public API random-weight models (cinfer_model_write_random, `cinfer init-random`): a model
 * folder for any supported config with seeded random weights, so realistic sizes can be
 * benchmarked without a download. Weights stream to disk row by row. */
#include "api/api_internal.h"

#include "base/error.h"
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

/* One tensor being written: how its rows are drawn and stored. */
typedef struct {
  uint64_t seed;
  ci_manifest_kind kind;
  int64_t rows, cols;       /* an expert stack is experts*rows rows */
  int bits, group_size;     /* bits 0 = bf16 */
  int part;                 /* quantized: 0 codes, 1 scales, 2 biases */
  float center, half_width; /* values are uniform in center +- half_width */
  float *row_f32;           /* [cols] scratch */
  uint32_t *row_codes;      /* [cols*bits/32] scratch */
  uint16_t *row_scales, *row_biases;
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

static int fill_rows(void *user, void *buf, size_t offset, size_t len) {
  tensor_source *src = user;
  size_t row_bytes;
  if (src->bits == 0) {
    row_bytes = (size_t)(is_row_major(src->kind) ? src->cols : src->rows) * 2;
  } else if (src->part == 0) {
    row_bytes = (size_t)src->cols * (size_t)src->bits / 8;
  } else {
    row_bytes = (size_t)(src->cols / src->group_size) * 2;
  }
  if (!is_row_major(src->kind)) { /* a vector is one row */
    draw_row(src, 0, src->row_f32, src->rows);
    uint16_t *dst = buf;
    for (size_t i = 0; i < len / 2; i++) dst[i] = ci_f32_to_bf16(src->row_f32[offset / 2 + i]);
    return 0;
  }
  if (offset % row_bytes || len % row_bytes)
    return ci_fail("init-random: row %zu bytes does not fit the write buffer", row_bytes);
  uint8_t *dst = buf;
  for (size_t r = offset / row_bytes; r < (offset + len) / row_bytes; r++, dst += row_bytes) {
    draw_row(src, (int64_t)r, src->row_f32, src->cols);
    if (src->bits == 0) {
      uint16_t *out = (uint16_t *)dst;
      for (int64_t c = 0; c < src->cols; c++) out[c] = ci_f32_to_bf16(src->row_f32[c]);
      continue;
    }
    if (ci_affine_quantize_matrix(src->row_f32, CI_F32, 1, src->cols, src->bits, src->group_size,
                                  src->row_codes, CI_BF16, src->row_scales, src->row_biases))
      return CI_ERR;
    const void *part = src->part == 0   ? (const void *)src->row_codes
                       : src->part == 1 ? (const void *)src->row_scales
                                        : (const void *)src->row_biases;
    memcpy(dst, part, row_bytes);
  }
  return 0;
}

/* ==== Declaring the tensors ==== */

typedef struct {
  ci_st_writer *writer;
  uint64_t seed;
  int bits, group_size;
  tensor_source *sources; /* grows; one per written tensor */
  int n_sources, cap_sources;
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
  int64_t n = is_row_major(e->kind) ? e->cols : e->rows;
  src->row_f32 = malloc((size_t)n * sizeof(float) + 64);
  if (bits) {
    src->row_codes = malloc((size_t)e->cols * (size_t)bits / 8 + 64);
    src->row_scales = malloc((size_t)(e->cols / job->group_size) * 2 + 64);
    src->row_biases = malloc((size_t)(e->cols / job->group_size) * 2 + 64);
  }
  if (!src->row_f32 || (bits && (!src->row_codes || !src->row_scales || !src->row_biases)))
    return NULL;
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

static int count_entry(void *ctx, const ci_manifest_entry *e) {
  (*(int *)ctx) += e->kind == CI_MANIFEST_MATRIX ? 3 : 1;
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
  int n_tensors = 0;
  ci_manifest_each(&spec, "model.", !spec.tied, count_entry, &n_tensors);
  job.cap_sources = n_tensors;
  job.sources = calloc((size_t)n_tensors, sizeof *job.sources);
  job.writer = ci_st_writer_new();
  char path[4096];
  snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
  if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) {
    ci_fail("cannot create %s", out_dir);
  } else if (!job.sources || !job.writer) {
    ci_fail("out of memory for %d tensors", n_tensors);
  } else if (!ci_manifest_each(&spec, "model.", !spec.tied, declare_entry, &job) &&
             !ci_st_writer_write(job.writer, path) &&
             !write_config(config, out_dir, bits, group_size)) {
    status = CINFER_OK;
  }
  for (int i = 0; i < job.n_sources; i++) {
    free(job.sources[i].row_f32);
    free(job.sources[i].row_codes);
    free(job.sources[i].row_scales);
    free(job.sources[i].row_biases);
  }
  free(job.sources);
  ci_st_writer_free(job.writer);
  ci_model_spec_free(&spec);
  json_decref(config);
  return status;
}
