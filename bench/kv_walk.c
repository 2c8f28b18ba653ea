/* The paged KV cache's memory pattern alone: loads (no arithmetic) over a buffer laid out as the
 * KV pool of a Llama-3.2-1B-geometry model at 16,384 positions in bf16 (1,024 blocks of 512 KiB,
 * each holding every layer's 16 KiB of K rows, then its 16 KiB of V rows, over 8 heads of 16
 * tokens x 128 bytes), in the orders the CPU attention could walk it, over `threads` threads.
 * Prints one JSON object per walk: the best of 3 passes in GB/s. bench/cpu.md ("every KV head of
 * a block in turn") has what it showed.
 *   head       one head at a time over all its blocks (2 KiB of K and 2 KiB of V a block), no
 *              software prefetch; heads split over the threads
 *   head-burst the same with the old kernel's prefetches: the next block into L1 and the one four
 *              ahead into L2, in a burst at each block
 *   block      every head of a block before the next block (one 16 KiB run of K and one of V),
 *              the blocks split over the threads, no software prefetch
 *   block-own  each thread's heads of a block in turn (heads split over the threads)
 * Usage: kv_walk [--threads N] */
#include "base/timing.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

enum { LAYERS = 16, HEADS = 8, TOKENS = 16, ROW = 128, BLOCKS = 1024, MAX_THREADS = 64 };
enum { HEAD_RUN = TOKENS * ROW, K_BLOCK = HEADS * HEAD_RUN, LAYER_BYTES = 2 * K_BLOCK };
#define BLOCK_STRIDE ((size_t)LAYERS * LAYER_BYTES)

typedef enum { WALK_HEAD, WALK_HEAD_BURST, WALK_BLOCK, WALK_BLOCK_OWN } walk;

typedef struct {
  const uint8_t *pool;
  walk order;
  int thread, threads;
  uint64_t sink;
} worker;

/* Sums the 64-bit words of n bytes from p (n a multiple of 64): a load per line, one add each. */
static uint64_t read_run(const uint8_t *p, size_t n, uint64_t acc) {
  for (size_t at = 0; at < n; at += 64) {
    uint64_t v;
    memcpy(&v, p + at, sizeof v);
    acc += v;
  }
  return acc;
}

static void prefetch_run(const uint8_t *p, size_t n, int l2) {
  for (size_t at = 0; at < n; at += 64) {
    if (l2)
      _mm_prefetch((const char *)p + at, _MM_HINT_T1);
    else
      _mm_prefetch((const char *)p + at, _MM_HINT_T0);
  }
}

static void *run_worker(void *arg) {
  worker *w = arg;
  uint64_t acc = 0;
  const int own = HEADS / w->threads > 0 ? HEADS / w->threads : 1;
  for (int layer = 0; layer < LAYERS; layer++) {
    const uint8_t *base = w->pool + (size_t)layer * LAYER_BYTES;
    if (w->order == WALK_HEAD || w->order == WALK_HEAD_BURST) {
      for (int h = w->thread; h < HEADS; h += w->threads)
        for (int b = 0; b < BLOCKS; b++) {
          const uint8_t *k = base + (size_t)b * BLOCK_STRIDE + (size_t)h * HEAD_RUN;
          if (w->order == WALK_HEAD_BURST) {
            if (b + 1 < BLOCKS) {
              prefetch_run(k + BLOCK_STRIDE, HEAD_RUN, 0);
              prefetch_run(k + K_BLOCK + BLOCK_STRIDE, HEAD_RUN, 0);
            }
            if (b + 4 < BLOCKS) {
              prefetch_run(k + 4 * BLOCK_STRIDE, HEAD_RUN, 1);
              prefetch_run(k + K_BLOCK + 4 * BLOCK_STRIDE, HEAD_RUN, 1);
            }
          }
          acc = read_run(k, HEAD_RUN, acc);
          acc = read_run(k + K_BLOCK, HEAD_RUN, acc);
        }
    } else if (w->order == WALK_BLOCK) {
      const int first = BLOCKS * w->thread / w->threads;
      const int last = BLOCKS * (w->thread + 1) / w->threads;
      for (int b = first; b < last; b++)
        acc = read_run(base + (size_t)b * BLOCK_STRIDE, LAYER_BYTES, acc);
    } else if (w->thread * own < HEADS) {
      const size_t first_head = (size_t)w->thread * own * HEAD_RUN;
      for (int b = 0; b < BLOCKS; b++) {
        const uint8_t *k = base + (size_t)b * BLOCK_STRIDE + first_head;
        acc = read_run(k, (size_t)own * HEAD_RUN, acc);
        acc = read_run(k + K_BLOCK, (size_t)own * HEAD_RUN, acc);
      }
    }
  }
  w->sink = acc;
  return NULL;
}

int main(int argc, char **argv) {
  int threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--threads")) {
      threads = atoi(argv[i + 1]);
    } else {
      fprintf(stderr, "kv_walk: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (threads < 1 || threads > MAX_THREADS) {
    fprintf(stderr, "kv_walk: --threads must be 1..%d\n", MAX_THREADS);
    return 2;
  }
  const size_t bytes = (size_t)BLOCKS * BLOCK_STRIDE;
  uint8_t *pool = aligned_alloc(2u << 20, bytes);
  if (!pool) {
    fprintf(stderr, "kv_walk: out of memory\n");
    return 1;
  }
  madvise(pool, bytes, MADV_HUGEPAGE);
  memset(pool, 1, bytes);
  static const char *const names[] = {"head", "head-burst", "block", "block-own"};
  uint64_t sink = 0;
  for (int order = WALK_HEAD; order <= WALK_BLOCK_OWN; order++) {
    double best = 1e30;
    for (int pass = 0; pass < 3; pass++) {
      pthread_t ids[MAX_THREADS];
      worker workers[MAX_THREADS];
      const double start = ci_now_seconds();
      for (int t = 0; t < threads; t++) {
        workers[t] = (worker){.pool = pool, .order = (walk)order, .thread = t, .threads = threads};
        pthread_create(&ids[t], NULL, run_worker, &workers[t]);
      }
      for (int t = 0; t < threads; t++) {
        pthread_join(ids[t], NULL);
        sink += workers[t].sink;
      }
      const double seconds = ci_now_seconds() - start;
      if (seconds < best) best = seconds;
    }
    printf("{\"walk\": \"%s\", \"threads\": %d, \"gb_s\": %.1f, \"sink\": %llu}\n", names[order],
           threads, (double)bytes / best / 1e9, (unsigned long long)(sink & 1));
  }
  free(pool);
  return 0;
}
