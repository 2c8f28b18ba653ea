/* Qwen family: `qwen2` (q/k/v biases) and `qwen3` (q/k RMSNorm), docs/models.md §5.2-5.3. */
#include "base/error.h"
#include "model/config_read.h"

#include <string.h>

/* Qwen's optional sliding layers: use_sliding_window, max_window_layers, layer_types. */
static int configure_qwen_windows(json_t *cfg, ci_model_spec *spec) {
  int use_sliding;
  if (ci_cfg_bool(cfg, "use_sliding_window", 0, &use_sliding)) return CI_ERR;
  if (!use_sliding) return CI_OK;
  long long window, max_window_layers;
  if (ci_cfg_int(cfg, "sliding_window", 4096, 1, 1LL << 31, &window) ||
      ci_cfg_int(cfg, "max_window_layers", 28, 0, 1 << 30, &max_window_layers))
    return CI_ERR;
  json_t *types = json_object_get(cfg, "layer_types");
  if (types && json_is_array(types) && (int)json_array_size(types) != spec->n_layers)
    return ci_fail("config.json: layer_types has %zu entries for %d layers", json_array_size(types),
                   spec->n_layers);
  for (int i = 0; i < spec->n_layers; i++) {
    int sliding = i >= max_window_layers;
    if (types && json_is_array(types)) {
      json_t *t = json_array_get(types, (size_t)i);
      if (!json_is_string(t)) return ci_fail("config.json: layer_types entries must be strings");
      sliding = strcmp(json_string_value(t), "sliding_attention") == 0;
    }
    if (sliding) {
      spec->layers[i].kind = CI_ATTN_SLIDING;
      spec->layers[i].window = (int)window;
    }
  }
  return CI_OK;
}

int ci_family_qwen2_configure(json_t *cfg, ci_model_spec *spec) {
  if (ci_cfg_read_common(cfg, spec, 0)) return CI_ERR;
  spec->qkv_bias = 1; /* always; o_proj has none */
  spec->n_ropes = 1;
  if (ci_cfg_rope(cfg, NULL, spec->layers[0].head_dim, 1e6, spec, 0)) return CI_ERR;
  return configure_qwen_windows(cfg, spec);
}

int ci_family_qwen3_configure(json_t *cfg, ci_model_spec *spec) {
  if (ci_cfg_read_common(cfg, spec, 0)) return CI_ERR;
  int attention_bias;
  if (ci_cfg_bool(cfg, "attention_bias", 0, &attention_bias)) return CI_ERR;
  spec->qkv_bias = spec->o_bias = attention_bias;
  spec->qk_norm = 1;
  spec->n_ropes = 1;
  if (ci_cfg_rope(cfg, NULL, spec->layers[0].head_dim, 1e6, spec, 0)) return CI_ERR;
  return configure_qwen_windows(cfg, spec);
}
