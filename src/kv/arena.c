/* KV arena: fixed-size slabs out of one buffer, or allocated one by one (see arena.h). */
#include "kv/arena.h"

#include "base/error.h"

#include <stdlib.h>

int ci_kv_arena_init(ci_kv_arena *arena, ci_backend *be, size_t slab_bytes, int64_t budget_bytes) {
  *arena = (ci_kv_arena){.be = be, .slab_bytes = slab_bytes};
  if (slab_bytes == 0) return ci_fail("kv arena: empty slabs");
  if (budget_bytes <= 0) return CI_OK;
  const int64_t slabs = (budget_bytes + (int64_t)slab_bytes - 1) / (int64_t)slab_bytes;
  if (slabs > INT32_MAX / 2) return ci_fail("kv arena: budget too large");
  arena->free_slabs = malloc((size_t)slabs * sizeof *arena->free_slabs);
  if (!arena->free_slabs) return ci_fail("kv arena: out of memory");
  arena->base = be->ops->alloc_uninitialized(be, (size_t)slabs * slab_bytes);
  if (!arena->base) {
    free(arena->free_slabs);
    return ci_fail_context("kv arena of %lld bytes", (long long)(slabs * (int64_t)slab_bytes));
  }
  arena->allocations = 1;
  arena->n_slabs = (int32_t)slabs;
  for (int32_t i = 0; i < arena->n_slabs; i++) arena->free_slabs[i] = arena->n_slabs - 1 - i;
  arena->n_free = arena->n_slabs;
  return CI_OK;
}

void ci_kv_arena_destroy(ci_kv_arena *arena) {
  if (arena->base) arena->be->ops->release(arena->be, arena->base);
  free(arena->free_slabs);
  *arena = (ci_kv_arena){0};
}

uint8_t *ci_kv_arena_take(ci_kv_arena *arena) {
  if (!arena->base) {
    uint8_t *slab = arena->be->ops->alloc_uninitialized(arena->be, arena->slab_bytes);
    if (slab) arena->allocations++;
    return slab;
  }
  if (arena->n_free == 0) {
    ci_fail("kv arena: all %d slabs of %zu bytes are in use", arena->n_slabs, arena->slab_bytes);
    return NULL;
  }
  return arena->base + (size_t)arena->free_slabs[--arena->n_free] * arena->slab_bytes;
}

void ci_kv_arena_give(ci_kv_arena *arena, uint8_t *slab) {
  const int32_t index = (int32_t)((size_t)(slab - arena->base) / arena->slab_bytes);
  /* keep the stack sorted so that the lowest slab is taken first (slabs stay packed) */
  int32_t i = arena->n_free++;
  while (i > 0 && arena->free_slabs[i - 1] < index) {
    arena->free_slabs[i] = arena->free_slabs[i - 1];
    i--;
  }
  arena->free_slabs[i] = index;
}
