/* Tensor parallelism (Megatron-style) inside one process: a model split over `world` ranks, one
 * backend and one host thread each. q|k|v and gate|up are split by output rows (whole heads, an
 * equal share of the intermediate units), o_proj and down by input columns followed by a sum
 * all-reduce, the head by vocabulary rows followed by a gather of the logit columns into rank 0;
 * embeddings and norms are whole on every rank. Each rank reads and writes its own KV heads.
 *
 * The ranks exchange partial sums through their backends' collective ops (all_reduce,
 * gather_cols: tensor/backend.h), meeting at the host barriers of base/rank_collective.h; every
 * rank runs the same kind of backend. The KV cache is one cache whose blocks have storage on every
 * rank (kv/cache.h ci_kv_cache_set_ranks): the same block ids and tables, each rank's KV heads (a
 * KV head that several ranks share copied to each) in memory of its own backend, so copy-on-write,
 * codec conversion and the prefix cache act on every rank's storage at once.
 *
 * The group is driven through rank 0's ci_model: ci_model_step and every call built on it run
 * each step on all ranks (rank 0 on the calling thread) and return rank 0's outputs. Sums are
 * taken in rank order for every element, so a sequence's logits stay independent of its batch. */
#ifndef CI_MODEL_TENSOR_PARALLEL_H
#define CI_MODEL_TENSOR_PARALLEL_H

#include "model/manifest.h"
#include "model/model.h"

/* Checks that a model of `spec` can be split over `world` ranks (1 .. CI_MAX_RANKS): dense
 * attention layers whose query heads, KV heads and intermediate units divide evenly. Returns
 * CI_OK or CI_ERR naming the first obstacle. */
int ci_tp_check_spec(const ci_model_spec *spec, int world);

/* Loads model_dir split over backends[0 .. world). The returned model is rank 0: it owns the
 * other ranks and backends[1 .. world) (destroyed with it; also on failure), while backends[0]
 * stays the caller's as with ci_model_load. world 1 is ci_model_load_in. NULL with
 * ci_last_error on failure. */
ci_model *ci_model_load_tp(const char *model_dir, ci_backend *const *backends, int world,
                           ci_weights_memory memory);

/* KV heads of a layer with n_kv_heads that each of `world` ranks attends with (a share, or one
 * head that several ranks share), and that the KV cache stores for all ranks together (each
 * rank's copy of a shared head is stored apart, so that each rank writes only its own). */
int ci_tp_kv_heads_here(int n_kv_heads, int world);
int ci_tp_kv_heads_stored(int n_kv_heads, int world);

/* Gives a KV cache made for rank 0's heads storage on every rank of m's group
 * (ci_kv_cache_set_ranks). Returns CI_OK or CI_ERR. */
int ci_tp_kv_cache_split(const ci_model *m, ci_kv_cache *cache);

/* The backend of rank `rank` of m's group (m's own for rank 0 or a whole model). */
ci_backend *ci_tp_rank_backend(const ci_model *m, int rank);

/* Ranks the model is split over (1 when whole). */
int ci_model_tensor_parallel(const ci_model *model);

/* ---- Used by the loader and the forward pass ---- */

/* Loads rank `rank` of `world` of model_dir on `be`, its collective `comm` (ci_model_load_in for
 * world 1). */
ci_model *ci_model_load_shard(const char *model_dir, ci_backend *be, ci_weights_memory memory,
                              int rank, int world, ci_rank_collective *comm);

/* Cuts a bound matrix of manifest entry `e` to this rank's share (a view for row shares, an
 * owned copy for column shares); whole matrices are left alone. Returns CI_OK or CI_ERR. */
int ci_tp_shard_matrix(ci_model *m, const ci_manifest_entry *e, ci_tensor *t);

/* The rows [*first, *first + *count) of bias entry `e` this rank keeps (all of them for biases
 * added after a reduction). */
void ci_tp_bias_range(const ci_model *m, const ci_manifest_entry *e, int64_t *first,
                      int64_t *count);

/* The head of a tied model: this rank's vocabulary rows of the embedding as loaded. */
int ci_tp_tied_head(ci_model *m);

/* Runs a step on every rank of rank 0's group (ci_model_step_picks / _hidden semantics). */
int ci_tp_step(ci_model *m, ci_workspace *ws, const ci_step_seq *seqs, int n_seqs, float *logits,
               ci_row_pick *picks, float *hidden);

/* Frees a group (stops its threads, frees ranks 1.. and their backends). NULL is a no-op. */
void ci_tp_group_free(struct ci_tp_group *group);

/* Frees a shard's owned host copies. */
void ci_tp_shard_release(ci_tp_shard *shard);

/* ---- One rank's part of a step (forward.c) ---- */

/* What a rank's step does besides the layers. */
typedef struct {
  int own_kv; /* reserve the sequences' KV before and commit it after (a whole model) */
  int want;   /* the rows of n_logit_rows are selected (some output is wanted) */
  int head;   /* the head runs on them (logits or picks are wanted) */
} ci_step_role;

/* Checks a step and reserves its sequences' KV (what own_kv does), for a driver that runs the
 * ranks with own_kv 0. */
int ci_model_step_admit(ci_model *m, const ci_step_seq *seqs, int n_seqs);

/* One rank's step; outputs (logits, picks, hidden) only on rank 0. */
int ci_model_step_run(ci_model *m, ci_workspace *ws, const ci_step_seq *seqs, int n_seqs,
                      float *logits, ci_row_pick *picks, float *hidden, const ci_step_role *role);

#endif
