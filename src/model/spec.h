/* Model spec: the architecture-neutral description of a model that config.json resolves to —
 * global sizes, per-layer attention geometry, RoPE tables and the quantization map. Each family
 * file (family_*.c) fills one from its config; the forward pass reads only this. */
#ifndef CI_MODEL_SPEC_H
#define CI_MODEL_SPEC_H

#include "tensor/backend.h"

#include <jansson.h>
#include <stdint.h>

typedef enum { CI_ATTN_FULL, CI_ATTN_SLIDING } ci_attn_kind;

/* MLP activation: SwiGLU (Llama, Qwen) or GeGLU with tanh-approximated GELU (Gemma). */
typedef enum { CI_ACT_SILU, CI_ACT_GELU_TANH } ci_activation;

/* The token mixer of a layer: softmax attention over the paged KV, or the gated DeltaNet
 * recurrence of Qwen3.5's linear-attention layers (a per-sequence state beside the KV). */
typedef enum { CI_MIXER_ATTENTION, CI_MIXER_DELTANET } ci_mixer;

/* How a block wires its norms: pre-norm (x += f(norm(x))) or Gemma's sandwich
 * (x += norm_post(f(norm_pre(x)))). */
typedef enum { CI_WIRING_PRE_NORM, CI_WIRING_SANDWICH } ci_block_wiring;

typedef struct {
  ci_attn_kind kind;
  int window;       /* W for sliding layers, 0 for full */
  int head_dim;     /* D */
  int n_kv_heads;   /* Hkv */
  int rope_index;   /* index into ci_model_spec.ropes */
  ci_mixer mixer;   /* attention (everything below applies) or gated DeltaNet */
  int cache_layer;  /* layer whose KV this layer attends over; itself unless a KV sharer; -1 for
                       a DeltaNet layer */
  int kv_index;     /* cache layer (index into the KV cache) this layer reads; -1 for DeltaNet */
  int k_eq_v;       /* no v_proj: V is the raw K projection (Gemma 4 full layers) */
  int intermediate; /* MLP width of this layer */
  float attn_scale; /* multiplies <q, k> */
} ci_layer_spec;

/* One resolved RoPE table; inv_freq is owned by the spec. */
typedef struct {
  ci_rope rope;
  float *inv_freq;
} ci_rope_table;

/* Quantization of one module: bits 0 means stored unquantized. */
typedef struct {
  int bits;
  int group_size;
} ci_quant;

typedef struct {
  char *path; /* module path, e.g. "model.layers.0.mlp.down_proj" */
  ci_quant quant;
} ci_quant_override;

typedef struct {
  int present;       /* config.json has an MLX quantization map */
  ci_quant fallback; /* the default entry */
  ci_quant_override *overrides;
  int n_overrides;
} ci_quant_map;

enum { CI_MAX_ROPES = 2, CI_MAX_EOS = 8 };

/* Geometry of the gated DeltaNet layers (Qwen3.5 linear attention). */
typedef struct {
  int n_k_heads;   /* Hk: query/key heads */
  int n_v_heads;   /* Hv: value heads, a multiple of Hk */
  int k_head_dim;  /* Dk */
  int v_head_dim;  /* Dv */
  int conv_kernel; /* Kc: causal depthwise convolution width */
} ci_deltanet_geometry;

typedef struct ci_model_spec {
  const char *model_type; /* points into a static family table */
  int hidden;             /* model width */
  int n_layers;
  int n_heads;      /* Hq, the same for every layer */
  int intermediate; /* MLP width */
  int vocab;
  int max_position;
  float norm_eps;
  float norm_weight_offset; /* 0: w as stored; 1: (1 + w) (Gemma) */
  int tied;                 /* head reuses the embedding */
  int qkv_bias;             /* biases on q, k, v projections */
  int o_bias;               /* bias on o_proj */
  int mlp_bias;             /* biases on gate, up, down */
  int qk_norm;              /* RMSNorm over D on q and k before RoPE (Qwen3) */
  ci_activation act;        /* MLP activation */
  ci_block_wiring wiring;   /* norm placement */
  float embed_scale;        /* multiplies the embedding rows; 0 = none (Gemma: sqrt(hidden)) */
  float attn_softcap;       /* attention logit softcap; 0 = none (Gemma 2) */
  float final_softcap;      /* final logit softcap; 0 = none */
  int v_norm;               /* no-scale RMSNorm over D on V (Gemma 4) */
  int layer_scalar;         /* per-layer scalar multiplies the residual (Gemma 4) */
  int ple_dim;              /* per-layer input width P; 0 = no per-layer inputs (Gemma 4) */
  int ple_vocab;            /* rows of the per-layer embedding table */
  float ple_embed_scale;    /* sqrt(P) in the embedding dtype */
  int n_experts;            /* MoE experts; 0 = dense MLP only */
  int top_k_experts;        /* experts per token */
  int moe_intermediate;     /* width of one expert */
  int n_cache_layers;       /* layers that own a KV cache */
  int *cache_layers;        /* [n_cache_layers] the model layer of each cache layer, in order */
  int attn_output_gate;     /* q_proj also yields a per-head gate: o = attn * sigmoid(gate)
                               before o_proj (Qwen3.5) */
  int n_deltanet_layers;    /* layers whose mixer is the gated DeltaNet */
  ci_deltanet_geometry deltanet;
  ci_layer_spec *layers; /* [n_layers] */
  ci_rope_table ropes[CI_MAX_ROPES];
  int n_ropes;
  int eos_ids[CI_MAX_EOS];
  int n_eos;
  ci_quant_map quant;
} ci_model_spec;

/* The spec of cache layer `c` (0 <= c < n_cache_layers). */
static inline const ci_layer_spec *ci_spec_cache_layer(const ci_model_spec *spec, int c) {
  return &spec->layers[spec->cache_layers[c]];
}

/* Bytes of one sequence's recurrent state over every DeltaNet layer (0 for models without
 * any): per layer the convolution tail [Kc - 1, C] and the state [Hv, Dk, Dv], f32. */
int64_t ci_spec_state_bytes(const ci_model_spec *spec);

/* Floats of one DeltaNet layer's part of that state. */
int64_t ci_spec_deltanet_layer_floats(const ci_model_spec *spec);

/* Reads DIR/config.json into *spec. Returns CI_OK, or CI_ERR with a message naming the
 * problem (missing file, not JSON, unsupported model_type listing the supported ones, bad
 * geometry, unsupported RoPE or quantization). On failure *spec holds nothing to free. */
int ci_model_spec_load(const char *model_dir, ci_model_spec *spec);

/* Same, from an already-parsed config object (the text config is picked inside). */
int ci_model_spec_from_json(json_t *config, ci_model_spec *spec);

/* Frees what the spec owns. */
void ci_model_spec_free(ci_model_spec *spec);

/* The quantization of module `path` (exact override, else the default; bits 0 if the map is
 * absent or says false). */
ci_quant ci_quant_lookup(const ci_quant_map *map, const char *path);

/* Comma-separated list of supported model_type values, for error messages. */
const char *ci_supported_model_types(void);

#endif
