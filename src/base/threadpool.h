/* Thread pool: a fixed set of workers that run parallel-for jobs. The calling thread takes
 * part in every job, so a pool of N threads starts N-1 workers. */
#ifndef CI_BASE_THREADPOOL_H
#define CI_BASE_THREADPOOL_H

typedef struct ci_threadpool ci_threadpool;

/* A job body: runs task `task` (0 <= task < n_tasks) on thread `thread` (0 <= thread <
 * n_threads; 0 is the caller). Tasks of one job may run in any order and concurrently. */
typedef void (*ci_task_fn)(void *ctx, int task, int thread);

/* Creates a pool of n_threads (>= 1) threads. Returns NULL (with ci_last_error) on failure. */
ci_threadpool *ci_threadpool_create(int n_threads);

/* Stops the workers and frees the pool. NULL is a no-op. */
void ci_threadpool_free(ci_threadpool *pool);

/* Number of threads, the caller included. */
int ci_threadpool_size(const ci_threadpool *pool);

/* Runs fn for every task in [0, n_tasks) and returns when all are done. Not reentrant: a job
 * body must not call ci_threadpool_run on the same pool. */
void ci_threadpool_run(ci_threadpool *pool, int n_tasks, ci_task_fn fn, void *ctx);

/* The number of online CPUs (>= 1). */
int ci_cpu_count(void);

#endif
