/* The CUDA backend's op table: device memory, the step (descriptor upload, logits download,
 * errors raised during the step), weights copied to the device at load, and the dispatch of
 * each op to its kernels (cuda_elementwise.cu, cuda_matmul.cu, cuda_attention.cu,
 * cuda_deltanet.cu).
 *
 * Every op enqueues work on one stream and returns without waiting; only download, step_end,
 * MoE routing (whose expert choice the host schedules) and release wait for the GPU. */
#include "backend/cuda/cuda_internal.h"

#include <cuda_profiler_api.h>

extern "C" {
#include "backend/cpu/kernels.h"
#include "tensor/dtype.h"
}

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { RING_BYTES = 8 << 20, RING_ALIGN = 256 };

int ci_cuda_fail(ci_cuda *cu, cudaError_t err, const char *what) {
  if (!cu->sticky_error) {
    cu->sticky_error = 1;
    snprintf(cu->sticky_message, sizeof cu->sticky_message, "CUDA: %s: %s", what,
             cudaGetErrorString(err));
  }
  return ci_fail("CUDA: %s: %s", what, cudaGetErrorString(err));
}

int ci_cuda_check_launch(ci_cuda *cu, const char *what) {
  cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? CI_OK : ci_cuda_fail(cu, err, what);
}

void *ci_cuda_malloc(ci_cuda *cu, size_t bytes) {
  void *p = NULL;
  ci_cuda_bind(cu);
  /* CI_CUDA_READ_SLACK bytes more: the TurboQuant and turbo-v attention copies aligned windows as
   * large as the larger of a KV layer's K and V rows, which may reach past the last row */
  cudaError_t err = cudaMalloc(&p, bytes + CI_CUDA_READ_SLACK);
  if (err != cudaSuccess) {
    cudaGetLastError(); /* clear: an allocation failure is not sticky */
    ci_fail("CUDA: cannot allocate %zu bytes of GPU memory: %s", bytes, cudaGetErrorString(err));
    return NULL;
  }
  cu->allocations++;
  return p;
}

void *ci_cuda_stage_reserve(ci_cuda *cu, size_t bytes, void **host) {
  size_t need = (bytes + RING_ALIGN - 1) / RING_ALIGN * RING_ALIGN;
  if (need > cu->ring.bytes) {
    ci_fail("CUDA: %zu bytes of step data exceed the %zu-byte staging ring", bytes, cu->ring.bytes);
    return NULL;
  }
  if (cu->ring.used + need > cu->ring.bytes) { /* wrap: wait until earlier copies are done */
    if (ci_cuda_record_flush(cu)) return NULL;
    cudaStreamSynchronize(cu->stream);
    cu->ring.used = 0;
  }
  *host = cu->ring.host + cu->ring.used;
  void *device = cu->ring.device + cu->ring.used;
  cu->ring.used += need;
  return device;
}

int ci_cuda_stage_send(ci_cuda *cu, void *device, const void *host, size_t bytes) {
  if (ci_cuda_record_staged(cu, device, bytes)) return CI_OK; /* copied with the step's others */
  ci_cuda_cmd cmd;
  memset(&cmd, 0, sizeof cmd);
  cmd.kind = CMD_MEMCPY;
  cmd.a.memcpy.dst = device;
  cmd.a.memcpy.src = host;
  cmd.a.memcpy.bytes = bytes;
  cmd.a.memcpy.kind = cudaMemcpyHostToDevice;
  return ci_cuda_emit(cu, &cmd);
}

void *ci_cuda_stage(ci_cuda *cu, const void *host, size_t bytes) {
  void *h = NULL, *d = ci_cuda_stage_reserve(cu, bytes, &h);
  if (!d) return NULL;
  memcpy(h, host, bytes);
  return ci_cuda_stage_send(cu, d, h, bytes) ? NULL : d;
}

/* Emits a device-to-device copy. */
static void emit_copy(ci_cuda *cu, void *dst, const void *src, size_t bytes) {
  ci_cuda_cmd cmd;
  memset(&cmd, 0, sizeof cmd);
  cmd.kind = CMD_MEMCPY;
  cmd.a.memcpy.dst = dst;
  cmd.a.memcpy.src = src;
  cmd.a.memcpy.bytes = bytes;
  cmd.a.memcpy.kind = cudaMemcpyDeviceToDevice;
  ci_cuda_emit(cu, &cmd);
}

/* A command of the vector family with its fields. */
static void emit_vec(ci_cuda *cu, ci_cuda_cmd_kind kind, float *x, const float *y, int64_t rows,
                     int64_t cols, int64_t stride, int64_t n, float value) {
  ci_cuda_cmd cmd;
  memset(&cmd, 0, sizeof cmd);
  cmd.kind = kind;
  cmd.a.vec.x = x;
  cmd.a.vec.y = y;
  cmd.a.vec.rows = rows;
  cmd.a.vec.cols = cols;
  cmd.a.vec.stride = stride;
  cmd.a.vec.n = n;
  cmd.a.vec.value = value;
  ci_cuda_emit(cu, &cmd);
}

void *ci_cuda_scratch(ci_cuda *cu, int slot, size_t bytes) {
  if (bytes <= cu->scratch_bytes[slot]) return cu->scratch[slot];
  if (cu->scratch[slot]) {
    cudaStreamSynchronize(cu->stream);
    cudaFree(cu->scratch[slot]);
    cu->scratch[slot] = NULL;
    cu->scratch_bytes[slot] = 0;
  }
  ci_cuda_graphs_invalidate(cu); /* captured graphs hold the old address */
  if (slot == 0) cu->converted_x = NULL;
  cu->scratch[slot] = ci_cuda_malloc(cu, bytes);
  if (cu->scratch[slot]) cu->scratch_bytes[slot] = bytes;
  return cu->scratch[slot];
}

/* ==== Memory ==== */

static void cuda_destroy(ci_backend *be) {
  ci_cuda *cu = ci_as_cuda(be);
  cudaSetDevice(cu->device);
  if (cu->stream) cudaStreamSynchronize(cu->stream);
  ci_cuda_graphs_destroy(cu);
  ci_cuda_collective_destroy(cu);
  ci_cuda_blas_destroy(cu);
  ci_cuda_gemv_destroy(cu);
  for (int i = 0; i < 3; i++)
    if (cu->timing_events[i]) cudaEventDestroy(cu->timing_events[i]);
  for (int i = 0; i < cu->n_weights; i++) cudaFree(cu->weights[i]);
  free(cu->weights);
  for (int i = 0; i < CI_CUDA_SCRATCH_SLOTS; i++)
    if (cu->scratch[i]) cudaFree(cu->scratch[i]);
  if (cu->ring.device) cudaFree(cu->ring.device);
  if (cu->ring.host) cudaFreeHost(cu->ring.host);
  if (cu->host_scores) cudaFreeHost(cu->host_scores);
  if (cu->error_flag) cudaFreeHost(cu->error_flag);
  if (cu->stream) cudaStreamDestroy(cu->stream);
  free(cu);
}

static void *cuda_alloc_uninitialized(ci_backend *be, size_t bytes) {
  return ci_cuda_malloc(ci_as_cuda(be), bytes);
}

static void *cuda_alloc(ci_backend *be, size_t bytes) {
  ci_cuda *cu = ci_as_cuda(be);
  void *p = ci_cuda_malloc(cu, bytes);
  if (p && cudaMemsetAsync(p, 0, bytes, cu->stream) != cudaSuccess) {
    cudaFree(p);
    ci_fail("CUDA: cannot clear %zu bytes", bytes);
    return NULL;
  }
  return p;
}

static void cuda_release(ci_backend *be, void *ptr) {
  if (!ptr) return;
  ci_cuda *cu = ci_as_cuda(be);
  ci_cuda_bind(cu);
  cu->converted_x = NULL;
  cudaStreamSynchronize(cu->stream);
  cudaFree(ptr);
}

static void cuda_copy_bytes(ci_backend *be, void *dst, const void *src, size_t bytes) {
  ci_cuda_bind(ci_as_cuda(be));
  emit_copy(ci_as_cuda(be), dst, src, bytes);
}

static void cuda_upload(ci_backend *be, void *dst, const void *host_src, size_t bytes) {
  ci_cuda *cu = ci_as_cuda(be);
  ci_cuda_bind(cu);
  cu->converted_x = NULL;
  /* at once even while a step records: uploads (the step descriptor, block-table changes) come
   * before the step's work on the stream, and keeping them out of the recorded list keeps the
   * lists of consecutive decode steps equal. From pageable memory the copy is staged before the
   * call returns, so host_src may change */
  cudaError_t err = cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, cu->stream);
  if (err != cudaSuccess) ci_cuda_fail(cu, err, "upload");
}

static void cuda_download(ci_backend *be, void *host_dst, const void *src, size_t bytes) {
  ci_cuda *cu = ci_as_cuda(be);
  ci_cuda_bind(cu);
  if (ci_cuda_record_flush(cu)) return;
  cudaError_t err = cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, cu->stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(cu->stream);
  if (err != cudaSuccess) ci_cuda_fail(cu, err, "download");
}

static void cuda_fill(ci_backend *be, float *x, float value, int64_t n) {
  emit_vec(ci_as_cuda(be), CMD_FILL, x, NULL, 0, 0, 0, n, value);
}

static int64_t cuda_allocation_count(ci_backend *be) {
  return ci_as_cuda(be)->allocations;
}

static int cuda_reserve_scratch(ci_backend *be, int64_t max_rows, int64_t max_k, int max_heads,
                                int max_head_dim) {
  ci_cuda *cu = ci_as_cuda(be);
  /* matmul inputs in half precision: two planes (hi, lo) of every row; the products of both
   * planes grow on first use with the widest weight */
  size_t bytes = (size_t)(max_rows + 1) * (size_t)max_k * 2 * sizeof(uint16_t);
  return ci_cuda_scratch(cu, 0, bytes) ? CI_OK : CI_ERR;
}

void *ci_cuda_alloc_weight(ci_cuda *cu, size_t bytes) {
  if (cu->n_weights == cu->cap_weights) {
    int cap = cu->cap_weights ? 2 * cu->cap_weights : 256;
    void **grown = (void **)realloc(cu->weights, (size_t)cap * sizeof *grown);
    if (!grown) {
      ci_fail("out of memory");
      return NULL;
    }
    cu->weights = grown;
    cu->cap_weights = cap;
  }
  void *d = ci_cuda_malloc(cu, bytes);
  if (d) cu->weights[cu->n_weights++] = d;
  return d;
}

void *ci_cuda_upload_weight(ci_cuda *cu, const void *host, size_t bytes) {
  void *d = ci_cuda_alloc_weight(cu, bytes);
  if (!d) return NULL;
  /* on the backend's stream, waited for: the legacy stream's cudaMemcpy may return before its
   * DMA lands and is not ordered before the kernels of a non-blocking stream */
  cudaError_t err = cudaMemcpyAsync(d, host, bytes, cudaMemcpyHostToDevice, cu->stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(cu->stream);
  if (err != cudaSuccess) {
    ci_cuda_fail(cu, err, "weight upload");
    return NULL; /* freed at destroy */
  }
  return d;
}

/* Copies a weight's arrays to the device; the backend owns the copies until destroy. */
static int cuda_prepare_weight(ci_backend *be, ci_tensor *t) {
  ci_cuda *cu = ci_as_cuda(be);
  if (ci_dtype_is_affine(t->dtype)) return ci_cuda_affine_upload(cu, t);
  if (t->dtype != CI_F32 && t->dtype != CI_F16 && t->dtype != CI_BF16)
    return ci_fail("the CUDA backend cannot run %s weights", ci_dtype_get(t->dtype)->name);
  void *d =
      ci_cuda_upload_weight(cu, t->data, ci_dtype_bytes(t->dtype, (size_t)ci_tensor_numel(t)));
  if (!d) return CI_ERR;
  t->data = d;
  return CI_OK;
}

static int cuda_pin_host(ci_backend *be, void *host, size_t bytes) {
  (void)be;
  cudaError_t err = cudaHostRegister(host, bytes, cudaHostRegisterDefault);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return ci_fail("CUDA: cannot pin %zu bytes of host memory: %s", bytes, cudaGetErrorString(err));
  }
  return CI_OK;
}

static void cuda_unpin_host(ci_backend *be, void *host) {
  (void)be;
  if (cudaHostUnregister(host) != cudaSuccess) cudaGetLastError();
}

/* ==== Steps ==== */

static int cuda_step_begin(ci_backend *be, void *desc, const void *host_desc, size_t bytes) {
  ci_cuda *cu = ci_as_cuda(be);
  ci_cuda_bind(cu);
  if (cu->sticky_error) return ci_fail("%s", cu->sticky_message);
  cudaError_t err = cudaMemcpyAsync(desc, host_desc, bytes, cudaMemcpyHostToDevice, cu->stream);
  if (err != cudaSuccess) return ci_cuda_fail(cu, err, "step descriptor upload");
  if (cu->timing) cu->step_started = ci_now_seconds();
  ci_cuda_record_begin(cu);
  return CI_OK;
}

static int cuda_step_end(ci_backend *be, const ci_download *downloads, int n_downloads) {
  ci_cuda *cu = ci_as_cuda(be);
  ci_cuda_bind(cu);
  cudaError_t err = cudaSuccess;
  const int timing = cu->timing;
  if (timing) cudaEventRecord(cu->timing_events[0], cu->stream);
  if (ci_cuda_record_end(cu)) { /* ci_last_error names what failed */
    cudaStreamSynchronize(cu->stream);
    cu->ring.used = 0;
    return CI_ERR;
  }
  const double launched = timing ? ci_now_seconds() : 0.0;
  if (timing) cudaEventRecord(cu->timing_events[1], cu->stream);
  for (int i = 0; i < n_downloads && err == cudaSuccess; i++)
    if (downloads[i].host && downloads[i].device && downloads[i].bytes)
      err = cudaMemcpyAsync(downloads[i].host, downloads[i].device, downloads[i].bytes,
                            cudaMemcpyDeviceToHost, cu->stream);
  if (timing) cudaEventRecord(cu->timing_events[2], cu->stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(cu->stream);
  if (timing && err == cudaSuccess) {
    float gpu_ms = 0.0f, download_ms = 0.0f;
    cudaEventElapsedTime(&gpu_ms, cu->timing_events[0], cu->timing_events[2]);
    cudaEventElapsedTime(&download_ms, cu->timing_events[1], cu->timing_events[2]);
    cu->times.steps++;
    cu->times.host_build_s += launched - cu->step_started;
    cu->times.gpu_s += 1e-3 * gpu_ms;
    cu->times.download_s += 1e-3 * download_ms;
    cu->times.wall_s += ci_now_seconds() - cu->step_started;
  }
  if (err == cudaSuccess) err = cudaGetLastError();
  cu->ring.used = 0;
  if (err != cudaSuccess) return ci_cuda_fail(cu, err, "step");
  if (cu->sticky_error) return ci_fail("%s", cu->sticky_message);
  if (*cu->error_flag) {
    int code = *cu->error_flag;
    *cu->error_flag = 0;
    return ci_fail("CUDA: a kernel met invalid step data (code %d: a KV position without a "
                   "block)",
                   code);
  }
  return CI_OK;
}

/* ==== Ops ==== */

/* The device description of a prepared weight. */
static ci_cuda_weight device_weight(const ci_tensor *t) {
  ci_cuda_weight w;
  memset(&w, 0, sizeof w);
  w.data = t->data;
  w.dtype = (int)t->dtype;
  if (ci_dtype_is_affine(t->dtype)) {
    w.pairs = t->scales; /* packed by ci_cuda_affine_upload */
    w.group_size = t->group_size;
    w.f16_pairs = t->scale_dtype == CI_F16;
  }
  return w;
}

static int cuda_matmul(ci_backend *be, const ci_tensor *w, const float *x, int64_t m, float *y,
                       const ci_row_segments *segments) {
  (void)segments; /* every path computes a row alike for any m (cuda_gemv.cu) */
  if (m <= 0) return CI_OK;
  ci_cuda_cmd cmd;
  memset(&cmd, 0, sizeof cmd);
  cmd.kind = CMD_MATMUL;
  cmd.a.matmul.w = device_weight(w);
  cmd.a.matmul.n = w->shape[w->ndim - 2];
  cmd.a.matmul.k = w->shape[w->ndim - 1];
  cmd.a.matmul.m = m;
  cmd.a.matmul.x = x;
  cmd.a.matmul.y = y;
  return ci_cuda_emit(ci_as_cuda(be), &cmd);
}

static int cuda_embed(ci_backend *be, const ci_tensor *table, const int32_t *ids, int64_t n,
                      float *out) {
  if (n <= 0) return CI_OK;
  ci_cuda_cmd cmd;
  memset(&cmd, 0, sizeof cmd);
  cmd.kind = CMD_EMBED;
  cmd.a.embed.table = device_weight(table);
  cmd.a.embed.dim = table->shape[1];
  cmd.a.embed.ids = ids;
  cmd.a.embed.n = n;
  cmd.a.embed.out = out;
  return ci_cuda_emit(ci_as_cuda(be), &cmd);
}

static void cuda_rmsnorm(ci_backend *be, float *out, const float *x, const float *w, int64_t n_rows,
                         int64_t dim, float eps, float w_offset) {
  ci_cuda_cmd cmd;
  memset(&cmd, 0, sizeof cmd);
  cmd.kind = CMD_RMSNORM;
  cmd.a.rmsnorm.out = out;
  cmd.a.rmsnorm.x = x;
  cmd.a.rmsnorm.w = w;
  cmd.a.rmsnorm.rows = n_rows;
  cmd.a.rmsnorm.dim = dim;
  cmd.a.rmsnorm.eps = eps;
  cmd.a.rmsnorm.w_offset = w_offset;
  ci_cuda_emit(ci_as_cuda(be), &cmd);
}

static void cuda_add_bias(ci_backend *be, float *x, const float *bias, int64_t rows, int64_t cols) {
  emit_vec(ci_as_cuda(be), CMD_ADD_BIAS, x, bias, rows, cols, 0, rows * cols, 0.0f);
}

static void cuda_add(ci_backend *be, float *x, const float *y, int64_t n) {
  emit_vec(ci_as_cuda(be), CMD_ADD, x, y, 0, 0, 0, n, 0.0f);
}

static void cuda_silu_mul(ci_backend *be, float *gate, const float *up, int64_t n) {
  emit_vec(ci_as_cuda(be), CMD_SILU_MUL, gate, up, 0, 0, 0, n, 0.0f);
}

static void cuda_gelu_tanh_mul(ci_backend *be, float *gate, const float *up, int64_t rows,
                               int64_t cols, int64_t up_stride) {
  emit_vec(ci_as_cuda(be), CMD_GELU_MUL, gate, up, rows, cols, up_stride, rows * cols, 0.0f);
}

static void cuda_scale(ci_backend *be, float *x, float s, int64_t n) {
  emit_vec(ci_as_cuda(be), CMD_SCALE, x, NULL, 0, 0, 0, n, s);
}

static void cuda_pick_rows(ci_backend *be, ci_row_pick *picks, const float *logits, int64_t rows,
                           int64_t vocab) {
  ci_cuda_cmd cmd;
  memset(&cmd, 0, sizeof cmd);
  cmd.kind = CMD_PICK_ROWS;
  cmd.a.pick.picks = picks;
  cmd.a.pick.logits = logits;
  cmd.a.pick.rows = rows;
  cmd.a.pick.vocab = vocab;
  ci_cuda_emit(ci_as_cuda(be), &cmd);
}

static void cuda_softcap(ci_backend *be, float *x, float cap, int64_t n) {
  emit_vec(ci_as_cuda(be), CMD_SOFTCAP, x, NULL, 0, 0, 0, n, cap);
}

static void cuda_copy(ci_backend *be, float *dst, const float *src, int64_t n) {
  if (n > 0) emit_copy(ci_as_cuda(be), dst, src, (size_t)n * sizeof(float));
}

static void emit_rows(ci_cuda *cu, ci_cuda_cmd_kind kind, float *dst, const float *src,
                      const int32_t *rows, const float *weights, int64_t m, int64_t dim) {
  ci_cuda_cmd cmd;
  memset(&cmd, 0, sizeof cmd);
  cmd.kind = kind;
  cmd.a.rows.dst = dst;
  cmd.a.rows.src = src;
  cmd.a.rows.rows = rows;
  cmd.a.rows.weights = weights;
  cmd.a.rows.m = m;
  cmd.a.rows.dim = dim;
  ci_cuda_emit(cu, &cmd);
}

static void cuda_gather_rows(ci_backend *be, float *dst, const float *src, const int32_t *rows,
                             int64_t m, int64_t dim) {
  ci_cuda *cu = ci_as_cuda(be);
  if (m <= 0) return;
  const int32_t *rows_dev = (const int32_t *)ci_cuda_stage(cu, rows, (size_t)m * sizeof *rows);
  if (rows_dev) emit_rows(cu, CMD_GATHER, dst, src, rows_dev, NULL, m, dim);
}

static void cuda_scatter_add_rows(ci_backend *be, float *dst, const float *src, const int32_t *rows,
                                  const float *weights, int64_t m, int64_t dim) {
  ci_cuda *cu = ci_as_cuda(be);
  if (m <= 0) return;
  const int32_t *rows_dev = (const int32_t *)ci_cuda_stage(cu, rows, (size_t)m * sizeof *rows);
  const float *weights_dev = (const float *)ci_cuda_stage(cu, weights, (size_t)m * sizeof *weights);
  if (rows_dev && weights_dev) emit_rows(cu, CMD_SCATTER, dst, src, rows_dev, weights_dev, m, dim);
}

/* MoE routing: the host schedules experts, so the router scores come to the host (the step's
 * one wait per MoE layer) and the CPU routing rule runs on them. */
static void cuda_moe_route(ci_backend *be, const float *scores, int64_t n, int n_experts, int top_k,
                           const float *expert_scale, int32_t *expert_ids, float *expert_weights) {
  ci_cuda *cu = ci_as_cuda(be);
  size_t bytes = ((size_t)n + 1) * (size_t)n_experts * sizeof(float);
  if (bytes > cu->host_scores_bytes) {
    if (cu->host_scores) cudaFreeHost(cu->host_scores);
    cu->host_scores = NULL;
    cu->host_scores_bytes = 0;
    cudaError_t err = cudaMallocHost((void **)&cu->host_scores, bytes);
    if (err != cudaSuccess) {
      ci_cuda_fail(cu, err, "MoE score buffer");
      return;
    }
    cu->allocations++;
    cu->host_scores_bytes = bytes;
  }
  if (ci_cuda_record_flush(cu)) return; /* the host needs the scores now */
  float *host_scale = cu->host_scores + (size_t)n * n_experts;
  cudaMemcpyAsync(cu->host_scores, scores, (size_t)n * n_experts * sizeof(float),
                  cudaMemcpyDeviceToHost, cu->stream);
  if (expert_scale)
    cudaMemcpyAsync(host_scale, expert_scale, (size_t)n_experts * sizeof(float),
                    cudaMemcpyDeviceToHost, cu->stream);
  cudaError_t err = cudaStreamSynchronize(cu->stream);
  if (err != cudaSuccess) {
    ci_cuda_fail(cu, err, "MoE routing");
    return;
  }
  ci_cpu_moe_route(NULL, cu->host_scores, n, n_experts, top_k, expert_scale ? host_scale : NULL,
                   expert_ids, expert_weights);
}

static void cuda_rope(ci_backend *be, float *x, int64_t n_rows, int n_heads, const int32_t *pos,
                      const ci_rope *rope) {
  ci_cuda_cmd cmd;
  memset(&cmd, 0, sizeof cmd);
  cmd.kind = CMD_ROPE;
  cmd.a.rope.x = x;
  cmd.a.rope.n_rows = n_rows;
  cmd.a.rope.n_heads = n_heads;
  cmd.a.rope.pos = pos;
  cmd.a.rope.rope = *rope;
  ci_cuda_emit(ci_as_cuda(be), &cmd);
}

static int cuda_kv_store(ci_backend *be, const ci_step_kv *seqs, const float *k, const float *v,
                         const int32_t *pos) {
  return ci_cuda_kv_store(ci_as_cuda(be), seqs, k, v, pos);
}

static int cuda_kv_convert_block(ci_backend *be, const ci_paged_kv *src, int32_t src_block,
                                 const ci_paged_kv *dst, int32_t dst_block, int live_tokens) {
  ci_cuda_bind(ci_as_cuda(be));
  if (ci_cuda_record_flush(ci_as_cuda(be))) return CI_ERR;
  return ci_cuda_kv_convert_block(ci_as_cuda(be), src, src_block, dst, dst_block, live_tokens);
}

static int cuda_attention(ci_backend *be, const ci_attention_args *args) {
  return ci_cuda_attention(ci_as_cuda(be), args);
}

static void cuda_sigmoid_mul(ci_backend *be, float *x, const float *gate, int64_t n) {
  ci_cuda_sigmoid_mul(ci_as_cuda(be), x, gate, n);
}

static int cuda_gated_deltanet(ci_backend *be, const ci_deltanet_args *args) {
  return ci_cuda_gated_deltanet(ci_as_cuda(be), args);
}

static ci_backend_ops make_ops(void) {
  ci_backend_ops ops;
  memset(&ops, 0, sizeof ops);
  ops.name = "cuda";
  ops.destroy = cuda_destroy;
  ops.alloc = cuda_alloc;
  ops.alloc_uninitialized = cuda_alloc_uninitialized;
  ops.release = cuda_release;
  ops.copy_bytes = cuda_copy_bytes;
  ops.upload = cuda_upload;
  ops.download = cuda_download;
  ops.fill = cuda_fill;
  ops.step_begin = cuda_step_begin;
  ops.step_end = cuda_step_end;
  ops.allocation_count = cuda_allocation_count;
  ops.reserve_scratch = cuda_reserve_scratch;
  ops.prepare_weight = cuda_prepare_weight;
  ops.pin_host = cuda_pin_host;
  ops.unpin_host = cuda_unpin_host;
  ops.matmul = cuda_matmul;
  ops.embed = cuda_embed;
  ops.rmsnorm = cuda_rmsnorm;
  ops.add_bias = cuda_add_bias;
  ops.add = cuda_add;
  ops.silu_mul = cuda_silu_mul;
  ops.gelu_tanh_mul = cuda_gelu_tanh_mul;
  ops.scale = cuda_scale;
  ops.softcap = cuda_softcap;
  ops.pick_rows = cuda_pick_rows;
  ops.copy = cuda_copy;
  ops.gather_rows = cuda_gather_rows;
  ops.scatter_add_rows = cuda_scatter_add_rows;
  ops.moe_route = cuda_moe_route;
  ops.rope = cuda_rope;
  ops.kv_store = cuda_kv_store;
  ops.kv_convert_block = cuda_kv_convert_block;
  ops.attention = cuda_attention;
  ops.sigmoid_mul = cuda_sigmoid_mul;
  ops.gated_deltanet = cuda_gated_deltanet;
  ops.all_reduce = ci_cuda_all_reduce;
  ops.gather_cols = ci_cuda_gather_cols;
  return ops;
}

static const ci_backend_ops cuda_ops = make_ops();

extern "C" int ci_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

extern "C" void ci_cuda_profile_range(int on) {
  if (on)
    cudaProfilerStart();
  else
    cudaProfilerStop();
}

extern "C" void ci_cuda_step_timing(ci_backend *be, int on, ci_cuda_step_times *out) {
  ci_cuda *cu = ci_as_cuda(be);
  if (on && !cu->timing)
    for (int i = 0; i < 3; i++)
      if (!cu->timing_events[i] && cudaEventCreate(&cu->timing_events[i]) != cudaSuccess) return;
  cu->timing = on;
  if (out) *out = cu->times;
  memset(&cu->times, 0, sizeof cu->times);
}

extern "C" void ci_cuda_set_input_planes(ci_backend *be, int planes) {
  ci_as_cuda(be)->input_planes = planes == 1 ? 1 : 2;
}

extern "C" void ci_cuda_set_batch_rows(ci_backend *be, int rows) {
  ci_as_cuda(be)->batch_rows = rows < 0 ? 0 : rows;
}

extern "C" int ci_cuda_device_memory(int gpu, size_t *free_bytes, size_t *total_bytes) {
  int count = ci_cuda_device_count();
  if (count == 0) return ci_fail("cannot read GPU memory: no CUDA GPU is visible");
  if (gpu < 0 || gpu >= count) return ci_fail("GPU %d: this machine has %d", gpu, count);
  cudaError_t err = cudaSetDevice(gpu);
  if (err == cudaSuccess) err = cudaMemGetInfo(free_bytes, total_bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return ci_fail("cannot read GPU %d's memory: %s", gpu, cudaGetErrorString(err));
  }
  return CI_OK;
}

extern "C" int ci_cuda_memory_info(ci_backend *be, size_t *free_bytes, size_t *total_bytes) {
  ci_cuda *cu = ci_as_cuda(be);
  cudaSetDevice(cu->device);
  cudaError_t err = cudaMemGetInfo(free_bytes, total_bytes);
  return err == cudaSuccess ? CI_OK : ci_cuda_fail(cu, err, "memory info");
}

extern "C" ci_backend *ci_cuda_backend_create(int gpu, int n_threads) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    cudaGetLastError();
    ci_fail("--device cuda: no CUDA GPU is visible (%s)",
            err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return NULL;
  }
  if (gpu < 0 || gpu >= count) {
    ci_fail("--gpu %d: this machine has %d CUDA GPU%s (0..%d)", gpu, count, count == 1 ? "" : "s",
            count - 1);
    return NULL;
  }
  ci_cuda *cu = (ci_cuda *)calloc(1, sizeof *cu);
  if (!cu) {
    ci_fail("out of memory");
    return NULL;
  }
  cu->base.ops = &cuda_ops;
  cu->base.host_visible = 0;
  cu->device = gpu;
  cu->bind_threads = count > 1;
  cu->input_planes = 2;
  (void)n_threads; /* every op runs on the GPU; MoE routing's host part is one thread */
  int ok = (err = cudaSetDevice(gpu)) == cudaSuccess &&
           (err = cudaStreamCreateWithFlags(&cu->stream, cudaStreamNonBlocking)) == cudaSuccess &&
           (err = cudaHostAlloc((void **)&cu->error_flag, sizeof(int), cudaHostAllocMapped)) ==
               cudaSuccess &&
           (err = cudaMallocHost((void **)&cu->ring.host, RING_BYTES)) == cudaSuccess;
  if (!ok) {
    ci_fail("CUDA: cannot start GPU %d: %s", gpu, cudaGetErrorString(err));
    cuda_destroy(&cu->base);
    return NULL;
  }
  *cu->error_flag = 0;
  cu->ring.bytes = RING_BYTES;
  cu->ring.device = (uint8_t *)ci_cuda_malloc(cu, RING_BYTES);
  if (!cu->ring.device || ci_cuda_blas_create(cu) || ci_cuda_graphs_create(cu) ||
      ci_cuda_flash_init(cu) || ci_cuda_gemv_init(cu) || ci_cuda_batch_gemm_init(cu)) {
    cuda_destroy(&cu->base);
    return NULL;
  }
  if (cudaDeviceGetAttribute(&cu->n_sms, cudaDevAttrMultiProcessorCount, gpu) != cudaSuccess)
    cu->n_sms = 1;
  /* CINFER_CUDA_FUSE=0: every recorded command its own launch (cuda_graph.cu) */
  const char *fuse_env = getenv("CINFER_CUDA_FUSE");
  cu->fuse = !(fuse_env && strcmp(fuse_env, "0") == 0);
  /* programmatic dependent launch needs compute capability 9.0; CINFER_CUDA_PDL=0 turns it off */
  int major = 0;
  const char *pdl_env = getenv("CINFER_CUDA_PDL");
  cu->pdl = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, gpu) == cudaSuccess &&
            major >= 9 && !(pdl_env && strcmp(pdl_env, "0") == 0);
  return &cu->base;
}
