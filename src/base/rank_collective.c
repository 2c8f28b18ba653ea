/* Collectives between tensor-parallel ranks in one address space (see rank_collective.h): a
 * generation-counting barrier whose waiters spin a while (base/spin_wait.h: a rank's host thread
 * reaches the next barrier within microseconds when it has a core) before they sleep on a
 * condition variable, and reductions that publish each rank's buffer before the barrier and read
 * them after it. */
#include "base/rank_collective.h"

#include "base/error.h"
#include "base/spin_wait.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* How long a rank waits awake at a barrier before it sleeps. */
enum { SPIN_NS = 1000000 };

struct ci_rank_collective {
  int world;
  pthread_mutex_t mu; /* guards sleeping: the last arrival and an abort wake the sleepers */
  pthread_cond_t cv;
  atomic_int arrived;               /* ranks at the barrier of this generation */
  atomic_uint_least64_t generation; /* barriers completed */
  atomic_int aborted;
  float *bufs[CI_MAX_RANKS]; /* each rank's buffer of the current call */
  float *dst;                /* rank 0's gather destination of the current call */
  void *published[CI_MAX_RANKS];
};

int ci_rank_collective_world(const ci_rank_collective *c) {
  return c->world;
}

void ci_rank_collective_publish(ci_rank_collective *c, int rank, void *ptr) {
  c->published[rank] = ptr;
}

void *ci_rank_collective_peer(const ci_rank_collective *c, int rank) {
  return c->published[rank];
}

ci_rank_collective *ci_rank_collective_create(int world) {
  if (world < 1 || world > CI_MAX_RANKS)
    return ci_fail("rank collective: %d ranks (1 to %d)", world, CI_MAX_RANKS), NULL;
  ci_rank_collective *c = calloc(1, sizeof *c);
  if (!c) return ci_fail("out of memory"), NULL;
  c->world = world;
  if (pthread_mutex_init(&c->mu, NULL)) {
    free(c);
    return ci_fail("rank collective: cannot create a mutex"), NULL;
  }
  if (pthread_cond_init(&c->cv, NULL)) {
    pthread_mutex_destroy(&c->mu);
    free(c);
    return ci_fail("rank collective: cannot create a condition variable"), NULL;
  }
  return c;
}

void ci_rank_collective_free(ci_rank_collective *c) {
  if (!c) return;
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

void ci_rank_collective_reset(ci_rank_collective *c) {
  atomic_store(&c->aborted, 0);
  atomic_store(&c->arrived, 0);
}

void ci_rank_collective_abort(ci_rank_collective *c) {
  pthread_mutex_lock(&c->mu);
  atomic_store(&c->aborted, 1);
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

int ci_rank_collective_barrier(ci_rank_collective *c) {
  if (c->world == 1) return CI_OK;
  if (atomic_load(&c->aborted)) return ci_fail("tensor parallel: another rank failed");
  const uint64_t generation = atomic_load(&c->generation);
  if (atomic_fetch_add(&c->arrived, 1) + 1 == c->world) {
    /* the last to arrive: the count restarts before anyone can see the new generation */
    atomic_store(&c->arrived, 0);
    pthread_mutex_lock(&c->mu);
    atomic_fetch_add(&c->generation, 1);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return CI_OK;
  }
  ci_spinner spin = {0, SPIN_NS, 0};
  while (atomic_load(&c->generation) == generation && !atomic_load(&c->aborted))
    if (!ci_spin_more(&spin)) {
      pthread_mutex_lock(&c->mu);
      while (atomic_load(&c->generation) == generation && !atomic_load(&c->aborted))
        pthread_cond_wait(&c->cv, &c->mu);
      pthread_mutex_unlock(&c->mu);
    }
  /* woken by an abort, not by the last rank */
  return atomic_load(&c->generation) == generation ? ci_fail("tensor parallel: another rank failed")
                                                   : CI_OK;
}

int ci_rank_collective_all_reduce(ci_rank_collective *c, int rank, float *buf, int64_t n) {
  if (c->world == 1) return CI_OK;
  c->bufs[rank] = buf;
  if (ci_rank_collective_barrier(c)) return CI_ERR;
  /* this rank's slice: element i is read and written by its owner alone */
  const int64_t first = n * rank / c->world, last = n * (rank + 1) / c->world;
  for (int64_t i = first; i < last; i++) {
    float sum = c->bufs[0][i];
    for (int r = 1; r < c->world; r++) sum += c->bufs[r][i];
    for (int r = 0; r < c->world; r++) c->bufs[r][i] = sum;
  }
  /* nobody publishes the next call's buffer before every slice is written */
  return ci_rank_collective_barrier(c);
}

int ci_rank_collective_gather_cols(ci_rank_collective *c, int rank, float *dst, const float *src,
                                   int64_t rows, int64_t cols, int64_t col0, int64_t dst_cols) {
  if (rank == 0) c->dst = dst;
  if (ci_rank_collective_barrier(c)) return CI_ERR;
  float *out = c->dst;
  if (out != src || col0 != 0 || cols != dst_cols)
    for (int64_t r = 0; r < rows; r++)
      memcpy(out + r * dst_cols + col0, src + r * cols, (size_t)cols * sizeof(float));
  return ci_rank_collective_barrier(c);
}
