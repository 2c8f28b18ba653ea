/* Scratch arena: chunks of memory handed out front to back; see arena.h. */
#include "base/arena.h"

#include "base/error.h"

#include <stdlib.h>

enum { ARENA_ALIGN = 64, ARENA_MIN_CHUNK = 1 << 16 };

struct ci_arena_chunk {
  ci_arena_chunk *next;
  size_t size; /* usable bytes at data */
  size_t used;
  unsigned char *data; /* ARENA_ALIGN-aligned */
};

static size_t round_up(size_t n) {
  return (n + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
}

/* Adds a chunk of at least `bytes` in front. */
static ci_arena_chunk *add_chunk(ci_arena *arena, size_t bytes) {
  const size_t size = round_up(bytes < ARENA_MIN_CHUNK ? ARENA_MIN_CHUNK : bytes);
  ci_arena_chunk *chunk = malloc(sizeof *chunk);
  unsigned char *data = chunk ? aligned_alloc(ARENA_ALIGN, size) : NULL;
  if (!data) {
    free(chunk);
    ci_fail("out of memory for %zu bytes of scratch", bytes);
    return NULL;
  }
  *chunk = (ci_arena_chunk){.next = arena->chunks, .size = size, .data = data};
  arena->chunks = chunk;
  arena->allocations++;
  return chunk;
}

void ci_arena_init(ci_arena *arena) {
  arena->chunks = NULL;
  arena->allocations = 0;
}

void ci_arena_free(ci_arena *arena) {
  for (ci_arena_chunk *c = arena->chunks, *next; c; c = next) {
    next = c->next;
    free(c->data);
    free(c);
  }
  arena->chunks = NULL;
}

void ci_arena_reset(ci_arena *arena) {
  ci_arena_chunk *head = arena->chunks;
  if (head && head->next) {
    size_t total = 0;
    for (ci_arena_chunk *c = head; c; c = c->next) total += c->size;
    ci_arena_free(arena);
    if (!add_chunk(arena, total)) return; /* the next take allocates again */
  } else if (head) {
    head->used = 0;
  }
}

int ci_arena_reserve(ci_arena *arena, size_t bytes) {
  ci_arena_reset(arena);
  if (arena->chunks && arena->chunks->size >= bytes) return 0;
  ci_arena_free(arena);
  return add_chunk(arena, bytes) ? 0 : -1;
}

void *ci_arena_take(ci_arena *arena, size_t bytes) {
  const size_t need = round_up(bytes ? bytes : 1);
  ci_arena_chunk *chunk = arena->chunks;
  if (!chunk || chunk->size - chunk->used < need) {
    /* the new chunk also covers what this round already took, so that a reset can merge */
    size_t taken = 0;
    for (ci_arena_chunk *c = arena->chunks; c; c = c->next) taken += c->used;
    chunk = add_chunk(arena, taken + need > 2 * need ? taken + need : 2 * need);
    if (!chunk) return NULL;
  }
  void *p = chunk->data + chunk->used;
  chunk->used += need;
  return p;
}
