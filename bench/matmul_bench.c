/* One weight matrix's matmul on the CPU, as a decode step runs it (ci_cpu_matmul_segments_multi,
 * the thread pool, the ISA's kernels): x of --m rows times W [--rows, --cols] of --dtype (bf16,
 * or MLX affine q8/q4 with bf16 scales and biases in groups of --group), random weights (their
 * codes in anonymous memory advised for transparent huge pages, as the model loader places
 * them). --copies distinct matrices are used in turn, so that with many copies (the
 * default: enough for 400 MB) every call streams its weights from DRAM, and with --copies 1 a
 * small matrix stays in cache and the figure is the kernel's compute. Prints one JSON object: the
 * best of --rounds passes over the copies, microseconds per call, the weight bytes (codes, scales
 * and biases) read per second, and a hash of the first copy's output bits (to check that a change
 * to a kernel keeps them).
 * Usage: matmul_bench [--rows N] [--cols K] [--dtype bf16|q8|q4] [--group 32|64|128] [--m M]
 *        [--threads T] [--copies C] [--rounds R] [--precision fast|exact] */
#include "backend/cpu/kernels.h"
#include "base/arena.h"
#include "base/error.h"
#include "base/threadpool.h"
#include "base/timing.h"
#include "tensor/tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* xorshift64: the random bytes of the weights and x */
static uint64_t next_random(uint64_t *state) {
  uint64_t x = *state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *state = x;
}

/* `count` bf16 values of the exponent in `exponent_bits`, a random mantissa and, when
 * `signed_values`, a random sign (finite, of one binade). */
static void fill_bf16(uint16_t *out, size_t count, uint16_t exponent_bits, int signed_values,
                      uint64_t *state) {
  for (size_t i = 0; i < count; i++) {
    const uint64_t r = next_random(state);
    out[i] = (uint16_t)(exponent_bits | (r & 0x7f) | (signed_values && (r & 0x100) ? 0x8000 : 0));
  }
}

/* Rounds a weight allocation up to whole 2 MiB pages. */
static size_t huge_round(size_t bytes) {
  const size_t huge = (size_t)2 << 20;
  return (bytes + huge - 1) / huge * huge;
}

/* Weight codes in anonymous memory advised for transparent huge pages, as the model loader
 * places them, so that the kernels see the TLB behaviour of a loaded model. */
static uint8_t *alloc_weights(size_t bytes) {
  void *p =
      mmap(NULL, huge_round(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  madvise(p, huge_round(bytes), MADV_HUGEPAGE); /* advice only */
  return p;
}

int main(int argc, char **argv) {
  int64_t rows = 4096, cols = 4096;
  int group = 64, m = 1, threads = 2, copies = 0, rounds = 5, fast = 1;
  const char *dtype_name = "q4";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--rows"))
      rows = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "--cols"))
      cols = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "--dtype"))
      dtype_name = argv[i + 1];
    else if (!strcmp(argv[i], "--group"))
      group = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--m"))
      m = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--threads"))
      threads = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--copies"))
      copies = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--rounds"))
      rounds = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--precision"))
      fast = strcmp(argv[i + 1], "exact") != 0;
    else {
      fprintf(stderr, "matmul_bench: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  ci_dtype dtype = !strcmp(dtype_name, "bf16") ? CI_BF16
                   : !strcmp(dtype_name, "q8") ? CI_Q8
                   : !strcmp(dtype_name, "q4") ? CI_Q4
                                               : CI_F32;
  if (dtype == CI_F32 || rows < 1 || cols < 1 || m < 1 || threads < 1 || copies < 0 || rounds < 1 ||
      (group != 32 && group != 64 && group != 128) || cols % group) {
    fprintf(stderr, "matmul_bench: bad arguments (dtype bf16|q8|q4, --cols a multiple of "
                    "--group 32|64|128, counts >= 1)\n");
    return 2;
  }
  const int affine = dtype != CI_BF16;
  const int bits = dtype == CI_Q8 ? 8 : dtype == CI_Q4 ? 4 : 16;
  const size_t code_bytes = (size_t)(rows * cols * bits / 8);
  const size_t scale_count = affine ? (size_t)(rows * (cols / group)) : 0;
  const size_t bytes_per_copy = code_bytes + 2 * scale_count * sizeof(uint16_t);
  if (copies == 0) copies = (int)(400e6 / (double)bytes_per_copy) + 1;

  ci_tensor *weights = calloc((size_t)copies, sizeof *weights);
  float *x = malloc((size_t)(m * cols) * sizeof *x);
  float *y = malloc((size_t)(m * rows) * sizeof *y);
  if (!weights || !x || !y) {
    fprintf(stderr, "matmul_bench: out of memory\n");
    return 1;
  }
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (int c = 0; c < copies; c++) {
    uint8_t *codes = alloc_weights(code_bytes);
    uint16_t *scales = affine ? malloc(scale_count * sizeof *scales) : NULL;
    uint16_t *biases = affine ? malloc(scale_count * sizeof *biases) : NULL;
    if (!codes || (affine && (!scales || !biases))) {
      fprintf(stderr, "matmul_bench: out of memory for %d copies of %zu bytes\n", copies,
              bytes_per_copy);
      return 1;
    }
    if (affine) {
      for (size_t i = 0; i < code_bytes; i++) codes[i] = (uint8_t)next_random(&state);
      fill_bf16(scales, scale_count, 0x3c00, 0, &state); /* scales ~2^-7, biases ~ +-2^-3 */
      fill_bf16(biases, scale_count, 0x3e00, 1, &state);
    } else {
      fill_bf16((uint16_t *)codes, code_bytes / 2, 0x3c00, 1, &state);
    }
    weights[c] = (ci_tensor){.dtype = dtype,
                             .ndim = 2,
                             .shape = {rows, cols},
                             .data = codes,
                             .scales = scales,
                             .biases = biases,
                             .scale_dtype = CI_BF16,
                             .group_size = affine ? group : 0};
  }
  for (int64_t i = 0; i < m * cols; i++)
    x[i] = (float)(int64_t)(next_random(&state) % 2001 - 1000) / 500.0f;

  const ci_isa isa = ci_cpu_detect_isa();
  const ci_precision precision = fast ? CI_PRECISION_FAST : CI_PRECISION_EXACT;
  ci_threadpool *pool = threads > 1 ? ci_threadpool_create(threads) : NULL;
  ci_arena scratch;
  ci_arena_init(&scratch);
  float *ys[1] = {y};
  uint64_t bits_hash = 1469598103934665603ull; /* FNV-1a of copy 0's output bytes */
  double best = 1e30;
  for (int round = -1; round < rounds; round++) { /* round -1: the warm-up */
    const double start = ci_now_seconds();
    for (int c = 0; c < copies; c++) {
      const ci_tensor *ws[1] = {&weights[c]};
      if (ci_cpu_matmul_segments_multi(pool, isa, precision, &scratch, ws, 1, x, m, ys, NULL) !=
          CI_OK) {
        fprintf(stderr, "matmul_bench: %s\n", ci_last_error());
        return 1;
      }
      if (round == -1 && c == 0) {
        const uint8_t *bytes_out = (const uint8_t *)y;
        for (size_t i = 0; i < (size_t)(m * rows) * sizeof *y; i++)
          bits_hash = (bits_hash ^ bytes_out[i]) * 1099511628211ull;
      }
    }
    const double per_call = (ci_now_seconds() - start) / copies;
    if (round >= 0 && per_call < best) best = per_call;
  }
  printf("{\"isa\": \"%s\", \"dtype\": \"%s\", \"rows\": %lld, \"cols\": %lld, \"group\": %d, "
         "\"m\": %d, \"threads\": %d, \"copies\": %d, \"precision\": \"%s\", "
         "\"us_per_call\": %.2f, \"weight_gb_s\": %.2f, \"output_bits\": \"%016llx\"}\n",
         ci_isa_name(isa), dtype_name, (long long)rows, (long long)cols, affine ? group : 0, m,
         threads, copies, fast ? "fast" : "exact", best * 1e6, (double)bytes_per_copy / best / 1e9,
         (unsigned long long)bits_hash);
  ci_arena_free(&scratch);
  if (pool) ci_threadpool_free(pool);
  for (int c = 0; c < copies; c++) {
    munmap((void *)weights[c].data, huge_round(code_bytes));
    free((void *)weights[c].scales);
    free((void *)weights[c].biases);
  }
  free(weights);
  free(x);
  free(y);
  return 0;
}
