/* Forward pass of the decoder-only transformer families, written once against the backend op
 * table: Llama/Mistral/Qwen pre-norm blocks and Gemma 2/3/4 sandwich blocks with GeGLU,
 * softcaps, K=V layers, KV sharing, per-layer inputs and MoE, and Qwen3.5's hybrid of gated
 * attention and gated DeltaNet layers (docs/models.md §5). A step is any mix
 * of rows: prefill chunks and decode tokens of many sequences. Every matmul reads its weights
 * once for all rows, with each sequence's rows a segment computed as if alone; KV writes and
 * attention cover every sequence in one call per layer. */
#include "base/error.h"
#include "model/lora_apply.h"
#include "model/model.h"
#include "model/tensor_parallel.h"

#include <math.h>
#include <stdlib.h>

/* The step as the layers see it: its rows and the sequences they belong to. */
typedef struct {
  ci_row_segments segments; /* rows of each sequence, for the matmuls */
  ci_step_kv kv;            /* the sequences, for kv_store and attention (views per layer) */
  const ci_step_seq *seqs;  /* [n_seqs] */
  ci_lora_step lora;        /* the sequences' adapters; lora.n_seqs 0 when none has one */
  ci_workspace *ws;         /* the LoRA scratch */
} step_rows;

/* y = x @ W^T for the step's n rows (or a subset given by `segments`). */
static int matmul(ci_backend *be, const step_rows *sr, const ci_tensor *w, const float *x, int n,
                  float *y) {
  return be->ops->matmul(be, w, x, n, y, &sr->segments);
}

/* y = x @ W^T (+ b). */
static int linear(ci_backend *be, const step_rows *sr, const ci_tensor *w, const float *bias,
                  const float *x, int n, float *y) {
  if (matmul(be, sr, w, x, n, y)) return CI_ERR;
  if (bias) be->ops->add_bias(be, y, bias, n, w->shape[0]);
  return CI_OK;
}

/* linear() of adaptable layer `target` of layer li: the base product of every row, then each
 * adapter's low-rank update of its sequences' rows. */
static int linear_at(ci_backend *be, const step_rows *sr, int li, ci_lora_target target,
                     const ci_tensor *w, const float *bias, const float *x, int n, float *y) {
  if (linear(be, sr, w, bias, x, n, y)) return CI_ERR;
  if (sr->lora.n_seqs == 0) return CI_OK;
  return ci_lora_apply(be, sr->ws, &sr->lora, li, target, x, w->shape[1], y, w->shape[0]);
}

/* linear_at() of n_weights (2 or 3) adaptable layers of layer li on the same x, in one backend
 * dispatch where the backend has one and the weights share a layout and no adapter applies;
 * else one linear_at() each. */
static int linear_multi_at(ci_backend *be, const step_rows *sr, int li,
                           const ci_lora_target *targets, const ci_tensor *const *ws,
                           const float *const *biases, int n_weights, const float *x, int n,
                           float *const *ys) {
  int fuse = be->ops->matmul_multi != NULL && sr->lora.n_seqs == 0;
  for (int i = 1; i < n_weights && fuse; i++)
    fuse = ws[i]->dtype == ws[0]->dtype && ws[i]->shape[1] == ws[0]->shape[1] &&
           ws[i]->group_size == ws[0]->group_size && ws[i]->scale_dtype == ws[0]->scale_dtype;
  if (!fuse) {
    for (int i = 0; i < n_weights; i++)
      if (linear_at(be, sr, li, targets[i], ws[i], biases[i], x, n, ys[i])) return CI_ERR;
    return CI_OK;
  }
  if (be->ops->matmul_multi(be, ws, n_weights, x, n, ys, &sr->segments)) return CI_ERR;
  for (int i = 0; i < n_weights; i++)
    if (biases[i]) be->ops->add_bias(be, ys[i], biases[i], n, ws[i]->shape[0]);
  return CI_OK;
}

/* Query heads, KV heads of layer li and MLP units of layer li on this rank (model/model.h
 * ci_tp_shard). */
static int heads_here(const ci_model *m) {
  return m->spec.n_heads / ci_model_tensor_parallel(m);
}
static int kv_heads_here(const ci_model *m, int li) {
  return ci_tp_kv_heads_here(m->spec.layers[li].n_kv_heads, ci_model_tensor_parallel(m));
}
static int64_t units_here(const ci_model *m, int li) {
  return m->spec.layers[li].intermediate / ci_model_tensor_parallel(m);
}

/* linear_at() of a weight split by input columns over the ranks (o_proj, down): each rank's
 * partial product with its adapters' partial updates (their A's columns of its share: the
 * updates are linear in x, so the partial updates sum to the whole one), summed over the ranks,
 * then the bias once. */
static int linear_reduced_at(const ci_model *m, const step_rows *sr, int li, ci_lora_target target,
                             const ci_tensor *w, const float *bias, const float *x, int n,
                             float *y) {
  ci_backend *be = m->be;
  if (ci_model_tensor_parallel(m) == 1) return linear_at(be, sr, li, target, w, bias, x, n, y);
  if (matmul(be, sr, w, x, n, y)) return CI_ERR;
  if (sr->lora.n_seqs > 0 &&
      ci_lora_apply(be, sr->ws, &sr->lora, li, target, x, w->shape[1], y, w->shape[0]))
    return CI_ERR;
  if (be->ops->all_reduce(be, m->shard.comm, m->shard.rank, y, (int64_t)n * w->shape[0]))
    return CI_ERR;
  if (bias) be->ops->add_bias(be, y, bias, n, w->shape[0]);
  return CI_OK;
}

/* RMSNorm over rows of width dim with the model's epsilon and weight offset. */
static void norm(const ci_model *m, float *out, const float *x, const float *w, int64_t rows,
                 int64_t dim) {
  m->be->ops->rmsnorm(m->be, out, x, w, rows, dim, m->spec.norm_eps, m->spec.norm_weight_offset);
}

/* Rows [first, first + count) of expert e of a stacked [E, rows, cols] weight, as a matrix. */
static ci_tensor expert_rows(const ci_tensor *stack, int64_t e, int64_t first, int64_t count) {
  ci_tensor view = *stack;
  const int64_t rows = stack->shape[1], cols = stack->shape[2];
  view.ndim = 2;
  view.shape[0] = count;
  view.shape[1] = cols;
  view.shape[2] = 0;
  view.data =
      (const char *)stack->data + ci_dtype_bytes(stack->dtype, (size_t)((e * rows + first) * cols));
  return view;
}

/* out = GeGLU or SwiGLU MLP of a (n rows) with layer li's dense weights. */
static int dense_mlp(ci_model *m, const step_rows *sr, int li, const float *a, int n,
                     ci_workspace *act, float *out) {
  ci_backend *be = m->be;
  const ci_layer_weights *L = &m->layers[li];
  const int64_t inter = units_here(m, li);
  const ci_lora_target targets[2] = {CI_LORA_GATE, CI_LORA_UP};
  const ci_tensor *const ws[2] = {&L->w_gate, &L->w_up};
  const float *const biases[2] = {L->b_gate, L->b_up};
  float *const ys[2] = {act->gate, act->up};
  if (linear_multi_at(be, sr, li, targets, ws, biases, 2, a, n, ys)) return CI_ERR;
  if (m->spec.act == CI_ACT_GELU_TANH)
    be->ops->gelu_tanh_mul(be, act->gate, act->up, n, inter, inter);
  else
    be->ops->silu_mul(be, act->gate, act->up, (int64_t)n * inter);
  return linear_reduced_at(m, sr, li, CI_LORA_DOWN, &L->w_down, L->b_down, act->gate, n, out);
}

/* act->moe_out = Σ_k w_k · expert_k(RMSNorm(x, moe_norm)) with the router's choice
 * (docs/models.md §5.7): experts run one at a time over the rows routed to them. */
static int moe_block(ci_model *m, const step_rows *sr, int li, int n, ci_workspace *act) {
  ci_backend *be = m->be;
  const ci_model_spec *s = &m->spec;
  const ci_layer_weights *L = &m->layers[li];
  const int64_t hidden = s->hidden, width = s->moe_intermediate;
  const int top_k = s->top_k_experts;
  /* Router on the post-attention residual: (RMSNorm_noscale(x) ⊙ scale) · hidden^-0.5. */
  be->ops->rmsnorm(be, act->a, act->x, L->router_scale, n, hidden, s->norm_eps, 0.0f);
  be->ops->scale(be, act->a, 1.0f / sqrtf((float)hidden), (int64_t)n * hidden);
  if (matmul(be, sr, &L->router, act->a, n, act->moe_scores)) return CI_ERR;
  be->ops->moe_route(be, act->moe_scores, n, s->n_experts, top_k, L->expert_scale, act->route_ids,
                     act->route_w);
  norm(m, act->a, act->x, L->moe_norm, n, hidden);
  be->ops->fill(be, act->moe_out, 0.0f, (int64_t)n * hidden);
  const int n_seqs = sr->kv.n_seqs;
  for (int e = 0; e < s->n_experts; e++) {
    /* the expert's rows, in row order, counted per sequence: each sequence's rows form a
     * segment, computed as in a step of that sequence alone */
    int count = 0;
    for (int i = 0; i < n_seqs; i++) {
      const int before = count;
      for (int t = sr->kv.first_row[i]; t < sr->kv.first_row[i] + sr->kv.n_rows[i]; t++)
        for (int k = 0; k < top_k; k++)
          if (act->route_ids[t * top_k + k] == e) {
            act->rows[count] = t;
            act->row_w[count++] = act->route_w[t * top_k + k];
          }
      act->expert_seg[i] = count - before;
    }
    if (count == 0) continue;
    const step_rows expert_rows_of_step = {.segments = {.n = n_seqs, .rows = act->expert_seg}};
    be->ops->gather_rows(be, act->moe_in, act->a, act->rows, count, hidden);
    ci_tensor gate = expert_rows(&L->experts_gate_up, e, 0, width);
    ci_tensor up = expert_rows(&L->experts_gate_up, e, width, width);
    ci_tensor down = expert_rows(&L->experts_down, e, 0, hidden);
    const step_rows *er = &expert_rows_of_step;
    if (matmul(be, er, &gate, act->moe_in, count, act->gate) ||
        matmul(be, er, &up, act->moe_in, count, act->up))
      return CI_ERR;
    be->ops->gelu_tanh_mul(be, act->gate, act->up, count, width, width);
    if (matmul(be, er, &down, act->gate, count, act->moe_y)) return CI_ERR;
    be->ops->scatter_add_rows(be, act->moe_out, act->moe_y, act->rows, act->row_w, count, hidden);
  }
  return CI_OK;
}

/* Attention half of layer li: projections, norms, RoPE, KV write (cache owners) and attention
 * over the cache layer for each sequence of the step, o_proj into act->proj. */
static int attention_block(ci_model *m, const step_rows *sr, int li, int n, ci_workspace *act) {
  ci_backend *be = m->be;
  const ci_model_spec *s = &m->spec;
  const ci_layer_spec *ls = &s->layers[li];
  const ci_layer_weights *L = &m->layers[li];
  const int D = ls->head_dim, Hq = heads_here(m), Hkv = kv_heads_here(m, li);
  const ci_rope *rope = &m->ropes[ls->rope_index];
  const int owner = ls->cache_layer == li;

  norm(m, act->a, act->x, L->attn_norm, n, s->hidden);
  /* q, k and v in one dispatch when this layer writes its own K and V */
  const int fused_qkv = owner && !ls->k_eq_v;
  if (fused_qkv) {
    const ci_lora_target targets[3] = {CI_LORA_Q, CI_LORA_K, CI_LORA_V};
    const ci_tensor *const ws[3] = {&L->wq, &L->wk, &L->wv};
    const float *const biases[3] = {L->bq, L->bk, L->bv};
    float *const ys[3] = {act->q, act->k, act->v};
    if (linear_multi_at(be, sr, li, targets, ws, biases, 3, act->a, n, ys)) return CI_ERR;
  } else if (linear_at(be, sr, li, CI_LORA_Q, &L->wq, L->bq, act->a, n, act->q)) {
    return CI_ERR;
  }
  if (s->attn_output_gate) {
    /* q_proj gave [rows, Hq, 2D]: per head its query, then its output gate (docs/models.md
     * §5.8); as rows of D, queries are the even rows and gates the odd ones */
    const int64_t heads = (int64_t)n * Hq;
    be->ops->gather_rows(be, act->att, act->q, act->head_rows, heads, D);
    be->ops->gather_rows(be, act->qg, act->q, act->head_rows + (int64_t)act->max_rows * Hq, heads,
                         D);
    be->ops->copy(be, act->q, act->att, heads * D);
  }
  if (s->qk_norm) norm(m, act->q, act->q, L->q_norm, (int64_t)n * Hq, D);
  be->ops->rope(be, act->q, n, Hq, act->pos, rope);
  if (owner) {
    if (!fused_qkv && linear_at(be, sr, li, CI_LORA_K, &L->wk, L->bk, act->a, n, act->k))
      return CI_ERR;
    if (ls->k_eq_v)
      be->ops->copy(be, act->v, act->k, (int64_t)n * Hkv * D); /* V is K before its norm */
    if (s->qk_norm) norm(m, act->k, act->k, L->k_norm, (int64_t)n * Hkv, D);
    if (s->v_norm)
      be->ops->rmsnorm(be, act->v, act->v, NULL, (int64_t)n * Hkv, D, s->norm_eps, 0.0f);
    be->ops->rope(be, act->k, n, Hkv, act->pos, rope);
  }
  for (int i = 0; i < sr->kv.n_seqs; i++)
    act->views[i] = ci_kv_seq_view_rank(sr->seqs[i].seq, ls->kv_index, m->shard.rank);
  if (owner && be->ops->kv_store(be, &sr->kv, act->k, act->v, act->pos)) return CI_ERR;
  const ci_attention_args args = {.q = act->q,
                                  .out = act->att,
                                  .pos = act->pos,
                                  .n_heads = Hq,
                                  .scale = ls->attn_scale,
                                  .softcap = s->attn_softcap,
                                  .window = ls->kind == CI_ATTN_SLIDING ? ls->window : 0,
                                  .seqs = &sr->kv};
  if (be->ops->attention(be, &args)) return CI_ERR;
  if (s->attn_output_gate) be->ops->sigmoid_mul(be, act->att, act->qg, (int64_t)n * Hq * D);
  return linear_reduced_at(m, sr, li, CI_LORA_O, &L->wo, L->bo, act->att, n, act->proj);
}

/* Gated DeltaNet half of layer li (docs/models.md §5.8): the four input projections, the mixer
 * over each sequence's recurrent state of this layer, out_proj into act->proj. */
static int deltanet_block(ci_model *m, const step_rows *sr, int li, int n, ci_workspace *act) {
  ci_backend *be = m->be;
  const ci_model_spec *s = &m->spec;
  const ci_layer_weights *L = &m->layers[li];
  const ci_deltanet_geometry *g = &s->deltanet;
  norm(m, act->a, act->x, L->attn_norm, n, s->hidden);
  if (matmul(be, sr, &L->dn_in_qkv, act->a, n, act->dn_qkv) ||
      matmul(be, sr, &L->dn_in_z, act->a, n, act->dn_z) ||
      matmul(be, sr, &L->dn_in_b, act->a, n, act->dn_b) ||
      matmul(be, sr, &L->dn_in_a, act->a, n, act->dn_a))
    return CI_ERR;
  int index = 0; /* this layer's place among the DeltaNet layers: its part of each state */
  for (int i = 0; i < li; i++) index += s->layers[i].mixer == CI_MIXER_DELTANET;
  const int64_t offset = (int64_t)index * ci_spec_deltanet_layer_floats(s);
  const int64_t total = ci_spec_state_bytes(s) / (int64_t)sizeof(float); /* a whole state */
  int rounds = 0; /* sequences in a speculative round keep per-row checkpoints */
  for (int i = 0; i < sr->kv.n_seqs; i++) {
    const ci_kv_seq *seq = sr->seqs[i].seq;
    act->dn_states[i] = seq->state + offset;
    act->dn_checkpoints[i] =
        seq->round_open ? seq->checkpoints + (seq->n - seq->round_start + 1) * total + offset
                        : NULL;
    rounds += seq->round_open;
  }
  const ci_deltanet_args args = {.qkv = act->dn_qkv,
                                 .z = act->dn_z,
                                 .b = act->dn_b,
                                 .a = act->dn_a,
                                 .out = act->dn_out,
                                 .conv_w = L->dn_conv,
                                 .a_log = L->dn_a_log,
                                 .dt_bias = L->dn_dt_bias,
                                 .norm_w = L->dn_norm,
                                 .norm_eps = s->norm_eps,
                                 .n_k_heads = g->n_k_heads,
                                 .n_v_heads = g->n_v_heads,
                                 .k_head_dim = g->k_head_dim,
                                 .v_head_dim = g->v_head_dim,
                                 .conv_kernel = g->conv_kernel,
                                 .n_seqs = sr->kv.n_seqs,
                                 .first_row = sr->kv.first_row,
                                 .n_rows = sr->kv.n_rows,
                                 .states = act->dn_states,
                                 .checkpoints = rounds ? act->dn_checkpoints : NULL,
                                 .checkpoint_stride = total};
  if (be->ops->gated_deltanet(be, &args)) return CI_ERR;
  return matmul(be, sr, &L->dn_out, act->dn_out, n, act->proj);
}

/* One layer, in the family's wiring. */
static int layer_forward(ci_model *m, const step_rows *sr, int li, int n, ci_workspace *act) {
  ci_backend *be = m->be;
  const ci_model_spec *s = &m->spec;
  const ci_layer_weights *L = &m->layers[li];
  const int64_t hn = (int64_t)n * s->hidden;

  if (s->layers[li].mixer == CI_MIXER_DELTANET ? deltanet_block(m, sr, li, n, act)
                                               : attention_block(m, sr, li, n, act))
    return CI_ERR;
  if (s->wiring == CI_WIRING_PRE_NORM) {
    be->ops->add(be, act->x, act->proj, hn);
    norm(m, act->a, act->x, L->mlp_norm, n, s->hidden);
    if (dense_mlp(m, sr, li, act->a, n, act, act->proj)) return CI_ERR;
    be->ops->add(be, act->x, act->proj, hn);
    return CI_OK;
  }
  norm(m, act->proj, act->proj, L->attn_post_norm, n, s->hidden);
  be->ops->add(be, act->x, act->proj, hn);
  norm(m, act->a, act->x, L->mlp_norm, n, s->hidden);
  if (dense_mlp(m, sr, li, act->a, n, act, act->proj)) return CI_ERR;
  if (s->n_experts > 0) {
    norm(m, act->proj, act->proj, L->mlp_post_norm_1, n, s->hidden);
    if (moe_block(m, sr, li, n, act)) return CI_ERR;
    norm(m, act->moe_out, act->moe_out, L->moe_post_norm, n, s->hidden);
    be->ops->add(be, act->proj, act->moe_out, hn);
  }
  norm(m, act->proj, act->proj, L->mlp_post_norm, n, s->hidden);
  be->ops->add(be, act->x, act->proj, hn);
  if (s->ple_dim > 0) {
    const int64_t P = s->ple_dim;
    if (linear(be, sr, &L->ple_gate, NULL, act->x, n, act->gate)) return CI_ERR;
    be->ops->gelu_tanh_mul(be, act->gate, act->ple + li * P, n, P, (int64_t)s->n_layers * P);
    if (linear(be, sr, &L->ple_proj, NULL, act->gate, n, act->proj)) return CI_ERR;
    norm(m, act->proj, act->proj, L->ple_post_norm, n, s->hidden);
    be->ops->add(be, act->x, act->proj, hn);
  }
  if (s->layer_scalar) be->ops->scale(be, act->x, L->layer_scale, hn);
  return CI_OK;
}

/* Per-layer inputs of the n tokens (docs/models.md §5.7): ((h0 @ W^T)·hidden^-0.5 normed over P +
 * E_ple[ids]·sqrt(P)) · 2^-0.5, laid out [n, N, P]. */
static int per_layer_inputs(ci_model *m, const step_rows *sr, const int32_t *ids, int n,
                            ci_workspace *act) {
  ci_backend *be = m->be;
  const ci_model_spec *s = &m->spec;
  const int64_t width = (int64_t)s->n_layers * s->ple_dim;
  if (be->ops->embed(be, &m->ple_embed, ids, n, act->ple_tmp)) return CI_ERR;
  be->ops->scale(be, act->ple_tmp, s->ple_embed_scale, (int64_t)n * width);
  if (matmul(be, sr, &m->ple_model_proj, act->x, n, act->ple)) return CI_ERR;
  be->ops->scale(be, act->ple, 1.0f / sqrtf((float)s->hidden), (int64_t)n * width);
  norm(m, act->ple, act->ple, m->ple_norm, (int64_t)n * s->n_layers, s->ple_dim);
  be->ops->add(be, act->ple, act->ple_tmp, (int64_t)n * width);
  be->ops->scale(be, act->ple, (float)M_SQRT1_2, (int64_t)n * width);
  return CI_OK;
}

/* Checks a step against the model and its sequences' state. */
static int check_step(const ci_model *m, const ci_step_seq *seqs, int n_seqs) {
  const ci_model_spec *s = &m->spec;
  if (n_seqs < 1) return ci_fail("step: no sequences");
  for (int i = 0; i < n_seqs; i++) {
    const ci_step_seq *q = &seqs[i];
    if (!q->seq || q->n_rows < 1) return ci_fail("step: sequence %d has no rows", i);
    if (q->n_logit_rows < 0 || q->n_logit_rows > q->n_rows)
      return ci_fail("step: %d logit rows requested for %d tokens", q->n_logit_rows, q->n_rows);
    for (int r = 0; r < q->n_rows; r++) {
      if (q->ids[r] < 0 || q->ids[r] >= s->vocab)
        return ci_fail("token id %d at index %d is out of range [0, %d)", q->ids[r], r, s->vocab);
      if (s->ple_dim > 0 && q->ids[r] >= s->ple_vocab)
        return ci_fail("token id %d is outside the per-layer input table (%d rows)", q->ids[r],
                       s->ple_vocab);
    }
    if (q->seq->n + q->n_rows > (int64_t)INT32_MAX) return ci_fail("step: sequence too long");
    /* a pending KV conversion must happen exactly at its start (docs/kv-cache.md §5) */
    if ((int64_t)q->n_rows > ci_kv_seq_chunk_limit(q->seq))
      return ci_fail("step: %d rows cross the sequence's KV conversion point", q->n_rows);
    for (int j = 0; j < i; j++)
      if (seqs[j].seq == q->seq) return ci_fail("step: a sequence appears twice in a step");
    if (s->n_deltanet_layers > 0 &&
        (!q->seq->state || q->seq->cache->state_bytes < ci_spec_state_bytes(s)))
      return ci_fail("step: sequence %d has no recurrent state for this %s model (its KV cache "
                     "must come from ci_model_kv_cache_create)",
                     i, s->model_type);
    if (s->n_deltanet_layers > 0 && q->seq->round_open &&
        q->seq->n + q->n_rows - q->seq->round_start >= q->seq->n_checkpoints)
      return ci_fail("step: %d rows exceed the speculative round's state checkpoints", q->n_rows);
  }
  return CI_OK;
}

int ci_model_step_admit(ci_model *m, const ci_step_seq *seqs, int n_seqs) {
  if (check_step(m, seqs, n_seqs)) return CI_ERR;
  for (int i = 0; i < n_seqs; i++)
    if (ci_kv_seq_reserve(seqs[i].seq, seqs[i].n_rows)) return CI_ERR;
  for (int i = 0; i < n_seqs; i++) ci_kv_seq_sync_tables(seqs[i].seq);
  return CI_OK;
}

/* The head of a split model on the selected rows `a`: this rank's vocabulary columns into its
 * scratch, then gathered into rank 0's out [n_logits, vocab]. */
static int head_here(ci_model *m, ci_workspace *ws, const step_rows *logit_rows, const float *a,
                     int n_logits, float *out) {
  ci_backend *be = m->be;
  const int64_t cols = m->head.shape[0];
  float *part = ci_workspace_tp_logits(ws, (int64_t)n_logits * cols);
  if (!part || matmul(be, logit_rows, &m->head, a, n_logits, part)) return CI_ERR;
  if (m->spec.final_softcap != 0.0f)
    be->ops->softcap(be, part, m->spec.final_softcap, (int64_t)n_logits * cols);
  return be->ops->gather_cols(be, m->shard.comm, m->shard.rank, out, part, n_logits, cols,
                              m->shard.vocab_first, m->spec.vocab);
}

/* ci_model_step_picks; with hidden instead of logits and picks, the selected rows' final-normed
 * hidden states (the head's input) are written there instead ([rows, hidden] f32). */
static int model_step(ci_model *m, ci_workspace *ws, const ci_step_seq *seqs, int n_seqs,
                      float *logits, ci_row_pick *picks, float *hidden) {
  if (m->tp) return ci_tp_step(m, ws, seqs, n_seqs, logits, picks, hidden);
  if (check_step(m, seqs, n_seqs)) return CI_ERR;
  const ci_step_role whole = {
      .own_kv = 1, .want = logits || picks || hidden, .head = logits || picks};
  return ci_model_step_run(m, ws, seqs, n_seqs, logits, picks, hidden, &whole);
}

int ci_model_step_run(ci_model *m, ci_workspace *ws, const ci_step_seq *seqs, int n_seqs,
                      float *logits, ci_row_pick *picks, float *hidden, const ci_step_role *role) {
  const ci_model_spec *s = &m->spec;
  const int want = role->want; /* rows are selected for any output */
  int n = 0, n_logits = 0;
  for (int i = 0; i < n_seqs; i++) {
    if (seqs[i].n_rows > INT32_MAX - n) return ci_fail("step: too many rows");
    n += seqs[i].n_rows;
  }
  if (ci_workspace_fit(ws, s, n, n_seqs)) return CI_ERR;
  int any_lora = 0;
  for (int i = 0; i < n_seqs; i++) any_lora |= (ws->seq_lora[i] = seqs[i].lora) != NULL;
  const ci_lora_step lora_step = {.rank = m->shard.rank,
                                  .n_seqs = any_lora ? n_seqs : 0,
                                  .first_row = ws->seq_first,
                                  .n_rows = ws->seq_rows,
                                  .loras = ws->seq_lora};
  if (any_lora && ci_lora_step_fit(ws, &lora_step, n)) return CI_ERR;
  for (int i = 0; i < n_seqs && role->own_kv; i++)
    if (ci_kv_seq_reserve(seqs[i].seq, seqs[i].n_rows)) return CI_ERR;

  /* the step descriptor: each sequence's ids at its next positions (host, then backend memory),
   * and the rows that give logits */
  int32_t *ids_host = ws->desc_host, *pos_host = ws->desc_host + n;
  for (int i = 0, row = 0; i < n_seqs; i++) {
    const ci_step_seq *q = &seqs[i];
    ws->seq_first[i] = row;
    ws->seq_rows[i] = q->n_rows;
    ws->logit_seg[i] = want ? q->n_logit_rows : 0;
    for (int r = 0; r < q->n_rows; r++, row++) {
      ids_host[row] = q->ids[r];
      pos_host[row] = (int32_t)(q->seq->n + r);
      if (want && r >= q->n_rows - q->n_logit_rows) ws->logit_rows[n_logits++] = row;
    }
  }
  ci_backend *be = m->be;
  ws->ids = ws->desc;
  ws->pos = ws->desc + n;
  if (be->ops->step_begin(be, ws->desc, ws->desc_host, (size_t)2 * n * sizeof(int32_t)))
    return CI_ERR;
  for (int i = 0; i < n_seqs && role->own_kv; i++) ci_kv_seq_sync_tables(seqs[i].seq);
  /* logits and picks: straight into the caller's buffers where the backend shares host memory */
  float *out = NULL;
  ci_row_pick *picks_out = NULL;
  if (n_logits > 0 && (logits || picks)) {
    out =
        be->host_visible && logits ? logits : ci_workspace_logits(ws, (int64_t)n_logits * s->vocab);
    if (!out) return CI_ERR;
  }
  if (n_logits > 0 && picks) {
    picks_out = be->host_visible ? picks : ci_workspace_picks(ws, n_logits);
    if (!picks_out) return CI_ERR;
  }
  const step_rows sr = {
      .segments = {.n = n_seqs, .rows = ws->seq_rows},
      .kv = {.n_seqs = n_seqs, .first_row = ws->seq_first, .n_rows = ws->seq_rows, .kv = ws->views},
      .seqs = seqs,
      .lora = lora_step,
      .ws = ws};

  int status = be->ops->embed(be, &m->embed, ws->ids, n, ws->x);
  if (status == CI_OK && s->embed_scale != 0.0f)
    be->ops->scale(be, ws->x, s->embed_scale, (int64_t)n * s->hidden);
  if (status == CI_OK && s->ple_dim > 0) status = per_layer_inputs(m, &sr, ws->ids, n, ws);
  for (int li = 0; li < s->n_layers && status == CI_OK; li++)
    status = layer_forward(m, &sr, li, n, ws);
  for (int i = 0; i < n_seqs && status == CI_OK && role->own_kv; i++)
    status = ci_kv_seq_commit(seqs[i].seq, seqs[i].n_rows);
  if (status == CI_OK && n_logits > 0) {
    be->ops->gather_rows(be, ws->proj, ws->x, ws->logit_rows, n_logits, s->hidden);
    norm(m, ws->a, ws->proj, m->final_norm, n_logits, s->hidden);
    const step_rows logit_rows = {.segments = {.n = n_seqs, .rows = ws->logit_seg}};
    if (role->head && ci_model_tensor_parallel(m) > 1) {
      status = head_here(m, ws, &logit_rows, ws->a, n_logits, out);
    } else if (out) {
      status = matmul(be, &logit_rows, &m->head, ws->a, n_logits, out);
      if (status == CI_OK && s->final_softcap != 0.0f)
        be->ops->softcap(be, out, s->final_softcap, (int64_t)n_logits * s->vocab);
    }
    if (picks_out && status == CI_OK) be->ops->pick_rows(be, picks_out, out, n_logits, s->vocab);
  }
  if (hidden) { /* the normed rows come back as logits would (a download where memory is apart) */
    const ci_download normed = {n_logits > 0 ? hidden : NULL, ws->a,
                                (size_t)n_logits * s->hidden * sizeof(float)};
    return status ? (be->ops->step_end(be, NULL, 0), status) : be->ops->step_end(be, &normed, 1);
  }
  const ci_download downloads[2] = {
      {n_logits > 0 ? logits : NULL, out, (size_t)n_logits * s->vocab * sizeof(float)},
      {n_logits > 0 ? picks : NULL, picks_out, (size_t)n_logits * sizeof(ci_row_pick)}};
  const int end = be->ops->step_end(be, downloads, 2);
  return status ? status : end;
}

int ci_model_step(ci_model *m, ci_workspace *ws, const ci_step_seq *seqs, int n_seqs,
                  float *logits) {
  return model_step(m, ws, seqs, n_seqs, logits, NULL, NULL);
}

int ci_model_step_picks(ci_model *m, ci_workspace *ws, const ci_step_seq *seqs, int n_seqs,
                        float *logits, ci_row_pick *picks) {
  return model_step(m, ws, seqs, n_seqs, logits, picks, NULL);
}

int ci_model_step_hidden(ci_model *m, ci_workspace *ws, const ci_step_seq *seqs, int n_seqs,
                         float *hidden) {
  if (!hidden) return ci_fail("step: no hidden-state buffer");
  return model_step(m, ws, seqs, n_seqs, NULL, NULL, hidden);
}

/* The model's own workspace, for the single-sequence calls. */
static ci_workspace *own_workspace(ci_model *m) {
  if (!m->workspace) m->workspace = ci_workspace_create(m->be);
  return m->workspace;
}

/* A step of one sequence's n tokens (within its chunk limit). */
static int forward_one(ci_model *m, ci_kv_seq *seq, const ci_lora *lora, const int32_t *ids, int n,
                       float *logits, int n_logit_rows) {
  ci_workspace *ws = own_workspace(m);
  if (!ws) return CI_ERR;
  const ci_step_seq step = {
      .seq = seq, .ids = ids, .n_rows = n, .n_logit_rows = n_logit_rows, .lora = lora};
  return ci_model_step(m, ws, &step, 1, logits);
}

int ci_model_forward(ci_model *m, ci_kv_seq *seq, const int32_t *ids, int n, float *logits,
                     int n_logit_rows) {
  return ci_model_forward_lora(m, seq, NULL, ids, n, logits, n_logit_rows);
}

int ci_model_forward_lora(ci_model *m, ci_kv_seq *seq, const ci_lora *lora, const int32_t *ids,
                          int n, float *logits, int n_logit_rows) {
  const ci_model_spec *s = &m->spec;
  if (n < 1) return ci_fail("forward: no tokens");
  if (!logits) n_logit_rows = 0;
  if (logits && (n_logit_rows < 1 || n_logit_rows > n))
    return ci_fail("forward: %d logit rows requested for %d tokens", n_logit_rows, n);
  /* A pending KV conversion caps the step so that it happens exactly at its start. */
  const int64_t limit = ci_kv_seq_chunk_limit(seq);
  if ((int64_t)n <= limit) return forward_one(m, seq, lora, ids, n, logits, n_logit_rows);
  for (int i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= s->vocab)
      return ci_fail("token id %d at index %d is out of range [0, %d)", ids[i], i, s->vocab);
  const int head = (int)limit, tail = n - head;
  const int tail_rows = n_logit_rows < tail ? n_logit_rows : tail;
  const int head_rows = n_logit_rows - tail_rows;
  if (forward_one(m, seq, lora, ids, head, head_rows ? logits : NULL, head_rows)) return CI_ERR;
  return ci_model_forward_lora(m, seq, lora, ids + head, tail,
                               logits ? logits + (int64_t)head_rows * s->vocab : NULL, tail_rows);
}

int ci_model_forward_decode_batch(ci_model *m, ci_kv_seq *const *seqs, const int32_t *ids, int n,
                                  float *logits) {
  return ci_model_forward_decode_batch_picks(m, seqs, ids, n, logits, NULL);
}

int ci_model_forward_decode_batch_picks(ci_model *m, ci_kv_seq *const *seqs, const int32_t *ids,
                                        int n, float *logits, ci_row_pick *picks) {
  if (n < 1) return ci_fail("forward: no sequences");
  ci_workspace *ws = own_workspace(m);
  ci_step_seq *steps = malloc((size_t)n * sizeof *steps);
  if (!ws || !steps) {
    free(steps);
    return ci_fail("forward: out of memory");
  }
  for (int i = 0; i < n; i++)
    steps[i] = (ci_step_seq){
        .seq = seqs[i], .ids = ids + i, .n_rows = 1, .n_logit_rows = logits || picks ? 1 : 0};
  const int status = ci_model_step_picks(m, ws, steps, n, logits, picks);
  free(steps);
  return status;
}
