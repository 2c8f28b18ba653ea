/* KV arena: the memory every KV block lives in, as slabs of one size. With a budget, it is one
 * backend buffer allocated when the cache is created, so that no block ever moves and a step
 * never allocates; without one, slabs are allocated as pools first need them (and kept), which
 * still never moves a block. Pools of every layer group and format take whole slabs and give
 * them back when they empty, so formats share the budget. A hybrid model's recurrent states take
 * runs of consecutive slabs (from the high end, so that the single slabs pools take from the low
 * end rarely split them) and give them back when their sequence goes. */
#ifndef CI_KV_ARENA_H
#define CI_KV_ARENA_H

#include "tensor/backend.h"

#include <stddef.h>
#include <stdint.h>

typedef struct {
  ci_backend *be;
  size_t slab_bytes;
  uint8_t *base;       /* n_slabs * slab_bytes; NULL without a budget */
  int32_t n_slabs;     /* slabs of base */
  int32_t *free_slabs; /* stack of free slab indexes of base, lowest on top */
  int32_t n_free;
  int64_t allocations; /* backend allocations made (1 with a budget) */
} ci_kv_arena;

/* Sets up an arena of slabs of slab_bytes. budget_bytes > 0 allocates ceil(budget / slab) slabs
 * at once; 0 allocates slabs on demand. Returns CI_OK or CI_ERR. */
int ci_kv_arena_init(ci_kv_arena *arena, ci_backend *be, size_t slab_bytes, int64_t budget_bytes);

/* Frees the storage; every slab must have been returned (or the cache is going away). */
void ci_kv_arena_destroy(ci_kv_arena *arena);

/* A slab, or NULL with ci_last_error when the budget is used up (or memory runs out). */
uint8_t *ci_kv_arena_take(ci_kv_arena *arena);

/* Gives a slab back. Without a budget slabs are kept by their pools, so this is only called on
 * an arena with a budget. */
void ci_kv_arena_give(ci_kv_arena *arena, uint8_t *slab);

/* A run of n_slabs consecutive slabs (the highest such run of free slabs), or NULL with
 * ci_last_error when no run that long is free. Only on an arena with a budget. */
uint8_t *ci_kv_arena_take_run(ci_kv_arena *arena, int32_t n_slabs);

/* Gives back a run of n_slabs slabs from ci_kv_arena_take_run. */
void ci_kv_arena_give_run(ci_kv_arena *arena, uint8_t *run, int32_t n_slabs);

/* Slabs of n_bytes rounded up (at least 1). */
int64_t ci_kv_arena_slabs_for(const ci_kv_arena *arena, int64_t n_bytes);

/* Bytes of the slabs taken (blocks and runs) of an arena with a budget; 0 without one. */
int64_t ci_kv_arena_bytes_taken(const ci_kv_arena *arena);

#endif
