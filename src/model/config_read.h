/* Typed, validating reads of config.json keys, shared by the family files. Each returns CI_OK
 * or CI_ERR with a message naming the key. */
#ifndef CI_MODEL_CONFIG_READ_H
#define CI_MODEL_CONFIG_READ_H

#include "model/spec.h"

#include <jansson.h>

/* Integer key; `fallback` when absent or null. Rejects non-integers and values outside
 * [min, max]. */
int ci_cfg_int(json_t *cfg, const char *key, long long fallback, long long min, long long max,
               long long *out);

/* Number key (integer or real); `fallback` when absent or null. */
int ci_cfg_num(json_t *cfg, const char *key, double fallback, double *out);

/* Boolean key; `fallback` when absent or null. */
int ci_cfg_bool(json_t *cfg, const char *key, int fallback, int *out);

/* Reads the MLX quantization map (`quantization`, or `quantization_config` with MLX fields) of
 * cfg into *map; absent leaves it not present. */
int ci_cfg_quant_map(json_t *cfg, ci_quant_map *map);

/* Reads the keys every family shares (sizes, eps, tie, eos, quantization map) and allocates
 * spec->layers with full attention and the global head_dim / n_kv_heads. `default_kv_heads`
 * 0 means "= num_attention_heads". */
int ci_cfg_read_common(json_t *cfg, ci_model_spec *spec, int default_kv_heads);

/* Resolves the RoPE of one layer type ("full_attention", "sliding_attention" or NULL) into
 * spec->ropes[index]: keyed rope_parameters -> flat rope_parameters -> rope_scaling +
 * rope_theta -> family default theta. */
int ci_cfg_rope(json_t *cfg, const char *layer_type, int head_dim, double default_theta,
                ci_model_spec *spec, int index);

/* A family: maps a config of its model_type(s) onto the spec. */
typedef struct {
  const char *model_type;
  int (*configure)(json_t *cfg, ci_model_spec *spec);
} ci_family;

int ci_family_llama_configure(json_t *cfg, ci_model_spec *spec);
int ci_family_mistral_configure(json_t *cfg, ci_model_spec *spec);
int ci_family_qwen2_configure(json_t *cfg, ci_model_spec *spec);
int ci_family_qwen3_configure(json_t *cfg, ci_model_spec *spec);
int ci_family_gemma2_configure(json_t *cfg, ci_model_spec *spec);
int ci_family_gemma3_configure(json_t *cfg, ci_model_spec *spec);
int ci_family_gemma4_configure(json_t *cfg, ci_model_spec *spec);
int ci_family_qwen35_configure(json_t *cfg, ci_model_spec *spec);

#endif
