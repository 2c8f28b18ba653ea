/* Gemma family: `gemma2`, `gemma3_text`/`gemma3` and `gemma4_text`/`gemma4` (docs/models.md
 * §5.5-5.7): sandwich norms, GeGLU, scaled embeddings, sliding/full layer patterns with per-type
 * RoPE, and Gemma 4's per-layer geometry, K=V full layers, per-layer inputs, KV sharing and MoE. */
#include "base/error.h"
#include "model/config_read.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ROPE_FULL = 0, ROPE_SLIDING = 1 };

static const char *const type_names[] = {"full_attention", "sliding_attention"};

/* Rejects bidirectional (embedding) variants, which need no causal mask. */
static int reject_bidirectional(json_t *cfg) {
  json_t *bidi = json_object_get(cfg, "use_bidirectional_attention");
  if (bidi &&
      (json_is_true(bidi) || (json_is_string(bidi) && strcmp(json_string_value(bidi), "all") == 0)))
    return ci_fail("config.json: use_bidirectional_attention is not supported (causal "
                   "language models only)");
  return CI_OK;
}

/* A softcap key: `fallback` when absent, off (0) when null. */
static int read_softcap(json_t *cfg, const char *key, double fallback, float *out) {
  json_t *v = json_object_get(cfg, key);
  if (v && json_is_null(v)) {
    *out = 0.0f;
    return CI_OK;
  }
  double cap;
  if (ci_cfg_num(cfg, key, fallback, &cap)) return CI_ERR;
  if (cap < 0) return ci_fail("config.json: \"%s\" must be >= 0", key);
  *out = (float)cap;
  return CI_OK;
}

/* Marks layers sliding from `layer_types` when present; otherwise `is_sliding(i)` decides.
 * Returns CI_ERR on a malformed list. */
static int read_layer_types(json_t *cfg, ci_model_spec *spec, int window, int pattern,
                            int even_sliding) {
  json_t *types = json_object_get(cfg, "layer_types");
  if (types && !json_is_null(types)) {
    if (!json_is_array(types) || (int)json_array_size(types) != spec->n_layers)
      return ci_fail("config.json: layer_types must list one type per layer (%d)", spec->n_layers);
  } else {
    types = NULL;
  }
  for (int i = 0; i < spec->n_layers; i++) {
    int sliding;
    if (types) {
      json_t *t = json_array_get(types, (size_t)i);
      if (!json_is_string(t)) return ci_fail("config.json: layer_types entries must be strings");
      const char *name = json_string_value(t);
      if (!strcmp(name, "sliding_attention"))
        sliding = 1;
      else if (!strcmp(name, "full_attention"))
        sliding = 0;
      else
        return ci_fail("config.json: layer type \"%s\" is not supported (full_attention, "
                       "sliding_attention)",
                       name);
    } else if (even_sliding) {
      sliding = i % 2 == 0;
    } else {
      sliding = (i + 1) % pattern != 0;
    }
    spec->layers[i].kind = sliding ? CI_ATTN_SLIDING : CI_ATTN_FULL;
    spec->layers[i].window = sliding ? window : 0;
    spec->layers[i].rope_index = sliding ? ROPE_SLIDING : ROPE_FULL;
  }
  return CI_OK;
}

/* Resolves a RoPE table from an explicit parameter object (or a fallback one). */
static int rope_from_params(json_t *params, int head_dim, ci_model_spec *spec, int index) {
  json_t *holder = json_object();
  if (!holder) return ci_fail("out of memory");
  json_object_set(holder, "rope_parameters", params);
  int status = ci_cfg_rope(holder, NULL, head_dim, 10000.0, spec, index);
  json_decref(holder);
  return status;
}

/* The keyed rope_parameters entry of a layer type, or NULL. */
static json_t *keyed_rope(json_t *cfg, int type) {
  json_t *params = json_object_get(cfg, "rope_parameters");
  if (!params || !json_is_object(params)) return NULL;
  json_t *entry = json_object_get(params, type_names[type]);
  return entry && json_is_object(entry) ? entry : NULL;
}

/* Settings every Gemma shares: sandwich norms, GeGLU, sqrt(hidden) embedding scale. */
static int read_gemma_common(json_t *cfg, ci_model_spec *spec) {
  if (reject_bidirectional(cfg)) return CI_ERR;
  if (ci_cfg_read_common(cfg, spec, 4)) return CI_ERR;
  if (ci_cfg_bool(cfg, "tie_word_embeddings", 1, &spec->tied)) return CI_ERR; /* default: tied */
  if (!json_object_get(cfg, "head_dim"))
    for (int i = 0; i < spec->n_layers; i++) spec->layers[i].head_dim = 256;
  int attention_bias;
  if (ci_cfg_bool(cfg, "attention_bias", 0, &attention_bias)) return CI_ERR;
  spec->qkv_bias = spec->o_bias = attention_bias;
  spec->act = CI_ACT_GELU_TANH;
  spec->wiring = CI_WIRING_SANDWICH;
  spec->embed_scale = sqrtf((float)spec->hidden); /* rounded to the table's dtype at load */
  return CI_OK;
}

/* query_pre_attn_scalar^-0.5 on every layer. */
static int read_query_scale(json_t *cfg, ci_model_spec *spec) {
  double qpas;
  if (ci_cfg_num(cfg, "query_pre_attn_scalar", 256, &qpas)) return CI_ERR;
  if (!(qpas > 0)) return ci_fail("config.json: query_pre_attn_scalar must be > 0");
  for (int i = 0; i < spec->n_layers; i++) spec->layers[i].attn_scale = (float)(1.0 / sqrt(qpas));
  return CI_OK;
}

int ci_family_gemma2_configure(json_t *cfg, ci_model_spec *spec) {
  if (read_gemma_common(cfg, spec) || read_query_scale(cfg, spec)) return CI_ERR;
  spec->norm_weight_offset = 1.0f;
  long long window;
  if (ci_cfg_int(cfg, "sliding_window", 4096, 1, 1LL << 31, &window) ||
      read_layer_types(cfg, spec, (int)window, 2, 1) ||
      read_softcap(cfg, "attn_logit_softcapping", 50.0, &spec->attn_softcap) ||
      read_softcap(cfg, "final_logit_softcapping", 30.0, &spec->final_softcap))
    return CI_ERR;
  /* One RoPE for every layer. */
  for (int i = 0; i < spec->n_layers; i++) spec->layers[i].rope_index = 0;
  spec->n_ropes = 1;
  return ci_cfg_rope(cfg, NULL, spec->layers[0].head_dim, 10000.0, spec, 0);
}

int ci_family_gemma3_configure(json_t *cfg, ci_model_spec *spec) {
  if (read_gemma_common(cfg, spec) || read_query_scale(cfg, spec)) return CI_ERR;
  spec->norm_weight_offset = 1.0f;
  spec->qk_norm = 1;
  long long window, pattern;
  if (ci_cfg_int(cfg, "sliding_window", 4096, 1, 1LL << 31, &window) ||
      ci_cfg_int(cfg, "sliding_window_pattern", 6, 1, 1 << 20, &pattern) ||
      read_layer_types(cfg, spec, (int)window, (int)pattern, 0) ||
      read_softcap(cfg, "final_logit_softcapping", 0.0, &spec->final_softcap))
    return CI_ERR;
  /* attn_logit_softcapping is read by the reference but never applied. */
  const int head_dim = spec->layers[0].head_dim;
  spec->n_ropes = 2;
  json_t *full = keyed_rope(cfg, ROPE_FULL);
  if (full ? rope_from_params(full, head_dim, spec, ROPE_FULL)
           : ci_cfg_rope(cfg, NULL, head_dim, 1e6, spec, ROPE_FULL))
    return CI_ERR;
  json_t *sliding = keyed_rope(cfg, ROPE_SLIDING);
  if (sliding) return rope_from_params(sliding, head_dim, spec, ROPE_SLIDING);
  double local_base;
  if (ci_cfg_num(cfg, "rope_local_base_freq", 10000.0, &local_base)) return CI_ERR;
  json_t *params = json_pack("{s:s, s:f}", "rope_type", "default", "rope_theta", local_base);
  if (!params) return ci_fail("out of memory");
  int status = rope_from_params(params, head_dim, spec, ROPE_SLIDING);
  json_decref(params);
  return status;
}

/* ==== Gemma 4 ==== */

/* Per-layer geometry (docs/models.md §5.7): per_layer_config entries when present, else one entry
 * per full layer from the flat global_head_dim / num_global_key_value_heads. */
static int read_gemma4_geometry(json_t *cfg, ci_model_spec *spec, int k_eq_v) {
  const int head_dim = spec->layers[0].head_dim, kv_heads = spec->layers[0].n_kv_heads;
  json_t *per_layer = json_object_get(cfg, "per_layer_config");
  if (per_layer && !json_is_null(per_layer)) {
    if (!json_is_object(per_layer))
      return ci_fail("config.json: per_layer_config must be an object keyed by layer index");
    const char *key;
    json_t *entry;
    json_object_foreach(per_layer, key, entry) {
      char *end;
      long index = strtol(key, &end, 10);
      if (*key == '\0' || *end != '\0' || index < 0 || index >= spec->n_layers)
        return ci_fail("config.json: per_layer_config key \"%s\" is not a layer index", key);
      if (!json_is_object(entry))
        return ci_fail("config.json: per_layer_config[\"%s\"] must be an object", key);
      long long d, h, q;
      if (ci_cfg_int(entry, "head_dim", head_dim, 2, CI_MAX_HEAD_DIM, &d) ||
          ci_cfg_int(entry, "num_key_value_heads", kv_heads, 1, 100000, &h) ||
          ci_cfg_int(entry, "num_attention_heads", spec->n_heads, 1, 100000, &q))
        return ci_fail_context("per_layer_config[\"%s\"]", key);
      if (q != spec->n_heads)
        return ci_fail("config.json: per_layer_config[\"%s\"] changes num_attention_heads "
                       "(not supported: q_proj is sized from the global value)",
                       key);
      spec->layers[index].head_dim = (int)d;
      spec->layers[index].n_kv_heads = (int)h;
    }
    return CI_OK;
  }
  long long global_dim, global_kv = 0;
  if (ci_cfg_int(cfg, "global_head_dim", 512, 2, CI_MAX_HEAD_DIM, &global_dim) ||
      ci_cfg_int(cfg, "num_global_key_value_heads", 0, 0, 100000, &global_kv))
    return CI_ERR;
  for (int i = 0; i < spec->n_layers; i++) {
    if (spec->layers[i].kind != CI_ATTN_FULL) continue;
    spec->layers[i].head_dim = (int)global_dim;
    if (k_eq_v && global_kv > 0) spec->layers[i].n_kv_heads = (int)global_kv;
  }
  return CI_OK;
}

/* Sharers (layers >= N - num_kv_shared_layers) read the last earlier layer of their type. */
static int read_gemma4_sharing(json_t *cfg, ci_model_spec *spec, int double_wide) {
  long long shared;
  if (ci_cfg_int(cfg, "num_kv_shared_layers", 0, 0, spec->n_layers - 1, &shared)) return CI_ERR;
  const int first_sharer = spec->n_layers - (int)shared;
  for (int i = first_sharer; i < spec->n_layers; i++) {
    ci_layer_spec *l = &spec->layers[i];
    int donor = -1;
    for (int j = first_sharer - 1; j >= 0 && donor < 0; j--)
      if (spec->layers[j].kind == l->kind) donor = j;
    if (donor < 0)
      return ci_fail("config.json: KV-shared layer %d has no earlier %s layer to read", i,
                     type_names[l->kind == CI_ATTN_SLIDING]);
    l->cache_layer = donor;
    l->n_kv_heads = spec->layers[donor].n_kv_heads;
    l->k_eq_v = spec->layers[donor].k_eq_v;
    if (double_wide) l->intermediate = 2 * spec->intermediate;
  }
  return CI_OK;
}

/* Per-layer inputs and MoE sizes. */
static int read_gemma4_extras(json_t *cfg, ci_model_spec *spec) {
  long long ple_dim, ple_vocab;
  json_t *p = json_object_get(cfg, "hidden_size_per_layer_input");
  if (p && json_is_null(p))
    ple_dim = 0;
  else if (ci_cfg_int(cfg, "hidden_size_per_layer_input", 256, 0, 1 << 20, &ple_dim))
    return CI_ERR;
  if (ci_cfg_int(cfg, "vocab_size_per_layer_input", 262144, 1, 1LL << 31, &ple_vocab))
    return CI_ERR;
  spec->ple_dim = (int)ple_dim;
  spec->ple_vocab = (int)ple_vocab;
  spec->ple_embed_scale = sqrtf((float)ple_dim);
  int moe;
  if (ci_cfg_bool(cfg, "enable_moe_block", 0, &moe)) return CI_ERR;
  if (!moe) return CI_OK;
  long long experts, top_k, width;
  if (ci_cfg_int(cfg, "num_experts", -1, 1, 1 << 16, &experts) ||
      ci_cfg_int(cfg, "top_k_experts", -1, 1, 1 << 16, &top_k) ||
      ci_cfg_int(cfg, "moe_intermediate_size", -1, 1, 1 << 30, &width))
    return CI_ERR;
  if (experts < 1 || top_k < 1 || width < 1 || top_k > experts)
    return ci_fail("config.json: enable_moe_block needs num_experts, top_k_experts <= "
                   "num_experts and moe_intermediate_size");
  spec->n_experts = (int)experts;
  spec->top_k_experts = (int)top_k;
  spec->moe_intermediate = (int)width;
  return CI_OK;
}

/* Gemma 4 RoPE per type: the keyed entry, else the type's default. */
static int read_gemma4_ropes(json_t *cfg, ci_model_spec *spec) {
  spec->n_ropes = 2;
  for (int type = 0; type < 2; type++) {
    int head_dim = 0;
    for (int i = 0; i < spec->n_layers; i++) {
      const ci_layer_spec *l = &spec->layers[i];
      if (l->rope_index != type) continue;
      if (head_dim && l->head_dim != head_dim)
        return ci_fail("config.json: %s layers disagree on head_dim (%d vs %d)", type_names[type],
                       head_dim, l->head_dim);
      head_dim = l->head_dim;
    }
    if (!head_dim) head_dim = spec->layers[0].head_dim; /* unused table */
    json_t *params = keyed_rope(cfg, type);
    json_t *fallback = NULL;
    if (!params) {
      fallback = type == ROPE_FULL
                     ? json_pack("{s:s, s:f, s:f}", "rope_type", "proportional",
                                 "partial_rotary_factor", 0.25, "rope_theta", 1e6)
                     : json_pack("{s:s, s:f}", "rope_type", "default", "rope_theta", 1e4);
      if (!fallback) return ci_fail("out of memory");
      params = fallback;
    }
    int status = rope_from_params(params, head_dim, spec, type);
    json_decref(fallback);
    if (status) return CI_ERR;
  }
  return CI_OK;
}

int ci_family_gemma4_configure(json_t *cfg, ci_model_spec *spec) {
  json_t *inter = json_object_get(cfg, "intermediate_size");
  if (inter && json_is_array(inter))
    return ci_fail("config.json: a per-layer intermediate_size list is not supported");
  if (read_gemma_common(cfg, spec)) return CI_ERR;
  spec->norm_weight_offset = 0.0f;
  spec->qk_norm = 1;
  spec->v_norm = 1;
  spec->layer_scalar = 1;
  long long window;
  int k_eq_v, double_wide;
  if (ci_cfg_int(cfg, "sliding_window", 512, 1, 1LL << 31, &window) ||
      read_layer_types(cfg, spec, (int)window, 6, 0) ||
      ci_cfg_bool(cfg, "attention_k_eq_v", 0, &k_eq_v) ||
      ci_cfg_bool(cfg, "use_double_wide_mlp", 0, &double_wide) ||
      read_softcap(cfg, "final_logit_softcapping", 0.0, &spec->final_softcap))
    return CI_ERR;
  /* The reference forces the last layer to full attention. */
  ci_layer_spec *last = &spec->layers[spec->n_layers - 1];
  last->kind = CI_ATTN_FULL;
  last->window = 0;
  last->rope_index = ROPE_FULL;
  if (read_gemma4_geometry(cfg, spec, k_eq_v)) return CI_ERR;
  for (int i = 0; i < spec->n_layers; i++) {
    ci_layer_spec *l = &spec->layers[i];
    l->attn_scale = 1.0f;
    l->k_eq_v = k_eq_v && l->kind == CI_ATTN_FULL;
    if (l->head_dim % 2 != 0) return ci_fail("config.json: head_dim of layer %d is odd", i);
    if (spec->n_heads % l->n_kv_heads != 0)
      return ci_fail("config.json: layer %d: %d query heads are not a multiple of %d KV heads", i,
                     spec->n_heads, l->n_kv_heads);
  }
  if (read_gemma4_sharing(cfg, spec, double_wide) || read_gemma4_extras(cfg, spec)) return CI_ERR;
  return read_gemma4_ropes(cfg, spec);
}
