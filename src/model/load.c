/* Model loading: binds the safetensors tensors named by the spec to the layer structs,
 * checking dtype, shape and quantization of each, and rejects anything missing or unused. */
#include "base/error.h"
#include "io/kv_config.h"
#include "io/safetensors.h"
#include "model/identity.h"
#include "model/manifest.h"
#include "model/model.h"
#include "model/tensor_parallel.h"

#include <stddef.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Takes `<module>.<part>` from the files, NULL if absent. */
static ci_st_tensor *take_part(ci_model *m, const char *module, const char *part) {
  char name[512];
  snprintf(name, sizeof name, "%s.%s", module, part);
  return ci_weights_take(m->files, name);
}

static int check_2d(const ci_st_tensor *t, const char *name, int64_t rows, int64_t cols) {
  if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
    return ci_fail("tensor %s: shape %s[%lld, %lld] expected [%lld, %lld] from config.json", name,
                   t->ndim == 2 ? "" : "(not 2-D) ", t->ndim > 0 ? (long long)t->shape[0] : 0LL,
                   t->ndim > 1 ? (long long)t->shape[1] : 0LL, (long long)rows, (long long)cols);
  return CI_OK;
}

/* Binds linear/embedding module `module` of logical shape [rows, cols] (plain float weight, or
 * MLX affine codes + scales + biases as the quantization map says). */
static int bind_matrix(ci_model *m, const char *module, int64_t rows, int64_t cols,
                       ci_tensor *out) {
  char name[512];
  snprintf(name, sizeof name, "%s.weight", module);
  ci_st_tensor *w = ci_weights_take(m->files, name);
  if (!w) return ci_fail("missing tensor %s", name);
  ci_st_tensor *scales = take_part(m, module, "scales");
  ci_st_tensor *biases = take_part(m, module, "biases");
  memset(out, 0, sizeof *out);
  out->ndim = 2;
  out->shape[0] = rows;
  out->shape[1] = cols;
  out->data = w->data;
  if (!scales) {
    if (biases) return ci_fail("tensor %s.biases has no matching .scales", module);
    if (w->dtype != CI_F32 && w->dtype != CI_F16 && w->dtype != CI_BF16)
      return ci_fail("tensor %s: dtype %s is not a float weight (and no .scales: not quantized)",
                     name, ci_dtype_get(w->dtype)->name);
    out->dtype = w->dtype;
    return check_2d(w, name, rows, cols);
  }
  if (!biases) return ci_fail("tensor %s.scales has no matching .biases", module);
  ci_quant q = ci_quant_lookup(&m->spec.quant, module);
  if (q.bits == 0)
    return ci_fail("tensor %s is quantized (has .scales) but config.json has no quantization "
                   "for it",
                   module);
  if (w->dtype != CI_U32) return ci_fail("tensor %s: quantized codes must be U32", name);
  if (scales->dtype != biases->dtype ||
      (scales->dtype != CI_F32 && scales->dtype != CI_F16 && scales->dtype != CI_BF16))
    return ci_fail("tensor %s.scales/.biases must share a float dtype", module);
  if (cols % q.group_size != 0)
    return ci_fail("tensor %s: input size %lld is not a multiple of group_size %d", module,
                   (long long)cols, q.group_size);
  if (check_2d(w, name, rows, cols * q.bits / 32)) return ci_fail_context("%d-bit codes", q.bits);
  char part[512];
  snprintf(part, sizeof part, "%s.scales", module);
  if (check_2d(scales, part, rows, cols / q.group_size)) return CI_ERR;
  snprintf(part, sizeof part, "%s.biases", module);
  if (check_2d(biases, part, rows, cols / q.group_size)) return CI_ERR;
  out->dtype = q.bits == 8 ? CI_Q8 : CI_Q4;
  out->scales = scales->data;
  out->biases = biases->data;
  out->scale_dtype = scales->dtype;
  out->group_size = q.group_size;
  return CI_OK;
}

/* A backend copy of n host floats, or NULL with ci_last_error. */
static float *backend_floats(ci_backend *be, const float *host, int64_t n) {
  float *copy = be->ops->alloc(be, (size_t)n * sizeof(float));
  if (copy) be->ops->upload(be, copy, host, (size_t)n * sizeof(float));
  return copy;
}

/* Copies elements [first, first + count) of the 1-D float tensor `name` of `len` elements to an
 * owned f32 array in backend memory. */
static int bind_vector_part(ci_model *m, const char *name, int64_t len, int64_t first,
                            int64_t count, float **out) {
  *out = NULL;
  ci_st_tensor *t = ci_weights_take(m->files, name);
  if (!t) return ci_fail("missing tensor %s", name);
  if (t->dtype != CI_F32 && t->dtype != CI_F16 && t->dtype != CI_BF16)
    return ci_fail("tensor %s: dtype %s is not a float type", name, ci_dtype_get(t->dtype)->name);
  if (t->ndim != 1 || t->shape[0] != len)
    return ci_fail("tensor %s: shape disagrees with config.json (expected [%lld])", name,
                   (long long)len);
  float *host = malloc((size_t)count * sizeof(float));
  if (!host) return ci_fail("out of memory");
  for (int64_t i = 0; i < count; i++) host[i] = ci_float_at(t->dtype, t->data, (size_t)(first + i));
  *out = backend_floats(m->be, host, count);
  free(host);
  return *out ? CI_OK : CI_ERR;
}

/* The whole vector. */
static int bind_vector(ci_model *m, const char *name, int64_t len, float **out) {
  return bind_vector_part(m, name, len, 0, len, out);
}

/* Binds a bare stack of expert matrices `name` [experts, rows, cols] (plain float dtypes). */
static int bind_experts(ci_model *m, const char *name, int64_t experts, int64_t rows, int64_t cols,
                        ci_tensor *out) {
  ci_st_tensor *t = ci_weights_take(m->files, name);
  if (!t) return ci_fail("missing tensor %s", name);
  if (t->dtype != CI_F32 && t->dtype != CI_F16 && t->dtype != CI_BF16)
    return ci_fail("tensor %s: dtype %s is not a float weight", name, ci_dtype_get(t->dtype)->name);
  if (t->ndim != 3 || t->shape[0] != experts || t->shape[1] != rows || t->shape[2] != cols)
    return ci_fail("tensor %s: shape disagrees with config.json (expected [%lld, %lld, %lld])",
                   name, (long long)experts, (long long)rows, (long long)cols);
  memset(out, 0, sizeof *out);
  out->dtype = t->dtype;
  out->ndim = 3;
  out->shape[0] = experts;
  out->shape[1] = rows;
  out->shape[2] = cols;
  out->data = t->data;
  return CI_OK;
}

/* Binds a depthwise convolution `<module>.weight` of `channels` x `width` as an owned f32
 * [channels, width] array in backend memory. Raw checkpoints store [C, 1, Kc], MLX conversions
 * [C, Kc, 1] (and fold the +1 of the zero-centred norms in): the layout sets the model's norm
 * offset, which every convolution must agree on (docs/models.md §5.8). */
static int bind_conv(ci_model *m, const char *module, int64_t channels, int64_t width,
                     float **out) {
  char name[300];
  snprintf(name, sizeof name, "%s.weight", module);
  *out = NULL;
  ci_st_tensor *t = ci_weights_take(m->files, name);
  if (!t) return ci_fail("missing tensor %s", name);
  if (t->dtype != CI_F32 && t->dtype != CI_F16 && t->dtype != CI_BF16)
    return ci_fail("tensor %s: dtype %s is not a float type (convolutions are never quantized)",
                   name, ci_dtype_get(t->dtype)->name);
  int mlx;
  if (t->ndim == 3 && t->shape[0] == channels && t->shape[1] == 1 && t->shape[2] == width)
    mlx = 0;
  else if (t->ndim == 3 && t->shape[0] == channels && t->shape[1] == width && t->shape[2] == 1)
    mlx = 1;
  else
    return ci_fail("tensor %s: shape disagrees with config.json (expected [%lld, 1, %lld] or "
                   "the MLX [%lld, %lld, 1])",
                   name, (long long)channels, (long long)width, (long long)channels,
                   (long long)width);
  const float offset = mlx ? 0.0f : 1.0f;
  if (m->conv_layout_seen && m->spec.norm_weight_offset != offset)
    return ci_fail("tensor %s: convolution layout %s differs from the model's other layers", name,
                   mlx ? "[C, Kc, 1]" : "[C, 1, Kc]");
  m->conv_layout_seen = 1;
  m->spec.norm_weight_offset = offset;
  const int64_t n = channels * width;
  float *host = malloc((size_t)n * sizeof(float));
  if (!host) return ci_fail("out of memory");
  for (int64_t i = 0; i < n; i++) host[i] = ci_float_at(t->dtype, t->data, (size_t)i);
  *out = backend_floats(m->be, host, n);
  free(host);
  return *out ? CI_OK : CI_ERR;
}

/* Binds one manifest entry into the model. */
static int bind_entry(void *ctx, const ci_manifest_entry *e) {
  ci_model *m = ctx;
  char name[300];
  void *dst;
  if (e->layer >= 0) {
    dst = (char *)&m->layers[e->layer] + e->field;
  } else {
    static const size_t global_fields[] = {[CI_GLOBAL_EMBED] = offsetof(ci_model, embed),
                                           [CI_GLOBAL_FINAL_NORM] = offsetof(ci_model, final_norm),
                                           [CI_GLOBAL_HEAD] = offsetof(ci_model, head),
                                           [CI_GLOBAL_PLE_EMBED] = offsetof(ci_model, ple_embed),
                                           [CI_GLOBAL_PLE_PROJ] =
                                               offsetof(ci_model, ple_model_proj),
                                           [CI_GLOBAL_PLE_NORM] = offsetof(ci_model, ple_norm)};
    dst = (char *)m + global_fields[e->global_role];
  }
  switch (e->kind) {
  case CI_MANIFEST_MATRIX:
    if (bind_matrix(m, e->module, e->rows, e->cols, dst)) return CI_ERR;
    if (m->shard.world > 1 && e->layer < 0 && e->global_role == CI_GLOBAL_EMBED)
      m->shard.embed_host = *(const ci_tensor *)dst; /* a tied head's rows come from here */
    if (ci_tp_shard_matrix(m, e, dst)) return ci_fail_context("tensor %s", e->module);
    if (m->be->ops->prepare_weight(m->be, dst)) return ci_fail_context("tensor %s", e->module);
    return CI_OK;
  case CI_MANIFEST_NORM:
    snprintf(name, sizeof name, "%s.weight", e->module);
    return bind_vector(m, name, e->rows, dst);
  case CI_MANIFEST_BIAS: {
    snprintf(name, sizeof name, "%s.bias", e->module);
    int64_t first, count;
    ci_tp_bias_range(m, e, &first, &count);
    return bind_vector_part(m, name, e->rows, first, count, dst);
  }
  case CI_MANIFEST_SCALAR:
    return bind_vector(m, e->module, e->rows, dst);
  case CI_MANIFEST_CONV:
    return bind_conv(m, e->module, e->rows, e->cols, dst);
  case CI_MANIFEST_EXPERTS:
    if (bind_experts(m, e->module, e->experts, e->rows, e->cols, dst)) return CI_ERR;
    if (m->be->ops->prepare_weight(m->be, dst)) return ci_fail_context("tensor %s", e->module);
    return CI_OK;
  }
  return ci_fail("manifest: unknown tensor kind");
}

/* Tensors that checkpoints carry but no supported family reads (docs/models.md §1, drop list). */
static int is_droppable(const char *name) {
  static const char *const dropped_prefixes[] = {
      "vision_tower.", "multi_modal_projector.", "embed_vision.", "audio_tower.",
      "embed_audio.",  "vision_embedder.",       "visual.",       "mtp."};
  static const char *const dropped_suffixes[] = {"input_min", "input_max", "output_min",
                                                 "output_max"};
  /* Multimodal wrappers nest the towers under "model." too. */
  const char *bare = strncmp(name, "model.", 6) == 0 ? name + 6 : name;
  for (size_t i = 0; i < sizeof dropped_prefixes / sizeof dropped_prefixes[0]; i++)
    if (strncmp(bare, dropped_prefixes[i], strlen(dropped_prefixes[i])) == 0 ||
        strncmp(name, dropped_prefixes[i], strlen(dropped_prefixes[i])) == 0)
      return 1;
  size_t len = strlen(name);
  for (size_t i = 0; i < sizeof dropped_suffixes / sizeof dropped_suffixes[0]; i++) {
    size_t n = strlen(dropped_suffixes[i]);
    if (len > n && strcmp(name + len - n, dropped_suffixes[i]) == 0) return 1;
  }
  return strstr(name, ".rotary_emb.") != NULL;
}

/* Drops the K/V projections and K norm a KV-sharing layer's checkpoint may still carry. */
static void drop_sharer_kv(ci_model *m, const char *prefix) {
  static const char *const modules[] = {"self_attn.k_proj", "self_attn.v_proj", "self_attn.k_norm"};
  static const char *const parts[] = {"weight", "scales", "biases", "bias"};
  for (int i = 0; i < m->spec.n_layers; i++) {
    const ci_layer_spec *l = &m->spec.layers[i];
    if (l->mixer != CI_MIXER_ATTENTION || l->cache_layer == i) continue;
    for (size_t k = 0; k < sizeof modules / sizeof modules[0]; k++) {
      char module[256];
      snprintf(module, sizeof module, "%slayers.%d.%s", prefix, i, modules[k]);
      for (size_t p = 0; p < sizeof parts / sizeof parts[0]; p++) take_part(m, module, parts[p]);
    }
  }
}

/* A Gemma embedding scale converted to the embedding table's dtype first (docs/models.md §0). */
static float scale_in_dtype(float scale, const ci_tensor *table) {
  ci_dtype dtype = ci_dtype_is_affine(table->dtype) ? table->scale_dtype : table->dtype;
  if (dtype == CI_BF16) return ci_bf16_to_f32(ci_f32_to_bf16(scale));
  if (dtype == CI_F16) return ci_f16_to_f32(ci_f32_to_f16(scale));
  return scale;
}

/* The tensor-name prefix of the text model, found by where the embedding lives. */
static const char *find_prefix(ci_weights *files) {
  static const char *const prefixes[] = {"model.", "model.language_model.",
                                         "language_model.model."};
  for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
    char name[128];
    snprintf(name, sizeof name, "%sembed_tokens.weight", prefixes[i]);
    if (ci_weights_find(files, name)) return prefixes[i];
  }
  return NULL;
}

/* Drops the head tensors a tied model may still carry. */
static void drop_tied_head(ci_model *m, const char *head_module) {
  static const char *const parts[] = {"weight", "scales", "biases"};
  for (int i = 0; i < 3; i++) take_part(m, head_module, parts[i]);
}

static int bind_all(ci_model *m) {
  ci_model_spec *s = &m->spec;
  if (s->n_deltanet_layers > 0 && (!m->be->ops->gated_deltanet || !m->be->ops->sigmoid_mul))
    return ci_fail("%s models (gated DeltaNet layers) do not run on the %s backend yet (use the "
                   "cpu backend)",
                   s->model_type, m->be->ops->name);
  const char *prefix = find_prefix(m->files);
  if (!prefix)
    return ci_fail("missing tensor model.embed_tokens.weight (no embedding under any known "
                   "prefix)");
  const char *head_module =
      strcmp(prefix, "language_model.model.") == 0 ? "language_model.lm_head" : "lm_head";
  char name[300];
  snprintf(name, sizeof name, "%s.weight", head_module);
  /* An untied model (tie_word_embeddings false, or absent where the family defaults to
   * untied) must carry its own head: reusing the embedding would silently compute wrong logits. */
  if (!s->tied && !ci_weights_find(m->files, name))
    return ci_fail("missing tensor %s (config.json: tie_word_embeddings is false, so the model "
                   "needs its own output head)",
                   name);
  m->layers = calloc((size_t)s->n_layers, sizeof *m->layers);
  if (!m->layers) return ci_fail("out of memory");
  if (ci_manifest_each(s, prefix, !s->tied, bind_entry, m)) return CI_ERR;
  if (s->tied) {
    m->head = m->embed;
    drop_tied_head(m, head_module);
    if (m->shard.world > 1 && ci_tp_tied_head(m)) return CI_ERR;
  }
  drop_sharer_kv(m, prefix);
  for (int i = 0; i < s->n_layers; i++) /* the residual scale is a step argument, not data */
    if (m->layers[i].layer_scalar)
      m->be->ops->download(m->be, &m->layers[i].layer_scale, m->layers[i].layer_scalar,
                           sizeof(float));
  for (int r = 0; r < s->n_ropes; r++) { /* RoPE frequencies in backend memory */
    const ci_rope *rope = &s->ropes[r].rope;
    m->ropes[r] = *rope;
    m->rope_freqs[r] =
        backend_floats(m->be, rope->inv_freq, rope->rot_dim / 2 > 0 ? rope->rot_dim / 2 : 1);
    if (!m->rope_freqs[r]) return CI_ERR;
    m->ropes[r].inv_freq = m->rope_freqs[r];
  }
  m->spec.embed_scale = m->spec.embed_scale ? scale_in_dtype(m->spec.embed_scale, &m->embed) : 0;
  if (s->ple_dim > 0)
    m->spec.ple_embed_scale = scale_in_dtype(m->spec.ple_embed_scale, &m->ple_embed);
  for (int i = 0; i < ci_weights_count(m->files); i++) {
    const ci_st_tensor *t = ci_weights_at(m->files, i);
    if (!t->used && !is_droppable(t->name))
      return ci_fail("unexpected tensor %s (not part of a %s model with this config)", t->name,
                     s->model_type);
  }
  return CI_OK;
}

ci_model *ci_model_load(const char *model_dir, ci_backend *be) {
  return ci_model_load_in(model_dir, be, CI_WEIGHTS_MMAP);
}

ci_model *ci_model_load_in(const char *model_dir, ci_backend *be, ci_weights_memory memory) {
  return ci_model_load_shard(model_dir, be, memory, 0, 1, NULL);
}

ci_model *ci_model_load_shard(const char *model_dir, ci_backend *be, ci_weights_memory memory,
                              int rank, int world, ci_rank_collective *comm) {
  ci_model *m = calloc(1, sizeof *m);
  if (!m) {
    ci_fail("out of memory");
    return NULL;
  }
  m->be = be;
  m->shard = (ci_tp_shard){.rank = rank, .world = world, .comm = comm};
  if (ci_model_spec_load(model_dir, &m->spec)) {
    free(m);
    return NULL;
  }
  if (ci_tp_check_spec(&m->spec, world)) {
    ci_model_spec_free(&m->spec);
    free(m);
    return NULL;
  }
  m->files = ci_weights_open_in(model_dir, memory);
  if (!m->files || bind_all(m) ||
      ci_kv_config_load(model_dir, m->spec.n_cache_layers,
                        m->spec.n_deltanet_layers ? m->spec.cache_layers : NULL, &m->kv_config) ||
      ci_model_identity(model_dir, m->files, m->identity)) {
    ci_model_free(m);
    return NULL;
  }
  return m;
}

void ci_model_free(ci_model *m) {
  if (!m) return;
  ci_tp_group_free(m->tp);
  ci_workspace_free(m->workspace);
  if (m->layers) {
    for (int i = 0; i < m->spec.n_layers; i++) {
      ci_layer_weights *L = &m->layers[i];
      float *owned[] = {L->attn_norm,
                        L->mlp_norm,
                        L->bq,
                        L->bk,
                        L->bv,
                        L->bo,
                        L->q_norm,
                        L->k_norm,
                        L->b_gate,
                        L->b_up,
                        L->b_down,
                        L->attn_post_norm,
                        L->mlp_post_norm,
                        L->mlp_post_norm_1,
                        L->moe_norm,
                        L->moe_post_norm,
                        L->router_scale,
                        L->expert_scale,
                        L->ple_post_norm,
                        L->layer_scalar,
                        L->dn_conv,
                        L->dn_dt_bias,
                        L->dn_a_log,
                        L->dn_norm};
      for (size_t k = 0; k < sizeof owned / sizeof owned[0]; k++)
        if (owned[k]) m->be->ops->release(m->be, owned[k]);
    }
    free(m->layers);
  }
  float *globals[] = {m->final_norm, m->ple_norm, m->rope_freqs[0], m->rope_freqs[1]};
  for (size_t k = 0; k < sizeof globals / sizeof globals[0]; k++)
    if (globals[k]) m->be->ops->release(m->be, globals[k]);
  free(m->kv_config);
  ci_tp_shard_release(&m->shard);
  ci_weights_free(m->files);
  ci_model_spec_free(&m->spec);
  free(m);
}

/* Bytes of a bound matrix as stored (codes + scales + biases for affine formats). */
static int64_t matrix_bytes(const ci_tensor *t) {
  int64_t n = ci_tensor_numel(t);
  int64_t bytes = (int64_t)ci_dtype_bytes(t->dtype, (size_t)n);
  if (ci_dtype_is_affine(t->dtype))
    bytes += 2 * (n / t->group_size) * (int64_t)ci_dtype_bytes(t->scale_dtype, 1);
  return bytes;
}

typedef struct {
  const ci_model *model;
  int64_t bytes;
} byte_count;

/* Adds the stored bytes of every matrix but the embedding (decode reads one row of it). */
static int count_matrix_bytes(void *ctx, const ci_manifest_entry *e) {
  byte_count *count = ctx;
  if (e->layer < 0 || (e->kind != CI_MANIFEST_MATRIX && e->kind != CI_MANIFEST_EXPERTS))
    return 0; /* the head is added once by the caller; the embeddings read one row */
  const ci_tensor *t =
      (const ci_tensor *)((const char *)&count->model->layers[e->layer] + e->field);
  int64_t bytes = matrix_bytes(t);
  /* A token reads top_k of the experts. */
  if (e->kind == CI_MANIFEST_EXPERTS)
    bytes = bytes / t->shape[0] * count->model->spec.top_k_experts;
  count->bytes += bytes;
  return 0;
}

int ci_model_kv_heads_stored(const ci_model *m, const ci_layer_spec *layer) {
  return ci_tp_kv_heads_stored(layer->n_kv_heads, ci_model_tensor_parallel(m));
}

int64_t ci_model_weight_bytes_per_token(const ci_model *m) {
  byte_count count = {.model = m, .bytes = 0};
  ci_manifest_each(&m->spec, "model.", 0, count_matrix_bytes, &count);
  return count.bytes + matrix_bytes(&m->head); /* tied or not, the head is read once */
}

ci_kv_cache *ci_model_kv_cache_create(const ci_model *m, ci_kv_codec codec, int block_tokens,
                                      int64_t arena_bytes) {
  return ci_model_kv_cache_create_protected(m, codec, block_tokens, arena_bytes, 0);
}

ci_kv_cache *ci_model_kv_cache_create_protected(const ci_model *m, ci_kv_codec codec,
                                                int block_tokens, int64_t arena_bytes,
                                                int protect) {
  const int n_cache = m->spec.n_cache_layers;
  if (protect < 0) return ci_fail("kv protect must be >= 0"), NULL;
  ci_kv_layer_desc *desc = calloc((size_t)n_cache, sizeof *desc);
  if (!desc) {
    ci_fail("out of memory");
    return NULL;
  }
  for (int i = 0; i < n_cache; i++) {
    const ci_layer_spec *l = ci_spec_cache_layer(&m->spec, i);
    /* With a kv_config.json plan, layers of different target codecs get their own groups. */
    int plan_class = 0;
    if (m->kv_config)
      while (plan_class < i && !ci_kv_format_equal(&m->kv_config[plan_class], &m->kv_config[i]))
        plan_class++;
    if (ci_kv_layer_protected(i, n_cache, protect))
      plan_class = n_cache + i; /* a group of its own */
    desc[i] = (ci_kv_layer_desc){
        .window = l->kind == CI_ATTN_SLIDING ? l->window : 0,
        .n_kv_heads = ci_tp_kv_heads_here(l->n_kv_heads, ci_model_tensor_parallel(m)),
        .head_dim = l->head_dim,
        .plan_class = plan_class};
  }
  ci_kv_cache *cache = ci_kv_cache_create(m->be, n_cache, desc, codec, block_tokens, arena_bytes);
  free(desc);
  if (cache && m->tp && ci_tp_kv_cache_split(m, cache)) {
    ci_kv_cache_free(cache);
    return NULL;
  }
  if (cache && ci_kv_cache_set_state_bytes(cache, ci_spec_state_bytes(&m->spec))) {
    ci_kv_cache_free(cache);
    return NULL;
  }
  return cache;
}

int ci_model_kv_seq_apply_config(const ci_model *m, ci_kv_seq *seq) {
  if (!m->kv_config) return CI_OK;
  return ci_kv_seq_set_layer_plan(seq, m->kv_config, 0);
}
