/* MLX affine weights on the GPU: their device layout and how a code becomes a weight.
 *
 * Layout. ci_cuda_affine_upload repacks MLX's row-major codes once, at load, into the order the
 * tensor-core kernels consume them. The matrix is cut into tiles of 16 rows and each tile's
 * columns into quads of 64 (the last tile and quad padded with zero codes). One (tile, quad) block
 * is 32 lanes x 16 bytes for q4 (512 bytes) and two such halves for q8 (1024 bytes); blocks are
 * stored tile by tile, a tile's quads in column order. Lane l's bytes hold exactly the codes of its
 * mma.sync m16n8k16 A fragments for the quad's four k-steps: with g = l / 4 and t = l % 4, fragment
 * register j (0-3) of k-step s holds rows g + 8 (j & 1), columns 16 s + 2 t + 8 (j >> 1) + e for
 * e = 0, 1. q4: the lane's word s, register j's two codes in bits [4 j, 4 j + 4) (e = 0) and
 * [16 + 4 j, 20 + 4 j) (e = 1). q8: half s / 2, the lane's words 2 (s % 2) and 2 (s % 2) + 1,
 * register j in bytes 2 (j & 1), + 1 of word j >> 1. A warp then reads a tile's quad with one
 * 16-byte load per lane (two for q8), and a kernel stage of a tile is one contiguous copy.
 *
 * Scales and biases: one 32-bit word per group (scale in the low half, bias in the high half,
 * both in the checkpoint's 16-bit type), stored tile by tile, group by group, the 16 rows of a
 * group together.
 *
 * Arithmetic. Every path that multiplies an affine matrix (the small-batch kernel, the
 * dequantisation ahead of cuBLASLt) turns code q of a group with scale s and bias b into the bf16
 * weight bf16(fma(s, q, b)) with the same operations (ci_affine_fragment, and its half-fragment
 * form for the small-batch kernel's two-warp blocks), so a row's product has the same bits
 * whichever path runs it. */
#ifndef CI_BACKEND_CUDA_CUDA_AFFINE_CUH
#define CI_BACKEND_CUDA_CUDA_AFFINE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

enum { CI_AFFINE_TILE_ROWS = 16, CI_AFFINE_QUAD_COLS = 64 };

static inline __host__ __device__ int64_t ci_affine_tiles(int64_t n) {
  return (n + 15) / 16;
}
static inline __host__ __device__ int64_t ci_affine_quads(int64_t k) {
  return (k + 63) / 64;
}
/* Bytes of one (tile, quad) block. */
static inline __host__ __device__ int ci_affine_quad_bytes(int bits) {
  return 128 * bits;
}
static inline __host__ __device__ size_t ci_affine_code_bytes(int64_t n, int64_t k, int bits) {
  return (size_t)(ci_affine_tiles(n) * ci_affine_quads(k)) * (size_t)ci_affine_quad_bytes(bits);
}
/* Index of the (scale, bias) word of row r, group `group`, in a matrix of `groups` groups a row. */
static inline __host__ __device__ int64_t ci_affine_pair_index(int64_t r, int64_t group,
                                                               int64_t groups) {
  return ((r / 16) * groups + group) * 16 + r % 16;
}

/* Where code (r, c) lives: its byte offset in the repacked codes, and its shift in that byte. */
static inline __host__ __device__ int64_t ci_affine_code_offset(int bits, int64_t quads, int64_t r,
                                                                int64_t c, int *shift) {
  const int64_t block = (r / 16) * quads + c / 64;
  const int rr = (int)(r % 16), cc = (int)(c % 64);
  const int g = rr % 8, s = cc / 16, t = (cc % 8) / 2, e = cc % 2;
  const int j = rr / 8 + 2 * ((cc % 16) / 8), lane = 4 * g + t;
  if (bits == 4) {
    const int bit = 4 * j + 16 * e;
    *shift = bit % 8;
    return block * 512 + lane * 16 + s * 4 + bit / 8;
  }
  *shift = 0;
  return block * 1024 + (s / 2) * 512 + lane * 16 + ((s % 2) * 2 + j / 2) * 4 + (j % 2) * 2 + e;
}

/* Output word i of the repacked codes, gathered from MLX's row-major codes `raw` of an [n, k]
 * matrix (q4: two codes a byte, the even column in the low nibble; q8: a code a byte). */
static inline __host__ __device__ uint32_t ci_affine_repacked_word(const uint8_t *raw, int bits,
                                                                   int64_t n, int64_t k,
                                                                   int64_t i) {
  const int words_per_block = 32 * bits; /* 128 (q4), 256 (q8) */
  const int64_t block = i / words_per_block, quads = ci_affine_quads(k);
  const int64_t tile = block / quads, quad = block % quads;
  const int within = (int)(i % words_per_block);
  const int half = within / 128, lane = (within % 128) / 4, word = within % 4;
  const int g = lane / 4, t = lane % 4;
  uint32_t out = 0;
  for (int b = 0; b < 8; b++) { /* q4: the 8 codes (j, e) of word s; q8: bytes 0-3 */
    if (bits == 8 && b >= 4) break;
    int j, e, s;
    if (bits == 4) {
      j = b % 4, e = b / 4, s = word;
    } else {
      j = (word % 2) * 2 + b / 2, e = b % 2, s = 2 * half + word / 2;
    }
    const int64_t r = tile * 16 + g + 8 * (j & 1),
                  c = quad * 64 + 16 * s + 2 * t + 8 * (j >> 1) + e;
    uint32_t q = 0;
    if (r < n && c < k)
      q = bits == 4 ? (raw[(r * k + c) / 2] >> (4 * (c % 2))) & 0xfu : raw[r * k + c];
    out |= bits == 4 ? q << (4 * j + 16 * e) : q << (8 * b);
  }
  return out;
}

#ifdef __CUDACC__
/* The scale and bias of a packed pair, as f32 (f16: 1, bf16: 0). */
__device__ static inline void ci_affine_unpack(uint32_t pair, int f16, float *s, float *b) {
  const uint16_t lo = (uint16_t)(pair & 0xffffu), hi = (uint16_t)(pair >> 16);
  if (f16) {
    *s = __half2float(__ushort_as_half(lo));
    *b = __half2float(__ushort_as_half(hi));
  } else {
    *s = __bfloat162float(__ushort_as_bfloat16(lo));
    *b = __bfloat162float(__ushort_as_bfloat16(hi));
  }
}

/* Codes (b0, b1) of byte positions of q8 word w as exact f32 (2^23 + q - 2^23). */
__device__ static inline float ci_affine_byte_f32(uint32_t w, int byte) {
  return __int_as_float((int)__byte_perm(w, 0x4B000000u, 0x7440u + (unsigned)byte)) - 8388608.0f;
}

/* The scales and biases of a fragment's rows g (index 0) and g + 8 (index 1) in one group: bf16
 * pairs as bf16 pairs (s, s) and (b, b), f16 pairs as f32. */
typedef struct {
  __nv_bfloat162 s2[2], b2[2];
  float s[2], b[2];
} ci_affine_rows;

/* The rows' scales and biases from their stored words. q4 takes each as the broadcast of one
 * half of the stored word, which its bf16 fma reads as an operand swizzle (no instruction; q4 8B
 * step 242 -> 260 tok/s with the one-LOP3 nibble below); q8 builds them from the halves, which
 * measured 1-4% faster there than the broadcast form (H200, kernel alone). */
template <int BITS>
__device__ static inline ci_affine_rows ci_affine_rows_of(uint32_t pair_lo, uint32_t pair_hi,
                                                          int f16) {
  ci_affine_rows r;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const uint32_t pair = h ? pair_hi : pair_lo;
    if (f16) {
      ci_affine_unpack(pair, 1, &r.s[h], &r.b[h]);
    } else if (BITS == 4) {
      const __nv_bfloat162 sb = *(const __nv_bfloat162 *)&pair;
      r.s2[h] = __low2bfloat162(sb);
      r.b2[h] = __high2bfloat162(sb);
    } else {
      const __nv_bfloat16 s = __ushort_as_bfloat16((uint16_t)(pair & 0xffffu));
      const __nv_bfloat16 b = __ushort_as_bfloat16((uint16_t)(pair >> 16));
      r.s2[h] = __halves2bfloat162(s, s);
      r.b2[h] = __halves2bfloat162(b, b);
    }
  }
  return r;
}

/* (codes & 0x000f000f) | 0x43004300 in one LOP3: two nibbles as the bf16 pair (128 + q0, 128 + q1)
 * (0x4300 | q is the bf16 of 128 + q, exactly). Written as PTX: from C the compiler emits an AND
 * and an OR, each with its immediate. */
__device__ static inline uint32_t ci_affine_q4_biased(uint32_t codes) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(codes), "n"(0x000f000f), "n"(0x43004300));
  return r;
}

/* The four A-fragment registers (bf16 pairs) of one k-step from the lane's code words (q4: word
 * s of the quad; q8: the step's two words) and its rows' scales and biases. bf16 pairs: fma in
 * bf16 pairs (one rounding); f16 pairs: fma in f32, then rounded to bf16. */
template <int BITS>
__device__ static inline void ci_affine_fragment(const uint32_t *words, const ci_affine_rows &rows,
                                                 int f16, uint32_t a[4]) {
  float q[4][2];
  if (BITS == 8 || f16) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
      if (BITS == 4) {
        q[j][0] = (float)((words[0] >> (4 * j)) & 0xfu);
        q[j][1] = (float)((words[0] >> (16 + 4 * j)) & 0xfu);
      } else {
        q[j][0] = ci_affine_byte_f32(words[j >> 1], 2 * (j & 1));
        q[j][1] = ci_affine_byte_f32(words[j >> 1], 2 * (j & 1) + 1);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < 4; j++) {
    __nv_bfloat162 w2;
    if (!f16) {
      __nv_bfloat162 q2;
      if (BITS == 4) {
        const uint32_t packed = ci_affine_q4_biased(words[0] >> (4 * j));
        const uint32_t c128 = 0x43004300u; /* bf16 pair (128, 128) */
        q2 = __hsub2(*(const __nv_bfloat162 *)&packed, *(const __nv_bfloat162 *)&c128);
      } else {
        q2 = __floats2bfloat162_rn(q[j][0], q[j][1]);
      }
      w2 = __hfma2(rows.s2[j & 1], q2, rows.b2[j & 1]);
    } else {
      w2 = __floats2bfloat162_rn(__fmaf_rn(rows.s[j & 1], q[j][0], rows.b[j & 1]),
                                 __fmaf_rn(rows.s[j & 1], q[j][1], rows.b[j & 1]));
    }
    a[j] = *(const uint32_t *)&w2;
  }
}

/* Half an A fragment: the registers of the fragment's rows g + 8 half only (half 0: registers 0
 * and 2; half 1: registers 1 and 3), placed in registers 0 and 2 with registers 1 and 3 zero, so
 * a warp that owns 8 of a tile's 16 rows multiplies them as the fragment's rows g (its mma's
 * rows g + 8 are zero). `rows` holds the scale and bias of row g + 8 half at index 0. Each
 * weight is computed exactly as ci_affine_fragment computes it. */
template <int BITS>
__device__ static inline void ci_affine_half_fragment(const uint32_t *words, int half,
                                                      const ci_affine_rows &rows, int f16,
                                                      uint32_t a[4]) {
  a[1] = a[3] = 0u;
#pragma unroll
  for (int r = 0; r < 2; r++) { /* fragment register j = half + 2 r */
    float q0, q1;
    uint32_t packed = 0u;
    if (BITS == 4) {
      const uint32_t codes = words[0] >> (4 * half + 8 * r); /* nibbles j, 16 + 4 j at 0, 16 */
      packed = ci_affine_q4_biased(codes);
      q0 = (float)(codes & 0xfu);
      q1 = (float)((codes >> 16) & 0xfu);
    } else {
      q0 = ci_affine_byte_f32(words[r], 2 * half);
      q1 = ci_affine_byte_f32(words[r], 2 * half + 1);
    }
    __nv_bfloat162 w2;
    if (!f16) {
      __nv_bfloat162 q2;
      if (BITS == 4) {
        const uint32_t c128 = 0x43004300u;
        q2 = __hsub2(*(const __nv_bfloat162 *)&packed, *(const __nv_bfloat162 *)&c128);
      } else {
        q2 = __floats2bfloat162_rn(q0, q1);
      }
      w2 = __hfma2(rows.s2[0], q2, rows.b2[0]);
    } else {
      w2 = __floats2bfloat162_rn(__fmaf_rn(rows.s[0], q0, rows.b[0]),
                                 __fmaf_rn(rows.s[0], q1, rows.b[0]));
    }
    a[2 * r] = *(const uint32_t *)&w2;
  }
}
#endif

#endif
