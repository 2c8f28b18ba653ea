/* Prefix cache: chained block hashes, a hash table of chain nodes, LRU-over-leaves eviction,
 * recurrent-state snapshots of hybrid models (see prefix_cache.h). */
#include "engine/prefix_cache.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>

/* One cached block position: tokens [index*T, (index+1)*T) of a chain, and the block of every
 * layer group holding their KV. */
typedef struct node {
  uint64_t hash;  /* chained: hash of the parent's hash and this block's tokens */
  uint64_t hash2; /* a second, independent chain: (hash, hash2) name the block on disk */
  int persisted;  /* handed to the persistence hook, or read from disk */
  uint64_t key;
  struct node *parent; /* NULL for index 0 */
  int n_children;
  int64_t index;
  int32_t *tokens;       /* [T] */
  ci_kv_block_ref *refs; /* [n_groups]; id -1 = not held */
  struct node *bucket_next;
  struct node *lru_prev, *lru_next; /* lru_prev toward the least recently used */
  float *state;        /* hybrid models: the recurrent state at the end of this block, or NULL */
  int32_t state_slabs; /* the arena slabs it takes (0: a backend allocation) */
  int state_moved;     /* the snapshot was taken while decoding (the next one replaces it) */
} node;

struct ci_prefix_cache {
  ci_kv_cache *kv;
  int T, n_groups;
  node **buckets;
  int64_t n_buckets; /* power of two */
  int64_t n_nodes, n_blocks, evictions;
  node *lru_oldest, *lru_newest;
  ci_prefix_cache_hook hook; /* persistence of new nodes (NULL: none) */
  void *hook_arg;
  int64_t n_states; /* nodes holding a state snapshot */
};

/* ==== Hashing ==== */

uint64_t ci_prefix_key_mix(uint64_t key, uint64_t v) {
  /* splitmix64 finalizer over the combination: every input bit reaches every output bit */
  uint64_t z = key ^ (v + 0x9E3779B97F4A7C15ULL + (key << 6) + (key >> 2));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

static uint64_t block_hash(uint64_t parent_hash, const int32_t *tokens, int T) {
  uint64_t h = parent_hash;
  for (int t = 0; t < T; t++) h = ci_prefix_key_mix(h, (uint32_t)tokens[t]);
  return h;
}

/* The second chain: other seed, token values moved out of the first chain's input range. */
static uint64_t block_hash2(uint64_t parent_hash, const int32_t *tokens, int T) {
  uint64_t h = parent_hash;
  for (int t = 0; t < T; t++) h = ci_prefix_key_mix(h, (uint64_t)(uint32_t)tokens[t] | 1ULL << 40);
  return h;
}

static uint64_t chain2_seed(uint64_t key) {
  return ci_prefix_key_mix(key, 0x5043414348453200ULL);
}

void ci_prefix_chain_seeds(uint64_t key, uint64_t out[2]) {
  out[0] = key;
  out[1] = chain2_seed(key);
}

void ci_prefix_chain_hashes(uint64_t key, const int32_t *tokens, int T, int64_t n_blocks,
                            uint64_t (*out)[2]) {
  uint64_t h = key, h2 = chain2_seed(key);
  for (int64_t i = 0; i < n_blocks; i++) {
    h = block_hash(h, tokens + i * T, T);
    h2 = block_hash2(h2, tokens + i * T, T);
    out[i][0] = h;
    out[i][1] = h2;
  }
}

/* ==== Table and LRU list ==== */

static node **bucket_of(const ci_prefix_cache *pc, uint64_t hash) {
  return &pc->buckets[hash & (uint64_t)(pc->n_buckets - 1)];
}

static int grow_buckets(ci_prefix_cache *pc) {
  const int64_t n = pc->n_buckets * 2;
  node **buckets = calloc((size_t)n, sizeof *buckets);
  if (!buckets) return ci_fail("prefix cache: out of memory");
  for (int64_t b = 0; b < pc->n_buckets; b++)
    for (node *x = pc->buckets[b], *next; x; x = next) {
      next = x->bucket_next;
      node **slot = &buckets[x->hash & (uint64_t)(n - 1)];
      x->bucket_next = *slot;
      *slot = x;
    }
  free(pc->buckets);
  pc->buckets = buckets;
  pc->n_buckets = n;
  return CI_OK;
}

/* The node continuing `parent` (NULL: a chain start under `key`) with `tokens`, or NULL. */
static node *find(const ci_prefix_cache *pc, uint64_t hash, uint64_t key, const node *parent,
                  const int32_t *tokens) {
  for (node *x = *bucket_of(pc, hash); x; x = x->bucket_next)
    if (x->hash == hash && x->key == key && x->parent == parent &&
        !memcmp(x->tokens, tokens, (size_t)pc->T * sizeof *tokens))
      return x;
  return NULL;
}

static void lru_unlink(ci_prefix_cache *pc, node *x) {
  if (x->lru_prev)
    x->lru_prev->lru_next = x->lru_next;
  else
    pc->lru_oldest = x->lru_next;
  if (x->lru_next)
    x->lru_next->lru_prev = x->lru_prev;
  else
    pc->lru_newest = x->lru_prev;
  x->lru_prev = x->lru_next = NULL;
}

static void lru_push_newest(ci_prefix_cache *pc, node *x) {
  x->lru_prev = pc->lru_newest;
  x->lru_next = NULL;
  if (pc->lru_newest)
    pc->lru_newest->lru_next = x;
  else
    pc->lru_oldest = x;
  pc->lru_newest = x;
}

static void touch(ci_prefix_cache *pc, node *x) {
  lru_unlink(pc, x);
  lru_push_newest(pc, x);
}

/* Drops x's state snapshot. */
static void drop_state(ci_prefix_cache *pc, node *x) {
  if (!x->state) return;
  ci_kv_cache_state_give(pc->kv, x->state, x->state_slabs);
  x->state = NULL;
  x->state_slabs = 0;
  pc->n_states--;
}

/* Bytes that releasing x's blocks (and state snapshot) would free now. */
static int64_t node_free_bytes(const ci_prefix_cache *pc, const node *x, int n_groups) {
  int64_t bytes = x->state ? ci_kv_cache_state_footprint(pc->kv) : 0;
  for (int g = 0; g < n_groups; g++)
    if (x->refs[g].id >= 0 && ci_kv_pool_refcount(x->refs[g].pool, x->refs[g].id) == 1)
      bytes += ci_kv_pool_block_bytes(x->refs[g].pool);
  return bytes;
}

/* Removes a leaf: unlinks it, releases its blocks, frees it. */
static void evict(ci_prefix_cache *pc, node *x) {
  node **link = bucket_of(pc, x->hash);
  while (*link != x) link = &(*link)->bucket_next;
  *link = x->bucket_next;
  lru_unlink(pc, x);
  if (x->parent) x->parent->n_children--;
  for (int g = 0; g < pc->n_groups; g++)
    if (x->refs[g].id >= 0) {
      ci_kv_pool_release(x->refs[g].pool, x->refs[g].id);
      pc->n_blocks--;
    }
  drop_state(pc, x);
  pc->n_nodes--;
  pc->evictions++;
  free(x->tokens);
  free(x->refs);
  free(x);
}

/* The hook's view of a node. */
static ci_prefix_block describe(const ci_prefix_cache *pc, const node *x) {
  ci_prefix_block b;
  b.key = x->key;
  b.hash[0] = x->hash;
  b.hash[1] = x->hash2;
  b.parent[0] = x->parent ? x->parent->hash : x->key;
  b.parent[1] = x->parent ? x->parent->hash2 : chain2_seed(x->key);
  b.index = x->index;
  b.tokens = x->tokens;
  b.block_tokens = pc->T;
  b.refs = x->refs;
  b.n_groups = pc->n_groups;
  return b;
}

/* A new node for block `index` of a chain (parent NULL at index 0) holding refs (each retained),
 * linked into the table and the LRU list as the newest. NULL with ci_last_error. */
static node *add_node(ci_prefix_cache *pc, uint64_t key, uint64_t hash, uint64_t hash2,
                      node *parent, int64_t index, const int32_t *block,
                      const ci_kv_block_ref *refs) {
  if (pc->n_nodes >= pc->n_buckets && grow_buckets(pc)) return NULL;
  node *x = calloc(1, sizeof *x);
  if (x) {
    x->tokens = malloc((size_t)pc->T * sizeof *x->tokens);
    x->refs = malloc((size_t)pc->n_groups * sizeof *x->refs);
  }
  if (!x || !x->tokens || !x->refs) {
    if (x) {
      free(x->tokens);
      free(x->refs);
    }
    free(x);
    ci_fail("prefix cache: out of memory");
    return NULL;
  }
  x->hash = hash;
  x->hash2 = hash2;
  x->key = key;
  x->parent = parent;
  x->index = index;
  memcpy(x->tokens, block, (size_t)pc->T * sizeof *block);
  for (int g = 0; g < pc->n_groups; g++) {
    x->refs[g] = refs[g];
    if (x->refs[g].id >= 0) {
      ci_kv_pool_retain(x->refs[g].pool, x->refs[g].id);
      pc->n_blocks++;
    }
  }
  node **slot = bucket_of(pc, hash);
  x->bucket_next = *slot;
  *slot = x;
  if (parent) parent->n_children++;
  pc->n_nodes++;
  lru_push_newest(pc, x);
  return x;
}

/* ==== Public ==== */

ci_prefix_cache *ci_prefix_cache_create(ci_kv_cache *kv) {
  ci_prefix_cache *pc = calloc(1, sizeof *pc);
  if (pc) pc->buckets = calloc(256, sizeof *pc->buckets);
  if (!pc || !pc->buckets) {
    free(pc);
    return ci_fail("prefix cache: out of memory"), NULL;
  }
  pc->kv = kv;
  pc->T = kv->block_tokens;
  pc->n_groups = kv->n_groups;
  pc->n_buckets = 256;
  return pc;
}

void ci_prefix_cache_free(ci_prefix_cache *pc) {
  if (!pc) return;
  ci_prefix_cache_trim(pc, -1);
  free(pc->buckets);
  free(pc);
}

int ci_prefix_cache_insert(ci_prefix_cache *pc, uint64_t key, const int32_t *tokens,
                           const ci_kv_seq *seq) {
  const int64_t n_full = seq->n / pc->T;
  uint64_t hash = key, hash2 = chain2_seed(key);
  node *parent = NULL;
  ci_kv_block_ref *refs = malloc((size_t)pc->n_groups * sizeof *refs);
  if (!refs) return ci_fail("prefix cache: out of memory");
  for (int64_t i = 0; i < n_full; i++) {
    const int32_t *block = tokens + i * pc->T;
    hash = block_hash(hash, block, pc->T);
    hash2 = block_hash2(hash2, block, pc->T);
    node *x = find(pc, hash, key, parent, block);
    if (!x) {
      for (int g = 0; g < pc->n_groups; g++) refs[g] = ci_kv_seq_block(seq, g, i);
      x = add_node(pc, key, hash, hash2, parent, i, block, refs);
      if (!x) {
        free(refs);
        return CI_ERR;
      }
      if (pc->hook) {
        const ci_prefix_block b = describe(pc, x);
        x->persisted = pc->hook(pc->hook_arg, &b);
      }
    }
    parent = x;
  }
  free(refs);
  /* parents end up more recent than their children, so leaves go first */
  for (node *x = parent; x; x = x->parent) touch(pc, x);
  return CI_OK;
}

void ci_prefix_cache_set_hook(ci_prefix_cache *pc, ci_prefix_cache_hook hook, void *arg) {
  pc->hook = hook;
  pc->hook_arg = arg;
}

/* The cached node of block n_blocks - 1 of the chain, following it from the start; *found gets
 * how many leading blocks are cached. */
static node *walk(const ci_prefix_cache *pc, uint64_t key, const int32_t *tokens, int64_t n_blocks,
                  int64_t *found) {
  uint64_t hash = key;
  node *x = NULL;
  int64_t n = 0;
  for (; n < n_blocks; n++) {
    const int32_t *block = tokens + n * pc->T;
    hash = block_hash(hash, block, pc->T);
    node *next = find(pc, hash, key, x, block);
    if (!next) break;
    x = next;
  }
  *found = n;
  return x;
}

int64_t ci_prefix_cache_lookup(const ci_prefix_cache *pc, uint64_t key, const int32_t *tokens,
                               int64_t max_blocks) {
  int64_t found = 0;
  walk(pc, key, tokens, max_blocks, &found);
  return found;
}

int ci_prefix_cache_add_block(ci_prefix_cache *pc, uint64_t key, const int32_t *tokens,
                              int64_t index, const ci_kv_block_ref *refs, int persisted) {
  int64_t found = 0;
  node *parent = walk(pc, key, tokens, index, &found);
  if (found != index)
    return ci_fail("prefix cache: block %lld added before its predecessors", (long long)index);
  uint64_t(*hashes)[2] = malloc((size_t)(index + 1) * sizeof *hashes);
  if (!hashes) return ci_fail("prefix cache: out of memory");
  ci_prefix_chain_hashes(key, tokens, pc->T, index + 1, hashes);
  const int32_t *block = tokens + index * pc->T;
  node *x = find(pc, hashes[index][0], key, parent, block);
  if (!x) x = add_node(pc, key, hashes[index][0], hashes[index][1], parent, index, block, refs);
  free(hashes);
  if (!x) return CI_ERR;
  x->persisted = x->persisted || persisted;
  for (node *y = x; y; y = y->parent) touch(pc, y);
  return CI_OK;
}

int64_t ci_prefix_cache_each_unpersisted(ci_prefix_cache *pc, ci_prefix_cache_hook fn, void *arg) {
  int64_t taken = 0;
  /* newest first: parents are more recent than their children */
  for (node *x = pc->lru_newest; x; x = x->lru_prev) {
    if (x->persisted) continue;
    const ci_prefix_block b = describe(pc, x);
    const int took = fn(arg, &b);
    if (took == 0) break;
    x->persisted = 1; /* taken, or (< 0) never to be persisted */
    if (took > 0) taken++;
  }
  return taken;
}

int64_t ci_prefix_cache_attach(ci_prefix_cache *pc, uint64_t key, const int32_t *tokens,
                               int64_t min_p, int64_t max_p, ci_kv_seq *seq, int converted,
                               int64_t conversion_offset) {
  const int64_t max_blocks = max_p / pc->T;
  if (max_blocks < 1 || max_blocks * pc->T < min_p) return 0;
  node **chain = malloc((size_t)max_blocks * sizeof *chain);
  ci_kv_block_ref *refs = malloc((size_t)(max_blocks * pc->n_groups) * sizeof *refs);
  if (!chain || !refs) {
    free(chain);
    free(refs);
    return 0;
  }
  int64_t n = 0;
  uint64_t hash = key;
  for (; n < max_blocks; n++) {
    const int32_t *block = tokens + n * pc->T;
    hash = block_hash(hash, block, pc->T);
    node *x = find(pc, hash, key, n ? chain[n - 1] : NULL, block);
    if (!x) break;
    chain[n] = x;
    memcpy(refs + n * pc->n_groups, x->refs, (size_t)pc->n_groups * sizeof *refs);
  }
  /* the longest run the sequence accepts (sliding groups may lack blocks near a run's end; a
   * hybrid model's run must end at a block holding a state snapshot) */
  int64_t attached = 0;
  for (int64_t j = n; j >= 1 && j * pc->T >= min_p; j--) {
    const int ok = seq->state
                       ? chain[j - 1]->state &&
                             ci_kv_seq_attach_with_state(seq, j, refs, converted, conversion_offset,
                                                         chain[j - 1]->state) == CI_OK
                       : ci_kv_seq_attach(seq, j, refs, converted, conversion_offset) == CI_OK;
    if (ok) {
      attached = j;
      break;
    }
  }
  for (int64_t i = attached - 1; i >= 0; i--) touch(pc, chain[i]);
  free(chain);
  free(refs);
  return attached * pc->T;
}

int ci_prefix_cache_snapshot(ci_prefix_cache *pc, uint64_t key, const int32_t *tokens,
                             const ci_kv_seq *seq, int moving) {
  const int64_t n_full = seq->n / pc->T;
  if (!seq->state || n_full < 1 || seq->n != n_full * pc->T) return CI_OK;
  uint64_t hash = key;
  node *x = NULL;
  for (int64_t i = 0; i < n_full; i++) {
    const int32_t *block = tokens + i * pc->T;
    hash = block_hash(hash, block, pc->T);
    if (!(x = find(pc, hash, key, x, block))) return CI_OK; /* not inserted: nothing to add to */
  }
  if (x->state) return CI_OK;
  ci_backend *be = pc->kv->be;
  /* from the KV arena like the sequences' states; with no run free the block stays without a
   * snapshot (a later request re-runs that part of the prompt) */
  x->state = ci_kv_cache_state_take(pc->kv, &x->state_slabs);
  if (!x->state) {
    x->state_slabs = 0;
    return CI_OK;
  }
  be->ops->copy_bytes(be, x->state, seq->state, (size_t)pc->kv->state_bytes);
  x->state_moved = moving;
  pc->n_states++;
  /* a decoding sequence leaves one snapshot behind it: the previous one it took goes */
  if (moving)
    for (node *up = x->parent; up; up = up->parent)
      if (up->state) {
        if (up->state_moved) drop_state(pc, up);
        break;
      }
  return CI_OK;
}

int64_t ci_prefix_cache_bytes(const ci_prefix_cache *pc) {
  int64_t bytes = 0;
  for (const node *x = pc->lru_oldest; x; x = x->lru_next)
    bytes += node_free_bytes(pc, x, pc->n_groups);
  return bytes;
}

int64_t ci_prefix_cache_trim(ci_prefix_cache *pc, int64_t max_bytes) {
  int64_t bytes = max_bytes < 0 ? INT64_MAX : ci_prefix_cache_bytes(pc), freed = 0;
  while (pc->lru_oldest && (max_bytes < 0 || bytes > max_bytes)) {
    node *x = pc->lru_oldest;
    while (x && x->n_children > 0) x = x->lru_next;
    if (!x) break; /* unreachable: a non-empty forest has a leaf */
    const int64_t b = node_free_bytes(pc, x, pc->n_groups);
    evict(pc, x);
    freed += b;
    if (max_bytes >= 0) bytes -= b;
  }
  return freed;
}

void ci_prefix_cache_get_stats(const ci_prefix_cache *pc, ci_prefix_cache_stats *stats) {
  stats->blocks = pc->n_blocks;
  stats->nodes = pc->n_nodes;
  stats->bytes = ci_prefix_cache_bytes(pc);
  stats->evictions = pc->evictions;
  stats->states = pc->n_states;
}
