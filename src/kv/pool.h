/* KV block pool: fixed-size, reference-counted blocks of T token slots for every layer of one
 * layer group in one codec, in slabs taken from the cache's arena. A block id names the same
 * slot range in each layer of the group; a block's address never changes while it is held. */
#ifndef CI_KV_POOL_H
#define CI_KV_POOL_H

#include "base/rank_collective.h"
#include "kv/arena.h"
#include "tensor/backend.h"

#include <stddef.h>
#include <stdint.h>

/* Another rank's copy of a pool's storage (model/tensor_parallel.h: each rank of a split model
 * keeps its KV heads of every block in memory of its own backend): the same slots, block ids and
 * geometry, slabs from that rank's arena. */
typedef struct {
  ci_backend *be;
  ci_kv_arena *arena;     /* not owned */
  uint8_t **slabs;        /* [n_slots] as the pool's */
  uint8_t **slabs_device; /* [n_slots] as the pool's */
} ci_kv_pool_mirror;

typedef struct {
  ci_backend *be;
  ci_kv_arena *arena; /* not owned: where the slabs come from */
  ci_kv_format format;
  int block_tokens; /* T */
  int n_layers;
  int n_kv_heads;
  int head_dim;
  size_t k_block_bytes;    /* one block of K of one layer: [Hkv][T][K row] */
  size_t v_block_bytes;    /* one block of V of one layer */
  size_t block_stride;     /* one block over every layer: [layer][K block, V block] */
  int32_t blocks_per_slab; /* block id b lives in slab b / blocks_per_slab */
  int32_t n_slots;         /* slab slots (capacity = n_slots * blocks_per_slab ids) */
  uint8_t **slabs;         /* [n_slots] NULL where the pool holds no slab */
  uint8_t **slabs_device;  /* [n_slots] its copy in backend memory (attention reads it); the same
                              array where the backend shares host memory. Updated when a slab is
                              taken; a released slot keeps its old address there (work already
                              queued on the device may still read it) */
  int32_t *slab_used;      /* [n_slots] blocks in use per slab */
  int32_t *refcount;       /* [n_slots * blocks_per_slab]; 0 = free */
  int32_t n_used;
  int32_t n_held; /* slabs held */
  int n_mirrors;  /* ranks beyond the first (0 unless the model is split) */
  ci_kv_pool_mirror mirrors[CI_MAX_RANKS - 1];
} ci_kv_pool;

/* Bytes one token of one KV head takes in a plain codec (bf16, f32; K and V together). */
size_t ci_kv_codec_bytes_per_token(ci_kv_codec codec, int head_dim);

/* "bf16", ... for the plain codecs. */
const char *ci_kv_codec_name(ci_kv_codec codec);

/* Bytes of one block over every layer of a pool of this geometry (K and V). */
size_t ci_kv_block_stride(const ci_kv_format *format, int block_tokens, int n_layers,
                          int n_kv_heads, int head_dim);

/* Sets up an empty pool (no storage yet) storing rows in `format`, its blocks in slabs of
 * `arena` (whose slabs must hold at least one block). Returns CI_OK or CI_ERR. */
int ci_kv_pool_init(ci_kv_pool *pool, ci_backend *be, ci_kv_arena *arena, ci_kv_format format,
                    int block_tokens, int n_layers, int n_kv_heads, int head_dim);

/* Adds rank storage on `be` with slabs from `arena` (same slab size as the pool's), before the pool
 * holds any slab: every slab taken from then on is taken in each copy, blocks are copied and
 * freed in each. Returns CI_OK or CI_ERR. */
int ci_kv_pool_add_mirror(ci_kv_pool *pool, ci_backend *be, ci_kv_arena *arena);

/* The slab table of rank `rank`'s copy as its backend reads it (rank 0: the pool's own). */
static inline uint8_t *const *ci_kv_pool_slabs_of(const ci_kv_pool *pool, int rank) {
  return rank == 0 ? pool->slabs_device : pool->mirrors[rank - 1].slabs_device;
}

/* Sizes the slot table for every slab of the pool's arena (called when the arena gets its
 * budget), so that taking a slab never allocates. Returns CI_OK or CI_ERR. */
int ci_kv_pool_fit_arena(ci_kv_pool *pool);

/* Address of K (value 0) or V (value 1) of block `id` in layer `layer` of the pool. */
static inline uint8_t *ci_kv_pool_block_at(const ci_kv_pool *pool, int32_t id, int layer,
                                           int value) {
  return pool->slabs[id / pool->blocks_per_slab] +
         (size_t)(id % pool->blocks_per_slab) * pool->block_stride +
         (size_t)layer * (pool->k_block_bytes + pool->v_block_bytes) +
         (value ? pool->k_block_bytes : 0);
}

/* Bytes in use (K and V of every layer of the used blocks). */
int64_t ci_kv_pool_bytes_used(const ci_kv_pool *pool);

/* Frees the storage. Every block should have been released first. */
void ci_kv_pool_destroy(ci_kv_pool *pool);

/* Takes the lowest free block (taking a slab from the arena when needed) with refcount 1.
 * Returns its id, or -1 with ci_last_error when the arena is used up. */
int32_t ci_kv_pool_alloc(ci_kv_pool *pool);

/* Bytes one block takes over every layer of the pool (K and V). */
int64_t ci_kv_pool_block_bytes(const ci_kv_pool *pool);

/* Owners of a block (0 = free). */
int32_t ci_kv_pool_refcount(const ci_kv_pool *pool, int32_t id);

/* A new block (refcount 1) holding a copy of block `id` in every layer (a backend copy, in each
 * rank's storage): the copy half of copy-on-write. Returns its id, or -1 with ci_last_error when
 * the pool is full. */
int32_t ci_kv_pool_copy_block(ci_kv_pool *pool, int32_t id);

/* Adds an owner to a block (prefix cache, forked sequence). */
void ci_kv_pool_retain(ci_kv_pool *pool, int32_t id);

/* Drops an owner; the block is free when none is left, and a slab of an arena with a budget
 * goes back to the arena when its last block is freed. */
void ci_kv_pool_release(ci_kv_pool *pool, int32_t id);

#endif
