/* Thread pool: workers spin for a while (1 ms by the clock), then sleep on a
 * condition variable, waiting for the next job generation; tasks are handed out through an
 * atomic counter. Posting a job and waiting for its end touch the lock only when some thread
 * sleeps (a count of sleepers and a flag of the waiting caller, each checked after the other
 * side's store, both sequentially consistent), so a job between busy threads costs a few atomic
 * operations: the many per-layer jobs of a decode step stay cheap. */
#include "base/threadpool.h"

#include "base/spin_wait.h"

#include "base/error.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

struct ci_threadpool {
  int n_threads;
  pthread_t *workers;
  pthread_mutex_t lock;
  pthread_cond_t wake;
  pthread_cond_t done;
  /* current job */
  ci_task_fn fn;
  void *ctx;
  int n_tasks;
  atomic_int next_task;
  atomic_int busy_workers;
  atomic_uint generation;
  atomic_int stopping;
  atomic_int sleepers;       /* workers asleep on `wake` (or about to be) */
  atomic_int caller_waiting; /* the caller sleeps on `done` */
  int64_t spin_ns;           /* how long a thread waits awake before it sleeps */
};

typedef struct {
  ci_threadpool *pool;
  int index;
} worker_arg;

/* How long a thread spins before it sleeps (CINFER_POOL_SPIN_US, or by default 1 ms). A wait
 * longer than the serial stretches between the jobs of a step keeps workers awake; waking sleepers
 * costs a futex call each, which on the 16-core Xeon measured (build/pool_bench, bench/threads.md)
 * made a job after 20 us of serial work cost 63 us at 8 threads and 172 us at 16 with a 20 us spin,
 * 5.5 and 26 us with 1 ms; on 2 Zen 4 cores the 1 ms spin made 1B Gemma q4 decode 1.4-2.4%
 * faster than 20 us (its step has serial stretches beyond 20 us: the 262k-row head's sampling).
 * Past CI_SPIN_PAUSE_NS the wait yields the core, so on a machine shared with other busy processes
 * a descheduled thread of the same job still gets it. */
enum {
  SPIN_US = 1000,       /* the whole wait before sleeping */
  MAX_SPIN_US = 1000000 /* the most CINFER_POOL_SPIN_US may ask */
};

static void run_tasks(ci_threadpool *pool, int thread) {
  for (;;) {
    int task = atomic_fetch_add_explicit(&pool->next_task, 1, memory_order_relaxed);
    if (task >= pool->n_tasks) break;
    pool->fn(pool->ctx, task, thread);
  }
}

/* Spins (ci_spin_more) until the generation differs from `seen` or stopping is set; returns the
 * last generation read. */
static unsigned spin_for_job(ci_threadpool *pool, unsigned seen) {
  ci_spinner s = {0, pool->spin_ns, 0};
  for (;;) {
    unsigned gen = atomic_load_explicit(&pool->generation, memory_order_acquire);
    if (gen != seen || atomic_load_explicit(&pool->stopping, memory_order_relaxed)) return gen;
    if (!ci_spin_more(&s)) return gen;
  }
}

static void *worker_main(void *p) {
  worker_arg arg = *(worker_arg *)p;
  free(p);
  ci_threadpool *pool = arg.pool;
  unsigned seen = 0;
  for (;;) {
    unsigned gen = spin_for_job(pool, seen);
    if (gen == seen && !atomic_load(&pool->stopping)) {
      pthread_mutex_lock(&pool->lock);
      atomic_fetch_add(&pool->sleepers, 1);
      while ((gen = atomic_load(&pool->generation)) == seen && !atomic_load(&pool->stopping))
        pthread_cond_wait(&pool->wake, &pool->lock);
      atomic_fetch_sub(&pool->sleepers, 1);
      pthread_mutex_unlock(&pool->lock);
    }
    if (atomic_load(&pool->stopping)) return NULL;
    seen = gen;
    run_tasks(pool, arg.index);
    if (atomic_fetch_sub(&pool->busy_workers, 1) == 1 && atomic_load(&pool->caller_waiting)) {
      pthread_mutex_lock(&pool->lock);
      pthread_cond_signal(&pool->done);
      pthread_mutex_unlock(&pool->lock);
    }
  }
}

ci_threadpool *ci_threadpool_create(int n_threads) {
  if (n_threads < 1) {
    ci_fail("thread count must be >= 1, got %d", n_threads);
    return NULL;
  }
  ci_threadpool *pool = calloc(1, sizeof *pool);
  if (!pool) {
    ci_fail("out of memory creating thread pool");
    return NULL;
  }
  pool->n_threads = n_threads;
  pool->spin_ns = (int64_t)SPIN_US * 1000;
  const char *spin = getenv("CINFER_POOL_SPIN_US");
  if (spin && *spin) {
    char *end = NULL;
    const long us = strtol(spin, &end, 10);
    if (*end != '\0' || us < 0 || us > MAX_SPIN_US) {
      free(pool);
      ci_fail("CINFER_POOL_SPIN_US must be a whole number of microseconds in [0, %d], got '%s'",
              MAX_SPIN_US, spin);
      return NULL;
    }
    pool->spin_ns = (int64_t)us * 1000;
  }
  pthread_mutex_init(&pool->lock, NULL);
  pthread_cond_init(&pool->wake, NULL);
  pthread_cond_init(&pool->done, NULL);
  pool->workers = calloc((size_t)n_threads, sizeof *pool->workers);
  if (!pool->workers) {
    free(pool);
    ci_fail("out of memory creating thread pool");
    return NULL;
  }
  for (int i = 1; i < n_threads; i++) {
    worker_arg *arg = malloc(sizeof *arg);
    if (arg) *arg = (worker_arg){.pool = pool, .index = i};
    if (!arg || pthread_create(&pool->workers[i], NULL, worker_main, arg) != 0) {
      free(arg);
      pool->n_threads = i;
      ci_threadpool_free(pool);
      ci_fail("cannot start worker thread %d", i);
      return NULL;
    }
  }
  return pool;
}

void ci_threadpool_free(ci_threadpool *pool) {
  if (!pool) return;
  pthread_mutex_lock(&pool->lock);
  atomic_store(&pool->stopping, 1);
  pthread_cond_broadcast(&pool->wake);
  pthread_mutex_unlock(&pool->lock);
  for (int i = 1; i < pool->n_threads; i++) pthread_join(pool->workers[i], NULL);
  pthread_mutex_destroy(&pool->lock);
  pthread_cond_destroy(&pool->wake);
  pthread_cond_destroy(&pool->done);
  free(pool->workers);
  free(pool);
}

int ci_threadpool_size(const ci_threadpool *pool) {
  return pool->n_threads;
}

void ci_threadpool_run(ci_threadpool *pool, int n_tasks, ci_task_fn fn, void *ctx) {
  if (n_tasks <= 0) return;
  if (pool->n_threads == 1 || n_tasks == 1) {
    for (int t = 0; t < n_tasks; t++) fn(ctx, t, 0);
    return;
  }
  pool->fn = fn;
  pool->ctx = ctx;
  pool->n_tasks = n_tasks;
  atomic_store(&pool->next_task, 0);
  atomic_store(&pool->busy_workers, pool->n_threads - 1);
  /* a worker counts itself a sleeper, under the lock, before it reads the generation for the
   * last time: either it sees this job, or this load sees it and the broadcast wakes it */
  atomic_fetch_add(&pool->generation, 1);
  if (atomic_load(&pool->sleepers) > 0) {
    pthread_mutex_lock(&pool->lock);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);
  }
  run_tasks(pool, 0);
  ci_spinner s = {0, pool->spin_ns, 0};
  while (atomic_load_explicit(&pool->busy_workers, memory_order_acquire) != 0) {
    if (ci_spin_more(&s)) continue;
    /* the same handshake the other way: the last worker reads the flag after its decrement */
    pthread_mutex_lock(&pool->lock);
    atomic_store(&pool->caller_waiting, 1);
    while (atomic_load(&pool->busy_workers) != 0) pthread_cond_wait(&pool->done, &pool->lock);
    atomic_store(&pool->caller_waiting, 0);
    pthread_mutex_unlock(&pool->lock);
    return;
  }
}

int ci_cpu_count(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : (int)n;
}
