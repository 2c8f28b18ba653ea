/* Tensor manifest of every family: one table of per-layer tensors, each with the conditions
 * under which a layer has it, expanded over the layers of a spec. */
#include "model/manifest.h"

#include "model/model.h"

#include <stdio.h>
#include <string.h>

typedef enum {
  DIM_NONE,
  DIM_ONE,
  DIM_HIDDEN,
  DIM_Q,
  DIM_KV,
  DIM_INTER,
  DIM_HEAD,
  DIM_PLE,
  DIM_EXPERTS,
  DIM_MOE_INTER,
  DIM_MOE_GATE_UP,
  DIM_Q_PROJ,    /* q_proj rows: Hq D, twice that with the output gate (Qwen3.5) */
  DIM_DN_CONV,   /* DeltaNet channels C = 2 Hk Dk + Hv Dv */
  DIM_DN_V,      /* Hv Dv */
  DIM_DN_HEADS,  /* Hv */
  DIM_DN_HEAD,   /* Dv */
  DIM_DN_KERNEL, /* Kc */
} dim_id;

/* Conditions a tensor needs, all of which must hold (a bit mask). */
enum {
  REQ_QKV_BIAS = 1 << 0,
  REQ_O_BIAS = 1 << 1,
  REQ_MLP_BIAS = 1 << 2,
  REQ_QK_NORM = 1 << 3,
  REQ_KV_OWNER = 1 << 4, /* the layer computes K and V (not a KV sharer) */
  REQ_V_PROJ = 1 << 5,   /* ... and V has its own projection (not K=V) */
  REQ_PRE_NORM = 1 << 6, /* Llama-style wiring */
  REQ_SANDWICH = 1 << 7, /* Gemma-style wiring */
  REQ_MOE = 1 << 8,      /* MoE block beside the dense MLP */
  REQ_PLE = 1 << 9,      /* per-layer inputs */
  REQ_LAYER_SCALAR = 1 << 10,
  REQ_ATTENTION = 1 << 11, /* the layer's mixer is attention */
  REQ_DELTANET = 1 << 12,  /* the layer's mixer is the gated DeltaNet */
};

typedef struct {
  const char *module; /* relative to "<prefix>layers.<i>." */
  ci_manifest_kind kind;
  dim_id experts, rows, cols;
  unsigned requires;
  size_t field;
} layer_tensor;

#define FIELD(name) offsetof(ci_layer_weights, name)
#define MAT(module, rows, cols, req, field)                                                        \
  { module, CI_MANIFEST_MATRIX, DIM_NONE, rows, cols, req, FIELD(field) }
#define VEC(module, kind, rows, req, field)                                                        \
  { module, kind, DIM_NONE, rows, DIM_NONE, req, FIELD(field) }
static const layer_tensor layer_tensors[] = {
    VEC("input_layernorm", CI_MANIFEST_NORM, DIM_HIDDEN, 0, attn_norm),
    MAT("self_attn.q_proj", DIM_Q_PROJ, DIM_HIDDEN, REQ_ATTENTION, wq),
    VEC("self_attn.q_proj", CI_MANIFEST_BIAS, DIM_Q_PROJ, REQ_ATTENTION | REQ_QKV_BIAS, bq),
    MAT("self_attn.k_proj", DIM_KV, DIM_HIDDEN, REQ_ATTENTION | REQ_KV_OWNER, wk),
    VEC("self_attn.k_proj", CI_MANIFEST_BIAS, DIM_KV, REQ_ATTENTION | REQ_KV_OWNER | REQ_QKV_BIAS,
        bk),
    MAT("self_attn.v_proj", DIM_KV, DIM_HIDDEN, REQ_ATTENTION | REQ_V_PROJ, wv),
    VEC("self_attn.v_proj", CI_MANIFEST_BIAS, DIM_KV, REQ_ATTENTION | REQ_V_PROJ | REQ_QKV_BIAS,
        bv),
    MAT("self_attn.o_proj", DIM_HIDDEN, DIM_Q, REQ_ATTENTION, wo),
    VEC("self_attn.o_proj", CI_MANIFEST_BIAS, DIM_HIDDEN, REQ_ATTENTION | REQ_O_BIAS, bo),
    VEC("self_attn.q_norm", CI_MANIFEST_NORM, DIM_HEAD, REQ_ATTENTION | REQ_QK_NORM, q_norm),
    VEC("self_attn.k_norm", CI_MANIFEST_NORM, DIM_HEAD, REQ_ATTENTION | REQ_QK_NORM | REQ_KV_OWNER,
        k_norm),
    VEC("post_attention_layernorm", CI_MANIFEST_NORM, DIM_HIDDEN, REQ_PRE_NORM, mlp_norm),
    VEC("post_attention_layernorm", CI_MANIFEST_NORM, DIM_HIDDEN, REQ_SANDWICH, attn_post_norm),
    VEC("pre_feedforward_layernorm", CI_MANIFEST_NORM, DIM_HIDDEN, REQ_SANDWICH, mlp_norm),
    VEC("post_feedforward_layernorm", CI_MANIFEST_NORM, DIM_HIDDEN, REQ_SANDWICH, mlp_post_norm),
    MAT("mlp.gate_proj", DIM_INTER, DIM_HIDDEN, 0, w_gate),
    VEC("mlp.gate_proj", CI_MANIFEST_BIAS, DIM_INTER, REQ_MLP_BIAS, b_gate),
    MAT("mlp.up_proj", DIM_INTER, DIM_HIDDEN, 0, w_up),
    VEC("mlp.up_proj", CI_MANIFEST_BIAS, DIM_INTER, REQ_MLP_BIAS, b_up),
    MAT("mlp.down_proj", DIM_HIDDEN, DIM_INTER, 0, w_down),
    VEC("mlp.down_proj", CI_MANIFEST_BIAS, DIM_HIDDEN, REQ_MLP_BIAS, b_down),
    VEC("post_feedforward_layernorm_1", CI_MANIFEST_NORM, DIM_HIDDEN, REQ_MOE, mlp_post_norm_1),
    VEC("pre_feedforward_layernorm_2", CI_MANIFEST_NORM, DIM_HIDDEN, REQ_MOE, moe_norm),
    VEC("post_feedforward_layernorm_2", CI_MANIFEST_NORM, DIM_HIDDEN, REQ_MOE, moe_post_norm),
    MAT("router.proj", DIM_EXPERTS, DIM_HIDDEN, REQ_MOE, router),
    VEC("router.scale", CI_MANIFEST_SCALAR, DIM_HIDDEN, REQ_MOE, router_scale),
    VEC("router.per_expert_scale", CI_MANIFEST_SCALAR, DIM_EXPERTS, REQ_MOE, expert_scale),
    {"experts.gate_up_proj", CI_MANIFEST_EXPERTS, DIM_EXPERTS, DIM_MOE_GATE_UP, DIM_HIDDEN, REQ_MOE,
     FIELD(experts_gate_up)},
    {"experts.down_proj", CI_MANIFEST_EXPERTS, DIM_EXPERTS, DIM_HIDDEN, DIM_MOE_INTER, REQ_MOE,
     FIELD(experts_down)},
    MAT("per_layer_input_gate", DIM_PLE, DIM_HIDDEN, REQ_PLE, ple_gate),
    MAT("per_layer_projection", DIM_HIDDEN, DIM_PLE, REQ_PLE, ple_proj),
    VEC("post_per_layer_input_norm", CI_MANIFEST_NORM, DIM_HIDDEN, REQ_PLE, ple_post_norm),
    VEC("layer_scalar", CI_MANIFEST_SCALAR, DIM_ONE, REQ_LAYER_SCALAR, layer_scalar),
    MAT("linear_attn.in_proj_qkv", DIM_DN_CONV, DIM_HIDDEN, REQ_DELTANET, dn_in_qkv),
    MAT("linear_attn.in_proj_z", DIM_DN_V, DIM_HIDDEN, REQ_DELTANET, dn_in_z),
    MAT("linear_attn.in_proj_b", DIM_DN_HEADS, DIM_HIDDEN, REQ_DELTANET, dn_in_b),
    MAT("linear_attn.in_proj_a", DIM_DN_HEADS, DIM_HIDDEN, REQ_DELTANET, dn_in_a),
    {"linear_attn.conv1d", CI_MANIFEST_CONV, DIM_NONE, DIM_DN_CONV, DIM_DN_KERNEL, REQ_DELTANET,
     FIELD(dn_conv)},
    VEC("linear_attn.dt_bias", CI_MANIFEST_SCALAR, DIM_DN_HEADS, REQ_DELTANET, dn_dt_bias),
    VEC("linear_attn.A_log", CI_MANIFEST_SCALAR, DIM_DN_HEADS, REQ_DELTANET, dn_a_log),
    VEC("linear_attn.norm", CI_MANIFEST_NORM, DIM_DN_HEAD, REQ_DELTANET, dn_norm),
    MAT("linear_attn.out_proj", DIM_HIDDEN, DIM_DN_V, REQ_DELTANET, dn_out),
};
#undef VEC
#undef MAT
#undef FIELD

static int64_t dim_value(const ci_model_spec *s, int layer, dim_id d) {
  const ci_layer_spec *l = &s->layers[layer];
  switch (d) {
  case DIM_ONE:
    return 1;
  case DIM_HIDDEN:
    return s->hidden;
  case DIM_Q:
    return (int64_t)s->n_heads * l->head_dim;
  case DIM_KV:
    return (int64_t)l->n_kv_heads * l->head_dim;
  case DIM_INTER:
    return l->intermediate;
  case DIM_HEAD:
    return l->head_dim;
  case DIM_PLE:
    return s->ple_dim;
  case DIM_EXPERTS:
    return s->n_experts;
  case DIM_MOE_INTER:
    return s->moe_intermediate;
  case DIM_MOE_GATE_UP:
    return 2 * (int64_t)s->moe_intermediate;
  case DIM_Q_PROJ:
    return (int64_t)s->n_heads * l->head_dim * (s->attn_output_gate ? 2 : 1);
  case DIM_DN_CONV:
    return 2 * (int64_t)s->deltanet.n_k_heads * s->deltanet.k_head_dim +
           (int64_t)s->deltanet.n_v_heads * s->deltanet.v_head_dim;
  case DIM_DN_V:
    return (int64_t)s->deltanet.n_v_heads * s->deltanet.v_head_dim;
  case DIM_DN_HEADS:
    return s->deltanet.n_v_heads;
  case DIM_DN_HEAD:
    return s->deltanet.v_head_dim;
  case DIM_DN_KERNEL:
    return s->deltanet.conv_kernel;
  default:
    return 0;
  }
}

/* The conditions layer `layer` of spec `s` satisfies. */
static unsigned layer_conditions(const ci_model_spec *s, int layer) {
  const ci_layer_spec *l = &s->layers[layer];
  unsigned have = 0;
  if (s->qkv_bias) have |= REQ_QKV_BIAS;
  if (s->o_bias) have |= REQ_O_BIAS;
  if (s->mlp_bias) have |= REQ_MLP_BIAS;
  if (s->qk_norm) have |= REQ_QK_NORM;
  if (l->cache_layer == layer) have |= REQ_KV_OWNER;
  if (l->cache_layer == layer && !l->k_eq_v) have |= REQ_V_PROJ;
  have |= s->wiring == CI_WIRING_SANDWICH ? REQ_SANDWICH : REQ_PRE_NORM;
  if (s->n_experts > 0) have |= REQ_MOE;
  if (s->ple_dim > 0) have |= REQ_PLE;
  if (s->layer_scalar) have |= REQ_LAYER_SCALAR;
  have |= l->mixer == CI_MIXER_DELTANET ? REQ_DELTANET : REQ_ATTENTION;
  return have;
}

/* Emits one model-level tensor. */
static int emit_global(const char *module, ci_manifest_kind kind, int64_t rows, int64_t cols,
                       int role, int (*fn)(void *, const ci_manifest_entry *), void *ctx) {
  ci_manifest_entry e;
  memset(&e, 0, sizeof e);
  e.layer = -1;
  snprintf(e.module, sizeof e.module, "%s", module);
  e.kind = kind;
  e.rows = rows;
  e.cols = cols;
  e.global_role = role;
  return fn(ctx, &e);
}

int ci_manifest_each(const ci_model_spec *spec, const char *prefix, int include_head,
                     int (*fn)(void *ctx, const ci_manifest_entry *entry), void *ctx) {
  char module[256];
  int rc;
  snprintf(module, sizeof module, "%sembed_tokens", prefix);
  if ((rc = emit_global(module, CI_MANIFEST_MATRIX, spec->vocab, spec->hidden, CI_GLOBAL_EMBED, fn,
                        ctx)))
    return rc;
  if (spec->ple_dim > 0) {
    const int64_t width = (int64_t)spec->n_layers * spec->ple_dim;
    snprintf(module, sizeof module, "%sembed_tokens_per_layer", prefix);
    if ((rc = emit_global(module, CI_MANIFEST_MATRIX, spec->ple_vocab, width, CI_GLOBAL_PLE_EMBED,
                          fn, ctx)))
      return rc;
    snprintf(module, sizeof module, "%sper_layer_model_projection", prefix);
    if ((rc = emit_global(module, CI_MANIFEST_MATRIX, width, spec->hidden, CI_GLOBAL_PLE_PROJ, fn,
                          ctx)))
      return rc;
    snprintf(module, sizeof module, "%sper_layer_projection_norm", prefix);
    if ((rc = emit_global(module, CI_MANIFEST_NORM, spec->ple_dim, 0, CI_GLOBAL_PLE_NORM, fn, ctx)))
      return rc;
  }
  ci_manifest_entry e;
  for (int i = 0; i < spec->n_layers; i++) {
    const unsigned have = layer_conditions(spec, i);
    for (size_t t = 0; t < sizeof layer_tensors / sizeof layer_tensors[0]; t++) {
      const layer_tensor *lt = &layer_tensors[t];
      if ((lt->requires & have) != lt->requires) continue;
      memset(&e, 0, sizeof e);
      snprintf(e.module, sizeof e.module, "%slayers.%d.%s", prefix, i, lt->module);
      e.kind = lt->kind;
      e.experts = dim_value(spec, i, lt->experts);
      e.rows = dim_value(spec, i, lt->rows);
      e.cols = dim_value(spec, i, lt->cols);
      e.layer = i;
      e.field = lt->field;
      if ((rc = fn(ctx, &e))) return rc;
    }
  }
  snprintf(module, sizeof module, "%snorm", prefix);
  if ((rc = emit_global(module, CI_MANIFEST_NORM, spec->hidden, 0, CI_GLOBAL_FINAL_NORM, fn, ctx)))
    return rc;
  if (include_head) {
    snprintf(module, sizeof module, "%slm_head",
             strcmp(prefix, "language_model.model.") == 0 ? "language_model." : "");
    if ((rc = emit_global(module, CI_MANIFEST_MATRIX, spec->vocab, spec->hidden, CI_GLOBAL_HEAD, fn,
                          ctx)))
      return rc;
  }
  return 0;
}
