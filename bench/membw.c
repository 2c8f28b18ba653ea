/* Memory read-bandwidth probe: streams a large buffer through the widest available vector loads
 * (AVX-512, AVX2 or plain C) on 1 thread and on N threads, and prints the best rates as JSON.
 * Usage: membw [--mib SIZE_MIB] [--threads N] [--reps R] */
#include "base/error.h"
#include "base/threadpool.h"

#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef uint64_t (*read_fn)(const uint8_t *p, size_t n);

/* The read kernels XOR every 64-bit word into a few accumulators: one-cycle ops, so the loop is
 * bound by loads. n is a multiple of 256 bytes; p is 64-byte aligned. */
__attribute__((target("avx512f"))) static uint64_t read_avx512(const uint8_t *p, size_t n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < n; i += 256) {
    a0 = _mm512_xor_si512(a0, _mm512_load_si512((const void *)(p + i)));
    a1 = _mm512_xor_si512(a1, _mm512_load_si512((const void *)(p + i + 64)));
    a2 = _mm512_xor_si512(a2, _mm512_load_si512((const void *)(p + i + 128)));
    a3 = _mm512_xor_si512(a3, _mm512_load_si512((const void *)(p + i + 192)));
  }
  a0 = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
  uint64_t out[8];
  _mm512_storeu_si512((void *)out, a0);
  return out[0] ^ out[1] ^ out[2] ^ out[3] ^ out[4] ^ out[5] ^ out[6] ^ out[7];
}

__attribute__((target("avx2"))) static uint64_t read_avx2(const uint8_t *p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < n; i += 128) {
    a0 = _mm256_xor_si256(a0, _mm256_load_si256((const __m256i *)(p + i)));
    a1 = _mm256_xor_si256(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
    a2 = _mm256_xor_si256(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
    a3 = _mm256_xor_si256(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
  }
  a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
  uint64_t out[4];
  _mm256_storeu_si256((__m256i *)out, a0);
  return out[0] ^ out[1] ^ out[2] ^ out[3];
}

static uint64_t read_scalar(const uint8_t *p, size_t n) {
  const uint64_t *q = (const uint64_t *)(const void *)p;
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  for (size_t i = 0; i < n / 8; i += 4) {
    a0 ^= q[i];
    a1 ^= q[i + 1];
    a2 ^= q[i + 2];
    a3 ^= q[i + 3];
  }
  return a0 ^ a1 ^ a2 ^ a3;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
  const uint8_t *buf;
  size_t bytes; /* whole buffer */
  int n_tasks;  /* slices */
  read_fn fn;
  volatile uint64_t sink[256]; /* one per task, so the reads cannot be optimised away */
} job;

static void read_slice(void *ctx, int task, int thread) {
  job *j = ctx;
  const size_t slice = j->bytes / (size_t)j->n_tasks / 256 * 256;
  j->sink[task] ^= j->fn(j->buf + (size_t)task * slice, slice);
}

/* Best-of-reps read rate in GB/s (1e9 bytes) of the buffer split over the pool's threads. */
static double measure(ci_threadpool *pool, job *j, int reps) {
  const int n = ci_threadpool_size(pool);
  j->n_tasks = n;
  const size_t slice = j->bytes / (size_t)n / 256 * 256;
  ci_threadpool_run(pool, n, read_slice, j); /* warm-up: TLB, page tables, thread start */
  double best = 0.0;
  for (int r = 0; r < reps; r++) {
    const double t0 = now_s();
    ci_threadpool_run(pool, n, read_slice, j);
    const double dt = now_s() - t0;
    const double gbs = (double)(slice * (size_t)n) / dt / 1e9;
    if (gbs > best) best = gbs;
  }
  return best;
}

static int parse_int(const char *s, int lo, int hi, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (*s == '\0' || *end != '\0' || v < lo || v > hi) return -1;
  *out = (int)v;
  return 0;
}

int main(int argc, char **argv) {
  int mib = 1024, threads = ci_cpu_count(), reps = 5;
  for (int i = 1; i < argc; i++) {
    int *dst = NULL, lo = 1, hi = 1 << 20;
    if (strcmp(argv[i], "--mib") == 0) {
      dst = &mib;
      lo = 16;
    } else if (strcmp(argv[i], "--threads") == 0) {
      dst = &threads;
      hi = 256;
    } else if (strcmp(argv[i], "--reps") == 0) {
      dst = &reps;
    }
    if (!dst || i + 1 >= argc || parse_int(argv[++i], lo, hi, dst) != 0) {
      fprintf(stderr, "usage: membw [--mib SIZE_MIB>=16] [--threads N<=256] [--reps R]\n");
      return 2;
    }
  }
  __builtin_cpu_init();
  read_fn fn = read_scalar;
  const char *isa = "scalar";
  if (__builtin_cpu_supports("avx512f")) {
    fn = read_avx512;
    isa = "avx512";
  } else if (__builtin_cpu_supports("avx2")) {
    fn = read_avx2;
    isa = "avx2";
  }
  const size_t bytes = (size_t)mib << 20;
  uint8_t *buf = aligned_alloc(4096, bytes);
  if (!buf) {
    fprintf(stderr, "membw: cannot allocate %d MiB\n", mib);
    return 1;
  }
  for (size_t i = 0; i < bytes; i += 8) { /* touch every page with non-zero data */
    const uint64_t v = i * 0x9e3779b97f4a7c15ull;
    memcpy(buf + i, &v, 8);
  }
  job j = {.buf = buf, .bytes = bytes, .fn = fn};
  ci_threadpool *one = ci_threadpool_create(1);
  ci_threadpool *many = ci_threadpool_create(threads);
  if (!one || !many) {
    fprintf(stderr, "membw: %s\n", ci_last_error());
    return 1;
  }
  const double gbs_1t = measure(one, &j, reps);
  const double gbs_nt = measure(many, &j, reps);
  printf("{\"read_gbs_1t\": %.2f, \"read_gbs_nt\": %.2f, \"threads\": %d, \"buffer_mib\": %d, "
         "\"isa\": \"%s\"}\n",
         gbs_1t, gbs_nt, threads, mib, isa);
  ci_threadpool_free(one);
  ci_threadpool_free(many);
  free(buf);
  return 0;
}
