/* Device memory for `cinfer fit` (see memory.h). */
#include "hub/memory.h"

#ifdef CINFER_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

#include "base/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The value in kB of "Key:   N kB" in text, in bytes; -1 when absent. */
static int64_t meminfo_field(const char *text, const char *key) {
  const size_t n = strlen(key);
  for (const char *line = text; *line;) {
    if (strncmp(line, key, n) == 0 && line[n] == ':') return strtoll(line + n + 1, NULL, 10) * 1024;
    const char *nl = strchr(line, '\n');
    if (!nl) break;
    line = nl + 1;
  }
  return -1;
}

int ci_meminfo_parse(const char *text, int64_t *available, int64_t *total) {
  *total = meminfo_field(text, "MemTotal");
  *available = meminfo_field(text, "MemAvailable");
  if (*available < 0) {
    const int64_t free_bytes = meminfo_field(text, "MemFree"),
                  cached = meminfo_field(text, "Cached");
    if (free_bytes >= 0) *available = free_bytes + (cached > 0 ? cached : 0);
  }
  if (*total <= 0 || *available < 0)
    return ci_fail("/proc/meminfo has no MemTotal or MemAvailable");
  return CI_OK;
}

/* Reads a small file into buf; returns its length or -1. */
static long read_small(const char *path, char *buf, size_t cap) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  const size_t n = fread(buf, 1, cap - 1, f);
  fclose(f);
  buf[n] = '\0';
  return (long)n;
}

/* Narrows to the cgroup v2 memory limit of this process, when one is set. */
static void apply_cgroup_limit(int64_t *available, int64_t *total) {
  char buf[64];
  if (read_small("/sys/fs/cgroup/memory.max", buf, sizeof buf) <= 0 || !strncmp(buf, "max", 3))
    return;
  const int64_t limit = strtoll(buf, NULL, 10);
  if (limit <= 0) return;
  int64_t used = 0;
  if (read_small("/sys/fs/cgroup/memory.current", buf, sizeof buf) > 0)
    used = strtoll(buf, NULL, 10);
  if (limit < *total) *total = limit;
  if (limit - used < *available) *available = limit - used > 0 ? limit - used : 0;
}

int ci_device_memory(const char *device, int64_t *available, int64_t *total) {
  *available = *total = 0;
  if (device && !strcmp(device, "cuda")) {
#ifdef CINFER_CUDA
    size_t free_bytes = 0, total_bytes = 0;
    if (ci_cuda_device_memory(0, &free_bytes, &total_bytes)) return CI_ERR;
    *available = (int64_t)free_bytes;
    *total = (int64_t)total_bytes;
    return CI_OK;
#else
    return ci_fail("cannot read GPU memory: this build has no CUDA backend (use --device cpu)");
#endif
  }
  if (device && strcmp(device, "cpu") != 0)
    return ci_fail("unknown device \"%s\" (cpu or cuda)", device);
  char text[8192];
  if (read_small("/proc/meminfo", text, sizeof text) <= 0)
    return ci_fail("cannot read /proc/meminfo");
  if (ci_meminfo_parse(text, available, total)) return CI_ERR;
  apply_cgroup_limit(available, total);
  return CI_OK;
}
