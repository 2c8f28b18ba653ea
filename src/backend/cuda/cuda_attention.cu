/* The CUDA backend's paged KV: kv_store writes a step's K and V rows into each sequence's
 * blocks, attention reads them back through the block table, kv_convert_block re-encodes a block
 * (delayed conversion, copy-on-write). Every KV codec: bf16 and f32 rows are written and read
 * here; quantized rows (affine, TurboQuant, turbo-v) are encoded here with the CPU's exact rule
 * (cuda_kv_codec.cuh) and attended by cuda_kv_attention.cu. Sequences sharing a KV layout (codec,
 * pool, layer offsets) go in one launch; their block-table pointers and row ranges travel as
 * kernel parameters, so a batch mixing codecs runs one launch per codec.
 *
 * Attention over bf16 KV with head_dim 64 or 128 runs the tensor-core kernel of
 * cuda_flash_attention.cu (the launch is planned here, per group). Other bf16/f32 layouts run one
 * block of four warps per (query row, query head): each warp takes chunks of
 * 32 keys in turn (one key per lane for the scores, then every lane's output dims over the
 * chunk's keys in order) with an online softmax in f32, and the warps merge in a fixed order, so
 * a row's result depends on its own sequence only (batch invariance). Sliding windows start at p -
 * W + 1; logit softcaps apply to the scaled score before the softmax. */
#include "backend/cuda/cuda_kv_codec.cuh"

#include <string.h>

enum { MAX_SEQS = CI_CUDA_MAX_SEQS, WARPS = 4, MAX_D = CI_CUDA_KV_MAX_D };

typedef ci_cuda_kv_layout kv_layout;
typedef ci_cuda_seq_group seq_group;
typedef ci_cuda_attention_params attention_params;

static int layout_of(const ci_paged_kv *kv, kv_layout *out) {
  if (kv->format.codec < 0 || kv->format.codec >= CI_KV_CODEC_COUNT)
    return ci_fail("the CUDA backend: unknown KV codec %d", (int)kv->format.codec);
  const int D = kv->head_dim, codec = (int)kv->format.codec;
  const int grouped = codec == CI_KV_AFFINE || codec == CI_KV_TURBO_V;
  const int rotated = codec == CI_KV_TURBO || codec == CI_KV_TURBO_V;
  /* the cache checked the format; a bad one here (a hand-built view) is named, never run */
  if ((grouped && (kv->format.group_size <= 0 || D % kv->format.group_size)) ||
      (rotated && (D < 2 || (D & (D - 1)))) ||
      (ci_kv_format_is_quantized(&kv->format) && ci_kv_row_bytes(&kv->format, D, 0) == 0))
    return ci_kv_format_check(&kv->format, D) ? CI_ERR
                                              : ci_fail("the CUDA backend: a malformed KV format");
  if (kv->k_row_bytes != ci_kv_row_bytes(&kv->format, D, 0) ||
      kv->v_row_bytes != ci_kv_row_bytes(&kv->format, D, 1))
    return ci_fail("the CUDA backend: KV rows of %zu/%zu bytes do not match their codec",
                   kv->k_row_bytes, kv->v_row_bytes);
  if (rotated && !kv->signs)
    return ci_fail("the CUDA backend: a TurboQuant KV layer without its sign vector");
  if (ci_kv_format_is_quantized(&kv->format) && kv->head_dim < 8)
    return ci_fail("the CUDA backend runs quantized KV for head_dim 8 and up (this model: %d)",
                   kv->head_dim);
  if (kv->head_dim > MAX_D)
    return ci_fail("the CUDA backend supports head_dim up to %d (this model: %d)", MAX_D,
                   kv->head_dim);
  memset(out, 0, sizeof *out);
  out->slabs = kv->slabs;
  out->block_stride = (int64_t)kv->block_stride;
  out->k_offset = (int64_t)kv->k_offset;
  out->v_offset = (int64_t)kv->v_offset;
  out->k_row_bytes = (int64_t)kv->k_row_bytes;
  out->v_row_bytes = (int64_t)kv->v_row_bytes;
  out->blocks_per_slab = kv->blocks_per_slab;
  out->block_tokens = kv->block_tokens;
  out->n_kv_heads = kv->n_kv_heads;
  out->head_dim = kv->head_dim;
  out->f32 = kv->format.codec == CI_KV_F32;
  out->codec = (int)kv->format.codec;
  out->k_bits = kv->format.k_bits;
  out->v_bits = kv->format.v_bits;
  out->group = kv->format.group_size;
  out->signs = rotated ? kv->signs : NULL;
  return CI_OK;
}

/* Whether two views give the same layout (every field layout_of reads; the block tables may
 * differ): a cheaper test than building both layouts, for the steps of many sequences. */
static int same_layout(const ci_paged_kv *a, const ci_paged_kv *b) {
  return a->format.codec == b->format.codec && a->format.k_bits == b->format.k_bits &&
         a->format.v_bits == b->format.v_bits && a->format.group_size == b->format.group_size &&
         a->block_tokens == b->block_tokens && a->n_kv_heads == b->n_kv_heads &&
         a->head_dim == b->head_dim && a->slabs == b->slabs &&
         a->blocks_per_slab == b->blocks_per_slab && a->block_stride == b->block_stride &&
         a->k_offset == b->k_offset && a->v_offset == b->v_offset &&
         a->k_row_bytes == b->k_row_bytes && a->v_row_bytes == b->v_row_bytes &&
         a->signs == b->signs;
}

__device__ static inline uint8_t *row_address(const kv_layout &L, int value, int32_t block,
                                              int64_t slot, int head) {
  return ci_kv_dev_row(L, value, block, slot, head);
}

__device__ static inline float load_kv(const kv_layout &L, const uint8_t *row, int d) {
  return L.f32 ? ((const float *)row)[d] : __bfloat162float(((const __nv_bfloat16 *)row)[d]);
}

__device__ static inline int seq_of(const seq_group *g, int x) {
  return ci_kv_dev_seq_of(g, x);
}

/* ==== kv_store ==== */

__global__ static void kv_store_kernel(kv_layout L, const seq_group *g, const float *k,
                                       const float *v, const int32_t *pos, int *error_flag) {
  /* the row's block from the step's inputs, before the wait (cuda_launch.cuh) */
  const int s = seq_of(g, blockIdx.x);
  const int row = g->first_row[s] + (blockIdx.x - g->row_start[s]);
  const int h = blockIdx.y; /* one KV head per block */
  const int width = L.n_kv_heads * L.head_dim;
  const int64_t p = pos[row];
  const int64_t entry = p / L.block_tokens;
  const int32_t block = entry < g->n_entries[s] ? g->table[s][entry] : -1;
  ci_grid_begin();
  if (block < 0) {
    if (threadIdx.x == 0) *error_flag = 1;
    return;
  }
  uint8_t *kr = row_address(L, 0, block, p % L.block_tokens, h);
  uint8_t *vr = row_address(L, 1, block, p % L.block_tokens, h);
  const float *ks = k + (int64_t)row * width + (int64_t)h * L.head_dim;
  const float *vs = v + (int64_t)row * width + (int64_t)h * L.head_dim;
  for (int d = threadIdx.x; d < L.head_dim; d += blockDim.x) {
    if (L.f32) {
      ((float *)kr)[d] = ks[d];
      ((float *)vr)[d] = vs[d];
    } else {
      ((__nv_bfloat16 *)kr)[d] = __float2bfloat16_rn(ks[d]);
      ((__nv_bfloat16 *)vr)[d] = __float2bfloat16_rn(vs[d]);
    }
  }
}

/* Quantized rows: one block of two warps per (row, KV head); lane 0 of warp 0 encodes the K
 * row, lane 0 of warp 1 the V row, each with the CPU's sequential rule (cuda_kv_codec.cuh). */
__global__ static void kv_store_quant_kernel(kv_layout L, const seq_group *g, const float *k,
                                             const float *v, const int32_t *pos, int *error_flag) {
  /* the row's block from the step's inputs, before the wait (cuda_launch.cuh) */
  const int s = seq_of(g, blockIdx.x);
  const int row = g->first_row[s] + (blockIdx.x - g->row_start[s]);
  const int h = blockIdx.y;
  const int value = threadIdx.x / 32;
  const int width = L.n_kv_heads * L.head_dim;
  const int64_t p = pos[row];
  const int64_t entry = p / L.block_tokens;
  const int32_t block = p >= 0 && entry < g->n_entries[s] ? g->table[s][entry] : -1;
  ci_grid_begin();
  if (threadIdx.x % 32 != 0) return;
  if (block < 0) {
    *error_flag = 1;
    return;
  }
  const float *x = (value ? v : k) + (int64_t)row * width + (int64_t)h * L.head_dim;
  ci_kv_dev_encode_row(L, value, x, row_address(L, value, block, p % L.block_tokens, h));
}

/* Quantized rows of a layout ci_kv_dev_warp_encodes: one block per (row, KV head), the first half
 * of its warps encoding the K row and the second half the V row with all their lanes (the
 * one-thread rule's bytes, cuda_kv_codec.cuh): one warp per row, or for affine rows one warp per
 * group. */
__global__ static void kv_store_warp_kernel(kv_layout L, const seq_group *g, const float *k,
                                            const float *v, const int32_t *pos, int *error_flag) {
  __shared__ float y[2][MAX_D];
  __shared__ uint8_t codes[2][MAX_D];
  /* the row's block from the step's inputs, before the wait (cuda_launch.cuh) */
  const int s = seq_of(g, blockIdx.x);
  const int row = g->first_row[s] + (blockIdx.x - g->row_start[s]);
  const int h = blockIdx.y, half = blockDim.x / 64; /* warps per row */
  const int value = threadIdx.x / 32 / half, part = threadIdx.x / 32 % half;
  const int width = L.n_kv_heads * L.head_dim;
  const int64_t p = pos[row];
  const int64_t entry = p / L.block_tokens;
  const int32_t block = p >= 0 && entry < g->n_entries[s] ? g->table[s][entry] : -1;
  ci_grid_begin();
  if (block < 0) {
    if (threadIdx.x == 0) *error_flag = 1;
    return;
  }
  const float *x = (value ? v : k) + (int64_t)row * width + (int64_t)h * L.head_dim;
  ci_kv_dev_encode_row_warp(L, value, x, y[value], codes[value],
                            row_address(L, value, block, p % L.block_tokens, h), part, half);
}

/* Copies the group to the device (the step's staging ring) and calls launch(layout, host group,
 * group on the device). */
template <typename Launch>
static int stage_and_launch(ci_cuda *cu, const kv_layout &L, const seq_group &g, Launch launch) {
  const seq_group *device = (const seq_group *)ci_cuda_stage(cu, &g, sizeof g);
  if (!device) return CI_ERR;
  return launch(L, g, device);
}

/* The most rows any sequence of the step has. */
static int max_rows_per_seq(const ci_step_kv *seqs) {
  int most = 0;
  for (int i = 0; i < seqs->n_seqs; i++) most = seqs->n_rows[i] > most ? seqs->n_rows[i] : most;
  return most;
}

/* Calls launch(layout, group) for the sequences of `seqs`, grouped by layout, MAX_SEQS at a time
 * (rows of every sequence once). With n_heads > 0 (attention) and a layout the tensor-core
 * kernel runs, each sequence's rows are also cut into that kernel's query tiles. */
template <typename Launch>
static int for_each_group(ci_cuda *cu, const ci_step_kv *seqs, int n_heads, Launch launch) {
  int done[1024];
  if (seqs->n_seqs > 1024) return ci_fail("CUDA: more than 1024 sequences in one step");
  memset(done, 0, sizeof done);
  for (int first = 0; first < seqs->n_seqs; first++) {
    if (done[first] || seqs->n_rows[first] <= 0) continue;
    kv_layout L;
    if (layout_of(&seqs->kv[first], &L)) return CI_ERR;
    seq_group g;
    memset(&g, 0, sizeof g);
    const int tile_positions =
        n_heads > 0 && ci_cuda_flash_supported(&L, n_heads, cu->input_planes == 2)
            ? ci_cuda_flash_positions_per_tile(
                  &L, n_heads, ci_cuda_flash_warps(n_heads, L.n_kv_heads, max_rows_per_seq(seqs)))
            : 0;
    for (int i = first; i < seqs->n_seqs; i++) {
      if (done[i] || seqs->n_rows[i] <= 0 || !same_layout(&seqs->kv[first], &seqs->kv[i])) continue;
      done[i] = 1;
      g.table[g.n] = seqs->kv[i].block_table;
      g.n_entries[g.n] = seqs->kv[i].n_table_entries;
      g.first_row[g.n] = seqs->first_row[i];
      g.n_rows[g.n] = seqs->n_rows[i];
      g.row_start[g.n] = g.total_rows;
      g.total_rows += seqs->n_rows[i];
      if (tile_positions) {
        g.tile_start[g.n] = g.total_tiles;
        g.total_tiles += (seqs->n_rows[i] + tile_positions - 1) / tile_positions;
      }
      if (++g.n == MAX_SEQS) {
        if (stage_and_launch(cu, L, g, launch)) return CI_ERR;
        memset(&g, 0, sizeof g);
      }
    }
    if (g.n > 0 && stage_and_launch(cu, L, g, launch)) return CI_ERR;
  }
  return CI_OK;
}

int ci_cuda_kv_store(ci_cuda *cu, const ci_step_kv *seqs, const float *k, const float *v,
                     const int32_t *pos) {
  return for_each_group(cu, seqs, 0,
                        [&](const kv_layout &L, const seq_group &host, const seq_group *g) {
                          ci_cuda_cmd cmd;
                          memset(&cmd, 0, sizeof cmd);
                          cmd.kind = CMD_KV_STORE;
                          cmd.a.kv.layout = L;
                          cmd.a.kv.group = g;
                          cmd.a.kv.total_rows = host.total_rows;
                          cmd.a.kv.k = k;
                          cmd.a.kv.v = v;
                          cmd.a.kv.pos = pos;
                          return ci_cuda_emit(cu, &cmd);
                        });
}

void ci_cuda_kv_store_launch(ci_cuda *cu, const ci_cuda_cmd *cmd) {
  const dim3 grid((unsigned)cmd->a.kv.total_rows, (unsigned)cmd->a.kv.layout.n_kv_heads);
  const int codec = cmd->a.kv.layout.codec;
  if (codec == CI_KV_BF16 || codec == CI_KV_F32)
    ci_launch(cu, kv_store_kernel, grid, 128, 0, cmd->a.kv.layout, cmd->a.kv.group, cmd->a.kv.k,
              cmd->a.kv.v, cmd->a.kv.pos, cu->error_flag);
  else if (ci_kv_dev_warp_encodes(cmd->a.kv.layout))
    ci_launch(
        cu, kv_store_warp_kernel, grid,
        codec == CI_KV_AFFINE ? 64 * (cmd->a.kv.layout.head_dim / cmd->a.kv.layout.group) : 64, 0,
        cmd->a.kv.layout, cmd->a.kv.group, cmd->a.kv.k, cmd->a.kv.v, cmd->a.kv.pos, cu->error_flag);
  else
    ci_launch(cu, kv_store_quant_kernel, grid, 64, 0, cmd->a.kv.layout, cmd->a.kv.group,
              cmd->a.kv.k, cmd->a.kv.v, cmd->a.kv.pos, cu->error_flag);
  ci_cuda_check_launch(cu, "kv_store");
}

/* ==== attention ==== */

/* PER_LANE = head_dim / 32 rounded up to a power of two: q and the output accumulator stay in
 * registers. */
template <int PER_LANE>
__global__ static void __launch_bounds__(WARPS * 32)
    attention_kernel(kv_layout L, const seq_group *g, attention_params a, int *error_flag) {
  ci_grid_begin();
  __shared__ float merge_m[WARPS], merge_l[WARPS];
  __shared__ float merge_acc[WARPS][MAX_D];
  const int s = seq_of(g, blockIdx.x);
  const int row = g->first_row[s] + (blockIdx.x - g->row_start[s]);
  const int h = blockIdx.y;
  const int D = L.head_dim;
  const int kv_head = h / (a.n_heads / L.n_kv_heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t p = a.pos[row];
  const int64_t lo = a.window > 0 && p - a.window + 1 > 0 ? p - a.window + 1 : 0;
  __shared__ float q_shared[MAX_D];
  const float *q = a.q + ((int64_t)row * a.n_heads + h) * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) q_shared[d] = q[d];
  __syncthreads();
  float acc[PER_LANE];
#pragma unroll
  for (int i = 0; i < PER_LANE; i++) acc[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  const int vector_rows = !L.f32 && D % 8 == 0;
  /* warp w takes chunks w, w + WARPS, ... of 32 keys: lane j scores key j of the chunk, then
   * every lane accumulates its output dims over the chunk's keys in order */
  for (int64_t first = lo + (int64_t)warp * 32; first <= p; first += (int64_t)WARPS * 32) {
    const int64_t key = first + lane;
    float score = -INFINITY;
    const uint8_t *vr = NULL;
    if (key <= p) {
      const int64_t entry = key / L.block_tokens;
      const int32_t block = entry < g->n_entries[s] ? g->table[s][entry] : -1;
      if (block < 0) {
        *error_flag = 1;
      } else {
        const uint8_t *kr = row_address(L, 0, block, key % L.block_tokens, kv_head);
        vr = row_address(L, 1, block, key % L.block_tokens, kv_head);
        float dot = 0.0f;
        if (vector_rows) {
          for (int d = 0; d < D; d += 8) {
            const uint4 packed = *(const uint4 *)(kr + 2 * d);
            const __nv_bfloat162 *pair = (const __nv_bfloat162 *)&packed;
#pragma unroll
            for (int t = 0; t < 4; t++) {
              const float2 f = __bfloat1622float2(pair[t]);
              dot += q_shared[d + 2 * t] * f.x;
              dot += q_shared[d + 2 * t + 1] * f.y;
            }
          }
        } else {
          for (int d = 0; d < D; d++) dot += q_shared[d] * load_kv(L, kr, d);
        }
        score = dot * a.scale;
        if (a.softcap != 0.0f) score = a.softcap * tanhf(score / a.softcap);
      }
    }
    float chunk_max = score;
    for (int off = 16; off > 0; off >>= 1)
      chunk_max = fmaxf(chunk_max, __shfl_xor_sync(0xffffffffu, chunk_max, off));
    if (chunk_max == -INFINITY) continue; /* no live key in this chunk */
    const float m_new = fmaxf(m, chunk_max);
    const float correction = expf(m - m_new);
    const float weight = vr ? expf(score - m_new) : 0.0f;
    float weight_sum = weight;
    for (int off = 16; off > 0; off >>= 1)
      weight_sum += __shfl_xor_sync(0xffffffffu, weight_sum, off);
    l = l * correction + weight_sum;
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) acc[i] *= correction;
    for (int j = 0; j < 32; j++) {
      const float wj = __shfl_sync(0xffffffffu, weight, j);
      const uint8_t *vj = (const uint8_t *)__shfl_sync(0xffffffffu, (unsigned long long)vr, j);
      if (!vj) continue;
#pragma unroll
      for (int i = 0; i < PER_LANE; i++) {
        const int d = lane + 32 * i;
        if (d < D) acc[i] += wj * load_kv(L, vj, d);
      }
    }
    m = m_new;
  }
  if (lane == 0) {
    merge_m[warp] = m;
    merge_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < PER_LANE; i++) {
    int d = lane + 32 * i;
    if (d < D) merge_acc[warp][d] = acc[i];
  }
  __syncthreads();
  float total_m = -INFINITY;
  for (int w = 0; w < WARPS; w++) total_m = fmaxf(total_m, merge_m[w]);
  float total_l = 0.0f;
  for (int w = 0; w < WARPS; w++)
    if (merge_l[w] > 0.0f) total_l += merge_l[w] * expf(merge_m[w] - total_m);
  float *out = a.out + ((int64_t)row * a.n_heads + h) * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < WARPS; w++)
      if (merge_l[w] > 0.0f) sum += merge_acc[w][d] * expf(merge_m[w] - total_m);
    out[d] = total_l > 0.0f ? sum / total_l : 0.0f;
  }
}

int ci_cuda_attention(ci_cuda *cu, const ci_attention_args *args) {
  attention_params a;
  memset(&a, 0, sizeof a);
  a.q = args->q;
  a.out = args->out;
  a.pos = args->pos;
  a.n_heads = args->n_heads;
  a.scale = args->scale;
  a.softcap = args->softcap;
  a.window = args->window;
  return for_each_group(
      cu, args->seqs, a.n_heads,
      [&](const kv_layout &L, const seq_group &host, const seq_group *g) {
        if (a.n_heads % L.n_kv_heads != 0)
          return ci_fail("attention: %d query heads do not group over %d KV heads", a.n_heads,
                         L.n_kv_heads);
        ci_cuda_cmd cmd;
        memset(&cmd, 0, sizeof cmd);
        cmd.kind = CMD_ATTENTION;
        cmd.a.kv.layout = L;
        cmd.a.kv.group = g;
        cmd.a.kv.total_rows = host.total_rows;
        cmd.a.kv.att = a;
        if (host.total_tiles > 0) {
          cmd.a.kv.flash = 1;
          cmd.a.kv.total_tiles = host.total_tiles;
          ci_cuda_flash_plan(
              &L, &host, a.n_heads,
              ci_cuda_flash_warps(a.n_heads, L.n_kv_heads, max_rows_per_seq(args->seqs)), cu,
              cu->input_planes == 2, &cmd.a.kv.plan);
        } else if (L.codec != CI_KV_BF16 && L.codec != CI_KV_F32) {
          ci_cuda_kv_attention_plan(&L, &host, a.n_heads, cu->n_sms, &cmd.a.kv.plan);
        }
        return ci_cuda_emit(cu, &cmd);
      });
}

int ci_cuda_attention_launch(ci_cuda *cu, const ci_cuda_cmd *cmd) {
  const kv_layout &L = cmd->a.kv.layout;
  if (L.codec != CI_KV_BF16 && L.codec != CI_KV_F32) return ci_cuda_kv_attention_launch(cu, cmd);
  const attention_params &a = cmd->a.kv.att;
  const seq_group *g = cmd->a.kv.group;
  dim3 grid((unsigned)cmd->a.kv.total_rows, (unsigned)a.n_heads);
  const int per_lane = (L.head_dim + 31) / 32;
  if (per_lane <= 1)
    ci_launch(cu, attention_kernel<1>, grid, WARPS * 32, 0, L, g, a, cu->error_flag);
  else if (per_lane <= 2)
    ci_launch(cu, attention_kernel<2>, grid, WARPS * 32, 0, L, g, a, cu->error_flag);
  else if (per_lane <= 4)
    ci_launch(cu, attention_kernel<4>, grid, WARPS * 32, 0, L, g, a, cu->error_flag);
  else if (per_lane <= 8)
    ci_launch(cu, attention_kernel<8>, grid, WARPS * 32, 0, L, g, a, cu->error_flag);
  else
    ci_launch(cu, attention_kernel<16>, grid, WARPS * 32, 0, L, g, a, cu->error_flag);
  return ci_cuda_check_launch(cu, "attention");
}

/* ==== conversion ==== */

__global__ static void convert_block_kernel(kv_layout from, int32_t from_block, kv_layout to,
                                            int32_t to_block, int live_tokens) {
  ci_grid_begin();
  const int D = from.head_dim;
  const int64_t n = (int64_t)from.n_kv_heads * live_tokens * D * 2;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int d = (int)(i % D);
    const int64_t t = (i / D) % live_tokens;
    const int h = (int)((i / D / live_tokens) % from.n_kv_heads);
    const int value = (int)(i / D / live_tokens / from.n_kv_heads);
    const float x = load_kv(from, row_address(from, value, from_block, t, h), d);
    uint8_t *dst = row_address(to, value, to_block, t, h);
    if (to.f32)
      ((float *)dst)[d] = x;
    else
      ((__nv_bfloat16 *)dst)[d] = __float2bfloat16_rn(x);
  }
}

/* Any codec on either side: one thread per stored row decodes it to f32 and encodes it again,
 * as the CPU does (cuda_kv_codec.cuh), so the block is byte-identical to the CPU's. */
__global__ static void convert_rows_kernel(kv_layout from, int32_t from_block, kv_layout to,
                                           int32_t to_block, int live_tokens) {
  ci_grid_begin();
  const int64_t n = (int64_t)from.n_kv_heads * live_tokens * 2;
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int t = (int)(i % live_tokens);
  const int h = (int)(i / live_tokens % from.n_kv_heads);
  const int value = (int)(i / live_tokens / from.n_kv_heads);
  float x[MAX_D];
  ci_kv_dev_decode_row(from, value, row_address(from, value, from_block, t, h), x);
  ci_kv_dev_encode_row(to, value, x, row_address(to, value, to_block, t, h));
}

int ci_cuda_kv_convert_block(ci_cuda *cu, const ci_paged_kv *src, int32_t src_block,
                             const ci_paged_kv *dst, int32_t dst_block, int live_tokens) {
  kv_layout from, to;
  if (layout_of(src, &from) || layout_of(dst, &to)) return CI_ERR;
  if (from.head_dim != to.head_dim || from.n_kv_heads != to.n_kv_heads)
    return ci_fail("kv conversion: mismatched geometry");
  if (live_tokens <= 0) return CI_OK;
  if (live_tokens > from.block_tokens || live_tokens > to.block_tokens)
    return ci_fail("kv conversion: %d live tokens in a block of %d", live_tokens,
                   from.block_tokens < to.block_tokens ? from.block_tokens : to.block_tokens);
  const int plain = (from.codec == CI_KV_BF16 || from.codec == CI_KV_F32) &&
                    (to.codec == CI_KV_BF16 || to.codec == CI_KV_F32);
  if (plain) {
    ci_launch(cu, convert_block_kernel, 64, 256, 0, from, src_block, to, dst_block, live_tokens);
  } else {
    const int64_t rows = (int64_t)from.n_kv_heads * live_tokens * 2;
    ci_launch(cu, convert_rows_kernel, (unsigned)((rows + 63) / 64), 64, 0, from, src_block, to,
              dst_block, live_tokens);
  }
  return ci_cuda_check_launch(cu, "kv_convert_block");
}

/* ==== the codec on the host (tests without a GPU) ==== */

static int host_layout(const ci_kv_format *f, const float *signs, int head_dim, kv_layout *L) {
  if (head_dim < 1 || head_dim > MAX_D)
    return ci_fail("the CUDA KV codec runs head_dim 1..%d (got %d)", MAX_D, head_dim);
  if (ci_kv_format_check(f, head_dim)) return CI_ERR;
  if ((f->codec == CI_KV_TURBO || f->codec == CI_KV_TURBO_V) && !signs)
    return ci_fail("a TurboQuant row needs its sign vector");
  memset(L, 0, sizeof *L);
  L->head_dim = head_dim;
  L->f32 = f->codec == CI_KV_F32;
  L->codec = (int)f->codec;
  L->k_bits = f->k_bits;
  L->v_bits = f->v_bits;
  L->group = f->group_size;
  L->signs = signs;
  return CI_OK;
}

extern "C" int ci_cuda_kv_encode_row_host(const ci_kv_format *f, int value, const float *signs,
                                          const float *x, int head_dim, void *row) {
  kv_layout L;
  memset(&L, 0, sizeof L);
  if (host_layout(f, signs, head_dim, &L)) return CI_ERR;
  ci_kv_dev_encode_row(L, value, x, (uint8_t *)row);
  return CI_OK;
}

extern "C" int ci_cuda_kv_decode_row_host(const ci_kv_format *f, int value, const float *signs,
                                          const void *row, int head_dim, float *x) {
  kv_layout L;
  memset(&L, 0, sizeof L);
  if (host_layout(f, signs, head_dim, &L)) return CI_ERR;
  ci_kv_dev_decode_row(L, value, (const uint8_t *)row, x);
  return CI_OK;
}
