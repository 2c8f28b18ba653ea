/* The CUDA backend's tensor-parallel collectives: each rank (a backend, one host thread) meets
 * the others at the host barriers of base/rank_collective.h and publishes a slot (buffer and two
 * events); the device work is ordered across the ranks' streams by those events, never by host
 * waits on the GPU. all_reduce: every rank sums all ranks' buffers in rank order into its own
 * scratch (one kernel reading its peers' memory: the same device, or peers over NVLink/PCIe),
 * waits until every rank has read every buffer, then copies the sums into its buffer. gather_cols:
 * each rank copies its columns into rank 0's destination. Steps of tensor-parallel ranks run
 * without graph capture (an event of another rank's stream cannot join a capture). */
#include "backend/cuda/cuda_internal.h"

enum { THREADS = 256 };

/* The ranks' buffers, passed by value. */
typedef struct {
  const float *bufs[CI_MAX_RANKS];
} rank_buffers;

/* sums[i] = bufs[0][i] + bufs[1][i] + ... in rank order (the same bits on every rank). */
__global__ static void rank_sum_kernel(rank_buffers in, int world, float *sums, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float sum = in.bufs[0][i];
    for (int r = 1; r < world; r++) sum = __fadd_rn(sum, in.bufs[r][i]);
    sums[i] = sum;
  }
}

/* The rank's events and, once, access to its peers' memory. */
static int prepare(ci_cuda *cu, ci_rank_collective *comm, int rank) {
  cudaSetDevice(cu->device);
  if (ci_cuda_recording(cu))
    return ci_fail("CUDA: a tensor-parallel rank's steps must run without graph capture");
  ci_cuda_rank_slot *slot = &cu->rank_slot;
  if (!slot->ready &&
      (cudaEventCreateWithFlags(&slot->ready, cudaEventDisableTiming) != cudaSuccess ||
       cudaEventCreateWithFlags(&slot->done, cudaEventDisableTiming) != cudaSuccess))
    return ci_cuda_fail(cu, cudaGetLastError(), "collective events");
  (void)comm;
  (void)rank;
  return CI_OK;
}

/* Lets this rank's kernels read the memory of every peer on another device (once). Needs the
 * peers' slots published. */
static int enable_peers(ci_cuda *cu, ci_rank_collective *comm, int rank, ci_cuda *const *peers) {
  if (cu->peer_access_done) return CI_OK;
  const int world = ci_rank_collective_world(comm);
  for (int r = 0; r < world; r++) {
    if (r == rank || peers[r]->device == cu->device) continue;
    int can = 0;
    cudaDeviceCanAccessPeer(&can, cu->device, peers[r]->device);
    if (!can)
      return ci_fail("CUDA: GPU %d cannot read GPU %d's memory (no peer access): tensor "
                     "parallelism needs GPUs that see each other",
                     cu->device, peers[r]->device);
    const cudaError_t err = cudaDeviceEnablePeerAccess(peers[r]->device, 0);
    if (err != cudaSuccess && err != cudaErrorPeerAccessAlreadyEnabled)
      return ci_cuda_fail(cu, err, "peer access");
    cudaGetLastError();
  }
  cu->peer_access_done = 1;
  return CI_OK;
}

int ci_cuda_all_reduce(ci_backend *be, ci_rank_collective *comm, int rank, float *buf, int64_t n) {
  ci_cuda *cu = ci_as_cuda(be);
  const int world = ci_rank_collective_world(comm);
  if (world == 1) return CI_OK;
  if (prepare(cu, comm, rank)) return CI_ERR;
  const size_t bytes = (size_t)n * sizeof(float);
  if (bytes > cu->rank_sums_bytes) {
    if (cu->rank_sums) {
      cudaStreamSynchronize(cu->stream);
      cudaFree(cu->rank_sums);
    }
    cu->rank_sums_bytes = 0;
    cu->rank_sums = (float *)ci_cuda_malloc(cu, bytes);
    if (!cu->rank_sums) {
      ci_rank_collective_abort(comm);
      return CI_ERR;
    }
    cu->rank_sums_bytes = bytes;
  }
  ci_cuda_rank_slot *slot = &cu->rank_slot;
  slot->buf = buf;
  cudaEventRecord(slot->ready, cu->stream); /* this rank's partial product is written */
  ci_rank_collective_publish(comm, rank, cu);
  if (ci_rank_collective_barrier(comm)) return CI_ERR;
  ci_cuda *peers[CI_MAX_RANKS];
  rank_buffers in;
  for (int r = 0; r < world; r++) {
    peers[r] = (ci_cuda *)ci_rank_collective_peer(comm, r);
    in.bufs[r] = peers[r]->rank_slot.buf;
    if (r != rank) cudaStreamWaitEvent(cu->stream, peers[r]->rank_slot.ready, 0);
  }
  if (enable_peers(cu, comm, rank, peers)) {
    ci_rank_collective_abort(comm);
    return CI_ERR;
  }
  int64_t blocks = (n + THREADS - 1) / THREADS;
  if (blocks > 4 * (int64_t)cu->n_sms) blocks = 4 * (int64_t)cu->n_sms;
  rank_sum_kernel<<<(unsigned)(blocks > 0 ? blocks : 1), THREADS, 0, cu->stream>>>(
      in, world, cu->rank_sums, n);
  if (ci_cuda_check_launch(cu, "all-reduce")) {
    ci_rank_collective_abort(comm);
    return CI_ERR;
  }
  cudaEventRecord(slot->done, cu->stream); /* this rank has read every buffer */
  if (ci_rank_collective_barrier(comm)) return CI_ERR;
  for (int r = 0; r < world; r++)
    if (r != rank) cudaStreamWaitEvent(cu->stream, peers[r]->rank_slot.done, 0);
  const cudaError_t err =
      cudaMemcpyAsync(buf, cu->rank_sums, bytes, cudaMemcpyDeviceToDevice, cu->stream);
  if (err != cudaSuccess) {
    ci_rank_collective_abort(comm);
    return ci_cuda_fail(cu, err, "all-reduce copy");
  }
  return CI_OK;
}

int ci_cuda_gather_cols(ci_backend *be, ci_rank_collective *comm, int rank, float *dst,
                        const float *src, int64_t rows, int64_t cols, int64_t col0,
                        int64_t dst_cols) {
  ci_cuda *cu = ci_as_cuda(be);
  const int world = ci_rank_collective_world(comm);
  if (prepare(cu, comm, rank)) return CI_ERR;
  ci_cuda_rank_slot *slot = &cu->rank_slot;
  slot->buf = rank == 0 ? dst : NULL;
  cudaEventRecord(slot->ready, cu->stream); /* rank 0: dst may be written; others: src is */
  ci_rank_collective_publish(comm, rank, cu);
  if (ci_rank_collective_barrier(comm)) return CI_ERR;
  const ci_cuda *first = (const ci_cuda *)ci_rank_collective_peer(comm, 0);
  if (rank != 0) cudaStreamWaitEvent(cu->stream, first->rank_slot.ready, 0);
  const cudaError_t err =
      cudaMemcpy2DAsync(first->rank_slot.buf + col0, (size_t)dst_cols * sizeof(float), src,
                        (size_t)cols * sizeof(float), (size_t)cols * sizeof(float), (size_t)rows,
                        cudaMemcpyDeviceToDevice, cu->stream);
  if (err != cudaSuccess) {
    ci_rank_collective_abort(comm);
    return ci_cuda_fail(cu, err, "logit gather");
  }
  cudaEventRecord(slot->done, cu->stream);
  if (ci_rank_collective_barrier(comm)) return CI_ERR;
  if (rank == 0)
    for (int r = 1; r < world; r++) {
      const ci_cuda *peer = (const ci_cuda *)ci_rank_collective_peer(comm, r);
      cudaStreamWaitEvent(cu->stream, peer->rank_slot.done, 0);
    }
  return CI_OK;
}

void ci_cuda_collective_destroy(ci_cuda *cu) {
  if (cu->rank_slot.ready) cudaEventDestroy(cu->rank_slot.ready);
  if (cu->rank_slot.done) cudaEventDestroy(cu->rank_slot.done);
  if (cu->rank_sums) cudaFree(cu->rank_sums);
  cu->rank_slot.ready = cu->rank_slot.done = NULL;
  cu->rank_sums = NULL;
}
