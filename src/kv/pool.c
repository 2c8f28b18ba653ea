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

/* One copy of the pool's storage: c = 0 the pool's own, c >= 1 mirror c - 1. */
typedef struct {
  ci_backend *be;
  ci_kv_arena *arena;
  uint8_t ***slabs, ***slabs_device;
} storage;

static storage storage_of(ci_kv_pool *pool, int c) {
  if (c == 0) return (storage){pool->be, pool->arena, &pool->slabs, &pool->slabs_device};
  ci_kv_pool_mirror *m = &pool->mirrors[c - 1];
  return (storage){m->be, m->arena, &m->slabs, &m->slabs_device};
}

/* Grows a mirror's slot table from `from` slots to n (NULL slabs). */
static int grow_mirror_slots(ci_kv_pool_mirror *m, int32_t from, int32_t n) {
  uint8_t **slabs = realloc(m->slabs, (size_t)n * sizeof *slabs);
  if (!slabs) return ci_fail("kv pool: out of memory");
  m->slabs = slabs;
  for (int32_t s = from; s < n; s++) slabs[s] = NULL;
  if (m->be->host_visible) m->slabs_device = slabs;
  return CI_OK;
}

/* Grows the slab slot table to n slots (no slab taken). */
static int grow_slots(ci_kv_pool *pool, int32_t n) {
  if (n <= pool->n_slots) return CI_OK;
  if ((int64_t)n * pool->blocks_per_slab > INT32_MAX) return ci_fail("kv pool: too many blocks");
  for (int i = 0; i < pool->n_mirrors; i++)
    if (grow_mirror_slots(&pool->mirrors[i], pool->n_slots, n)) return CI_ERR;
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

/* A device reads a copy's slot table from its own memory: one copy, kept current slab by slab. */
static int fit_device_table(ci_kv_pool *pool, storage st) {
  if (st.be->host_visible || pool->n_slots == 0) return CI_OK;
  if (*st.slabs_device) st.be->ops->release(st.be, *st.slabs_device);
  *st.slabs_device = st.be->ops->alloc(st.be, (size_t)pool->n_slots * sizeof(uint8_t *));
  if (!*st.slabs_device) return CI_ERR;
  st.be->ops->upload(st.be, *st.slabs_device, *st.slabs, (size_t)pool->n_slots * sizeof(uint8_t *));
  return CI_OK;
}

int ci_kv_pool_fit_arena(ci_kv_pool *pool) {
  /* with a budget every slab of the arena may end up here: the slot table never grows */
  if (pool->arena->n_slabs > 0 && grow_slots(pool, pool->arena->n_slabs)) return CI_ERR;
  for (int c = 0; c <= pool->n_mirrors; c++)
    if (fit_device_table(pool, storage_of(pool, c))) return CI_ERR;
  return CI_OK;
}

int ci_kv_pool_add_mirror(ci_kv_pool *pool, ci_backend *be, ci_kv_arena *arena) {
  if (pool->n_held > 0) return ci_fail("kv pool: ranks are added before the first slab");
  if (pool->n_mirrors == CI_MAX_RANKS - 1) return ci_fail("kv pool: too many ranks");
  if (arena->slab_bytes != pool->arena->slab_bytes)
    return ci_fail("kv pool: a rank's slabs differ in size");
  ci_kv_pool_mirror *m = &pool->mirrors[pool->n_mirrors];
  *m = (ci_kv_pool_mirror){.be = be, .arena = arena};
  if (pool->n_slots > 0 && grow_mirror_slots(m, 0, pool->n_slots)) return CI_ERR;
  pool->n_mirrors++;
  return fit_device_table(pool, storage_of(pool, pool->n_mirrors));
}

/* Publishes slot `slot` of the slab tables to the backends' copies (at once: a slab taken for
 * this step's blocks must be there before the step's kernels run). */
static void publish_slot(ci_kv_pool *pool, int32_t slot) {
  for (int c = 0; c <= pool->n_mirrors; c++) {
    const storage st = storage_of(pool, c);
    if (*st.slabs_device != *st.slabs)
      st.be->ops->upload(st.be, *st.slabs_device + slot, *st.slabs + slot, sizeof(uint8_t *));
  }
}

void ci_kv_pool_destroy(ci_kv_pool *pool) {
  for (int c = pool->n_mirrors; c >= 0; c--) {
    const storage st = storage_of(pool, c);
    for (int32_t s = 0; s < pool->n_slots; s++)
      if ((*st.slabs)[s]) {
        if (st.arena->base)
          ci_kv_arena_give(st.arena, (*st.slabs)[s]);
        else
          st.be->ops->release(st.be, (*st.slabs)[s]);
      }
    if (*st.slabs_device && *st.slabs_device != *st.slabs)
      st.be->ops->release(st.be, *st.slabs_device);
    if (c > 0) free(*st.slabs);
  }
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
  for (int c = 0; c <= pool->n_mirrors; c++) {
    const storage st = storage_of(pool, c);
    uint8_t *slab = ci_kv_arena_take(st.arena);
    if (!slab) { /* the copies taken so far go back */
      while (c-- > 0) {
        const storage back = storage_of(pool, c);
        if (back.arena->base)
          ci_kv_arena_give(back.arena, (*back.slabs)[slot]);
        else
          back.be->ops->release(back.be, (*back.slabs)[slot]);
        (*back.slabs)[slot] = NULL;
      }
      return -1;
    }
    (*st.slabs)[slot] = slab;
  }
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
  const size_t bytes = pool->block_stride;
  for (int c = 0; c <= pool->n_mirrors; c++) {
    const storage st = storage_of(pool, c);
    uint8_t *const *slabs = *st.slabs;
    const int32_t per = pool->blocks_per_slab;
    st.be->ops->copy_bytes(st.be, slabs[copy / per] + (size_t)(copy % per) * bytes,
                           slabs[id / per] + (size_t)(id % per) * bytes, bytes);
  }
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
    for (int c = 0; c <= pool->n_mirrors; c++) {
      const storage st = storage_of(pool, c);
      ci_kv_arena_give(st.arena, (*st.slabs)[slot]);
      (*st.slabs)[slot] = NULL;
    }
    pool->n_held--;
    /* The backend's copy keeps the old address until the slot is taken again. A release can
     * come while a step's work is still queued behind it (a sliding window's blocks are
     * released when the step commits its rows, before a device runs the recorded step), and
     * that work still reads these blocks; an upload runs at once, so a NULL published here
     * reached the device first (an illegal address in kv_store and attention on the GPU). No
     * block table names the slot's blocks after this step. */
  }
}
