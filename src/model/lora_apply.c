/* LoRA in a step (see lora_apply.h): for each adapter among the step's sequences, its rows are
 * gathered into one block (segmented by sequence), put through the two low-rank matmuls and added
 * back scaled, beside the shared base matmul that already ran over every row (the segmented
 * gather form of Punica and S-LoRA). Rows without an adapter are not touched. */
#include "model/lora_apply.h"

#include "base/error.h"

int ci_lora_apply(ci_backend *be, ci_workspace *ws, const ci_lora_step *step, int layer,
                  ci_lora_target target, const float *x, int64_t in, float *y, int64_t out) {
  for (int i = 0; i < step->n_seqs; i++) {
    const ci_lora *lora = step->loras[i];
    if (!lora) continue;
    const ci_lora_module *mod = ci_lora_module_at(lora, layer, target, step->rank);
    if (!mod) continue;
    int done = 0;
    for (int j = 0; j < i && !done; j++) done = step->loras[j] == lora;
    if (done) continue;
    /* every row of every sequence with this adapter, sequence by sequence */
    int count = 0, segs = 0;
    for (int k = i; k < step->n_seqs; k++) {
      if (step->loras[k] != lora) continue;
      for (int r = 0; r < step->n_rows[k]; r++) {
        ws->lora_row_ids[count] = step->first_row[k] + r;
        ws->lora_w[count++] = mod->scale;
      }
      ws->lora_seg[segs++] = step->n_rows[k];
    }
    if (in > ws->lora_width || out > ws->lora_width || mod->rank > ws->lora_rank ||
        count > ws->lora_rows)
      return ci_fail("adapter: the step's LoRA scratch is too small");
    const ci_row_segments segments = {.n = segs, .rows = ws->lora_seg};
    be->ops->gather_rows(be, ws->lora_x, x, ws->lora_row_ids, count, in);
    if (be->ops->matmul(be, &mod->a, ws->lora_x, count, ws->lora_t, &segments) ||
        be->ops->matmul(be, &mod->b, ws->lora_t, count, ws->lora_y, &segments))
      return CI_ERR;
    be->ops->scatter_add_rows(be, y, ws->lora_y, ws->lora_row_ids, ws->lora_w, count, out);
  }
  return CI_OK;
}

int ci_lora_step_fit(ci_workspace *ws, const ci_lora_step *step, int n_rows) {
  int max_rank = 0;
  int64_t max_width = 0;
  for (int i = 0; i < step->n_seqs; i++) {
    const ci_lora *lora = step->loras[i];
    if (!lora) continue;
    if (lora->max_rank > max_rank) max_rank = lora->max_rank;
    if (lora->max_width > max_width) max_width = lora->max_width;
  }
  if (max_rank == 0) return CI_OK;
  return ci_workspace_fit_lora(ws, n_rows, step->n_seqs, max_rank, max_width);
}
