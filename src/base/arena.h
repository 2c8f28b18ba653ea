/* Scratch arena: a bump allocator for the buffers one operation needs while it runs (packed
 * activations, partial results). Memory is reused from call to call; it is allocated only when a
 * call needs more than any call before it, and every such allocation is counted, so that a
 * caller can check that its steady state allocates nothing. */
#ifndef CI_BASE_ARENA_H
#define CI_BASE_ARENA_H

#include <stddef.h>
#include <stdint.h>

typedef struct ci_arena_chunk ci_arena_chunk;

typedef struct {
  ci_arena_chunk *chunks; /* newest first; after ci_arena_reset at most one */
  int64_t allocations;    /* chunks allocated so far (growth events) */
} ci_arena;

/* An empty arena (no memory yet). */
void ci_arena_init(ci_arena *arena);

/* Frees every chunk. The arena may be initialised again. */
void ci_arena_free(ci_arena *arena);

/* Makes sure the next calls can take `bytes` in total without allocating (after a reset).
 * Returns 0, or -1 with ci_last_error when memory runs out. */
int ci_arena_reserve(ci_arena *arena, size_t bytes);

/* Forgets every buffer taken since the last reset. When the last round needed more than one
 * chunk, they are replaced by a single chunk of their total size, so that the next round of the
 * same size allocates nothing. */
void ci_arena_reset(ci_arena *arena);

/* A 64-byte aligned buffer of `bytes` (contents undefined), valid until the next reset, or NULL
 * with ci_last_error when memory runs out. */
void *ci_arena_take(ci_arena *arena, size_t bytes);

#endif
