/* A bounded wait loop for threads that expect a short wait (the thread pool's workers, the ranks
 * of a tensor-parallel model at a barrier): pause instructions for the first PAUSE_NS, then
 * sched_yield (so that a thread the OS has descheduled on a busy machine gets the core) until the
 * limit, after which the caller sleeps. */
#ifndef CI_BASE_SPIN_WAIT_H
#define CI_BASE_SPIN_WAIT_H

#include <sched.h>
#include <stdint.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CI_CPU_RELAX() _mm_pause()
#else
#define CI_CPU_RELAX() ((void)0)
#endif

enum {
  CI_SPIN_PAUSE_NS = 50000, /* the first part of a wait spins on pause, the rest yields */
  CI_SPIN_CHECK_EVERY = 64  /* pauses between clock reads */
};

static inline int64_t ci_spin_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* One wait: start it as {0, limit_ns, 0}. */
typedef struct {
  int64_t start, limit;
  int iterations;
} ci_spinner;

/* Waits a little; 1 while the wait is within its limit, 0 once it is spent (sleep then). */
static inline int ci_spin_more(ci_spinner *s) {
  s->iterations++;
  if (s->start == 0 || s->iterations % CI_SPIN_CHECK_EVERY == 0) {
    const int64_t t = ci_spin_now_ns();
    if (s->start == 0) s->start = t;
    if (t - s->start > s->limit) return 0;
    if (t - s->start > CI_SPIN_PAUSE_NS) {
      s->iterations = CI_SPIN_CHECK_EVERY - 1; /* check the clock after every yield */
      sched_yield();
      return 1;
    }
  }
  CI_CPU_RELAX();
  return 1;
}

#endif
