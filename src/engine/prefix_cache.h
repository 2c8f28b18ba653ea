/* Prefix cache (docs/generation.md §7, docs/kv-cache.md §8): full KV blocks of running and finished
 * sequences, content-addressed by a hash chained over the token ids of every block from the first,
 * seeded with a key that names the model and the sequence's codec state (plan and conversion). A
 * new request walks its prompt's chain, attaches the longest run of cached blocks its KV state
 * allows, and prefills only the rest. Blocks are shared by reference (the cache holds one owner
 * of each); writes into shared blocks copy them first (ci_kv_seq_reserve).
 *
 * Eviction is least-recently-used over leaves (a block whose successors are gone), so a chain is
 * always shortened from its end. The byte cap counts blocks only the cache holds: blocks a
 * running sequence also holds cost nothing extra.
 *
 * Persistence (engine/prompt_cache.h) hooks in from outside: each node also carries a second,
 * independent chained hash (the pair names the block on disk) and a persisted flag; a hook sees
 * every block insert adds, blocks read back from disk are added as persisted, and the blocks not
 * yet persisted can be walked for an explicit save.
 *
 * Ownership: the cache holds references to blocks of `kv` (which must outlive it); it is used by
 * one thread (the engine's). */
#ifndef CI_ENGINE_PREFIX_CACHE_H
#define CI_ENGINE_PREFIX_CACHE_H

#include "kv/cache.h"

#include <stdint.h>

typedef struct ci_prefix_cache ci_prefix_cache;

typedef struct {
  int64_t blocks;    /* cached blocks (one per group per entry node) */
  int64_t nodes;     /* chain nodes (T tokens each) */
  int64_t bytes;     /* bytes of blocks only the cache holds */
  int64_t evictions; /* nodes evicted so far */
  int64_t states;    /* recurrent-state snapshots held (hybrid models) */
} ci_prefix_cache_stats;

/* A cached block as the persistence hook sees it (engine/prompt_cache.h). */
typedef struct {
  uint64_t key;
  uint64_t hash[2];      /* the block's two chained hashes: its name on disk */
  uint64_t parent[2];    /* its predecessor's (for block 0: the chains' seeds) */
  int64_t index;         /* positions [index*T, (index+1)*T) */
  const int32_t *tokens; /* [block_tokens] */
  int block_tokens;
  const ci_kv_block_ref *refs; /* [n_groups]; id -1 = not held (released sliding block) */
  int n_groups;
} ci_prefix_block;

/* Called for a block; returns 1 when it took it (persisted, or queued to be), 0 when it could
 * not now, -1 when it never can (the block then counts as persisted, so it is not offered again).
 */
typedef int (*ci_prefix_cache_hook)(void *arg, const ci_prefix_block *block);

/* An empty cache over `kv`. NULL with ci_last_error when out of memory. */
ci_prefix_cache *ci_prefix_cache_create(ci_kv_cache *kv);

/* Releases every cached block and frees the cache. NULL is a no-op. */
void ci_prefix_cache_free(ci_prefix_cache *pc);

/* Calls hook(arg, block) for every block ci_prefix_cache_insert adds from now on (persistence);
 * a block it takes counts as persisted. NULL turns it off. */
void ci_prefix_cache_set_hook(ci_prefix_cache *pc, ci_prefix_cache_hook hook, void *arg);

/* Registers the full blocks of `seq` (positions [0, floor(n/T)*T), whose token ids are
 * tokens[0..]) under `key`; blocks already cached under the same chain are left as they are.
 * Returns CI_OK, or CI_ERR when out of memory (the cache stays consistent). */
int ci_prefix_cache_insert(ci_prefix_cache *pc, uint64_t key, const int32_t *tokens,
                           const ci_kv_seq *seq);

/* Hybrid models (a sequence with a recurrent state): when seq->n is a whole number of blocks,
 * all of them cached under `key` (after ci_prefix_cache_insert), stores a copy of the sequence's
 * state with the last one, so that a prefix ending there can be attached. `moving`: taken while
 * decoding; such a snapshot is dropped when the same chain gets the next one further on, so a
 * decoding sequence leaves one behind it (those taken at prefill chunk ends stay). Snapshots
 * count in the cache's bytes and go with their block's node. They are taken like the sequences'
 * states (ci_kv_cache_state_take: arena slabs with a budget, so a step never allocates); with
 * no room the block stays without one (nothing stored). Returns CI_OK. */
int ci_prefix_cache_snapshot(ci_prefix_cache *pc, uint64_t key, const int32_t *tokens,
                             const ci_kv_seq *seq, int moving);

/* Attaches to the empty sequence `seq` the longest cached prefix of tokens[0..n_tokens) under
 * `key` whose length p is a multiple of T with min_p <= p <= max_p and that ci_kv_seq_attach
 * accepts (`converted`, `conversion_offset` as there); for a sequence with a recurrent state, p
 * must end at a block holding a snapshot, which becomes its state. Returns p (0 = miss, seq
 * untouched). */
int64_t ci_prefix_cache_attach(ci_prefix_cache *pc, uint64_t key, const int32_t *tokens,
                               int64_t min_p, int64_t max_p, ci_kv_seq *seq, int converted,
                               int64_t conversion_offset);

/* How many leading blocks of tokens[0 .. max_blocks*T) are cached under `key`. */
int64_t ci_prefix_cache_lookup(const ci_prefix_cache *pc, uint64_t key, const int32_t *tokens,
                               int64_t max_blocks);

/* Adds block `index` of the chain tokens[0 .. (index+1)*T) under `key`, whose blocks 0 .. index-1
 * must be cached, holding refs[0..n_groups) (the cache retains each; id -1 = none), and marks it
 * persisted when `persisted` (read from disk: no need to write it again). A block already cached
 * is left as it is. Returns CI_OK or CI_ERR. */
int ci_prefix_cache_add_block(ci_prefix_cache *pc, uint64_t key, const int32_t *tokens,
                              int64_t index, const ci_kv_block_ref *refs, int persisted);

/* Calls fn for the blocks not yet persisted, most recently used first (a parent before its
 * children), until fn returns 0; those it took count as persisted. Returns how many it took. */
int64_t ci_prefix_cache_each_unpersisted(ci_prefix_cache *pc, ci_prefix_cache_hook fn, void *arg);

/* The two chained hashes of blocks 0 .. n_blocks-1 of tokens under `key` into out[i]. */
void ci_prefix_chain_hashes(uint64_t key, const int32_t *tokens, int T, int64_t n_blocks,
                            uint64_t (*out)[2]);

/* The values the two chains start from under `key` (block 0's "parent"). */
void ci_prefix_chain_seeds(uint64_t key, uint64_t out[2]);

/* Evicts least-recently-used entries until the bytes only the cache holds are <= max_bytes.
 * Returns the bytes freed. */
int64_t ci_prefix_cache_trim(ci_prefix_cache *pc, int64_t max_bytes);

/* Current figures. */
void ci_prefix_cache_get_stats(const ci_prefix_cache *pc, ci_prefix_cache_stats *stats);

/* Bytes of blocks only the cache holds (what trimming could give back). */
int64_t ci_prefix_cache_bytes(const ci_prefix_cache *pc);

/* Folds v into a key (for building keys from the model and plan fields). */
uint64_t ci_prefix_key_mix(uint64_t key, uint64_t v);

#endif
