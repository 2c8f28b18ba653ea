/* KV block pool: storage grows by doubling; ids are recycled through a free stack. */
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

int ci_kv_pool_init(ci_kv_pool *pool, ci_backend *be, ci_kv_format format, int block_tokens,
                    int n_layers, int n_kv_heads, int head_dim, int32_t max_blocks) {
  memset(pool, 0, sizeof *pool);
  if (block_tokens < 1 || n_layers < 1 || n_kv_heads < 1 || head_dim < 1)
    return ci_fail("kv pool: invalid geometry");
  pool->be = be;
  pool->format = format;
  pool->block_tokens = block_tokens;
  pool->n_layers = n_layers;
  pool->n_kv_heads = n_kv_heads;
  pool->head_dim = head_dim;
  pool->max_blocks = max_blocks;
  pool->k_block_bytes =
      ci_kv_row_bytes(&format, head_dim, 0) * (size_t)n_kv_heads * (size_t)block_tokens;
  pool->v_block_bytes =
      ci_kv_row_bytes(&format, head_dim, 1) * (size_t)n_kv_heads * (size_t)block_tokens;
  pool->k_data = calloc((size_t)n_layers, sizeof *pool->k_data);
  pool->v_data = calloc((size_t)n_layers, sizeof *pool->v_data);
  if (!pool->k_data || !pool->v_data) {
    free(pool->k_data);
    free(pool->v_data);
    return ci_fail("kv pool: out of memory");
  }
  return CI_OK;
}

void ci_kv_pool_destroy(ci_kv_pool *pool) {
  if (!pool->k_data) return;
  for (int l = 0; l < pool->n_layers; l++) {
    if (pool->k_data[l]) pool->be->ops->release(pool->be, pool->k_data[l]);
    if (pool->v_data[l]) pool->be->ops->release(pool->be, pool->v_data[l]);
  }
  free(pool->k_data);
  free(pool->v_data);
  free(pool->refcount);
  free(pool->free_ids);
  memset(pool, 0, sizeof *pool);
}

/* Moves one layer's storage into a larger backend buffer. */
static int grow_layer(ci_kv_pool *pool, uint8_t **data, size_t block_bytes, int32_t new_capacity) {
  uint8_t *bigger = pool->be->ops->alloc(pool->be, (size_t)new_capacity * block_bytes);
  if (!bigger) return CI_ERR;
  if (*data) {
    memcpy(bigger, *data, (size_t)pool->capacity * block_bytes);
    pool->be->ops->release(pool->be, *data);
  }
  *data = bigger;
  return CI_OK;
}

static int grow(ci_kv_pool *pool) {
  int32_t new_capacity = pool->capacity ? pool->capacity * 2 : 16;
  if (pool->max_blocks && new_capacity > pool->max_blocks) new_capacity = pool->max_blocks;
  if (new_capacity <= pool->capacity)
    return ci_fail("kv pool: all %d blocks are in use", pool->capacity);
  int32_t *refcount = realloc(pool->refcount, (size_t)new_capacity * sizeof *refcount);
  if (refcount) pool->refcount = refcount;
  int32_t *free_ids = realloc(pool->free_ids, (size_t)new_capacity * sizeof *free_ids);
  if (free_ids) pool->free_ids = free_ids;
  if (!refcount || !free_ids) return ci_fail("kv pool: out of memory");
  for (int l = 0; l < pool->n_layers; l++)
    if (grow_layer(pool, &pool->k_data[l], pool->k_block_bytes, new_capacity) ||
        grow_layer(pool, &pool->v_data[l], pool->v_block_bytes, new_capacity))
      return ci_fail_context("kv pool: growing to %d blocks", new_capacity);
  /* Push new ids so that the lowest id is handed out first. */
  for (int32_t id = new_capacity - 1; id >= pool->capacity; id--) {
    pool->refcount[id] = 0;
    pool->free_ids[pool->n_free++] = id;
  }
  pool->capacity = new_capacity;
  return CI_OK;
}

int32_t ci_kv_pool_alloc(ci_kv_pool *pool) {
  if (pool->n_free == 0 && grow(pool) != CI_OK) return -1;
  int32_t id = pool->free_ids[--pool->n_free];
  pool->refcount[id] = 1;
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
  const int32_t copy = ci_kv_pool_alloc(pool); /* may move the storage: address blocks after */
  if (copy < 0) return -1;
  for (int l = 0; l < pool->n_layers; l++) {
    memcpy(pool->k_data[l] + (size_t)copy * pool->k_block_bytes,
           pool->k_data[l] + (size_t)id * pool->k_block_bytes, pool->k_block_bytes);
    memcpy(pool->v_data[l] + (size_t)copy * pool->v_block_bytes,
           pool->v_data[l] + (size_t)id * pool->v_block_bytes, pool->v_block_bytes);
  }
  return copy;
}

void ci_kv_pool_retain(ci_kv_pool *pool, int32_t id) {
  pool->refcount[id]++;
}

void ci_kv_pool_release(ci_kv_pool *pool, int32_t id) {
  if (--pool->refcount[id] == 0) {
    pool->free_ids[pool->n_free++] = id;
    pool->n_used--;
  }
}
