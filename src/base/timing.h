/* Timing and process memory probes for benchmarks and stats lines. */
#ifndef CI_BASE_TIMING_H
#define CI_BASE_TIMING_H

#include <stdint.h>

/* Monotonic time in seconds. */
double ci_now_seconds(void);

/* Peak resident set size of this process in bytes. */
int64_t ci_peak_rss_bytes(void);

#endif
