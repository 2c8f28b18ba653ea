/* RoPE resolution: picks a layer type's RoPE parameters from either config serialisation and
 * builds its f32 inverse-frequency table in the reference's operation order (docs/models.md §3.1).
 */
#include "base/error.h"
#include "model/config_read.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The parameter object that applies to `layer_type`, or NULL for "use top-level keys". */
static json_t *rope_params_for(json_t *cfg, const char *layer_type) {
  json_t *params = json_object_get(cfg, "rope_parameters");
  if (params && json_is_object(params)) {
    if (layer_type) {
      json_t *keyed = json_object_get(params, layer_type);
      if (keyed && json_is_object(keyed)) return keyed;
    }
    if (json_object_get(params, "rope_type") || json_object_get(params, "rope_theta") ||
        json_object_get(params, "type"))
      return params;
  }
  json_t *scaling = json_object_get(cfg, "rope_scaling");
  if (scaling && json_is_object(scaling)) return scaling;
  return NULL;
}

/* Reads a required number from the RoPE dict. */
static int rope_num(json_t *params, const char *key, double *out) {
  json_t *v = params ? json_object_get(params, key) : NULL;
  if (!v || !json_is_number(v))
    return ci_fail("config.json: RoPE parameter \"%s\" is missing or not a number", key);
  *out = json_number_value(v);
  return CI_OK;
}

int ci_cfg_rope(json_t *cfg, const char *layer_type, int head_dim, double default_theta,
                ci_model_spec *spec, int index) {
  json_t *params = rope_params_for(cfg, layer_type);
  double theta = default_theta;
  if (ci_cfg_num(cfg, "rope_theta", default_theta, &theta)) return CI_ERR;
  const char *type = "default";
  if (params) {
    if (ci_cfg_num(params, "rope_theta", theta, &theta)) return CI_ERR;
    json_t *t = json_object_get(params, "rope_type");
    if (!t || json_is_null(t)) t = json_object_get(params, "type");
    if (t && !json_is_null(t)) {
      if (!json_is_string(t)) return ci_fail("config.json: rope_type must be a string");
      type = json_string_value(t);
    }
  }
  if (!(theta > 0)) return ci_fail("config.json: rope_theta must be > 0");
  if (!strcmp(type, "mrope")) type = "default";
  int half = head_dim / 2;
  ci_rope_table *table = &spec->ropes[index];
  table->inv_freq = calloc((size_t)(half ? half : 1), sizeof(float));
  if (!table->inv_freq) return ci_fail("out of memory");
  table->rope = (ci_rope){.head_dim = head_dim,
                          .rot_dim = head_dim,
                          .traditional = 0,
                          .inv_freq = table->inv_freq,
                          .qk_scale = 1.0f};
  /* Default table: 1 / theta^(2j/d) with the exponent and power in f32, as torch computes it. */
  for (int j = 0; j < half; j++) {
    float exponent = (float)(2 * j) / (float)head_dim;
    table->inv_freq[j] = 1.0f / powf((float)theta, exponent);
  }
  if (!strcmp(type, "default")) return CI_OK;
  if (!strcmp(type, "linear")) {
    double factor = 0;
    if (rope_num(params, "factor", &factor)) return CI_ERR;
    if (!(factor > 0)) return ci_fail("config.json: linear RoPE factor must be > 0");
    for (int j = 0; j < half; j++) table->inv_freq[j] /= (float)factor;
    return CI_OK;
  }
  if (!strcmp(type, "llama3")) {
    double factor = 0, low = 0, high = 0, original = 0;
    if (rope_num(params, "factor", &factor) || rope_num(params, "low_freq_factor", &low) ||
        rope_num(params, "high_freq_factor", &high))
      return CI_ERR;
    json_t *orig = json_object_get(params, "original_max_position_embeddings");
    if (orig && json_is_number(orig)) {
      original = json_number_value(orig);
    } else if (ci_cfg_num(cfg, "original_max_position_embeddings", 0, &original)) {
      return CI_ERR;
    }
    if (!(original > 0) && ci_cfg_num(cfg, "max_position_embeddings", 8192, &original))
      return CI_ERR;
    if (!(factor > 0) || !(low > 0) || !(high > low))
      return ci_fail("config.json: llama3 RoPE needs factor > 0 and high_freq_factor > "
                     "low_freq_factor > 0");
    float low_wavelen = (float)(original / low);
    float high_wavelen = (float)(original / high);
    for (int j = 0; j < half; j++) {
      float inv = table->inv_freq[j];
      float wavelen = 2.0f * (float)M_PI / inv;
      float scaled = wavelen > low_wavelen ? inv / (float)factor : inv;
      if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
        float smooth = ((float)original / wavelen - (float)low) / (float)(high - low);
        scaled = (1.0f - smooth) * scaled / (float)factor + smooth * scaled;
      }
      table->inv_freq[j] = scaled;
    }
    return CI_OK;
  }
  if (!strcmp(type, "proportional")) {
    /* Gemma 4 full layers: the first floor(p * D / 2) pairs rotate with the default table
     * (exponent over D) divided by factor; the remaining pairs stay unrotated. */
    double partial = 1.0, factor = 1.0;
    if (ci_cfg_num(params, "partial_rotary_factor", 1.0, &partial) ||
        ci_cfg_num(params, "factor", 1.0, &factor))
      return CI_ERR;
    if (!(partial > 0 && partial <= 1) || !(factor > 0))
      return ci_fail("config.json: proportional RoPE needs 0 < partial_rotary_factor <= 1 and "
                     "factor > 0");
    int rotated = (int)floor(partial * head_dim / 2.0);
    for (int j = 0; j < half; j++)
      table->inv_freq[j] = j < rotated ? table->inv_freq[j] / (float)factor : 0.0f;
    return CI_OK;
  }
  if (!strcmp(type, "dynamic"))
    return ci_fail("config.json: rope_type \"dynamic\" is not supported (its position-dependent "
                   "base is incompatible with a KV cache)");
  return ci_fail("config.json: rope_type \"%s\" is not supported yet (supported: default, "
                 "linear, llama3, proportional)",
                 type);
}
