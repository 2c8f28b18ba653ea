/* Internals shared by the CUDA backend's files: the backend struct, error checking, the staging
 * ring for small host arrays, and the launchers each .cu file exports to cuda_backend.cu. */
#ifndef CI_BACKEND_CUDA_CUDA_INTERNAL_H
#define CI_BACKEND_CUDA_CUDA_INTERNAL_H

extern "C" {
#include "backend/cuda/cuda_backend.h"
#include "base/error.h"
#include "base/timing.h"
#include "tensor/backend.h"
}

#include "backend/cuda/cuda_launch.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

struct ci_cuda_blas;   /* cuda_matmul.cu */
struct ci_cuda_graphs; /* cuda_graph.cu */

/* Where one layer's KV of a group of sequences lives (everything but the block tables). */
typedef struct {
  uint8_t *const *slabs;
  int64_t block_stride, k_offset, v_offset, k_row_bytes, v_row_bytes;
  int32_t blocks_per_slab;
  int block_tokens, n_kv_heads, head_dim;
  int f32;   /* 1: f32 rows */
  int codec; /* ci_kv_codec of the rows */
  int k_bits, v_bits, group;
  const float *signs; /* [head_dim] TurboQuant sign vector (turbo, turbo-v; else NULL) */
} ci_cuda_kv_layout;

enum { CI_CUDA_MAX_SEQS = 64, CI_CUDA_SCRATCH_SLOTS = 5 };
/* Bytes every device allocation has past its end, which kernels may read (never write). */
enum { CI_CUDA_READ_SLACK = 256 };

/* The sequences of one KV launch, in device memory (staged per step): rows
 * [first_row, first_row + n_rows) of the step; row_start is the launch's running row count. */
typedef struct {
  int n;
  int total_rows;
  const int32_t *table[CI_CUDA_MAX_SEQS];
  int64_t n_entries[CI_CUDA_MAX_SEQS];
  int32_t first_row[CI_CUDA_MAX_SEQS];
  int32_t n_rows[CI_CUDA_MAX_SEQS];
  int32_t row_start[CI_CUDA_MAX_SEQS];
  int32_t tile_start[CI_CUDA_MAX_SEQS]; /* tensor-core attention: the sequence's first tile */
  int total_tiles;
} ci_cuda_seq_group;

/* Key splits of `split` positions that the longest sequence of a launch's group can hold (its
 * block-table entries times the block size), at least one. */
static inline int ci_cuda_key_splits(const ci_cuda_seq_group *g, const ci_cuda_kv_layout *L,
                                     int split) {
  int64_t max_keys = 0;
  for (int i = 0; i < g->n; i++) {
    const int64_t keys = g->n_entries[i] * L->block_tokens;
    max_keys = keys > max_keys ? keys : max_keys;
  }
  const int splits = (int)((max_keys + split - 1) / split);
  return splits < 1 ? 1 : splits;
}

/* How one tensor-core attention launch runs (cuda_flash_attention.cu): `group` query heads per
 * KV head; keys in `splits` fixed splits, walked in one block per tile (parallel 0) or one block
 * per split plus a merge (parallel 1, whose split states need slot-2 scratch); exact: two bf16
 * planes for q and P; TurboQuant KV also keeps q rotated in slot-2 scratch. scratch_bytes is
 * all of it; partial, state and q_rotated are filled in at launch. */
typedef struct {
  int group, warps, splits, parallel, exact;
  size_t scratch_bytes;
  float *partial, *state, *q_rotated;
} ci_cuda_flash_params;

typedef struct {
  const float *q;
  float *out;
  const int32_t *pos;
  int n_heads;
  float scale, softcap;
  int window;
} ci_cuda_attention_params;

/* A weight matrix on the device: bf16/f16/f32 rows, or MLX affine codes with their (scale, bias)
 * pairs packed by ci_cuda_affine_upload (see cuda_affine.cuh). */
typedef struct {
  const void *data;
  const void *pairs; /* affine only */
  int dtype;         /* ci_dtype */
  int group_size;    /* affine only */
  int f16_pairs;     /* affine only: 1 when the pairs are f16, 0 when bf16 */
} ci_cuda_weight;

/* One unit of GPU work of a step. Ops build commands; outside a recorded step a command runs at
 * once, inside one it is appended to the step's list, which runs (or replays as a CUDA graph) at
 * step end. Commands hold every argument by value, so equal lists launch equal work. */
typedef enum {
  CMD_MEMCPY,
  CMD_EMBED,
  CMD_RMSNORM,
  CMD_ADD_BIAS,
  CMD_ADD,
  CMD_SILU_MUL,
  CMD_GELU_MUL,
  CMD_SCALE,
  CMD_SOFTCAP,
  CMD_FILL,
  CMD_GATHER,
  CMD_SCATTER,
  CMD_ROPE,
  CMD_MATMUL,
  CMD_KV_STORE,
  CMD_ATTENTION,
  CMD_SIGMOID_MUL,
  CMD_DELTANET,
  CMD_PICK_ROWS
} ci_cuda_cmd_kind;

/* A gated DeltaNet launch (cuda_deltanet.cu): ci_deltanet_args with the per-sequence arrays as
 * one staged device table (seqs) of n_seqs entries over total_rows rows. */
typedef struct {
  float *qkv;
  const float *z, *b, *a;
  float *out;
  const float *conv_w, *a_log, *dt_bias, *norm_w;
  float norm_eps;
  int n_k_heads, n_v_heads, k_head_dim, v_head_dim, conv_kernel;
  int n_seqs;
  int64_t total_rows;
  const void *seqs;
  int64_t checkpoint_stride;
} ci_cuda_deltanet_params;

typedef struct {
  ci_cuda_cmd_kind kind;
  union {
    struct {
      void *dst;
      const void *src;
      size_t bytes;
      int kind; /* cudaMemcpyKind */
    } memcpy;
    struct {
      ci_cuda_weight table;
      int64_t dim;
      const int32_t *ids;
      int64_t n;
      float *out;
    } embed;
    struct {
      float *out;
      const float *x, *w;
      int64_t rows, dim;
      float eps, w_offset;
    } rmsnorm;
    struct {
      float *x;
      const float *y; /* bias, addend, up */
      int64_t rows, cols, stride, n;
      float value; /* scale, softcap, fill */
    } vec;
    struct {
      float *dst;
      const float *src;
      const int32_t *rows;
      const float *weights;
      int64_t m, dim;
    } rows;
    struct {
      ci_row_pick *picks;
      const float *logits;
      int64_t rows, vocab;
    } pick;
    struct {
      float *x;
      int64_t n_rows;
      int n_heads;
      const int32_t *pos;
      ci_rope rope;
    } rope;
    struct {
      ci_cuda_weight w;
      int64_t n, k, m;
      const float *x;
      float *y;
    } matmul;
    struct {
      ci_cuda_kv_layout layout;
      const ci_cuda_seq_group *group; /* device copy */
      int total_rows;
      const float *k, *v;
      const int32_t *pos;
      ci_cuda_attention_params att;
      int flash;                 /* 1: the tensor-core kernel (bf16 or fast affine KV, D 64/128) */
      int total_tiles;           /* flash: query tiles of the launch */
      ci_cuda_flash_params plan; /* flash, and quantized KV (splits, parallel, scratch_bytes) */
    } kv;
    ci_cuda_deltanet_params deltanet;
  } a;
} ci_cuda_cmd;

/* A host-to-device staging ring: small host arrays an op needs on the device (row lists) are
 * written to pinned host memory and copied asynchronously into the device twin at the same
 * offset. Both halves are reset when the stream is idle (step end). */
typedef struct {
  uint8_t *host;   /* pinned, [bytes] */
  uint8_t *device; /* [bytes] */
  size_t bytes, used;
} ci_cuda_ring;

/* How ci_cuda_k_segment cuts affine rows: rows longer than `above` columns into `segments`
 * segments of whole 512-column stages (q8: as many, 2 to `segments`, as give about `q8_units`
 * (row group, segment) units; q8_units 0: `segments`), q4 rows of 2048 to `above` columns of
 * matrices of up to 4096 rows into `short_segments`. */
typedef struct {
  int segments, above, short_segments, q8_units;
} ci_cuda_k_rule;

/* The rule ci_cuda_k_segment follows unless CINFER_CUDA_K_SEGMENTS overrides it (measured:
 * cuda_matmul.cu). */
static inline ci_cuda_k_rule ci_cuda_k_rule_default(void) {
  const ci_cuda_k_rule rule = {4, 4096, 2, 512};
  return rule;
}

/* What a rank of a tensor-parallel model publishes to the others in a collective
 * (cuda_collective.cu). */
typedef struct {
  float *buf;        /* this call's buffer (all_reduce), or rank 0's destination (gather_cols) */
  cudaEvent_t ready; /* recorded on the rank's stream when buf may be read (or written) */
  cudaEvent_t done;  /* recorded when the rank has read its peers' buffers (or written rank 0's) */
} ci_cuda_rank_slot;

/* The backend. Every op enqueues on `stream`; step_end waits for it. */
typedef struct {
  ci_backend base;
  int device;
  cudaStream_t stream;
  int64_t allocations; /* cudaMalloc calls so far */
  int *error_flag;     /* device int: kernels set it when they meet bad data */
  ci_cuda_ring ring;
  /* scratch: [0] half-precision copies of matmul inputs, [1] f32 products of both planes,
   * [2] per-split attention states, [3] dequantised slices of affine weights, [4] the partial
   * products of a matmul's K segments (ci_cuda_k_segment) */
  void *scratch[CI_CUDA_SCRATCH_SLOTS];
  size_t scratch_bytes[CI_CUDA_SCRATCH_SLOTS];
  int n_sms;       /* streaming multiprocessors of the device */
  int smem_per_sm; /* shared memory bytes per SM */
  /* [head_dim 128][exact][cooperative decode]: serial flash-attention blocks one SM holds */
  int flash_blocks_per_sm[2][2][2];
  int flash_affine_blocks_per_sm[2][2];  /* [head_dim 128][cooperative]: the same, affine KV */
  int flash_turbo_blocks_per_sm[2][2];   /* the same, TurboQuant KV */
  int flash_turbo_v_blocks_per_sm[2][2]; /* the same, turbo-v KV */
  int pdl;  /* 1: kernels launch with programmatic dependent launch (cuda_launch.cuh) */
  int fuse; /* 1 (default): fused launches (cuda_graph.cu); CINFER_CUDA_FUSE=0 runs every command
               on its own, for measuring what the fusions save */
  /* the matmul input last converted into scratch[0] (NULL: none valid); q/k/v and gate/up
   * products of one input convert it once */
  const float *converted_x;
  int64_t converted_n;
  int converted_kind;
  int input_planes; /* 2: matmul inputs as bf16 hi + lo planes (about 16 mantissa bits); 1: bf16 */
  ci_cuda_k_rule k_rule; /* how ci_cuda_k_segment cuts rows (CINFER_CUDA_K_SEGMENTS) */
  unsigned *gemv_counts; /* [CI_CUDA_GEMV_COUNTS] zeroed: segments done per small-batch row group */
  int gemv_shape;     /* affine small-batch stage shape forced (CI_CUDA_GEMV_*), -1: by its rule */
  int batch_rows;     /* the most input rows (planes x rows) the affine batch matmul takes
                         (CINFER_CUDA_BATCH_ROWS) */
  int batch_shape;    /* the batch matmul's block shape forced (16 tiles + nt), -1: by its rule
                         (CINFER_CUDA_BATCH_SHAPE) */
  float *host_scores; /* pinned host copy of MoE router scores */
  size_t host_scores_bytes;
  /* weights copied to the device at load, freed at destroy */
  void **weights;
  int n_weights, cap_weights;
  struct ci_cuda_blas *blas;
  struct ci_cuda_graphs *graphs; /* the recorded step and its graph cache */
  int sticky_error;              /* a CUDA failure was met; reported by step_end */
  char sticky_message[256];
  /* step timing (ci_cuda_step_timing): events at the launch, before and after the download */
  int timing;
  cudaEvent_t timing_events[3];
  double step_started;
  ci_cuda_step_times times;
  /* tensor parallelism (cuda_collective.cu): the slot this rank publishes, the sums of an
   * all-reduce before they replace the rank's buffer, the peers whose memory the kernels read */
  ci_cuda_rank_slot rank_slot;
  float *rank_sums;
  size_t rank_sums_bytes;
  int peer_access_done;
  int bind_threads; /* the machine has several GPUs: ops make theirs current (ci_cuda_bind) */
} ci_cuda;

/* kernel<<<grid, block, smem, cu->stream>>>(args...) through ci_launch_on (cuda_launch.cuh). */
template <typename... Params, typename... Args>
static inline void ci_launch(ci_cuda *cu, void (*kernel)(Params...), dim3 grid, dim3 block,
                             size_t smem, Args &&...args) {
  ci_launch_on(cu->stream, cu->pdl, kernel, grid, block, smem, std::forward<Args>(args)...);
}

static inline ci_cuda *ci_as_cuda(ci_backend *be) {
  return (ci_cuda *)be;
}

/* Records a CUDA failure on the backend (reported by the next step_end) and as the thread's
 * error. Returns CI_ERR. */
int ci_cuda_fail(ci_cuda *cu, cudaError_t err, const char *what);

/* Checks the last launch; returns CI_OK or ci_cuda_fail. */
int ci_cuda_check_launch(ci_cuda *cu, const char *what);

/* Makes the backend's GPU the calling thread's current device: the ranks of a tensor-parallel
 * model call each other's backends from their host threads (KV copies, table uploads, codec
 * conversions), and the runtime launches on the current device. */
static inline void ci_cuda_bind(const ci_cuda *cu) {
  if (!cu->bind_threads) return; /* one GPU: every thread's current device is it */
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != cu->device) cudaSetDevice(cu->device);
}

/* 1 while the step's commands are being recorded for a graph (ops do not run yet). */
int ci_cuda_recording(const ci_cuda *cu);

/* The tensor-parallel collectives (backend op table; cuda_collective.cu) and their teardown. */
int ci_cuda_all_reduce(ci_backend *be, ci_rank_collective *comm, int rank, float *buf, int64_t n);
int ci_cuda_gather_cols(ci_backend *be, ci_rank_collective *comm, int rank, float *dst,
                        const float *src, int64_t rows, int64_t cols, int64_t col0,
                        int64_t dst_cols);
void ci_cuda_collective_destroy(ci_cuda *cu);

/* Device memory of `bytes` (counted), or NULL with ci_last_error. */
void *ci_cuda_malloc(ci_cuda *cu, size_t bytes);

/* Copies n bytes of host memory to the device through the ring; returns the device address
 * (valid until the next step end), or NULL with ci_last_error. */
void *ci_cuda_stage(ci_cuda *cu, const void *host, size_t bytes);
/* ci_cuda_stage in two halves, for callers that write the bytes in place instead of from a
 * buffer of their own: reserve returns the device address and sets *host to the ring's pinned
 * memory for them; once they are written, send copies them (returns CI_OK or CI_ERR). */
void *ci_cuda_stage_reserve(ci_cuda *cu, size_t bytes, void **host);
int ci_cuda_stage_send(ci_cuda *cu, void *device, const void *host, size_t bytes);

/* ==== cuda_graph.cu: commands, step recording, graph replay ==== */
int ci_cuda_graphs_create(ci_cuda *cu);
void ci_cuda_graphs_destroy(ci_cuda *cu);
/* Runs cmd now, or appends it to the step being recorded. Returns CI_OK or CI_ERR. */
int ci_cuda_emit(ci_cuda *cu, const ci_cuda_cmd *cmd);
/* Starts recording a step's commands (graphs on) . */
void ci_cuda_record_begin(ci_cuda *cu);
/* While a step records: extends the range of staging-ring bytes the step copies to the device
 * in one copy before its first command to cover [device, device + bytes), and returns 1; 0 when
 * no step records (the caller copies them itself). */
int ci_cuda_record_staged(ci_cuda *cu, const void *device, size_t bytes);
/* Runs the recorded commands now and stops recording (an op must wait for the GPU mid-step). */
int ci_cuda_record_flush(ci_cuda *cu);
/* Ends the recorded step: runs its commands, through a cached CUDA graph when this list was seen
 * before. Returns CI_OK or CI_ERR. */
int ci_cuda_record_end(ci_cuda *cu);
/* Drops every captured graph (their scratch addresses changed). */
void ci_cuda_graphs_invalidate(ci_cuda *cu);
/* Executes one command on the stream (cuda_graph.cu's switch over the launchers). */
int ci_cuda_execute(ci_cuda *cu, const ci_cuda_cmd *cmd);

/* Device scratch buffer `slot` (0 or 1) of at least `bytes` (grown when needed, counted). NULL
 * on failure. */
void *ci_cuda_scratch(ci_cuda *cu, int slot, size_t bytes);

/* ==== cuda_matmul.cu ==== */
int ci_cuda_blas_create(ci_cuda *cu);
void ci_cuda_blas_destroy(ci_cuda *cu);
/* Runs matmul commands [c, c + parts), which multiply the same input (one command: any), y = x
 * W^T each: small batches as one launch of the small-batch kernel (cuda_gemv.cu), others in
 * cuBLASLt (affine weights dequantised to bf16 slices first). Reserves the scratch they need. */
int ci_cuda_matmul_run(ci_cuda *cu, const ci_cuda_cmd *c, int parts);
/* Scratch bytes per slot that matmul commands [c, c + parts), run as ci_cuda_matmul_run runs
 * them, need. */
void ci_cuda_matmul_scratch(const ci_cuda *cu, const ci_cuda_cmd *c, int parts,
                            size_t need[CI_CUDA_SCRATCH_SLOTS]);

/* The summation order of every product with an [n, k] matrix, whatever the number of rows:
 * K is cut into segments of the returned number of columns (the last may be shorter; k itself:
 * one segment), each output is one chain of tensor-core products over each segment from zero, and
 * the segments' sums are added in order, (s0 + s1) + s2 .... Long rows of affine (q8/q4) weights
 * (the down projection; for q4 also the 2048-4096-column rows of q, k, v and o) are cut so that
 * a batch-1 product has enough independent chains to keep the GPU's SMs issuing; the small-batch
 * kernel and cuBLASLt both follow it, so rows stay bit-identical across them. The cut depends on
 * the matrix alone (dtype, rows, columns), never on the batch. */
int64_t ci_cuda_k_segment(const ci_cuda *cu, int dtype, int64_t n, int64_t k);

/* Copies `bytes` of a weight from the host into a new device allocation the backend frees at
 * destroy. NULL (with the error set) on failure. */
void *ci_cuda_upload_weight(ci_cuda *cu, const void *host, size_t bytes);
/* A new device allocation of `bytes` for a weight, freed at destroy (contents undefined). */
void *ci_cuda_alloc_weight(ci_cuda *cu, size_t bytes);

/* ==== cuda_affine.cu ==== */
/* Copies affine weight t to the device in the layout of cuda_affine.cuh (codes repacked, (scale,
 * bias) pairs packed) and points t->data at the codes and t->scales at the pairs (t->biases
 * becomes NULL). */
int ci_cuda_affine_upload(ci_cuda *cu, ci_tensor *t);
/* Rows [row0, row0 + rows) of affine weight w ([n, k]) as bf16 into dst ([rows][k]), each weight
 * as every other path computes it (ci_affine_fragment). */
void ci_cuda_affine_dequant(ci_cuda *cu, const ci_cuda_weight *w, int64_t row0, int64_t rows,
                            int64_t k, void *dst);
/* Embedding rows of an affine table: out[i] = scale * q + bias in f32, as the CPU computes it. */
void ci_cuda_affine_embed(ci_cuda *cu, const ci_cuda_weight *table, int64_t dim, const int32_t *ids,
                          int64_t n, float *out);

/* ==== cuda_elementwise.cu ==== */
void ci_cuda_embed(ci_cuda *cu, const void *table, int dtype, int64_t dim, const int32_t *ids,
                   int64_t n, float *out);
/* With planes_dst (may be NULL) the norm also writes the bf16 input planes of a following matmul
 * (as ci_cuda_to_half writes them) where its kernel can; returns 1 when it did. With add (may be
 * NULL; only where ci_cuda_add_rmsnorm_fusable) it first adds add into x, which it writes back. */
int ci_cuda_rmsnorm(ci_cuda *cu, float *out, const float *x, const float *w, int64_t n_rows,
                    int64_t dim, float eps, float w_offset, void *planes_dst, int planes,
                    const float *add);
/* 1 when ci_cuda_rmsnorm can run with `add` (x += add first, in the same kernel, bit for bit as
 * ci_cuda_add then ci_cuda_rmsnorm). */
int ci_cuda_add_rmsnorm_fusable(const float *out, const float *x, const float *w, const float *add,
                                int64_t dim);
void ci_cuda_add_bias(ci_cuda *cu, float *x, const float *bias, int64_t rows, int64_t cols);
void ci_cuda_add(ci_cuda *cu, float *x, const float *y, int64_t n);
/* planes_dst as for ci_cuda_rmsnorm (always written when given). */
int ci_cuda_silu_mul(ci_cuda *cu, float *gate, const float *up, int64_t n, void *planes_dst,
                     int planes);
void ci_cuda_gelu_tanh_mul(ci_cuda *cu, float *gate, const float *up, int64_t rows, int64_t cols,
                           int64_t up_stride);
void ci_cuda_scale(ci_cuda *cu, float *x, float s, int64_t n);
void ci_cuda_softcap(ci_cuda *cu, float *x, float cap, int64_t n);
/* picks[r] = the greedy pick of logits row r (cuda_pick.cu). */
void ci_cuda_pick_rows(ci_cuda *cu, ci_row_pick *picks, const float *logits, int64_t rows,
                       int64_t vocab);
void ci_cuda_fill(ci_cuda *cu, float *x, float value, int64_t n);
void ci_cuda_gather_rows(ci_cuda *cu, float *dst, const float *src, const int32_t *rows_dev,
                         int64_t m, int64_t dim);
void ci_cuda_scatter_add_rows(ci_cuda *cu, float *dst, const float *src, const int32_t *rows_dev,
                              const float *weights_dev, int64_t m, int64_t dim);
/* RoPE over x (n_heads per row) and, when x2 is set, x2 (n_heads2 per row) in one launch. */
void ci_cuda_rope(ci_cuda *cu, float *x, int n_heads, float *x2, int n_heads2, int64_t n_rows,
                  const int32_t *pos, const ci_rope *rope);
/* dst = half-precision copy of n floats (bf16 or f16); with planes 2 a second plane follows at
 * dst + n holding the rounding remainder. */
void ci_cuda_to_half(ci_cuda *cu, void *dst, const float *src, int64_t n, int bf16, int planes);
/* y[i] = a[i] + b[i]. */
void ci_cuda_sum(ci_cuda *cu, float *y, const float *a, const float *b, int64_t n);
/* y[m, n] = the in-order sum of `segs` partial products part[s][planes * m][n] (two planes: the
 * values' sum plus the remainders' sum, as ci_cuda_sum adds them). */
void ci_cuda_segment_sum(ci_cuda *cu, float *y, const float *part, int segs, int64_t m, int64_t n,
                         int planes);

/* ==== cuda_attention.cu ==== */
int ci_cuda_kv_store(ci_cuda *cu, const ci_step_kv *seqs, const float *k, const float *v,
                     const int32_t *pos);
int ci_cuda_attention(ci_cuda *cu, const ci_attention_args *args);
void ci_cuda_kv_store_launch(ci_cuda *cu, const ci_cuda_cmd *cmd);
int ci_cuda_attention_launch(ci_cuda *cu, const ci_cuda_cmd *cmd);
/* ==== cuda_kv_attention.cu: attention over quantized KV rows (CUDA cores) ==== */
/* Plans a launch over the host copy of its sequence group: fixed key splits, walked in one block
 * per (row, head) or one block per split plus a merge (needs scratch_bytes of slot-2 scratch). */
void ci_cuda_kv_attention_plan(const ci_cuda_kv_layout *L, const ci_cuda_seq_group *host_group,
                               int n_heads, int n_sms, ci_cuda_flash_params *f);
int ci_cuda_kv_attention_launch(ci_cuda *cu, const ci_cuda_cmd *cmd);
/* ==== cuda_flash_attention.cu ==== */
/* Raises the kernels' shared-memory limit (once, at backend creation). */
int ci_cuda_flash_init(ci_cuda *cu);

/* cuda_gemv.cu: the small-batch matmul (bf16 or affine weights), bit-identical to cuBLASLt's rows.
 * fits: whether it takes this product (planes * m <= 8 input rows, n % 16 == 0, k % 16 == 0, or
 * k % 32 == 0 for affine weights). launch: y[p] = x @ w[p]^T for `parts`
 * (1..CI_CUDA_GEMV_MAX_PARTS) matrices of one type and n[p] rows sharing the input x, which holds
 * `planes` bf16 planes of m rows each. */
enum { CI_CUDA_GEMV_MAX_PARTS = 3, CI_CUDA_GEMV_COUNTS = 1 << 16 };
int ci_cuda_gemv_init(ci_cuda *cu);
void ci_cuda_gemv_destroy(ci_cuda *cu);
int ci_cuda_gemv_fits(int dtype, int64_t n, int64_t k, int64_t m, int planes);
/* seg_cols: ci_cuda_k_segment of the matrices (the same for every part); partial: with segments,
 * scratch of planes * m * segments * (sum of n) floats. */
void ci_cuda_gemv_launch(ci_cuda *cu, int parts, const ci_cuda_weight *w, const int64_t *n,
                         float *const *y, int64_t k, const void *x, int64_t m, int planes,
                         int64_t seg_cols, float *partial);
/* 1 when the tensor-core kernel runs this layout with n_heads query heads: bf16 KV, and in fast
 * mode (exact 0: one input plane) affine KV of 4 or 8 bits, TurboQuant and turbo-v KV, decoded
 * to bf16 tiles. */
int ci_cuda_flash_supported(const ci_cuda_kv_layout *L, int n_heads, int exact);
/* Warps per block for a launch whose sequences have at most max_rows_per_seq rows. */
int ci_cuda_flash_warps(int n_heads, int n_kv_heads, int max_rows_per_seq);
/* Query positions per tile (16 packed rows per warp / the GQA group). */
int ci_cuda_flash_positions_per_tile(const ci_cuda_kv_layout *L, int n_heads, int warps);
/* Plans a launch over the host copy of its sequence group (tile_start and total_tiles set). */
void ci_cuda_flash_plan(const ci_cuda_kv_layout *L, const ci_cuda_seq_group *host_group,
                        int n_heads, int warps, const ci_cuda *cu, int exact,
                        ci_cuda_flash_params *f);
int ci_cuda_flash_launch(ci_cuda *cu, const ci_cuda_cmd *cmd);

/* cuda_batch_gemm.cu: the batch matmul of affine weights (dequantised on chip) for more input
 * rows than the small-batch kernel takes, up to CI_CUDA_BATCH_ROWS planes x rows, bit-identical
 * to cuBLASLt's rows over the dequantised matrix. fits: whether it takes a product of `rows` input
 * rows (planes x rows) of weights of `dtype` in groups of group_size with k columns. launch:
 * out[p] = x @ w[p]^T for `parts` (1..CI_CUDA_GEMV_MAX_PARTS) matrices of one format and n[p] rows
 * sharing the bf16 input x of `rows` rows, cut into K segments of seg_cols columns; partial 0:
 * out[p] is y (one segment), 1: out[p] holds [segments][rows][n[p]] partial products for
 * ci_cuda_segment_sum. */
enum { CI_CUDA_BATCH_ROWS = 128 };
int ci_cuda_batch_gemm_init(ci_cuda *cu);
int ci_cuda_batch_gemm_fits(const ci_cuda *cu, int dtype, int group_size, int64_t k, int64_t rows);
void ci_cuda_batch_gemm_launch(ci_cuda *cu, int parts, const ci_cuda_weight *w, const int64_t *n,
                               float *const *out, int partial, int64_t k, const void *x,
                               int64_t rows, int64_t seg_cols);

/* ==== cuda_deltanet.cu ==== */
/* Emits x[i] *= sigmoid(gate[i]). */
void ci_cuda_sigmoid_mul(ci_cuda *cu, float *x, const float *gate, int64_t n);
void ci_cuda_sigmoid_mul_launch(ci_cuda *cu, float *x, const float *gate, int64_t n);
/* Checks the arguments, stages the sequence table and emits the command. */
int ci_cuda_gated_deltanet(ci_cuda *cu, const ci_deltanet_args *args);
int ci_cuda_deltanet_launch(ci_cuda *cu, const ci_cuda_cmd *cmd);

int ci_cuda_kv_convert_block(ci_cuda *cu, const ci_paged_kv *src, int32_t src_block,
                             const ci_paged_kv *dst, int32_t dst_block, int live_tokens);

#endif
