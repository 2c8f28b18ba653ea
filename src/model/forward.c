/* Forward pass of the decoder-only transformer families (Llama, Mistral, Qwen2, Qwen3) over one
 * sequence, written once against the backend op table (model.md §5.1-5.3). */
#include "base/error.h"
#include "model/model.h"

#include <math.h>
#include <stdlib.h>

/* Activation buffers of one forward call of n tokens (backend memory). */
typedef struct {
  float *x;     /* (n, hidden) residual stream */
  float *a;     /* (n, hidden) normed input of a block */
  float *q;     /* (n, Hq * D) */
  float *k;     /* (n, Hkv * D) */
  float *v;     /* (n, Hkv * D) */
  float *att;   /* (n, Hq * D) attention output */
  float *proj;  /* (n, hidden) o_proj / down_proj output */
  float *gate;  /* (n, I) */
  float *up;    /* (n, I) */
  int32_t *pos; /* (n) */
} activations;

static void activations_free(ci_backend *be, activations *act) {
  void *bufs[] = {act->x,   act->a,    act->q,    act->k,  act->v,
                  act->att, act->proj, act->gate, act->up, act->pos};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (bufs[i]) be->ops->release(be, bufs[i]);
}

static int activations_alloc(const ci_model *m, int n, activations *act) {
  const ci_model_spec *s = &m->spec;
  int64_t q_dim = 0, kv_dim = 0;
  for (int i = 0; i < s->n_layers; i++) {
    int64_t qd = (int64_t)s->n_heads * s->layers[i].head_dim;
    int64_t kd = (int64_t)s->layers[i].n_kv_heads * s->layers[i].head_dim;
    if (qd > q_dim) q_dim = qd;
    if (kd > kv_dim) kv_dim = kd;
  }
  ci_backend *be = m->be;
  const size_t f = sizeof(float);
  act->x = be->ops->alloc(be, (size_t)n * s->hidden * f);
  act->a = be->ops->alloc(be, (size_t)n * s->hidden * f);
  act->q = be->ops->alloc(be, (size_t)n * q_dim * f);
  act->k = be->ops->alloc(be, (size_t)n * kv_dim * f);
  act->v = be->ops->alloc(be, (size_t)n * kv_dim * f);
  act->att = be->ops->alloc(be, (size_t)n * q_dim * f);
  act->proj = be->ops->alloc(be, (size_t)n * s->hidden * f);
  act->gate = be->ops->alloc(be, (size_t)n * s->intermediate * f);
  act->up = be->ops->alloc(be, (size_t)n * s->intermediate * f);
  act->pos = be->ops->alloc(be, (size_t)n * sizeof(int32_t));
  if (!act->x || !act->a || !act->q || !act->k || !act->v || !act->att || !act->proj ||
      !act->gate || !act->up || !act->pos) {
    activations_free(be, act);
    return ci_fail("out of memory for activations of %d tokens", n);
  }
  return CI_OK;
}

/* y = x @ W^T (+ b). */
static int linear(ci_backend *be, const ci_tensor *w, const float *bias, const float *x, int n,
                  float *y) {
  if (be->ops->matmul(be, w, x, n, y)) return CI_ERR;
  if (bias) be->ops->add_bias(be, y, bias, n, w->shape[0]);
  return CI_OK;
}

/* One layer: x += Attn(RMSNorm(x)); x += MLP(RMSNorm(x)). */
static int layer_forward(ci_model *m, ci_kv_seq *seq, int li, int n, activations *act) {
  ci_backend *be = m->be;
  const ci_model_spec *s = &m->spec;
  const ci_layer_spec *ls = &s->layers[li];
  const ci_layer_weights *L = &m->layers[li];
  const int D = ls->head_dim, Hq = s->n_heads, Hkv = ls->n_kv_heads;
  const ci_rope *rope = &s->ropes[ls->rope_index].rope;

  be->ops->rmsnorm(be, act->a, act->x, L->attn_norm, n, s->hidden, s->norm_eps,
                   s->norm_weight_offset);
  if (linear(be, &L->wq, L->bq, act->a, n, act->q) ||
      linear(be, &L->wk, L->bk, act->a, n, act->k) || linear(be, &L->wv, L->bv, act->a, n, act->v))
    return CI_ERR;
  if (s->qk_norm) {
    be->ops->rmsnorm(be, act->q, act->q, L->q_norm, (int64_t)n * Hq, D, s->norm_eps,
                     s->norm_weight_offset);
    be->ops->rmsnorm(be, act->k, act->k, L->k_norm, (int64_t)n * Hkv, D, s->norm_eps,
                     s->norm_weight_offset);
  }
  be->ops->rope(be, act->q, n, Hq, act->pos, rope);
  be->ops->rope(be, act->k, n, Hkv, act->pos, rope);

  ci_paged_kv kv = ci_kv_seq_view(seq, li);
  if (be->ops->kv_store(be, &kv, act->k, act->v, act->pos, n)) return CI_ERR;
  ci_attention_args args = {.q = act->q,
                            .out = act->att,
                            .pos = act->pos,
                            .n_rows = n,
                            .n_heads = Hq,
                            .scale = 1.0f / sqrtf((float)D),
                            .softcap = 0.0f,
                            .window = ls->kind == CI_ATTN_SLIDING ? ls->window : 0,
                            .kv = &kv};
  if (be->ops->attention(be, &args)) return CI_ERR;
  if (linear(be, &L->wo, L->bo, act->att, n, act->proj)) return CI_ERR;
  be->ops->add(be, act->x, act->proj, (int64_t)n * s->hidden);

  be->ops->rmsnorm(be, act->a, act->x, L->mlp_norm, n, s->hidden, s->norm_eps,
                   s->norm_weight_offset);
  if (linear(be, &L->w_gate, L->b_gate, act->a, n, act->gate) ||
      linear(be, &L->w_up, L->b_up, act->a, n, act->up))
    return CI_ERR;
  be->ops->silu_mul(be, act->gate, act->up, (int64_t)n * s->intermediate);
  if (linear(be, &L->w_down, L->b_down, act->gate, n, act->proj)) return CI_ERR;
  be->ops->add(be, act->x, act->proj, (int64_t)n * s->hidden);
  return CI_OK;
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
  if (ci_kv_seq_reserve(seq, n)) return CI_ERR;

  activations act = {0};
  if (activations_alloc(m, n, &act)) return CI_ERR;
  int status = CI_OK;
  for (int i = 0; i < n; i++) act.pos[i] = (int32_t)(seq->n + i);
  ci_backend *be = m->be;
  status = be->ops->embed(be, &m->embed, ids, n, act.x);
  for (int li = 0; li < s->n_layers && status == CI_OK; li++)
    status = layer_forward(m, seq, li, n, &act);
  if (status == CI_OK) ci_kv_seq_commit(seq, n);
  if (status == CI_OK && logits) {
    const float *last = act.x + (int64_t)(n - n_logit_rows) * s->hidden;
    be->ops->rmsnorm(be, act.a, last, m->final_norm, n_logit_rows, s->hidden, s->norm_eps,
                     s->norm_weight_offset);
    status = be->ops->matmul(be, &m->head, act.a, n_logit_rows, logits);
  }
  activations_free(be, &act);
  return status;
}
