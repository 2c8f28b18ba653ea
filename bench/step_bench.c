/* step_bench: times the model step on a device, without tokenizer or server: prefill of P
 * prompt tokens in one chunk, and decode steps of B sequences batched in one step (the engine's
 * batched step), each sequence holding a short prompt first. Also measures the device's memory
 * bandwidth (a large device copy) so batch-1 decode can be reported as a share of the roofline.
 * Writes one JSON object to stdout; bench/cuda.sh turns it into bench/cuda.md.
 *
 * usage: step_bench MODEL_DIR [--device cpu|cuda] [--prompts 512,2048] [--batches 1,16,64]
 *                             [--gen N] [--context 128[,N..]] [--threads N] [--planes 1|2]
 *                             [--graphs 0|1] [--precision fast|exact] [--kv CODEC] [--profile]
 *                             [--rows]
 * --planes: how the CUDA backend feeds activations to bf16 matmuls (cuda_backend.h).
 * --precision: the matmul numerics (default exact; on CUDA, --planes decides).
 * --kv: the decode sequences' KV codecs (a comma list), as `cinfer fit --kv-codec` spells one:
 *   bf16 (default), affine:BITS[:GROUP], turbo:BITS[:VBITS], turbo-v:KBITS:VBITS. Each decode
 *   sequence stores its --context prompt in bf16 and converts before the timed steps (the warm-up
 *   steps convert), so the timed steps read and write only the codec's blocks. Decode runs every
 *   (context, codec, batch) of the lists with the model loaded once: `--prompts 0 --batches 1
 *   --context 4096,16384 --kv bf16,affine:8,turbo:4` is the depth benchmark. Prefill always
 *   stores bf16; --prompts 0 skips it.
 * --rows: the decode steps download each sequence's whole logit row, as for a request that
 *   samples (default: only each row's greedy pick, as the engine's step for greedy requests).
 * --init CONFIG:DTYPE: first writes a random-weight model (cinfer_model_write_random: seed 1,
 *   groups of 64) of that config and dtype (bf16, q8, q4) at MODEL_DIR unless MODEL_DIR already
 *   has a config.json, so a GPU machine needs no other binary (nor `cinfer`'s libraries).
 * --profile: marks the timed decode steps as the profiler's range (run under
 *   `ncu --profile-from-start off`).
 * On a GPU each decode entry also splits its steps' time (per step, ms): host_build (recording
 * the ops and launching the step), gpu (the launch to the end of the logits download),
 * download (the logits' copy), backend_step (step_begin to step_end's return); step_ms beyond
 * backend_step is the engine's own host work between steps. */
#include "backend/cuda/cuda_backend.h"
#include "base/error.h"
#include "base/timing.h"
#include "cinfer.h"
#include "engine/model_open.h"
#include "model/model.h"
#include "tensor/kv_format.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_list(const char *text, int *out, int max) {
  int n = 0;
  for (const char *p = text; *p && n < max;) {
    out[n++] = atoi(p);
    const char *comma = strchr(p, ',');
    if (!comma) break;
    p = comma + 1;
  }
  return n;
}

/* Seconds of a synchronised step: the backend's step_end waits for the device. */
static void sync_backend(ci_backend *be) {
  be->ops->step_end(be, NULL, 0);
}

/* Device bandwidth: bytes read + written per second by a copy of `bytes`. */
static double measure_bandwidth(ci_backend *be, size_t bytes) {
  uint8_t *a = be->ops->alloc_uninitialized(be, bytes),
          *b = be->ops->alloc_uninitialized(be, bytes);
  if (!a || !b) return 0.0;
  be->ops->copy_bytes(be, b, a, bytes);
  sync_backend(be);
  double best = 1e30;
  for (int i = 0; i < 5; i++) {
    double t0 = ci_now_seconds();
    be->ops->copy_bytes(be, b, a, bytes);
    sync_backend(be);
    double t = ci_now_seconds() - t0;
    best = t < best ? t : best;
  }
  be->ops->release(be, a);
  be->ops->release(be, b);
  return 2.0 * (double)bytes / best;
}

static int32_t token_at(int i, int t, int vocab) {
  return (int32_t)(((int64_t)t * 7919 + (int64_t)i * 104729 + 17) % vocab);
}

/* Device buffers of the weights-only step: inputs and outputs of up to 256 rows, a 1-int step
 * descriptor. */
typedef struct {
  float *x, *y;
  int32_t *desc;
} matmul_buffers;

static int matmul_buffers_alloc(ci_model *model, matmul_buffers *mb) {
  ci_backend *be = model->be;
  int64_t max_k = model->head.shape[1], max_n = model->head.shape[0];
  for (int l = 0; l < model->spec.n_layers; l++) {
    const ci_layer_weights *L = &model->layers[l];
    const ci_tensor *all[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    for (int i = 0; i < 7; i++) {
      if (!all[i]->data) continue;
      max_n = all[i]->shape[0] > max_n ? all[i]->shape[0] : max_n;
      max_k = all[i]->shape[1] > max_k ? all[i]->shape[1] : max_k;
    }
  }
  mb->x = be->ops->alloc(be, (size_t)(256 * max_k) * sizeof(float));
  mb->y = be->ops->alloc(be, (size_t)(256 * max_n) * sizeof(float));
  mb->desc = be->ops->alloc(be, sizeof(int32_t));
  return mb->x && mb->y && mb->desc ? 0 : -1;
}

/* Seconds of one "weights-only" step: every matrix of the model multiplied by B decode rows (one
 * row per segment, as the engine's decode step gives them), nothing else; the best of 5 after a
 * warm-up. It separates the matmul kernels' share of a decode step from the other ops'. */
static double weights_only_step(ci_model *model, const matmul_buffers *mb, int B) {
  ci_backend *be = model->be;
  int32_t ones[256], host_desc = 0;
  for (int i = 0; i < 256; i++) ones[i] = 1;
  const ci_row_segments segments = {.n = B, .rows = ones};
  double best = 1e30;
  for (int rep = 0; rep < 8; rep++) {
    double t0 = ci_now_seconds();
    be->ops->step_begin(be, mb->desc, &host_desc, sizeof host_desc);
    for (int l = 0; l < model->spec.n_layers; l++) {
      const ci_layer_weights *L = &model->layers[l];
      const ci_tensor *mats[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
      for (int i = 0; i < 7; i++)
        if (mats[i]->data) be->ops->matmul(be, mats[i], mb->x, B, mb->y, &segments);
    }
    be->ops->matmul(be, &model->head, mb->x, B, mb->y, &segments);
    be->ops->step_end(be, NULL, 0);
    double t = ci_now_seconds() - t0;
    if (rep >= 3) best = t < best ? t : best;
  }
  return best;
}

/* Parses "codec[:a[:b]]" (a: bits; b: the group size for affine, the V bits otherwise). Returns 0,
 * or -1 with ci_last_error. */
static int parse_kv(const char *text, ci_kv_format *out) {
  char buf[64];
  if (strlen(text) >= sizeof buf) return ci_fail("--kv %s: too long", text);
  strcpy(buf, text);
  char *a = strchr(buf, ':'), *b = NULL;
  if (a) {
    *a++ = '\0';
    b = strchr(a, ':');
    if (b) *b++ = '\0';
  }
  int v[2] = {0, 0};
  const char *parts[2] = {a, b};
  for (int i = 0; i < 2; i++) {
    if (!parts[i]) continue;
    char *end;
    const long x = strtol(parts[i], &end, 10);
    if (end == parts[i] || *end || x < 1 || x > 1024)
      return ci_fail("--kv %s: bad number '%s'", text, parts[i]);
    v[i] = (int)x;
  }
  const int affine = !strcmp(buf, "affine");
  return ci_kv_format_parse(buf, v[0], affine ? 0 : v[1], affine ? v[1] : 0, out);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: step_bench MODEL_DIR [--device cpu|cuda] [--prompts 512,2048] "
                    "[--batches 1,16,64] [--gen N] [--context 128[,N..]] [--threads N] "
                    "[--precision fast|exact] [--kv CODEC]\n");
    return 2;
  }
  ci_device_options device = {.device = "auto", .gpu = 0, .n_threads = 0};
  int prompts[8] = {512, 2048}, n_prompts = 2, batches[16] = {1, 16, 64}, n_batches = 3;
  int gen = 32, contexts[4] = {128}, n_contexts = 1, planes = 2, graphs = 1, profile = 0;
  int rows = 0; /* --rows: decode steps download whole logit rows instead of greedy picks */
  ci_kv_format kvs[8] = {ci_kv_format_plain(CI_KV_BF16)};
  int n_kvs = 1;
  for (int i = 2; i < argc; i += 2) {
    if (!strcmp(argv[i], "--profile") || !strcmp(argv[i], "--rows")) {
      if (!strcmp(argv[i], "--profile"))
        profile = 1;
      else
        rows = 1;
      i--; /* a flag without a value */
      continue;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "step_bench: %s needs a value\n", argv[i]);
      return 2;
    }
    if (!strcmp(argv[i], "--device"))
      device.device = argv[i + 1];
    else if (!strcmp(argv[i], "--prompts"))
      n_prompts = parse_list(argv[i + 1], prompts, 8);
    else if (!strcmp(argv[i], "--batches"))
      n_batches = parse_list(argv[i + 1], batches, 16);
    else if (!strcmp(argv[i], "--gen"))
      gen = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--context"))
      n_contexts = parse_list(argv[i + 1], contexts, 4);
    else if (!strcmp(argv[i], "--threads"))
      device.n_threads = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--planes"))
      planes = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--precision") && !strcmp(argv[i + 1], "fast"))
      device.precision = CI_PRECISION_FAST;
    else if (!strcmp(argv[i], "--precision") && !strcmp(argv[i + 1], "exact"))
      device.precision = CI_PRECISION_EXACT;
    else if (!strcmp(argv[i], "--init")) {
      char spec[512], path[1024];
      snprintf(spec, sizeof spec, "%s", argv[i + 1]);
      char *colon = strrchr(spec, ':');
      if (!colon) {
        fprintf(stderr, "step_bench: --init %s: expected CONFIG:DTYPE\n", argv[i + 1]);
        return 2;
      }
      *colon = '\0';
      snprintf(path, sizeof path, "%s/config.json", argv[1]);
      FILE *existing = fopen(path, "r");
      if (existing) {
        fclose(existing);
      } else {
        const cinfer_random_model_options options = {colon + 1, 64, 1};
        if (cinfer_model_write_random(spec, argv[1], &options) != CINFER_OK) {
          fprintf(stderr, "step_bench: --init: %s\n", cinfer_last_error());
          return 1;
        }
      }
    } else if (!strcmp(argv[i], "--graphs"))
      graphs = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--kv")) {
      char list[256];
      snprintf(list, sizeof list, "%s", argv[i + 1]);
      n_kvs = 0;
      for (char *save = NULL, *item = strtok_r(list, ",", &save); item;
           item = strtok_r(NULL, ",", &save)) {
        if (n_kvs == 8 || parse_kv(item, &kvs[n_kvs++])) {
          fprintf(stderr, "step_bench: --kv: %s\n", n_kvs == 8 ? "at most 8" : ci_last_error());
          return 2;
        }
      }
    } else {
      fprintf(stderr, "step_bench: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  int context = 1; /* the longest */
  for (int c = 0; c < n_contexts; c++) {
    if (contexts[c] < 1 || contexts[c] > 65536) {
      fprintf(stderr, "step_bench: --context %d is outside 1..65536\n", contexts[c]);
      return 2;
    }
    context = contexts[c] > context ? contexts[c] : context;
  }
  for (int b = 0; b < n_batches; b++)
    if (batches[b] < 1 || batches[b] > 256) {
      fprintf(stderr, "step_bench: --batches %d is outside 1..256\n", batches[b]);
      return 2;
    }
  if (n_prompts < 0 || n_batches < 1 || n_contexts < 1 || n_kvs < 1) {
    fprintf(stderr, "step_bench: a bad list in --prompts, --batches, --context or --kv\n");
    return 2;
  }
  ci_model *model = ci_model_open_on(argv[1], &device);
  if (!model) {
    fprintf(stderr, "step_bench: %s\n", ci_last_error());
    return 1;
  }
  ci_backend *be = model->be;
#ifdef CINFER_CUDA
  if (!be->host_visible) {
    ci_cuda_set_input_planes(be, planes);
    ci_cuda_set_graphs(be, graphs);
  }
#endif
  const int vocab = model->spec.vocab;
  char kv_name[32];
  ci_kv_format_name(&kvs[0], kv_name, sizeof kv_name);
  printf("{\"model\": \"%s\", \"backend\": \"%s\", \"input_planes\": %d, \"graphs\": %d, "
         "\"kv\": \"%s\", \"context\": %d, \"decode_output\": \"%s\", "
         "\"weight_bytes_per_token\": %lld",
         argv[1], be->ops->name, planes, graphs, kv_name, context, rows ? "rows" : "picks",
         (long long)ci_model_weight_bytes_per_token(model));
  double bandwidth = be->host_visible ? 0.0 : measure_bandwidth(be, (size_t)2 << 30);
  printf(", \"bandwidth_bytes_per_s\": %.4g", bandwidth);
  /* the KV every measurement needs at once: the largest batch's contexts, or the longest prompt */
  int64_t max_seqs = 2, tokens = 0;
  for (int b = 0; b < n_batches; b++)
    max_seqs = batches[b] + 2 > max_seqs ? batches[b] + 2 : max_seqs;
  for (int p = 0; p < n_prompts; p++) tokens = prompts[p] + 64 > tokens ? prompts[p] + 64 : tokens;
  if ((int64_t)(max_seqs - 2) * (context + gen + 16) > tokens)
    tokens = (int64_t)(max_seqs - 2) * (context + gen + 16);
  const ci_kv_format bf16 = ci_kv_format_plain(CI_KV_BF16);
  /* a hybrid model's recurrent state per sequence too, each in whole slabs (up to 4 MiB spare) */
  const int64_t state = ci_spec_state_bytes(&model->spec);
  const int64_t arena = 2 * tokens * ci_model_kv_bytes_per_token(model, &bf16) +
                        (state > 0 ? max_seqs * (state + ((int64_t)4 << 20)) : 0) +
                        ((int64_t)1 << 28);
  ci_kv_cache *cache = ci_model_kv_cache_create(model, CI_KV_BF16, 16, arena);
  if (cache && ci_kv_cache_set_limits(cache, (int)max_seqs,
                                      tokens > context + gen + 64 ? tokens : context + gen + 64)) {
    ci_kv_cache_free(cache);
    cache = NULL;
  }
  if (!cache) {
    fprintf(stderr, "step_bench: %s\n", ci_last_error());
    return 1;
  }
  int32_t *ids = malloc(sizeof(int32_t) * 65536);
  const size_t logits_bytes = (size_t)vocab * 256 * sizeof(float);
  float *logits = malloc(logits_bytes);
  /* as the engine does: the step's logits land in page-locked memory */
  const int pinned = be->ops->pin_host(be, logits, logits_bytes) == CI_OK;
  ci_row_pick *picks = malloc(256 * sizeof *picks);
  if (!logits || !picks) {
    fprintf(stderr, "step_bench: out of memory\n");
    return 1;
  }
  /* warm-up: a short prefill and a few decode steps */
  {
    ci_kv_seq *s = ci_kv_seq_create(cache);
    for (int t = 0; t < 64; t++) ids[t] = token_at(0, t, vocab);
    ci_model_forward(model, s, ids, 64, logits, 1);
    for (int t = 0; t < 4; t++) ci_model_forward(model, s, ids + t, 1, logits, 1);
    ci_kv_seq_free(s);
  }
  printf(", \"prefill\": [");
  int printed = 0;
  for (int p = 0; p < n_prompts; p++) {
    const int n = prompts[p] > 65536 ? 65536 : prompts[p];
    if (n < 1) continue;
    for (int t = 0; t < n; t++) ids[t] = token_at(1, t, vocab);
    double best = 1e30;
    for (int run = 0; run < 3; run++) {
      ci_kv_seq *s = ci_kv_seq_create(cache);
      double t0 = ci_now_seconds();
      if (ci_model_forward(model, s, ids, n, logits, 1)) {
        fprintf(stderr, "step_bench: prefill %d: %s\n", n, ci_last_error());
        return 1;
      }
      double t = ci_now_seconds() - t0;
      best = t < best ? t : best;
      ci_kv_seq_free(s);
    }
    printf("%s{\"tokens\": %d, \"seconds\": %.6f, \"tok_s\": %.1f}", printed++ ? ", " : "", n, best,
           n / best);
    fflush(stdout);
  }
  matmul_buffers buffers = {0};
  const int have_buffers = !be->host_visible && matmul_buffers_alloc(model, &buffers) == 0;
  printf("], \"decode\": [");
  printed = 0;
  for (int run = 0; run < n_contexts * n_kvs * n_batches; run++) {
    const int B = batches[run % n_batches], depth = contexts[run / n_batches / n_kvs];
    const ci_kv_format kv = kvs[run / n_batches % n_kvs];
    ci_kv_format_name(&kv, kv_name, sizeof kv_name);
    ci_kv_seq **seqs = calloc((size_t)B, sizeof *seqs);
    int32_t *next = calloc((size_t)B, sizeof *next);
    for (int i = 0; i < B; i++) {
      seqs[i] = ci_kv_seq_create(cache);
      for (int t = 0; t < depth; t++) ids[t] = token_at(i, t, vocab);
      if (!seqs[i] || (kv.codec != CI_KV_BF16 && ci_kv_seq_set_plan(seqs[i], &kv, 0)) ||
          ci_model_forward(model, seqs[i], ids, depth, NULL, 0)) {
        fprintf(stderr, "step_bench: context of sequence %d: %s\n", i, ci_last_error());
        return 1;
      }
      next[i] = token_at(i, depth, vocab);
    }
    /* as the engine's step for greedy requests: each row's greedy pick (with --rows also every
     * sequence's whole logit row, what a request that samples needs) */
    for (int w = 0; w < 2; w++)
      ci_model_forward_decode_batch_picks(model, seqs, next, B, rows ? logits : NULL, picks);
#ifdef CINFER_CUDA
    if (profile) ci_cuda_profile_range(1);
    ci_cuda_step_times times = {0};
    if (!be->host_visible) ci_cuda_step_timing(be, 1, NULL);
#endif
    double t0 = ci_now_seconds();
    for (int step = 0; step < gen; step++) {
      if (ci_model_forward_decode_batch_picks(model, seqs, next, B, rows ? logits : NULL, picks)) {
        fprintf(stderr, "step_bench: decode batch %d: %s\n", B, ci_last_error());
        return 1;
      }
      for (int i = 0; i < B; i++) next[i] = token_at(i, step, vocab);
    }
    double t = ci_now_seconds() - t0;
    char split[256] = "";
#ifdef CINFER_CUDA
    if (profile) ci_cuda_profile_range(0);
    if (!be->host_visible) {
      ci_cuda_step_timing(be, 0, &times);
      const double per = times.steps > 0 ? 1e3 / (double)times.steps : 0.0;
      snprintf(split, sizeof split,
               ", \"host_build_ms\": %.3f, \"gpu_ms\": %.3f, \"download_ms\": %.3f, "
               "\"backend_step_ms\": %.3f",
               per * times.host_build_s, per * times.gpu_s, per * times.download_s,
               per * times.wall_s);
    }
#endif
    (void)profile;
    const double matmuls = have_buffers ? weights_only_step(model, &buffers, B) : 0.0;
    printf("%s{\"batch\": %d, \"context\": %d, \"kv\": \"%s\", \"steps\": %d, \"seconds\": %.6f, "
           "\"step_ms\": %.3f, \"tok_s\": %.1f, \"weights_only_step_ms\": %.3f%s}",
           printed++ ? ", " : "", B, depth, kv_name, gen, t, 1e3 * t / gen, (double)B * gen / t,
           1e3 * matmuls, split);
    fflush(stdout);
    for (int i = 0; i < B; i++) ci_kv_seq_free(seqs[i]);
    free(seqs);
    free(next);
  }
  printf("]");
#ifdef CINFER_CUDA
  size_t free_bytes = 0, total_bytes = 0;
  if (!be->host_visible && ci_cuda_memory_info(be, &free_bytes, &total_bytes) == CI_OK)
    printf(", \"gpu_memory_used_bytes\": %zu", total_bytes - free_bytes);
#endif
  printf("}\n");
  free(ids);
  if (pinned) be->ops->unpin_host(be, logits);
  free(logits);
  free(picks);
  ci_kv_cache_free(cache);
  ci_model_close(model);
  return 0;
}
