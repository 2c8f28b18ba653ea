/* The workspace of a model's steps: sizing from the spec, growth, release (see workspace.h). */
#include "model/workspace.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>

ci_workspace *ci_workspace_create(ci_backend *be) {
  ci_workspace *ws = calloc(1, sizeof *ws);
  if (!ws) return ci_fail("workspace: out of memory"), NULL;
  ws->be = be;
  return ws;
}

/* Releases every buffer (the sizes become 0). */
static void release_buffers(ci_workspace *ws) {
  float **dev[] = {&ws->x,       &ws->a,          &ws->q,        &ws->k,      &ws->v,
                   &ws->att,     &ws->proj,       &ws->gate,     &ws->up,     &ws->ple,
                   &ws->ple_tmp, &ws->moe_scores, &ws->moe_out,  &ws->moe_in, &ws->moe_y,
                   &ws->logits,  &ws->qg,         &ws->dn_qkv,   &ws->dn_z,   &ws->dn_b,
                   &ws->dn_a,    &ws->dn_out,     &ws->tp_logits};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) {
    if (*dev[i]) ws->be->ops->release(ws->be, *dev[i]);
    *dev[i] = NULL;
  }
  if (ws->desc) ws->be->ops->release(ws->be, ws->desc);
  ws->desc = ws->ids = ws->pos = NULL;
  ws->logit_capacity = 0;
  ws->tp_logit_capacity = 0;
  if (ws->picks) ws->be->ops->release(ws->be, ws->picks);
  ws->picks = NULL;
  ws->pick_capacity = 0;
  void **host[] = {(void **)&ws->desc_host,  (void **)&ws->seq_first, (void **)&ws->seq_rows,
                   (void **)&ws->logit_rows, (void **)&ws->logit_seg, (void **)&ws->views,
                   (void **)&ws->seq_lora,   (void **)&ws->route_ids, (void **)&ws->route_w,
                   (void **)&ws->rows,       (void **)&ws->row_w,     (void **)&ws->expert_seg,
                   (void **)&ws->head_rows,  (void **)&ws->dn_states, (void **)&ws->dn_checkpoints};
  for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) {
    free(*host[i]);
    *host[i] = NULL;
  }
  ws->max_rows = ws->max_seqs = 0;
}

/* `buffer` (backend memory, *capacity elements) or, when n is more, a new buffer of n elements
 * of `size` bytes in its place (the old contents are not kept); NULL when that fails. */
static void *grow(ci_workspace *ws, void *buffer, int64_t *capacity, int64_t n, size_t size) {
  if (n <= *capacity) return buffer;
  if (buffer) ws->be->ops->release(ws->be, buffer);
  ws->allocations++;
  void *grown = ws->be->ops->alloc(ws->be, (size_t)n * size);
  *capacity = grown ? n : 0;
  return grown;
}

float *ci_workspace_logits(ci_workspace *ws, int64_t n) {
  return ws->logits = grow(ws, ws->logits, &ws->logit_capacity, n, sizeof(float));
}

float *ci_workspace_tp_logits(ci_workspace *ws, int64_t n) {
  return ws->tp_logits = grow(ws, ws->tp_logits, &ws->tp_logit_capacity, n, sizeof(float));
}

ci_row_pick *ci_workspace_picks(ci_workspace *ws, int64_t n) {
  return ws->picks = grow(ws, ws->picks, &ws->pick_capacity, n, sizeof(ci_row_pick));
}

/* Releases the LoRA scratch (its sizes become 0). */
static void release_lora(ci_workspace *ws) {
  float **dev[] = {&ws->lora_x, &ws->lora_t, &ws->lora_y};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) {
    if (*dev[i]) ws->be->ops->release(ws->be, *dev[i]);
    *dev[i] = NULL;
  }
  free(ws->lora_row_ids);
  free(ws->lora_w);
  free(ws->lora_seg);
  ws->lora_row_ids = ws->lora_seg = NULL;
  ws->lora_w = NULL;
  ws->lora_rows = ws->lora_seqs = ws->lora_rank = 0;
  ws->lora_width = 0;
}

int ci_workspace_fit_lora(ci_workspace *ws, int max_rows, int max_seqs, int max_rank,
                          int64_t max_width) {
  if (max_rows <= ws->lora_rows && max_seqs <= ws->lora_seqs && max_rank <= ws->lora_rank &&
      max_width <= ws->lora_width)
    return CI_OK;
  if (max_rows < ws->lora_rows) max_rows = ws->lora_rows;
  if (max_seqs < ws->lora_seqs) max_seqs = ws->lora_seqs;
  if (max_rank < ws->lora_rank) max_rank = ws->lora_rank;
  if (max_width < ws->lora_width) max_width = ws->lora_width;
  release_lora(ws);
  ws->allocations++;
  ci_backend *be = ws->be;
  const size_t n = (size_t)max_rows, f = sizeof(float);
  const int ok = (ws->lora_x = be->ops->alloc(be, n * (size_t)max_width * f)) &&
                 (ws->lora_t = be->ops->alloc(be, n * (size_t)max_rank * f)) &&
                 (ws->lora_y = be->ops->alloc(be, n * (size_t)max_width * f)) &&
                 (ws->lora_row_ids = malloc(n * sizeof(int32_t))) &&
                 (ws->lora_w = malloc(n * sizeof(float))) &&
                 (ws->lora_seg = malloc((size_t)max_seqs * sizeof(int32_t)));
  if (!ok) {
    release_lora(ws);
    return ci_fail("workspace: out of memory for adapters on steps of %d rows", max_rows);
  }
  ws->lora_rows = max_rows;
  ws->lora_seqs = max_seqs;
  ws->lora_rank = max_rank;
  ws->lora_width = max_width;
  return CI_OK;
}

void ci_workspace_free(ci_workspace *ws) {
  if (!ws) return;
  release_lora(ws);
  release_buffers(ws);
  free(ws);
}

/* Widest rows of each buffer kind over every layer of the model. */
typedef struct {
  int64_t q_dim, kv_dim, inter, max_k;
  int64_t dn_channels, dn_v_dim; /* DeltaNet C and Hv Dv; 0 without DeltaNet layers */
  int max_heads, max_head_dim;
} widths;

static widths widths_of(const ci_model_spec *s) {
  widths w = {.inter = s->intermediate, .max_heads = s->n_heads};
  for (int i = 0; i < s->n_layers; i++) {
    const ci_layer_spec *l = &s->layers[i];
    const int64_t qd = (int64_t)s->n_heads * l->head_dim * (s->attn_output_gate ? 2 : 1);
    const int64_t kd = (int64_t)l->n_kv_heads * l->head_dim;
    if (qd > w.q_dim) w.q_dim = qd;
    if (kd > w.kv_dim) w.kv_dim = kd;
    if (l->intermediate > w.inter) w.inter = l->intermediate;
    if (l->head_dim > w.max_head_dim) w.max_head_dim = l->head_dim;
  }
  if (s->moe_intermediate > w.inter) w.inter = s->moe_intermediate;
  if (s->ple_dim > w.inter) w.inter = s->ple_dim;
  if (s->n_deltanet_layers > 0) {
    const ci_deltanet_geometry *g = &s->deltanet;
    w.dn_v_dim = (int64_t)g->n_v_heads * g->v_head_dim;
    w.dn_channels = 2 * (int64_t)g->n_k_heads * g->k_head_dim + w.dn_v_dim;
  }
  /* the widest matmul input: hidden, the attention output, an MLP, per-layer or DeltaNet width */
  w.max_k = s->hidden;
  if (w.q_dim > w.max_k) w.max_k = w.q_dim;
  if (w.inter > w.max_k) w.max_k = w.inter;
  if (w.dn_v_dim > w.max_k) w.max_k = w.dn_v_dim;
  return w;
}

int64_t ci_workspace_bytes(const ci_model_spec *s, int max_rows, int max_seqs) {
  const widths w = widths_of(s);
  const int64_t n = max_rows, f = sizeof(float);
  int64_t bytes = n * f * (3 * (int64_t)s->hidden + 2 * w.q_dim + 2 * w.kv_dim + 2 * w.inter);
  if (s->ple_dim > 0) bytes += 2 * n * f * (int64_t)s->n_layers * s->ple_dim;
  if (s->n_experts > 0) {
    bytes += n * f * ((int64_t)s->n_experts + 3 * (int64_t)s->hidden);
    bytes += n * (int64_t)s->top_k_experts * (int64_t)(sizeof(int32_t) + sizeof(float));
    bytes += n * (int64_t)(sizeof(int32_t) + sizeof(float)) + max_seqs * (int64_t)sizeof(int32_t);
  }
  if (s->attn_output_gate)
    bytes += n * f * ((int64_t)s->n_heads * w.max_head_dim) +
             2 * n * s->n_heads * (int64_t)sizeof(int32_t);
  if (s->n_deltanet_layers > 0)
    bytes += n * f * (w.dn_channels + 2 * w.dn_v_dim + 2 * (int64_t)s->deltanet.n_v_heads) +
             2 * max_seqs * (int64_t)sizeof(float *);
  bytes += 2 * 2 * n * (int64_t)sizeof(int32_t) + n * (int64_t)sizeof(int32_t);
  bytes += max_seqs * (int64_t)(3 * sizeof(int32_t) + sizeof(ci_paged_kv) + sizeof(void *));
  return bytes;
}

int ci_workspace_fit(ci_workspace *ws, const ci_model_spec *s, int max_rows, int max_seqs) {
  if (max_rows < 1 || max_seqs < 1) return ci_fail("workspace: empty step");
  if (max_rows <= ws->max_rows && max_seqs <= ws->max_seqs) return CI_OK;
  if (max_rows < ws->max_rows) max_rows = ws->max_rows;
  if (max_seqs < ws->max_seqs) max_seqs = ws->max_seqs;
  release_buffers(ws);
  ws->allocations++;
  ci_backend *be = ws->be;
  const widths w = widths_of(s);
  const size_t n = (size_t)max_rows, f = sizeof(float);
  int ok = (ws->x = be->ops->alloc(be, n * s->hidden * f)) &&
           (ws->a = be->ops->alloc(be, n * s->hidden * f)) &&
           (ws->q = be->ops->alloc(be, n * w.q_dim * f)) &&
           (ws->k = be->ops->alloc(be, n * w.kv_dim * f)) &&
           (ws->v = be->ops->alloc(be, n * w.kv_dim * f)) &&
           (ws->att = be->ops->alloc(be, n * w.q_dim * f)) &&
           (ws->proj = be->ops->alloc(be, n * s->hidden * f)) &&
           (ws->gate = be->ops->alloc(be, n * w.inter * f)) &&
           (ws->up = be->ops->alloc(be, n * w.inter * f));
  if (ok && s->ple_dim > 0) {
    const size_t width = (size_t)s->n_layers * s->ple_dim;
    ok = (ws->ple = be->ops->alloc(be, n * width * f)) &&
         (ws->ple_tmp = be->ops->alloc(be, n * width * f));
  }
  if (ok && s->n_experts > 0) {
    const size_t k = (size_t)s->top_k_experts;
    ok = (ws->moe_scores = be->ops->alloc(be, n * s->n_experts * f)) &&
         (ws->moe_out = be->ops->alloc(be, n * s->hidden * f)) &&
         (ws->moe_in = be->ops->alloc(be, n * s->hidden * f)) &&
         (ws->moe_y = be->ops->alloc(be, n * s->hidden * f)) &&
         (ws->route_ids = malloc(n * k * sizeof(int32_t))) &&
         (ws->route_w = malloc(n * k * sizeof(float))) &&
         (ws->rows = malloc(n * sizeof(int32_t))) && (ws->row_w = malloc(n * sizeof(float))) &&
         (ws->expert_seg = malloc((size_t)max_seqs * sizeof(int32_t)));
  }
  if (ok && s->attn_output_gate) {
    const size_t heads = n * (size_t)s->n_heads;
    ok = (ws->qg = be->ops->alloc(be, heads * (size_t)w.max_head_dim * f)) &&
         (ws->head_rows = malloc(2 * heads * sizeof(int32_t)));
    for (size_t i = 0; ok && i < heads; i++) { /* row i of [rows, Hq, 2D] as rows of D */
      ws->head_rows[i] = (int32_t)(2 * i);
      ws->head_rows[heads + i] = (int32_t)(2 * i + 1);
    }
  }
  if (ok && s->n_deltanet_layers > 0) {
    const size_t hv = (size_t)s->deltanet.n_v_heads;
    ok = (ws->dn_qkv = be->ops->alloc(be, n * (size_t)w.dn_channels * f)) &&
         (ws->dn_z = be->ops->alloc(be, n * (size_t)w.dn_v_dim * f)) &&
         (ws->dn_b = be->ops->alloc(be, n * hv * f)) &&
         (ws->dn_a = be->ops->alloc(be, n * hv * f)) &&
         (ws->dn_out = be->ops->alloc(be, n * (size_t)w.dn_v_dim * f)) &&
         (ws->dn_states = malloc((size_t)max_seqs * sizeof(float *))) &&
         (ws->dn_checkpoints = malloc((size_t)max_seqs * sizeof(float *)));
  }
  const size_t seqs = (size_t)max_seqs;
  ok = ok && (ws->desc = be->ops->alloc(be, 2 * n * sizeof(int32_t))) &&
       (ws->desc_host = malloc(2 * n * sizeof(int32_t))) &&
       (ws->seq_first = malloc(seqs * sizeof(int32_t))) &&
       (ws->seq_rows = malloc(seqs * sizeof(int32_t))) &&
       (ws->logit_rows = malloc(n * sizeof(int32_t))) &&
       (ws->logit_seg = malloc(seqs * sizeof(int32_t))) &&
       (ws->views = malloc(seqs * sizeof(ci_paged_kv))) &&
       (ws->seq_lora = calloc(seqs, sizeof *ws->seq_lora));
  if (!ok) {
    release_buffers(ws);
    return ci_fail("workspace: out of memory for steps of %d rows", max_rows);
  }
  ws->max_rows = max_rows;
  ws->max_seqs = max_seqs;
  return be->ops->reserve_scratch(be, max_rows, w.max_k, w.max_heads, w.max_head_dim);
}
