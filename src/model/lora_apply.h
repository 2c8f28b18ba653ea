/* Applying LoRA adapters inside a step: per-row low-rank products y += scale · (x Aᵀ) Bᵀ beside
 * the shared base matmul, grouped by adapter. Each sequence's rows come out bit-identical to a
 * step of that sequence alone (the matmuls are segmented by sequence, and every row gets exactly
 * one addition per adapted layer). */
#ifndef CI_MODEL_LORA_APPLY_H
#define CI_MODEL_LORA_APPLY_H

#include "model/lora.h"
#include "model/workspace.h"

/* The adapters of a step's sequences: sequence i owns rows [first_row[i], first_row[i] +
 * n_rows[i]) and runs with loras[i] (NULL: none). */
typedef struct {
  int n_seqs;
  const int32_t *first_row;
  const int32_t *n_rows;
  const ci_lora *const *loras;
  int rank; /* the rank of a split model whose step this is (0 for a whole model) */
} ci_lora_step;

/* Grows the workspace's LoRA scratch for this step (nothing when no sequence has an adapter).
 * Returns CI_OK or CI_ERR. */
int ci_lora_step_fit(ci_workspace *ws, const ci_lora_step *step, int n_rows);

/* y[rows, out] += the adapters' updates of linear `target` of layer `layer` for input x[rows, in]
 * (backend memory), for the rows of every sequence whose adapter adapts that layer. Returns
 * CI_OK or CI_ERR. */
int ci_lora_apply(ci_backend *be, ci_workspace *ws, const ci_lora_step *step, int layer,
                  ci_lora_target target, const float *x, int64_t in, float *y, int64_t out);

#endif
