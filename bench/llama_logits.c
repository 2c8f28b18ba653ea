/* llama_logits: teacher-forced logits and a greedy continuation from llama.cpp, to check a GGUF
 * written by bench/gguf_from_hf.py against cinfer (`cinfer logits`, `cinfer generate
 * --temperature 0`) or a fixture's transformers logits. Built against a llama.cpp build outside
 * this repository (see bench/README.md, "Checking a conversion"); not part of the CMake build.
 *
 * Usage: llama_logits MODEL.gguf IDS [--out LOGITS.f32] [--greedy N] [--threads T]
 *                     [--kv f32|f16]
 * IDS is a comma-separated list of token ids (no BOS is added). The whole prompt is decoded as
 * one batch with every position's logits; --out writes them as little-endian f32
 * [n_ids, n_vocab]. --greedy N then appends N argmax tokens one decode step at a time and prints
 * them comma-separated on stdout. The KV cache is f32 by default (exact), f16 as llama.cpp's
 * default. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static int parse_ids(const char *text, llama_token **out, int *n_out) {
  int cap = 16, n = 0;
  llama_token *ids = malloc(sizeof *ids * (size_t)cap);
  if (!ids) return fprintf(stderr, "llama_logits: out of memory\n"), -1;
  const char *p = text;
  while (*p) {
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (end == p || errno || v < 0 || v > 0x7fffffffL) {
      fprintf(stderr, "llama_logits: IDS: not a token id at \"%.20s\"\n", p);
      free(ids);
      return -1;
    }
    if (n == cap) {
      cap *= 2;
      llama_token *grown = realloc(ids, sizeof *ids * (size_t)cap);
      if (!grown) {
        free(ids);
        return fprintf(stderr, "llama_logits: out of memory\n"), -1;
      }
      ids = grown;
    }
    ids[n++] = (llama_token)v;
    p = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') {
      fprintf(stderr, "llama_logits: IDS: unexpected '%c'\n", *end);
      free(ids);
      return -1;
    }
  }
  if (n == 0) {
    free(ids);
    return fprintf(stderr, "llama_logits: IDS is empty\n"), -1;
  }
  *out = ids;
  *n_out = n;
  return 0;
}

static int argmax(const float *v, int n) {
  int best = 0;
  for (int i = 1; i < n; i++)
    if (v[i] > v[best]) best = i;
  return best;
}

int main(int argc, char **argv) {
  const char *out_path = NULL, *kv = "f32";
  int greedy = 0, threads = 2;
  if (argc < 3) {
    fprintf(stderr, "usage: llama_logits MODEL.gguf IDS [--out LOGITS.f32] [--greedy N] "
                    "[--threads T] [--kv f32|f16]\n");
    return 2;
  }
  for (int i = 3; i < argc; i++) {
    if (i + 1 >= argc) return fprintf(stderr, "llama_logits: %s needs a value\n", argv[i]), 2;
    if (!strcmp(argv[i], "--out"))
      out_path = argv[++i];
    else if (!strcmp(argv[i], "--greedy"))
      greedy = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--threads"))
      threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--kv"))
      kv = argv[++i];
    else
      return fprintf(stderr, "llama_logits: unknown option %s\n", argv[i]), 2;
  }
  if (greedy < 0 || threads < 1 || (strcmp(kv, "f32") && strcmp(kv, "f16")))
    return fprintf(stderr, "llama_logits: bad --greedy, --threads or --kv value\n"), 2;
  llama_token *ids;
  int n_ids;
  if (parse_ids(argv[2], &ids, &n_ids)) return 2;

  int status = 1;
  llama_backend_init();
  struct llama_model_params mp = llama_model_default_params();
  struct llama_model *model = llama_model_load_from_file(argv[1], mp);
  struct llama_context *ctx = NULL;
  struct llama_batch batch = llama_batch_init(n_ids, 0, 1);
  FILE *out = NULL;
  if (!model) {
    fprintf(stderr, "llama_logits: cannot load %s\n", argv[1]);
    goto done;
  }
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  for (int i = 0; i < n_ids; i++)
    if (ids[i] >= n_vocab) {
      fprintf(stderr, "llama_logits: token id %d >= vocabulary size %d\n", ids[i], n_vocab);
      goto done;
    }
  struct llama_context_params cp = llama_context_default_params();
  cp.n_ctx = (uint32_t)(n_ids + greedy + 16);
  cp.n_batch = cp.n_ubatch = (uint32_t)n_ids;
  cp.n_threads = cp.n_threads_batch = threads;
  cp.type_k = cp.type_v = strcmp(kv, "f32") ? GGML_TYPE_F16 : GGML_TYPE_F32;
  cp.no_perf = true;
  ctx = llama_init_from_model(model, cp);
  if (!ctx) {
    fprintf(stderr, "llama_logits: cannot create a context\n");
    goto done;
  }
  batch.n_tokens = n_ids;
  for (int i = 0; i < n_ids; i++) {
    batch.token[i] = ids[i];
    batch.pos[i] = i;
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = 1;
  }
  if (llama_decode(ctx, batch)) {
    fprintf(stderr, "llama_logits: decoding the prompt failed\n");
    goto done;
  }
  if (out_path) {
    out = fopen(out_path, "wb");
    if (!out) {
      fprintf(stderr, "llama_logits: cannot write %s: %s\n", out_path, strerror(errno));
      goto done;
    }
    for (int i = 0; i < n_ids; i++)
      if (fwrite(llama_get_logits_ith(ctx, i), sizeof(float), (size_t)n_vocab, out) !=
          (size_t)n_vocab) {
        fprintf(stderr, "llama_logits: writing %s failed\n", out_path);
        goto done;
      }
  }
  int next = argmax(llama_get_logits_ith(ctx, n_ids - 1), n_vocab);
  for (int step = 0; step < greedy; step++) {
    printf("%s%d", step ? "," : "", next);
    batch.n_tokens = 1;
    batch.token[0] = next;
    batch.pos[0] = n_ids + step;
    batch.logits[0] = 1;
    if (llama_decode(ctx, batch)) {
      fprintf(stderr, "llama_logits: decode step %d failed\n", step);
      goto done;
    }
    next = argmax(llama_get_logits_ith(ctx, 0), n_vocab);
  }
  if (greedy) printf("\n");
  status = 0;
done:
  if (out && fclose(out) && !status) {
    fprintf(stderr, "llama_logits: closing %s failed\n", out_path);
    status = 1;
  }
  llama_batch_free(batch);
  if (ctx) llama_free(ctx);
  if (model) llama_model_free(model);
  llama_backend_free();
  free(ids);
  return status;
}
