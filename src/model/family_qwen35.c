/* Qwen3.5 hybrid family (`qwen3_5_text`, and the text part of `qwen3_5`): gated DeltaNet
 * "linear attention" layers beside gated full-attention layers with partial RoPE
 * (docs/models.md §5.8). Reads the layer pattern, the DeltaNet geometry and the partial rotary
 * table; zero-centred norms are the default (the loader switches to plain norms for MLX
 * conversions, which fold the +1 in). */
#include "base/error.h"
#include "model/config_read.h"

#include <math.h>
#include <string.h>

/* Layer i's mixer from layer_types (with the legacy names transformers remaps) or, without it,
 * full_attention_interval: linear unless (i + 1) % interval == 0. */
static int read_layer_types(json_t *cfg, ci_model_spec *spec) {
  json_t *types = json_object_get(cfg, "layer_types");
  if (types && !json_is_null(types)) {
    if (!json_is_array(types) || (int)json_array_size(types) != spec->n_layers)
      return ci_fail("config.json: layer_types must list one type for each of the %d layers",
                     spec->n_layers);
    for (int i = 0; i < spec->n_layers; i++) {
      json_t *t = json_array_get(types, (size_t)i);
      const char *name = json_is_string(t) ? json_string_value(t) : "";
      if (!strcmp(name, "linear_attention") || !strcmp(name, "mamba") || !strcmp(name, "conv"))
        spec->layers[i].mixer = CI_MIXER_DELTANET;
      else if (!strcmp(name, "full_attention") || !strcmp(name, "attention"))
        spec->layers[i].mixer = CI_MIXER_ATTENTION;
      else
        return ci_fail("config.json: layer_types[%d] \"%s\" is not linear_attention or "
                       "full_attention",
                       i, name);
    }
    return CI_OK;
  }
  long long interval;
  if (ci_cfg_int(cfg, "full_attention_interval", 4, 1, 1 << 20, &interval)) return CI_ERR;
  for (int i = 0; i < spec->n_layers; i++)
    spec->layers[i].mixer = (i + 1) % interval ? CI_MIXER_DELTANET : CI_MIXER_ATTENTION;
  return CI_OK;
}

static int read_deltanet(json_t *cfg, ci_model_spec *spec) {
  long long hk, hv, dk, dv, kc;
  if (ci_cfg_int(cfg, "linear_num_key_heads", 16, 1, 4096, &hk) ||
      ci_cfg_int(cfg, "linear_num_value_heads", 32, 1, 4096, &hv) ||
      ci_cfg_int(cfg, "linear_key_head_dim", 128, 1, CI_MAX_HEAD_DIM, &dk) ||
      ci_cfg_int(cfg, "linear_value_head_dim", 128, 1, CI_MAX_HEAD_DIM, &dv) ||
      ci_cfg_int(cfg, "linear_conv_kernel_dim", 4, 1, 64, &kc))
    return CI_ERR;
  if (hv % hk != 0)
    return ci_fail("config.json: linear_num_value_heads %lld is not a multiple of "
                   "linear_num_key_heads %lld",
                   hv, hk);
  spec->deltanet = (ci_deltanet_geometry){.n_k_heads = (int)hk,
                                          .n_v_heads = (int)hv,
                                          .k_head_dim = (int)dk,
                                          .v_head_dim = (int)dv,
                                          .conv_kernel = (int)kc};
  return CI_OK;
}

/* Partial RoPE of the full-attention layers: the first floor(D * p) dims rotate with the
 * default table built over that width (pairs (j, j + d_r / 2)); the rest pass through. */
static int read_rope(json_t *cfg, ci_model_spec *spec) {
  const int head_dim = spec->layers[0].head_dim;
  json_t *params = json_object_get(cfg, "rope_parameters");
  double partial = 0.25;
  if (ci_cfg_num(cfg, "partial_rotary_factor", 0.25, &partial)) return CI_ERR;
  if (params && json_is_object(params) &&
      ci_cfg_num(params, "partial_rotary_factor", partial, &partial))
    return CI_ERR;
  if (!(partial > 0 && partial <= 1))
    return ci_fail("config.json: partial_rotary_factor %g must be in (0, 1]", partial);
  const int rot_dim = (int)floor(head_dim * partial);
  if (rot_dim < 2 || rot_dim % 2 != 0)
    return ci_fail("config.json: head_dim %d x partial_rotary_factor %g gives %d rotary dims "
                   "(must be even and >= 2)",
                   head_dim, partial, rot_dim);
  spec->n_ropes = 1;
  if (ci_cfg_rope(cfg, NULL, rot_dim, 1e7, spec, 0)) return CI_ERR;
  spec->ropes[0].rope.head_dim = head_dim;
  spec->ropes[0].rope.rot_dim = rot_dim;
  return CI_OK;
}

int ci_family_qwen35_configure(json_t *cfg, ci_model_spec *spec) {
  json_t *gate = json_object_get(cfg, "attn_output_gate");
  if (gate && json_is_false(gate))
    return ci_fail("config.json: attn_output_gate false is not a Qwen3.5 model (its attention "
                   "always has the output gate)");
  if (ci_cfg_read_common(cfg, spec, 0)) return CI_ERR;
  int attention_bias;
  if (ci_cfg_bool(cfg, "attention_bias", 0, &attention_bias)) return CI_ERR;
  spec->qkv_bias = spec->o_bias = attention_bias;
  spec->qk_norm = 1;
  spec->attn_output_gate = 1;
  spec->norm_weight_offset = 1.0f; /* raw checkpoints; plain for MLX conversions (loader) */
  if (read_layer_types(cfg, spec) || read_deltanet(cfg, spec) || read_rope(cfg, spec))
    return CI_ERR;
  int full = 0;
  for (int i = 0; i < spec->n_layers; i++) {
    if (spec->layers[i].mixer == CI_MIXER_DELTANET)
      spec->n_deltanet_layers++;
    else
      full++;
  }
  if (full == 0)
    return ci_fail("config.json: a Qwen3.5 model needs at least one full_attention layer");
  return CI_OK;
}
