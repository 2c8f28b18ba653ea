/* KV arena: fixed-size slabs out of one buffer, or allocated one by one, and runs of consecutive
 * slabs for recurrent states (see arena.h). */
#include "kv/arena.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>

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

uint8_t *ci_kv_arena_take_run(ci_kv_arena *arena, int32_t n_slabs) {
  if (!arena->base) return ci_fail("kv arena: runs of slabs need an arena with a budget"), NULL;
  if (n_slabs < 1) return ci_fail("kv arena: an empty run"), NULL;
  /* free_slabs is sorted from the highest index down: a run is n_slabs adjacent entries whose
   * indexes differ by n_slabs - 1; the first one found is the highest */
  for (int32_t i = 0; i + n_slabs <= arena->n_free; i++) {
    if (arena->free_slabs[i] - arena->free_slabs[i + n_slabs - 1] != n_slabs - 1) continue;
    const int32_t first = arena->free_slabs[i + n_slabs - 1];
    memmove(arena->free_slabs + i, arena->free_slabs + i + n_slabs,
            (size_t)(arena->n_free - i - n_slabs) * sizeof *arena->free_slabs);
    arena->n_free -= n_slabs;
    return arena->base + (size_t)first * arena->slab_bytes;
  }
  ci_fail("kv arena: no %d consecutive free slabs of %zu bytes (%d of %d slabs free)", n_slabs,
          arena->slab_bytes, arena->n_free, arena->n_slabs);
  return NULL;
}

void ci_kv_arena_give_run(ci_kv_arena *arena, uint8_t *run, int32_t n_slabs) {
  for (int32_t i = 0; i < n_slabs; i++)
    ci_kv_arena_give(arena, run + (size_t)i * arena->slab_bytes);
}

int64_t ci_kv_arena_slabs_for(const ci_kv_arena *arena, int64_t n_bytes) {
  const int64_t slabs = (n_bytes + (int64_t)arena->slab_bytes - 1) / (int64_t)arena->slab_bytes;
  return slabs > 0 ? slabs : 1;
}

int64_t ci_kv_arena_bytes_taken(const ci_kv_arena *arena) {
  return (int64_t)(arena->n_slabs - arena->n_free) * (int64_t)arena->slab_bytes;
}
