/* The CPU attention kernel alone on one thread: one decode row's attention over every layer of
 * a paged KV cache (Llama-3.2-1B geometry by default: 16 layers, 8 KV heads of 4 query heads,
 * head_dim 64, 16-token blocks), through the ISA's ci_kv_kernels as the backend calls it (every
 * KV head of a layer in one call). With --alias N the block table maps block b to pool block
 * b % N, so that with a small N the rows stay in cache and the figure is the kernel's compute
 * alone; without it every block is its own (the cache's memory pattern on one thread). Rows hold
 * random bytes of a finite range (valid codes for every codec). Prints one JSON object: the best
 * of --runs passes, ns per (key, KV head), the KV bytes read per second and a hash of the
 * outputs' bits (to check that a change to the kernel keeps them).
 * Usage: attend_bench [--keys N] [--alias N] [--precision fast|exact] [--codec bf16|affine8|
 *        affine4|turboK|turboKV (K, V bits 2-4)|turbov83|turbov44] [--head-dim D] [--group G]
 * [--block-tokens T] [--runs R] */
#include "backend/cpu/kv_kernels.h"
#include "base/timing.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

enum { LAYERS = 16, KV_HEADS = 8 };

static int parse_codec(const char *name, ci_kv_format *format) {
  if (!strcmp(name, "bf16")) {
    *format = ci_kv_format_plain(CI_KV_BF16);
  } else if (!strcmp(name, "affine8") || !strcmp(name, "affine4")) {
    *format = (ci_kv_format){.codec = CI_KV_AFFINE, .group_size = 64};
    format->k_bits = format->v_bits = name[6] == '8' ? 8 : 4;
  } else if (!strcmp(name, "turbov83") || !strcmp(name, "turbov44")) {
    *format = (ci_kv_format){.codec = CI_KV_TURBO_V, .group_size = 32};
    format->k_bits = name[6] - '0';
    format->v_bits = name[7] - '0';
  } else if (!strncmp(name, "turbo", 5) && name[5] >= '2' && name[5] <= '4' &&
             (!name[6] || (name[6] >= '2' && name[6] <= '4' && !name[7]))) {
    /* turboK (K and V of K bits) or turboKV */
    *format = (ci_kv_format){.codec = CI_KV_TURBO, .k_bits = name[5] - '0'};
    format->v_bits = name[6] ? name[6] - '0' : format->k_bits;
  } else {
    return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  int64_t keys = 16384;
  int block_tokens = 16, alias = 0, fast = 1, head_dim = 64, group = 4, runs = 5;
  const char *codec = "bf16";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--keys"))
      keys = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "--block-tokens"))
      block_tokens = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--alias"))
      alias = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--precision"))
      fast = strcmp(argv[i + 1], "exact") != 0;
    else if (!strcmp(argv[i], "--codec"))
      codec = argv[i + 1];
    else if (!strcmp(argv[i], "--head-dim"))
      head_dim = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--group"))
      group = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--runs"))
      runs = atoi(argv[i + 1]);
    else {
      fprintf(stderr, "attend_bench: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  ci_kv_format format;
  if (parse_codec(codec, &format) || keys < 1 || alias < 0 || head_dim % 16 || group < 1 ||
      group > 8 || runs < 1 || block_tokens < 1 || block_tokens > 64) {
    fprintf(stderr, "attend_bench: bad arguments (see the header of bench/attend_bench.c)\n");
    return 2;
  }
  const int D = head_dim, G = group;
  const int64_t blocks = (keys + block_tokens - 1) / block_tokens;
  const size_t k_row = ci_kv_row_bytes(&format, D, 0), v_row = ci_kv_row_bytes(&format, D, 1);
  const size_t layer_bytes = (size_t)KV_HEADS * block_tokens * (k_row + v_row);
  const size_t stride = LAYERS * layer_bytes, pool_blocks = alias ? (size_t)alias : (size_t)blocks;
  const size_t bytes = (stride * pool_blocks + (2u << 20) - 1) / (2u << 20) * (2u << 20);
  uint8_t *pool = aligned_alloc(2u << 20, bytes);
  int32_t *table = malloc((size_t)blocks * sizeof *table);
  float *signs = malloc((size_t)D * sizeof *signs);
  const int64_t query_floats = (int64_t)KV_HEADS * G * D;
  float *q = malloc((size_t)query_floats * sizeof *q);
  float *out = malloc((size_t)KV_HEADS * G * (D + 2) * sizeof *out);
  float *scratch = aligned_alloc(
      64, (size_t)ci_kv_attend_scratch_floats(block_tokens, D, KV_HEADS * G) * sizeof(float) + 64);
  if (!pool || !table || !signs || !q || !out || !scratch) {
    fprintf(stderr, "attend_bench: out of memory\n");
    return 1;
  }
  madvise(pool, bytes, MADV_HUGEPAGE);
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < bytes; i++) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    pool[i] = (uint8_t)(0x3c + (state >> 62)); /* 0x3c..0x3f: bf16 0.01-0.75, f16 1-1.9 */
  }
  for (int64_t b = 0; b < blocks; b++) table[b] = (int32_t)(alias ? b % alias : b);
  for (int i = 0; i < D; i++) signs[i] = i % 3 ? 1.0f : -1.0f;
  for (int64_t i = 0; i < query_floats; i++) q[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
  uint8_t *slabs[1] = {pool};
  ci_paged_kv kv[LAYERS];
  for (int l = 0; l < LAYERS; l++)
    kv[l] = (ci_paged_kv){.format = format,
                          .block_tokens = block_tokens,
                          .n_kv_heads = KV_HEADS,
                          .head_dim = D,
                          .block_table = table,
                          .n_table_entries = blocks,
                          .slabs = slabs,
                          .blocks_per_slab = (int32_t)pool_blocks,
                          .block_stride = stride,
                          .k_offset = l * layer_bytes,
                          .v_offset = l * layer_bytes + (size_t)KV_HEADS * block_tokens * k_row,
                          .k_row_bytes = k_row,
                          .v_row_bytes = v_row,
                          .signs = signs};
  const ci_kv_kernels k = ci_cpu_kv_kernels(ci_cpu_detect_isa(), &format, D,
                                            fast ? CI_PRECISION_FAST : CI_PRECISION_EXACT);
  double best = 1e30;
  for (int run = 0; run < runs; run++) {
    const double start = ci_now_seconds();
    for (int l = 0; l < LAYERS; l++)
      k.attend(&k, &kv[l], 0, KV_HEADS, q, G, 0, keys, 0.125f, 0.0f, scratch, out);
    const double seconds = ci_now_seconds() - start;
    if (seconds < best) best = seconds;
  }
  const double key_heads = (double)LAYERS * KV_HEADS * keys;
  uint64_t bits_hash = 1469598103934665603ull; /* FNV-1a of the last layer's outputs' bytes */
  const uint8_t *bytes_out = (const uint8_t *)out;
  for (size_t i = 0; i < (size_t)KV_HEADS * G * (D + 2) * sizeof *out; i++)
    bits_hash = (bits_hash ^ bytes_out[i]) * 1099511628211ull;
  printf("{\"isa\": \"%s\", \"codec\": \"%s\", \"precision\": \"%s\", \"head_dim\": %d, "
         "\"group\": %d, \"keys\": %lld, \"alias\": %d, \"ms\": %.3f, "
         "\"ns_per_key_head\": %.3f, \"kv_gb_s\": %.2f, \"output_bits\": \"%016llx\"}\n",
         ci_isa_name(ci_cpu_detect_isa()), codec, fast ? "fast" : "exact", D, G, (long long)keys,
         alias, best * 1e3, best / key_heads * 1e9,
         key_heads * (double)(k_row + v_row) / best / 1e9, (unsigned long long)bits_hash);
  free(pool);
  free(table);
  free(signs);
  free(q);
  free(out);
  free(scratch);
  return 0;
}
