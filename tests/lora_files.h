/* Writing LoRA adapter folders for tests: a deterministic adapter for a loaded model in PEFT
 * layout (adapter_config.json + adapter_model.safetensors, f32 A [r, in] / B [out, r]) or mlx-lm
 * layout (adapters.safetensors, bf16 lora_a [in, r] / lora_b [r, out]) holding the same values,
 * and the merged model folder W + scale · B A (f32 for adapted layers, quantized layers
 * dequantized first) as an independent reference. Header-only, for the test programs. */
#ifndef CI_TESTS_LORA_FILES_H
#define CI_TESTS_LORA_FILES_H

#include "io/safetensors.h"
#include "io/safetensors_write.h"
#include "model/lora.h"
#include "model/model.h"
#include "tensor/affine_quant.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int rank;
  float alpha;
  int rslora;
  int peft;         /* 1: PEFT layout, 0: mlx-lm */
  unsigned targets; /* bit t set: adapt ci_lora_target t in every layer that has it */
  uint32_t seed;
} test_lora_spec;

/* The scale the spec's config gives (the mlx-lm config states it directly). */
static inline float test_lora_scale(const test_lora_spec *s) {
  return s->alpha / (s->rslora ? sqrtf((float)s->rank) : (float)s->rank);
}

/* A bf16-representable value in (-0.15, 0.15) for element idx of part (0 = A, 1 = B). */
static inline float test_lora_value(uint32_t seed, int layer, int target, int part, int64_t idx) {
  uint64_t h = ((uint64_t)seed * 0x9E3779B97F4A7C15ULL) ^ ((uint64_t)layer << 40) ^
               ((uint64_t)target << 32) ^ ((uint64_t)part << 31) ^ (uint64_t)idx;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  h ^= h >> 33;
  float v = ((float)(h & 0xFFFFFF) / (float)0x1000000 - 0.5f) * 0.3f;
  uint32_t u;
  memcpy(&u, &v, 4);
  u &= 0xFFFF0000u;
  memcpy(&v, &u, 4);
  return v;
}

/* The model's weight of (layer, target) as lora.c finds it, or NULL. */
static inline const ci_tensor *test_lora_weight(const ci_model *m, int li, int t) {
  const ci_layer_weights *L = &m->layers[li];
  const int owner = m->spec.layers[li].cache_layer == li;
  const ci_tensor *w[CI_LORA_N_TARGETS] = {&L->wq,
                                           owner ? &L->wk : NULL,
                                           owner && !m->spec.layers[li].k_eq_v ? &L->wv : NULL,
                                           &L->wo,
                                           &L->w_gate,
                                           &L->w_up,
                                           &L->w_down};
  return w[t] && w[t]->data ? w[t] : NULL;
}

/* Writes the adapter of `spec` for `model` into the existing folder dir. Returns 0 or -1. */
static inline int test_lora_write(const char *dir, const ci_model *model,
                                  const test_lora_spec *spec) {
  char path[2048];
  snprintf(path, sizeof path, "%s/adapter_config.json", dir);
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  static const char *const names[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                      "gate_proj", "up_proj", "down_proj"};
  if (spec->peft) {
    fprintf(f,
            "{\"peft_type\": \"LORA\", \"task_type\": \"CAUSAL_LM\", \"r\": %d, "
            "\"lora_alpha\": %g, \"use_rslora\": %s, \"bias\": \"none\", "
            "\"lora_dropout\": 0.0, \"rank_pattern\": {}, \"alpha_pattern\": {}, "
            "\"target_modules\": [",
            spec->rank, spec->alpha, spec->rslora ? "true" : "false");
    for (int t = 0, first = 1; t < CI_LORA_N_TARGETS; t++)
      if (spec->targets & (1u << t)) fprintf(f, "%s\"%s\"", first ? "" : ", ", names[t]), first = 0;
    fprintf(f, "]}\n");
  } else {
    fprintf(f,
            "{\"fine_tune_type\": \"lora\", \"num_layers\": %d, \"lora_parameters\": "
            "{\"rank\": %d, \"scale\": %.9g, \"dropout\": 0.0}}\n",
            model->spec.n_layers, spec->rank, test_lora_scale(spec));
  }
  fclose(f);
  ci_st_writer *w = ci_st_writer_new();
  if (!w) return -1;
  void **blocks = calloc((size_t)model->spec.n_layers * CI_LORA_N_TARGETS * 2, sizeof *blocks);
  int n_blocks = 0, rc = 0;
  for (int li = 0; li < model->spec.n_layers && rc == 0; li++)
    for (int t = 0; t < CI_LORA_N_TARGETS && rc == 0; t++) {
      const ci_tensor *wt = test_lora_weight(model, li, t);
      if (!(spec->targets & (1u << t)) || !wt) continue;
      const int64_t out = wt->shape[0], in = wt->shape[1], r = spec->rank;
      char name[256];
      const char *path_t = ci_lora_target_path((ci_lora_target)t);
      if (spec->peft) {
        float *a = malloc((size_t)(r * in) * sizeof *a), *b = malloc((size_t)(out * r) * sizeof *b);
        blocks[n_blocks++] = a;
        blocks[n_blocks++] = b;
        for (int64_t i = 0; i < r * in; i++) a[i] = test_lora_value(spec->seed, li, t, 0, i);
        for (int64_t i = 0; i < out * r; i++) b[i] = test_lora_value(spec->seed, li, t, 1, i);
        const int64_t sa[2] = {r, in}, sb[2] = {out, r};
        snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.lora_A.weight", li,
                 path_t);
        rc |= ci_st_writer_add(w, name, CI_F32, 2, sa, a);
        snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.lora_B.weight", li,
                 path_t);
        rc |= ci_st_writer_add(w, name, CI_F32, 2, sb, b);
      } else { /* transposed, bf16 */
        uint16_t *a = malloc((size_t)(r * in) * 2), *b = malloc((size_t)(out * r) * 2);
        blocks[n_blocks++] = a;
        blocks[n_blocks++] = b;
        for (int64_t i = 0; i < in; i++)
          for (int64_t k = 0; k < r; k++) {
            float v = test_lora_value(spec->seed, li, t, 0, k * in + i);
            uint32_t u;
            memcpy(&u, &v, 4);
            a[i * r + k] = (uint16_t)(u >> 16);
          }
        for (int64_t k = 0; k < r; k++)
          for (int64_t o = 0; o < out; o++) {
            float v = test_lora_value(spec->seed, li, t, 1, o * r + k);
            uint32_t u;
            memcpy(&u, &v, 4);
            b[k * out + o] = (uint16_t)(u >> 16);
          }
        const int64_t sa[2] = {in, r}, sb[2] = {r, out};
        snprintf(name, sizeof name, "model.layers.%d.%s.lora_a", li, path_t);
        rc |= ci_st_writer_add(w, name, CI_BF16, 2, sa, a);
        snprintf(name, sizeof name, "model.layers.%d.%s.lora_b", li, path_t);
        rc |= ci_st_writer_add(w, name, CI_BF16, 2, sb, b);
      }
    }
  snprintf(path, sizeof path, "%s/%s", dir,
           spec->peft ? "adapter_model.safetensors" : "adapters.safetensors");
  if (rc == 0) rc = ci_st_writer_write(w, path);
  for (int i = 0; i < n_blocks; i++) free(blocks[i]);
  free(blocks);
  ci_st_writer_free(w);
  return rc ? -1 : 0;
}

/* Copies src_dir/name to dst_dir/name. Returns 0 or -1. */
static inline int test_lora_copy_file(const char *src_dir, const char *dst_dir, const char *name) {
  char a[2048], b[2048];
  snprintf(a, sizeof a, "%s/%s", src_dir, name);
  snprintf(b, sizeof b, "%s/%s", dst_dir, name);
  FILE *in = fopen(a, "rb"), *out = in ? fopen(b, "wb") : NULL;
  if (!in || !out) {
    if (in) fclose(in);
    return -1;
  }
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
  fclose(in);
  return fclose(out) == 0 ? 0 : -1;
}

/* Writes into dst_dir the model of src_dir (loaded as `model`) with the adapter of `spec` merged:
 * each adapted weight becomes f32 W + scale · B A (W dequantized when quantized); every other
 * tensor is copied as it is. Returns 0 or -1. */
static inline int test_lora_write_merged(const char *src_dir, const char *dst_dir,
                                         const ci_model *model, const test_lora_spec *spec) {
  if (test_lora_copy_file(src_dir, dst_dir, "config.json")) return -1;
  ci_weights *files = ci_weights_open(src_dir);
  ci_st_writer *w = ci_st_writer_new();
  if (!files || !w) return -1;
  const float scale = test_lora_scale(spec);
  float **merged = calloc((size_t)model->spec.n_layers * CI_LORA_N_TARGETS, sizeof *merged);
  int rc = 0;
  for (int li = 0; li < model->spec.n_layers && rc == 0; li++)
    for (int t = 0; t < CI_LORA_N_TARGETS && rc == 0; t++) {
      const ci_tensor *wt = test_lora_weight(model, li, t);
      if (!(spec->targets & (1u << t)) || !wt) continue;
      const int64_t out = wt->shape[0], in = wt->shape[1], r = spec->rank;
      float *m = malloc((size_t)(out * in) * sizeof *m);
      merged[li * CI_LORA_N_TARGETS + t] = m;
      for (int64_t o = 0; o < out; o++) {
        if (ci_dtype_is_affine(wt->dtype)) {
          const int bits = wt->dtype == CI_Q8 ? 8 : 4;
          const size_t sb = ci_dtype_get(wt->scale_dtype)->bits / 8;
          const int64_t groups = in / wt->group_size;
          rc |= ci_affine_dequantize_row((const uint32_t *)wt->data + o * in * bits / 32,
                                         (const char *)wt->scales + (size_t)(o * groups) * sb,
                                         (const char *)wt->biases + (size_t)(o * groups) * sb,
                                         wt->scale_dtype, in, bits, wt->group_size, m + o * in);
        } else {
          for (int64_t i = 0; i < in; i++)
            m[o * in + i] = ci_float_at(wt->dtype, wt->data, (size_t)(o * in + i));
        }
        for (int64_t i = 0; i < in; i++) {
          float d = 0.0f;
          for (int64_t k = 0; k < r; k++)
            d += test_lora_value(spec->seed, li, t, 1, o * r + k) *
                 test_lora_value(spec->seed, li, t, 0, k * in + i);
          m[o * in + i] += scale * d;
        }
      }
    }
  char module[512];
  for (int i = 0; i < ci_weights_count(files) && rc == 0; i++) {
    const ci_st_tensor *st = ci_weights_at(files, i);
    const float *replace = NULL;
    const ci_tensor *wt = NULL;
    int skip = 0;
    for (int li = 0; li < model->spec.n_layers && !replace && !skip; li++)
      for (int t = 0; t < CI_LORA_N_TARGETS && !replace && !skip; t++) {
        if (!merged[li * CI_LORA_N_TARGETS + t]) continue;
        snprintf(module, sizeof module, "model.layers.%d.%s.", li,
                 ci_lora_target_path((ci_lora_target)t));
        if (strncmp(st->name, module, strlen(module)) != 0) continue;
        const char *part = st->name + strlen(module);
        if (strcmp(part, "weight") == 0) {
          replace = merged[li * CI_LORA_N_TARGETS + t];
          wt = test_lora_weight(model, li, t);
        } else if (strcmp(part, "scales") == 0 || strcmp(part, "biases") == 0) {
          skip = 1;
        }
      }
    if (skip) continue;
    if (replace)
      rc |= ci_st_writer_add(w, st->name, CI_F32, 2, wt->shape, replace);
    else
      rc |= ci_st_writer_add(w, st->name, st->dtype, st->ndim, st->shape, st->data);
  }
  char path[2048];
  snprintf(path, sizeof path, "%s/model.safetensors", dst_dir);
  if (rc == 0) rc = ci_st_writer_write(w, path);
  for (int i = 0; i < model->spec.n_layers * CI_LORA_N_TARGETS; i++) free(merged[i]);
  free(merged);
  ci_st_writer_free(w);
  ci_weights_free(files);
  return rc ? -1 : 0;
}

#endif
