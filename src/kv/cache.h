/* Paged KV cache: layers grouped by geometry and retention, one block pool per group, and the
 * per-sequence block tables that map positions to blocks (DESIGN.md §4, kv.md §1-4). */
#ifndef CI_KV_CACHE_H
#define CI_KV_CACHE_H

#include "kv/pool.h"

#include <stdint.h>

/* What the cache needs to know about one cache-owning layer. */
typedef struct {
  int window; /* 0 = full attention; W > 0 = sliding, keeps the last W positions */
  int n_kv_heads;
  int head_dim;
} ci_kv_layer_desc;

/* Layers with identical window, Hkv and D share block ids and a pool. */
typedef struct {
  int window;
  int n_kv_heads;
  int head_dim;
  int n_layers;
  ci_kv_pool pool;
} ci_kv_group;

typedef struct {
  ci_backend *be;
  int block_tokens;
  int n_layers;
  int n_groups;
  ci_kv_group *groups; /* [n_groups] */
  int *group_of_layer; /* [n_layers] */
  int *slot_of_layer;  /* [n_layers] index of the layer inside its group */
} ci_kv_cache;

/* One sequence's view of the cache: its length and one block table per group. Entry i of a
 * table holds the block of positions [i*T, (i+1)*T), or -1 once a sliding group released it. */
typedef struct {
  int32_t *entries;
  int64_t n_entries;
  int64_t capacity;
  int64_t first_live; /* entries below this index were released (sliding groups) */
} ci_kv_block_table;

typedef struct {
  ci_kv_cache *cache;
  int64_t n;                 /* positions stored */
  ci_kv_block_table *tables; /* [cache->n_groups] */
} ci_kv_seq;

/* Builds a cache for n_layers cache-owning layers in codec `codec` with T = block_tokens.
 * max_blocks_per_group 0 = unbounded. Returns NULL with ci_last_error on failure. */
ci_kv_cache *ci_kv_cache_create(ci_backend *be, int n_layers, const ci_kv_layer_desc *layers,
                                ci_kv_codec codec, int block_tokens, int32_t max_blocks_per_group);

/* Frees the cache; every sequence must have been freed first. */
void ci_kv_cache_free(ci_kv_cache *cache);

/* Blocks in use, summed over groups. */
int64_t ci_kv_cache_blocks_used(const ci_kv_cache *cache);

/* Bytes of KV storage in use (blocks in use x bytes per block, K and V, every layer). */
int64_t ci_kv_cache_bytes_used(const ci_kv_cache *cache);

/* A new empty sequence. NULL with ci_last_error on failure. */
ci_kv_seq *ci_kv_seq_create(ci_kv_cache *cache);

/* Releases the sequence's blocks and frees it. NULL is a no-op. */
void ci_kv_seq_free(ci_kv_seq *seq);

/* Makes sure blocks exist for positions [n, n + n_new) in every group (step contract item 2).
 * Returns CI_OK, or CI_ERR when the pool is exhausted (the sequence is left unchanged in
 * length; blocks already taken stay with it). */
int ci_kv_seq_reserve(ci_kv_seq *seq, int64_t n_new);

/* Ends a step: n += n_new, then sliding groups release blocks no future query can see. */
void ci_kv_seq_commit(ci_kv_seq *seq, int64_t n_new);

/* The paged view of cache layer `layer` for this sequence, for kv_store and attention. */
ci_paged_kv ci_kv_seq_view(const ci_kv_seq *seq, int layer);

#endif
