/* Thread-pool dispatch cost: the time of one parallel-for job whose tasks do (almost) nothing,
 * back to back and with a stretch of serial work between jobs (as a decode step's ops leave
 * between its matmuls), minus that serial work. Prints one JSON object.
 * Usage: pool_bench [--threads N] [--jobs J] [--gap-us G] */
#include "base/threadpool.h"
#include "base/timing.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A task's work: a few adds, so that the job is all dispatch and barrier. */
static void tiny_task(void *ctx, int task, int thread) {
  volatile int *sink = ctx;
  sink[thread * 16] += task;
}

/* Serial work of about `us` microseconds on the calling thread (a dependent chain). */
static double spin_work(double us) {
  const double end = ci_now_seconds() + us * 1e-6;
  double x = 1.0;
  while (ci_now_seconds() < end) x = x * 1.0000001 + 1e-9;
  return x;
}

/* Median microseconds per job of `jobs` jobs, each after `gap_us` of serial work (the gap not
 * counted), over 5 repetitions. */
static double per_job_us(ci_threadpool *pool, int jobs, double gap_us, int *sink) {
  double runs[5];
  const int tasks = 4 * ci_threadpool_size(pool);
  for (int rep = 0; rep < 5; rep++) {
    double busy = 0.0;
    for (int j = 0; j < jobs; j++) {
      if (gap_us > 0) spin_work(gap_us);
      const double t0 = ci_now_seconds();
      ci_threadpool_run(pool, tasks, tiny_task, sink);
      busy += ci_now_seconds() - t0;
    }
    runs[rep] = busy / jobs * 1e6;
  }
  for (int i = 1; i < 5; i++)
    for (int j = i; j > 0 && runs[j] < runs[j - 1]; j--) {
      const double t = runs[j];
      runs[j] = runs[j - 1];
      runs[j - 1] = t;
    }
  return runs[2];
}

int main(int argc, char **argv) {
  int threads = ci_cpu_count(), jobs = 2000;
  double gap_us = 20.0;
  for (int i = 1; i < argc; i++) {
    if (i + 1 >= argc) {
      fprintf(stderr, "pool_bench: %s needs a value\n", argv[i]);
      return 2;
    }
    if (!strcmp(argv[i], "--threads"))
      threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--jobs"))
      jobs = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--gap-us"))
      gap_us = atof(argv[++i]);
    else {
      fprintf(stderr, "pool_bench: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (threads < 1 || jobs < 1 || gap_us < 0) {
    fprintf(stderr, "pool_bench: --threads and --jobs must be >= 1, --gap-us >= 0\n");
    return 2;
  }
  ci_threadpool *pool = ci_threadpool_create(threads);
  int *sink = calloc((size_t)threads * 16, sizeof *sink);
  if (!pool || !sink) {
    fprintf(stderr, "pool_bench: cannot create a pool of %d threads\n", threads);
    free(sink);
    ci_threadpool_free(pool);
    return 1;
  }
  const double back_to_back = per_job_us(pool, jobs, 0.0, sink);
  const double after_gap = per_job_us(pool, jobs / 4 > 0 ? jobs / 4 : 1, gap_us, sink);
  printf("{\"threads\": %d, \"jobs\": %d, \"us_per_job\": %.2f, \"gap_us\": %.1f, "
         "\"us_per_job_after_gap\": %.2f}\n",
         threads, jobs, back_to_back, gap_us, after_gap);
  free(sink);
  ci_threadpool_free(pool);
  return 0;
}
