/* KV block pool: fixed-size, reference-counted blocks of T token slots for every layer of one
 * layer group in one codec. A block id names the same slot range in each layer of the group. */
#ifndef CI_KV_POOL_H
#define CI_KV_POOL_H

#include "tensor/backend.h"

#include <stddef.h>
#include <stdint.h>

typedef struct {
  ci_backend *be;
  ci_kv_format format;
  int block_tokens; /* T */
  int n_layers;
  int n_kv_heads;
  int head_dim;
  size_t k_block_bytes; /* one block of K of one layer: [Hkv][T][K row] */
  size_t v_block_bytes; /* one block of V of one layer */
  int32_t capacity;     /* blocks allocated in storage */
  int32_t max_blocks;   /* 0 = grow without limit */
  int32_t n_used;
  uint8_t **k_data; /* [n_layers] -> [capacity * k_block_bytes] */
  uint8_t **v_data;
  int32_t *refcount; /* [capacity] */
  int32_t *free_ids; /* stack of free block ids */
  int32_t n_free;
} ci_kv_pool;

/* Bytes one token of one KV head takes in a plain codec (bf16, f32; K and V together). */
size_t ci_kv_codec_bytes_per_token(ci_kv_codec codec, int head_dim);

/* "bf16", ... for the plain codecs. */
const char *ci_kv_codec_name(ci_kv_codec codec);

/* Sets up an empty pool (no storage yet) storing rows in `format`. Returns CI_OK or CI_ERR. */
int ci_kv_pool_init(ci_kv_pool *pool, ci_backend *be, ci_kv_format format, int block_tokens,
                    int n_layers, int n_kv_heads, int head_dim, int32_t max_blocks);

/* Bytes in use (K and V of every layer of the used blocks). */
int64_t ci_kv_pool_bytes_used(const ci_kv_pool *pool);

/* Frees the storage. Every block should have been released first. */
void ci_kv_pool_destroy(ci_kv_pool *pool);

/* Takes a free block (growing storage when needed) with refcount 1. Returns its id, or -1 with
 * ci_last_error when the pool is at max_blocks or memory runs out. */
int32_t ci_kv_pool_alloc(ci_kv_pool *pool);

/* Bytes one block takes over every layer of the pool (K and V). */
int64_t ci_kv_pool_block_bytes(const ci_kv_pool *pool);

/* Owners of a block (0 = free). */
int32_t ci_kv_pool_refcount(const ci_kv_pool *pool, int32_t id);

/* A new block (refcount 1) holding a copy of block `id` in every layer: the copy half of
 * copy-on-write. Returns its id, or -1 with ci_last_error when the pool is full. */
int32_t ci_kv_pool_copy_block(ci_kv_pool *pool, int32_t id);

/* Adds an owner to a block (prefix cache, forked sequence). */
void ci_kv_pool_retain(ci_kv_pool *pool, int32_t id);

/* Drops an owner; the block returns to the free list when none is left. */
void ci_kv_pool_release(ci_kv_pool *pool, int32_t id);

#endif
