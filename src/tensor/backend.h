/* Backend op interface: the operations a model forward pass and the KV cache need, implemented
 * once per device (cpu now, cuda later). Activation buffers are backend memory obtained from
 * alloc(); on the CPU they are f32 arrays. The backend knows nothing about models. */
#ifndef CI_TENSOR_BACKEND_H
#define CI_TENSOR_BACKEND_H

#include "base/rank_collective.h"
#include "tensor/kv_format.h"
#include "tensor/tensor.h"

#include <stddef.h>
#include <stdint.h>

/* ==== Steps ==== */

/* One copy of step output from backend memory to the host at step end. */
typedef struct {
  void *host;
  const void *device;
  size_t bytes;
} ci_download;

/* The greedy pick of a logits row: the lowest id holding the row's largest logit (NaN never
 * wins), and that token's log-probability, logit - log(sum_t e^logit_t) with NaN logits left
 * out of the sum (0 when the largest logit is +inf). token is -1 when every logit is -inf or NaN.
 * A step that returns picks instead of whole rows downloads 8 bytes per row, not 4 * vocab. */
typedef struct {
  int32_t token;
  float logprob;
} ci_row_pick;

/* ==== Rotary position embedding ==== */

/* A RoPE table for one layer type. Pairs are (j, j + rot_dim/2) for j < rot_dim/2 (split-half)
 * or (2j, 2j+1) when traditional; dims >= rot_dim pass through. inv_freq[j] = 0 leaves pair j
 * unrotated (Gemma 4 proportional RoPE). */
typedef struct {
  int head_dim;
  int rot_dim;           /* even, <= head_dim */
  int traditional;       /* 1: interleaved pairs */
  const float *inv_freq; /* [rot_dim/2] */
  float qk_scale;        /* multiplies q and k after rotation (YaRN/longrope); 1 otherwise */
} ci_rope;

/* ==== Paged KV ==== */

/* One layer's KV of one sequence, as attention and kv_store see it. Position p lives in pool
 * block block_table[p / block_tokens] at slot p % block_tokens; a released block is -1. Block b
 * is in slab slabs[b / blocks_per_slab] at (b % blocks_per_slab) * block_stride; within it this
 * layer's K block, [n_kv_heads][block_tokens] rows of k_row_bytes, starts at k_offset and its V
 * block at v_offset. */
typedef struct {
  ci_kv_format format;
  int block_tokens;
  int n_kv_heads;
  int head_dim;
  const int32_t *block_table;
  int64_t n_table_entries;
  uint8_t *const *slabs;
  int32_t blocks_per_slab;
  size_t block_stride;             /* one block over every layer of its pool */
  size_t k_offset, v_offset;       /* this layer's K and V blocks inside a block */
  size_t k_row_bytes, v_row_bytes; /* one stored row of one head */
  const float *signs;              /* [head_dim] TurboQuant sign vector of this cache layer */
} ci_paged_kv;

/* Address of row `slot` of kv head `head` in block `block` (K: value 0, V: value 1). */
static inline uint8_t *ci_kv_block_row(const ci_paged_kv *kv, int value, int32_t block,
                                       int64_t slot, int head) {
  return kv->slabs[block / kv->blocks_per_slab] +
         (size_t)(block % kv->blocks_per_slab) * kv->block_stride +
         (value ? kv->v_offset : kv->k_offset) +
         (size_t)((int64_t)head * kv->block_tokens + slot) *
             (value ? kv->v_row_bytes : kv->k_row_bytes);
}

/* Address of the stored row of (position, kv head). */
static inline uint8_t *ci_kv_row_at(const ci_paged_kv *kv, int value, int64_t position, int head) {
  return ci_kv_block_row(kv, value, kv->block_table[position / kv->block_tokens],
                         position % kv->block_tokens, head);
}

/* The sequences of a step as one layer's KV ops see them: sequence i owns the step's rows
 * [first_row[i], first_row[i] + n_rows[i]) and reads and writes its KV through kv[i]. */
typedef struct {
  int n_seqs;
  const int32_t *first_row; /* [n_seqs] */
  const int32_t *n_rows;    /* [n_seqs] */
  const ci_paged_kv *kv;    /* [n_seqs] */
} ci_step_kv;

/* Arguments of one attention call: every query row of a step attending over its own sequence's
 * paged KV (which already holds every position <= the row's position). */
typedef struct {
  const float *q;     /* [n_rows, n_heads, head_dim] */
  float *out;         /* [n_rows, n_heads, head_dim] */
  const int32_t *pos; /* [n_rows] absolute positions */
  int n_heads;        /* query heads; head h reads KV head h / (n_heads / n_kv_heads) */
  float scale;        /* multiplies <q, k> */
  float softcap;      /* 0 = none; else scores become softcap * tanh(score / softcap) */
  int window;         /* 0 = full causal; W > 0: keys max(0, p-W+1) .. p */
  const ci_step_kv *seqs;
} ci_attention_args;

/* The numerics of a backend's matmuls. EXACT: f32 activations (the reference path, within 1e-3
 * of transformers in f32). FAST: activations in the precision of the weights' own arithmetic --
 * bf16 weights and quantized prefill take x rounded to bf16 (bf16 products, f32 accumulation),
 * q8/q4 decode takes x as one int8 plane per group. Both keep batch invariance. */
typedef enum { CI_PRECISION_EXACT = 0, CI_PRECISION_FAST = 1 } ci_precision;

/* How the rows of a matmul split into independent segments (the sequences of a step): each
 * segment's rows of the result must be bit-identical to a matmul of that segment alone. */
typedef struct {
  int n;               /* segments; 0 = one segment of every row */
  const int32_t *rows; /* [n] rows of each segment, in order, summing to the row count */
} ci_row_segments;

/* ==== Gated DeltaNet ==== */

/* Arguments of one gated DeltaNet call (Qwen3.5 linear attention, docs/models.md §5.8) over the
 * rows of a step: sequence i owns rows [first_row[i], first_row[i] + n_rows[i]) and carries its
 * recurrent state in states[i]: the convolution tail [conv_kernel - 1, C] then the state
 * [n_v_heads, k_head_dim, v_head_dim], f32, zero for a new sequence. C = 2 Hk Dk + Hv Dv. */
typedef struct {
  float *qkv;           /* [n_rows, C] in_proj_qkv output; used as scratch (overwritten) */
  const float *z;       /* [n_rows, Hv Dv] in_proj_z output (the output gate) */
  const float *b;       /* [n_rows, Hv] in_proj_b output (beta before the sigmoid) */
  const float *a;       /* [n_rows, Hv] in_proj_a output (the decay input) */
  float *out;           /* [n_rows, Hv Dv] gated RMSNorm of the recurrence output */
  const float *conv_w;  /* [C, conv_kernel] depthwise causal convolution */
  const float *a_log;   /* [Hv] */
  const float *dt_bias; /* [Hv] */
  const float *norm_w;  /* [Dv] plain RMSNorm weight of the output */
  float norm_eps;
  int n_k_heads, n_v_heads, k_head_dim, v_head_dim, conv_kernel;
  int n_seqs;
  const int32_t *first_row; /* [n_seqs] host memory */
  const int32_t *n_rows;    /* [n_seqs] host memory */
  float *const *states;     /* [n_seqs] host array of backend pointers */
  /* NULL, or [n_seqs] entries, NULL for a sequence without: where to keep this layer's state
   * after each of the sequence's rows (a speculative round): after row r at
   * checkpoints[i] + r * checkpoint_stride, laid out as the state. Such a sequence's rows run
   * the recurrent form one by one (the arithmetic of single-row steps). */
  float *const *checkpoints;
  int64_t checkpoint_stride; /* floats */
} ci_deltanet_args;

/* ==== The op table ==== */

typedef struct ci_backend ci_backend;

typedef struct {
  const char *name;
  void (*destroy)(ci_backend *be);
  /* Activation/KV memory. alloc returns zeroed memory, alloc_uninitialized memory whose
   * contents are undefined (the KV arena), both NULL with ci_last_error on failure. */
  void *(*alloc)(ci_backend *be, size_t bytes);
  void *(*alloc_uninitialized)(ci_backend *be, size_t bytes);
  void (*release)(ci_backend *be, void *ptr);
  /* dst[0..bytes) = src[0..bytes) in backend memory (copy-on-write of KV blocks). */
  void (*copy_bytes)(ci_backend *be, void *dst, const void *src, size_t bytes);
  /* Host memory to backend memory and back (weights' vectors and tables at load, the step
   * descriptor, logits). */
  void (*upload)(ci_backend *be, void *dst, const void *host_src, size_t bytes);
  void (*download)(ci_backend *be, void *host_dst, const void *src, size_t bytes);
  /* x[i] = value for n floats of backend memory. */
  void (*fill)(ci_backend *be, float *x, float value, int64_t n);
  /* Starts a step: the step descriptor (host_desc, bytes) goes to backend memory at desc, which
   * the step's ops then read (token ids, positions). Returns CI_OK or CI_ERR. */
  int (*step_begin)(ci_backend *be, void *desc, const void *host_desc, size_t bytes);
  /* Ends a step: waits for its work, makes the n downloads (each bytes from backend memory
   * `device` to `host`; nothing to do when they are the same memory; a NULL host or 0 bytes is
   * skipped), and returns CI_OK or the first error an op raised during the step. */
  int (*step_end)(ci_backend *be, const ci_download *downloads, int n);
  /* Registers host memory that step_end downloads logits into, so that a device can write it
   * directly (page-locked); the caller unpins it before freeing it. Nothing to do on the CPU.
   * Returns CI_OK, or CI_ERR (downloads then stay correct, only slower). */
  int (*pin_host)(ci_backend *be, void *host, size_t bytes);
  void (*unpin_host)(ci_backend *be, void *host);
  /* Allocations the backend has made so far (alloc calls and growth of its scratch): a steady
   * state that allocates nothing leaves it unchanged. */
  int64_t (*allocation_count)(ci_backend *be);
  /* Makes sure the ops need no further scratch memory for steps of up to max_rows rows whose
   * matmuls have at most max_k inputs (attention: max_heads x max_head_dim per row). Returns
   * CI_OK or CI_ERR. */
  int (*reserve_scratch)(ci_backend *be, int64_t max_rows, int64_t max_k, int max_heads,
                         int max_head_dim);

  /* Makes a weight's arrays (data, scales, biases) readable by this backend's ops, once at
   * load: nothing on the CPU (the mapped file is read in place); a device copies them to its
   * memory, which it owns until destroy, and points t at the copies. Returns CI_OK, or CI_ERR
   * naming what this backend cannot run (a dtype it has no kernels for). */
  int (*prepare_weight)(ci_backend *be, ci_tensor *t);

  /* y[m, N] = x[m, K] @ W[N, K]^T for any weight dtype (f32/f16/bf16/q8/q4); with segments
   * (may be NULL), each segment's rows are computed as a matmul of that segment alone would
   * compute them, while the weights are read once for all rows. */
  int (*matmul)(ci_backend *be, const ci_tensor *w, const float *x, int64_t m, float *y,
                const ci_row_segments *segments);
  /* Optional (NULL: the caller runs matmul per weight): ys[i] = x @ ws[i]^T for n_weights
   * (2..4) weights of one dtype, width and grouping on the same x (q|k|v, gate|up), each row
   * exactly as matmul computes it, in one dispatch. */
  int (*matmul_multi)(ci_backend *be, const ci_tensor *const *ws, int n_weights, const float *x,
                      int64_t m, float *const *ys, const ci_row_segments *segments);
  /* out[n, dim] = rows ids of an embedding table (dequantized); ids already range-checked. */
  int (*embed)(ci_backend *be, const ci_tensor *table, const int32_t *ids, int64_t n, float *out);
  /* out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * (w_offset + w); w NULL means no scale.
   * out may equal x. */
  void (*rmsnorm)(ci_backend *be, float *out, const float *x, const float *w, int64_t n_rows,
                  int64_t dim, float eps, float w_offset);
  /* x[rows, cols] += bias[cols] broadcast over rows. */
  void (*add_bias)(ci_backend *be, float *x, const float *bias, int64_t rows, int64_t cols);
  /* x[i] += y[i]. */
  void (*add)(ci_backend *be, float *x, const float *y, int64_t n);
  /* gate[i] = silu(gate[i]) * up[i]. */
  void (*silu_mul)(ci_backend *be, float *gate, const float *up, int64_t n);
  /* gate[r, c] = gelu_tanh(gate[r, c]) * up[r * up_stride + c] for a [rows, cols] gate. */
  void (*gelu_tanh_mul)(ci_backend *be, float *gate, const float *up, int64_t rows, int64_t cols,
                        int64_t up_stride);
  /* x[i] *= s. */
  void (*scale)(ci_backend *be, float *x, float s, int64_t n);
  /* x[i] = cap * tanh(x[i] / cap). */
  void (*softcap)(ci_backend *be, float *x, float cap, int64_t n);
  /* dst[i] = src[i]. */
  void (*copy)(ci_backend *be, float *dst, const float *src, int64_t n);
  /* picks[r] = the greedy pick of logits row r of [rows, vocab] (ci_row_pick); picks is backend
   * memory. A row's pick depends on that row alone. */
  void (*pick_rows)(ci_backend *be, ci_row_pick *picks, const float *logits, int64_t rows,
                    int64_t vocab);
  /* dst[i] = src[rows[i]] for m rows of width dim; rows is host memory. */
  void (*gather_rows)(ci_backend *be, float *dst, const float *src, const int32_t *rows, int64_t m,
                      int64_t dim);
  /* dst[rows[i]] += weights[i] * src[i] for m rows of width dim; rows and weights are host
   * memory. */
  void (*scatter_add_rows)(ci_backend *be, float *dst, const float *src, const int32_t *rows,
                           const float *weights, int64_t m, int64_t dim);
  /* MoE routing of n tokens over E experts from router scores [n, E]: softmax over all E, the
   * top_k largest probabilities per token, renormalised over the k and multiplied by
   * expert_scale[e] (may be NULL). Writes expert ids and weights [n, top_k] to host memory, so
   * the caller can schedule experts. */
  void (*moe_route)(ci_backend *be, const float *scores, int64_t n, int n_experts, int top_k,
                    const float *expert_scale, int32_t *expert_ids, float *expert_weights);
  /* Rotates x [n_rows, n_heads, head_dim] in place at the rows' positions. */
  void (*rope)(ci_backend *be, float *x, int64_t n_rows, int n_heads, const int32_t *pos,
               const ci_rope *rope);
  /* Encodes the step's k, v [rows, n_kv_heads, head_dim] at positions pos into each sequence's
   * paged KV. */
  int (*kv_store)(ci_backend *be, const ci_step_kv *seqs, const float *k, const float *v,
                  const int32_t *pos);
  /* Re-encodes the first live_tokens slots of block src_block of src into block dst_block of
   * dst, head by head (one layer; a sequence's KV codec conversion). Returns CI_OK or CI_ERR. */
  int (*kv_convert_block)(ci_backend *be, const ci_paged_kv *src, int32_t src_block,
                          const ci_paged_kv *dst, int32_t dst_block, int live_tokens);
  /* Masked attention of every row of a step over its sequence's paged KV (see
   * ci_attention_args); each sequence's rows come out as a call for it alone gives them. */
  int (*attention)(ci_backend *be, const ci_attention_args *args);
  /* x[i] *= sigmoid(gate[i]) (the output gate of Qwen3.5 attention). NULL where the backend
   * does not run Qwen3.5 yet. */
  void (*sigmoid_mul)(ci_backend *be, float *x, const float *gate, int64_t n);
  /* The gated DeltaNet mixer of a step's rows (see ci_deltanet_args): causal convolution with
   * each sequence's tail, SiLU, L2-normalised q and k, the gated delta rule (block-parallel over
   * chunks of a sequence's rows; one recurrent step for a single row), then the gated RMSNorm.
   * Each sequence's rows and state come out as a call for it alone gives them. NULL where the
   * backend does not run Qwen3.5 yet. */
  int (*gated_deltanet)(ci_backend *be, const ci_deltanet_args *args);

  /* Collectives between the ranks of a tensor-parallel model (model/tensor_parallel.h), each rank
   * calling with its own backend; NULL where the backend cannot hold a rank. The ranks meet at
   * comm's barriers on the host; the data moves as the backend's memory allows. all_reduce: buf[i]
   * = the sum over the ranks, in rank order, of each rank's buf[i] (n floats of backend memory),
   * on every rank (the same bits everywhere, whatever the batch). gather_cols: rank r's src
   * [rows, cols] into columns [col0, col0 + cols) of rank 0's dst [rows, dst_cols] (dst is
   * rank 0's; the others pass NULL). Both return CI_OK or CI_ERR (a rank failed: comm aborted). */
  int (*all_reduce)(ci_backend *be, ci_rank_collective *comm, int rank, float *buf, int64_t n);
  int (*gather_cols)(ci_backend *be, ci_rank_collective *comm, int rank, float *dst,
                     const float *src, int64_t rows, int64_t cols, int64_t col0, int64_t dst_cols);
} ci_backend_ops;

struct ci_backend {
  const ci_backend_ops *ops;
  int host_visible; /* 1: backend memory is host memory (the CPU): no copies are needed */
};

#endif
