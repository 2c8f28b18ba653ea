/* How the CUDA kernels address, encode and decode stored KV rows (docs/kv-cache.md §2): the row
 * address of (block, slot, head), the launch's sequence of a block, and for every codec the
 * single-thread row encoder and decoder. The encoders and decoders repeat the CPU reference
 * (src/tensor/kv_format.c) operation for operation with explicitly rounded multiplies and adds
 * (no fused multiply-add), so a row the GPU writes is byte-identical to the CPU's, and block files
 * and prefix-cache blocks move between the backends unchanged. */
#ifndef CI_BACKEND_CUDA_CUDA_KV_CODEC_CUH
#define CI_BACKEND_CUDA_CUDA_KV_CODEC_CUH

#include "backend/cuda/cuda_internal.h"

extern "C" {
#include "tensor/kv_format.h"
}

#include <float.h>
#include <math.h>
#include <string.h>

enum { CI_CUDA_KV_MAX_D = 512, CI_CUDA_TURBO_V_GROUP = 32 };

/* Functions marked CI_KV_HD also compile for the host (ci_cuda_kv_encode_row_host), where the
 * explicitly rounded operations are plain ones (the host compiler contracts nothing on the
 * baseline x86-64 ISA), so tests without a GPU check the same codec code against the CPU's. */
#define CI_KV_HD __host__ __device__
#ifdef __CUDA_ARCH__
#define CI_KV_FADD(a, b) __fadd_rn(a, b)
#define CI_KV_FSUB(a, b) __fsub_rn(a, b)
#define CI_KV_FMUL(a, b) __fmul_rn(a, b)
#define CI_KV_FDIV(a, b) __fdiv_rn(a, b)
#define CI_KV_DADD(a, b) __dadd_rn(a, b)
#define CI_KV_DMUL(a, b) __dmul_rn(a, b)
#define CI_KV_DDIV(a, b) __ddiv_rn(a, b)
#else
#define CI_KV_FADD(a, b) ((float)(a) + (float)(b))
#define CI_KV_FSUB(a, b) ((float)(a) - (float)(b))
#define CI_KV_FMUL(a, b) ((float)(a) * (float)(b))
#define CI_KV_FDIV(a, b) ((float)(a) / (float)(b))
#define CI_KV_DADD(a, b) ((double)(a) + (double)(b))
#define CI_KV_DMUL(a, b) ((double)(a) * (double)(b))
#define CI_KV_DDIV(a, b) ((double)(a) / (double)(b))
#endif

/* The Lloyd-Max codebooks for N(0,1) (src/tensor/turbo_quant.c, the same literals), indexed by
 * bits (2..4); unused entries are 0. */
#define CI_KV_CENTROIDS                                                                            \
  {                                                                                                \
    {0}, {0}, {-1.510418f, -0.452780f, 0.452780f, 1.510418f},                                      \
        {-2.151946f, -1.343909f, -0.756005f, -0.245094f,                                           \
         0.245094f,  0.756005f,  1.343909f,  2.151946f},                                           \
    {                                                                                              \
      -2.732590f, -2.069017f, -1.618046f, -1.256231f, -0.942340f, -0.656759f, -0.388048f,          \
          -0.128395f, 0.128395f, 0.388048f, 0.656759f, 0.942340f, 1.256231f, 1.618046f, 2.069017f, \
          2.732590f                                                                                \
    }                                                                                              \
  }
#define CI_KV_THRESHOLDS                                                                           \
  {                                                                                                \
    {0}, {0}, {-0.981599f, 0.0f, 0.981599f},                                                       \
        {-1.747927f, -1.049957f, -0.500550f, 0.0f, 0.500550f, 1.049957f, 1.747927f}, {             \
      -2.400803f, -1.843532f, -1.437139f, -1.099286f, -0.799550f, -0.522404f, -0.258222f, 0.0f,    \
          0.258222f, 0.522404f, 0.799550f, 1.099286f, 1.437139f, 1.843532f, 2.400803f              \
    }                                                                                              \
  }
static __constant__ const float ci_kv_centroids[5][16] = CI_KV_CENTROIDS;
static __constant__ const float ci_kv_thresholds[5][15] = CI_KV_THRESHOLDS;
static const float ci_kv_centroids_host[5][16] = CI_KV_CENTROIDS;
static const float ci_kv_thresholds_host[5][15] = CI_KV_THRESHOLDS;

CI_KV_HD static inline const float *ci_kv_codebook(int bits) {
#ifdef __CUDA_ARCH__
  return ci_kv_centroids[bits];
#else
  return ci_kv_centroids_host[bits];
#endif
}

CI_KV_HD static inline const float *ci_kv_codebook_thresholds(int bits) {
#ifdef __CUDA_ARCH__
  return ci_kv_thresholds[bits];
#else
  return ci_kv_thresholds_host[bits];
#endif
}

/* ==== Addressing ==== */

__device__ static inline uint8_t *ci_kv_dev_row(const ci_cuda_kv_layout &L, int value,
                                                int32_t block, int64_t slot, int head) {
  return L.slabs[block / L.blocks_per_slab] +
         (int64_t)(block % L.blocks_per_slab) * L.block_stride + (value ? L.v_offset : L.k_offset) +
         ((int64_t)head * L.block_tokens + slot) * (value ? L.v_row_bytes : L.k_row_bytes);
}

/* The launch's sequence of block x: the sequences starting at or before row x, counted by one
 * ballot per 32 sequences (every lane of the warp must call it). */
__device__ static inline int ci_kv_dev_seq_of(const ci_cuda_seq_group *g, int x) {
  static_assert(CI_CUDA_MAX_SEQS <= 64, "two ballots cover the sequences of a launch");
  const int lane = threadIdx.x & 31;
  const int a = lane < g->n && g->row_start[lane] <= x;
  const int b = lane + 32 < g->n && g->row_start[lane + 32] <= x;
  return __popc(__ballot_sync(0xffffffffu, a)) + __popc(__ballot_sync(0xffffffffu, b)) - 1;
}

/* ==== Scalars ==== */

/* Code i of an LSB-first bit stream of `bits`-bit codes (ci_kv_code_at). */
CI_KV_HD static inline unsigned ci_kv_dev_code(const uint8_t *codes, int i, int bits) {
  if (bits == 8) return codes[i];
  if (bits == 4) return (codes[i >> 1] >> ((i & 1) * 4)) & 15u;
  if (bits == 2) return (codes[i >> 2] >> ((i & 3) * 2)) & 3u;
  const unsigned bit = (unsigned)i * (unsigned)bits;
  const unsigned word = codes[bit >> 3] | ((unsigned)codes[(bit >> 3) + 1] << 8);
  return (word >> (bit & 7)) & ((1u << bits) - 1);
}

CI_KV_HD static inline float ci_kv_dev_bf16(const uint8_t *p) {
  const uint32_t u = (uint32_t)(p[0] | (p[1] << 8)) << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* f16 bits -> f32, exactly (ci_f16_to_f32's integer rule: the rows' f16 fields convert without
 * the half-precision intrinsics, the same code on the host and the device). */
CI_KV_HD static inline float ci_kv_dev_f16_to_f32(unsigned h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu, bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else { /* subnormal: normalise */
      exponent = 127 - 15 + 1;
      while (!(mantissa & 0x400u)) {
        mantissa <<= 1;
        exponent--;
      }
      bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
    }
  } else if (exponent == 31) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

CI_KV_HD static inline float ci_kv_dev_f16(const uint8_t *p) {
  return ci_kv_dev_f16_to_f32((unsigned)(p[0] | (p[1] << 8)));
}

CI_KV_HD static inline void ci_kv_dev_put16(uint8_t *p, unsigned short v) {
  p[0] = (uint8_t)(v & 0xff);
  p[1] = (uint8_t)(v >> 8);
}

/* f32 -> bf16 bits, round to nearest even, NaN quieted (ci_f32_to_bf16's rule). */
CI_KV_HD static inline void ci_kv_dev_put_bf16(uint8_t *p, float v) {
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    ci_kv_dev_put16(p, (unsigned short)((u >> 16) | 0x40));
  else
    ci_kv_dev_put16(p, (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16));
}

/* f32 -> f16 bits, round to nearest even (ci_f32_to_f16's integer rule, operation for operation:
 * on the H200 the half-precision intrinsics stored other bytes here than the host did). */
CI_KV_HD static inline unsigned short ci_kv_dev_f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  const unsigned short sign = (unsigned short)((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;  /* NaN */
  if (abs >= 0x477ff000u) return sign | 0x7c00u; /* overflow to inf (round to nearest) */
  if (abs < 0x38800000u) {                       /* subnormal or zero in f16 */
    if (abs < 0x33000000u) return sign;
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const int shift = 126 - (int)(abs >> 23); /* the f16 subnormal unit is 2^-24 */
    uint32_t half = mantissa >> shift;
    const uint32_t rem = mantissa & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return (unsigned short)(sign | half);
  }
  uint32_t half = (abs >> 13) - ((127 - 15) << 10);
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) half++;
  return (unsigned short)(sign | half);
}

/* f32 -> f16 bits, saturating at ±65504 (ci_f32_to_f16_saturate). */
CI_KV_HD static inline void ci_kv_dev_put_f16(uint8_t *p, float v) {
  if (v > 65504.0f) v = 65504.0f;
  if (v < -65504.0f) v = -65504.0f;
  ci_kv_dev_put16(p, ci_kv_dev_f32_to_f16(v));
}

/* Number of thresholds strictly below u (ci_lloyd_max_code). */
CI_KV_HD static inline uint8_t ci_kv_dev_lloyd_code(float u, int bits) {
  const float *t = ci_kv_codebook_thresholds(bits);
  int lo = 0, hi = (1 << bits) - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (t[mid] < u)
      lo = mid + 1;
    else
      hi = mid;
  }
  return (uint8_t)lo;
}

/* ci_affine_code: clamp(rint(x), 0, n), NaN -> 0. */
CI_KV_HD static inline uint8_t ci_kv_dev_affine_code(float x, float n) {
  if (!(x >= -1.0f)) x = -1.0f;
  if (x > n + 1.0f) x = n + 1.0f;
  float q = rintf(x);
  if (q < 0.0f) q = 0.0f;
  if (q > n) q = n;
  return (uint8_t)q;
}

/* In place x <- H_D x, sequentially (ci_fwht). */
CI_KV_HD static inline void ci_kv_dev_fwht(float *x, int D) {
  for (int len = 1; len < D; len <<= 1)
    for (int i = 0; i < D; i += len << 1)
      for (int j = i; j < i + len; j++) {
        const float a = x[j], b = x[j + len];
        x[j] = CI_KV_FADD(a, b);
        x[j + len] = CI_KV_FSUB(a, b);
      }
  const float scale = 1.0f / sqrtf((float)D);
  for (int i = 0; i < D; i++) x[i] = CI_KV_FMUL(x[i], scale);
}

/* Packs n codes of `bits` LSB-first into out (n * bits / 8 bytes). */
CI_KV_HD static inline void ci_kv_dev_pack(const uint8_t *codes, int n, int bits, uint8_t *out) {
  const int bytes = n * bits / 8;
  for (int i = 0; i < bytes; i++) out[i] = 0;
  for (int i = 0; i < n; i++) {
    const unsigned bit = (unsigned)i * (unsigned)bits;
    const unsigned v = (unsigned)codes[i] << (bit & 7);
    out[bit >> 3] |= (uint8_t)v;
    if ((bit & 7) + (unsigned)bits > 8) out[(bit >> 3) + 1] |= (uint8_t)(v >> 8);
  }
}

/* ==== Row encoders (one thread per row) ==== */

/* An affine group's scale s and bias b from its minimum lo and maximum hi, n = 2^bits - 1
 * (ci_affine_quantize_group's rule: the larger edge exact). Both affine encoders use it. */
CI_KV_HD static inline void ci_kv_dev_affine_params(float lo, float hi, float n, float *s_out,
                                                    float *b_out) {
  float s = CI_KV_FDIV(CI_KV_FSUB(hi, lo), n);
  if (s < 1e-7f) s = 1e-7f;
  float edge;
  if (fabsf(lo) > fabsf(hi)) {
    edge = lo;
  } else {
    edge = hi;
    s = -s;
  }
  const float q0 = rintf(CI_KV_FDIV(edge, s));
  float b = 0.0f;
  if (q0 != 0.0f) {
    s = CI_KV_FDIV(edge, q0);
    b = edge;
  }
  *s_out = s;
  *b_out = b;
}

/* MLX affine per group: codes | bf16 scales | bf16 biases (ci_affine_quantize_group). */
CI_KV_HD static inline void ci_kv_dev_affine_encode(const float *x, int D, int bits, int group,
                                                    uint8_t *row) {
  uint8_t codes[CI_CUDA_KV_MAX_D];
  const int groups = D / group;
  const float n = (float)((1 << bits) - 1);
  uint8_t *scales = row + D * bits / 8, *biases = scales + 2 * groups;
  for (int g = 0; g < groups; g++) {
    const float *w = x + g * group;
    float lo = w[0], hi = w[0];
    for (int i = 1; i < group; i++) {
      if (w[i] < lo) lo = w[i];
      if (w[i] > hi) hi = w[i];
    }
    float s, b;
    ci_kv_dev_affine_params(lo, hi, n, &s, &b);
    for (int i = 0; i < group; i++)
      codes[g * group + i] = ci_kv_dev_affine_code(CI_KV_FDIV(CI_KV_FSUB(w[i], b), s), n);
    ci_kv_dev_put_bf16(scales + 2 * g, s);
    ci_kv_dev_put_bf16(biases + 2 * g, b);
  }
  ci_kv_dev_pack(codes, D, bits, row);
}

/* TurboQuant: codes of the rotated, renormalised vector | fp16 ν. */
CI_KV_HD static inline void ci_kv_dev_turbo_encode(const float *x, int D, int bits,
                                                   const float *signs, uint8_t *row) {
  float y[CI_CUDA_KV_MAX_D];
  uint8_t codes[CI_CUDA_KV_MAX_D];
  double norm2 = 0.0;
  for (int i = 0; i < D; i++) norm2 = CI_KV_DADD(norm2, CI_KV_DMUL((double)x[i], (double)x[i]));
  const float gamma = (float)sqrt(norm2);
  float nu = 0.0f;
  if (gamma == 0.0f) {
    for (int i = 0; i < D; i++) codes[i] = (uint8_t)(1 << (bits - 1));
  } else {
    for (int i = 0; i < D; i++) y[i] = CI_KV_FMUL(signs[i], x[i]);
    ci_kv_dev_fwht(y, D);
    const float unit = CI_KV_FDIV(sqrtf((float)D), gamma);
    const float *c = ci_kv_codebook(bits);
    double decoded2 = 0.0;
    for (int i = 0; i < D; i++) {
      codes[i] = ci_kv_dev_lloyd_code(CI_KV_FMUL(y[i], unit), bits);
      decoded2 = CI_KV_DADD(decoded2, CI_KV_DMUL((double)c[codes[i]], (double)c[codes[i]]));
    }
    nu = (float)CI_KV_DDIV((double)gamma, sqrt(decoded2));
  }
  ci_kv_dev_pack(codes, D, bits, row);
  ci_kv_dev_put_f16(row + D * bits / 8, nu);
}

/* turbo-v K: asymmetric affine per 32-group: codes | fp16 sc | fp16 zp. */
CI_KV_HD static inline void ci_kv_dev_turbo_v_key_encode(const float *x, int D, int bits,
                                                         uint8_t *row) {
  uint8_t codes[CI_CUDA_KV_MAX_D];
  const int G = CI_CUDA_TURBO_V_GROUP, groups = D / G;
  uint8_t *sc_out = row + D * bits / 8, *zp_out = sc_out + 2 * groups;
  for (int g = 0; g < groups; g++) {
    const float *v = x + g * G;
    float lo = v[0], hi = v[0];
    for (int i = 1; i < G; i++) {
      if (v[i] < lo) lo = v[i];
      if (v[i] > hi) hi = v[i];
    }
    if (lo == hi) {
      if (lo > 0)
        lo = 0;
      else
        hi = 0;
    }
    float sc, zp;
    int qmin, qmax;
    if (bits == 8) {
      sc = CI_KV_FDIV(CI_KV_FSUB(hi, lo), 254.0f);
      zp = rintf(CI_KV_FDIV(CI_KV_FADD(hi, lo), CI_KV_FMUL(2.0f, CI_KV_FADD(sc, 1e-8f))));
      qmin = -127, qmax = 127;
    } else {
      qmax = (1 << bits) - 1;
      qmin = 0;
      sc = CI_KV_FDIV(CI_KV_FSUB(hi, lo), (float)qmax);
      zp = rintf(CI_KV_FDIV(lo, CI_KV_FADD(sc, 1e-8f)));
    }
    for (int i = 0; i < G; i++) {
      float q = rintf(CI_KV_FSUB(CI_KV_FDIV(v[i], CI_KV_FADD(sc, 1e-8f)), zp));
      if (q < (float)qmin) q = (float)qmin;
      if (q > (float)qmax) q = (float)qmax;
      codes[g * G + i] = (uint8_t)(int8_t)(int)q;
    }
    ci_kv_dev_put_f16(sc_out + 2 * g, sc);
    ci_kv_dev_put_f16(zp_out + 2 * g, zp);
  }
  ci_kv_dev_pack(codes, D, bits, row);
}

/* turbo-v V: rotated, per 32-group RMS-normalised Lloyd-Max codes | fp16 r per group. */
CI_KV_HD static inline void ci_kv_dev_turbo_v_value_encode(const float *x, int D, int bits,
                                                           const float *signs, uint8_t *row) {
  float y[CI_CUDA_KV_MAX_D];
  uint8_t codes[CI_CUDA_KV_MAX_D];
  const int G = CI_CUDA_TURBO_V_GROUP;
  for (int i = 0; i < D; i++) y[i] = CI_KV_FMUL(signs[i], x[i]);
  ci_kv_dev_fwht(y, D);
  uint8_t *r_out = row + D * bits / 8;
  for (int g = 0; g < D / G; g++) {
    const float *v = y + g * G;
    float sum = 0.0f;
    for (int i = 0; i < G; i++) sum = CI_KV_FADD(sum, CI_KV_FMUL(v[i], v[i]));
    const float r = sqrtf(CI_KV_FDIV(sum, (float)G));
    for (int i = 0; i < G; i++)
      codes[g * G + i] = ci_kv_dev_lloyd_code(CI_KV_FDIV(v[i], CI_KV_FADD(r, 1e-8f)), bits);
    ci_kv_dev_put_f16(r_out + 2 * g, r);
  }
  ci_kv_dev_pack(codes, D, bits, row);
}

/* ==== Row encoders (one warp per row) ====
 *
 * The same rows as the one-thread encoders above, byte for byte, with the 32 lanes of a warp
 * (every lane calls them; D a multiple of 32): lane l takes elements l, l + 32, ... and every
 * per-element operation is the one-thread encoder's. What the one-thread rule does in order is
 * kept: a group's minimum and maximum are the first elements attaining them (a NaN first element
 * stays, later NaNs are skipped, and of -0 and +0 the first one wins), and float sums run
 * sequentially in one lane. TurboQuant's two double sums of squares are taken by the whole warp
 * (a tree) and redone sequentially in one lane only when the float they lead to could differ
 * from the sequential sum's (ci_kv_dev_settled_float). The scratch (y: D floats, codes: D bytes)
 * is the warp's shared memory. */

/* ci_kv_dev_pack's bytes, the lanes over the bytes: byte j gathers the bits of every code that
 * falls in it. */
__device__ static inline void ci_kv_dev_pack_warp(const uint8_t *codes, int n, int bits,
                                                  uint8_t *out) {
  for (int j = (int)(threadIdx.x & 31); j < n * bits / 8; j += 32) {
    unsigned v = 0;
    for (int i = 8 * j / bits; i <= (8 * j + 7) / bits && i < n; i++) {
      const int shift = i * bits - 8 * j;
      v |= shift >= 0 ? (unsigned)codes[i] << shift : (unsigned)codes[i] >> -shift;
    }
    out[j] = (uint8_t)v;
  }
}

/* The one-thread rule's extreme of w[0..32 * per_lane) (lane l holds w[l + 32 k] in v[k]):
 * `w[i] < lo` (or > for the maximum) from lo = w[0]. */
template <bool MAX, int N>
__device__ static inline float ci_kv_dev_first_extreme_warp(const float (&v)[N], int per_lane) {
  float e = MAX ? -INFINITY : INFINITY;
#pragma unroll
  for (int k = 0; k < N; k++)
    if (k < per_lane) e = MAX ? fmaxf(e, v[k]) : fminf(e, v[k]); /* skip NaNs */
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, e, off);
    e = MAX ? fmaxf(e, o) : fminf(e, o);
  }
  const float first = __shfl_sync(0xffffffffu, v[0], 0);
  if (isnan(first)) return first;
#pragma unroll
  for (int k = 0; k < N; k++) { /* the first element equal to it (its sign, for zeros) */
    if (k >= per_lane) break;
    const unsigned hit = __ballot_sync(0xffffffffu, v[k] == e);
    if (hit) return __shfl_sync(0xffffffffu, v[k], __ffs(hit) - 1);
  }
  return e; /* every element NaN but the first: unreachable (the first would be NaN) */
}

/* In place x <- H_D x over the warp's shared memory (ci_kv_dev_fwht's butterflies). */
__device__ static inline void ci_kv_dev_fwht_warp(float *x, int D) {
  const int lane = threadIdx.x & 31;
  for (int len = 1; len < D; len <<= 1) {
    for (int t = lane; t < D / 2; t += 32) {
      const int i = ((t & -len) << 1) | (t & (len - 1)); /* (t / len) 2 len + t % len */
      const float a = x[i], b = x[i + len];
      x[i] = CI_KV_FADD(a, b);
      x[i + len] = CI_KV_FSUB(a, b);
    }
    __syncwarp();
  }
  const float scale = 1.0f / sqrtf((float)D);
  for (int i = lane; i < D; i += 32) x[i] = CI_KV_FMUL(x[i], scale);
  __syncwarp();
}

/* ci_kv_dev_affine_encode (group a multiple of 32) for groups g0, g0 + g_step, ... of the row:
 * their codes, scales and biases (the groups' codes fill whole bytes). */
__device__ static inline void ci_kv_dev_affine_encode_warp(const float *x, int D, int bits,
                                                           int group, int g0, int g_step,
                                                           uint8_t *codes, uint8_t *row) {
  const int lane = threadIdx.x & 31, groups = D / group, per_lane = group / 32;
  const float n = (float)((1 << bits) - 1);
  uint8_t *scales = row + D * bits / 8, *biases = scales + 2 * groups;
  for (int g = g0; g < groups; g += g_step) {
    const float *w = x + g * group;
    float v[4]; /* groups of up to 128 (ci_kv_dev_warp_encodes) */
#pragma unroll
    for (int k = 0; k < 4; k++) v[k] = k < per_lane ? w[lane + 32 * k] : 0.0f;
    const float lo = ci_kv_dev_first_extreme_warp<false>(v, per_lane),
                hi = ci_kv_dev_first_extreme_warp<true>(v, per_lane);
    float s, b;
    ci_kv_dev_affine_params(lo, hi, n, &s, &b);
#pragma unroll
    for (int k = 0; k < 4; k++)
      if (k < per_lane)
        codes[g * group + lane + 32 * k] =
            ci_kv_dev_affine_code(CI_KV_FDIV(CI_KV_FSUB(v[k], b), s), n);
    if (lane == 0) {
      ci_kv_dev_put_bf16(scales + 2 * g, s);
      ci_kv_dev_put_bf16(biases + 2 * g, b);
    }
    __syncwarp();
    ci_kv_dev_pack_warp(codes + g * group, group, bits, row + g * group * bits / 8);
    __syncwarp();
  }
}

/* ci_kv_dev_lloyd_code for every lane of the warp at once (each its own u): the same binary
 * search, its thresholds read by shuffle from the lanes (lane j holds threshold j,
 * ci_kv_dev_lloyd_lane), not by lane-divergent constant loads. */
__device__ static inline uint8_t ci_kv_dev_lloyd_code_warp(float u, int bits, float t_lane) {
  int lo = 0, hi = (1 << bits) - 1;
  for (int it = 0; it < bits; it++) { /* bits halvings settle 2^bits codes */
    const int mid = (lo + hi) / 2;
    const float t = __shfl_sync(0xffffffffu, t_lane, mid);
    if (lo < hi) {
      if (t < u)
        lo = mid + 1;
      else
        hi = mid;
    }
  }
  return (uint8_t)lo;
}

/* The calling lane's threshold for ci_kv_dev_lloyd_code_warp. */
__device__ static inline float ci_kv_dev_lloyd_lane(int bits) {
  const int lane = threadIdx.x & 31;
  return lane < (1 << bits) - 1 ? ci_kv_codebook_thresholds(bits)[lane] : 0.0f;
}

/* sum_i x[i]^2 over x[0..D) in double, the products exact: each lane sums its elements in index
 * order, then the lanes' sums meet in a shuffle tree (every lane gets the same value). */
__device__ static inline double ci_kv_dev_square_sum_warp(const float *x, int D) {
  const int lane = threadIdx.x & 31;
  double sum = 0.0;
  for (int i = lane; i < D; i += 32) sum = CI_KV_DADD(sum, CI_KV_DMUL((double)x[i], (double)x[i]));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1)
    sum = CI_KV_DADD(sum, __shfl_xor_sync(0xffffffffu, sum, off));
  return sum;
}

/* The one-thread rule's sequential sum_i x[i]^2 (lane 0 alone, 16 loads ahead of the chain),
 * broadcast to the warp. */
__device__ static inline double ci_kv_dev_square_sum_lane0(const float *x, int D) {
  double sum = 0.0;
  if ((threadIdx.x & 31) == 0)
    for (int i0 = 0; i0 < D; i0 += 16) /* D is a multiple of 32 */
#pragma unroll
      for (int i = i0; i < i0 + 16; i++)
        sum = CI_KV_DADD(sum, CI_KV_DMUL((double)x[i], (double)x[i]));
  return __shfl_sync(0xffffffffu, sum, 0);
}

/* Whether (float)r is also the float of every double within 2^-42 of r (relative): then a value
 * computed as r is, but from a sum of the same n <= 512 nonnegative terms taken in another order,
 * rounds to the same float. Two summation orders of n nonnegative doubles agree within
 * 2 (n - 1) 2^-53 of the sum; sqrt halves that, and the correctly rounded sqrt and division add
 * at most 2^-53 each per side, so the two derived values differ by at most (n + 3) 2^-53
 * relative, about 2^-44 at n = 512 (a quarter of the margin). False for zero, non-finite values and
 * the largest float. */
__device__ static inline bool ci_kv_dev_settled_float(double r) {
  const float f = __double2float_rn(r);
  if (!(r > 0.0) || !isfinite(f) || f == FLT_MAX || f == 0.0f) return false;
  const double below = 0.5 * ((double)f + (double)nextafterf(f, 0.0f)); /* rounding boundaries */
  const double above = 0.5 * ((double)f + (double)nextafterf(f, INFINITY));
  const double margin = r * 0x1p-42;
  return r - below > margin && above - r > margin;
}

/* ci_kv_dev_turbo_encode. */
__device__ static inline void ci_kv_dev_turbo_encode_warp(const float *x, int D, int bits,
                                                          const float *signs, float *y,
                                                          uint8_t *codes, uint8_t *row) {
  const int lane = threadIdx.x & 31;
  for (int i = lane; i < D; i += 32) y[i] = x[i];
  __syncwarp();
  /* gamma = (float)sqrt(sum of squares) in the one-thread order's value: the warp's tree sum
   * gives the same float unless the value is near a rounding boundary; then lane 0 sums in
   * order (a sum of zero is zero in any order) */
  double norm2 = ci_kv_dev_square_sum_warp(y, D);
  if (norm2 != 0.0 && !ci_kv_dev_settled_float(sqrt(norm2)))
    norm2 = ci_kv_dev_square_sum_lane0(y, D);
  __syncwarp();
  const float gamma = (float)sqrt(norm2);
  float nu = 0.0f;
  if (gamma == 0.0f) {
    for (int i = lane; i < D; i += 32) codes[i] = (uint8_t)(1 << (bits - 1));
  } else {
    for (int i = lane; i < D; i += 32) y[i] = CI_KV_FMUL(signs[i], y[i]);
    __syncwarp();
    ci_kv_dev_fwht_warp(y, D);
    const float unit = CI_KV_FDIV(sqrtf((float)D), gamma);
    const float t_lane = ci_kv_dev_lloyd_lane(bits);
    /* lane j holds centroid j: the codes' centroids by shuffle, not by lane-divergent constant
     * loads */
    const float c_lane = lane < (1 << bits) ? ci_kv_codebook(bits)[lane] : 0.0f;
    for (int i = lane; i < D; i += 32) { /* y[i] becomes the code's centroid */
      const int code = ci_kv_dev_lloyd_code_warp(CI_KV_FMUL(y[i], unit), bits, t_lane);
      codes[i] = (uint8_t)code;
      y[i] = __shfl_sync(0xffffffffu, c_lane, code);
    }
    __syncwarp();
    /* nu = gamma / |decoded|, the same way (the centroids are never zero) */
    const double ratio = CI_KV_DDIV((double)gamma, sqrt(ci_kv_dev_square_sum_warp(y, D)));
    nu = ci_kv_dev_settled_float(ratio)
             ? (float)ratio
             : (float)CI_KV_DDIV((double)gamma, sqrt(ci_kv_dev_square_sum_lane0(y, D)));
  }
  __syncwarp();
  ci_kv_dev_pack_warp(codes, D, bits, row);
  if (lane == 0) ci_kv_dev_put_f16(row + D * bits / 8, nu);
  __syncwarp();
}

/* ci_kv_dev_turbo_v_key_encode (groups of 32: one element per lane). */
__device__ static inline void ci_kv_dev_turbo_v_key_encode_warp(const float *x, int D, int bits,
                                                                uint8_t *codes, uint8_t *row) {
  const int lane = threadIdx.x & 31, G = CI_CUDA_TURBO_V_GROUP, groups = D / G;
  static_assert(CI_CUDA_TURBO_V_GROUP == 32, "one element per lane");
  uint8_t *sc_out = row + D * bits / 8, *zp_out = sc_out + 2 * groups;
  for (int g = 0; g < groups; g++) {
    const float v[1] = {x[g * G + lane]};
    float lo = ci_kv_dev_first_extreme_warp<false>(v, 1),
          hi = ci_kv_dev_first_extreme_warp<true>(v, 1);
    if (lo == hi) {
      if (lo > 0)
        lo = 0;
      else
        hi = 0;
    }
    float sc, zp;
    int qmin, qmax;
    if (bits == 8) {
      sc = CI_KV_FDIV(CI_KV_FSUB(hi, lo), 254.0f);
      zp = rintf(CI_KV_FDIV(CI_KV_FADD(hi, lo), CI_KV_FMUL(2.0f, CI_KV_FADD(sc, 1e-8f))));
      qmin = -127, qmax = 127;
    } else {
      qmax = (1 << bits) - 1;
      qmin = 0;
      sc = CI_KV_FDIV(CI_KV_FSUB(hi, lo), (float)qmax);
      zp = rintf(CI_KV_FDIV(lo, CI_KV_FADD(sc, 1e-8f)));
    }
    float q = rintf(CI_KV_FSUB(CI_KV_FDIV(v[0], CI_KV_FADD(sc, 1e-8f)), zp));
    if (q < (float)qmin) q = (float)qmin;
    if (q > (float)qmax) q = (float)qmax;
    codes[g * G + lane] = (uint8_t)(int8_t)(int)q;
    if (lane == 0) {
      ci_kv_dev_put_f16(sc_out + 2 * g, sc);
      ci_kv_dev_put_f16(zp_out + 2 * g, zp);
    }
  }
  __syncwarp();
  ci_kv_dev_pack_warp(codes, D, bits, row);
  __syncwarp();
}

/* ci_kv_dev_turbo_v_value_encode (each group's sum of squares in order, by lane g). */
__device__ static inline void ci_kv_dev_turbo_v_value_encode_warp(const float *x, int D, int bits,
                                                                  const float *signs, float *y,
                                                                  uint8_t *codes, uint8_t *row) {
  const int lane = threadIdx.x & 31, G = CI_CUDA_TURBO_V_GROUP, groups = D / G;
  for (int i = lane; i < D; i += 32) y[i] = CI_KV_FMUL(signs[i], x[i]);
  __syncwarp();
  ci_kv_dev_fwht_warp(y, D);
  uint8_t *r_out = row + D * bits / 8;
  float r_mine = 0.0f; /* lane g: group g's r */
  if (lane < groups) {
    const float *v = y + lane * G;
    float sum = 0.0f;
    for (int i = 0; i < G; i++) sum = CI_KV_FADD(sum, CI_KV_FMUL(v[i], v[i]));
    r_mine = sqrtf(CI_KV_FDIV(sum, (float)G));
    ci_kv_dev_put_f16(r_out + 2 * lane, r_mine);
  }
  const float t_lane = ci_kv_dev_lloyd_lane(bits);
  for (int g = 0; g < groups; g++) {
    const float r = __shfl_sync(0xffffffffu, r_mine, g);
    codes[g * G + lane] =
        ci_kv_dev_lloyd_code_warp(CI_KV_FDIV(y[g * G + lane], CI_KV_FADD(r, 1e-8f)), bits, t_lane);
  }
  __syncwarp();
  ci_kv_dev_pack_warp(codes, D, bits, row);
  __syncwarp();
}

/* 1 when ci_kv_dev_encode_row_warp encodes the layout's rows (quantized codecs, D a multiple of
 * 32 up to CI_CUDA_KV_MAX_D, affine groups of 32, 64 or 128). */
CI_KV_HD static inline int ci_kv_dev_warp_encodes(const ci_cuda_kv_layout &L) {
  if (L.head_dim % 32 || L.head_dim > CI_CUDA_KV_MAX_D || L.head_dim < 32) return 0;
  if (L.codec == CI_KV_AFFINE) return L.group % 32 == 0 && L.group <= 128;
  return L.codec == CI_KV_TURBO || L.codec == CI_KV_TURBO_V;
}

/* ci_kv_dev_encode_row for a layout ci_kv_dev_warp_encodes, by the calling warp (affine: only
 * groups g0, g0 + g_step, ...; other warps may encode the others). */
__device__ static inline void ci_kv_dev_encode_row_warp(const ci_cuda_kv_layout &L, int value,
                                                        const float *x, float *y, uint8_t *codes,
                                                        uint8_t *row, int g0, int g_step) {
  const int D = L.head_dim, bits = value ? L.v_bits : L.k_bits;
  if (L.codec == CI_KV_AFFINE)
    ci_kv_dev_affine_encode_warp(x, D, bits, L.group, g0, g_step, codes, row);
  else if (L.codec == CI_KV_TURBO)
    ci_kv_dev_turbo_encode_warp(x, D, bits, L.signs, y, codes, row);
  else if (value)
    ci_kv_dev_turbo_v_value_encode_warp(x, D, bits, L.signs, y, codes, row);
  else
    ci_kv_dev_turbo_v_key_encode_warp(x, D, bits, codes, row);
}

/* Encodes x[0..D) as a K (value 0) or V (value 1) row of the layout's codec
 * (ci_kv_encode_row). */
CI_KV_HD static inline void ci_kv_dev_encode_row(const ci_cuda_kv_layout &L, int value,
                                                 const float *x, uint8_t *row) {
  const int D = L.head_dim, bits = value ? L.v_bits : L.k_bits;
  switch (L.codec) {
  case CI_KV_F32:
    for (int i = 0; i < D; i++) ((float *)row)[i] = x[i];
    break;
  case CI_KV_AFFINE:
    ci_kv_dev_affine_encode(x, D, bits, L.group, row);
    break;
  case CI_KV_TURBO:
    ci_kv_dev_turbo_encode(x, D, bits, L.signs, row);
    break;
  case CI_KV_TURBO_V:
    if (value)
      ci_kv_dev_turbo_v_value_encode(x, D, bits, L.signs, row);
    else
      ci_kv_dev_turbo_v_key_encode(x, D, bits, row);
    break;
  default: /* bf16 */
    for (int i = 0; i < D; i++) ci_kv_dev_put_bf16(row + 2 * i, x[i]);
  }
}

/* Decodes a row back to x[0..D) in the model basis (ci_kv_decode_row). */
CI_KV_HD static inline void ci_kv_dev_decode_row(const ci_cuda_kv_layout &L, int value,
                                                 const uint8_t *row, float *x) {
  const int D = L.head_dim, bits = value ? L.v_bits : L.k_bits;
  const int G = CI_CUDA_TURBO_V_GROUP;
  switch (L.codec) {
  case CI_KV_F32:
    for (int i = 0; i < D; i++) x[i] = ((const float *)row)[i];
    break;
  case CI_KV_AFFINE: {
    const int groups = D / L.group;
    const uint8_t *scales = row + D * bits / 8, *biases = scales + 2 * groups;
    for (int g = 0; g < groups; g++) {
      const float s = ci_kv_dev_bf16(scales + 2 * g), b = ci_kv_dev_bf16(biases + 2 * g);
      for (int i = g * L.group; i < (g + 1) * L.group; i++)
        x[i] = CI_KV_FADD(CI_KV_FMUL(s, (float)ci_kv_dev_code(row, i, bits)), b);
    }
    break;
  }
  case CI_KV_TURBO: {
    const float *c = ci_kv_codebook(bits);
    const float nu = ci_kv_dev_f16(row + D * bits / 8);
    for (int i = 0; i < D; i++) x[i] = CI_KV_FMUL(nu, c[ci_kv_dev_code(row, i, bits)]);
    ci_kv_dev_fwht(x, D);
    for (int i = 0; i < D; i++) x[i] = CI_KV_FMUL(x[i], L.signs[i]);
    break;
  }
  case CI_KV_TURBO_V:
    if (value) {
      const float *c = ci_kv_codebook(bits);
      const uint8_t *r_in = row + D * bits / 8;
      for (int i = 0; i < D; i++)
        x[i] = CI_KV_FMUL(c[ci_kv_dev_code(row, i, bits)], ci_kv_dev_f16(r_in + 2 * (i / G)));
      ci_kv_dev_fwht(x, D);
      for (int i = 0; i < D; i++) x[i] = CI_KV_FMUL(x[i], L.signs[i]);
    } else {
      const int groups = D / G;
      const uint8_t *sc_in = row + D * bits / 8, *zp_in = sc_in + 2 * groups;
      for (int g = 0; g < groups; g++) {
        const float sc = ci_kv_dev_f16(sc_in + 2 * g), zp = ci_kv_dev_f16(zp_in + 2 * g);
        for (int i = g * G; i < (g + 1) * G; i++) {
          const unsigned code = ci_kv_dev_code(row, i, bits);
          const float idx = bits == 8 ? (float)(int8_t)(uint8_t)code : (float)code;
          x[i] = CI_KV_FMUL(CI_KV_FADD(idx, zp), sc);
        }
      }
    }
    break;
  default: /* bf16 */
    for (int i = 0; i < D; i++) x[i] = ci_kv_dev_bf16(row + 2 * i);
  }
}

#endif
