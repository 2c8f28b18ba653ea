/* The memory a model may use on a device: this machine's RAM for the CPU (/proc/meminfo,
 * narrowed by a cgroup v2 limit when one is set). The hook for GPU memory lives here too: a
 * device whose memory cinfer cannot read yet is an error naming it. */
#ifndef CI_HUB_MEMORY_H
#define CI_HUB_MEMORY_H

#include <stdint.h>

/* Fills *available (what can be allocated now: MemAvailable) and *total (MemTotal) in bytes for
 * device "cpu" (NULL means cpu), or the free and total memory of GPU 0 for "cuda". Returns 0;
 * CI_ERR with a message for an unknown device, for "cuda" without a GPU or without the CUDA
 * backend, or when /proc/meminfo cannot be read. */
int ci_device_memory(const char *device, int64_t *available, int64_t *total);

/* Parses the text of /proc/meminfo: MemAvailable and MemTotal in bytes (available falls back to
 * MemFree + Cached on kernels without MemAvailable). Returns 0 or CI_ERR. */
int ci_meminfo_parse(const char *text, int64_t *available, int64_t *total);

#endif
