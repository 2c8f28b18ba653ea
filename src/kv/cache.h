/* Paged KV cache: layers grouped by geometry and retention, block pools per (group, format), and
 * the per-sequence block tables that map positions to blocks; each sequence carries its own
 * codec plan and converts from its base format to the target at its start threshold
 * (docs/kv-cache.md §1-5). */
#ifndef CI_KV_CACHE_H
#define CI_KV_CACHE_H

#include "kv/pool.h"

#include <stdint.h>

/* What the cache needs to know about one cache-owning layer. */
typedef struct {
  int window; /* 0 = full attention; W > 0 = sliding, keeps the last W positions */
  int n_kv_heads;
  int head_dim;
  int plan_class; /* layers whose per-layer plans (kv_config.json) may differ get different
                     classes; 0 for all when plans are uniform */
} ci_kv_layer_desc;

/* Layers with identical window, Hkv, D and plan class share block ids, one pool per format in
 * use. */
typedef struct {
  int window;
  int n_kv_heads;
  int head_dim;
  int plan_class;
  int n_layers;
  int *layers;  /* [n_layers] cache layer index of each slot */
  float *signs; /* [n_layers][head_dim] TurboQuant sign vectors of those layers (backend
                   memory) */
  float *rank_signs[CI_MAX_RANKS]; /* [1 .. n_ranks) their copies in each rank's memory */
  ci_kv_pool **pools;              /* [n_pools]; pools[0] holds the base format */
  int n_pools;
} ci_kv_group;

typedef struct {
  ci_backend *be;
  ci_kv_arena arena; /* every block's storage */
  int has_arena;
  int block_tokens;
  /* Block tables of every sequence in one array (after ci_kv_cache_set_limits): sequence row r,
   * group g owns entries [(r * n_groups + g) * max_table_entries, ... + max_table_entries). */
  int32_t *table_store;  /* [max_seqs][n_groups][max_table_entries], host */
  int32_t *table_device; /* its copy in backend memory (the same array where the backend shares
                            host memory) */
  int max_seqs;
  int64_t max_table_entries; /* blocks of the longest sequence */
  uint8_t *row_taken;        /* [max_seqs] */
  int n_live_seqs;           /* sequences created and not yet freed */
  int n_layers;
  int n_groups;
  ci_kv_group *groups; /* [n_groups] */
  int *group_of_layer; /* [n_layers] */
  int *slot_of_layer;  /* [n_layers] index of the layer inside its group */
  int64_t state_bytes; /* recurrent state of each sequence (hybrid models), 0 for none */
  int64_t state_held;  /* bytes the live sequences' states and checkpoints take (whole slabs of
                          the arena with a budget) */
  /* The ranks of a split model (model/tensor_parallel.h): rank 0 is be, arena and table_device
   * above; ranks 1 .. n_ranks - 1 hold their KV heads of every block in their own arena (the same
   * slab size and budget), and their own copies of the block tables and sign vectors. */
  int n_ranks;
  ci_backend *rank_be[CI_MAX_RANKS];
  ci_kv_arena rank_arenas[CI_MAX_RANKS];
  int32_t *rank_tables[CI_MAX_RANKS];
} ci_kv_cache;

/* One sequence's view of the cache: its length and one block table per group. Entry i of a
 * table holds the block of positions [i*T, (i+1)*T) in `pool`, or -1 once a sliding group
 * released it. */
typedef struct {
  int32_t *entries;
  int64_t n_entries;
  int64_t capacity;
  int64_t first_live; /* entries below this index were released (sliding groups) */
  int64_t sync_from;  /* entries from here on changed since the backend's copy was written */
  ci_kv_pool *pool;   /* the pool (format) the blocks live in */
  int has_target;     /* this group converts to `target` at the sequence's start */
  ci_kv_format target;
} ci_kv_block_table;

typedef struct {
  ci_kv_cache *cache;
  int row;                   /* its row of cache->table_store; -1 when its tables are its own */
  int64_t n;                 /* positions stored */
  ci_kv_block_table *tables; /* [cache->n_groups] */
  /* Delayed quantization plan (docs/kv-cache.md §5). */
  int has_plan;
  ci_kv_format target;
  int64_t start; /* S: convert once n >= S (and n > 0) */
  int converted;
  int64_t conversion_offset; /* n at conversion */
  /* Speculative rounds (docs/kv-cache.md §6). */
  int64_t rollback_reserve; /* R: sliding groups keep every position >= n - W + 1 - R */
  int round_open;           /* a round is open: commits neither convert nor close it */
  int64_t round_start;      /* n when the open round began */
  /* Recurrent state (hybrid models: cache->state_bytes, zero at creation; the model's layers
   * define its layout), NULL without one. With a budget it is a run of state_slabs slabs of the
   * arena; without one (state_slabs 0) a backend allocation of its own. */
  float *state;
  int32_t state_slabs;
  /* Its checkpoints during a speculative round: the state at the round start, then after each
   * row of the round's step (written by the step), n_checkpoints states of room, reserved once
   * (ci_kv_seq_reserve_checkpoints) and kept until the sequence goes; a run of checkpoint_slabs
   * slabs of the arena, or a backend allocation where that is 0. */
  float *checkpoints;
  int64_t n_checkpoints;
  int32_t checkpoint_slabs;
} ci_kv_seq;

/* One block of one group as a prefix-cache entry holds it: its pool (format) and id; id -1 when
 * the sequence it came from no longer held it (a sliding group released it). */
typedef struct {
  ci_kv_pool *pool;
  int32_t id;
} ci_kv_block_ref;

/* Builds a cache for n_layers cache-owning layers whose sequences start in `base` (bf16 or f32)
 * with T = block_tokens. arena_bytes > 0 allocates the whole KV arena now (at least that many
 * bytes, in whole slabs; blocks then never move and steps never allocate); 0 takes memory as
 * blocks are first needed. Returns NULL with ci_last_error. */
ci_kv_cache *ci_kv_cache_create(ci_backend *be, int n_layers, const ci_kv_layer_desc *layers,
                                ci_kv_codec base, int block_tokens, int64_t arena_bytes);

/* Gives a cache made without a budget its arena of arena_bytes (whole slabs) now, before any
 * block is taken (a caller that needs the cache's geometry to size its budget). Returns CI_OK or
 * CI_ERR (the cache then keeps taking memory on demand). */
int ci_kv_cache_set_arena(ci_kv_cache *cache, int64_t arena_bytes);

/* Splits the cache's storage over `n_ranks` ranks: backends[0] must be the cache's backend, and
 * each other rank gets storage of its own on backends[r] (the cache's layers then describe one
 * rank's KV heads). Before any sequence, block or recurrent state; the arena's budget (now or
 * later) applies to each rank. Returns CI_OK or CI_ERR. */
int ci_kv_cache_set_ranks(ci_kv_cache *cache, ci_backend *const *backends, int n_ranks);

/* Puts the block tables of up to max_seqs sequences of up to max_positions positions into one
 * array owned by the cache (so that a step never grows a table, and a device can hold them),
 * before any sequence exists. Later sequences beyond max_seqs, or growing past max_positions,
 * are refused. Returns CI_OK or CI_ERR. */
int ci_kv_cache_set_limits(ci_kv_cache *cache, int max_seqs, int64_t max_positions);

/* Bytes of the arena allocated at creation (0 without a budget), and its base address. */
int64_t ci_kv_cache_arena_bytes(const ci_kv_cache *cache);
const void *ci_kv_cache_arena_base(const ci_kv_cache *cache);

/* Bytes of the arena one block of group g in `format` takes: its share of a slab (a slab holds
 * a whole number of blocks). */
int64_t ci_kv_cache_block_cost(const ci_kv_cache *cache, int g, const ci_kv_format *format);

/* Bytes of one slab: pools take arena memory in slabs. */
int64_t ci_kv_cache_slab_bytes(const ci_kv_cache *cache);

/* The pool of group g storing `format`, created on first use (blocks restored from a persisted
 * prefix cache go there). NULL with ci_last_error when out of memory. */
ci_kv_pool *ci_kv_cache_pool(ci_kv_cache *cache, int g, const ci_kv_format *format);
/* Gives every sequence of the cache a recurrent state of `bytes` (a whole number of floats,
 * zeroed, taken with the sequence and freed with it) beside its KV blocks: the fixed
 * per-sequence part of a hybrid model's cache. With a budget the state is a run of whole slabs
 * of the arena (ci_kv_cache_state_cost), so blocks and states share the budget; without one it
 * is a backend allocation of its own. Only before any sequence exists. Returns CI_OK or CI_ERR.
 * With states, a speculative round keeps a checkpoint of the state after each of its rows (the
 * step writes them), and closing it restores the one after the last kept row; a prefix attach
 * needs the state at the prefix end (ci_kv_seq_attach_with_state). */
int ci_kv_cache_set_state_bytes(ci_kv_cache *cache, int64_t bytes);

/* Bytes of one sequence's recurrent state (0 without). */
int64_t ci_kv_cache_state_bytes(const ci_kv_cache *cache);

/* Bytes of memory a sequence's recurrent state takes, plus its checkpoints for speculative rounds
 * of up to max_round_rows rows (0: a sequence that never speculates), in whole slabs of the arena
 * each (as an arena with a budget hands them out); 0 for a model without states. Admission
 * counts this beside the blocks. */
int64_t ci_kv_cache_state_cost(const ci_kv_cache *cache, int64_t max_round_rows);

/* One more state-sized buffer (a prefix-cache snapshot of a sequence's state): a run of whole
 * arena slabs with a budget (*slabs set; counted in bytes used), else a backend allocation (*slabs
 * 0). Its contents are undefined. NULL with ci_last_error when the arena has no such run. Give it
 * back with ci_kv_cache_state_give. */
float *ci_kv_cache_state_take(ci_kv_cache *cache, int32_t *slabs);
void ci_kv_cache_state_give(ci_kv_cache *cache, float *state, int32_t slabs);

/* Bytes one such buffer takes (whole slabs with a budget). */
int64_t ci_kv_cache_state_footprint(const ci_kv_cache *cache);

/* Bytes of the arena's slabs taken (by pools and states); 0 without a budget. */
int64_t ci_kv_cache_arena_bytes_taken(const ci_kv_cache *cache);

/* Frees the cache; every sequence must have been freed first. */
void ci_kv_cache_free(ci_kv_cache *cache);

/* Blocks in use, summed over groups and formats. */
int64_t ci_kv_cache_blocks_used(const ci_kv_cache *cache);

/* Bytes of KV storage in use (blocks in use x bytes per block, K and V, every layer), plus the
 * recurrent states and state checkpoints the live sequences hold (whole slabs with a budget). */
int64_t ci_kv_cache_bytes_used(const ci_kv_cache *cache);

/* Blocks and bytes of one storage format, summed over the layer groups that use it. */
typedef struct {
  ci_kv_format format;
  int64_t blocks_used, blocks_free; /* free = allocated storage not in use */
  int64_t bytes_used;
} ci_kv_format_usage;

/* Fills out[0..n) with the usage of each format in use or allocated (n <= max). Returns n. */
int ci_kv_cache_usage_by_format(const ci_kv_cache *cache, ci_kv_format_usage *out, int max);

/* Bytes group g holds in use, over all its formats. */
int64_t ci_kv_group_bytes_used(const ci_kv_cache *cache, int g);

/* A new empty sequence in the base format (with its recurrent state where the cache has states:
 * refused, naming the shortage, when the arena has no run of slabs free for it). NULL with
 * ci_last_error on failure. */
ci_kv_seq *ci_kv_seq_create(ci_kv_cache *cache);

/* Releases the sequence's blocks and frees it. NULL is a no-op. */
void ci_kv_seq_free(ci_kv_seq *seq);

/* Gives an empty sequence a codec plan: it converts to `target` at the step boundary where
 * n >= start (never while empty). A bf16/f32 target equal to the base is no plan. Fails, naming
 * the layer, when a layer's head_dim cannot use the format. */
int ci_kv_seq_set_plan(ci_kv_seq *seq, const ci_kv_format *target, int64_t start);

/* 1 when cache layer `layer` of n is among the first or last `protect` (docs/kv-cache.md §7). */
int ci_kv_layer_protected(int layer, int n_layers, int protect);

/* As ci_kv_seq_set_plan, except that the first and last `protect` cache layers stay in the base
 * format (docs/kv-cache.md §7 `--kv-protect`). Fails, naming the problem, when one of them shares
 * its group with other layers (the cache must give them groups of their own). */
int ci_kv_seq_set_plan_protected(ci_kv_seq *seq, const ci_kv_format *target, int64_t start,
                                 int protect);

/* Per-layer plan: layer l converts to targets[l] (a bf16/f32 entry equal to the base means
 * "stays"); layers of one group must agree (give them distinct plan classes at creation). */
int ci_kv_seq_set_layer_plan(ci_kv_seq *seq, const ci_kv_format *targets, int64_t start);

/* The most tokens the next step may append so that a pending conversion happens exactly at
 * `start` (docs/kv-cache.md §5 "Exact crossing"); INT64_MAX when unconstrained. */
int64_t ci_kv_seq_chunk_limit(const ci_kv_seq *seq);

/* Makes sure blocks exist for positions [n, n + n_new) in every group (step contract item 2);
 * a partly filled last block that other owners share is copied first (copy-on-write). Returns
 * CI_OK, or CI_ERR when the pool is exhausted (the sequence is left unchanged in length; blocks
 * already taken stay with it). */
int ci_kv_seq_reserve(ci_kv_seq *seq, int64_t n_new);

/* Ends a step: n += n_new, then sliding groups release blocks no future query can see, then the
 * plan's conversion runs if due. Returns CI_OK, or CI_ERR when conversion runs out of memory. */
int ci_kv_seq_commit(ci_kv_seq *seq, int64_t n_new);

/* Sets the rollback reserve R (docs/kv-cache.md §4, §6): from the next step boundary on, sliding
 * groups keep every position >= n - W + 1 - R, so that a rollback of up to R positions still
 * finds every key the next query needs. 0 (the default) keeps only the window. R >= 0. */
void ci_kv_seq_set_rollback_reserve(ci_kv_seq *seq, int64_t reserve);

/* Reserves a sequence's state checkpoints for speculative rounds of up to max_round_rows rows
 * (max_round_rows + 1 states: from the arena with a budget), once, so that opening a round never
 * allocates. A no-op without a recurrent state or when that much is already reserved. Not while
 * a round is open. Returns CI_OK, or CI_ERR naming the shortage. */
int ci_kv_seq_reserve_checkpoints(ci_kv_seq *seq, int64_t max_round_rows);

/* Opens a speculative round before a step that appends n_rows rows whose last rows may be
 * rolled back: until the round closes no commit converts the sequence. Fails (the sequence
 * unchanged) when a round is already open, or when the rows would pass a pending conversion's
 * start (a round drafts at most S - n - 1 tokens: docs/kv-cache.md §5 "Exact crossing"); the
 * conversion at S then runs when the round closes, so no rollback ever crosses it. A sequence
 * with a recurrent state whose checkpoints were not reserved for n_rows rows reserves them here
 * (ci_kv_seq_reserve_checkpoints; callers that must not allocate in a step reserve first). */
int ci_kv_seq_round_open(ci_kv_seq *seq, int64_t n_rows);

/* Closes the open round keeping n_keep positions (round start <= n_keep <= n, n - n_keep <= R):
 * blocks entirely at or past n_keep are released (a shared block is only let go, never written),
 * then sliding retention and a due conversion run as at a commit. The cache is left as if the
 * dropped positions had never been appended: re-appending the same tokens gives bit-identical
 * blocks' live rows and logits. Returns CI_OK, or CI_ERR (no round open, n_keep out of range,
 * conversion out of memory). */
int ci_kv_seq_round_close(ci_kv_seq *seq, int64_t n_keep);

/* Block i (positions [i*T, (i+1)*T)) of group g, id -1 when released or not yet allocated. */
ci_kv_block_ref ci_kv_seq_block(const ci_kv_seq *seq, int g, int64_t i);

/* Prefix reuse (docs/kv-cache.md §8 "attach"): makes an empty sequence whose plan is already set
 * hold positions [0, n_blocks*T) by referencing existing blocks (no copy; each gains an owner).
 * refs[i * n_groups + g] is block i of group g. `converted` says the blocks are in the plan's
 * target formats: the sequence then counts as converted at `conversion_offset` (which must be
 * <= n_blocks*T); otherwise they are in the base format and n_blocks*T must stay below the
 * plan's start. Full groups need every block; sliding groups need those covering the last W
 * positions (older ones are left released). Returns CI_OK, or CI_ERR naming the unmet
 * condition with the sequence unchanged. Writes into shared blocks copy them first
 * (ci_kv_seq_reserve). */
int ci_kv_seq_attach(ci_kv_seq *seq, int64_t n_blocks, const ci_kv_block_ref *refs, int converted,
                     int64_t conversion_offset);

/* A new sequence holding what `src` holds (docs/kv-cache.md §8 "fork"): the same length, codec
 * plan and conversion state, its block tables referencing the same blocks (each gains an owner;
 * nothing is copied) and a copy of its recurrent state (hybrid models), with as much room for state
 * checkpoints reserved as `src` has. A write into a shared block
 * copies it first (ci_kv_seq_reserve), so the two sequences then diverge without touching each
 * other's KV: n > 1 choices of one prompt. Fails
 * (NULL with ci_last_error) while a speculative round is open, or when no sequence slot or
 * memory is left. */
ci_kv_seq *ci_kv_seq_fork(const ci_kv_seq *src);
/* ci_kv_seq_attach for a sequence with a recurrent state (hybrid models): the blocks as there,
 * and the state becomes a copy of `state` (cache->state_bytes, backend memory), which must be
 * the state the producing sequence had at exactly n_blocks * T positions. */
int ci_kv_seq_attach_with_state(ci_kv_seq *seq, int64_t n_blocks, const ci_kv_block_ref *refs,
                                int converted, int64_t conversion_offset, const float *state);

/* Brings the backend's copy of the sequence's block tables up to date (before a step that reads
 * them; nothing to do where the backend shares host memory). */
void ci_kv_seq_sync_tables(ci_kv_seq *seq);

/* The paged view of cache layer `layer` for this sequence, for kv_store and attention (its
 * tables and slab pointers in backend memory). */
ci_paged_kv ci_kv_seq_view(const ci_kv_seq *seq, int layer);

/* The same for rank `rank` of a cache split over ranks (its storage, tables and signs). */
ci_paged_kv ci_kv_seq_view_rank(const ci_kv_seq *seq, int layer, int rank);

#endif
