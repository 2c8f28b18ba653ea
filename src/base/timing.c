/* Timing and process memory probes (see timing.h). */
#include "base/timing.h"

#include <sys/resource.h>
#include <time.h>

double ci_now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int64_t ci_peak_rss_bytes(void) {
  struct rusage usage;
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return (int64_t)usage.ru_maxrss * 1024;
}
