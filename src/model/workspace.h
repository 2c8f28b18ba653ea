/* The workspace of a model's steps: every activation and bookkeeping buffer a step needs, sized
 * once for the largest step it will run and reused by every step after, so that a step in the
 * steady state allocates nothing (the forward pass in forward.c reads it top to bottom). */
#ifndef CI_MODEL_WORKSPACE_H
#define CI_MODEL_WORKSPACE_H

#include "model/spec.h"
#include "tensor/backend.h"

#include <stdint.h>

typedef struct ci_workspace {
  ci_backend *be;      /* not owned */
  int max_rows;        /* rows of a step (tokens over every sequence) */
  int max_seqs;        /* sequences of a step */
  int64_t allocations; /* buffer (re)allocations so far */
  /* Activations, backend memory. */
  float *x;          /* (rows, hidden) residual stream */
  float *a;          /* (rows, hidden) normed input of a block */
  float *q;          /* (rows, Hq * D) */
  float *k;          /* (rows, Hkv * D) */
  float *v;          /* (rows, Hkv * D) */
  float *att;        /* (rows, Hq * D) attention output */
  float *proj;       /* (rows, hidden) o_proj / down_proj output */
  float *gate;       /* (rows, I) */
  float *up;         /* (rows, I) */
  float *ple;        /* (rows, N, P) per-layer inputs; NULL without PLE */
  float *ple_tmp;    /* (rows, N * P) */
  float *moe_scores; /* (rows, E) router scores; NULL without MoE */
  float *moe_out;    /* (rows, hidden) weighted expert sum */
  float *moe_in;     /* (rows, hidden) gathered rows of one expert */
  float *moe_y;      /* (rows, hidden) one expert's output rows */
  float *qg;         /* (rows, Hq * D) output gate of gated attention; NULL without */
  float *dn_qkv;     /* (rows, C) DeltaNet in_proj_qkv output; NULL without DeltaNet layers */
  float *dn_z;       /* (rows, Hv * Dv) */
  float *dn_b;       /* (rows, Hv) */
  float *dn_a;       /* (rows, Hv) */
  float *dn_out;     /* (rows, Hv * Dv) */
  /* The step's description, host memory. */
  int32_t *desc;      /* (2 rows) the step descriptor in backend memory: ids, positions */
  int32_t *desc_host; /* (2 rows) its host copy, written by the step */
  int32_t *ids;       /* (rows) token of each row: inside desc */
  int32_t *pos;       /* (rows) position of each row: inside desc */
  float *logits;      /* (logit_capacity) logits in backend memory where it is not host memory */
  int64_t logit_capacity;
  float *tp_logits; /* (tp_logit_capacity) a split model's own vocabulary columns of the logits */
  int64_t tp_logit_capacity;
  ci_row_pick *picks; /* (pick_capacity) row picks in backend memory where it is not host memory */
  int64_t pick_capacity;
  int32_t *seq_first;              /* (seqs) first row of each sequence */
  int32_t *seq_rows;               /* (seqs) rows of each sequence */
  int32_t *logit_rows;             /* (rows) the rows whose logits the step returns, in order */
  int32_t *logit_seg;              /* (seqs) logit rows of each sequence */
  ci_paged_kv *views;              /* (seqs) one layer's KV view of each sequence */
  const struct ci_lora **seq_lora; /* (seqs) each sequence's adapter (NULL: none) */
  /* MoE scheduling, host memory. */
  int32_t *route_ids;  /* (rows, k) */
  float *route_w;      /* (rows, k) */
  int32_t *rows;       /* (rows) token rows of one expert */
  float *row_w;        /* (rows) their weights */
  int32_t *expert_seg; /* (seqs) rows of one expert from each sequence */
  /* LoRA scratch (ci_workspace_fit_lora; NULL until a step runs an adapter): one adapter's rows
   * of a step gathered, their low-rank product, and where it goes back. */
  float *lora_x;         /* (lora_rows, lora_width) gathered inputs, backend memory */
  float *lora_t;         /* (lora_rows, lora_rank) x Aᵀ */
  float *lora_y;         /* (lora_rows, lora_width) t Bᵀ */
  int32_t *lora_row_ids; /* (lora_rows) step row of each gathered row, host memory */
  float *lora_w;         /* (lora_rows) the adapter's scale, once per gathered row */
  int32_t *lora_seg;     /* (lora_seqs) gathered rows of each sequence */
  int lora_rows, lora_seqs, lora_rank;
  int64_t lora_width;
  /* Hybrid models, host memory. */
  int32_t *head_rows; /* (2 rows Hq) D-wide rows of the gated q_proj output: queries, then gates */
  float **dn_states;  /* (seqs) each sequence's state of one DeltaNet layer */
  float **dn_checkpoints; /* (seqs) where a sequence in a speculative round keeps it per row */
} ci_workspace;

/* An empty workspace for `spec` on `be` (no buffers yet). NULL with ci_last_error. */
ci_workspace *ci_workspace_create(ci_backend *be);

/* Makes the workspace hold steps of up to max_rows rows over max_seqs sequences of a model of
 * `spec`, (re)allocating only when it is smaller, and reserves the backend's scratch for such
 * steps. Returns CI_OK or CI_ERR. */
int ci_workspace_fit(ci_workspace *ws, const ci_model_spec *spec, int max_rows, int max_seqs);

/* Bytes of the buffers ci_workspace_fit allocates for steps of max_rows rows over max_seqs
 * sequences of a model of `spec` (the backend's scratch and the logits not included): what a
 * memory estimate adds for the activations. */
int64_t ci_workspace_bytes(const ci_model_spec *spec, int max_rows, int max_seqs);

/* A backend buffer of at least n logits (grown when smaller), for backends whose memory the host
 * cannot read. NULL with ci_last_error. */
float *ci_workspace_logits(ci_workspace *ws, int64_t n);
/* The same for n logits of a tensor-parallel rank's vocabulary share (before the gather). */
float *ci_workspace_tp_logits(ci_workspace *ws, int64_t n);
/* The same for n row picks. */
ci_row_pick *ci_workspace_picks(ci_workspace *ws, int64_t n);

/* Makes the LoRA scratch hold steps of max_rows rows over max_seqs sequences with adapters of
 * rank <= max_rank on layers at most max_width wide (grown only). Returns CI_OK or CI_ERR. */
int ci_workspace_fit_lora(ci_workspace *ws, int max_rows, int max_seqs, int max_rank,
                          int64_t max_width);

/* Frees every buffer and the workspace. NULL is a no-op. */
void ci_workspace_free(ci_workspace *ws);

#endif
