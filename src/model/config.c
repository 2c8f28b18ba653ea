/* config.json -> model spec: picks the text config, dispatches on model_type through the family
 * table, and validates the geometry every family shares. */
#include "base/error.h"
#include "model/config_read.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const ci_family families[] = {
    {"llama", ci_family_llama_configure},    {"mistral", ci_family_mistral_configure},
    {"qwen2", ci_family_qwen2_configure},    {"qwen3", ci_family_qwen3_configure},
    {"gemma2", ci_family_gemma2_configure},  {"gemma3_text", ci_family_gemma3_configure},
    {"gemma3", ci_family_gemma3_configure},  {"gemma4_text", ci_family_gemma4_configure},
    {"gemma4", ci_family_gemma4_configure},  {"qwen3_5_text", ci_family_qwen35_configure},
    {"qwen3_5", ci_family_qwen35_configure},
};
enum { N_FAMILIES = sizeof families / sizeof families[0] };

const char *ci_supported_model_types(void) {
  return "llama, mistral, qwen2, qwen3, gemma2, gemma3_text, gemma3, gemma4_text, gemma4, "
         "qwen3_5_text, qwen3_5";
}

void ci_model_spec_free(ci_model_spec *spec) {
  if (!spec) return;
  free(spec->layers);
  free(spec->cache_layers);
  for (int i = 0; i < CI_MAX_ROPES; i++) free(spec->ropes[i].inv_freq);
  for (int i = 0; i < spec->quant.n_overrides; i++) free(spec->quant.overrides[i].path);
  free(spec->quant.overrides);
  memset(spec, 0, sizeof *spec);
}

/* The object holding the text model's keys: text_config when present, else the top level. */
static json_t *text_config_of(json_t *config) {
  json_t *text = json_object_get(config, "text_config");
  return text && json_is_object(text) ? text : config;
}

/* Fills the per-layer fields a family left at zero (scale 1/sqrt(D), the global MLP width, its
 * own cache), numbers the cache layers (the attention layers that own a KV cache, in order;
 * DeltaNet layers have none) and checks that no owner follows a KV sharer. */
static int finish_layers(ci_model_spec *spec) {
  int owners = 0, sharers = 0;
  spec->cache_layers = malloc((size_t)spec->n_layers * sizeof *spec->cache_layers);
  if (!spec->cache_layers) return ci_fail("out of memory");
  for (int i = 0; i < spec->n_layers; i++) {
    ci_layer_spec *l = &spec->layers[i];
    if (l->attn_scale == 0.0f) l->attn_scale = 1.0f / sqrtf((float)l->head_dim);
    if (l->intermediate == 0) l->intermediate = spec->intermediate;
    if (l->mixer == CI_MIXER_DELTANET) {
      l->cache_layer = l->kv_index = -1;
      continue;
    }
    if (l->cache_layer == i) {
      if (sharers) return ci_fail("config.json: layer %d owns a KV cache after a sharer", i);
      spec->cache_layers[owners] = i;
      l->kv_index = owners++;
    } else if (l->cache_layer < 0 || l->cache_layer >= i ||
               spec->layers[l->cache_layer].mixer != CI_MIXER_ATTENTION) {
      return ci_fail("config.json: layer %d reads the KV of layer %d", i, l->cache_layer);
    } else {
      l->kv_index = spec->layers[l->cache_layer].kv_index;
      sharers++;
    }
  }
  spec->n_cache_layers = owners;
  return CI_OK;
}

int64_t ci_spec_deltanet_layer_floats(const ci_model_spec *spec) {
  const ci_deltanet_geometry *g = &spec->deltanet;
  const int64_t channels =
      2 * (int64_t)g->n_k_heads * g->k_head_dim + (int64_t)g->n_v_heads * g->v_head_dim;
  return (int64_t)(g->conv_kernel - 1) * channels +
         (int64_t)g->n_v_heads * g->k_head_dim * g->v_head_dim;
}

int64_t ci_spec_state_bytes(const ci_model_spec *spec) {
  return (int64_t)spec->n_deltanet_layers * ci_spec_deltanet_layer_floats(spec) *
         (int64_t)sizeof(float);
}

int ci_model_spec_from_json(json_t *config, ci_model_spec *spec) {
  memset(spec, 0, sizeof *spec);
  if (!json_is_object(config)) return ci_fail("config.json: top level must be a JSON object");
  json_t *text = text_config_of(config);
  json_t *type = json_object_get(text, "model_type");
  if (!type) type = json_object_get(config, "model_type");
  if (!type || !json_is_string(type))
    return ci_fail("config.json: \"model_type\" is missing (supported: %s)",
                   ci_supported_model_types());
  const char *name = json_string_value(type);
  const ci_family *family = NULL;
  for (int i = 0; i < N_FAMILIES; i++)
    if (strcmp(families[i].model_type, name) == 0) family = &families[i];
  if (!family)
    return ci_fail("config.json: unsupported model_type \"%s\" (supported: %s)", name,
                   ci_supported_model_types());
  spec->model_type = family->model_type;
  int status = family->configure(text, spec);
  /* A top-level eos_token_id overrides the nested one. */
  if (status == CI_OK && text != config && json_object_get(config, "eos_token_id")) {
    spec->n_eos = 0;
    json_t *eos = json_object_get(config, "eos_token_id");
    if (json_is_integer(eos)) {
      spec->eos_ids[spec->n_eos++] = (int)json_integer_value(eos);
    } else if (json_is_array(eos)) {
      size_t i;
      json_t *v;
      json_array_foreach(eos, i, v) if (json_is_integer(v) && spec->n_eos < CI_MAX_EOS)
          spec->eos_ids[spec->n_eos++] = (int)json_integer_value(v);
    }
  }
  /* a Qwen3.5 multimodal wrapper: the top-level tie_word_embeddings decides */
  if (status == CI_OK && text != config && !strncmp(family->model_type, "qwen3_5", 7) &&
      json_object_get(config, "tie_word_embeddings"))
    status = ci_cfg_bool(config, "tie_word_embeddings", spec->tied, &spec->tied);
  /* MLX conversions keep the quantization map at the top level of a nested config */
  if (status == CI_OK && text != config && !spec->quant.present)
    status = ci_cfg_quant_map(config, &spec->quant);
  if (status == CI_OK) status = finish_layers(spec);
  if (status == CI_OK) {
    /* Sizes must keep every [rows, cols] product inside int64 and per-row sizes inside int. */
    for (int i = 0; i < spec->n_layers && status == CI_OK; i++) {
      const ci_layer_spec *l = &spec->layers[i];
      if ((long long)spec->n_heads * l->head_dim > INT_MAX / 4 ||
          (long long)l->n_kv_heads * l->head_dim > INT_MAX / 4)
        status = ci_fail("config.json: attention width of layer %d is too large", i);
    }
  }
  if (status != CI_OK) ci_model_spec_free(spec);
  return status;
}

int ci_model_spec_load(const char *model_dir, ci_model_spec *spec) {
  memset(spec, 0, sizeof *spec);
  char path[4096];
  snprintf(path, sizeof path, "%s/config.json", model_dir);
  json_error_t jerr;
  json_t *config = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
  if (!config) {
    FILE *f = fopen(path, "rb");
    if (!f) return ci_fail("%s: missing (a model folder needs config.json)", path);
    fclose(f);
    return ci_fail("%s: not valid JSON (line %d: %s)", path, jerr.line, jerr.text);
  }
  int status = ci_model_spec_from_json(config, spec);
  json_decref(config);
  return status;
}
