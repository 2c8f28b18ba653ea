/* Paged KV cache: grouping of layers, sequence block tables, reservation and sliding-window
 * release (see cache.h). */
#include "kv/cache.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>

ci_kv_cache *ci_kv_cache_create(ci_backend *be, int n_layers, const ci_kv_layer_desc *layers,
                                ci_kv_codec codec, int block_tokens, int32_t max_blocks_per_group) {
  ci_kv_cache *cache = calloc(1, sizeof *cache);
  if (!cache) goto oom;
  cache->be = be;
  cache->block_tokens = block_tokens;
  cache->n_layers = n_layers;
  cache->groups = calloc((size_t)n_layers, sizeof *cache->groups);
  cache->group_of_layer = calloc((size_t)n_layers, sizeof(int));
  cache->slot_of_layer = calloc((size_t)n_layers, sizeof(int));
  if (!cache->groups || !cache->group_of_layer || !cache->slot_of_layer) goto oom;
  for (int l = 0; l < n_layers; l++) {
    const ci_kv_layer_desc *d = &layers[l];
    int g = 0;
    while (g < cache->n_groups &&
           !(cache->groups[g].window == d->window && cache->groups[g].n_kv_heads == d->n_kv_heads &&
             cache->groups[g].head_dim == d->head_dim))
      g++;
    if (g == cache->n_groups) {
      cache->groups[g] =
          (ci_kv_group){.window = d->window, .n_kv_heads = d->n_kv_heads, .head_dim = d->head_dim};
      cache->n_groups++;
    }
    cache->group_of_layer[l] = g;
    cache->slot_of_layer[l] = cache->groups[g].n_layers++;
  }
  for (int g = 0; g < cache->n_groups; g++) {
    ci_kv_group *group = &cache->groups[g];
    if (ci_kv_pool_init(&group->pool, be, codec, block_tokens, group->n_layers, group->n_kv_heads,
                        group->head_dim, max_blocks_per_group)) {
      ci_kv_cache_free(cache);
      return NULL;
    }
  }
  return cache;
oom:
  ci_kv_cache_free(cache);
  ci_fail("kv cache: out of memory");
  return NULL;
}

void ci_kv_cache_free(ci_kv_cache *cache) {
  if (!cache) return;
  if (cache->groups)
    for (int g = 0; g < cache->n_groups; g++) ci_kv_pool_destroy(&cache->groups[g].pool);
  free(cache->groups);
  free(cache->group_of_layer);
  free(cache->slot_of_layer);
  free(cache);
}

int64_t ci_kv_cache_blocks_used(const ci_kv_cache *cache) {
  int64_t used = 0;
  for (int g = 0; g < cache->n_groups; g++) used += cache->groups[g].pool.n_used;
  return used;
}

int64_t ci_kv_cache_bytes_used(const ci_kv_cache *cache) {
  int64_t bytes = 0;
  for (int g = 0; g < cache->n_groups; g++) {
    const ci_kv_pool *pool = &cache->groups[g].pool;
    bytes += (int64_t)pool->n_used * (int64_t)pool->block_bytes * 2 * pool->n_layers;
  }
  return bytes;
}

ci_kv_seq *ci_kv_seq_create(ci_kv_cache *cache) {
  ci_kv_seq *seq = calloc(1, sizeof *seq);
  if (seq) seq->tables = calloc((size_t)cache->n_groups, sizeof *seq->tables);
  if (!seq || !seq->tables) {
    free(seq);
    ci_fail("kv sequence: out of memory");
    return NULL;
  }
  seq->cache = cache;
  return seq;
}

void ci_kv_seq_free(ci_kv_seq *seq) {
  if (!seq) return;
  for (int g = 0; g < seq->cache->n_groups; g++) {
    ci_kv_block_table *table = &seq->tables[g];
    for (int64_t i = 0; i < table->n_entries; i++)
      if (table->entries[i] >= 0)
        ci_kv_pool_release(&seq->cache->groups[g].pool, table->entries[i]);
    free(table->entries);
  }
  free(seq->tables);
  free(seq);
}

int ci_kv_seq_reserve(ci_kv_seq *seq, int64_t n_new) {
  const int64_t T = seq->cache->block_tokens;
  int64_t needed = (seq->n + n_new + T - 1) / T;
  for (int g = 0; g < seq->cache->n_groups; g++) {
    ci_kv_block_table *table = &seq->tables[g];
    if (needed > table->capacity) {
      int64_t capacity = table->capacity ? table->capacity : 16;
      while (capacity < needed) capacity *= 2;
      int32_t *entries = realloc(table->entries, (size_t)capacity * sizeof *entries);
      if (!entries) return ci_fail("kv sequence: out of memory");
      table->entries = entries;
      table->capacity = capacity;
    }
    while (table->n_entries < needed) {
      int32_t id = ci_kv_pool_alloc(&seq->cache->groups[g].pool);
      if (id < 0) return CI_ERR;
      table->entries[table->n_entries++] = id;
    }
  }
  return CI_OK;
}

void ci_kv_seq_commit(ci_kv_seq *seq, int64_t n_new) {
  seq->n += n_new;
  const int64_t T = seq->cache->block_tokens;
  for (int g = 0; g < seq->cache->n_groups; g++) {
    const ci_kv_group *group = &seq->cache->groups[g];
    if (group->window == 0) continue;
    /* The next query (position n) sees positions >= n - W + 1: older blocks can go. */
    int64_t oldest_needed = seq->n - group->window + 1;
    ci_kv_block_table *table = &seq->tables[g];
    int64_t i = table->first_live;
    for (; i < table->n_entries && (i + 1) * T <= oldest_needed; i++) {
      if (table->entries[i] >= 0) {
        ci_kv_pool_release(&seq->cache->groups[g].pool, table->entries[i]);
        table->entries[i] = -1;
      }
    }
    table->first_live = i;
  }
}

ci_paged_kv ci_kv_seq_view(const ci_kv_seq *seq, int layer) {
  const ci_kv_cache *cache = seq->cache;
  int g = cache->group_of_layer[layer];
  int slot = cache->slot_of_layer[layer];
  const ci_kv_group *group = &cache->groups[g];
  return (ci_paged_kv){.codec = group->pool.codec,
                       .block_tokens = cache->block_tokens,
                       .n_kv_heads = group->n_kv_heads,
                       .head_dim = group->head_dim,
                       .block_table = seq->tables[g].entries,
                       .n_table_entries = seq->tables[g].n_entries,
                       .k_base = group->pool.k_data[slot],
                       .v_base = group->pool.v_data[slot],
                       .block_bytes = group->pool.block_bytes};
}
