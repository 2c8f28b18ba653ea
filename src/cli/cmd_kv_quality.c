/* `cinfer kv-quality`: how much a KV codec changes a model's predictions. Teacher-forces the
 * same tokens through a bf16-KV sequence and a sequence in the codec (fed in equal chunks, so the
 * codec sequence converts after its first chunk or at --kv-start) and reports the mean KL
 * divergence KL(p_bf16 || p_codec) of the next-token distributions, top-1 agreement, and the KV
 * bytes per token relative to bf16, as one JSON line. */
#include "cinfer.h"
#include "cli/args.h"
#include "cli/kv_flags.h"
#include "cli/verbs.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: cinfer kv-quality --model DIR (--tokens N [--seed S] | --ids-file FILE) [--chunk N]\n"
    "  [--skip N]\n" CI_CLI_MODEL_USAGE CI_CLI_KV_USAGE
    "Positions before --skip (default: the first chunk) are not scored.\n";

/* Reads comma/space/newline-separated ids; returns a malloc'd array or NULL. */
static int32_t *read_ids_file(const char *path, int *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1024, count = 0;
  int32_t *ids = malloc(cap * sizeof *ids);
  long long v;
  int c;
  while (ids) {
    while ((c = fgetc(f)) != EOF &&
           (c == ',' || c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == '[' || c == ']'))
      ;
    if (c == EOF) break;
    ungetc(c, f);
    if (fscanf(f, "%lld", &v) != 1 || v < 0 || v > INT32_MAX) {
      free(ids);
      ids = NULL;
      break;
    }
    if (count == cap) {
      int32_t *bigger = realloc(ids, 2 * cap * sizeof *ids);
      if (!bigger) {
        free(ids);
        ids = NULL;
        break;
      }
      ids = bigger;
      cap *= 2;
    }
    ids[count++] = (int32_t)v;
  }
  fclose(f);
  *n = (int)count;
  return ids;
}

/* log-softmax of logits[0..V) into out. */
static void log_softmax(const float *logits, int V, double *out) {
  double max = logits[0];
  for (int i = 1; i < V; i++)
    if (logits[i] > max) max = logits[i];
  double sum = 0.0;
  for (int i = 0; i < V; i++) sum += exp((double)logits[i] - max);
  const double log_sum = log(sum) + max;
  for (int i = 0; i < V; i++) out[i] = (double)logits[i] - log_sum;
}

static int argmax(const float *x, int n) {
  int best = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[best]) best = i;
  return best;
}

int ci_verb_kv_quality(int argc, char **argv) {
  ci_flag flags[] = {
      {"--model", "-m", 1, NULL},    {"--tokens", "-n", 1, NULL}, {"--seed", NULL, 1, NULL},
      {"--ids-file", NULL, 1, NULL}, {"--chunk", NULL, 1, NULL},  {"--skip", NULL, 1, NULL},
      {"--help", "-h", 0, NULL},     CI_CLI_MODEL_FLAGS,          CI_CLI_KV_FLAGS};
  const int nf = sizeof flags / sizeof flags[0];
  if (ci_args_parse(argc, argv, flags, nf, "kv-quality")) return 2;
  if (ci_args_get(flags, nf, "--help")) {
    fputs(usage, stdout);
    return 0;
  }
  const char *model_arg = ci_args_get(flags, nf, "--model");
  const char *ids_path = ci_args_get(flags, nf, "--ids-file");
  long long tokens, seed, chunk, skip;
  cinfer_params test_params;
  cinfer_params_init(&test_params, NULL);
  cinfer_model_options model_options;
  char name[32];
  int quantized = 0;
  if (!model_arg || (!ids_path && !ci_args_get(flags, nf, "--tokens"))) {
    fprintf(stderr, "cinfer kv-quality: --model and --tokens or --ids-file are required\n%s",
            usage);
    return 2;
  }
  if (ci_args_int(flags, nf, "--tokens", 1024, 2, 1 << 24, &tokens) ||
      ci_args_int(flags, nf, "--seed", 1, 0, 1LL << 62, &seed) ||
      ci_args_int(flags, nf, "--chunk", 64, 1, 1 << 20, &chunk) ||
      ci_args_int(flags, nf, "--skip", -1, 0, 1 << 24, &skip) ||
      ci_cli_model_options(flags, nf, "kv-quality", &model_options) ||
      ci_cli_kv_flags(flags, nf, "kv-quality", &test_params, name, sizeof name, &quantized))
    return 2;
  if (!quantized) {
    fprintf(stderr, "cinfer kv-quality: --kv-codec must name a quantized codec\n");
    return 2;
  }
  if (skip < 0) skip = test_params.kv_start > chunk ? test_params.kv_start : chunk;
  cinfer_model *model = NULL;
  int rc = ci_cli_model_load(flags, nf, "kv-quality", model_arg, &model);
  if (rc) return rc;
  rc = 1;
  const int V = cinfer_model_vocab_size(model);
  int n = (int)tokens;
  int32_t *ids = NULL;
  if (ids_path) {
    ids = read_ids_file(ids_path, &n);
    if (!ids || n < 2) {
      fprintf(stderr, "cinfer kv-quality: %s: not a list of token ids\n", ids_path);
      free(ids);
      cinfer_model_free(model);
      return 1;
    }
  } else {
    ids = malloc((size_t)n * sizeof *ids);
    uint64_t state = (uint64_t)seed;
    for (int i = 0; ids && i < n; i++) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      ids[i] = (int32_t)((state >> 33) % (uint64_t)V);
    }
  }
  /* The reference runs in bf16 with no plan, laid out like the codec session; both feed each
   * chunk in one forward pass, and may run past the model's context length. */
  test_params.prefill_chunk = (int)chunk;
  test_params.context_size = n;
  cinfer_params ref_params = test_params;
  ref_params.kv_codec = "bf16";
  cinfer_session *ref = NULL, *test = NULL;
  float *ref_logits = malloc((size_t)chunk * V * sizeof(float));
  float *test_logits = malloc((size_t)chunk * V * sizeof(float));
  double *lp = malloc((size_t)V * sizeof(double)), *lq = malloc((size_t)V * sizeof(double));
  if (!ids || !ref_logits || !test_logits || !lp || !lq) {
    fprintf(stderr, "cinfer kv-quality: out of memory\n");
    goto done;
  }
  if (cinfer_session_create(model, &ref_params, &ref) != CINFER_OK ||
      cinfer_session_create(model, &test_params, &test) != CINFER_OK) {
    fprintf(stderr, "cinfer kv-quality: %s\n", cinfer_last_error());
    goto done;
  }
  double kl_sum = 0.0, kl_max = 0.0;
  long long scored = 0, agree = 0;
  for (int start = 0; start < n; start += (int)chunk) {
    const int len = n - start < chunk ? n - start : (int)chunk;
    if (cinfer_session_feed(ref, ids + start, (size_t)len, ref_logits, (size_t)len) != CINFER_OK ||
        cinfer_session_feed(test, ids + start, (size_t)len, test_logits, (size_t)len) !=
            CINFER_OK) {
      fprintf(stderr, "cinfer kv-quality: %s\n", cinfer_last_error());
      goto done;
    }
    for (int r = 0; r < len; r++) {
      if (start + r < skip) continue;
      const float *p = ref_logits + (size_t)r * V, *q = test_logits + (size_t)r * V;
      log_softmax(p, V, lp);
      log_softmax(q, V, lq);
      double kl = 0.0;
      for (int i = 0; i < V; i++) kl += exp(lp[i]) * (lp[i] - lq[i]);
      kl_sum += kl;
      if (kl > kl_max) kl_max = kl;
      agree += argmax(p, V) == argmax(q, V);
      scored++;
    }
  }
  if (scored == 0) {
    fprintf(stderr, "cinfer kv-quality: no position after --skip %lld to score\n", skip);
    goto done;
  }
  int64_t bpt = 0, bpt_bf16 = 0;
  if (cinfer_model_kv_bytes_per_token(model, &test_params, &bpt) != CINFER_OK ||
      cinfer_model_kv_bytes_per_token(model, &ref_params, &bpt_bf16) != CINFER_OK) {
    fprintf(stderr, "cinfer kv-quality: %s\n", cinfer_last_error());
    goto done;
  }
  printf("{\"kv_codec\": \"%s\", \"kv_start\": %lld, \"positions\": %lld, \"kl_mean\": %.6g, "
         "\"kl_max\": %.6g, \"top1_agreement\": %.6f, \"bytes_per_token\": %.0f, "
         "\"bytes_vs_bf16\": %.4f}\n",
         name, (long long)test_params.kv_start, scored, kl_sum / scored, kl_max,
         (double)agree / scored, (double)bpt, (double)bpt / (double)bpt_bf16);
  rc = 0;
done:
  free(ids);
  free(ref_logits);
  free(test_logits);
  free(lp);
  free(lq);
  cinfer_session_free(ref);
  cinfer_session_free(test);
  cinfer_model_free(model);
  return rc;
}
