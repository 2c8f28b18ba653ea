/* Tensor manifest: the list of tensors a model spec expects — module name, kind and logical
 * shape — from one table. The loader binds it; `init-random` writes it. */
#ifndef CI_MODEL_MANIFEST_H
#define CI_MODEL_MANIFEST_H

#include "model/spec.h"

#include <stddef.h>
#include <stdint.h>

typedef enum {
  CI_MANIFEST_MATRIX,  /* `<module>.weight` [rows, cols], or MLX affine .weight/.scales/.biases */
  CI_MANIFEST_NORM,    /* `<module>.weight` [rows] */
  CI_MANIFEST_BIAS,    /* `<module>.bias` [rows] */
  CI_MANIFEST_SCALAR,  /* `<module>` [rows], a bare vector (layer_scalar, router scales) */
  CI_MANIFEST_EXPERTS, /* `<module>` [experts, rows, cols], a bare stack of expert matrices */
  CI_MANIFEST_CONV,    /* `<module>.weight` [rows, 1, cols] (or MLX [rows, cols, 1]): a depthwise
                          convolution of width cols, never quantized */
} ci_manifest_kind;

typedef struct {
  char module[256]; /* full module path, e.g. "model.layers.0.self_attn.q_proj" */
  ci_manifest_kind kind;
  int64_t rows;    /* output size (vector length for norms and biases) */
  int64_t cols;    /* input size; 0 for vectors */
  int64_t experts; /* leading dimension of CI_MANIFEST_EXPERTS, else 0 */
  int layer;       /* layer index, -1 for global tensors */
  size_t field;    /* offsetof the destination in ci_layer_weights (layer >= 0) */
  int global_role; /* layer < 0: a ci_manifest_global_role */
} ci_manifest_entry;

/* Model-level tensors. */
typedef enum {
  CI_GLOBAL_EMBED,
  CI_GLOBAL_FINAL_NORM,
  CI_GLOBAL_HEAD,
  CI_GLOBAL_PLE_EMBED, /* per-layer input embedding table (Gemma 4) */
  CI_GLOBAL_PLE_PROJ,  /* per_layer_model_projection */
  CI_GLOBAL_PLE_NORM,  /* per_layer_projection_norm */
} ci_manifest_global_role;

/* Calls fn for each expected tensor of `spec` with tensor-name prefix `prefix` ("model." for
 * Hugging Face text checkpoints), in checkpoint order. `include_head` adds lm_head (untied
 * models). Stops and returns the first non-zero value fn returns, else 0. */
int ci_manifest_each(const ci_model_spec *spec, const char *prefix, int include_head,
                     int (*fn)(void *ctx, const ci_manifest_entry *entry), void *ctx);

#endif
