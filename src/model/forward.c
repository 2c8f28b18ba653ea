/* Forward pass of the decoder-only transformer families, written once against the backend op
 * table: Llama/Mistral/Qwen pre-norm blocks and Gemma 2/3/4 sandwich blocks with GeGLU,
 * softcaps, K=V layers, KV sharing, per-layer inputs and MoE (docs/models.md §5). A step is one
 * sequence's tokens, or one decode token of each of several sequences: their rows share every
 * matmul (the weights are read once) through row kernels whose per-row results do not depend
 * on the batch, while KV writes and attention run per sequence. */
#include "base/error.h"
#include "model/model.h"

#include <math.h>
#include <stdlib.h>

/* Activation buffers of one forward call of n tokens (backend memory), plus the host-side
 * expert schedule of an MoE step. */
typedef struct {
  float *x;       /* (n, hidden) residual stream */
  float *a;       /* (n, hidden) normed input of a block */
  float *q;       /* (n, Hq * D) */
  float *k;       /* (n, Hkv * D) */
  float *v;       /* (n, Hkv * D) */
  float *att;     /* (n, Hq * D) attention output */
  float *proj;    /* (n, hidden) o_proj / down_proj output */
  float *gate;    /* (n, I) */
  float *up;      /* (n, I) */
  int32_t *pos;   /* (n) */
  float *ple;     /* (n, N, P) per-layer inputs; NULL without PLE */
  float *ple_tmp; /* (n, N * P) */
  /* MoE */
  float *moe_scores;  /* (n, E) router scores */
  float *moe_out;     /* (n, hidden) weighted expert sum */
  float *moe_in;      /* (n, hidden) gathered rows of one expert */
  float *moe_y;       /* (n, hidden) one expert's output rows */
  int32_t *route_ids; /* host (n, k) */
  float *route_w;     /* host (n, k) */
  int32_t *rows;      /* host (n) token rows of one expert */
  float *row_w;       /* host (n) their weights */
} activations;

static void activations_free(ci_backend *be, activations *act) {
  void *bufs[] = {act->x,          act->a,       act->q,      act->k,    act->v,   act->att,
                  act->proj,       act->gate,    act->up,     act->pos,  act->ple, act->ple_tmp,
                  act->moe_scores, act->moe_out, act->moe_in, act->moe_y};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (bufs[i]) be->ops->release(be, bufs[i]);
  free(act->route_ids);
  free(act->route_w);
  free(act->rows);
  free(act->row_w);
}

static int activations_alloc(const ci_model *m, int n, activations *act) {
  const ci_model_spec *s = &m->spec;
  int64_t q_dim = 0, kv_dim = 0, inter = 0;
  for (int i = 0; i < s->n_layers; i++) {
    const ci_layer_spec *l = &s->layers[i];
    int64_t qd = (int64_t)s->n_heads * l->head_dim;
    int64_t kd = (int64_t)l->n_kv_heads * l->head_dim;
    if (qd > q_dim) q_dim = qd;
    if (kd > kv_dim) kv_dim = kd;
    if (l->intermediate > inter) inter = l->intermediate;
  }
  if (s->moe_intermediate > inter) inter = s->moe_intermediate;
  if (s->ple_dim > inter) inter = s->ple_dim;
  ci_backend *be = m->be;
  const size_t f = sizeof(float);
  act->x = be->ops->alloc(be, (size_t)n * s->hidden * f);
  act->a = be->ops->alloc(be, (size_t)n * s->hidden * f);
  act->q = be->ops->alloc(be, (size_t)n * q_dim * f);
  act->k = be->ops->alloc(be, (size_t)n * kv_dim * f);
  act->v = be->ops->alloc(be, (size_t)n * kv_dim * f);
  act->att = be->ops->alloc(be, (size_t)n * q_dim * f);
  act->proj = be->ops->alloc(be, (size_t)n * s->hidden * f);
  act->gate = be->ops->alloc(be, (size_t)n * inter * f);
  act->up = be->ops->alloc(be, (size_t)n * inter * f);
  act->pos = be->ops->alloc(be, (size_t)n * sizeof(int32_t));
  int ok = act->x && act->a && act->q && act->k && act->v && act->att && act->proj && act->gate &&
           act->up && act->pos;
  if (ok && s->ple_dim > 0) {
    const size_t width = (size_t)s->n_layers * s->ple_dim;
    act->ple = be->ops->alloc(be, (size_t)n * width * f);
    act->ple_tmp = be->ops->alloc(be, (size_t)n * width * f);
    ok = act->ple && act->ple_tmp;
  }
  if (ok && s->n_experts > 0) {
    const size_t k = (size_t)s->top_k_experts;
    act->moe_scores = be->ops->alloc(be, (size_t)n * s->n_experts * f);
    act->moe_out = be->ops->alloc(be, (size_t)n * s->hidden * f);
    act->moe_in = be->ops->alloc(be, (size_t)n * s->hidden * f);
    act->moe_y = be->ops->alloc(be, (size_t)n * s->hidden * f);
    act->route_ids = malloc((size_t)n * k * sizeof(int32_t));
    act->route_w = malloc((size_t)n * k * sizeof(float));
    act->rows = malloc((size_t)n * sizeof(int32_t));
    act->row_w = malloc((size_t)n * sizeof(float));
    ok = act->moe_scores && act->moe_out && act->moe_in && act->moe_y && act->route_ids &&
         act->route_w && act->rows && act->row_w;
  }
  if (!ok) {
    activations_free(be, act);
    return ci_fail("out of memory for activations of %d tokens", n);
  }
  return CI_OK;
}

/* The rows of one step: sequence i owns rows [first[i], first[i] + rows[i]). */
typedef struct {
  int n_seqs;
  ci_kv_seq *const *seqs;
  const int *first;
  const int *rows;
  int row_invariant; /* several sequences: matmul rows must not depend on the batch */
} step_rows;

/* y = x @ W^T for the step's n rows. */
static int matmul(ci_backend *be, const step_rows *sr, const ci_tensor *w, const float *x, int n,
                  float *y) {
  return sr->row_invariant ? be->ops->matmul_rows(be, w, x, n, y) : be->ops->matmul(be, w, x, n, y);
}

/* y = x @ W^T (+ b). */
static int linear(ci_backend *be, const step_rows *sr, const ci_tensor *w, const float *bias,
                  const float *x, int n, float *y) {
  if (matmul(be, sr, w, x, n, y)) return CI_ERR;
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
                     activations *act, float *out) {
  ci_backend *be = m->be;
  const ci_layer_weights *L = &m->layers[li];
  const int64_t inter = m->spec.layers[li].intermediate;
  if (linear(be, sr, &L->w_gate, L->b_gate, a, n, act->gate) ||
      linear(be, sr, &L->w_up, L->b_up, a, n, act->up))
    return CI_ERR;
  if (m->spec.act == CI_ACT_GELU_TANH)
    be->ops->gelu_tanh_mul(be, act->gate, act->up, n, inter, inter);
  else
    be->ops->silu_mul(be, act->gate, act->up, (int64_t)n * inter);
  return linear(be, sr, &L->w_down, L->b_down, act->gate, n, out);
}

/* act->moe_out = Σ_k w_k · expert_k(RMSNorm(x, moe_norm)) with the router's choice
 * (docs/models.md §5.7): experts run one at a time over the rows routed to them. */
static int moe_block(ci_model *m, const step_rows *sr, int li, int n, activations *act) {
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
  be->ops->scale(be, act->moe_out, 0.0f, (int64_t)n * hidden);
  for (int e = 0; e < s->n_experts; e++) {
    int count = 0;
    for (int t = 0; t < n; t++)
      for (int k = 0; k < top_k; k++)
        if (act->route_ids[t * top_k + k] == e) {
          act->rows[count] = t;
          act->row_w[count++] = act->route_w[t * top_k + k];
        }
    if (count == 0) continue;
    be->ops->gather_rows(be, act->moe_in, act->a, act->rows, count, hidden);
    ci_tensor gate = expert_rows(&L->experts_gate_up, e, 0, width);
    ci_tensor up = expert_rows(&L->experts_gate_up, e, width, width);
    ci_tensor down = expert_rows(&L->experts_down, e, 0, hidden);
    if (matmul(be, sr, &gate, act->moe_in, count, act->gate) ||
        matmul(be, sr, &up, act->moe_in, count, act->up))
      return CI_ERR;
    be->ops->gelu_tanh_mul(be, act->gate, act->up, count, width, width);
    if (matmul(be, sr, &down, act->gate, count, act->moe_y)) return CI_ERR;
    be->ops->scatter_add_rows(be, act->moe_out, act->moe_y, act->rows, act->row_w, count, hidden);
  }
  return CI_OK;
}

/* Attention half of layer li: projections, norms, RoPE, KV write (cache owners) and attention
 * over the cache layer for each sequence of the step, o_proj into act->proj. */
static int attention_block(ci_model *m, const step_rows *sr, int li, int n, activations *act) {
  ci_backend *be = m->be;
  const ci_model_spec *s = &m->spec;
  const ci_layer_spec *ls = &s->layers[li];
  const ci_layer_weights *L = &m->layers[li];
  const int D = ls->head_dim, Hq = s->n_heads, Hkv = ls->n_kv_heads;
  const ci_rope *rope = &s->ropes[ls->rope_index].rope;
  const int owner = ls->cache_layer == li;

  norm(m, act->a, act->x, L->attn_norm, n, s->hidden);
  if (linear(be, sr, &L->wq, L->bq, act->a, n, act->q)) return CI_ERR;
  if (s->qk_norm) norm(m, act->q, act->q, L->q_norm, (int64_t)n * Hq, D);
  be->ops->rope(be, act->q, n, Hq, act->pos, rope);
  if (owner) {
    if (linear(be, sr, &L->wk, L->bk, act->a, n, act->k)) return CI_ERR;
    if (ls->k_eq_v)
      be->ops->copy(be, act->v, act->k, (int64_t)n * Hkv * D); /* V is K before its norm */
    else if (linear(be, sr, &L->wv, L->bv, act->a, n, act->v))
      return CI_ERR;
    if (s->qk_norm) norm(m, act->k, act->k, L->k_norm, (int64_t)n * Hkv, D);
    if (s->v_norm)
      be->ops->rmsnorm(be, act->v, act->v, NULL, (int64_t)n * Hkv, D, s->norm_eps, 0.0f);
    be->ops->rope(be, act->k, n, Hkv, act->pos, rope);
  }
  for (int i = 0; i < sr->n_seqs; i++) {
    const int64_t r0 = sr->first[i];
    const int rows = sr->rows[i];
    ci_paged_kv kv = ci_kv_seq_view(sr->seqs[i], ls->cache_layer);
    if (owner && be->ops->kv_store(be, &kv, act->k + r0 * Hkv * D, act->v + r0 * Hkv * D,
                                   act->pos + r0, rows))
      return CI_ERR;
    ci_attention_args args = {.q = act->q + r0 * Hq * D,
                              .out = act->att + r0 * Hq * D,
                              .pos = act->pos + r0,
                              .n_rows = rows,
                              .n_heads = Hq,
                              .scale = ls->attn_scale,
                              .softcap = s->attn_softcap,
                              .window = ls->kind == CI_ATTN_SLIDING ? ls->window : 0,
                              .kv = &kv};
    if (be->ops->attention(be, &args)) return CI_ERR;
  }
  return linear(be, sr, &L->wo, L->bo, act->att, n, act->proj);
}

/* One layer, in the family's wiring. */
static int layer_forward(ci_model *m, const step_rows *sr, int li, int n, activations *act) {
  ci_backend *be = m->be;
  const ci_model_spec *s = &m->spec;
  const ci_layer_weights *L = &m->layers[li];
  const int64_t hn = (int64_t)n * s->hidden;

  if (attention_block(m, sr, li, n, act)) return CI_ERR;
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
  if (s->layer_scalar) be->ops->scale(be, act->x, L->layer_scalar[0], hn);
  return CI_OK;
}

/* Per-layer inputs of the n tokens (docs/models.md §5.7): ((h0 @ W^T)·hidden^-0.5 normed over P +
 * E_ple[ids]·sqrt(P)) · 2^-0.5, laid out [n, N, P]. */
static int per_layer_inputs(ci_model *m, const step_rows *sr, const int32_t *ids, int n,
                            activations *act) {
  ci_backend *be = m->be;
  const ci_model_spec *s = &m->spec;
  const int64_t width = (int64_t)s->n_layers * s->ple_dim;
  for (int i = 0; i < n; i++)
    if (ids[i] >= s->ple_vocab)
      return ci_fail("token id %d is outside the per-layer input table (%d rows)", ids[i],
                     s->ple_vocab);
  if (be->ops->embed(be, &m->ple_embed, ids, n, act->ple_tmp)) return CI_ERR;
  be->ops->scale(be, act->ple_tmp, s->ple_embed_scale, (int64_t)n * width);
  if (matmul(be, sr, &m->ple_model_proj, act->x, n, act->ple)) return CI_ERR;
  be->ops->scale(be, act->ple, 1.0f / sqrtf((float)s->hidden), (int64_t)n * width);
  norm(m, act->ple, act->ple, m->ple_norm, (int64_t)n * s->n_layers, s->ple_dim);
  be->ops->add(be, act->ple, act->ple_tmp, (int64_t)n * width);
  be->ops->scale(be, act->ple, (float)M_SQRT1_2, (int64_t)n * width);
  return CI_OK;
}

/* One step of n tokens (already validated) of the step's sequences through every layer; the
 * logits of the last n_logit_rows rows. */
static int forward_step(ci_model *m, const step_rows *sr, const int32_t *ids, int n, float *logits,
                        int n_logit_rows) {
  const ci_model_spec *s = &m->spec;
  for (int i = 0; i < sr->n_seqs; i++)
    if (ci_kv_seq_reserve(sr->seqs[i], sr->rows[i])) return CI_ERR;

  activations act = {0};
  if (activations_alloc(m, n, &act)) return CI_ERR;
  for (int i = 0; i < sr->n_seqs; i++)
    for (int r = 0; r < sr->rows[i]; r++) act.pos[sr->first[i] + r] = (int32_t)(sr->seqs[i]->n + r);
  ci_backend *be = m->be;
  int status = be->ops->embed(be, &m->embed, ids, n, act.x);
  if (status == CI_OK && s->embed_scale != 0.0f)
    be->ops->scale(be, act.x, s->embed_scale, (int64_t)n * s->hidden);
  if (status == CI_OK && s->ple_dim > 0) status = per_layer_inputs(m, sr, ids, n, &act);
  for (int li = 0; li < s->n_layers && status == CI_OK; li++)
    status = layer_forward(m, sr, li, n, &act);
  for (int i = 0; i < sr->n_seqs && status == CI_OK; i++)
    status = ci_kv_seq_commit(sr->seqs[i], sr->rows[i]);
  if (status == CI_OK && logits) {
    const float *last = act.x + (int64_t)(n - n_logit_rows) * s->hidden;
    norm(m, act.a, last, m->final_norm, n_logit_rows, s->hidden);
    status = matmul(be, sr, &m->head, act.a, n_logit_rows, logits);
    if (status == CI_OK && s->final_softcap != 0.0f)
      be->ops->softcap(be, logits, s->final_softcap, (int64_t)n_logit_rows * s->vocab);
  }
  activations_free(be, &act);
  return status;
}

/* A step of one sequence's n tokens. */
static int forward_one(ci_model *m, ci_kv_seq *seq, const int32_t *ids, int n, float *logits,
                       int n_logit_rows) {
  const int first = 0;
  const step_rows sr = {.n_seqs = 1, .seqs = &seq, .first = &first, .rows = &n};
  return forward_step(m, &sr, ids, n, logits, n_logit_rows);
}

int ci_model_forward(ci_model *m, ci_kv_seq *seq, const int32_t *ids, int n, float *logits,
                     int n_logit_rows) {
  const ci_model_spec *s = &m->spec;
  if (n < 1) return ci_fail("forward: no tokens");
  if (logits && (n_logit_rows < 1 || n_logit_rows > n))
    return ci_fail("forward: %d logit rows requested for %d tokens", n_logit_rows, n);
  for (int i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= s->vocab)
      return ci_fail("token id %d at index %d is out of range [0, %d)", ids[i], i, s->vocab);
  if (seq->n + n > (int64_t)INT32_MAX) return ci_fail("forward: sequence too long");
  /* A pending KV conversion caps the step so that it happens exactly at its start
   * (docs/kv-cache.md §5). */
  const int64_t limit = ci_kv_seq_chunk_limit(seq);
  if ((int64_t)n <= limit) return forward_one(m, seq, ids, n, logits, n_logit_rows);
  const int head = (int)limit, tail = n - head;
  const int tail_rows = logits ? (n_logit_rows < tail ? n_logit_rows : tail) : 0;
  const int head_rows = logits ? n_logit_rows - tail_rows : 0;
  if (forward_one(m, seq, ids, head, head_rows ? logits : NULL, head_rows)) return CI_ERR;
  return ci_model_forward(m, seq, ids + head, tail,
                          logits ? logits + (int64_t)head_rows * s->vocab : NULL, tail_rows);
}

int ci_model_forward_decode_batch(ci_model *m, ci_kv_seq *const *seqs, const int32_t *ids, int n,
                                  float *logits) {
  const ci_model_spec *s = &m->spec;
  if (n < 1) return ci_fail("forward: no sequences");
  if (n == 1) return ci_model_forward(m, seqs[0], ids, 1, logits, logits ? 1 : 0);
  for (int i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= s->vocab)
      return ci_fail("token id %d at index %d is out of range [0, %d)", ids[i], i, s->vocab);
    if (seqs[i]->n + 1 > (int64_t)INT32_MAX) return ci_fail("forward: sequence too long");
    for (int j = 0; j < i; j++)
      if (seqs[j] == seqs[i]) return ci_fail("forward: a sequence appears twice in a batch");
  }
  int *first = malloc((size_t)n * sizeof *first), *rows = malloc((size_t)n * sizeof *rows);
  if (!first || !rows) {
    free(first);
    free(rows);
    return ci_fail("forward: out of memory");
  }
  for (int i = 0; i < n; i++) {
    first[i] = i;
    rows[i] = 1; /* a pending conversion still allows one token (docs/kv-cache.md §5: start > n) */
  }
  const step_rows sr = {
      .n_seqs = n, .seqs = seqs, .first = first, .rows = rows, .row_invariant = 1};
  const int status = forward_step(m, &sr, ids, n, logits, logits ? n : 0);
  free(first);
  free(rows);
  return status;
}
