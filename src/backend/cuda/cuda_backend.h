/* The CUDA backend: implements the op table of tensor/backend.h on one NVIDIA GPU (bf16, f16
 * and f32 weights; every KV codec). Built only when nvcc is present (CINFER_CUDA). */
#ifndef CI_BACKEND_CUDA_CUDA_BACKEND_H
#define CI_BACKEND_CUDA_CUDA_BACKEND_H

#include "tensor/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of CUDA GPUs this process sees (0 when there is no driver or no GPU). */
int ci_cuda_device_count(void);

/* Creates a backend on GPU `gpu` (an ordinal below ci_cuda_device_count()); n_threads is
 * accepted for the host work a GPU backend may keep (unused now: every op runs on the GPU). Returns
 * NULL with ci_last_error naming the cause (no GPU, an ordinal out of range, cuBLASLt missing).
 * Free with be->ops->destroy(be). */
ci_backend *ci_cuda_backend_create(int gpu, int n_threads);

/* How matmul inputs (f32 activations) meet half-precision weights: 2 (the default) splits each
 * input into a bf16 value and its bf16 remainder, both multiplied in one product (about 16 of
 * f32's 24 mantissa bits, logits within ~1e-3 of an f32 reference); 1 rounds inputs to bf16 (half
 * the tensor-core work for prefill; logits move by ~1e-1 on small random models). */
void ci_cuda_set_input_planes(ci_backend *be, int planes);

/* The most input rows (planes x rows) a product of affine weights runs in the batch kernel
 * (cuda_batch_gemm.cu; default 128; 0: above the small-batch kernel's rows every product
 * dequantises the weights to bf16 for cuBLASLt). Results are the same bits either way; tests
 * compare the two. */
void ci_cuda_set_batch_rows(ci_backend *be, int rows);

/* Turns the replay of repeated steps as CUDA graphs on (the default) or off; results are the
 * same either way. */
void ci_cuda_set_graphs(ci_backend *be, int enabled);

/* Starts (on = 1) or stops the range a profiler started with --profile-from-start off records
 * (cudaProfilerStart/Stop): benchmarks mark the steps worth profiling with it. */
void ci_cuda_profile_range(int on);

/* Where the steps' time goes, summed over the steps since the last call: host seconds from
 * step_begin to the step's launch (recording the ops, hashing the list, launching it), GPU seconds
 * from that launch to the end of the logits download (of which the download), and host seconds
 * from step_begin to step_end's return. */
typedef struct {
  int64_t steps;
  double host_build_s, gpu_s, download_s, wall_s;
} ci_cuda_step_times;

/* Turns the step timing on (on = 1: two CUDA events and a clock read per step) or off, and moves
 * the sums so far into *out (may be NULL), starting them again from zero. */
void ci_cuda_step_timing(ci_backend *be, int on, ci_cuda_step_times *out);

/* Bytes of memory free and in total on GPU `gpu`, without starting a backend. Returns CI_OK, or
 * CI_ERR naming why (no GPU, an ordinal out of range). */
int ci_cuda_device_memory(int gpu, size_t *free_bytes, size_t *total_bytes);

/* Bytes of device memory free and in total on the backend's GPU. */
int ci_cuda_memory_info(ci_backend *be, size_t *free_bytes, size_t *total_bytes);

/* The GPU's KV row encoder and decoder (kv_store, kv_convert_block) run on the host: the same
 * codec code the kernels compile, for tests on machines without a GPU (the kernels differ only in
 * rounding each operation explicitly). Arguments as ci_kv_encode_row / ci_kv_decode_row; D at
 * most 512. Returns CI_OK, or CI_ERR naming a format or D the GPU does not run. */
int ci_cuda_kv_encode_row_host(const ci_kv_format *f, int value, const float *signs, const float *x,
                               int head_dim, void *row);
int ci_cuda_kv_decode_row_host(const ci_kv_format *f, int value, const float *signs,
                               const void *row, int head_dim, float *x);

/* The GPU's layout of MLX affine codes (cuda_affine.cuh), on the host for tests: the bytes of an
 * [n, k] matrix of `bits`-bit codes in it, word i of it gathered from MLX's row-major codes
 * `raw`, and the byte offset of code (r, c) in it (*shift: the code's bit shift in that byte). */
size_t ci_cuda_affine_code_bytes_host(int64_t n, int64_t k, int bits);
uint32_t ci_cuda_affine_repacked_word_host(const uint8_t *raw, int bits, int64_t n, int64_t k,
                                           int64_t i);
int64_t ci_cuda_affine_code_offset_host(int bits, int64_t k, int64_t r, int64_t c, int *shift);

/* Where products with an [n, k] matrix of weight dtype `dtype` (ci_dtype) cut K under the
 * default rule (cuda_internal.h, ci_cuda_k_segment): the columns of every segment but the last,
 * k when the rows stay one chain. On the host, for tests without a GPU. */
int64_t ci_cuda_k_segment_host(int dtype, int64_t n, int64_t k);

/* The small-batch kernel's stage shapes for affine weights: columns x depth. */
enum { CI_CUDA_GEMV_512x3, CI_CUDA_GEMV_256x4, CI_CUDA_GEMV_256x3 };

/* The stage shape the small-batch kernel streams a product of `units` (row group, segment) units
 * of an affine weight (dtype CI_Q8 or CI_Q4, groups of `group`) times x_rows input rows (up to 8)
 * in, on a GPU of n_sms SMs with smem_per_sm bytes of shared memory each (cuda_gemv.cu). On the
 * host, for tests without a GPU. */
int ci_cuda_gemv_shape_host(int dtype, int64_t units, int64_t x_rows, int group, int n_sms,
                            int smem_per_sm);

#ifdef __cplusplus
}
#endif

#endif
