/* Model spec: the architecture-neutral description of a model that config.json resolves to —
 * global sizes, per-layer attention geometry, RoPE tables and the quantization map. Each family
 * file (family_*.c) fills one from its config; the forward pass reads only this. */
#ifndef CI_MODEL_SPEC_H
#define CI_MODEL_SPEC_H

#include "tensor/backend.h"

#include <jansson.h>
#include <stdint.h>

typedef enum { CI_ATTN_FULL, CI_ATTN_SLIDING } ci_attn_kind;

typedef struct {
  ci_attn_kind kind;
  int window;     /* W for sliding layers, 0 for full */
  int head_dim;   /* D */
  int n_kv_heads; /* Hkv */
  int rope_index; /* index into ci_model_spec.ropes */
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
  ci_layer_spec *layers;    /* [n_layers] */
  ci_rope_table ropes[CI_MAX_ROPES];
  int n_ropes;
  int eos_ids[CI_MAX_EOS];
  int n_eos;
  ci_quant_map quant;
} ci_model_spec;

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
