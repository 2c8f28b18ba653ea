/* Tensor manifest of the Llama-style families: one table of per-layer tensors, expanded over
 * the layers of a spec. */
#include "model/manifest.h"

#include "model/model.h"

#include <stdio.h>
#include <string.h>

typedef enum { DIM_NONE, DIM_HIDDEN, DIM_Q, DIM_KV, DIM_INTER, DIM_HEAD } dim_id;
typedef enum { WHEN_ALWAYS, WHEN_QKV_BIAS, WHEN_O_BIAS, WHEN_MLP_BIAS, WHEN_QK_NORM } when_id;

typedef struct {
  const char *module; /* relative to "<prefix>layers.<i>." */
  ci_manifest_kind kind;
  dim_id rows, cols;
  when_id when;
  size_t field;
} layer_tensor;

#define FIELD(name) offsetof(ci_layer_weights, name)
static const layer_tensor layer_tensors[] = {
    {"input_layernorm", CI_MANIFEST_NORM, DIM_HIDDEN, DIM_NONE, WHEN_ALWAYS, FIELD(attn_norm)},
    {"self_attn.q_proj", CI_MANIFEST_MATRIX, DIM_Q, DIM_HIDDEN, WHEN_ALWAYS, FIELD(wq)},
    {"self_attn.q_proj", CI_MANIFEST_BIAS, DIM_Q, DIM_NONE, WHEN_QKV_BIAS, FIELD(bq)},
    {"self_attn.k_proj", CI_MANIFEST_MATRIX, DIM_KV, DIM_HIDDEN, WHEN_ALWAYS, FIELD(wk)},
    {"self_attn.k_proj", CI_MANIFEST_BIAS, DIM_KV, DIM_NONE, WHEN_QKV_BIAS, FIELD(bk)},
    {"self_attn.v_proj", CI_MANIFEST_MATRIX, DIM_KV, DIM_HIDDEN, WHEN_ALWAYS, FIELD(wv)},
    {"self_attn.v_proj", CI_MANIFEST_BIAS, DIM_KV, DIM_NONE, WHEN_QKV_BIAS, FIELD(bv)},
    {"self_attn.o_proj", CI_MANIFEST_MATRIX, DIM_HIDDEN, DIM_Q, WHEN_ALWAYS, FIELD(wo)},
    {"self_attn.o_proj", CI_MANIFEST_BIAS, DIM_HIDDEN, DIM_NONE, WHEN_O_BIAS, FIELD(bo)},
    {"self_attn.q_norm", CI_MANIFEST_NORM, DIM_HEAD, DIM_NONE, WHEN_QK_NORM, FIELD(q_norm)},
    {"self_attn.k_norm", CI_MANIFEST_NORM, DIM_HEAD, DIM_NONE, WHEN_QK_NORM, FIELD(k_norm)},
    {"post_attention_layernorm", CI_MANIFEST_NORM, DIM_HIDDEN, DIM_NONE, WHEN_ALWAYS,
     FIELD(mlp_norm)},
    {"mlp.gate_proj", CI_MANIFEST_MATRIX, DIM_INTER, DIM_HIDDEN, WHEN_ALWAYS, FIELD(w_gate)},
    {"mlp.gate_proj", CI_MANIFEST_BIAS, DIM_INTER, DIM_NONE, WHEN_MLP_BIAS, FIELD(b_gate)},
    {"mlp.up_proj", CI_MANIFEST_MATRIX, DIM_INTER, DIM_HIDDEN, WHEN_ALWAYS, FIELD(w_up)},
    {"mlp.up_proj", CI_MANIFEST_BIAS, DIM_INTER, DIM_NONE, WHEN_MLP_BIAS, FIELD(b_up)},
    {"mlp.down_proj", CI_MANIFEST_MATRIX, DIM_HIDDEN, DIM_INTER, WHEN_ALWAYS, FIELD(w_down)},
    {"mlp.down_proj", CI_MANIFEST_BIAS, DIM_HIDDEN, DIM_NONE, WHEN_MLP_BIAS, FIELD(b_down)},
};
#undef FIELD

static int64_t dim_value(const ci_model_spec *s, int layer, dim_id d) {
  const ci_layer_spec *l = &s->layers[layer];
  switch (d) {
  case DIM_HIDDEN:
    return s->hidden;
  case DIM_Q:
    return (int64_t)s->n_heads * l->head_dim;
  case DIM_KV:
    return (int64_t)l->n_kv_heads * l->head_dim;
  case DIM_INTER:
    return s->intermediate;
  case DIM_HEAD:
    return l->head_dim;
  default:
    return 0;
  }
}

static int wanted(const ci_model_spec *s, when_id when) {
  switch (when) {
  case WHEN_QKV_BIAS:
    return s->qkv_bias;
  case WHEN_O_BIAS:
    return s->o_bias;
  case WHEN_MLP_BIAS:
    return s->mlp_bias;
  case WHEN_QK_NORM:
    return s->qk_norm;
  default:
    return 1;
  }
}

int ci_manifest_each(const ci_model_spec *spec, const char *prefix, int include_head,
                     int (*fn)(void *ctx, const ci_manifest_entry *entry), void *ctx) {
  ci_manifest_entry e;
  int rc;
  memset(&e, 0, sizeof e);
  e.layer = -1;
  snprintf(e.module, sizeof e.module, "%sembed_tokens", prefix);
  e.kind = CI_MANIFEST_MATRIX;
  e.rows = spec->vocab;
  e.cols = spec->hidden;
  e.global_role = 0;
  if ((rc = fn(ctx, &e))) return rc;
  for (int i = 0; i < spec->n_layers; i++) {
    for (size_t t = 0; t < sizeof layer_tensors / sizeof layer_tensors[0]; t++) {
      const layer_tensor *lt = &layer_tensors[t];
      if (!wanted(spec, lt->when)) continue;
      memset(&e, 0, sizeof e);
      snprintf(e.module, sizeof e.module, "%slayers.%d.%s", prefix, i, lt->module);
      e.kind = lt->kind;
      e.rows = dim_value(spec, i, lt->rows);
      e.cols = dim_value(spec, i, lt->cols);
      e.layer = i;
      e.field = lt->field;
      if ((rc = fn(ctx, &e))) return rc;
    }
  }
  memset(&e, 0, sizeof e);
  e.layer = -1;
  snprintf(e.module, sizeof e.module, "%snorm", prefix);
  e.kind = CI_MANIFEST_NORM;
  e.rows = spec->hidden;
  e.global_role = 1;
  if ((rc = fn(ctx, &e))) return rc;
  if (include_head) {
    memset(&e, 0, sizeof e);
    e.layer = -1;
    snprintf(e.module, sizeof e.module, "%slm_head",
             strcmp(prefix, "language_model.model.") == 0 ? "language_model." : "");
    e.kind = CI_MANIFEST_MATRIX;
    e.rows = spec->vocab;
    e.cols = spec->hidden;
    e.global_role = 2;
    if ((rc = fn(ctx, &e))) return rc;
  }
  return 0;
}
