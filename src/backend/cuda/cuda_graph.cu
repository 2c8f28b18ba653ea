/* The CUDA backend's steps as command lists and CUDA graphs.
 *
 * Between step_begin and step_end every op appends a command (its arguments by value) instead of
 * launching; small host arrays the step needs (row lists, the KV launches' sequence groups, the
 * DeltaNet layers' sequence tables) are written into the pinned staging ring, and the step copies
 * all of them to the device in one copy before its first command (one graph node, not one per layer
 * and KV launch: a copy node between two kernels costs a few microseconds and breaks the
 * programmatic dependent launch of the kernel after it). At step end the list is hashed: a list
 * seen before (same ops, same pointers, same shapes: the decode steps of a running batch) replays
 * as one CUDA graph, so a step costs one launch instead of hundreds; a list seen once runs command
 * by command and is captured the second time. The data that changes from step to step (ids,
 * positions, block tables, sequence groups) is read by the kernels from device memory that the
 * step's uploads and its copy node refresh, so a replay computes exactly what the
 * command-by-command run computes. A step whose op must wait for the GPU (MoE routing) runs its
 * commands at that point and the rest of the step eagerly. */
#include "backend/cuda/cuda_internal.h"

#include <stdlib.h>
#include <string.h>

enum { GRAPH_CACHE = 64, SEEN_CACHE = 256 };

typedef struct {
  uint64_t hash;
  cudaGraphExec_t exec;
  uint64_t last_use;
} graph_entry;

struct ci_cuda_graphs {
  int recording;
  ci_cuda_cmd *cmds;
  int n_cmds, cap_cmds;
  graph_entry graphs[GRAPH_CACHE];
  uint64_t seen[SEEN_CACHE]; /* hashes run once, captured on their next appearance */
  uint64_t clock;
  int enabled;
  int capturing; /* run_all runs inside a stream capture (checks it after each command) */
  size_t staged_from, staged_to; /* the staging ring's bytes the recorded step copies first */
};

int ci_cuda_graphs_create(ci_cuda *cu) {
  ci_cuda_graphs *g = (ci_cuda_graphs *)calloc(1, sizeof *g);
  if (!g) return ci_fail("out of memory");
  const char *env = getenv("CINFER_CUDA_GRAPHS");
  g->enabled = !(env && strcmp(env, "0") == 0); /* 0: every step runs command by command */
  cu->graphs = g;
  return CI_OK;
}

static void drop_graphs(ci_cuda_graphs *g) {
  for (int i = 0; i < GRAPH_CACHE; i++)
    if (g->graphs[i].exec) {
      cudaGraphExecDestroy(g->graphs[i].exec);
      g->graphs[i].exec = NULL;
      g->graphs[i].hash = 0;
    }
}

void ci_cuda_graphs_destroy(ci_cuda *cu) {
  ci_cuda_graphs *g = cu->graphs;
  if (!g) return;
  drop_graphs(g);
  free(g->cmds);
  free(g);
  cu->graphs = NULL;
}

void ci_cuda_graphs_invalidate(ci_cuda *cu) {
  if (cu->graphs) drop_graphs(cu->graphs);
}

int ci_cuda_recording(const ci_cuda *cu) {
  return cu->graphs && cu->graphs->recording;
}

void ci_cuda_set_graphs(ci_backend *be, int enabled) {
  ci_cuda *cu = ci_as_cuda(be);
  if (cu->graphs) cu->graphs->enabled = enabled;
}

/* Where a producer of n floats may also write the bf16 input planes of the matmul that reads
 * them next (the matmul input scratch, when it holds them), or NULL. */
static void *planes_for(ci_cuda *cu, int64_t n) {
  if (!cu->fuse) return NULL;
  const size_t bytes = (size_t)cu->input_planes * (size_t)n * sizeof(uint16_t);
  return cu->scratch[0] && bytes <= cu->scratch_bytes[0] ? cu->scratch[0] : NULL;
}

/* Records that the matmul input scratch holds x's bf16 planes (a bf16-weight matmul of x then
 * skips its conversion; ci_cuda_matmul_launch checks pointer, size and kind). */
static void mark_converted(ci_cuda *cu, const float *x, int64_t n) {
  cu->converted_x = x;
  cu->converted_n = n;
  cu->converted_kind = CI_BF16 * 4 + cu->input_planes;
}

int ci_cuda_execute(ci_cuda *cu, const ci_cuda_cmd *c) {
  if (c->kind != CMD_MATMUL) cu->converted_x = NULL; /* any other op may rewrite an input */
  switch (c->kind) {
  case CMD_MEMCPY: {
    cudaError_t err = cudaMemcpyAsync(c->a.memcpy.dst, c->a.memcpy.src, c->a.memcpy.bytes,
                                      (cudaMemcpyKind)c->a.memcpy.kind, cu->stream);
    return err == cudaSuccess ? CI_OK : ci_cuda_fail(cu, err, "copy");
  }
  case CMD_EMBED:
    if (ci_dtype_is_affine((ci_dtype)c->a.embed.table.dtype))
      ci_cuda_affine_embed(cu, &c->a.embed.table, c->a.embed.dim, c->a.embed.ids, c->a.embed.n,
                           c->a.embed.out);
    else
      ci_cuda_embed(cu, c->a.embed.table.data, c->a.embed.table.dtype, c->a.embed.dim,
                    c->a.embed.ids, c->a.embed.n, c->a.embed.out);
    return CI_OK;
  case CMD_RMSNORM: {
    const int64_t n = c->a.rmsnorm.rows * c->a.rmsnorm.dim;
    void *planes = planes_for(cu, n);
    if (ci_cuda_rmsnorm(cu, c->a.rmsnorm.out, c->a.rmsnorm.x, c->a.rmsnorm.w, c->a.rmsnorm.rows,
                        c->a.rmsnorm.dim, c->a.rmsnorm.eps, c->a.rmsnorm.w_offset, planes,
                        cu->input_planes, NULL))
      mark_converted(cu, c->a.rmsnorm.out, n);
    return CI_OK;
  }
  case CMD_ADD_BIAS:
    ci_cuda_add_bias(cu, c->a.vec.x, c->a.vec.y, c->a.vec.rows, c->a.vec.cols);
    return CI_OK;
  case CMD_ADD:
    ci_cuda_add(cu, c->a.vec.x, c->a.vec.y, c->a.vec.n);
    return CI_OK;
  case CMD_SILU_MUL:
    if (ci_cuda_silu_mul(cu, c->a.vec.x, c->a.vec.y, c->a.vec.n, planes_for(cu, c->a.vec.n),
                         cu->input_planes))
      mark_converted(cu, c->a.vec.x, c->a.vec.n);
    return CI_OK;
  case CMD_GELU_MUL:
    ci_cuda_gelu_tanh_mul(cu, c->a.vec.x, c->a.vec.y, c->a.vec.rows, c->a.vec.cols,
                          c->a.vec.stride);
    return CI_OK;
  case CMD_SCALE:
    ci_cuda_scale(cu, c->a.vec.x, c->a.vec.value, c->a.vec.n);
    return CI_OK;
  case CMD_SOFTCAP:
    ci_cuda_softcap(cu, c->a.vec.x, c->a.vec.value, c->a.vec.n);
    return CI_OK;
  case CMD_FILL:
    ci_cuda_fill(cu, c->a.vec.x, c->a.vec.value, c->a.vec.n);
    return CI_OK;
  case CMD_PICK_ROWS:
    ci_cuda_pick_rows(cu, c->a.pick.picks, c->a.pick.logits, c->a.pick.rows, c->a.pick.vocab);
    return CI_OK;
  case CMD_GATHER:
    ci_cuda_gather_rows(cu, c->a.rows.dst, c->a.rows.src, c->a.rows.rows, c->a.rows.m,
                        c->a.rows.dim);
    return CI_OK;
  case CMD_SCATTER:
    ci_cuda_scatter_add_rows(cu, c->a.rows.dst, c->a.rows.src, c->a.rows.rows, c->a.rows.weights,
                             c->a.rows.m, c->a.rows.dim);
    return CI_OK;
  case CMD_ROPE:
    ci_cuda_rope(cu, c->a.rope.x, c->a.rope.n_heads, NULL, 0, c->a.rope.n_rows, c->a.rope.pos,
                 &c->a.rope.rope);
    return CI_OK;
  case CMD_MATMUL:
    return ci_cuda_matmul_run(cu, c, 1);
  case CMD_KV_STORE:
    ci_cuda_kv_store_launch(cu, c);
    return CI_OK;
  case CMD_ATTENTION:
    if (c->a.kv.flash) return ci_cuda_flash_launch(cu, c);
    return ci_cuda_attention_launch(cu, c);
  case CMD_SIGMOID_MUL:
    ci_cuda_sigmoid_mul_launch(cu, c->a.vec.x, c->a.vec.y, c->a.vec.n);
    return CI_OK;
  case CMD_DELTANET:
    return ci_cuda_deltanet_launch(cu, c);
  }
  return ci_fail("CUDA: unknown command %d", (int)c->kind);
}

int ci_cuda_emit(ci_cuda *cu, const ci_cuda_cmd *cmd) {
  ci_cuda_graphs *g = cu->graphs;
  if (!g || !g->recording) return ci_cuda_execute(cu, cmd);
  if (g->n_cmds == g->cap_cmds) {
    int cap = g->cap_cmds ? 2 * g->cap_cmds : 1024;
    ci_cuda_cmd *grown = (ci_cuda_cmd *)realloc(g->cmds, (size_t)cap * sizeof *grown);
    if (!grown) return ci_fail("out of memory");
    g->cmds = grown;
    g->cap_cmds = cap;
  }
  g->cmds[g->n_cmds++] = *cmd;
  return CI_OK;
}

void ci_cuda_record_begin(ci_cuda *cu) {
  ci_cuda_graphs *g = cu->graphs;
  if (!g || !g->enabled) return;
  g->recording = 1;
  g->n_cmds = 0;
  g->staged_from = g->staged_to = cu->ring.used;
  cu->converted_x = NULL;
}

int ci_cuda_record_staged(ci_cuda *cu, const void *device, size_t bytes) {
  ci_cuda_graphs *g = cu->graphs;
  if (!g || !g->recording) return 0;
  const size_t end = (size_t)((const uint8_t *)device - cu->ring.device) + bytes;
  if (end > g->staged_to) g->staged_to = end;
  return 1;
}

/* 1 when cmds a, b are a residual add x += y and an RMSNorm of that x, which one kernel runs. */
static int add_then_norm(const ci_cuda_cmd *a, const ci_cuda_cmd *b) {
  return a->kind == CMD_ADD && b->kind == CMD_RMSNORM && b->a.rmsnorm.x == a->a.vec.x &&
         b->a.rmsnorm.rows * b->a.rmsnorm.dim == a->a.vec.n && b->a.rmsnorm.rows > 0 &&
         ci_cuda_add_rmsnorm_fusable(b->a.rmsnorm.out, b->a.rmsnorm.x, b->a.rmsnorm.w, a->a.vec.y,
                                     b->a.rmsnorm.dim);
}

/* 1 when matmul command b multiplies the same input as a (a's output is not that input), so the
 * two can run as parts of one launch. */
static int same_input_matmul(const ci_cuda_cmd *a, const ci_cuda_cmd *b) {
  return a->kind == CMD_MATMUL && b->kind == CMD_MATMUL && b->a.matmul.x == a->a.matmul.x &&
         b->a.matmul.m == a->a.matmul.m && b->a.matmul.k == a->a.matmul.k &&
         b->a.matmul.w.dtype == a->a.matmul.w.dtype &&
         (const float *)a->a.matmul.y != a->a.matmul.x &&
         (const float *)b->a.matmul.y != b->a.matmul.x;
}

/* How many matmul commands from command i run as one launch (1 with the fusions off, and for a
 * command that is no matmul). */
static int matmul_parts(const ci_cuda *cu, int i) {
  const ci_cuda_graphs *g = cu->graphs;
  int parts = 1;
  while (cu->fuse && parts < CI_CUDA_GEMV_MAX_PARTS && i + parts < g->n_cmds &&
         same_input_matmul(&g->cmds[i], &g->cmds[i + parts]))
    parts++;
  return parts;
}

/* 1 when rope commands a, b rotate two disjoint buffers (q, then k) of the same rows with the
 * same positions and table, which one launch runs (overlapping buffers would race in it). */
static int rope_pair(const ci_cuda_cmd *a, const ci_cuda_cmd *b) {
  if (a->kind != CMD_ROPE || b->kind != CMD_ROPE) return 0;
  const ci_rope *ra = &a->a.rope.rope, *rb = &b->a.rope.rope;
  const float *a_end = a->a.rope.x + a->a.rope.n_rows * a->a.rope.n_heads * ra->head_dim;
  const float *b_end = b->a.rope.x + b->a.rope.n_rows * b->a.rope.n_heads * rb->head_dim;
  return (a_end <= b->a.rope.x || b_end <= a->a.rope.x) && a->a.rope.n_rows == b->a.rope.n_rows &&
         a->a.rope.pos == b->a.rope.pos && ra->head_dim == rb->head_dim &&
         ra->rot_dim == rb->rot_dim && ra->traditional == rb->traditional &&
         ra->inv_freq == rb->inv_freq && ra->qk_scale == rb->qk_scale;
}

/* 1 when the stream's graph capture was invalidated (an operation a capture cannot hold). */
static int capture_broken(ci_cuda *cu) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(cu->stream, &status) != cudaSuccess ||
         status == cudaStreamCaptureStatusInvalidated;
}

/* Runs the recorded commands in order, a residual add and the norm after it as one kernel (the
 * same arithmetic as the two), the RoPE of q and of k as one launch, and consecutive matmuls of
 * one input (q, k, v; gate, up) as one launch (each row's arithmetic unchanged). */
static int run_all(ci_cuda *cu) {
  ci_cuda_graphs *g = cu->graphs;
  if (g->staged_to > g->staged_from) { /* the step's staged bytes, in one copy */
    const cudaError_t err =
        cudaMemcpyAsync(cu->ring.device + g->staged_from, cu->ring.host + g->staged_from,
                        g->staged_to - g->staged_from, cudaMemcpyHostToDevice, cu->stream);
    if (err != cudaSuccess) return ci_cuda_fail(cu, err, "staged step data");
  }
  for (int i = 0, last = -1; i <= g->n_cmds; last = i++) {
    if (g->capturing && last >= 0 && capture_broken(cu))
      return ci_fail("CUDA: command %d of the step (kind %d) broke the graph capture", last,
                     (int)g->cmds[last].kind);
    if (i == g->n_cmds) break;
    const ci_cuda_cmd *c = &g->cmds[i];
    if (!cu->fuse) {
      if (ci_cuda_execute(cu, c)) return CI_ERR;
      continue;
    }
    if (i + 1 < g->n_cmds && add_then_norm(c, c + 1)) {
      const ci_cuda_cmd *norm = c + 1;
      const int64_t n = norm->a.rmsnorm.rows * norm->a.rmsnorm.dim;
      cu->converted_x = NULL;
      void *planes = planes_for(cu, n);
      if (ci_cuda_rmsnorm(cu, norm->a.rmsnorm.out, norm->a.rmsnorm.x, norm->a.rmsnorm.w,
                          norm->a.rmsnorm.rows, norm->a.rmsnorm.dim, norm->a.rmsnorm.eps,
                          norm->a.rmsnorm.w_offset, planes, cu->input_planes, c->a.vec.y))
        mark_converted(cu, norm->a.rmsnorm.out, n);
      if (cu->sticky_error) return CI_ERR;
      i++;
      continue;
    }
    if (i + 1 < g->n_cmds && rope_pair(c, c + 1)) {
      cu->converted_x = NULL;
      ci_cuda_rope(cu, c->a.rope.x, c->a.rope.n_heads, c[1].a.rope.x, c[1].a.rope.n_heads,
                   c->a.rope.n_rows, c->a.rope.pos, &c->a.rope.rope);
      if (cu->sticky_error) return CI_ERR;
      i++;
      continue;
    }
    if (c->kind == CMD_MATMUL) {
      const int parts = matmul_parts(cu, i);
      if (ci_cuda_matmul_run(cu, c, parts)) return CI_ERR;
      if (cu->sticky_error) return CI_ERR;
      i += parts - 1;
      continue;
    }
    if (ci_cuda_execute(cu, c)) return CI_ERR;
  }
  return CI_OK;
}

int ci_cuda_record_flush(ci_cuda *cu) {
  ci_cuda_graphs *g = cu->graphs;
  if (!g || !g->recording) return CI_OK;
  g->recording = 0;
  int rc = run_all(cu);
  g->n_cmds = 0;
  g->staged_from = g->staged_to; /* copied */
  return rc;
}

/* FNV-1a over the command list, eight bytes at a time: equal hashes mean the same launches with
 * the same arguments. */
static uint64_t hash_commands(const ci_cuda_cmd *cmds, int n) {
  uint64_t h = 1469598103934665603ull;
  const uint8_t *bytes = (const uint8_t *)cmds;
  const size_t len = (size_t)n * sizeof *cmds;
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    uint64_t word;
    memcpy(&word, bytes + i, 8);
    h = (h ^ word) * 1099511628211ull;
  }
  for (; i < len; i++) h = (h ^ bytes[i]) * 1099511628211ull;
  return h ^ (uint64_t)n;
}

/* Grows the matmul and attention scratch to what every recorded command needs, before a capture
 * fixes the addresses (a later growth drops the captured graphs). */
static int reserve_for(ci_cuda *cu) {
  ci_cuda_graphs *g = cu->graphs;
  size_t need[CI_CUDA_SCRATCH_SLOTS] = {0};
  for (int i = 0, parts; i < g->n_cmds; i += parts) {
    const ci_cuda_cmd *c = &g->cmds[i];
    parts = matmul_parts(cu, i);
    if (c->kind != CMD_MATMUL) continue;
    size_t n[CI_CUDA_SCRATCH_SLOTS];
    ci_cuda_matmul_scratch(cu, c, parts, n);
    for (int s = 0; s < CI_CUDA_SCRATCH_SLOTS; s++) need[s] = n[s] > need[s] ? n[s] : need[s];
  }
  for (int s = 0; s < CI_CUDA_SCRATCH_SLOTS; s++)
    if (need[s] && !ci_cuda_scratch(cu, s, need[s])) return CI_ERR;
  size_t attention = 0; /* per-split states of parallel attention launches */
  for (int i = 0; i < g->n_cmds; i++) {
    const ci_cuda_cmd *c = &g->cmds[i];
    if (c->kind == CMD_ATTENTION && c->a.kv.plan.scratch_bytes > attention)
      attention = c->a.kv.plan.scratch_bytes;
  }
  if (attention && !ci_cuda_scratch(cu, 2, attention)) return CI_ERR;
  return CI_OK;
}

int ci_cuda_record_end(ci_cuda *cu) {
  ci_cuda_graphs *g = cu->graphs;
  if (!g || !g->recording) return CI_OK;
  g->recording = 0;
  if (g->n_cmds == 0) return run_all(cu); /* (its staged bytes, if any) */
  if (reserve_for(cu)) return CI_ERR;
  /* the staged range is part of what a graph replays (its copy node) */
  const uint64_t h = hash_commands(g->cmds, g->n_cmds) ^
                     ((uint64_t)g->staged_from * 0x9e3779b97f4a7c15ull) ^
                     ((uint64_t)g->staged_to * 0xc2b2ae3d27d4eb4full);
  g->clock++;
  for (int i = 0; i < GRAPH_CACHE; i++)
    if (g->graphs[i].exec && g->graphs[i].hash == h) {
      g->graphs[i].last_use = g->clock;
      cu->converted_x = NULL;
      cudaError_t err = cudaGraphLaunch(g->graphs[i].exec, cu->stream);
      return err == cudaSuccess ? CI_OK : ci_cuda_fail(cu, err, "graph launch");
    }
  int seen = 0;
  for (int i = 0; i < SEEN_CACHE && !seen; i++) seen = g->seen[i] == h;
  if (!seen) { /* first sighting: run it, remember it */
    g->seen[g->clock % SEEN_CACHE] = h;
    return run_all(cu);
  }
  /* second sighting: capture, keep, launch */
  cu->converted_x = NULL;
  cudaGraph_t graph = NULL;
  cudaError_t err = cudaStreamBeginCapture(cu->stream, cudaStreamCaptureModeThreadLocal);
  if (err != cudaSuccess) return ci_cuda_fail(cu, err, "graph capture");
  g->capturing = 1;
  int rc = run_all(cu);
  g->capturing = 0;
  err = cudaStreamEndCapture(cu->stream, &graph);
  if (rc || err != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    return rc ? CI_ERR : ci_cuda_fail(cu, err, "graph capture");
  }
  cudaGraphExec_t exec = NULL;
  err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (err != cudaSuccess) return ci_cuda_fail(cu, err, "graph instantiation");
  int slot = 0;
  for (int i = 1; i < GRAPH_CACHE; i++)
    if (!g->graphs[i].exec || g->graphs[i].last_use < g->graphs[slot].last_use) slot = i;
  if (g->graphs[slot].exec) cudaGraphExecDestroy(g->graphs[slot].exec);
  g->graphs[slot].exec = exec;
  g->graphs[slot].hash = h;
  g->graphs[slot].last_use = g->clock;
  err = cudaGraphLaunch(exec, cu->stream);
  return err == cudaSuccess ? CI_OK : ci_cuda_fail(cu, err, "graph launch");
}
