/* Paged KV cache: grouping of layers, pools per format, sequence block tables, reservation,
 * sliding-window release and delayed conversion (see cache.h). */
#include "kv/cache.h"

#include "base/error.h"
#include "tensor/turbo_quant.h"

/* Blocks of the largest group (in f32) per slab of the arena. */
enum { SLAB_BLOCKS = 4 };

#include <stdlib.h>
#include <string.h>

/* The pool of `format` in group g, created on first use. NULL with ci_last_error on failure. */
static ci_kv_pool *group_pool(ci_kv_cache *cache, ci_kv_group *group, const ci_kv_format *format) {
  for (int i = 0; i < group->n_pools; i++)
    if (ci_kv_format_equal(&group->pools[i]->format, format)) return group->pools[i];
  ci_kv_pool **pools = realloc(group->pools, (size_t)(group->n_pools + 1) * sizeof *pools);
  if (!pools) {
    ci_fail("kv cache: out of memory");
    return NULL;
  }
  group->pools = pools;
  ci_kv_pool *pool = calloc(1, sizeof *pool);
  if (!pool) {
    ci_fail("kv cache: out of memory");
    return NULL;
  }
  if (ci_kv_pool_init(pool, cache->be, &cache->arena, *format, cache->block_tokens, group->n_layers,
                      group->n_kv_heads, group->head_dim)) {
    free(pool);
    return NULL;
  }
  for (int r = 1; r < cache->n_ranks; r++)
    if (ci_kv_pool_add_mirror(pool, cache->rank_be[r], &cache->rank_arenas[r])) {
      ci_kv_pool_destroy(pool);
      free(pool);
      return NULL;
    }
  group->pools[group->n_pools++] = pool;
  return pool;
}

ci_kv_pool *ci_kv_cache_pool(ci_kv_cache *cache, int g, const ci_kv_format *format) {
  return group_pool(cache, &cache->groups[g], format);
}

ci_kv_cache *ci_kv_cache_create(ci_backend *be, int n_layers, const ci_kv_layer_desc *layers,
                                ci_kv_codec base, int block_tokens, int64_t arena_bytes) {
  if (block_tokens < 1 || block_tokens > 64) {
    ci_fail("kv cache: block size %d is outside 1..64", block_tokens);
    return NULL;
  }
  if (base != CI_KV_BF16 && base != CI_KV_F32) {
    ci_fail("kv cache: the base format must be bf16 or f32");
    return NULL;
  }
  ci_kv_cache *cache = calloc(1, sizeof *cache);
  if (!cache) goto oom;
  cache->be = be;
  cache->n_ranks = 1;
  cache->block_tokens = block_tokens;
  cache->n_layers = n_layers;
  cache->groups = calloc((size_t)(n_layers ? n_layers : 1), sizeof *cache->groups);
  cache->group_of_layer = calloc((size_t)(n_layers ? n_layers : 1), sizeof(int));
  cache->slot_of_layer = calloc((size_t)(n_layers ? n_layers : 1), sizeof(int));
  if (!cache->groups || !cache->group_of_layer || !cache->slot_of_layer) goto oom;
  for (int l = 0; l < n_layers; l++) {
    const ci_kv_layer_desc *d = &layers[l];
    int g = 0;
    while (g < cache->n_groups &&
           !(cache->groups[g].window == d->window && cache->groups[g].n_kv_heads == d->n_kv_heads &&
             cache->groups[g].head_dim == d->head_dim &&
             cache->groups[g].plan_class == d->plan_class))
      g++;
    if (g == cache->n_groups) {
      cache->groups[g] = (ci_kv_group){.window = d->window,
                                       .n_kv_heads = d->n_kv_heads,
                                       .head_dim = d->head_dim,
                                       .plan_class = d->plan_class};
      cache->n_groups++;
    }
    cache->group_of_layer[l] = g;
    cache->slot_of_layer[l] = cache->groups[g].n_layers++;
  }
  for (int g = 0; g < cache->n_groups; g++) {
    ci_kv_group *group = &cache->groups[g];
    group->layers = calloc((size_t)group->n_layers, sizeof(int));
    group->signs =
        be->ops->alloc(be, (size_t)group->n_layers * (size_t)group->head_dim * sizeof(float));
    if (!group->layers || !group->signs) goto oom;
  }
  float signs[CI_MAX_HEAD_DIM];
  for (int l = 0; l < n_layers; l++) {
    ci_kv_group *group = &cache->groups[cache->group_of_layer[l]];
    const int slot = cache->slot_of_layer[l];
    group->layers[slot] = l;
    if (group->head_dim > CI_MAX_HEAD_DIM) {
      ci_kv_cache_free(cache);
      ci_fail("kv cache: head_dim %d is over %d", group->head_dim, CI_MAX_HEAD_DIM);
      return NULL;
    }
    ci_turbo_signs(l, group->head_dim, signs);
    be->ops->upload(be, group->signs + (size_t)slot * group->head_dim, signs,
                    (size_t)group->head_dim * sizeof(float));
  }
  /* slabs hold SLAB_BLOCKS blocks of the group with the largest blocks in the widest format
   * (f32), so that a block of any group in any format fits one */
  const ci_kv_format widest = ci_kv_format_plain(CI_KV_F32);
  size_t largest = 1;
  for (int g = 0; g < cache->n_groups; g++) {
    const ci_kv_group *group = &cache->groups[g];
    const size_t stride = ci_kv_block_stride(&widest, block_tokens, group->n_layers,
                                             group->n_kv_heads, group->head_dim);
    if (stride > largest) largest = stride;
  }
  if (ci_kv_arena_init(&cache->arena, be, largest * SLAB_BLOCKS, arena_bytes)) {
    ci_kv_cache_free(cache);
    return NULL;
  }
  cache->has_arena = 1;
  const ci_kv_format base_format = ci_kv_format_plain(base);
  for (int g = 0; g < cache->n_groups; g++)
    if (!group_pool(cache, &cache->groups[g], &base_format)) {
      ci_kv_cache_free(cache);
      return NULL;
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
    for (int g = 0; g < cache->n_groups; g++) {
      ci_kv_group *group = &cache->groups[g];
      for (int i = 0; i < group->n_pools; i++) {
        ci_kv_pool_destroy(group->pools[i]);
        free(group->pools[i]);
      }
      free(group->pools);
      free(group->layers);
      if (group->signs) cache->be->ops->release(cache->be, group->signs);
      for (int r = 1; r < cache->n_ranks; r++)
        if (group->rank_signs[r])
          cache->rank_be[r]->ops->release(cache->rank_be[r], group->rank_signs[r]);
    }
  for (int r = 1; r < cache->n_ranks; r++) {
    ci_kv_arena_destroy(&cache->rank_arenas[r]);
    if (cache->rank_tables[r] && cache->rank_tables[r] != cache->table_store)
      cache->rank_be[r]->ops->release(cache->rank_be[r], cache->rank_tables[r]);
  }
  if (cache->has_arena) ci_kv_arena_destroy(&cache->arena);
  if (cache->table_device && cache->table_device != cache->table_store)
    cache->be->ops->release(cache->be, cache->table_device);
  free(cache->table_store);
  free(cache->row_taken);
  free(cache->groups);
  free(cache->group_of_layer);
  free(cache->slot_of_layer);
  free(cache);
}

int ci_kv_cache_set_arena(ci_kv_cache *cache, int64_t arena_bytes) {
  if (ci_kv_cache_blocks_used(cache) > 0 || cache->arena.allocations > 0)
    return ci_fail("kv cache: the arena is fixed before the first block");
  const size_t slab_bytes = cache->arena.slab_bytes;
  for (int r = 0; r < cache->n_ranks; r++) {
    ci_kv_arena *arena = r == 0 ? &cache->arena : &cache->rank_arenas[r];
    ci_backend *be = r == 0 ? cache->be : cache->rank_be[r];
    ci_kv_arena_destroy(arena);
    if (ci_kv_arena_init(arena, be, slab_bytes, arena_bytes)) {
      for (int back = r; back >= 0; back--) { /* every rank back to on-demand slabs */
        ci_kv_arena *undo = back == 0 ? &cache->arena : &cache->rank_arenas[back];
        if (back < r) ci_kv_arena_destroy(undo);
        ci_kv_arena_init(undo, back == 0 ? cache->be : cache->rank_be[back], slab_bytes, 0);
      }
      return CI_ERR;
    }
  }
  for (int g = 0; g < cache->n_groups; g++)
    for (int i = 0; i < cache->groups[g].n_pools; i++)
      if (ci_kv_pool_fit_arena(cache->groups[g].pools[i])) return CI_ERR;
  return CI_OK;
}

int ci_kv_cache_set_ranks(ci_kv_cache *cache, ci_backend *const *backends, int n_ranks) {
  if (n_ranks < 1 || n_ranks > CI_MAX_RANKS)
    return ci_fail("kv cache: %d ranks (1 to %d)", n_ranks, CI_MAX_RANKS);
  if (backends[0] != cache->be) return ci_fail("kv cache: rank 0 must be the cache's backend");
  if (cache->n_ranks > 1 || cache->n_live_seqs > 0 || ci_kv_cache_blocks_used(cache) > 0 ||
      cache->arena.allocations > (cache->arena.base ? 1 : 0) || cache->table_store)
    return ci_fail("kv cache: ranks are set once, before any sequence or block");
  if (cache->state_bytes > 0)
    return ci_fail("kv cache: recurrent states cannot be split over ranks yet");
  const int64_t budget = (int64_t)cache->arena.n_slabs * (int64_t)cache->arena.slab_bytes;
  for (int r = 1; r < n_ranks; r++) {
    ci_backend *be = backends[r];
    cache->rank_be[r] = be;
    if (ci_kv_arena_init(&cache->rank_arenas[r], be, cache->arena.slab_bytes, budget)) goto fail;
    cache->n_ranks = r + 1; /* what exists so far is freed with the cache */
    for (int g = 0; g < cache->n_groups; g++) {
      ci_kv_group *group = &cache->groups[g];
      const size_t bytes = (size_t)group->n_layers * (size_t)group->head_dim * sizeof(float);
      float *host = malloc(bytes);
      group->rank_signs[r] = be->ops->alloc(be, bytes);
      if (!host || !group->rank_signs[r]) {
        free(host);
        ci_fail("kv cache: out of memory");
        goto fail;
      }
      cache->be->ops->download(cache->be, host, group->signs, bytes);
      be->ops->upload(be, group->rank_signs[r], host, bytes);
      free(host);
      for (int i = 0; i < group->n_pools; i++)
        if (ci_kv_pool_add_mirror(group->pools[i], be, &cache->rank_arenas[r])) goto fail;
    }
  }
  return CI_OK;
fail:
  return ci_fail_context("kv cache of %d ranks", n_ranks);
}

int ci_kv_cache_set_limits(ci_kv_cache *cache, int max_seqs, int64_t max_positions) {
  if (cache->table_store || cache->n_live_seqs > 0)
    return ci_fail("kv cache: limits are set once, before the first sequence");
  if (max_seqs < 1 || max_positions < 1) return ci_fail("kv cache: empty limits");
  const int64_t entries = (max_positions + cache->block_tokens - 1) / cache->block_tokens;
  const size_t n = (size_t)max_seqs * (size_t)cache->n_groups * (size_t)entries;
  cache->table_store = malloc((n ? n : 1) * sizeof *cache->table_store);
  cache->row_taken = calloc((size_t)max_seqs, 1);
  ci_backend *be = cache->be;
  cache->table_device =
      be->host_visible ? cache->table_store : be->ops->alloc(be, (n ? n : 1) * sizeof(int32_t));
  if (!cache->table_store || !cache->row_taken || !cache->table_device) {
    if (cache->table_device && cache->table_device != cache->table_store)
      be->ops->release(be, cache->table_device);
    free(cache->table_store);
    free(cache->row_taken);
    cache->table_store = cache->table_device = NULL;
    cache->row_taken = NULL;
    return ci_fail("kv cache: out of memory for the block tables");
  }
  for (int r = 1; r < cache->n_ranks; r++) {
    ci_backend *rank_be = cache->rank_be[r];
    cache->rank_tables[r] = rank_be->host_visible
                                ? cache->table_store
                                : rank_be->ops->alloc(rank_be, (n ? n : 1) * sizeof(int32_t));
    if (!cache->rank_tables[r]) return ci_fail("kv cache: out of memory for the block tables");
  }
  cache->max_seqs = max_seqs;
  cache->max_table_entries = entries;
  return CI_OK;
}

int64_t ci_kv_cache_arena_bytes(const ci_kv_cache *cache) {
  return (int64_t)cache->arena.n_slabs * (int64_t)cache->arena.slab_bytes;
}

const void *ci_kv_cache_arena_base(const ci_kv_cache *cache) {
  return cache->arena.base;
}

int64_t ci_kv_cache_block_cost(const ci_kv_cache *cache, int g, const ci_kv_format *format) {
  const ci_kv_group *group = &cache->groups[g];
  const size_t stride = ci_kv_block_stride(format, cache->block_tokens, group->n_layers,
                                           group->n_kv_heads, group->head_dim);
  return (int64_t)(cache->arena.slab_bytes / (cache->arena.slab_bytes / stride));
}

int64_t ci_kv_cache_slab_bytes(const ci_kv_cache *cache) {
  return (int64_t)cache->arena.slab_bytes;
}

int64_t ci_kv_cache_blocks_used(const ci_kv_cache *cache) {
  int64_t used = 0;
  for (int g = 0; g < cache->n_groups; g++)
    for (int i = 0; i < cache->groups[g].n_pools; i++) used += cache->groups[g].pools[i]->n_used;
  return used;
}

int ci_kv_cache_usage_by_format(const ci_kv_cache *cache, ci_kv_format_usage *out, int max) {
  int n = 0;
  for (int g = 0; g < cache->n_groups; g++)
    for (int i = 0; i < cache->groups[g].n_pools; i++) {
      const ci_kv_pool *pool = cache->groups[g].pools[i];
      int k = 0;
      while (k < n && !ci_kv_format_equal(&out[k].format, &pool->format)) k++;
      if (k == n) {
        if (n == max) continue;
        out[n++] = (ci_kv_format_usage){.format = pool->format};
      }
      out[k].blocks_used += pool->n_used;
      out[k].blocks_free += (int64_t)pool->n_held * pool->blocks_per_slab - pool->n_used;
      out[k].bytes_used += ci_kv_pool_bytes_used(pool);
    }
  return n;
}

int64_t ci_kv_group_bytes_used(const ci_kv_cache *cache, int g) {
  int64_t bytes = 0;
  for (int i = 0; i < cache->groups[g].n_pools; i++)
    bytes += ci_kv_pool_bytes_used(cache->groups[g].pools[i]);
  return bytes;
}

int ci_kv_cache_set_state_bytes(ci_kv_cache *cache, int64_t bytes) {
  if (bytes < 0) return ci_fail("kv cache: negative state size");
  if (bytes % (int64_t)sizeof(float))
    return ci_fail("kv cache: a recurrent state of %lld bytes is not a whole number of floats",
                   (long long)bytes);
  if (cache->n_live_seqs > 0)
    return ci_fail("kv cache: the recurrent state size is set before any sequence exists");
  if (bytes > 0 && cache->n_ranks > 1)
    return ci_fail("kv cache: recurrent states cannot be split over ranks yet");
  cache->state_bytes = bytes;
  return CI_OK;
}

int64_t ci_kv_cache_state_bytes(const ci_kv_cache *cache) {
  return cache->state_bytes;
}

/* Bytes that `bytes` of state memory take: whole slabs of an arena with a budget. */
static int64_t state_footprint(const ci_kv_cache *cache, int64_t bytes) {
  if (bytes <= 0) return 0;
  if (!cache->arena.base) return bytes;
  return ci_kv_arena_slabs_for(&cache->arena, bytes) * (int64_t)cache->arena.slab_bytes;
}

int64_t ci_kv_cache_state_cost(const ci_kv_cache *cache, int64_t max_round_rows) {
  if (cache->state_bytes == 0) return 0;
  /* whole slabs even before the cache has its budget (the engine sizes the budget from this) */
  const ci_kv_arena *arena = &cache->arena;
  int64_t slabs = ci_kv_arena_slabs_for(arena, cache->state_bytes);
  if (max_round_rows > 0)
    slabs += ci_kv_arena_slabs_for(arena, (max_round_rows + 1) * cache->state_bytes);
  return slabs * (int64_t)arena->slab_bytes;
}

int64_t ci_kv_cache_arena_bytes_taken(const ci_kv_cache *cache) {
  return ci_kv_arena_bytes_taken(&cache->arena);
}

/* Memory for `bytes` of state: a run of whole slabs (*slabs set) from an arena with a budget, else
 * a backend allocation (*slabs 0). Counted in cache->state_held. NULL with ci_last_error. */
static float *take_state_memory(ci_kv_cache *cache, int64_t bytes, int32_t *slabs) {
  float *memory = NULL;
  *slabs = 0;
  if (cache->arena.base) {
    const int64_t n = ci_kv_arena_slabs_for(&cache->arena, bytes);
    if (n > INT32_MAX) return ci_fail("kv cache: a state of %lld bytes", (long long)bytes), NULL;
    memory = (float *)ci_kv_arena_take_run(&cache->arena, (int32_t)n);
    if (memory) *slabs = (int32_t)n;
  } else {
    memory = cache->be->ops->alloc_uninitialized(cache->be, (size_t)bytes);
  }
  if (memory) cache->state_held += state_footprint(cache, bytes);
  return memory;
}

/* Gives back what take_state_memory took. */
static void give_state_memory(ci_kv_cache *cache, float *memory, int64_t bytes, int32_t slabs) {
  if (!memory) return;
  if (slabs > 0) {
    ci_kv_arena_give_run(&cache->arena, (uint8_t *)memory, slabs);
    cache->state_held -= (int64_t)slabs * (int64_t)cache->arena.slab_bytes;
  } else {
    cache->be->ops->release(cache->be, memory);
    cache->state_held -= bytes;
  }
}

float *ci_kv_cache_state_take(ci_kv_cache *cache, int32_t *slabs) {
  *slabs = 0;
  if (cache->state_bytes <= 0) return ci_fail("kv cache: this model has no recurrent state"), NULL;
  return take_state_memory(cache, cache->state_bytes, slabs);
}

void ci_kv_cache_state_give(ci_kv_cache *cache, float *state, int32_t slabs) {
  give_state_memory(cache, state, cache->state_bytes, slabs);
}

int64_t ci_kv_cache_state_footprint(const ci_kv_cache *cache) {
  return state_footprint(cache, cache->state_bytes);
}

int64_t ci_kv_cache_bytes_used(const ci_kv_cache *cache) {
  int64_t bytes = cache->state_held;
  for (int g = 0; g < cache->n_groups; g++) bytes += ci_kv_group_bytes_used(cache, g);
  return bytes;
}

ci_kv_seq *ci_kv_seq_create(ci_kv_cache *cache) {
  ci_kv_seq *seq = calloc(1, sizeof *seq);
  if (seq)
    seq->tables = calloc((size_t)(cache->n_groups ? cache->n_groups : 1), sizeof *seq->tables);
  if (!seq || !seq->tables) {
    free(seq);
    ci_fail("kv sequence: out of memory");
    return NULL;
  }
  seq->cache = cache;
  seq->row = -1;
  if (!cache->table_store && !cache->be->host_visible) {
    free(seq->tables);
    free(seq);
    ci_fail("kv cache: a backend with memory of its own needs the cache's limits set");
    return NULL;
  }
  if (cache->table_store) {
    int row = 0;
    while (row < cache->max_seqs && cache->row_taken[row]) row++;
    if (row == cache->max_seqs) {
      free(seq->tables);
      free(seq);
      ci_fail("kv cache: all %d sequence slots are in use", cache->max_seqs);
      return NULL;
    }
    cache->row_taken[row] = 1;
    seq->row = row;
    for (int g = 0; g < cache->n_groups; g++) {
      seq->tables[g].entries =
          cache->table_store + ((size_t)row * cache->n_groups + g) * cache->max_table_entries;
      seq->tables[g].capacity = cache->max_table_entries;
    }
  }
  if (cache->state_bytes > 0) {
    seq->state = take_state_memory(cache, cache->state_bytes, &seq->state_slabs);
    if (!seq->state) {
      if (seq->row >= 0) cache->row_taken[seq->row] = 0;
      free(seq->tables);
      free(seq);
      ci_fail_context("kv sequence: recurrent state of %lld bytes", (long long)cache->state_bytes);
      return NULL;
    }
    cache->be->ops->fill(cache->be, seq->state, 0.0f, cache->state_bytes / (int64_t)sizeof(float));
  }
  cache->n_live_seqs++;
  for (int g = 0; g < cache->n_groups; g++) seq->tables[g].pool = cache->groups[g].pools[0];
  return seq;
}

void ci_kv_seq_free(ci_kv_seq *seq) {
  if (!seq) return;
  for (int g = 0; g < seq->cache->n_groups; g++) {
    ci_kv_block_table *table = &seq->tables[g];
    for (int64_t i = 0; i < table->n_entries; i++)
      if (table->entries[i] >= 0) ci_kv_pool_release(table->pool, table->entries[i]);
    if (seq->row < 0) free(table->entries);
  }
  if (seq->row >= 0) seq->cache->row_taken[seq->row] = 0;
  give_state_memory(seq->cache, seq->state, seq->cache->state_bytes, seq->state_slabs);
  give_state_memory(seq->cache, seq->checkpoints, seq->n_checkpoints * seq->cache->state_bytes,
                    seq->checkpoint_slabs);
  seq->cache->n_live_seqs--;
  free(seq->tables);
  free(seq);
}

int ci_kv_seq_set_layer_plan(ci_kv_seq *seq, const ci_kv_format *targets, int64_t start) {
  if (seq->n != 0) return ci_fail("kv sequence: a codec plan is set before the first token");
  if (start < 0) return ci_fail("kv sequence: the conversion start must be >= 0");
  const ci_kv_cache *cache = seq->cache;
  for (int l = 0; l < cache->n_layers; l++) {
    const int g = cache->group_of_layer[l];
    const ci_kv_group *group = &cache->groups[g];
    const ci_kv_format *first = &targets[group->layers[0]];
    if (!ci_kv_format_equal(&targets[l], first))
      return ci_fail("kv sequence: cache layers %d and %d share blocks but not a codec plan",
                     group->layers[0], l);
    if (ci_kv_format_check(&targets[l], group->head_dim))
      return ci_fail_context("cache layer %d", l);
  }
  seq->has_plan = 0;
  for (int g = 0; g < cache->n_groups; g++) {
    ci_kv_block_table *table = &seq->tables[g];
    const ci_kv_format *target = &targets[cache->groups[g].layers[0]];
    table->has_target = !ci_kv_format_equal(target, &table->pool->format);
    /* the target's pool exists before the first step, so that converting allocates nothing */
    if (table->has_target && !group_pool(seq->cache, &seq->cache->groups[g], target)) return CI_ERR;
    table->target = *target;
    seq->has_plan |= table->has_target;
  }
  seq->start = start;
  seq->converted = 0;
  return CI_OK;
}

int ci_kv_layer_protected(int layer, int n_layers, int protect) {
  return layer < protect || layer >= n_layers - protect;
}

int ci_kv_seq_set_plan_protected(ci_kv_seq *seq, const ci_kv_format *target, int64_t start,
                                 int protect) {
  const ci_kv_cache *cache = seq->cache;
  const int n = cache->n_layers;
  if (protect < 0) return ci_fail("kv protect must be >= 0");
  ci_kv_format *targets = malloc((size_t)(n ? n : 1) * sizeof *targets);
  if (!targets) return ci_fail("out of memory");
  for (int l = 0; l < n; l++) {
    const int g = cache->group_of_layer[l];
    const int protected_layer = ci_kv_layer_protected(l, n, protect);
    if (protected_layer && cache->groups[g].n_layers > 1) {
      free(targets);
      return ci_fail("kv protect %d: cache layer %d shares its blocks with other layers (the "
                     "cache was made for a smaller protect)",
                     protect, l);
    }
    targets[l] = protected_layer ? seq->tables[g].pool->format : *target;
  }
  int status = ci_kv_seq_set_layer_plan(seq, targets, start);
  free(targets);
  return status;
}

int ci_kv_seq_set_plan(ci_kv_seq *seq, const ci_kv_format *target, int64_t start) {
  return ci_kv_seq_set_plan_protected(seq, target, start, 0);
}

int64_t ci_kv_seq_chunk_limit(const ci_kv_seq *seq) {
  if (seq->has_plan && !seq->converted && seq->start > seq->n) return seq->start - seq->n;
  return INT64_MAX;
}

/* Grows a table to hold at least n entries. */
static int table_reserve(ci_kv_block_table *table, int table_is_shared, int64_t n) {
  if (n <= table->capacity) return CI_OK;
  if (table_is_shared)
    return ci_fail("kv sequence: %lld blocks exceed the cache's limit of %lld per sequence",
                   (long long)n, (long long)table->capacity);
  int64_t capacity = table->capacity ? table->capacity : 16;
  while (capacity < n) capacity *= 2;
  int32_t *entries = realloc(table->entries, (size_t)capacity * sizeof *entries);
  if (!entries) return ci_fail("kv sequence: out of memory");
  table->entries = entries;
  table->capacity = capacity;
  return CI_OK;
}

int ci_kv_seq_reserve(ci_kv_seq *seq, int64_t n_new) {
  const int64_t T = seq->cache->block_tokens;
  int64_t needed = (seq->n + n_new + T - 1) / T;
  for (int g = 0; g < seq->cache->n_groups; g++) {
    ci_kv_block_table *table = &seq->tables[g];
    /* copy-on-write: the step writes from position n on, so only the block holding n can be a
     * shared block that is written (full blocks are never written again) */
    const int64_t last = seq->n / T;
    if (n_new > 0 && seq->n % T && last < table->n_entries && table->entries[last] >= 0 &&
        ci_kv_pool_refcount(table->pool, table->entries[last]) > 1) {
      const int32_t copy = ci_kv_pool_copy_block(table->pool, table->entries[last]);
      if (copy < 0) return CI_ERR;
      ci_kv_pool_release(table->pool, table->entries[last]);
      table->entries[last] = copy;
      if (last < table->sync_from) table->sync_from = last;
    }
    if (table_reserve(table, seq->row >= 0, needed)) return CI_ERR;
    while (table->n_entries < needed) {
      int32_t id = ci_kv_pool_alloc(table->pool);
      if (id < 0) return CI_ERR;
      if (table->n_entries < table->sync_from) table->sync_from = table->n_entries;
      table->entries[table->n_entries++] = id;
    }
  }
  return CI_OK;
}

/* The view of slot `slot` (layer inside the group) of a pool in rank `rank`'s storage, for
 * block-level backend ops. */
static ci_paged_kv pool_layer_view(const ci_kv_group *group, const ci_kv_pool *pool, int slot,
                                   int rank) {
  return (ci_paged_kv){
      .format = pool->format,
      .block_tokens = pool->block_tokens,
      .n_kv_heads = group->n_kv_heads,
      .head_dim = group->head_dim,
      .slabs = ci_kv_pool_slabs_of(pool, rank),
      .blocks_per_slab = pool->blocks_per_slab,
      .block_stride = pool->block_stride,
      .k_offset = (size_t)slot * (pool->k_block_bytes + pool->v_block_bytes),
      .v_offset = (size_t)slot * (pool->k_block_bytes + pool->v_block_bytes) + pool->k_block_bytes,
      .k_row_bytes = ci_kv_row_bytes(&pool->format, group->head_dim, 0),
      .v_row_bytes = ci_kv_row_bytes(&pool->format, group->head_dim, 1),
      .signs =
          (rank == 0 ? group->signs : group->rank_signs[rank]) + (size_t)slot * group->head_dim};
}

/* Re-encodes every retained position of group g into `target`'s pool (a backend op per block and
 * layer) and releases the old blocks (docs/kv-cache.md §5). Encoding from the
 * decoded base rows equals encoding at append. */
static int convert_group(ci_kv_seq *seq, int g, ci_kv_pool *target) {
  const ci_kv_group *group = &seq->cache->groups[g];
  ci_backend *be = seq->cache->be;
  ci_kv_block_table *table = &seq->tables[g];
  ci_kv_pool *source = table->pool;
  const int T = seq->cache->block_tokens;
  for (int64_t i = table->first_live; i < table->n_entries; i++) {
    const int32_t old_id = table->entries[i];
    if (old_id < 0) continue;
    const int32_t new_id = ci_kv_pool_alloc(target);
    if (new_id < 0) return ci_fail_context("kv conversion");
    const int live = seq->n - i * T < T ? (int)(seq->n - i * T) : T;
    for (int r = 0; r < seq->cache->n_ranks; r++) {
      ci_backend *rank_be = r == 0 ? be : seq->cache->rank_be[r];
      for (int l = 0; l < group->n_layers; l++) {
        const ci_paged_kv from = pool_layer_view(group, source, l, r);
        const ci_paged_kv to = pool_layer_view(group, target, l, r);
        if (rank_be->ops->kv_convert_block(rank_be, &from, old_id, &to, new_id, live))
          return CI_ERR;
      }
    }
    ci_kv_pool_release(source, old_id);
    table->entries[i] = new_id;
    if (i < table->sync_from) table->sync_from = i;
  }
  table->pool = target;
  return CI_OK;
}

/* Step-boundary work at the current n: sliding groups release blocks no future query (nor a
 * rollback within the reserve) can see, then the plan's conversion runs if due and no round is
 * open. */
static int settle(ci_kv_seq *seq) {
  const int64_t T = seq->cache->block_tokens;
  for (int g = 0; g < seq->cache->n_groups; g++) {
    const ci_kv_group *group = &seq->cache->groups[g];
    if (group->window == 0) continue;
    /* The next query (position n) sees positions >= n - W + 1; a rollback of up to R positions
     * moves that bound back by R. Older blocks can go. */
    int64_t oldest_needed = seq->n - group->window + 1 - seq->rollback_reserve;
    ci_kv_block_table *table = &seq->tables[g];
    int64_t i = table->first_live;
    for (; i < table->n_entries && (i + 1) * T <= oldest_needed; i++) {
      if (table->entries[i] >= 0) {
        ci_kv_pool_release(table->pool, table->entries[i]);
        table->entries[i] = -1;
        if (i < table->sync_from) table->sync_from = i;
      }
    }
    table->first_live = i;
  }
  if (seq->has_plan && !seq->converted && !seq->round_open && seq->n > 0 && seq->n >= seq->start) {
    for (int g = 0; g < seq->cache->n_groups; g++) {
      if (!seq->tables[g].has_target) continue;
      ci_kv_pool *target = group_pool(seq->cache, &seq->cache->groups[g], &seq->tables[g].target);
      if (!target || convert_group(seq, g, target)) return CI_ERR;
      seq->tables[g].has_target = 0;
    }
    seq->converted = 1;
    seq->conversion_offset = seq->n;
  }
  return CI_OK;
}

int ci_kv_seq_commit(ci_kv_seq *seq, int64_t n_new) {
  seq->n += n_new;
  return settle(seq);
}

void ci_kv_seq_set_rollback_reserve(ci_kv_seq *seq, int64_t reserve) {
  seq->rollback_reserve = reserve > 0 ? reserve : 0;
}

int ci_kv_seq_reserve_checkpoints(ci_kv_seq *seq, int64_t max_round_rows) {
  ci_kv_cache *cache = seq->cache;
  if (!seq->state || seq->n_checkpoints >= max_round_rows + 1) return CI_OK;
  if (seq->round_open) return ci_fail("kv sequence: checkpoints are reserved outside a round");
  if (max_round_rows < 1 || max_round_rows > INT32_MAX)
    return ci_fail("kv sequence: checkpoints for rounds of %lld rows", (long long)max_round_rows);
  /* the old ones go first, so that their slabs can be part of the new run */
  give_state_memory(cache, seq->checkpoints, seq->n_checkpoints * cache->state_bytes,
                    seq->checkpoint_slabs);
  seq->checkpoints = NULL;
  seq->n_checkpoints = 0;
  seq->checkpoint_slabs = 0;
  seq->checkpoints =
      take_state_memory(cache, (max_round_rows + 1) * cache->state_bytes, &seq->checkpoint_slabs);
  if (!seq->checkpoints)
    return ci_fail_context("kv sequence: state checkpoints for speculative rounds of %lld rows",
                           (long long)max_round_rows);
  seq->n_checkpoints = max_round_rows + 1;
  return CI_OK;
}

int ci_kv_seq_round_open(ci_kv_seq *seq, int64_t n_rows) {
  if (seq->round_open) return ci_fail("kv sequence: a speculative round is already open");
  if (n_rows < 1) return ci_fail("kv sequence: a speculative round needs at least one row");
  if (n_rows > 1 && n_rows > ci_kv_seq_chunk_limit(seq))
    return ci_fail("kv sequence: a speculative round of %lld rows at position %lld would reach "
                   "the conversion start %lld",
                   (long long)n_rows, (long long)seq->n, (long long)seq->start);
  if (seq->state) {
    if (ci_kv_seq_reserve_checkpoints(seq, n_rows)) return CI_ERR;
    /* the first checkpoint: the state at the round start */
    seq->cache->be->ops->copy_bytes(seq->cache->be, seq->checkpoints, seq->state,
                                    (size_t)seq->cache->state_bytes);
  }
  seq->round_open = 1;
  seq->round_start = seq->n;
  return CI_OK;
}

int ci_kv_seq_round_close(ci_kv_seq *seq, int64_t n_keep) {
  if (!seq->round_open) return ci_fail("kv sequence: no speculative round is open");
  if (n_keep < seq->round_start || n_keep > seq->n || seq->n - n_keep > seq->rollback_reserve)
    return ci_fail("kv sequence: cannot keep %lld positions of %lld (round start %lld, rollback "
                   "reserve %lld)",
                   (long long)n_keep, (long long)seq->n, (long long)seq->round_start,
                   (long long)seq->rollback_reserve);
  const int64_t T = seq->cache->block_tokens;
  const int64_t keep_blocks = (n_keep + T - 1) / T;
  for (int g = 0; g < seq->cache->n_groups; g++) {
    ci_kv_block_table *table = &seq->tables[g];
    for (int64_t i = keep_blocks; i < table->n_entries; i++)
      if (table->entries[i] >= 0) ci_kv_pool_release(table->pool, table->entries[i]);
    if (table->n_entries > keep_blocks) {
      table->n_entries = keep_blocks;
      if (table->first_live > keep_blocks) table->first_live = keep_blocks;
      if (table->sync_from > keep_blocks) table->sync_from = keep_blocks;
    }
  }
  if (seq->state && n_keep < seq->n) { /* the state after the last kept row */
    ci_backend *be = seq->cache->be;
    const size_t bytes = (size_t)seq->cache->state_bytes;
    be->ops->copy_bytes(
        be, seq->state,
        (const char *)seq->checkpoints + (size_t)(n_keep - seq->round_start) * bytes, bytes);
  }
  seq->n = n_keep;
  seq->round_open = 0;
  return settle(seq);
}

ci_kv_block_ref ci_kv_seq_block(const ci_kv_seq *seq, int g, int64_t i) {
  const ci_kv_block_table *table = &seq->tables[g];
  return (ci_kv_block_ref){table->pool, i >= 0 && i < table->n_entries ? table->entries[i] : -1};
}

static int attach_blocks(ci_kv_seq *seq, int64_t n_blocks, const ci_kv_block_ref *refs,
                         int converted, int64_t conversion_offset);

int ci_kv_seq_attach(ci_kv_seq *seq, int64_t n_blocks, const ci_kv_block_ref *refs, int converted,
                     int64_t conversion_offset) {
  if (seq->state)
    return ci_fail("kv attach: a hybrid (gated DeltaNet) model's sequence needs the recurrent "
                   "state at the prefix end too (ci_kv_seq_attach_with_state)");
  return attach_blocks(seq, n_blocks, refs, converted, conversion_offset);
}

int ci_kv_seq_attach_with_state(ci_kv_seq *seq, int64_t n_blocks, const ci_kv_block_ref *refs,
                                int converted, int64_t conversion_offset, const float *state) {
  if (!seq->state || !state)
    return ci_fail("kv attach: a recurrent state is attached only to a sequence that has one");
  if (attach_blocks(seq, n_blocks, refs, converted, conversion_offset)) return CI_ERR;
  ci_backend *be = seq->cache->be;
  be->ops->copy_bytes(be, seq->state, state, (size_t)seq->cache->state_bytes);
  return CI_OK;
}

static int attach_blocks(ci_kv_seq *seq, int64_t n_blocks, const ci_kv_block_ref *refs,
                         int converted, int64_t conversion_offset) {
  ci_kv_cache *cache = seq->cache;
  const int64_t T = cache->block_tokens, p = n_blocks * T;
  if (seq->n != 0) return ci_fail("kv attach: the sequence is not empty");
  if (n_blocks < 1) return ci_fail("kv attach: no blocks");
  if (converted && (!seq->has_plan || conversion_offset > p))
    return ci_fail("kv attach: converted blocks need a plan that converted by position %lld",
                   (long long)p);
  if (!converted && seq->has_plan && p >= seq->start)
    return ci_fail("kv attach: %lld base-format positions reach the plan's start %lld",
                   (long long)p, (long long)seq->start);
  /* check everything before taking any reference */
  ci_kv_pool **pools = calloc((size_t)cache->n_groups, sizeof *pools);
  int64_t *first_live = calloc((size_t)cache->n_groups, sizeof *first_live);
  if (!pools || !first_live) {
    free(pools);
    free(first_live);
    return ci_fail("kv attach: out of memory");
  }
  int status = CI_OK;
  for (int g = 0; g < cache->n_groups && status == CI_OK; g++) {
    const ci_kv_group *group = &cache->groups[g];
    const ci_kv_block_table *table = &seq->tables[g];
    const ci_kv_format *want =
        converted && table->has_target ? &table->target : &table->pool->format;
    /* sliding groups: the next query (position p) sees positions >= p - W + 1 */
    const int64_t oldest =
        group->window > 0 && p - group->window + 1 > 0 ? p - group->window + 1 : 0;
    first_live[g] = oldest / T;
    for (int64_t i = first_live[g]; i < n_blocks && status == CI_OK; i++) {
      const ci_kv_block_ref *ref = &refs[i * cache->n_groups + g];
      if (ref->id < 0 || !ref->pool)
        status = ci_fail("kv attach: block %lld of layer group %d is not held", (long long)i, g);
      else if (!ci_kv_format_equal(&ref->pool->format, want))
        status = ci_fail("kv attach: block %lld of layer group %d is in another format",
                         (long long)i, g);
      else if (pools[g] && pools[g] != ref->pool)
        status = ci_fail("kv attach: the blocks of layer group %d are in different pools", g);
      pools[g] = ref->pool;
    }
    if (status == CI_OK) status = table_reserve(&seq->tables[g], seq->row >= 0, n_blocks);
  }
  if (status == CI_OK) {
    for (int g = 0; g < cache->n_groups; g++) {
      ci_kv_block_table *table = &seq->tables[g];
      for (int64_t i = 0; i < n_blocks; i++) {
        const ci_kv_block_ref *ref = &refs[i * cache->n_groups + g];
        table->entries[i] = i >= first_live[g] ? ref->id : -1;
        if (i >= first_live[g]) ci_kv_pool_retain(ref->pool, ref->id);
      }
      table->n_entries = n_blocks;
      table->sync_from = 0;
      table->first_live = first_live[g];
      if (pools[g]) table->pool = pools[g];
      if (converted) table->has_target = 0;
    }
    seq->n = p;
    if (converted) {
      seq->converted = 1;
      seq->conversion_offset = conversion_offset;
    }
  }
  free(pools);
  free(first_live);
  return status;
}

ci_kv_seq *ci_kv_seq_fork(const ci_kv_seq *src) {
  if (src->round_open) return ci_fail("kv fork: a speculative round is open"), NULL;
  ci_kv_seq *seq = ci_kv_seq_create(src->cache);
  if (!seq) return NULL;
  /* the same room for speculative rounds as the source */
  if (src->n_checkpoints > 1 && ci_kv_seq_reserve_checkpoints(seq, src->n_checkpoints - 1)) {
    ci_kv_seq_free(seq);
    return NULL;
  }
  for (int g = 0; g < src->cache->n_groups; g++)
    if (table_reserve(&seq->tables[g], seq->row >= 0, src->tables[g].n_entries)) {
      ci_kv_seq_free(seq);
      return NULL;
    }
  for (int g = 0; g < src->cache->n_groups; g++) {
    const ci_kv_block_table *from = &src->tables[g];
    ci_kv_block_table *to = &seq->tables[g];
    for (int64_t i = 0; i < from->n_entries; i++) {
      to->entries[i] = from->entries[i];
      if (from->entries[i] >= 0) ci_kv_pool_retain(from->pool, from->entries[i]);
    }
    to->n_entries = from->n_entries;
    to->first_live = from->first_live;
    to->sync_from = 0;
    to->pool = from->pool;
    to->has_target = from->has_target;
    to->target = from->target;
  }
  seq->n = src->n;
  seq->has_plan = src->has_plan;
  seq->target = src->target;
  seq->start = src->start;
  seq->converted = src->converted;
  seq->conversion_offset = src->conversion_offset;
  seq->rollback_reserve = src->rollback_reserve;
  /* a hybrid model's recurrent state is the sequence's too: the fork starts from a copy */
  if (src->state && seq->state)
    src->cache->be->ops->copy_bytes(src->cache->be, seq->state, src->state,
                                    (size_t)src->cache->state_bytes);
  return seq;
}

void ci_kv_seq_sync_tables(ci_kv_seq *seq) {
  const ci_kv_cache *cache = seq->cache;
  if (seq->row < 0) return;
  for (int g = 0; g < cache->n_groups; g++) { /* only what changed since the last copy */
    ci_kv_block_table *table = &seq->tables[g];
    const int64_t from = table->sync_from < 0 ? 0 : table->sync_from;
    for (int r = 0; r < cache->n_ranks && from < table->n_entries; r++) {
      int32_t *device = r == 0 ? cache->table_device : cache->rank_tables[r];
      ci_backend *be = r == 0 ? cache->be : cache->rank_be[r];
      if (device != cache->table_store)
        be->ops->upload(be, device + (table->entries - cache->table_store) + from,
                        table->entries + from, (size_t)(table->n_entries - from) * sizeof(int32_t));
    }
    table->sync_from = table->n_entries;
  }
}

ci_paged_kv ci_kv_seq_view_rank(const ci_kv_seq *seq, int layer, int rank) {
  const ci_kv_cache *cache = seq->cache;
  const int g = cache->group_of_layer[layer];
  ci_paged_kv view =
      pool_layer_view(&cache->groups[g], seq->tables[g].pool, cache->slot_of_layer[layer], rank);
  const int32_t *tables = rank == 0 ? cache->table_device : cache->rank_tables[rank];
  view.block_table = seq->row >= 0 ? tables + (seq->tables[g].entries - cache->table_store)
                                   : seq->tables[g].entries;
  view.n_table_entries = seq->tables[g].n_entries;
  return view;
}

ci_paged_kv ci_kv_seq_view(const ci_kv_seq *seq, int layer) {
  return ci_kv_seq_view_rank(seq, layer, 0);
}
