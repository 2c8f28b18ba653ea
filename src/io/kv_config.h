/* kv_config.json (docs/kv-cache.md §7): the per-cache-layer KV codec plan a model folder may carry
 * — a JSON array of {layer_idx, bits, group_size} (MLX affine) or {layer_idx, codec: "turbo" |
 * "turbo-v", k_bits, v_bits}; unlisted layers stay bf16. */
#ifndef CI_IO_KV_CONFIG_H
#define CI_IO_KV_CONFIG_H

#include "tensor/kv_format.h"

/* Reads DIR/kv_config.json for a model with n_cache_layers cache-owning layers; an entry's
 * layer_idx is the model layer index of its cache layer: cache_layers[c] for cache layer c (NULL:
 * c itself). Sets *targets to a malloc'd [n_cache_layers] array (bf16 for unlisted layers; caller
 * frees), or NULL when the file is absent. Returns 0, or -1 with ci_last_error naming the file
 * and entry. */
int ci_kv_config_load(const char *model_dir, int n_cache_layers, const int *cache_layers,
                      ci_kv_format **targets);

#endif
