/* Tensor-core paged attention over bf16 KV (head_dim 64 or 128), for prefill and decode rows
 * alike.
 *
 * A block of four warps takes up to 64 packed query rows of one sequence and one KV head: the
 * query heads of the KV head's group (GQA) times consecutive positions, 16 packed rows per warp.
 * It walks the keys in tiles of 64 (staged in shared memory), computes S = Q K^T and O += P V
 * with mma.sync m16n8k16 (bf16 operands, f32 accumulation) and keeps an online softmax per row.
 *
 * Batch invariance: a row's result depends on its own query and keys only, never on which rows
 * share its block or its launch. Keys are split at fixed absolute boundaries of SPLIT positions;
 * within a split the tiles are fixed absolute ranges of 64 keys, visited in order, and a tile
 * holding none of a row's keys leaves that row's state bit for bit unchanged; the splits' states
 * are merged in split order by merge_state. A launch either walks every split of its rows in one
 * block (prefill: the merged state is kept in shared memory) or gives each split its own block
 * and merges the per-split states in a second kernel (decode: parallel over the keys) — both run
 * the same arithmetic in the same order, so a row comes out the same either way, whether it is a
 * decode row, a prefill row or a speculative verification row.
 *
 * Precision: with two input planes (exact) q and P enter the tensor cores as bf16 value plus
 * bf16 remainder (about 16 mantissa bits, like the matmuls); with one plane as bf16. */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_kv_codec.cuh"
#include "backend/cuda/cuda_mma.cuh"

#include <string.h>

/* FA_MAX_WARPS warps per block, 16 packed query rows per warp for prefill launches; decode
 * launches (one warp's 16 rows per tile) run cooperative blocks of FA_MAX_WARPS warps sharing
 * those 16 rows (a row's arithmetic does not depend on the block's width or mode). */
enum { FA_MAX_WARPS = 4, FA_MAX_ROWS = 16 * FA_MAX_WARPS, FA_KEYS = 64, FA_SPLIT = 128 };

/* The template argument QB of the kernels: 0 bf16 KV, 4 or 8 affine KV of that many bits,
 * FA_TURBO TurboQuant KV (2-4 bits per side, read at run time), FA_TURBO_V turbo-v KV (K 4
 * or 8 bits, V 2-4, read at run time). The two TurboQuant codecs stage row windows (fa_smem). */
enum { FA_TURBO = 1, FA_TURBO_V = 2 };
__host__ __device__ constexpr bool fa_windows(int qb) {
  return qb == FA_TURBO || qb == FA_TURBO_V;
}
/* The alignment of the staged windows (and the size of their copies): TurboQuant rows are 2-byte
 * aligned, 16-byte windows; turbo-v rows 4-byte aligned, 16-byte windows too, but 8-byte ones
 * with 8-bit K rows, whose slots then stay small enough for two blocks per SM (H200, 8B at 16k:
 * turbo-v 4,3 with 8-byte windows 142.6 tok/s, 16-byte ones 146-148). */
__host__ __device__ constexpr int fa_window_align(int qb, int k_bits) {
  return qb == FA_TURBO_V && k_bits == 8 ? 8 : 16;
}

typedef ci_cuda_kv_layout kv_layout;
typedef ci_cuda_seq_group seq_group;
typedef ci_cuda_attention_params attention_params;

__device__ static inline const uint8_t *fa_row_address(const kv_layout &L, int value, int32_t block,
                                                       int64_t slot, int head) {
  return L.slabs[block / L.blocks_per_slab] +
         (int64_t)(block % L.blocks_per_slab) * L.block_stride + (value ? L.v_offset : L.k_offset) +
         ((int64_t)head * L.block_tokens + slot) * (value ? L.v_row_bytes : L.k_row_bytes);
}

/* The bytes of the larger stored row (K or V): what a staging slot holds. */
__host__ __device__ static inline int64_t fa_staged_row_bytes(const kv_layout &L) {
  return L.k_row_bytes > L.v_row_bytes ? L.k_row_bytes : L.v_row_bytes;
}

__device__ static inline uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *(uint32_t *)&v;
}

/* The bf16 remainders x - bf16(x) of a pair, packed. */
__device__ static inline uint32_t pack_bf16_rest(float lo, float hi) {
  const float rl = lo - __bfloat162float(__float2bfloat16_rn(lo));
  const float rh = hi - __bfloat162float(__float2bfloat16_rn(hi));
  return pack_bf16(rl, rh);
}

/* x <- H_D (s . x) / sqrt(D) for one vector held by a warp (lane l holds element l + 32 j in
 * v[j]): the butterflies of ci_kv_dev_fwht in its stage order (len = 1, 2, ... D / 2; the lower
 * element of a pair becomes a + b, the upper a - b), lanes exchanging by shuffle where len < 32,
 * so each element sees the operations of fa_block_fwht in the same order and the result is the
 * same to the bit. */
template <int D>
__device__ static inline void fa_warp_rotate(float (&v)[D / 32], const float *signs) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < D / 32; j++) v[j] = __fmul_rn(signs[lane + 32 * j], v[j]);
#pragma unroll
  for (int len = 1; len < 32; len <<= 1)
#pragma unroll
    for (int j = 0; j < D / 32; j++) {
      const float other = __shfl_xor_sync(0xffffffffu, v[j], len);
      v[j] = lane & len ? __fsub_rn(other, v[j]) : __fadd_rn(v[j], other);
    }
#pragma unroll
  for (int stride = 1; stride < D / 32; stride <<= 1) /* len = 32 stride */
#pragma unroll
    for (int j = 0; j < D / 32; j++)
      if (!(j & stride)) {
        const float a = v[j], b = v[j + stride];
        v[j] = __fadd_rn(a, b);
        v[j + stride] = __fsub_rn(a, b);
      }
  const float scale = 1.0f / sqrtf((float)D);
#pragma unroll
  for (int j = 0; j < D / 32; j++) v[j] = __fmul_rn(v[j], scale);
}

/* Folds one split's softmax state (pm, pl, pacc) into the running total (tm, tl, tacc). A split
 * with no key of the row (pl == 0) changes nothing; the first split with keys is copied. The
 * explicit roundings keep the compiler from contracting differently at the two call sites. */
__device__ static inline void merge_scalars(float &tm, float &tl, float pm, float pl, float &ct,
                                            float &cp) {
  if (pl == 0.0f) {
    ct = 1.0f;
    cp = 0.0f;
    return;
  }
  if (tl == 0.0f) {
    tm = pm;
    tl = pl;
    ct = 0.0f;
    cp = 1.0f;
    return;
  }
  const float m = fmaxf(tm, pm);
  ct = __expf(tm - m);
  cp = __expf(pm - m);
  tl = __fadd_rn(__fmul_rn(tl, ct), __fmul_rn(pl, cp));
  tm = m;
}

/* cp == 0: nothing to add; ct == 0: the first split with keys. Selects, not branches: in a fold of
 * many splits the dependent chain is then a multiply, an add and the selects a split. As branches,
 * ~30 instructions a split waited on each other (Nsight Compute: a warp issued once per 6.6
 * cycles, mostly on fixed-latency dependencies); the merge of the 8B's 129 splits at 16k tokens
 * took 15.2 us a launch, 9.6 with the selects and the chunked factors of flash_merge_kernel (8B
 * bf16 batch-1 decode at 16k tokens 160.5 -> 166.0 tok/s, H200). */
__device__ static inline float merge_value(float t, float p, float ct, float cp) {
  const float merged = __fadd_rn(__fmul_rn(t, ct), __fmul_rn(p, cp));
  return cp == 0.0f ? t : ct == 0.0f ? p : merged;
}

/* The end of a tile's softmax step for a lane's two rows: the row sums completed over the four
 * lanes of each row, the running sums l corrected and increased, the N accumulator fragments
 * rescaled by the rows' corrections. One code for the per-warp (prefill) and the cooperative
 * (decode) blocks, so both keep the same arithmetic. */
template <int N>
__device__ static inline void fa_fold_tile(float (&row_sum)[2], float (&l)[2],
                                           const float (&correction)[2], float (&acc)[N][4]) {
#pragma unroll
  for (int h = 0; h < 2; h++) {
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 1);
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 2);
    l[h] = __fadd_rn(__fmul_rn(l[h], correction[h]), row_sum[h]);
  }
#pragma unroll
  for (int i = 0; i < N; i++)
#pragma unroll
    for (int c = 0; c < 4; c++) acc[i][c] = __fmul_rn(acc[i][c], correction[c >> 1]);
}

/* The launch's sequence owning query tile x: the number of sequences starting at or before x,
 * counted by one ballot per 32 sequences (every lane of the warp must call it). */
__device__ static inline int fa_seq_of_tile(const seq_group *g, int x) {
  static_assert(CI_CUDA_MAX_SEQS <= 64, "two ballots cover the sequences of a launch");
  const int lane = threadIdx.x & 31;
  const int a = lane < g->n && g->tile_start[lane] <= x;
  const int b = lane + 32 < g->n && g->tile_start[lane + 32] <= x;
  return __popc(__ballot_sync(0xffffffffu, a)) + __popc(__ballot_sync(0xffffffffu, b)) - 1;
}

/* The same for row x of the launch (row_start). */
__device__ static inline int fa_seq_of_row(const seq_group *g, int x) {
  const int lane = threadIdx.x & 31;
  const int a = lane < g->n && g->row_start[lane] <= x;
  const int b = lane + 32 < g->n && g->row_start[lane + 32] <= x;
  return __popc(__ballot_sync(0xffffffffu, a)) + __popc(__ballot_sync(0xffffffffu, b)) - 1;
}

struct fa_shared_tail {
  const uint8_t *rows[2][2][FA_KEYS]; /* [stage][K, V][key of the tile]: row address or NULL */
  int32_t pos[FA_MAX_ROWS];
};

/* Shared memory: the tiles' row addresses and the block's positions, then two stages of K and V
 * tiles [FA_KEYS][STRIDE] bf16 (the next tile loads while the current one is used), then (walking
 * every split) the merged state of each warp's rows per lane, which a parallel launch does not
 * need (it launches with PARALLEL_BYTES, so more of its blocks fit an SM).
 *
 * Affine KV (QB = 4 or 8 bits): the stored rows (codes, then the groups' bf16 scales and biases)
 * are copied as they are into stages of raw_stride-byte slots (at most RAW_STRIDE: the launch
 * sizes its shared memory for its rows), and the block decodes the current stage into one bf16
 * tile, which the tensor cores then read as they read bf16 KV. Prefill blocks keep two stages;
 * cooperative (decode) blocks one, which they refill with the next tile as soon as the current
 * one is decoded; they are held to 128 registers and their decoded tile has no padding (chunks
 * swizzled, fa_tile_at): four blocks per SM where the shared memory allows it (head_dim 128:
 * affine, TurboQuant, turbo-v with 4-bit K; H200, 8B at 16k, batch 1: affine:4 157.0 ->
 * 158.4-159.9 tok/s, affine:8 150.8 -> 153.9, turbo:4 143.6 -> 146.0-146.7, turbo-v:8,3 135.2
 * -> 140.5-140.7 (three blocks either way, fewer barriers); 16 sequences of 4k: turbo-v:8,3
 * 1,210 -> 1,391, affine:8 1,609 -> 1,693).
 * TurboQuant KV (QB = FA_TURBO): its rows (codes, then fp16 ν) are 2-byte aligned, so each slot
 * holds the 16-byte-aligned window of global memory that covers its row (the row starts at byte
 * address & 15 of the slot; the allocation's tail slack covers a window past the last row), and
 * the tile holds ν·ĉ[code] in the rotated basis (q is rotated before: by a small kernel for
 * prefill launches, inside cooperative decode blocks (H200, 8B at 128 tokens: turbo:4 +1-2%,
 * level at 16k); the output after, by the merge or that kernel). turbo-v KV (QB = FA_TURBO_V)
 * stages 8-byte-aligned windows of its 4-byte-aligned rows the same way (its K and V rows differ in
 * size); its K tile is in the model basis, its V tile in the rotated one (output un-rotated). */
template <int D, int W, bool COOP = false, int QB = 0> struct fa_smem {
  /* decoded quantized tiles of decode blocks: no padding, chunks swizzled (fa_tile_at), so that
   * more of these blocks fit an SM */
  static constexpr bool SWIZZLE = COOP && QB != 0;
  static constexpr int STRIDE = SWIZZLE ? D : D + 8; /* bf16 elements per staged key row */
  static constexpr size_t STAGE_ELEMS = (size_t)2 * FA_KEYS * STRIDE;
  static constexpr size_t TAIL_BYTES = (sizeof(fa_shared_tail) + 15) / 16 * 16;
  /* cooperative blocks: the tile's weights P [16][P_STRIDE] f32 and each warp's row maxima */
  static constexpr int P_STRIDE = FA_KEYS + 4;
  static constexpr size_t EXTRA_BYTES = COOP ? (size_t)(16 * P_STRIDE + W * 16) * 4 : 0;
  static constexpr size_t KV_BYTES = (QB ? 1 : 2) * STAGE_ELEMS * 2;
  /* a stored affine row: D QB-bit codes, then a bf16 scale and bias per group (groups >= 32);
   * TurboQuant: the window of a row of at most 4-bit codes and ν; turbo-v: the 8-byte window of
   * a K row of 8-bit codes and its groups' sc and zp (the larger row) */
  static constexpr int RAW_STRIDE = QB == FA_TURBO     ? D / 2 + 16
                                    : QB == FA_TURBO_V ? (D + D / 8 + 4 + 7) / 8 * 8
                                    : QB               ? (D * QB / 8 + 4 * (D / 32) + 15) / 16 * 16
                                                       : 0;
  /* the V slots' bound: as K, but turbo-v decode blocks' V slots with 8-bit K rows are their own
   * (k_slot), and with 4-bit ones both slots are at most D / 2 + 16 bytes */
  static constexpr int V_RAW_STRIDE = QB == FA_TURBO_V && COOP ? D / 2 + 16 : RAW_STRIDE;
  static constexpr size_t RAW_STAGE = (size_t)FA_KEYS * (RAW_STRIDE + V_RAW_STRIDE);
  /* stored-row stages: cooperative (decode) blocks decode a tile as soon as it lands and copy
   * the next one into the same stage while they compute, so one stage serves them (and the
   * smaller blocks fit four per SM) */
  static constexpr int RAW_STAGES = COOP ? 1 : 2;
  static constexpr size_t RAW_BYTES = RAW_STAGES * RAW_STAGE;
  static constexpr int ACC_REGS = D / 8 * 4;
  static constexpr size_t TOTAL_BYTES = (size_t)W * (ACC_REGS + 4) * 32 * 4;
  static constexpr size_t BYTES = TAIL_BYTES + EXTRA_BYTES + KV_BYTES + RAW_BYTES + TOTAL_BYTES;
  static constexpr size_t PARALLEL_BYTES = TAIL_BYTES + EXTRA_BYTES + KV_BYTES + RAW_BYTES;
  /* the slot of a stored row of row_bytes, and the bytes a launch needs for such rows: head_dim
   * 128 rounds the row up to 8 bytes (8-bit rows of groups of 64: 136-byte slots; with two
   * stages they allowed three blocks per SM where 144-byte ones allowed two; H200, 8B at 16k:
   * 148 -> 152 tok/s); head_dim 64 keeps
   * RAW_STRIDE (its blocks are bound by registers to four per SM either way, and the smaller
   * slots measured 6% slower on the 1B geometry); TurboQuant and turbo-v: the aligned windows
   * covering a 2- (TurboQuant) or 4-byte-aligned (turbo-v) row, fa_window_align (row_bytes: the
   * larger of the K and V rows) */
  __host__ __device__ static constexpr int raw_stride(int64_t row_bytes, int k_bits) {
    if (fa_windows(QB)) {
      const int align = fa_window_align(QB, k_bits), row_align = QB == FA_TURBO ? 2 : 4;
      return (int)((row_bytes + align - row_align + align - 1) & ~(int64_t)(align - 1));
    }
    return QB ? (D >= 128 ? (int)((row_bytes + 7) & ~(int64_t)7) : RAW_STRIDE) : 0;
  }
  /* the slots of a stage's K rows and of its V rows (FA_KEYS K slots, then FA_KEYS V slots):
   * alike (the larger row's), but turbo-v decode blocks with 8-bit K rows give each side the
   * window of its own row (head_dim 128, 3-bit V: 152- and 64-byte slots instead of 152 for
   * both, so four blocks fit an SM instead of three; H200, 8B at 16k, batch 1: turbo-v 8,3
   * 142.7-143.2 -> 147.8-148.0 tok/s, 16 sequences at 4k 1,421 -> 1,507; own slots for every
   * windowed codec cost the others ~1%) */
  __host__ __device__ static bool own_slots(const kv_layout &L) {
    return QB == FA_TURBO_V && COOP && L.k_bits == 8;
  }
  __host__ __device__ static int k_slot(const kv_layout &L) {
    return raw_stride(own_slots(L) ? L.k_row_bytes : fa_staged_row_bytes(L), L.k_bits);
  }
  __host__ __device__ static int v_slot(const kv_layout &L) {
    return raw_stride(own_slots(L) ? L.v_row_bytes : fa_staged_row_bytes(L), L.k_bits);
  }
  static size_t launch_bytes(const kv_layout &L, bool parallel) {
    return (parallel ? PARALLEL_BYTES : BYTES) - RAW_BYTES +
           (size_t)RAW_STAGES * FA_KEYS * (k_slot(L) + v_slot(L));
  }
};

/* The element offset of 16-byte chunk c (dims [8 c, 8 c + 8)) of row r of a bf16 tile of
 * `stride` elements per row. SWIZZLE tiles (decoded quantized KV in decode blocks) have no padding
 * (stride D) and keep chunk c at c ^ (r & 7), so the 8 rows an ldmatrix reads at once still fall
 * in 8 different bank groups; the others spread rows by their 8 elements of padding. */
template <bool SWIZZLE> __device__ static inline int fa_tile_at(int r, int c, int stride) {
  return r * stride + 8 * (SWIZZLE ? c ^ (r & 7) : c);
}

/* Decodes the RAW stage's 2 * FA_KEYS stored affine rows (K then V) into the bf16 tile: thread t
 * takes dims [8 c, 8 c + 8) of rows t / (D / 8), + THREADS / (D / 8), ... (c = t % (D / 8)), one
 * group's scale and bias each, and writes them as one 16-byte store. Rows copied as zeros (no key
 * of the block) decode to zeros. A fixed walk (PASSES rows per thread, addresses stepped, not
 * recomputed) and a handful of instructions per pair: the decode is most of what a quantized
 * decode block issues (H200, 8B at 16k, affine:4: 14.0M instructions a layer against bf16 KV's
 * 7.8M, at 57% of the issue slots). */
template <int D, int QB, int THREADS, bool SWIZZLE>
__device__ static inline void fa_decode_affine(const uint8_t *raw, int raw_stride,
                                               __nv_bfloat16 *tile, int stride, int group_shift) {
  constexpr int CHUNKS = D / 8, ROWS_PER_PASS = THREADS / CHUNKS;
  constexpr int PASSES = 2 * FA_KEYS / ROWS_PER_PASS;
  static_assert(THREADS % CHUNKS == 0 && 2 * FA_KEYS % ROWS_PER_PASS == 0, "decode walk");
  const int c = threadIdx.x % CHUNKS, row0 = threadIdx.x / CHUNKS;
  const int gi = (8 * c) >> group_shift, groups = D >> group_shift;
  const int scale_at = D * QB / 8 + 2 * gi, bias_at = D * QB / 8 + 2 * (groups + gi);
  const uint8_t *row = raw + row0 * raw_stride;
#pragma unroll 4
  for (int pass = 0; pass < PASSES; pass++, row += ROWS_PER_PASS * raw_stride) {
    const int r = row0 + pass * ROWS_PER_PASS;
    const uint32_t scale_bits = *(const uint16_t *)(row + scale_at);
    const uint32_t bias_bits = *(const uint16_t *)(row + bias_at);
    uint32_t out[4];
    if (QB == 4) {
      /* in bf16 pairs: byte i of the codes holds elements 2 i (low nibble) and 2 i + 1; the
       * pair as bf16 exactly (128 + code, minus 128), then code * scale + bias, rounded once
       * (the stored bf16 scale and bias as they are, in both halves) */
      const uint32_t w = *(const uint32_t *)(row + 4 * c), high = w >> 4;
      const uint32_t s2u = __byte_perm(scale_bits, 0, 0x1010),
                     b2u = __byte_perm(bias_bits, 0, 0x1010);
      const __nv_bfloat162 s2 = *(const __nv_bfloat162 *)&s2u, b2 = *(const __nv_bfloat162 *)&b2u;
      const __nv_bfloat162 magic = __bfloat162bfloat162(__float2bfloat16_rn(128.0f));
#pragma unroll
      for (int i = 0; i < 4; i++) {
        uint32_t x = __byte_perm(w, high, (uint32_t)(i | (4 + i) << 8));
        /* (x & 0x000f000f) | 0x43004300 as one instruction */
        asm("lop3.b32 %0, %0, %1, %2, 0xEA;" : "+r"(x) : "r"(0x000f000fu), "n"(0x43004300));
        const __nv_bfloat162 c2 = __hsub2(*(const __nv_bfloat162 *)&x, magic);
        const __nv_bfloat162 v2 = __hfma2(c2, s2, b2);
        out[i] = *(const uint32_t *)&v2;
      }
    } else {
      const float scale = __uint_as_float(scale_bits << 16),
                  bias = __uint_as_float(bias_bits << 16);
      const uint2 wv = *(const uint2 *)(row + 8 * c);
#pragma unroll
      for (int i = 0; i < 4; i++) {
        float v[2];
#pragma unroll
        for (int j = 0; j < 2; j++) {
          const int e = 2 * i + j; /* element e: byte e of the codes */
          /* the code as a float, exactly: 2^23 + code (its byte under 0x4b000000), minus 2^23 */
          const uint32_t magic =
              __byte_perm(e < 4 ? wv.x : wv.y, 0x4b000000u, (uint32_t)(0x7650 | (e & 3)));
          const float x = __fsub_rn(__uint_as_float(magic), 8388608.0f);
          v[j] = __fmaf_rn(scale, x, bias);
        }
        out[i] = pack_bf16(v[0], v[1]);
      }
    }
    *(uint4 *)(tile + fa_tile_at<SWIZZLE>(r, c, stride)) =
        make_uint4(out[0], out[1], out[2], out[3]);
  }
}

/* Decodes the RAW stage's 2 * FA_KEYS TurboQuant row windows (K then V) into the bf16 tile in
 * the rotated basis, ν·ĉ[code] per element: thread t takes dims [8 c, 8 c + 8) of rows
 * t / (D / 8), + THREADS / (D / 8), ... (c = t % (D / 8)), whose codes are `bits` bytes of the
 * LSB-first stream; lane i holds centroid i of the K (ck) and V (cv) codebooks, read by shuffle.
 * rows[r] is row r's global address (NULL: copied as zeros, ν = 0, decodes to zeros). */
template <int D, int THREADS, bool SWIZZLE>
__device__ static inline void
fa_decode_turbo(const uint8_t *raw, int raw_stride, const uint8_t *const *rows, __nv_bfloat16 *tile,
                int stride, int k_bits, int v_bits, float ck, float cv) {
  constexpr int CHUNKS = D / 8, ROWS_PER_PASS = THREADS / CHUNKS;
  constexpr int PASSES = FA_KEYS / ROWS_PER_PASS;
  static_assert(THREADS % CHUNKS == 0 && FA_KEYS % ROWS_PER_PASS == 0, "decode walk");
  const int c = threadIdx.x % CHUNKS, row0 = threadIdx.x / CHUNKS;
  /* the K rows, then the V rows: a fixed walk of each, their width and codebook set once */
#pragma unroll
  for (int value = 0; value < 2; value++) {
    const int bits = value ? v_bits : k_bits, at = c * bits, nu_at = D * bits / 8;
    const unsigned mask = (1u << bits) - 1u;
    const float cb = value ? cv : ck;
#pragma unroll 4
    for (int pass = 0; pass < PASSES; pass++) {
      const int r = value * FA_KEYS + row0 + pass * ROWS_PER_PASS;
      const uint8_t *row = raw + r * raw_stride + ((uintptr_t)rows[r] & 15);
      const float nu = __half2float(__ushort_as_half(*(const unsigned short *)(row + nu_at)));
      /* the chunk's bits bytes from byte `at` lie in one or two words */
      const uint32_t w0 = *(const uint32_t *)((uintptr_t)(row + at) & ~(uintptr_t)3);
      const uint32_t w1 = *(const uint32_t *)((uintptr_t)(row + at + bits - 1) & ~(uintptr_t)3);
      const uint32_t w = __funnelshift_r(w0, w1, 8 * (unsigned)((uintptr_t)(row + at) & 3));
      uint32_t out[4];
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const float x0 = __shfl_sync(0xffffffffu, cb, (int)((w >> (bits * (2 * i))) & mask));
        const float x1 = __shfl_sync(0xffffffffu, cb, (int)((w >> (bits * (2 * i + 1))) & mask));
        out[i] = pack_bf16(__fmul_rn(nu, x0), __fmul_rn(nu, x1));
      }
      *(uint4 *)(tile + fa_tile_at<SWIZZLE>(r, c, stride)) =
          make_uint4(out[0], out[1], out[2], out[3]);
    }
  }
}

/* The same for turbo-v row windows: K rows (4-bit codes, or 8-bit signed ones, then per
 * 32-group fp16 sc and zp) decode to (idx + zp)·sc in the model basis, V rows (2-4 bit codes, then
 * a fp16 r per 32-group) to ĉ[code]·r in the rotated basis; lane i holds centroid i of the V
 * codebook. The stage holds FA_KEYS K slots of k_slot bytes, then FA_KEYS V slots of v_slot. */
template <int D, int THREADS, bool SWIZZLE>
__device__ static inline void
fa_decode_turbo_v(const uint8_t *raw, int k_slot, int v_slot, const uint8_t *const *rows,
                  __nv_bfloat16 *tile, int stride, int window, int k_bits, int v_bits, float cv) {
  constexpr int CHUNKS = D / 8, ROWS_PER_PASS = THREADS / CHUNKS, GROUPS = D / 32;
  static_assert(THREADS % CHUNKS == 0 && FA_KEYS % ROWS_PER_PASS == 0, "decode walk");
  const int c = threadIdx.x % CHUNKS, row0 = threadIdx.x / CHUNKS, g = c / 4;
  /* the K rows, then the V rows (each in its window, 4-byte aligned) */
#pragma unroll 4
  for (int r = row0; r < FA_KEYS; r += ROWS_PER_PASS) {
    const uint8_t *row = raw + r * k_slot + ((uintptr_t)rows[r] & (uintptr_t)(window - 1));
    const uint8_t *tail = row + D * k_bits / 8;
    const float sc = __half2float(__ushort_as_half(*(const unsigned short *)(tail + 2 * g)));
    const float zp =
        __half2float(__ushort_as_half(*(const unsigned short *)(tail + 2 * (GROUPS + g))));
    const uint32_t w0 = *(const uint32_t *)(row + c * k_bits);
    const uint32_t w1 = k_bits == 8 ? *(const uint32_t *)(row + c * k_bits + 4) : 0u;
    uint32_t out[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
      float x[2];
#pragma unroll
      for (int j = 0; j < 2; j++) {
        const int e = 2 * i + j;
        const float idx = k_bits == 8 ? (float)(int8_t)((e < 4 ? w0 : w1) >> (8 * (e & 3)))
                                      : (float)((w0 >> (4 * e)) & 0xfu);
        x[j] = __fmul_rn(__fadd_rn(idx, zp), sc);
      }
      out[i] = pack_bf16(x[0], x[1]);
    }
    *(uint4 *)(tile + fa_tile_at<SWIZZLE>(r, c, stride)) =
        make_uint4(out[0], out[1], out[2], out[3]);
  }
  const uint8_t *const v_raw = raw + FA_KEYS * k_slot;
  const unsigned mask = (1u << v_bits) - 1u;
#pragma unroll 4
  for (int r = row0; r < FA_KEYS; r += ROWS_PER_PASS) {
    const uint8_t *row =
        v_raw + r * v_slot + ((uintptr_t)rows[FA_KEYS + r] & (uintptr_t)(window - 1));
    const uint8_t *tail = row + D * v_bits / 8;
    const float rms = __half2float(__ushort_as_half(*(const unsigned short *)(tail + 2 * g)));
    const int at = c * v_bits;
    const uint32_t w0 = *(const uint32_t *)((uintptr_t)(row + at) & ~(uintptr_t)3);
    const uint32_t w1 = *(const uint32_t *)((uintptr_t)(row + at + v_bits - 1) & ~(uintptr_t)3);
    const uint32_t w = __funnelshift_r(w0, w1, 8 * (unsigned)((uintptr_t)(row + at) & 3));
    uint32_t out[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const float x0 = __shfl_sync(0xffffffffu, cv, (int)((w >> (v_bits * (2 * i))) & mask));
      const float x1 = __shfl_sync(0xffffffffu, cv, (int)((w >> (v_bits * (2 * i + 1))) & mask));
      out[i] = pack_bf16(__fmul_rn(x0, rms), __fmul_rn(x1, rms));
    }
    *(uint4 *)(tile + fa_tile_at<SWIZZLE>(FA_KEYS + r, c, stride)) =
        make_uint4(out[0], out[1], out[2], out[3]);
  }
}

/* COOP (decode): the W warps share one warp's 16 packed rows. Warp w computes the scores of keys
 * [16 w, 16 w + 16) of each tile, the tile's row maxima meet in shared memory (a maximum is
 * exact in any order), the weights P go through shared memory and every warp sums its rows' P
 * in the per-warp (prefill) order (per lane over the n-tiles in turn, then the two shuffles), and
 * warp w accumulates P V for head dims [w D / W, (w + 1) D / W): each output keeps the arithmetic
 * chain of a per-warp (prefill) block, so the rows stay bit-identical to prefill rows. */
template <int D, bool EXACT, int W, bool COOP, int QB = 0> /* launch bounds: see fa_smem */
__global__ static void __launch_bounds__(W * 32, (COOP && QB != 0) ? 4 : 0)
    flash_attention_kernel(kv_layout L, const seq_group *g, attention_params a,
                           ci_cuda_flash_params f, int *error_flag) {
  static_assert(!COOP || W == 4, "a cooperative block is four warps on 16 rows");
  static_assert(QB == 0 || (!EXACT && (QB == 4 || QB == 8 || fa_windows(QB))),
                "affine KV: 4 or 8 bits, fast; TurboQuant and turbo-v: fast");
  typedef fa_smem<D, W, COOP, QB> SM;
  extern __shared__ __align__(16) uint8_t smem[];
  fa_shared_tail *tail = (fa_shared_tail *)smem;
  /* stage i: K at i * STAGE_ELEMS, V after it (affine KV: one tile, decoded from raw stage i) */
  __nv_bfloat16 *stages = (__nv_bfloat16 *)(smem + SM::TAIL_BYTES + SM::EXTRA_BYTES);
  uint8_t *const raw = smem + SM::TAIL_BYTES + SM::EXTRA_BYTES + SM::KV_BYTES;
  /* raw: RAW_STAGES stages of FA_KEYS K slots, then FA_KEYS V slots */
  const int k_slot = SM::k_slot(L); /* bytes per slot */
  /* (SM::v_slot equals k_slot but for turbo-v decode blocks; spelled out so that the other
   * kernels know it at compile time) */
  const int v_slot = QB == FA_TURBO_V && COOP ? SM::v_slot(L) : k_slot;
  float *total = (float *)(smem + SM::TAIL_BYTES + SM::EXTRA_BYTES + SM::KV_BYTES +
                           (size_t)SM::RAW_STAGES * FA_KEYS *
                               (k_slot + v_slot));        /* [warp][ACC_REGS + 4][32] */
  float *const p_tile = (float *)(smem + SM::TAIL_BYTES); /* COOP: [16][P_STRIDE] */
  float *const row_max = p_tile + 16 * SM::P_STRIDE;      /* COOP: [W][16] */
  /* COOP: the accumulators of this warp's head dims [dim0, dim0 + D / 4), ACC_N of them */
  constexpr int ACC_N = COOP ? D / 32 : D / 8;

  const int G = f.group,
            QP = 16 * (COOP ? 1 : W) / G; /* query heads per KV head; positions per block */
  const int s = fa_seq_of_tile(g, blockIdx.x);
  const int first_local = (blockIdx.x - g->tile_start[s]) * QP;
  const int n_pos = min(QP, g->n_rows[s] - first_local);
  const int step_row0 = g->first_row[s] + first_local;   /* the step's row of position 0 */
  const int launch_row0 = g->row_start[s] + first_local; /* the launch's row of position 0 */
  const int kv_head = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row_warp = COOP ? 0 : warp; /* whose 16 packed rows this warp computes */
  const int dim0 = COOP ? warp * (D / 4) : 0;
  const int gid = lane >> 2, tig = lane & 3;

  /* the block's positions: step inputs, read before the wait (cuda_launch.cuh) */
  if (threadIdx.x < QP)
    tail->pos[threadIdx.x] = threadIdx.x < n_pos ? a.pos[step_row0 + threadIdx.x] : 0;
  ci_grid_begin();
  __syncthreads();
  int64_t p_max = -1, lo_min = INT64_MAX;
  for (int i = 0; i < n_pos; i++) {
    const int64_t p = tail->pos[i];
    const int64_t lo = a.window > 0 && p - a.window + 1 > 0 ? p - a.window + 1 : 0;
    p_max = p > p_max ? p : p_max;
    lo_min = lo < lo_min ? lo : lo_min;
  }
  const int64_t split_lo = lo_min / FA_SPLIT, split_hi = p_max / FA_SPLIT;
  int64_t first_split = split_lo, last_split = split_hi;
  if (f.parallel) {
    first_split = last_split = blockIdx.z;
    if (first_split < split_lo || first_split > split_hi) return;
  }

  /* this lane's two packed rows: r = warp*16 + gid (A) and + 8 (B) */
  int row_p[2], row_lo[2]; /* positions are int32 (a.pos) */
  int live[2], step_row[2], launch_row[2], head[2];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int r = row_warp * 16 + gid + 8 * h, qi = r / G;
    live[h] = qi < n_pos;
    step_row[h] = step_row0 + qi;
    launch_row[h] = launch_row0 + qi;
    head[h] = kv_head * G + r % G;
    row_p[h] = live[h] ? tail->pos[qi] : -1;
    row_lo[h] = a.window > 0 && row_p[h] - a.window + 1 > 0 ? row_p[h] - a.window + 1 : 0;
    if (!live[h]) row_lo[h] = INT_MAX;
  }
  const int warp_live = row_warp * 16 < n_pos * G;

  /* TurboQuant: lane i's centroid i of the K and V codebooks (fa_decode_turbo) */
  float turbo_k_centroid = 0.0f, turbo_v_centroid = 0.0f;
  if constexpr (fa_windows(QB)) {
    if (QB == FA_TURBO)
      turbo_k_centroid = lane < (1 << L.k_bits) ? ci_kv_centroids[L.k_bits][lane] : 0.0f;
    turbo_v_centroid = lane < (1 << L.v_bits) ? ci_kv_centroids[L.v_bits][lane] : 0.0f;
  }
  /* TurboQuant, cooperative blocks: each warp rotates some of the 16 packed rows' q into the
   * decoded-tile area (free until the first tile is decoded), q~ = H (s . q) / sqrt(D); prefill
   * blocks read q~ from f.q_rotated, written by fa_rotate_kernel */
  constexpr bool ROTATE_Q = COOP && QB == FA_TURBO;
  float *const q_rotated = (float *)stages; /* ROTATE_Q: [16][D] */
  if constexpr (ROTATE_Q) {
    for (int r = warp; r < 16; r += W) {
      if (r / G >= n_pos) break; /* the live rows come first */
      const float *src = a.q + ((int64_t)(step_row0 + r / G) * a.n_heads + kv_head * G + r % G) * D;
      float v[D / 32];
#pragma unroll
      for (int j = 0; j < D / 32; j++) v[j] = src[lane + 32 * j];
      fa_warp_rotate<D>(v, L.signs);
#pragma unroll
      for (int j = 0; j < D / 32; j++) q_rotated[r * D + lane + 32 * j] = v[j];
    }
    __syncthreads();
  }
  /* q as A fragments: k-step kk holds dims [16 kk, 16 kk + 16) */
  uint32_t qa[D / 16][4], ql[EXACT ? D / 16 : 1][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
    for (int half = 0; half < 2; half++) {
#pragma unroll
      for (int h = 0; h < 2; h++) {
        float2 x = make_float2(0.0f, 0.0f);
        if (live[h] && ROTATE_Q)
          x = *(const float2 *)(q_rotated + (gid + 8 * h) * D + 16 * kk + 8 * half + 2 * tig);
        else if (live[h])
          x = *(const float2 *)((QB == FA_TURBO
                                     ? f.q_rotated + (int64_t)launch_row[h] * a.n_heads * D
                                     : a.q + (int64_t)step_row[h] * a.n_heads * D) +
                                (int64_t)head[h] * D + 16 * kk + 8 * half + 2 * tig);
        qa[kk][2 * half + h] = pack_bf16(x.x, x.y);
        if (EXACT) ql[EXACT ? kk : 0][2 * half + h] = pack_bf16_rest(x.x, x.y);
      }
    }
  }

  float acc[ACC_N][4];
  float m[2], l[2];
  float *tot = total + (size_t)warp * (SM::ACC_REGS + 4) * 32;
  if (!f.parallel) {
    tot[(SM::ACC_REGS + 1) * 32 + lane] = 0.0f; /* tl of row A */
    tot[(SM::ACC_REGS + 3) * 32 + lane] = 0.0f; /* tl of row B */
  }
  /* the tiles of this block: fixed absolute ranges of FA_KEYS keys, split boundaries among
   * them; the keys outside [key_from, key_to] are staged as zeros */
  const int64_t key_from =
      f.parallel && first_split * FA_SPLIT > lo_min ? first_split * FA_SPLIT : lo_min;
  const int64_t key_to = f.parallel && first_split * FA_SPLIT + FA_SPLIT - 1 < p_max
                             ? first_split * FA_SPLIT + FA_SPLIT - 1
                             : p_max;
  const int64_t first_tile = key_from / FA_KEYS * FA_KEYS;
  int bad_block = 0;
  /* thread t looks up key t % FA_KEYS of a tile, K (t < FA_KEYS) or V: every block-table entry
   * first (independent loads, in flight together), then the row addresses */
  const int32_t *const table = g->table[s];
  const int64_t n_entries = g->n_entries[s];
  const unsigned block_tokens = (unsigned)L.block_tokens;
  auto find_rows = [&](int64_t tile0, int stage) {
    constexpr int PER_THREAD = (2 * FA_KEYS + W * 32 - 1) / (W * 32);
    int32_t block[PER_THREAD];
    unsigned slot[PER_THREAD];
#pragma unroll
    for (int i = 0; i < PER_THREAD; i++) {
      const unsigned t = threadIdx.x + i * W * 32;
      const unsigned key = (unsigned)tile0 + t % FA_KEYS; /* positions are int32 */
      const unsigned entry = key / block_tokens;
      slot[i] = key - entry * block_tokens;
      block[i] = t < 2 * FA_KEYS && key >= key_from && key <= key_to
                     ? (entry < n_entries ? __ldg(table + entry) : -1)
                     : INT32_MIN; /* no key of the rows */
    }
#pragma unroll
    for (int i = 0; i < PER_THREAD; i++) {
      const unsigned t = threadIdx.x + i * W * 32;
      if (t >= 2 * FA_KEYS) continue;
      const uint8_t *row = NULL;
      if (block[i] != INT32_MIN && block[i] < 0)
        bad_block = 1;
      else if (block[i] >= 0)
        row = fa_row_address(L, t / FA_KEYS, block[i], slot[i], kv_head);
      tail->rows[stage][t / FA_KEYS][t % FA_KEYS] = row;
    }
  };
  constexpr int CHUNKS = D / 8; /* 16-byte chunks of a key row */
  /* the 2 * FA_KEYS staged rows (K then V) in 16-byte chunks: thread t copies chunk t % CHUNKS
   * of rows t / CHUNKS, + ROWS_PER_PASS, ... (a fixed unrolled walk: a handful of instructions
   * per copy) */
  constexpr int ROWS_PER_PASS = W * 32 / CHUNKS, PASSES = 2 * FA_KEYS / ROWS_PER_PASS;
  static_assert(W * 32 % CHUNKS == 0 && 2 * FA_KEYS % ROWS_PER_PASS == 0, "copy walk");
  const unsigned copy_chunk = threadIdx.x % CHUNKS, copy_row0 = threadIdx.x / CHUNKS;
  /* affine KV: the stored rows' CHUNK-byte pieces (CHUNK 8 or 4, as the rows' alignment allows),
   * thread t copying pieces t, t + THREADS, ... of the 2 * FA_KEYS rows in row order */
  /* TurboQuant, turbo-v: the row's covering window in pieces of fa_window_align(QB) bytes, from
   * the row's address rounded down to that alignment */
  const int raw_slot = k_slot; /* K and V slots alike (but see issue_raw_copies) */
  const int raw_chunk = fa_windows(QB) ? fa_window_align(QB, L.k_bits)
                        : QB && ((L.block_stride | L.k_offset | L.v_offset | L.k_row_bytes) & 7)
                            ? 4
                            : 8;
  const int raw_pieces = (fa_windows(QB) ? raw_slot : (int)L.k_row_bytes) / raw_chunk; /* per row */
  auto raw_stage = [&](int stage) {
    return raw + (SM::RAW_STAGES == 1 ? 0 : stage * FA_KEYS * (k_slot + v_slot));
  };
  /* turbo-v with own K and V slots: the windows of the FA_KEYS rows of `rows` into slots of `slot`
   * bytes from dst, in pieces of raw_chunk bytes: thread t copying pieces t, t + THREADS, ... in
   * row order */
  auto issue_window_copies = [&](const uint8_t *const *rows, unsigned dst, int slot) {
    constexpr int THREADS = W * 32;
    const int pieces = slot / raw_chunk, row_step = THREADS / pieces, piece_step = THREADS % pieces;
    int r = threadIdx.x / pieces, piece = threadIdx.x % pieces;
    for (int j = 0; j < FA_KEYS * pieces; j += THREADS) {
      if (r < FA_KEYS) {
        const uint8_t *row =
            (const uint8_t *)((uintptr_t)rows[r] & ~(uintptr_t)(raw_chunk - 1)); /* window */
        const unsigned at = dst + r * slot + piece * raw_chunk;
        const void *src = rows[r] ? (const void *)(row + piece * raw_chunk) : (const void *)L.slabs;
        if (raw_chunk == 16)
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(at), "l"(src),
                       "r"(rows[r] ? 16 : 0));
        else
          asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(at), "l"(src),
                       "r"(rows[r] ? 8 : 0));
      }
      r += row_step, piece += piece_step;
      if (piece >= pieces) piece -= pieces, r++;
    }
  };
  auto issue_raw_copies = [&](int stage) {
    constexpr int THREADS = W * 32;
    if constexpr (QB == FA_TURBO_V && COOP) {
      if (k_slot != v_slot) {
        const uint8_t *const *rows = &tail->rows[stage][0][0];
        const unsigned dst_stage = (unsigned)__cvta_generic_to_shared(raw_stage(stage));
        issue_window_copies(rows, dst_stage, k_slot);
        issue_window_copies(rows + FA_KEYS, dst_stage + FA_KEYS * k_slot, v_slot);
        asm volatile("cp.async.commit_group;\n" ::);
        return;
      }
    }
    const int row_step = THREADS / raw_pieces, piece_step = THREADS % raw_pieces;
    int r = threadIdx.x / raw_pieces, piece = threadIdx.x % raw_pieces;
    const uint8_t *const *rows = &tail->rows[stage][0][0];
    const unsigned dst_stage = (unsigned)__cvta_generic_to_shared(raw_stage(stage));
    for (int j = 0; j < raw_pieces; j++) { /* raw_pieces pieces per thread, exactly */
      const uint8_t *row = rows[r];
      if (fa_windows(QB)) row = (const uint8_t *)((uintptr_t)row & ~(uintptr_t)(raw_chunk - 1));
      const unsigned dst = dst_stage + r * raw_slot + piece * raw_chunk;
      const void *src = row ? (const void *)(row + piece * raw_chunk) : (const void *)L.slabs;
      if (fa_windows(QB) && raw_chunk == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                     "r"(row ? 16 : 0));
      else if (raw_chunk == 8)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src),
                     "r"(row ? 8 : 0));
      else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
                     "r"(row ? 4 : 0));
      r += row_step, piece += piece_step;
      if (piece >= raw_pieces) piece -= raw_pieces, r++;
    }
    asm volatile("cp.async.commit_group;\n" ::);
  };
  auto issue_copies = [&](int stage) {
    if constexpr (QB != 0) {
      issue_raw_copies(stage);
      return;
    }
    const unsigned dst0 = (unsigned)__cvta_generic_to_shared(
        stages + stage * SM::STAGE_ELEMS + copy_row0 * SM::STRIDE + 8 * copy_chunk);
    const uint8_t *const *rows = &tail->rows[stage][0][0] + copy_row0;
#pragma unroll
    for (int i = 0; i < PASSES; i++) {
      const uint8_t *row = rows[i * ROWS_PER_PASS];
      const unsigned dst = dst0 + i * ROWS_PER_PASS * SM::STRIDE * 2;
      const void *src = row ? (const void *)(row + 16 * copy_chunk) : (const void *)L.slabs;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                   "r"(row ? 16 : 0));
    }
    asm volatile("cp.async.commit_group;\n" ::);
  };
  /* folds the finished split's state: to the merge kernel, or into the running total */
  auto finish_split = [&](int64_t split) {
    if (f.parallel) { /* this split's state goes to the merge kernel */
#pragma unroll
      for (int h = 0; h < 2; h++) {
        if (!live[h]) continue;
        const int64_t slot = ((int64_t)launch_row[h] * a.n_heads + head[h]) * f.splits + split;
        if (tig == 0 && (!COOP || warp == 0)) { /* (every warp holds the same m and l) */
          f.state[2 * slot] = m[h];
          f.state[2 * slot + 1] = l[h];
        }
#pragma unroll
        for (int i = 0; i < ACC_N; i++)
          *(float2 *)(f.partial + slot * D + dim0 + 8 * i + 2 * tig) =
              make_float2(acc[i][2 * h], acc[i][2 * h + 1]);
      }
    } else { /* merge into the running total in shared memory (each lane its own entries) */
#pragma unroll
      for (int h = 0; h < 2; h++) {
        float tm = tot[(SM::ACC_REGS + 2 * h) * 32 + lane];
        float tl = tot[(SM::ACC_REGS + 2 * h + 1) * 32 + lane];
        float ct, cp;
        merge_scalars(tm, tl, m[h], l[h], ct, cp);
        tot[(SM::ACC_REGS + 2 * h) * 32 + lane] = tm;
        tot[(SM::ACC_REGS + 2 * h + 1) * 32 + lane] = tl;
#pragma unroll
        for (int i = 0; i < ACC_N; i++)
#pragma unroll
          for (int c = 2 * h; c < 2 * h + 2; c++) {
            float *t = &tot[(i * 4 + c) * 32 + lane];
            *t = merge_value(*t, acc[i][c], ct, cp);
          }
      }
    }
#pragma unroll
    for (int i = 0; i < ACC_N; i++)
#pragma unroll
      for (int c = 0; c < 4; c++) acc[i][c] = 0.0f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.0f;
  };
  find_rows(first_tile, 0);
  __syncthreads();
  issue_copies(0);
  int64_t current_split = first_tile / FA_SPLIT;
#pragma unroll
  for (int i = 0; i < ACC_N; i++)
#pragma unroll
    for (int c = 0; c < 4; c++) acc[i][c] = 0.0f;
  m[0] = m[1] = -INFINITY;
  l[0] = l[1] = 0.0f;
  /* quantized KV: decodes the landed stored rows of `stage` into the bf16 tile (every warp, live
   * or not) */
  auto decode_tile = [&](int stage) {
    if constexpr (QB == FA_TURBO)
      fa_decode_turbo<D, W * 32, SM::SWIZZLE>(raw_stage(stage), raw_slot, &tail->rows[stage][0][0],
                                              stages, SM::STRIDE, L.k_bits, L.v_bits,
                                              turbo_k_centroid, turbo_v_centroid);
    else if constexpr (QB == FA_TURBO_V)
      fa_decode_turbo_v<D, W * 32, SM::SWIZZLE>(raw_stage(stage), k_slot, v_slot,
                                                &tail->rows[stage][0][0], stages, SM::STRIDE,
                                                raw_chunk, L.k_bits, L.v_bits, turbo_v_centroid);
    else if constexpr (QB != 0)
      fa_decode_affine<D, QB, W * 32, SM::SWIZZLE>(raw_stage(stage), raw_slot, stages, SM::STRIDE,
                                                   __ffs(L.group) - 1);
  };
  int stage = 0;
  for (int64_t tile0 = first_tile; tile0 <= key_to; tile0 += FA_KEYS, stage ^= 1) {
    const int has_next = tile0 + FA_KEYS <= key_to;
    if (has_next) find_rows(tile0 + FA_KEYS, stage ^ 1);
    if constexpr (QB != 0 && SM::RAW_STAGES == 1) {
      /* one stored-row stage: this tile is decoded as soon as it lands, then the next one is
       * copied into the stage while this one computes */
      asm volatile("cp.async.wait_group 0;\n" ::: "memory");
      __syncthreads(); /* landed; the next addresses visible; the previous tile consumed */
      decode_tile(stage);
      __syncthreads(); /* the decoded tile visible; the stage free */
      if (has_next) issue_copies(stage ^ 1);
    } else {
      __syncthreads(); /* addresses visible; the other stage's previous tile is consumed */
      if (has_next) {
        issue_copies(stage ^ 1);
        asm volatile("cp.async.wait_group 1;\n" ::: "memory");
      } else {
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
      }
      __syncthreads(); /* this tile has landed */
      if constexpr (QB != 0) {
        decode_tile(stage);
        __syncthreads();
      }
    }
    if (!warp_live) continue;
    if (tile0 / FA_SPLIT != current_split) { /* a split boundary: fold the finished split */
      finish_split(current_split);
      current_split = tile0 / FA_SPLIT;
    }
    const __nv_bfloat16 *sk = stages + (QB ? 0 : stage) * SM::STAGE_ELEMS;
    const __nv_bfloat16 *sv = sk + FA_KEYS * SM::STRIDE;

    if constexpr (COOP) {
      /* S for keys [16 warp, 16 warp + 16) of the tile: n-tiles 2 warp and 2 warp + 1, each
       * score the per-warp (prefill) block's chain over kk */
      float sc[2][4];
#pragma unroll
      for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int c = 0; c < 4; c++) sc[nt][c] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++) {
        const int mi = lane >> 3;
        const int key_in_tile = warp * 16 + (lane & 7) + (mi >> 1) * 8;
        uint32_t b[4];
        if constexpr (SM::SWIZZLE)
          ldmatrix_x4(b, sk + fa_tile_at<true>(key_in_tile, 2 * kk + (mi & 1), SM::STRIDE));
        else
          ldmatrix_x4(b, sk + key_in_tile * SM::STRIDE + kk * 16 + (mi & 1) * 8);
        mma_bf16(sc[0], qa[kk], b[0], b[1]);
        mma_bf16(sc[1], qa[kk], b[2], b[3]);
        if (EXACT) {
          mma_bf16(sc[0], ql[EXACT ? kk : 0], b[0], b[1]);
          mma_bf16(sc[1], ql[EXACT ? kk : 0], b[2], b[3]);
        }
      }
      /* scale, softcap, mask; this warp's row maxima, then the tile's through shared memory */
      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
          const int h = c >> 1;
          const int key = (int)tile0 + (2 * warp + nt) * 8 + 2 * tig + (c & 1);
          float score = sc[nt][c] * a.scale;
          if (a.softcap != 0.0f) score = a.softcap * tanhf(score / a.softcap);
          if (key < row_lo[h] || key > row_p[h]) score = -INFINITY;
          sc[nt][c] = score;
          tile_max[h] = fmaxf(tile_max[h], score);
        }
#pragma unroll
      for (int h = 0; h < 2; h++) {
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
        if (tig == 0) row_max[warp * 16 + gid + 8 * h] = tile_max[h];
      }
      __syncthreads(); /* every warp's maxima */
      float correction[2];
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const int r = gid + 8 * h;
        tile_max[h] =
            fmaxf(fmaxf(row_max[r], row_max[16 + r]), fmaxf(row_max[32 + r], row_max[48 + r]));
        const float m_new = fmaxf(m[h], tile_max[h]);
        if (tile_max[h] == -INFINITY) { /* no key of this row here: its state stays as it is */
          correction[h] = 1.0f;
          tile_max[h] = 0.0f;
        } else {
          correction[h] = __expf(m[h] - m_new);
          m[h] = m_new;
          tile_max[h] = m_new;
        }
      }
      /* this warp's weights into the tile's P */
#pragma unroll
      for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
          const int h = c >> 1;
          const float p = sc[nt][c] == -INFINITY ? 0.0f : __expf(sc[nt][c] - tile_max[h]);
          p_tile[(gid + 8 * h) * SM::P_STRIDE + (2 * warp + nt) * 8 + 2 * tig + (c & 1)] = p;
        }
      __syncthreads(); /* the whole tile's P */
      /* the row sums in the per-warp (prefill) block's order: over n-tiles 0..7 in turn, then the
       * shuffles */
      float row_sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int nt = 0; nt < FA_KEYS / 8; nt++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
          const int h = c >> 1;
          row_sum[h] += p_tile[(gid + 8 * h) * SM::P_STRIDE + nt * 8 + 2 * tig + (c & 1)];
        }
      fa_fold_tile(row_sum, l, correction, acc);
      /* O += P V for this warp's head dims: k-step j covers keys [16 j, 16 j + 16) */
#pragma unroll
      for (int j = 0; j < FA_KEYS / 16; j++) {
        const float *pr0 = p_tile + gid * SM::P_STRIDE + 16 * j + 2 * tig;
        const float *pr1 = pr0 + 8 * SM::P_STRIDE;
        uint32_t pa[4] = {pack_bf16(pr0[0], pr0[1]), pack_bf16(pr1[0], pr1[1]),
                          pack_bf16(pr0[8], pr0[9]), pack_bf16(pr1[8], pr1[9])};
        uint32_t pl[4];
        if (EXACT) {
          pl[0] = pack_bf16_rest(pr0[0], pr0[1]);
          pl[1] = pack_bf16_rest(pr1[0], pr1[1]);
          pl[2] = pack_bf16_rest(pr0[8], pr0[9]);
          pl[3] = pack_bf16_rest(pr1[8], pr1[9]);
        }
#pragma unroll
        for (int n = 0; n < ACC_N / 2; n++) {
          const int mi = lane >> 3;
          const int key_in_tile = 16 * j + (lane & 7) + (mi & 1) * 8;
          uint32_t b[4];
          if constexpr (SM::SWIZZLE)
            ldmatrix_x4_trans(
                b, sv + fa_tile_at<true>(key_in_tile, dim0 / 8 + 2 * n + (mi >> 1), SM::STRIDE));
          else
            ldmatrix_x4_trans(b, sv + key_in_tile * SM::STRIDE + dim0 + n * 16 + (mi >> 1) * 8);
          mma_bf16(acc[2 * n], pa, b[0], b[1]);
          mma_bf16(acc[2 * n + 1], pa, b[2], b[3]);
          if (EXACT) {
            mma_bf16(acc[2 * n], pl, b[0], b[1]);
            mma_bf16(acc[2 * n + 1], pl, b[2], b[3]);
          }
        }
      }
    } else {
      /* S = Q K^T for 64 keys: n-tile nt holds keys [8 nt, 8 nt + 8) */
      float sc[FA_KEYS / 8][4];
#pragma unroll
      for (int nt = 0; nt < FA_KEYS / 8; nt++)
#pragma unroll
        for (int c = 0; c < 4; c++) sc[nt][c] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
        for (int nt2 = 0; nt2 < FA_KEYS / 16; nt2++) {
          const int mi = lane >> 3;
          const int key_in_tile = nt2 * 16 + (lane & 7) + (mi >> 1) * 8;
          uint32_t b[4];
          ldmatrix_x4(b, sk + key_in_tile * SM::STRIDE + kk * 16 + (mi & 1) * 8);
          mma_bf16(sc[2 * nt2], qa[kk], b[0], b[1]);
          mma_bf16(sc[2 * nt2 + 1], qa[kk], b[2], b[3]);
          if (EXACT) {
            mma_bf16(sc[2 * nt2], ql[EXACT ? kk : 0], b[0], b[1]);
            mma_bf16(sc[2 * nt2 + 1], ql[EXACT ? kk : 0], b[2], b[3]);
          }
        }
      }
      /* scale, softcap, mask; row maxima */
      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int nt = 0; nt < FA_KEYS / 8; nt++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
          const int h = c >> 1;
          const int key = (int)tile0 + nt * 8 + 2 * tig + (c & 1);
          float score = sc[nt][c] * a.scale;
          if (a.softcap != 0.0f) score = a.softcap * tanhf(score / a.softcap);
          if (key < row_lo[h] || key > row_p[h]) score = -INFINITY;
          sc[nt][c] = score;
          tile_max[h] = fmaxf(tile_max[h], score);
        }
      float correction[2];
#pragma unroll
      for (int h = 0; h < 2; h++) {
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
        const float m_new = fmaxf(m[h], tile_max[h]);
        if (tile_max[h] == -INFINITY) { /* no key of this row here: its state stays as it is */
          correction[h] = 1.0f;
          tile_max[h] = 0.0f; /* exponent base: every score is -inf, so every weight is 0 */
        } else {
          correction[h] = __expf(m[h] - m_new);
          m[h] = m_new;
          tile_max[h] = m_new;
        }
      }
      float row_sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int nt = 0; nt < FA_KEYS / 8; nt++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
          const int h = c >> 1;
          const float p = sc[nt][c] == -INFINITY ? 0.0f : __expf(sc[nt][c] - tile_max[h]);
          sc[nt][c] = p;
          row_sum[h] += p;
        }
      fa_fold_tile(row_sum, l, correction, acc);
      /* O += P V: k-step j covers keys [16 j, 16 j + 16), P from the score fragments */
#pragma unroll
      for (int j = 0; j < FA_KEYS / 16; j++) {
        uint32_t pa[4] = {pack_bf16(sc[2 * j][0], sc[2 * j][1]),
                          pack_bf16(sc[2 * j][2], sc[2 * j][3]),
                          pack_bf16(sc[2 * j + 1][0], sc[2 * j + 1][1]),
                          pack_bf16(sc[2 * j + 1][2], sc[2 * j + 1][3])};
        uint32_t pl[4];
        if (EXACT) {
          pl[0] = pack_bf16_rest(sc[2 * j][0], sc[2 * j][1]);
          pl[1] = pack_bf16_rest(sc[2 * j][2], sc[2 * j][3]);
          pl[2] = pack_bf16_rest(sc[2 * j + 1][0], sc[2 * j + 1][1]);
          pl[3] = pack_bf16_rest(sc[2 * j + 1][2], sc[2 * j + 1][3]);
        }
#pragma unroll
        for (int nd2 = 0; nd2 < D / 16; nd2++) {
          const int mi = lane >> 3;
          const int key_in_tile = 16 * j + (lane & 7) + (mi & 1) * 8;
          uint32_t b[4];
          ldmatrix_x4_trans(b, sv + key_in_tile * SM::STRIDE + nd2 * 16 + (mi >> 1) * 8);
          mma_bf16(acc[2 * nd2], pa, b[0], b[1]);
          mma_bf16(acc[2 * nd2 + 1], pa, b[2], b[3]);
          if (EXACT) {
            mma_bf16(acc[2 * nd2], pl, b[0], b[1]);
            mma_bf16(acc[2 * nd2 + 1], pl, b[2], b[3]);
          }
        }
      }
    }
  }
  if (warp_live) finish_split(current_split);
  if (bad_block) *error_flag = 1;
  if (f.parallel || !warp_live) return;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    if (!live[h]) continue;
    const float tl = tot[(SM::ACC_REGS + 2 * h + 1) * 32 + lane];
    float *out = a.out + ((int64_t)step_row[h] * a.n_heads + head[h]) * D;
#pragma unroll
    for (int i = 0; i < ACC_N; i++) {
      const float v0 = tot[(i * 4 + 2 * h) * 32 + lane], v1 = tot[(i * 4 + 2 * h + 1) * 32 + lane];
      *(float2 *)(out + dim0 + 8 * i + 2 * tig) =
          tl > 0.0f ? make_float2(__fdiv_rn(v0, tl), __fdiv_rn(v1, tl)) : make_float2(0.0f, 0.0f);
    }
  }
}

/* x <- H_D x for the D threads of a block (blockDim.x == D), through buf[D] in shared memory,
 * with the butterflies of ci_kv_dev_fwht (each element sees the same operations in the same
 * order as the sequential transform), then its 1/sqrt(D) scale. */
__device__ static inline float fa_block_fwht(float x, float *buf, int D) {
  const int d = threadIdx.x;
  buf[d] = x;
  __syncthreads();
  for (int len = 1; len < D; len <<= 1) {
    float a = 0.0f, b = 0.0f;
    int i = 0;
    if (d < D / 2) {
      i = (d / len) * (len << 1) + d % len;
      a = buf[i], b = buf[i + len];
    }
    __syncthreads();
    if (d < D / 2) {
      buf[i] = __fadd_rn(a, b);
      buf[i + len] = __fsub_rn(a, b);
    }
    __syncthreads();
  }
  return __fmul_rn(buf[d], 1.0f / sqrtf((float)D));
}

/* TurboQuant and turbo-v KV around the tensor-core kernel, one block of D threads per (launch
 * row, query head): query 1 (TurboQuant, prefill launches; cooperative blocks rotate their own q,
 * fa_warp_rotate) writes q~ = H (s . q) / sqrt(D) to f.q_rotated (by launch row);
 * query 0 un-rotates a serial launch's output in place, o = s . H o~ (the merge kernel does it
 * for parallel ones, with the same fa_block_fwht). */
__global__ static void fa_rotate_kernel(const seq_group *g, attention_params a,
                                        ci_cuda_flash_params f, const float *signs, int D,
                                        int query) {
  ci_grid_begin();
  __shared__ float buf[CI_CUDA_KV_MAX_D];
  const int s = fa_seq_of_row(g, blockIdx.x);
  const int step_row = g->first_row[s] + (blockIdx.x - g->row_start[s]);
  const int h = blockIdx.y, d = threadIdx.x;
  if (query) {
    const float x = a.q[((int64_t)step_row * a.n_heads + h) * D + d];
    f.q_rotated[((int64_t)blockIdx.x * a.n_heads + h) * D + d] =
        fa_block_fwht(__fmul_rn(signs[d], x), buf, D);
  } else {
    float *out = a.out + ((int64_t)step_row * a.n_heads + h) * D;
    out[d] = __fmul_rn(signs[d], fa_block_fwht(out[d], buf, D));
  }
}

/* Merges the per-split states of each (row, head) of a parallel launch, in split order, with the
 * arithmetic of merge_scalars / merge_value. Only the output values and the sum l form chains;
 * the factors (ct, cp) of each split depend on the running maximum alone, which is a prefix
 * maximum (exact in any order). So the block first works out the factors of a chunk of up to
 * MERGE_CHUNK splits at once: each thread loads the states of MERGE_CHUNK / D consecutive splits,
 * a block-wide scan of the threads' maxima gives each split the maximum of the splits with keys
 * before it, and the factors go to shared memory. Then each thread folds its output dim of the
 * chunk's splits in order with merge_value, two dependent operations per split, its loads of the
 * partial outputs MERGE_LOADS splits ahead of the fold. The factors are the ones the serial fold
 * computes (same expressions on the same running maximum), so the result is bit-identical to it
 * and to a block that walks every split (prefill). (A first form worked in batches of 32 splits,
 * one warp computing their factors while the others waited, each batch a round trip to memory and
 * two barriers: with the same selects, 8B bf16 batch-1 decode at 16k tokens 164.7-164.8 tok/s
 * against 166.0-166.1 in this form, H200.) */
enum { MERGE_CHUNK = 512, MERGE_LOADS = 32 };
/* signs: the TurboQuant / turbo-v sign vector (the output is un-rotated, o = s . H o~), else
 * NULL. */
template <int D>
__global__ static void __launch_bounds__(D)
    flash_merge_kernel(const seq_group *g, attention_params a, ci_cuda_flash_params f,
                       const float *signs) {
  constexpr int PER = MERGE_CHUNK / D, WARPS = D / 32;
  __shared__ float4 coef[MERGE_CHUNK]; /* (ct, cp, l of the split, unused) */
  __shared__ float rotate_buf[D];
  __shared__ float warp_max[WARPS];
  __shared__ int warp_any[WARPS];
  /* the row's position: a step input, read before the wait (cuda_launch.cuh) */
  const int s = fa_seq_of_row(g, blockIdx.x);
  const int step_row = g->first_row[s] + (blockIdx.x - g->row_start[s]);
  const int h = blockIdx.y;
  const int64_t p = a.pos[step_row];
  ci_grid_begin();
  const int64_t lo = a.window > 0 && p - a.window + 1 > 0 ? p - a.window + 1 : 0;
  const int64_t base = ((int64_t)blockIdx.x * a.n_heads + h) * f.splits;
  const int d = threadIdx.x, lane = d & 31, warp = d >> 5;
  float run_max = -INFINITY; /* the maximum over the splits with keys so far */
  int run_any = 0;           /* whether a split with keys came before */
  float tl = 0.0f, t = 0.0f;
  for (int64_t first = lo / FA_SPLIT; first <= p / FA_SPLIT; first += MERGE_CHUNK) {
    const int n = (int)min((int64_t)MERGE_CHUNK, p / FA_SPLIT - first + 1);
    /* this thread's splits PER d .. PER d + PER - 1 of the chunk */
    float pm[PER], pl[PER];
    float mine = -INFINITY; /* the maximum over my splits with keys */
    int mine_any = 0;
#pragma unroll
    for (int j = 0; j < PER; j++) {
      const int i = PER * d + j;
      pm[j] = 0.0f, pl[j] = 0.0f;
      if (i < n) {
        const float2 ml = *(const float2 *)(f.state + 2 * (base + first + i));
        pm[j] = ml.x, pl[j] = ml.y;
      }
      if (i < n && !(pl[j] == 0.0f)) { /* merge_scalars skips a split with l == 0 */
        mine = fmaxf(mine, pm[j]);
        mine_any = 1;
      }
    }
    /* inclusive scan over the block's threads, in thread order: within the warp by shuffles,
     * then across the warps */
    float v = mine;
    int any = mine_any;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const float o = __shfl_up_sync(0xffffffffu, v, off);
      const int oa = __shfl_up_sync(0xffffffffu, any, off);
      if (lane >= off) v = fmaxf(v, o), any |= oa;
    }
    if (lane == 31) warp_max[warp] = v, warp_any[warp] = any;
    float before = __shfl_up_sync(0xffffffffu, v, 1); /* exclusive: the splits before mine */
    int any_before = __shfl_up_sync(0xffffffffu, any, 1);
    if (lane == 0) before = -INFINITY, any_before = 0;
    __syncthreads();
    float chunk_max = -INFINITY;
    int chunk_any = 0;
#pragma unroll
    for (int w = 0; w < WARPS; w++) {
      if (w < warp) before = fmaxf(before, warp_max[w]), any_before |= warp_any[w];
      chunk_max = fmaxf(chunk_max, warp_max[w]), chunk_any |= warp_any[w];
    }
    before = fmaxf(run_max, before); /* the running maximum when my first split folds in */
    any_before |= run_any;
#pragma unroll
    for (int j = 0; j < PER; j++) {
      const int i = PER * d + j;
      const int live = i < n && !(pl[j] == 0.0f);
      float ct = 1.0f, cp = 0.0f; /* no keys: nothing changes */
      if (live && !any_before) {
        ct = 0.0f, cp = 1.0f; /* the first split with keys is copied */
      } else if (live) {
        const float m = fmaxf(before, pm[j]);
        ct = __expf(before - m);
        cp = __expf(pm[j] - m);
      }
      if (i < n) coef[i] = make_float4(ct, cp, pl[j], 0.0f);
      if (live) before = fmaxf(before, pm[j]), any_before = 1;
    }
    run_max = fmaxf(run_max, chunk_max);
    run_any = run_any || chunk_any;
    __syncthreads();
    /* fold my dim of the chunk's splits in order, loading MERGE_LOADS splits ahead */
    const float *src = f.partial + (base + first) * D + d;
    float cur[MERGE_LOADS], next[MERGE_LOADS];
#pragma unroll
    for (int j = 0; j < MERGE_LOADS; j++) cur[j] = j < n ? src[(int64_t)j * D] : 0.0f;
    for (int i0 = 0; i0 < n; i0 += MERGE_LOADS) {
#pragma unroll
      for (int j = 0; j < MERGE_LOADS; j++) {
        const int i = i0 + MERGE_LOADS + j;
        next[j] = i < n ? src[(int64_t)i * D] : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < MERGE_LOADS; j++) {
        if (i0 + j < n) {
          const float4 c = coef[i0 + j];
          tl = merge_value(tl, c.z, c.x, c.y);
          t = merge_value(t, cur[j], c.x, c.y);
        }
        cur[j] = next[j];
      }
    }
    __syncthreads(); /* the chunk's factors and maxima are consumed */
  }
  float *out = a.out + ((int64_t)step_row * a.n_heads + h) * D;
  const float o = tl > 0.0f ? __fdiv_rn(t, tl) : 0.0f;
  out[d] = signs ? __fmul_rn(signs[d], fa_block_fwht(o, rotate_buf, D)) : o;
}

/* Affine KV the tensor-core kernel decodes: 4 or 8 bits on both sides, power-of-two groups of at
 * least 32 dims, rows of equal size that fit RAW_STRIDE and start 4-byte aligned (cp.async). */
static int affine_tiles_supported(const kv_layout *L) {
  if (L->codec != CI_KV_AFFINE || L->k_bits != L->v_bits || (L->k_bits != 4 && L->k_bits != 8))
    return 0;
  if (L->group < 32 || L->group > L->head_dim || (L->group & (L->group - 1))) return 0;
  const int64_t want = (int64_t)L->head_dim * L->k_bits / 8 + 4 * (L->head_dim / L->group);
  const int64_t raw_stride = L->k_bits == 8
                                 ? (L->head_dim == 128 ? fa_smem<128, 4, false, 8>::RAW_STRIDE
                                                       : fa_smem<64, 4, false, 8>::RAW_STRIDE)
                                 : (L->head_dim == 128 ? fa_smem<128, 4, false, 4>::RAW_STRIDE
                                                       : fa_smem<64, 4, false, 4>::RAW_STRIDE);
  if (L->k_row_bytes != want || L->v_row_bytes != want || want > raw_stride) return 0;
  return ((L->block_stride | L->k_offset | L->v_offset | L->k_row_bytes) & 3) == 0;
}

/* TurboQuant KV the tensor-core kernel decodes: 2-4 bits per side, rows of codes and fp16 ν,
 * 16-byte aligned blocks and regions (the row windows are copied in 16-byte pieces). */
static int turbo_tiles_supported(const kv_layout *L) {
  if (L->codec != CI_KV_TURBO || !L->signs) return 0;
  if (L->k_bits < 2 || L->k_bits > 4 || L->v_bits < 2 || L->v_bits > 4) return 0;
  if (L->k_row_bytes != (int64_t)L->head_dim * L->k_bits / 8 + 2 ||
      L->v_row_bytes != (int64_t)L->head_dim * L->v_bits / 8 + 2)
    return 0;
  return ((L->block_stride | L->k_offset | L->v_offset) & 15) == 0;
}

/* turbo-v KV the tensor-core kernel decodes: K 4 or 8 bits, V 2-4, groups of 32 with fp16
 * parameters, 16-byte aligned blocks and regions. */
static int turbo_v_tiles_supported(const kv_layout *L) {
  if (L->codec != CI_KV_TURBO_V || !L->signs) return 0;
  if ((L->k_bits != 4 && L->k_bits != 8) || L->v_bits < 2 || L->v_bits > 4) return 0;
  const int groups = L->head_dim / CI_CUDA_TURBO_V_GROUP;
  if (L->k_row_bytes != (int64_t)L->head_dim * L->k_bits / 8 + 4 * groups ||
      L->v_row_bytes != (int64_t)L->head_dim * L->v_bits / 8 + 2 * groups)
    return 0;
  return ((L->block_stride | L->k_offset | L->v_offset) & 15) == 0;
}

int ci_cuda_flash_supported(const kv_layout *L, int n_heads, int exact) {
  if (L->head_dim != 64 && L->head_dim != 128) return 0;
  if (L->codec != CI_KV_BF16 && (exact || !(affine_tiles_supported(L) || turbo_tiles_supported(L) ||
                                            turbo_v_tiles_supported(L))))
    return 0;
  if (n_heads % L->n_kv_heads) return 0;
  const int group = n_heads / L->n_kv_heads;
  return group <= 16 && 16 % group == 0;
}

int ci_cuda_flash_warps(int n_heads, int n_kv_heads, int max_rows_per_seq) {
  /* one warp (16 packed rows) when every sequence's rows fit it: decode and short drafts */
  return max_rows_per_seq * (n_heads / n_kv_heads) <= 16 ? 1 : FA_MAX_WARPS;
}

int ci_cuda_flash_positions_per_tile(const kv_layout *L, int n_heads, int warps) {
  return 16 * warps / (n_heads / L->n_kv_heads);
}

void ci_cuda_flash_plan(const kv_layout *L, const ci_cuda_seq_group *host_group, int n_heads,
                        int warps, const ci_cuda *cu, int exact, ci_cuda_flash_params *f) {
  memset(f, 0, sizeof *f);
  f->group = n_heads / L->n_kv_heads;
  f->warps = warps;
  f->exact = exact;
  const int total_rows = host_group->total_rows;
  f->splits = ci_cuda_key_splits(host_group, L, FA_SPLIT);
  const int64_t blocks = (int64_t)host_group->total_tiles * L->n_kv_heads;
  const size_t bytes = (size_t)total_rows * n_heads * f->splits * (L->head_dim + 2) * sizeof(float);
  const size_t q_bytes = L->codec == CI_KV_TURBO && warps != 1 /* cooperative: in the block */
                             ? (size_t)total_rows * n_heads * L->head_dim * sizeof(float)
                             : 0;
  /* Split the keys over blocks when one block per tile leaves SMs idle: fewer blocks than the
   * GPU holds at once (prefill), or fewer than one and a half such waves for the cooperative
   * decode blocks, whose serial walk streams the next split's keys while this one computes and
   * so beats many short parallel blocks once the waves are nearly full (H200, step_bench: 8B at
   * 64 and 128 sequences serial is 7-10% faster, 1B at 64 sequences parallel 6-17% faster). */
  const int64_t resident =
      (int64_t)cu->n_sms *
      (L->codec == CI_KV_AFFINE  ? cu->flash_affine_blocks_per_sm[L->head_dim == 128][warps == 1]
       : L->codec == CI_KV_TURBO ? cu->flash_turbo_blocks_per_sm[L->head_dim == 128][warps == 1]
       : L->codec == CI_KV_TURBO_V
           ? cu->flash_turbo_v_blocks_per_sm[L->head_dim == 128][warps == 1]
           : cu->flash_blocks_per_sm[L->head_dim == 128][exact != 0][warps == 1]);
  f->parallel = f->splits > 1 && (warps == 1 ? 2 * blocks < 3 * resident : blocks < resident) &&
                bytes <= ((size_t)256 << 20);
  f->scratch_bytes = (f->parallel ? bytes : 0) + q_bytes;
}

/* Raises the kernel's shared-memory limit and records how many of its serial blocks an SM holds
 * (the plan's measure of a full wave; affine KV: that of the 8-bit kernel, the larger). */
template <int D, bool EXACT, bool COOP, int QB> static cudaError_t flash_setup(ci_cuda *cu) {
  typedef fa_smem<D, FA_MAX_WARPS, COOP, QB> SM;
  cudaError_t err =
      cudaFuncSetAttribute(flash_attention_kernel<D, EXACT, FA_MAX_WARPS, COOP, QB>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SM::BYTES);
  if (QB == 4) return err;
  int *per_sm = QB == FA_TURBO_V ? &cu->flash_turbo_v_blocks_per_sm[D == 128][COOP]
                : QB == FA_TURBO ? &cu->flash_turbo_blocks_per_sm[D == 128][COOP]
                : QB             ? &cu->flash_affine_blocks_per_sm[D == 128][COOP]
                                 : &cu->flash_blocks_per_sm[D == 128][EXACT][COOP];
  if (err == cudaSuccess)
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        per_sm, flash_attention_kernel<D, EXACT, FA_MAX_WARPS, COOP, QB>, FA_MAX_WARPS * 32,
        SM::BYTES);
  if (err == cudaSuccess && *per_sm < 1) *per_sm = 1;
  return err;
}

template <int D, bool EXACT, int QB = 0> static cudaError_t flash_setup_both(ci_cuda *cu) {
  cudaError_t err = flash_setup<D, EXACT, true, QB>(cu);
  return err == cudaSuccess ? flash_setup<D, EXACT, false, QB>(cu) : err;
}

int ci_cuda_flash_init(ci_cuda *cu) {
  cudaError_t err = flash_setup_both<64, false>(cu);
  if (err == cudaSuccess) err = flash_setup_both<64, true>(cu);
  if (err == cudaSuccess) err = flash_setup_both<128, false>(cu);
  if (err == cudaSuccess) err = flash_setup_both<128, true>(cu);
  if (err == cudaSuccess) err = flash_setup_both<64, false, 4>(cu);
  if (err == cudaSuccess) err = flash_setup_both<64, false, 8>(cu);
  if (err == cudaSuccess) err = flash_setup_both<128, false, 4>(cu);
  if (err == cudaSuccess) err = flash_setup_both<128, false, 8>(cu);
  if (err == cudaSuccess) err = flash_setup_both<64, false, FA_TURBO>(cu);
  if (err == cudaSuccess) err = flash_setup_both<128, false, FA_TURBO>(cu);
  if (err == cudaSuccess) err = flash_setup_both<64, false, FA_TURBO_V>(cu);
  if (err == cudaSuccess) err = flash_setup_both<128, false, FA_TURBO_V>(cu);
  return err == cudaSuccess ? CI_OK : ci_cuda_fail(cu, err, "flash attention setup");
}

template <int D, bool EXACT, int W, bool COOP, int QB>
static void launch_flash(ci_cuda *cu, const ci_cuda_cmd *cmd, const ci_cuda_flash_params &f) {
  typedef fa_smem<D, W, COOP, QB> SM;
  static_assert(SM::BYTES <= 113 * 1024, "flash attention shared memory: 2 blocks/SM");
  const kv_layout &L = cmd->a.kv.layout;
  const dim3 grid((unsigned)cmd->a.kv.total_tiles, (unsigned)L.n_kv_heads,
                  f.parallel ? (unsigned)f.splits : 1u);
  const size_t smem = SM::launch_bytes(L, f.parallel);
  const dim3 row_heads((unsigned)cmd->a.kv.total_rows, (unsigned)cmd->a.kv.att.n_heads);
  const float *signs = fa_windows(QB) ? L.signs : NULL; /* the output is rotated */
  if (QB == FA_TURBO && !COOP)                          /* cooperative blocks rotate q themselves */
    ci_launch(cu, fa_rotate_kernel, row_heads, D, 0, cmd->a.kv.group, cmd->a.kv.att, f, signs, D,
              1);
  ci_launch(cu, flash_attention_kernel<D, EXACT, W, COOP, QB>, grid, W * 32, smem, L,
            cmd->a.kv.group, cmd->a.kv.att, f, cu->error_flag);
  if (f.parallel)
    ci_launch(cu, flash_merge_kernel<D>, row_heads, D, 0, cmd->a.kv.group, cmd->a.kv.att, f, signs);
  else if (fa_windows(QB))
    ci_launch(cu, fa_rotate_kernel, row_heads, D, 0, cmd->a.kv.group, cmd->a.kv.att, f, signs, D,
              0);
}

template <int D, bool EXACT, int QB = 0>
static void launch_width(ci_cuda *cu, const ci_cuda_cmd *cmd, const ci_cuda_flash_params &f) {
  /* one-warp tiles (decode, short drafts) run as cooperative four-warp blocks */
  if (f.warps == 1)
    launch_flash<D, EXACT, FA_MAX_WARPS, true, QB>(cu, cmd, f);
  else
    launch_flash<D, EXACT, FA_MAX_WARPS, false, QB>(cu, cmd, f);
}

template <int D>
static void launch_affine(ci_cuda *cu, const ci_cuda_cmd *cmd, const ci_cuda_flash_params &f) {
  if (cmd->a.kv.layout.k_bits == 8)
    launch_width<D, false, 8>(cu, cmd, f);
  else
    launch_width<D, false, 4>(cu, cmd, f);
}

int ci_cuda_flash_launch(ci_cuda *cu, const ci_cuda_cmd *cmd) {
  ci_cuda_flash_params f = cmd->a.kv.plan;
  if (f.scratch_bytes) {
    const size_t slots = (size_t)cmd->a.kv.total_rows * cmd->a.kv.att.n_heads * f.splits;
    float *scratch = (float *)ci_cuda_scratch(cu, 2, f.scratch_bytes);
    if (!scratch) return CI_ERR;
    if (f.parallel) {
      f.partial = scratch;
      f.state = scratch + slots * cmd->a.kv.layout.head_dim;
      scratch = f.state + 2 * slots;
    }
    f.q_rotated = scratch; /* TurboQuant KV */
  }
  const int exact = f.exact;
  if (cmd->a.kv.layout.codec == CI_KV_TURBO) { /* fast mode only (ci_cuda_flash_supported) */
    if (cmd->a.kv.layout.head_dim == 64)
      launch_width<64, false, FA_TURBO>(cu, cmd, f);
    else
      launch_width<128, false, FA_TURBO>(cu, cmd, f);
  } else if (cmd->a.kv.layout.codec == CI_KV_TURBO_V) { /* fast mode only */
    if (cmd->a.kv.layout.head_dim == 64)
      launch_width<64, false, FA_TURBO_V>(cu, cmd, f);
    else
      launch_width<128, false, FA_TURBO_V>(cu, cmd, f);
  } else if (cmd->a.kv.layout.codec == CI_KV_AFFINE) { /* fast mode only */
    if (cmd->a.kv.layout.head_dim == 64)
      launch_affine<64>(cu, cmd, f);
    else
      launch_affine<128>(cu, cmd, f);
  } else if (cmd->a.kv.layout.head_dim == 64) {
    if (exact)
      launch_width<64, true>(cu, cmd, f);
    else
      launch_width<64, false>(cu, cmd, f);
  } else {
    if (exact)
      launch_width<128, true>(cu, cmd, f);
    else
      launch_width<128, false>(cu, cmd, f);
  }
  return ci_cuda_check_launch(cu, "flash attention");
}
