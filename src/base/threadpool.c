/* Thread pool: workers spin briefly, then sleep on a condition variable, waiting for the next
 * job generation; tasks are handed out through an atomic counter. Short spins keep the many
 * small per-layer jobs of a decode step cheap to dispatch. */
#include "base/threadpool.h"

#include "base/error.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
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
};

typedef struct {
  ci_threadpool *pool;
  int index;
} worker_arg;

static void run_tasks(ci_threadpool *pool, int thread) {
  for (;;) {
    int task = atomic_fetch_add_explicit(&pool->next_task, 1, memory_order_relaxed);
    if (task >= pool->n_tasks) break;
    pool->fn(pool->ctx, task, thread);
  }
}

enum { SPIN_ITERATIONS = 20000 };

static void *worker_main(void *p) {
  worker_arg arg = *(worker_arg *)p;
  free(p);
  ci_threadpool *pool = arg.pool;
  unsigned seen = 0;
  for (;;) {
    unsigned gen = atomic_load_explicit(&pool->generation, memory_order_acquire);
    for (int spin = 0; gen == seen && spin < SPIN_ITERATIONS; spin++) {
      if (atomic_load_explicit(&pool->stopping, memory_order_relaxed)) return NULL;
      gen = atomic_load_explicit(&pool->generation, memory_order_acquire);
    }
    if (gen == seen) {
      pthread_mutex_lock(&pool->lock);
      while ((gen = atomic_load(&pool->generation)) == seen && !atomic_load(&pool->stopping))
        pthread_cond_wait(&pool->wake, &pool->lock);
      pthread_mutex_unlock(&pool->lock);
    }
    if (atomic_load(&pool->stopping)) return NULL;
    seen = gen;
    run_tasks(pool, arg.index);
    if (atomic_fetch_sub_explicit(&pool->busy_workers, 1, memory_order_acq_rel) == 1) {
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
  pthread_mutex_lock(&pool->lock);
  atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
  pthread_cond_broadcast(&pool->wake);
  pthread_mutex_unlock(&pool->lock);
  run_tasks(pool, 0);
  for (int spin = 0; spin < SPIN_ITERATIONS * 10; spin++)
    if (atomic_load_explicit(&pool->busy_workers, memory_order_acquire) == 0) return;
  pthread_mutex_lock(&pool->lock);
  while (atomic_load(&pool->busy_workers) != 0) pthread_cond_wait(&pool->done, &pool->lock);
  pthread_mutex_unlock(&pool->lock);
}

int ci_cpu_count(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : (int)n;
}
