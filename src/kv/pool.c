/* KV block pool: blocks in slabs of the arena, the lowest free id handed out first so that
 * slabs stay packed and empty ones can go back to the arena. */
#include "kv/pool.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>

size_t ci_kv_codec_bytes_per_token(ci_kv_codec codec, int head_dim) {
  ci_kv_format f = ci_kv_format_plain(codec);
  return ci_kv_bytes_per_token(&f, head_dim);
}

const char *ci_kv_codec_name(ci_kv_codec codec) {
  static const char *const names[CI_KV_CODEC_COUNT] = {"bf16", "f32", "affine", "turbo", "turbo-v"};
  return codec < CI_KV_CODEC_COUNT ? names[codec] : "?";
}

int64_t ci_kv_pool_bytes_used(const ci_kv_pool *pool) {
  return (int64_t)pool->n_used * (int64_t)(pool->k_block_bytes + pool->v_block_bytes) *
         pool->n_layers;
}

/* Grows the slab slot table to n slots (no slab taken). */
static int grow_slots(ci_kv_pool *pool, int32_t n) {
  if (n <= pool->n_slots) return CI_OK;
  if ((int64_t)n * pool->blocks_per_slab > INT32_MAX) return ci_fail("kv pool: too many blocks");
  uint8_t **slabs = realloc(pool->slabs, (size_t)n * sizeof *slabs);
  if (slabs) pool->slabs = slabs;
  int32_t *used = realloc(pool->slab_used, (size_t)n * sizeof *used);
  if (used) pool->slab_used = used;
  int32_t *refcount =
      realloc(pool->refcount, (size_t)n * (size_t)pool->blocks_per_slab * sizeof *refcount);
  if (refcount) pool->refcount = refcount;
  if (!slabs || !used || !refcount) return ci_fail("kv pool: out of memory");
  for (int32_t s = pool->n_slots; s < n; s++) {
    slabs[s] = NULL;
    used[s] = 0;
  }
  if (pool->be->host_visible) pool->slabs_device = slabs;
  memset(refcount + (size_t)pool->n_slots * pool->blocks_per_slab, 0,
         (size_t)(n - pool->n_slots) * (size_t)pool->blocks_per_slab * sizeof *refcount);
  pool->n_slots = n;
  return CI_OK;
}

size_t ci_kv_block_stride(const ci_kv_format *format, int block_tokens, int n_layers,
                          int n_kv_heads, int head_dim) {
  const size_t rows = (size_t)n_kv_heads * (size_t)block_tokens;
  return (ci_kv_row_bytes(format, head_dim, 0) + ci_kv_row_bytes(format, head_dim, 1)) * rows *
         (size_t)n_layers;
}

int ci_kv_pool_init(ci_kv_pool *pool, ci_backend *be, ci_kv_arena *arena, ci_kv_format format,
                    int block_tokens, int n_layers, int n_kv_heads, int head_dim) {
  memset(pool, 0, sizeof *pool);
  if (block_tokens < 1 || n_layers < 1 || n_kv_heads < 1 || head_dim < 1)
    return ci_fail("kv pool: invalid geometry");
  pool->be = be;
  pool->arena = arena;
  pool->format = format;
  pool->block_tokens = block_tokens;
  pool->n_layers = n_layers;
  pool->n_kv_heads = n_kv_heads;
  pool->head_dim = head_dim;
  pool->k_block_bytes =
      ci_kv_row_bytes(&format, head_dim, 0) * (size_t)n_kv_heads * (size_t)block_tokens;
  pool->v_block_bytes =
      ci_kv_row_bytes(&format, head_dim, 1) * (size_t)n_kv_heads * (size_t)block_tokens;
  pool->block_stride = (pool->k_block_bytes + pool->v_block_bytes) * (size_t)n_layers;
  if (pool->block_stride > arena->slab_bytes)
    return ci_fail("kv pool: a block of %zu bytes does not fit a slab of %zu", pool->block_stride,
                   arena->slab_bytes);
  pool->blocks_per_slab = (int32_t)(arena->slab_bytes / pool->block_stride);
  if (ci_kv_pool_fit_arena(pool)) {
    ci_kv_pool_destroy(pool);
    return CI_ERR;
  }
  return CI_OK;
}

int ci_kv_pool_fit_arena(ci_kv_pool *pool) {
  /* with a budget every slab of the arena may end up here: the slot table never grows */
  if (pool->arena->n_slabs > 0 && grow_slots(pool, pool->arena->n_slabs)) return CI_ERR;
  if (pool->be->host_visible || pool->n_slots == 0) return CI_OK;
  /* a device reads the slot table from its own memory: one copy, kept current slab by slab */
  if (pool->slabs_device) pool->be->ops->release(pool->be, pool->slabs_device);
  pool->slabs_device = pool->be->ops->alloc(pool->be, (size_t)pool->n_slots * sizeof(uint8_t *));
  if (!pool->slabs_device) return CI_ERR;
  pool->be->ops->upload(pool->be, pool->slabs_device, pool->slabs,
                        (size_t)pool->n_slots * sizeof(uint8_t *));
  return CI_OK;
}

/* Publishes slot `slot` of the slab table to the backend's copy (at once: a slab taken for this
 * step's blocks must be there before the step's kernels run). */
static void publish_slot(ci_kv_pool *pool, int32_t slot) {
  if (pool->slabs_device != pool->slabs)
    pool->be->ops->upload(pool->be, pool->slabs_device + slot, pool->slabs + slot,
                          sizeof(uint8_t *));
}

void ci_kv_pool_destroy(ci_kv_pool *pool) {
  for (int32_t s = 0; s < pool->n_slots; s++)
    if (pool->slabs[s]) {
      if (pool->arena->base)
        ci_kv_arena_give(pool->arena, pool->slabs[s]);
      else
        pool->be->ops->release(pool->be, pool->slabs[s]);
    }
  if (pool->slabs_device && pool->slabs_device != pool->slabs)
    pool->be->ops->release(pool->be, pool->slabs_device);
  free(pool->slabs);
  free(pool->slab_used);
  free(pool->refcount);
  memset(pool, 0, sizeof *pool);
}

/* Takes a slab from the arena into the lowest empty slot. Returns the slot, or -1. */
static int32_t take_slab(ci_kv_pool *pool) {
  if (!pool->be->host_visible && !pool->arena->base)
    return ci_fail("kv pool: a backend with memory of its own needs a KV budget (an arena)"), -1;
  int32_t slot = 0;
  while (slot < pool->n_slots && pool->slabs[slot]) slot++;
  if (slot == pool->n_slots && grow_slots(pool, pool->n_slots ? pool->n_slots * 2 : 4)) return -1;
  uint8_t *slab = ci_kv_arena_take(pool->arena);
  if (!slab) return -1;
  pool->slabs[slot] = slab;
  pool->slab_used[slot] = 0;
  pool->n_held++;
  publish_slot(pool, slot);
  return slot;
}

int32_t ci_kv_pool_alloc(ci_kv_pool *pool) {
  const int32_t per = pool->blocks_per_slab;
  int32_t slot = 0;
  while (slot < pool->n_slots && !(pool->slabs[slot] && pool->slab_used[slot] < per)) slot++;
  if (slot == pool->n_slots && (slot = take_slab(pool)) < 0) return -1;
  int32_t id = slot * per;
  while (pool->refcount[id] != 0) id++;
  pool->refcount[id] = 1;
  pool->slab_used[slot]++;
  pool->n_used++;
  return id;
}

int64_t ci_kv_pool_block_bytes(const ci_kv_pool *pool) {
  return (int64_t)(pool->k_block_bytes + pool->v_block_bytes) * pool->n_layers;
}

int32_t ci_kv_pool_refcount(const ci_kv_pool *pool, int32_t id) {
  return pool->refcount[id];
}

int32_t ci_kv_pool_copy_block(ci_kv_pool *pool, int32_t id) {
  const int32_t copy = ci_kv_pool_alloc(pool);
  if (copy < 0) return -1;
  pool->be->ops->copy_bytes(pool->be, ci_kv_pool_block_at(pool, copy, 0, 0),
                            ci_kv_pool_block_at(pool, id, 0, 0), pool->block_stride);
  return copy;
}

void ci_kv_pool_retain(ci_kv_pool *pool, int32_t id) {
  pool->refcount[id]++;
}

void ci_kv_pool_release(ci_kv_pool *pool, int32_t id) {
  if (--pool->refcount[id] != 0) return;
  pool->n_used--;
  const int32_t slot = id / pool->blocks_per_slab;
  if (--pool->slab_used[slot] == 0 && pool->arena->base) {
    ci_kv_arena_give(pool->arena, pool->slabs[slot]);
    pool->slabs[slot] = NULL;
    pool->n_held--;
    /* The backend's copy keeps the old address until the slot is taken again. A release can
     * come while a step's work is still queued behind it (a sliding window's blocks are
     * released when the step commits its rows, before a device runs the recorded step), and
     * that work still reads these blocks; an upload runs at once, so a NULL published here
     * reached the device first (an illegal address in kv_store and attention on the GPU). No
     * block table names the slot's blocks after this step. */
  }
}
