/* A loaded model: its spec, its weight files and the tensors of every layer, bound to a
 * backend. The forward pass (forward.c) reads it top to bottom. */
#ifndef CI_MODEL_MODEL_H
#define CI_MODEL_MODEL_H

#include "base/rank_collective.h"
#include "io/safetensors.h"
#include "kv/cache.h"
#include "model/spec.h"
#include "model/workspace.h"
#include "tensor/backend.h"

/* Tensors of one transformer layer. Linear weights are [out, in] in their stored format;
 * vectors (norm weights, biases) are owned f32 copies in backend memory, NULL when the model has
 * none. */
typedef struct {
  float *attn_norm;       /* (hidden) input_layernorm */
  ci_tensor wq;           /* (Hq*D, hidden) */
  ci_tensor wk;           /* (Hkv*D, hidden) */
  ci_tensor wv;           /* (Hkv*D, hidden) */
  ci_tensor wo;           /* (hidden, Hq*D) */
  float *bq, *bk, *bv;    /* (Hq*D), (Hkv*D), (Hkv*D) */
  float *bo;              /* (hidden) */
  float *q_norm, *k_norm; /* (D) */
  float *attn_post_norm;  /* (hidden) sandwich: norm of the attention output */
  float *mlp_norm;        /* (hidden) pre-MLP norm (Llama post_attention_layernorm) */
  float *mlp_post_norm;   /* (hidden) sandwich: norm of the feed-forward output */
  ci_tensor w_gate;       /* (I, hidden) */
  ci_tensor w_up;         /* (I, hidden) */
  ci_tensor w_down;       /* (hidden, I) */
  float *b_gate, *b_up, *b_down;
  /* MoE block (Gemma 4): dense-branch post norm, router and a stack of experts. */
  float *mlp_post_norm_1;    /* (hidden) */
  float *moe_norm;           /* (hidden) pre_feedforward_layernorm_2 */
  float *moe_post_norm;      /* (hidden) post_feedforward_layernorm_2 */
  ci_tensor router;          /* (E, hidden) */
  float *router_scale;       /* (hidden) */
  float *expert_scale;       /* (E) */
  ci_tensor experts_gate_up; /* (E, 2 I_moe, hidden): gate rows then up rows */
  ci_tensor experts_down;    /* (E, hidden, I_moe) */
  /* Per-layer inputs (Gemma 4). */
  ci_tensor ple_gate;   /* (P, hidden) */
  ci_tensor ple_proj;   /* (hidden, P) */
  float *ple_post_norm; /* (hidden) */
  float *layer_scalar;  /* (1) */
  float layer_scale;    /* its value, read once at load */
  /* Gated DeltaNet mixer (Qwen3.5 linear-attention layers; C = 2 Hk Dk + Hv Dv). */
  ci_tensor dn_in_qkv;          /* (C, hidden) */
  ci_tensor dn_in_z;            /* (Hv Dv, hidden) */
  ci_tensor dn_in_b;            /* (Hv, hidden) */
  ci_tensor dn_in_a;            /* (Hv, hidden) */
  ci_tensor dn_out;             /* (hidden, Hv Dv) */
  float *dn_conv;               /* (C, Kc) depthwise convolution, f32 */
  float *dn_dt_bias, *dn_a_log; /* (Hv) */
  float *dn_norm;               /* (Dv) plain RMSNorm weight of the output */
} ci_layer_weights;

/* A model's part of a tensor-parallel group (model/tensor_parallel.h): rank `rank` of `world`
 * holds whole query and KV heads [rank * H / world, (rank + 1) * H / world) of every layer, the
 * same share of the MLP's intermediate units, and the head's vocabulary rows
 * [vocab_first, vocab_first + head.shape[0]); norms, embeddings and the o/down biases are whole
 * on every rank. A whole model is rank 0 of 1. */
typedef struct {
  int rank, world;
  ci_rank_collective *comm; /* not owned; NULL when whole */
  int64_t vocab_first;
  ci_tensor embed_host; /* tied models while loading: the embedding before prepare_weight */
  void **owned;         /* [n_owned] owned host copies of column slices */
  int n_owned, owned_capacity;
} ci_tp_shard;

typedef struct ci_model {
  ci_model_spec spec;
  ci_backend *be;                  /* not owned */
  ci_weights *files;               /* owned: the mmap'd safetensors */
  ci_tensor embed;                 /* (V, hidden) */
  ci_tensor head;                  /* (V, hidden); the embedding itself when tied */
  float *final_norm;               /* (hidden) */
  ci_tensor ple_embed;             /* (V_ple, N * P) per-layer input table (Gemma 4) */
  ci_tensor ple_model_proj;        /* (N * P, hidden) */
  float *ple_norm;                 /* (P) */
  ci_layer_weights *layers;        /* [n_layers] */
  ci_rope ropes[CI_MAX_ROPES];     /* spec.ropes with their frequencies in backend memory */
  float *rope_freqs[CI_MAX_ROPES]; /* owned: (rot_dim / 2) each */
  ci_kv_format *kv_config; /* [n_cache_layers] per-layer KV plan from kv_config.json, or NULL */
  ci_workspace *workspace; /* owned: the workspace of ci_model_forward (created on first use) */
  uint64_t identity[2];    /* config + weights fingerprint (model/identity.h): persisted KV is
                              only reused by the model that wrote it */
  int conv_layout_seen;    /* a DeltaNet convolution has set the norm offset (loading) */
  ci_tp_shard shard;       /* rank 0 of 1 unless loaded by ci_model_load_tp */
  struct ci_tp_group *tp;  /* owned: rank 0 of a group drives the other ranks; NULL otherwise */
} ci_model;

/* Loads a model folder (config.json + safetensors) for backend `be`. Validates every tensor
 * against the config; a missing, misshapen or unused tensor is an error naming it. Returns NULL
 * with ci_last_error on failure. */
ci_model *ci_model_load(const char *model_dir, ci_backend *be);

/* As ci_model_load with the weight files held in `memory` (io/safetensors.h):
 * CI_WEIGHTS_HUGE_PAGES suits a CPU backend, which reads the weights in place every token;
 * ci_model_load maps them. */
ci_model *ci_model_load_in(const char *model_dir, ci_backend *be, ci_weights_memory memory);

/* Frees the model (not the backend). NULL is a no-op. */
void ci_model_free(ci_model *model);

/* KV heads the model's KV cache stores for a layer: its own, or one per rank where the ranks of a
 * tensor-parallel model share heads (model/tensor_parallel.h). */
int ci_model_kv_heads_stored(const ci_model *model, const ci_layer_spec *layer);

/* Bytes of weights one decode step reads (every matrix once, the embedding row excluded). */
int64_t ci_model_weight_bytes_per_token(const ci_model *model);

/* A KV cache laid out for this model's cache-owning layers (KV sharers own none), storing every
 * layer in `codec`. Cache layer i is model layer i. arena_bytes: see ci_kv_cache_create. */
ci_kv_cache *ci_model_kv_cache_create(const ci_model *model, ci_kv_codec codec, int block_tokens,
                                      int64_t arena_bytes);

/* As ci_model_kv_cache_create, with each of the first and last `protect` cache layers in a group
 * of its own, so that plans can keep up to that many layers at each end in the base format
 * (docs/kv-cache.md §7, `--kv-protect`). */
ci_kv_cache *ci_model_kv_cache_create_protected(const ci_model *model, ci_kv_codec codec,
                                                int block_tokens, int64_t arena_bytes, int protect);

/* Gives an empty sequence the model's kv_config.json plan (start 0), if the folder has one.
 * Returns CI_OK (also when there is none) or CI_ERR. */
int ci_model_kv_seq_apply_config(const ci_model *model, ci_kv_seq *seq);

/* One sequence's part of a step: n_rows tokens appended at its positions seq->n, seq->n + 1, ...
 * (a prefill chunk, or one decode token), and how many of the last rows return logits. */
typedef struct {
  ci_kv_seq *seq;
  const int32_t *ids;         /* [n_rows] */
  int n_rows;                 /* >= 1, at most ci_kv_seq_chunk_limit(seq) */
  int n_logit_rows;           /* 0 .. n_rows */
  const struct ci_lora *lora; /* the sequence's LoRA adapter (model/lora.h), NULL: none */
} ci_step_seq;

/* Runs one step: the rows of every sequence in seqs[0..n_seqs) go through the model together
 * (each matmul reads its weights once for all rows), their K/V are written to their sequences,
 * which advance, and `logits` (may be NULL) receives [sum of n_logit_rows, vocab] f32 logits,
 * sequence by sequence. Each sequence's rows are bit-identical to a step of that sequence alone
 * with the same rows (batch invariance). Uses `ws`, grown when the step is larger than any
 * before. Returns CI_OK, or CI_ERR (bad id, a sequence twice, rows crossing a pending KV
 * conversion, KV exhausted): after a failure past validation the step's sequences are in no
 * defined state and must be dropped. */
int ci_model_step(ci_model *model, ci_workspace *ws, const ci_step_seq *seqs, int n_seqs,
                  float *logits);

/* ci_model_step that also (or only: logits NULL) returns each logit row's greedy pick
 * (tensor/backend.h's ci_row_pick) in picks [sum of n_logit_rows], computed where the logits are:
 * on a GPU a step that needs no whole row downloads 8 bytes per row instead of 4 * vocab. */
int ci_model_step_picks(ci_model *model, ci_workspace *ws, const ci_step_seq *seqs, int n_seqs,
                        float *logits, ci_row_pick *picks);

/* ci_model_step giving, instead of logits, the final-normed hidden states (the LM head's input) of
 * each sequence's last n_logit_rows rows into hidden ([sum of n_logit_rows, hidden] f32), for
 * embeddings. The same operations as ci_model_step up to the head, so batch invariant too. */
int ci_model_step_hidden(ci_model *model, ci_workspace *ws, const ci_step_seq *seqs, int n_seqs,
                         float *hidden);

/* Forward pass of n tokens `ids` of one sequence at positions seq->n .. seq->n+n-1: writes
 * their K/V into the sequence and advances it. When logits is non-NULL it receives
 * [n_logit_rows, vocab] f32 logits for the last n_logit_rows positions (1 <= n_logit_rows <= n).
 * Returns CI_OK or CI_ERR (bad id, KV exhausted). */
int ci_model_forward(ci_model *model, ci_kv_seq *seq, const int32_t *ids, int n, float *logits,
                     int n_logit_rows);

/* ci_model_forward with the LoRA adapter `lora` (NULL: none) applied. */
int ci_model_forward_lora(ci_model *model, ci_kv_seq *seq, const struct ci_lora *lora,
                          const int32_t *ids, int n, float *logits, int n_logit_rows);

/* One decode step of n sequences at once (ci_model_step with one row each): sequence i appends
 * ids[i] and, when logits is non-NULL, gets its next-token logits in row i of logits [n, vocab].
 * Returns CI_OK, or CI_ERR as ci_model_step. */
int ci_model_forward_decode_batch(ci_model *model, ci_kv_seq *const *seqs, const int32_t *ids,
                                  int n, float *logits);

/* ci_model_forward_decode_batch that also (or only: logits NULL) gives each sequence's greedy
 * pick in picks[i] (ci_model_step_picks). */
int ci_model_forward_decode_batch_picks(ci_model *model, ci_kv_seq *const *seqs, const int32_t *ids,
                                        int n, float *logits, ci_row_pick *picks);

#endif
