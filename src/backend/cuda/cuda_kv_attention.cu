/* Attention over quantized KV rows on CUDA cores (affine, TurboQuant, turbo-v; docs/kv-cache.md
 * §2), read in place: no decoded copy of the cache. The launch shape and the online softmax are
 * those of cuda_attention.cu's kernel: one block of four warps per (query row, query head), each
 * warp taking chunks of 32 keys in turn (lane j scores key j of the chunk, then every lane
 * accumulates its output dims over the chunk's keys in order), the warps merged in a fixed order,
 * so a row's result depends on its own sequence only (batch invariance, every launch mode).
 *
 * Per codec, the work that does not depend on the key is done once per (row, head):
 *   - affine K (s_G code + b_G): q's group sums, so a score is sum_G (s_G <q_G, code_G> + b_G
 *     sum(q_G));
 *   - turbo-v K ((code + zp_G) sc_G): likewise sum_G sc_G (<q_G, code_G> + zp_G sum(q_G));
 *   - TurboQuant K (ν c[code] in the rotated basis): q rotated once (q̃ = H (s ⊙ q)), a score is
 *     ν <q̃, c[code]>;
 *   - rotated V (TurboQuant, turbo-v): the output accumulates in the rotated basis and is
 *     un-rotated once after the merge (o = s ⊙ H õ).
 * The codebooks live in shared memory. Sliding windows and logit softcaps as in
 * cuda_attention.cu. */
#include "backend/cuda/cuda_kv_codec.cuh"

#include <string.h>

/* KV_SPLIT: keys per split, one 32-key chunk per warp (a decode row at 16k context gets 128
 * blocks per KV head, enough to fill the GPU at batch 1). */
enum { WARPS = 4, MAX_D = CI_CUDA_KV_MAX_D, MAX_GROUPS = MAX_D / 32, KV_SPLIT = WARPS * 32 };

typedef ci_cuda_kv_layout kv_layout;
typedef ci_cuda_seq_group seq_group;
typedef ci_cuda_attention_params attention_params;

/* The alignment (1, 2, 4 or 8 bytes) every stored row of a layout side starts at: slabs are
 * 256-byte aligned, rows sit at block_stride, offset and row_bytes multiples. */
__device__ static inline int row_alignment(const kv_layout &L, int value) {
  const int64_t x = L.block_stride | (value ? L.v_offset : L.k_offset) |
                    (value ? L.v_row_bytes : L.k_row_bytes) | 8;
  return (int)(x & -x);
}

/* n (<= 8) consecutive bytes at p as a little-endian word, read with the widest loads the
 * alignment `align` of p allows (packed rows are only 2-byte aligned in some codecs). */
__device__ static inline unsigned long long load_bytes(const uint8_t *p, int n, int align) {
  unsigned long long w = 0;
  int i = 0;
  if (align >= 4)
    for (; i + 4 <= n; i += 4) w |= (unsigned long long)*(const uint32_t *)(p + i) << (8 * i);
  if (align >= 2)
    for (; i + 2 <= n; i += 2) w |= (unsigned long long)*(const uint16_t *)(p + i) << (8 * i);
  for (; i < n; i++) w |= (unsigned long long)p[i] << (8 * i);
  return w;
}

/* Codes d0 .. d0 + n - 1 (n <= 8) of a packed row into codes[]: one word load where they start
 * on a byte (8-, 4- and 2-bit codes with d0 a multiple of n), code by code otherwise (3 bits). */
template <int N>
__device__ static inline void codes_at(const uint8_t *row, int d0, int bits, int align,
                                       unsigned codes[N]) {
  if (bits != 3 && (d0 * bits) % 8 == 0 && (N * bits) % 8 == 0) {
    const int offset = d0 * bits / 8;
    const int a = offset & (align - 1) ? (offset & -offset) : align;
    const unsigned long long w = load_bytes(row + offset, N * bits / 8, a);
#pragma unroll
    for (int i = 0; i < N; i++) codes[i] = (unsigned)(w >> (i * bits)) & ((1u << bits) - 1);
  } else {
#pragma unroll
    for (int i = 0; i < N; i++) codes[i] = ci_kv_dev_code(row, d0 + i, bits);
  }
}

/* A 16-bit field of a row's tail (bf16 or f16 bits); tails start 2-byte aligned. */
__device__ static inline unsigned tail16(const uint8_t *p) {
  return *(const uint16_t *)p;
}

/* In place x <- H_D x over shared memory with every thread of the block (ci_fwht's butterflies:
 * each element sees the same operations in the same order as the sequential transform). */
__device__ static void shared_fwht(float *x, int D) {
  for (int len = 1; len < D; len <<= 1) {
    for (int t = threadIdx.x; t < D / 2; t += blockDim.x) {
      const int i = (t / len) * (len << 1) + t % len;
      const float a = x[i], b = x[i + len];
      x[i] = __fadd_rn(a, b);
      x[i + len] = __fsub_rn(a, b);
    }
    __syncthreads();
  }
  const float scale = 1.0f / sqrtf((float)D);
  for (int d = threadIdx.x; d < D; d += blockDim.x) x[d] = __fmul_rn(x[d], scale);
  __syncthreads();
}

/* scores[g] = <q_g, K row> for the block's nh query heads (q rotated for TurboQuant; q_g at
 * q + g * MAX_D, its group sums at qsum + g * MAX_GROUPS): each code is read and decoded once and
 * used by every head; each head's sum runs in the same order whatever the other heads. */
template <int CODEC, int GB>
__device__ static inline void score_rows(const kv_layout &L, const uint8_t *kr, const float *q,
                                         const float *qsum, const float *centroids, int nh,
                                         int align, float *scores) {
  const int D = L.head_dim, bits = L.k_bits;
  const uint8_t *tail = kr + D * bits / 8;
  float dot[GB];
  if (CODEC == CI_KV_TURBO) {
#pragma unroll
    for (int g = 0; g < GB; g++) dot[g] = 0.0f;
    for (int d0 = 0; d0 < D; d0 += 8) {
      unsigned codes[8];
      codes_at<8>(kr, d0, bits, align, codes);
#pragma unroll
      for (int i = 0; i < 8; i++) {
        const float c = centroids[codes[i]];
#pragma unroll
        for (int g = 0; g < GB; g++)
          if (g < nh) dot[g] += q[g * MAX_D + d0 + i] * c;
      }
    }
    const float nu = ci_kv_dev_f16_to_f32(tail16(tail));
#pragma unroll
    for (int g = 0; g < GB; g++) scores[g] = nu * dot[g];
    return;
  }
  const int group = CODEC == CI_KV_AFFINE ? L.group : CI_CUDA_TURBO_V_GROUP;
  const int groups = D / group;
#pragma unroll
  for (int g = 0; g < GB; g++) scores[g] = 0.0f;
  for (int gi = 0; gi < groups; gi++) {
#pragma unroll
    for (int g = 0; g < GB; g++) dot[g] = 0.0f;
    for (int d0 = gi * group; d0 < (gi + 1) * group; d0 += 8) {
      unsigned codes[8];
      codes_at<8>(kr, d0, bits, align, codes);
#pragma unroll
      for (int i = 0; i < 8; i++) {
        const float x =
            CODEC == CI_KV_TURBO_V && bits == 8 ? (float)(int8_t)codes[i] : (float)codes[i];
#pragma unroll
        for (int g = 0; g < GB; g++)
          if (g < nh) dot[g] += q[g * MAX_D + d0 + i] * x;
      }
    }
    if (CODEC == CI_KV_AFFINE) {
      const float sv = __uint_as_float(tail16(tail + 2 * gi) << 16),
                  b = __uint_as_float(tail16(tail + 2 * (groups + gi)) << 16);
#pragma unroll
      for (int g = 0; g < GB; g++)
        if (g < nh) scores[g] += sv * dot[g] + b * qsum[g * MAX_GROUPS + gi];
    } else {
      const float sc = ci_kv_dev_f16_to_f32(tail16(tail + 2 * gi)),
                  zp = ci_kv_dev_f16_to_f32(tail16(tail + 2 * (groups + gi)));
#pragma unroll
      for (int g = 0; g < GB; g++)
        if (g < nh) scores[g] += sc * (dot[g] + zp * qsum[g * MAX_GROUPS + gi]);
    }
  }
}

/* Elements d0 .. d0 + N - 1 of a V row in the accumulation basis (rotated for TurboQuant and
 * turbo-v), d0 a multiple of N (N <= 8 divides every group, so they share one scale). */
template <int CODEC, int N>
__device__ static inline void values_at(const kv_layout &L, const uint8_t *vr, int d0, int align,
                                        const float *centroids, float v[N]) {
  const int D = L.head_dim, bits = L.v_bits;
  const uint8_t *tail = vr + D * bits / 8;
  unsigned codes[N];
  codes_at<N>(vr, d0, bits, align, codes);
  if (CODEC == CI_KV_AFFINE) {
    const int g = d0 / L.group, groups = D / L.group;
    const float sv = __uint_as_float(tail16(tail + 2 * g) << 16),
                b = __uint_as_float(tail16(tail + 2 * (groups + g)) << 16);
#pragma unroll
    for (int i = 0; i < N; i++) v[i] = sv * (float)codes[i] + b;
  } else {
    const float r = ci_kv_dev_f16_to_f32(
        tail16(CODEC == CI_KV_TURBO ? tail : tail + 2 * (d0 / CI_CUDA_TURBO_V_GROUP)));
#pragma unroll
    for (int i = 0; i < N; i++)
      v[i] = CODEC == CI_KV_TURBO ? r * centroids[codes[i]] : centroids[codes[i]] * r;
  }
}

/* Folds a split's state (sm, sl, so) into the running state (rm, rl, ro): the one merge rule of
 * both launch modes, every operation rounded explicitly so the two kernels agree bit for bit. A
 * split without keys (sl == 0) leaves the state unchanged. */
__device__ static inline void merge_split(float &rm, float &rl, float &ro, float sm, float sl,
                                          float so) {
  if (!(sl > 0.0f)) return;
  if (!(rl > 0.0f)) {
    rm = sm, rl = sl, ro = so;
    return;
  }
  const float m = fmaxf(rm, sm);
  const float a = expf(__fsub_rn(rm, m)), b = expf(__fsub_rn(sm, m));
  rl = __fadd_rn(__fmul_rn(rl, a), __fmul_rn(sl, b));
  ro = __fadd_rn(__fmul_rn(ro, a), __fmul_rn(so, b));
  rm = m;
}

/* out[d] = o[d] in the model basis (un-rotated through shared memory for rotated V). */
template <int CODEC>
__device__ static inline void write_output(const kv_layout &L, float *o_shared, float *out) {
  constexpr bool rotated_v = CODEC == CI_KV_TURBO || CODEC == CI_KV_TURBO_V;
  const int D = L.head_dim;
  if (rotated_v) shared_fwht(o_shared, D);
  for (int d = threadIdx.x; d < D; d += blockDim.x)
    out[d] = rotated_v ? __fmul_rn(L.signs[d], o_shared[d]) : o_shared[d];
}

/* Query heads one block takes (of one KV head's GQA group of G) for PER_LANE output dims per
 * lane: the accumulators of every head stay in registers, so a group of at most 4 (Llama 3's
 * 32/8) gets a kernel sized for 4. */
__host__ __device__ constexpr int heads_per_block(int per_lane, int G) {
  return per_lane <= 4 ? (G <= 4 ? 4 : 8) : per_lane <= 8 ? 4 : 2;
}

/* One block per (query row, KV head, chunk of up to GB query heads of its group[, split]).
 * Keys are split at fixed absolute boundaries of KV_SPLIT positions. Within a split the warps
 * take chunks of 32 keys in turn (lane j decodes key j's K row once for every head of the block,
 * then every lane decodes its output dims of the chunk's V rows once for every head) and merge in
 * warp order; the splits then merge in split order (merge_split), either inside the block
 * (parallel 0: one block walks every split of its row) or in kv_merge_kernel (parallel 1: one
 * block per split), with the same arithmetic either way. A head's arithmetic never depends on
 * the other heads of its block. */
template <int PER_LANE, int CODEC, int GB>
__global__ static void __launch_bounds__(WARPS * 32, GB <= 4 && PER_LANE <= 4 ? 5 : 1)
    kv_attention_kernel(kv_layout L, const seq_group *g, attention_params a, ci_cuda_flash_params f,
                        int *error_flag) {
  ci_grid_begin();
  constexpr bool rotate_q = CODEC == CI_KV_TURBO;
  constexpr int OUT_PER_THREAD = (PER_LANE * 32 + WARPS * 32 - 1) / (WARPS * 32);
  __shared__ float merge_m[WARPS], merge_l[WARPS];
  __shared__ float merge_acc[WARPS][MAX_D];
  __shared__ float q_shared[GB * MAX_D], out_shared[MAX_D];
  __shared__ float qsum[GB * MAX_GROUPS];
  __shared__ float k_centroids[16], v_centroids[16];
  const int s = ci_kv_dev_seq_of(g, blockIdx.x);
  const int row = g->first_row[s] + (blockIdx.x - g->row_start[s]);
  const int D = L.head_dim;
  const int G = a.n_heads / L.n_kv_heads, chunks = (G + GB - 1) / GB;
  const int kv_head = blockIdx.y / chunks, h0 = kv_head * G + (blockIdx.y % chunks) * GB;
  const int nh = G - (blockIdx.y % chunks) * GB < GB ? G - (blockIdx.y % chunks) * GB : GB;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int k_align = row_alignment(L, 0), v_align = row_alignment(L, 1);
  const int64_t p = a.pos[row];
  const int64_t lo = a.window > 0 && p - a.window + 1 > 0 ? p - a.window + 1 : 0;
  int64_t first_split = lo / KV_SPLIT, last_split = p / KV_SPLIT;
  if (f.parallel) {
    if ((int64_t)blockIdx.z < first_split || (int64_t)blockIdx.z > last_split)
      return; /* no key of this row in the split: the merge skips it */
    first_split = last_split = blockIdx.z;
  }
  for (int i = threadIdx.x; i < nh * D; i += blockDim.x) {
    const int hg = i / D, d = i % D;
    const float x = a.q[((int64_t)row * a.n_heads + h0 + hg) * D + d];
    q_shared[hg * MAX_D + d] = rotate_q ? __fmul_rn(L.signs[d], x) : x;
  }
  if (threadIdx.x < 16) {
    k_centroids[threadIdx.x] = L.k_bits <= 4 ? ci_kv_centroids[L.k_bits][threadIdx.x] : 0.0f;
    v_centroids[threadIdx.x] = L.v_bits <= 4 ? ci_kv_centroids[L.v_bits][threadIdx.x] : 0.0f;
  }
  __syncthreads();
  if (rotate_q) {
    for (int hg = 0; hg < nh; hg++) shared_fwht(q_shared + hg * MAX_D, D);
  } else {
    const int group = CODEC == CI_KV_AFFINE ? L.group : CI_CUDA_TURBO_V_GROUP;
    for (int i = threadIdx.x; i < nh * (D / group); i += blockDim.x) {
      const int hg = i / (D / group), gi = i % (D / group);
      float sum = 0.0f;
      for (int d = gi * group; d < (gi + 1) * group; d++) sum += q_shared[hg * MAX_D + d];
      qsum[hg * MAX_GROUPS + gi] = sum;
    }
    __syncthreads();
  }
  /* the running state of each head over splits (in-block mode): every thread holds rm, rl alike
   * and the output dims d = threadIdx.x + k * blockDim.x of ro */
  float rm[GB], rl[GB], ro[GB][OUT_PER_THREAD];
#pragma unroll
  for (int hg = 0; hg < GB; hg++) {
    rm[hg] = -INFINITY, rl[hg] = 0.0f;
#pragma unroll
    for (int k = 0; k < OUT_PER_THREAD; k++) ro[hg][k] = 0.0f;
  }
  for (int64_t split = first_split; split <= last_split; split++) {
    const int64_t k_lo = split * KV_SPLIT > lo ? split * KV_SPLIT : lo;
    const int64_t k_hi = (split + 1) * KV_SPLIT - 1 < p ? (split + 1) * KV_SPLIT - 1 : p;
    float acc[GB][PER_LANE], m[GB], l[GB];
#pragma unroll
    for (int hg = 0; hg < GB; hg++) {
      m[hg] = -INFINITY, l[hg] = 0.0f;
#pragma unroll
      for (int i = 0; i < PER_LANE; i++) acc[hg][i] = 0.0f;
    }
    for (int64_t first = k_lo + (int64_t)warp * 32; first <= k_hi; first += (int64_t)WARPS * 32) {
      const int64_t key = first + lane;
      float score[GB];
#pragma unroll
      for (int hg = 0; hg < GB; hg++) score[hg] = 0.0f;
      const uint8_t *vr = NULL;
      if (key <= k_hi) {
        const int64_t entry = key / L.block_tokens;
        const int32_t block = entry < g->n_entries[s] ? g->table[s][entry] : -1;
        if (block < 0) {
          *error_flag = 1;
        } else {
          vr = ci_kv_dev_row(L, 1, block, key % L.block_tokens, kv_head);
          score_rows<CODEC, GB>(L, ci_kv_dev_row(L, 0, block, key % L.block_tokens, kv_head),
                                q_shared, qsum, k_centroids, nh, k_align, score);
        }
      }
      if (!__any_sync(0xffffffffu, vr != NULL)) continue; /* no live key in this chunk */
      float weight[GB];
#pragma unroll
      for (int hg = 0; hg < GB; hg++) {
        float sc = -INFINITY;
        if (vr) {
          sc = score[hg] * a.scale;
          if (a.softcap != 0.0f) sc = a.softcap * tanhf(sc / a.softcap);
        }
        float chunk_max = sc;
        for (int off = 16; off > 0; off >>= 1)
          chunk_max = fmaxf(chunk_max, __shfl_xor_sync(0xffffffffu, chunk_max, off));
        const float m_new = fmaxf(m[hg], chunk_max);
        const float correction = expf(m[hg] - m_new);
        weight[hg] = vr ? expf(sc - m_new) : 0.0f;
        float weight_sum = weight[hg];
        for (int off = 16; off > 0; off >>= 1)
          weight_sum += __shfl_xor_sync(0xffffffffu, weight_sum, off);
        l[hg] = l[hg] * correction + weight_sum;
#pragma unroll
        for (int i = 0; i < PER_LANE; i++) acc[hg][i] *= correction;
        m[hg] = m_new;
      }
      for (int j = 0; j < 32; j++) {
        const uint8_t *vj = (const uint8_t *)__shfl_sync(0xffffffffu, (unsigned long long)vr, j);
        float wj[GB];
#pragma unroll
        for (int hg = 0; hg < GB; hg++) wj[hg] = __shfl_sync(0xffffffffu, weight[hg], j);
        if (!vj || lane * PER_LANE >= D) continue;
        /* lane's PER_LANE consecutive dims, decoded 8 at a time (one scale each) */
        constexpr int N = PER_LANE < 8 ? PER_LANE : 8;
#pragma unroll
        for (int h = 0; h < PER_LANE / N; h++) {
          float v[N];
          values_at<CODEC, N>(L, vj, lane * PER_LANE + h * N, v_align, v_centroids, v);
#pragma unroll
          for (int i = 0; i < N; i++)
#pragma unroll
            for (int hg = 0; hg < GB; hg++) acc[hg][h * N + i] += wj[hg] * v[i];
        }
      }
    }
    /* each head's split state: its warps merged in order */
#pragma unroll
    for (int hg = 0; hg < GB; hg++) {
      if (hg >= nh) break;
      if (lane == 0) {
        merge_m[warp] = m[hg];
        merge_l[warp] = l[hg];
      }
#pragma unroll
      for (int i = 0; i < PER_LANE; i++) {
        const int d = lane * PER_LANE + i;
        if (d < D) merge_acc[warp][d] = acc[hg][i];
      }
      __syncthreads();
      float sm = -INFINITY;
      for (int w = 0; w < WARPS; w++) sm = fmaxf(sm, merge_m[w]);
      float sl = 0.0f;
      for (int w = 0; w < WARPS; w++)
        if (merge_l[w] > 0.0f) sl += merge_l[w] * expf(merge_m[w] - sm);
      const int64_t slot = ((int64_t)blockIdx.x * a.n_heads + h0 + hg) * f.splits + split;
      if (f.parallel && threadIdx.x == 0) {
        f.state[2 * slot] = sm;
        f.state[2 * slot + 1] = sl;
      }
#pragma unroll
      for (int k = 0; k < OUT_PER_THREAD; k++) {
        const int d = threadIdx.x + k * WARPS * 32;
        if (d >= D) continue;
        float so = 0.0f;
        for (int w = 0; w < WARPS; w++)
          if (merge_l[w] > 0.0f) so += merge_acc[w][d] * expf(merge_m[w] - sm);
        if (f.parallel) {
          f.partial[slot * D + d] = so;
        } else {
          float m_copy = rm[hg], l_copy = rl[hg];
          merge_split(m_copy, l_copy, ro[hg][k], sm, sl, so);
        }
      }
      if (!f.parallel) {
        float unused = 0.0f;
        merge_split(rm[hg], rl[hg], unused, sm, sl, 0.0f);
      }
      __syncthreads(); /* merge_* are reused by the next head and split */
    }
  }
  if (f.parallel) return;
#pragma unroll
  for (int hg = 0; hg < GB; hg++) {
    if (hg >= nh) break;
#pragma unroll
    for (int k = 0; k < OUT_PER_THREAD; k++) {
      const int d = threadIdx.x + k * WARPS * 32;
      if (d < D) out_shared[d] = rl[hg] > 0.0f ? __fdiv_rn(ro[hg][k], rl[hg]) : 0.0f;
    }
    __syncthreads();
    write_output<CODEC>(L, out_shared, a.out + ((int64_t)row * a.n_heads + h0 + hg) * D);
    __syncthreads(); /* out_shared is reused by the next head */
  }
}

/* Parallel mode: merges the per-split states of each (row, query head) in split order, with
 * merge_split's arithmetic. Only the output values and the sum form chains: a split's factors
 * (expf(rm - m), expf(sm - m)) depend on the running maximum alone, a prefix maximum (exact in any
 * order). Warp 0 computes a batch of KV_MERGE_BATCH splits' factors at once (a shuffle scan over
 * the splits with keys) while every thread loads its output dims of those splits; then each
 * thread folds them in order, two dependent operations per split: the result is bit-identical to
 * the serial fold (and to kv_attention_kernel's in-block merge). */
enum { KV_MERGE_BATCH = 32 };
__device__ static inline void merge_with(float &r, float s, float4 c) {
  if (c.w == 1.0f) /* the first split with keys: copied */
    r = s;
  else if (c.w == 2.0f)
    r = __fadd_rn(__fmul_rn(r, c.x), __fmul_rn(s, c.y));
}

template <int CODEC>
__global__ static void __launch_bounds__(WARPS * 32)
    kv_merge_kernel(kv_layout L, const seq_group *g, attention_params a, ci_cuda_flash_params f) {
  ci_grid_begin();
  constexpr int PER_THREAD = MAX_D / (WARPS * 32);
  __shared__ float out_shared[MAX_D];
  __shared__ float4 coef[KV_MERGE_BATCH]; /* (a, b, l of the split, 0 skip / 1 copy / 2 fold) */
  const int s = ci_kv_dev_seq_of(g, blockIdx.x);
  const int row = g->first_row[s] + (blockIdx.x - g->row_start[s]);
  const int h = blockIdx.y, D = L.head_dim, lane = threadIdx.x % 32;
  const int64_t p = a.pos[row];
  const int64_t lo = a.window > 0 && p - a.window + 1 > 0 ? p - a.window + 1 : 0;
  const int64_t base = ((int64_t)blockIdx.x * a.n_heads + h) * f.splits;
  float run_max = -INFINITY; /* warp 0: the running maximum over the splits with keys */
  int run_any = 0;
  float rl = 0.0f, ro[PER_THREAD];
#pragma unroll
  for (int k = 0; k < PER_THREAD; k++) ro[k] = 0.0f;
  for (int64_t first = lo / KV_SPLIT; first <= p / KV_SPLIT; first += KV_MERGE_BATCH) {
    const int n = (int)min((int64_t)KV_MERGE_BATCH, p / KV_SPLIT - first + 1);
    __syncthreads(); /* the previous batch's factors are consumed */
    if (threadIdx.x < 32) {
      float sm = 0.0f, sl = 0.0f;
      if (lane < n)
        sm = f.state[2 * (base + first + lane)], sl = f.state[2 * (base + first + lane) + 1];
      const int live = lane < n && sl > 0.0f; /* merge_split skips !(sl > 0) */
      float v = live ? sm : -INFINITY;        /* inclusive prefix maximum */
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const float o = __shfl_up_sync(0xffffffffu, v, off);
        if (lane >= off) v = fmaxf(v, o);
      }
      float before = __shfl_up_sync(0xffffffffu, v, 1);
      if (lane == 0) before = -INFINITY;
      before = fmaxf(run_max, before);
      const unsigned live_mask = __ballot_sync(0xffffffffu, live);
      const int any_before = run_any || (live_mask & ((1u << lane) - 1u)) != 0;
      float4 c = make_float4(0.0f, 0.0f, sl, 0.0f);
      if (live && !any_before) {
        c.w = 1.0f;
      } else if (live) {
        const float m = fmaxf(before, sm);
        c = make_float4(expf(__fsub_rn(before, m)), expf(__fsub_rn(sm, m)), sl, 2.0f);
      }
      if (lane < n) coef[lane] = c;
      run_max = fmaxf(run_max, __shfl_sync(0xffffffffu, v, 31));
      run_any = run_any || live_mask != 0;
    }
    for (int i0 = 0; i0 < n; i0 += 8) { /* 8 splits' values in flight per thread */
      float part[8][PER_THREAD];
#pragma unroll
      for (int i = 0; i < 8; i++)
#pragma unroll
        for (int k = 0; k < PER_THREAD; k++) {
          const int d = threadIdx.x + k * WARPS * 32;
          part[i][k] = i0 + i < n && d < D ? f.partial[(base + first + i0 + i) * D + d] : 0.0f;
        }
      if (i0 == 0) __syncthreads(); /* this batch's factors */
#pragma unroll
      for (int i = 0; i < 8; i++) {
        if (i0 + i >= n) break;
        const float4 c = coef[i0 + i];
        merge_with(rl, c.z, c);
#pragma unroll
        for (int k = 0; k < PER_THREAD; k++) merge_with(ro[k], part[i][k], c);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < PER_THREAD; k++) {
    const int d = threadIdx.x + k * WARPS * 32;
    if (d < D) out_shared[d] = rl > 0.0f ? __fdiv_rn(ro[k], rl) : 0.0f;
  }
  __syncthreads();
  write_output<CODEC>(L, out_shared, a.out + ((int64_t)row * a.n_heads + h) * D);
}

/* PER_LANE of the kernel that runs head_dim D. */
static int lane_dims(int D) {
  const int per_lane = (D + 31) / 32;
  return per_lane <= 1 ? 1 : per_lane <= 2 ? 2 : per_lane <= 4 ? 4 : per_lane <= 8 ? 8 : 16;
}

template <int PER_LANE, int CODEC, int GB>
static void launch_kernel(ci_cuda *cu, const ci_cuda_cmd *cmd, const ci_cuda_flash_params &f,
                          dim3 grid) {
  ci_launch(cu, kv_attention_kernel<PER_LANE, CODEC, GB>, grid, WARPS * 32, 0, cmd->a.kv.layout,
            cmd->a.kv.group, cmd->a.kv.att, f, cu->error_flag);
}

template <int CODEC>
static void launch_codec(ci_cuda *cu, const ci_cuda_cmd *cmd, const ci_cuda_flash_params &f) {
  const kv_layout &L = cmd->a.kv.layout;
  const attention_params &a = cmd->a.kv.att;
  const seq_group *g = cmd->a.kv.group;
  const int per_lane = lane_dims(L.head_dim);
  const int G = a.n_heads / L.n_kv_heads, gb = heads_per_block(per_lane, G);
  const dim3 grid((unsigned)cmd->a.kv.total_rows, (unsigned)(L.n_kv_heads * ((G + gb - 1) / gb)),
                  f.parallel ? (unsigned)f.splits : 1u);
  if (per_lane <= 1)
    gb == 4 ? launch_kernel<1, CODEC, 4>(cu, cmd, f, grid)
            : launch_kernel<1, CODEC, 8>(cu, cmd, f, grid);
  else if (per_lane <= 2)
    gb == 4 ? launch_kernel<2, CODEC, 4>(cu, cmd, f, grid)
            : launch_kernel<2, CODEC, 8>(cu, cmd, f, grid);
  else if (per_lane <= 4)
    gb == 4 ? launch_kernel<4, CODEC, 4>(cu, cmd, f, grid)
            : launch_kernel<4, CODEC, 8>(cu, cmd, f, grid);
  else if (per_lane <= 8)
    launch_kernel<8, CODEC, heads_per_block(8, 8)>(cu, cmd, f, grid);
  else
    launch_kernel<16, CODEC, heads_per_block(16, 8)>(cu, cmd, f, grid);
  if (f.parallel)
    ci_launch(cu, kv_merge_kernel<CODEC>, dim3((unsigned)cmd->a.kv.total_rows, (unsigned)a.n_heads),
              WARPS * 32, 0, L, g, a, f);
}

void ci_cuda_kv_attention_plan(const kv_layout *L, const seq_group *host_group, int n_heads,
                               int n_sms, ci_cuda_flash_params *f) {
  memset(f, 0, sizeof *f);
  f->splits = ci_cuda_key_splits(host_group, L, KV_SPLIT);
  const int G = n_heads / L->n_kv_heads, gb = heads_per_block(lane_dims(L->head_dim), G);
  const int64_t blocks = (int64_t)host_group->total_rows * L->n_kv_heads * ((G + gb - 1) / gb);
  const size_t bytes =
      (size_t)host_group->total_rows * n_heads * f->splits * (L->head_dim + 2) * sizeof(float);
  /* one block per split when one block per (row, head) leaves SMs idle (decode, short chunks) */
  f->parallel = f->splits > 1 && blocks < 8 * n_sms && bytes <= ((size_t)256 << 20);
  f->scratch_bytes = f->parallel ? bytes : 0;
}

int ci_cuda_kv_attention_launch(ci_cuda *cu, const ci_cuda_cmd *cmd) {
  ci_cuda_flash_params f = cmd->a.kv.plan;
  if (f.splits < 1) return ci_fail("CUDA attention: a quantized KV launch without a plan");
  if (f.parallel) {
    const size_t slots = (size_t)cmd->a.kv.total_rows * cmd->a.kv.att.n_heads * f.splits;
    float *scratch = (float *)ci_cuda_scratch(cu, 2, f.scratch_bytes);
    if (!scratch) return CI_ERR;
    f.partial = scratch;
    f.state = scratch + slots * cmd->a.kv.layout.head_dim;
  }
  switch (cmd->a.kv.layout.codec) {
  case CI_KV_AFFINE:
    launch_codec<CI_KV_AFFINE>(cu, cmd, f);
    break;
  case CI_KV_TURBO:
    launch_codec<CI_KV_TURBO>(cu, cmd, f);
    break;
  case CI_KV_TURBO_V:
    launch_codec<CI_KV_TURBO_V>(cu, cmd, f);
    break;
  default:
    return ci_fail("CUDA attention: KV codec %d has no quantized kernel", cmd->a.kv.layout.codec);
  }
  return ci_cuda_check_launch(cu, "quantized KV attention");
}
