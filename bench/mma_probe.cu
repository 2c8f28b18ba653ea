/* Microbenchmark of the tensor-core instructions behind the small-batch matmul
 * (src/backend/cuda/cuda_gemv.cu): cycles per dependent mma.sync m16n8k16 (bf16, f32 accumulate)
 * in one warp, with 1, 2 or 4 independent chains; cycles per k-step of a wgmma m64n8k16 chain on
 * one accumulator (A and B from shared memory), waiting after each or issued in groups; and
 * whether a wgmma chain over K gives the same bits as the mma.sync chain (64 x 8 outputs,
 * K = 4096, random bf16). bench/cuda.md cites its figures (H200: 24.8 / 25.3 / 26.0 cycles,
 * wgmma 49.3 waiting, 20.0 in groups of 32, 512/512 bit-equal).
 *
 * Build and run on the GPU machine, from the repository root:
 *   nvcc -O3 --generate-code=arch=compute_90a,code=[sm_90a] -o build/mma_probe bench/mma_probe.cu
 *   build/mma_probe */
#include "../src/backend/cuda/cuda_mma.cuh"

#include <cuda_bf16.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#define CK(x)                                                                                      \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__);                                 \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

__device__ static inline uint64_t desc_of(const void *smem, int lbo, int sbo) {
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
  return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16) |
         ((uint64_t)((sbo >> 4) & 0x3FFF) << 32);
}
__device__ static inline void wg_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ static inline void wg_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ static inline void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ static inline void proxy_fence() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// m64n8k16, A and B from smem
__device__ static inline void wg_n8_ss(float d[4], uint64_t da, uint64_t db, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, %4, %5, p, 1, "
               "1, 0, 0;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "l"(da), "l"(db), "r"(scale_d));
}
// m64n16k16 A, B smem (8 regs)
__device__ static inline void wg_n16_ss(float d[8], uint64_t da, uint64_t db, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, "
               "%8, %9, p, 1, 1, 0, 0;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                 "+f"(d[7])
               : "l"(da), "l"(db), "r"(scale_d));
}

/* ---- latency: dependent mma.sync ---- */
template <int CH> __global__ void k_mma_lat(int steps, long long *cyc, float *out) {
  uint32_t a[4] = {0x3f803f80u, 0x3f803f80u, 0x3f803f80u, (uint32_t)threadIdx.x};
  float c[CH][4] = {};
  __syncwarp();
  long long t0 = clock64();
  for (int s = 0; s < steps; s++) {
#pragma unroll
    for (int j = 0; j < CH; j++) mma_bf16(c[j], a, 0x3f803f80u, 0u);
  }
  long long t1 = clock64();
  float acc = 0;
#pragma unroll
  for (int j = 0; j < CH; j++) acc += c[j][0] + c[j][3];
  out[threadIdx.x] = acc;
  if (threadIdx.x == 0) *cyc = t1 - t0;
}

/* ---- latency: wgmma chain, A,B from smem ---- */
template <int N, int GROUP> __global__ void k_wg_lat(int steps, long long *cyc, float *out) {
  __shared__ __align__(128) __nv_bfloat16 sa[64 * 16];
  __shared__ __align__(128) __nv_bfloat16 sb[64 * 16];
  for (int i = threadIdx.x; i < 64 * 16; i += blockDim.x) {
    sa[i] = __float2bfloat16(0.001f * (i % 7));
    sb[i] = __float2bfloat16(0.001f * (i % 5));
  }
  proxy_fence();
  __syncthreads();
  const uint64_t da = desc_of(sa, 1024, 128), db = desc_of(sb, N * 16, 128);
  float d[N / 2] = {};
  wg_fence();
  long long t0 = clock64();
  for (int s = 0; s < steps; s += GROUP) {
#pragma unroll
    for (int g = 0; g < GROUP; g++) {
      if (N == 8)
        wg_n8_ss(d, da, db, 1);
      else
        wg_n16_ss(d, da, db, 1);
    }
    wg_commit();
    wg_wait<0>();
  }
  long long t1 = clock64();
  float acc = 0;
  for (int j = 0; j < N / 2; j++) acc += d[j];
  out[threadIdx.x] = acc;
  if (threadIdx.x == 0) *cyc = t1 - t0;
}

/* ---- bits: W [64][K], x [8][K] bf16. ---- */
// (1) mma.sync chains: warp w rows 16w..16w+15, B = x. y1[x][w]
__global__ void k_bits_mma(const __nv_bfloat16 *W, const __nv_bfloat16 *x, int K, float *y) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  float c[4] = {0, 0, 0, 0};
  for (int k0 = 0; k0 < K; k0 += 16) {
    uint32_t a[4], b[2];
    const __nv_bfloat16 *r0 = W + (size_t)(16 * warp + g) * K + k0, *r1 = r0 + 8 * (size_t)K;
    __nv_bfloat162 v;
    v = __halves2bfloat162(r0[2 * t], r0[2 * t + 1]);
    a[0] = *(uint32_t *)&v;
    v = __halves2bfloat162(r1[2 * t], r1[2 * t + 1]);
    a[1] = *(uint32_t *)&v;
    v = __halves2bfloat162(r0[2 * t + 8], r0[2 * t + 9]);
    a[2] = *(uint32_t *)&v;
    v = __halves2bfloat162(r1[2 * t + 8], r1[2 * t + 9]);
    a[3] = *(uint32_t *)&v;
    const __nv_bfloat16 *xc = x + (size_t)g * K + k0; // B col n = g, rows k = 2t,2t+1 / 2t+8,9
    v = __halves2bfloat162(xc[2 * t], xc[2 * t + 1]);
    b[0] = *(uint32_t *)&v;
    v = __halves2bfloat162(xc[2 * t + 8], xc[2 * t + 9]);
    b[1] = *(uint32_t *)&v;
    mma_bf16(c, a, b[0], b[1]);
  }
  const int row = 16 * warp + g;
  y[(2 * t) * 64 + row] = c[0];
  y[(2 * t + 1) * 64 + row] = c[1];
  y[(2 * t) * 64 + row + 8] = c[2];
  y[(2 * t + 1) * 64 + row + 8] = c[3];
}

// store 'rows' x 16 tile of matrix M (row stride K, columns k0..k0+15) in core-matrix layout
// [kchunk(2)][rowgroup(rows/8)][8][8] at dst
__device__ void store_core(__nv_bfloat16 *dst, const __nv_bfloat16 *M, int rows, int K, int k0,
                           int valid_rows) {
  for (int i = threadIdx.x; i < rows * 16; i += blockDim.x) {
    const int r = i / 16, c = i % 16;
    const int kc = c / 8, rg = r / 8;
    const __nv_bfloat16 v = r < valid_rows ? M[(size_t)r * K + k0 + c] : __float2bfloat16(0.0f);
    dst[((kc * (rows / 8) + rg) * 8 + (r % 8)) * 8 + (c % 8)] = v;
  }
}

// (2) wgmma chain: A = W (64 rows), B = x (8 rows), both staged per k-step in shared memory in
// the no-swizzle K-major core-matrix layout (LBO: bytes between core matrices along K; SBO: along
// M/N). y[x][w] as (1).
__global__ void k_bits_wg(const __nv_bfloat16 *W, const __nv_bfloat16 *x, int K, float *y) {
  __shared__ __align__(128) __nv_bfloat16 sa[64 * 16];
  __shared__ __align__(128) __nv_bfloat16 sb[8 * 16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  float d[4] = {0, 0, 0, 0};
  for (int k0 = 0; k0 < K; k0 += 16) {
    __syncthreads();
    store_core(sa, W, 64, K, k0, 64);
    store_core(sb, x, 8, K, k0, 8);
    proxy_fence();
    __syncthreads();
    const uint64_t da = desc_of(sa, 1024, 128), db = desc_of(sb, 128, 256);
    wg_fence();
    wg_n8_ss(d, da, db, k0 > 0);
    wg_commit();
    wg_wait<0>();
  }
  const int row = 16 * warp + g;
  y[(2 * t) * 64 + row] = d[0];
  y[(2 * t + 1) * 64 + row] = d[1];
  y[(2 * t) * 64 + row + 8] = d[2];
  y[(2 * t + 1) * 64 + row + 8] = d[3];
}

static float bf2f(__nv_bfloat16 h) {
  return __bfloat162float(h);
}

int main() {
  long long *cyc;
  float *out;
  CK(cudaMalloc(&cyc, 8));
  CK(cudaMalloc(&out, 4096));
  long long h;
  const int steps = 4096;
#define LAT(kern, threads, chains, label)                                                          \
  kern<<<1, threads>>>(steps, cyc, out);                                                           \
  CK(cudaDeviceSynchronize());                                                                     \
  kern<<<1, threads>>>(steps, cyc, out);                                                           \
  CK(cudaDeviceSynchronize());                                                                     \
  CK(cudaMemcpy(&h, cyc, 8, cudaMemcpyDeviceToHost));                                              \
  printf("%-40s %.1f cycles per step (%d chains)\n", label, (double)h / steps, chains);
  LAT(k_mma_lat<1>, 32, 1, "mma.sync m16n8k16 dependent");
  LAT(k_mma_lat<2>, 32, 2, "mma.sync 2 chains");
  LAT(k_mma_lat<4>, 32, 4, "mma.sync 4 chains");
  LAT((k_wg_lat<8, 1>), 128, 1, "wgmma n8 wait each");
  LAT((k_wg_lat<8, 8>), 128, 1, "wgmma n8 group 8");
  LAT((k_wg_lat<8, 32>), 128, 1, "wgmma n8 group 32");
  LAT((k_wg_lat<16, 32>), 128, 1, "wgmma n16 group 32");

  const int K = 4096;
  __nv_bfloat16 *hW = (__nv_bfloat16 *)malloc(64 * K * 2), *hx = (__nv_bfloat16 *)malloc(8 * K * 2);
  srand(1);
  for (int i = 0; i < 64 * K; i++) hW[i] = __float2bfloat16(((rand() % 20001) - 10000) * 1e-4f);
  for (int i = 0; i < 8 * K; i++) hx[i] = __float2bfloat16(((rand() % 20001) - 10000) * 1e-3f);
  __nv_bfloat16 *dW, *dx;
  float *y1, *y2;
  CK(cudaMalloc(&dW, 64 * K * 2));
  CK(cudaMalloc(&dx, 8 * K * 2));
  CK(cudaMalloc(&y1, 512 * 4));
  CK(cudaMalloc(&y2, 512 * 4));
  CK(cudaMemcpy(dW, hW, 64 * K * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dx, hx, 8 * K * 2, cudaMemcpyHostToDevice));
  float r1[512], r2[512];
  double ref[512];
  for (int xr = 0; xr < 8; xr++)
    for (int w = 0; w < 64; w++) {
      double s = 0;
      for (int k = 0; k < K; k++)
        s += (double)bf2f(hW[(size_t)w * K + k]) * bf2f(hx[(size_t)xr * K + k]);
      ref[xr * 64 + w] = s;
    }
  k_bits_mma<<<1, 128>>>(dW, dx, K, y1);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(r1, y1, 2048, cudaMemcpyDeviceToHost));
  double e = 0;
  for (int i = 0; i < 512; i++) e = fmax(e, fabs(r1[i] - ref[i]));
  printf("mma.sync chain vs f64 ref: max abs err %.3g (ref[0] %.4f got %.4f)\n", e, ref[0], r1[0]);
  CK(cudaMemset(y2, 0, 2048));
  k_bits_wg<<<1, 128>>>(dW, dx, K, y2);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(r2, y2, 2048, cudaMemcpyDeviceToHost));
  int same = 0;
  double e2 = 0;
  for (int i = 0; i < 512; i++) {
    same += memcmp(&r1[i], &r2[i], 4) == 0;
    e2 = fmax(e2, fabs(r2[i] - ref[i]));
  }
  printf("wgmma chain (A = W, B = x from shared memory): bit-equal to mma.sync %d/512, max err vs "
         "f64 %.3g\n",
         same, e2);
  return 0;
}
