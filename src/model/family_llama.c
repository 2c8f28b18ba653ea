/* Llama family: `llama` (incl. MiniCPM5 checkpoints) and `mistral` (docs/models.md §5.1). */
#include "base/error.h"
#include "model/config_read.h"

/* Biases (attention_bias, mlp_bias) and the RoPE shared by both model types. */
static int configure_llama_like(json_t *cfg, ci_model_spec *spec) {
  if (ci_cfg_read_common(cfg, spec, 0)) return CI_ERR;
  int attention_bias, mlp_bias;
  if (ci_cfg_bool(cfg, "attention_bias", 0, &attention_bias) ||
      ci_cfg_bool(cfg, "mlp_bias", 0, &mlp_bias))
    return CI_ERR;
  spec->qkv_bias = spec->o_bias = attention_bias;
  spec->mlp_bias = mlp_bias;
  spec->n_ropes = 1;
  return ci_cfg_rope(cfg, NULL, spec->layers[0].head_dim, 10000.0, spec, 0);
}

int ci_family_llama_configure(json_t *cfg, ci_model_spec *spec) {
  return configure_llama_like(cfg, spec); /* no sliding window, whatever the config says */
}

int ci_family_mistral_configure(json_t *cfg, ci_model_spec *spec) {
  if (configure_llama_like(cfg, spec)) return CI_ERR;
  json_t *window = json_object_get(cfg, "sliding_window");
  long long w = 4096; /* class default when the key is absent; null means full attention */
  if (window && json_is_null(window)) return CI_OK;
  if (ci_cfg_int(cfg, "sliding_window", 4096, 1, 1LL << 31, &w)) return CI_ERR;
  for (int i = 0; i < spec->n_layers; i++) {
    spec->layers[i].kind = CI_ATTN_SLIDING;
    spec->layers[i].window = (int)w;
  }
  return CI_OK;
}
