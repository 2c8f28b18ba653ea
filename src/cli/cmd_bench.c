/* `cinfer bench`: prefill and decode throughput of one sequence on seeded random-token prompts
 * (EOS ignored), median over runs, as a table or one JSON object. */
#include "base/timing.h"
#include "cinfer.h"
#include "cli/args.h"
#include "cli/kv_flags.h"
#include "cli/verbs.h"

#include <stdio.h>
#include <stdlib.h>

static const char usage[] =
    "usage: cinfer bench --model DIR [-p PROMPT_TOKENS] [-n GEN_TOKENS] [--depth N] [--runs N]\n"
    "  [--warmup N] [--json]\n" CI_CLI_MODEL_USAGE CI_CLI_KV_USAGE
    "Prefill and decode are timed apart, as llama-bench's pp and tg tests: the prompt in one\n"
    "session, then GEN_TOKENS decoded in a fresh one after a one-token prompt. --depth N fills N\n"
    "positions of the KV cache with synthetic K/V (encoded in the KV codec) first, to time both\n"
    "at that context length.\n";

typedef struct {
  double prefill_seconds;
  double decode_seconds;
  int64_t kv_bytes; /* KV storage in use at the end (the larger of the two sessions) */
} run_times;

/* One session: `depth` synthetic positions, then `prompt_len` seeded random ids fed in one
 * forward pass (its time in *prefill_seconds); with gen_len > 0 it then decodes gen_len tokens
 * greedily (EOS ignored): gen_len + 1 steps, the first sampling from the prompt's logits, each
 * later one running the previous token first (their time in *decode_seconds). KV storage in use
 * at the end in *kv_bytes. Prints the error and returns 1 on failure. */
static int bench_session(cinfer_model *model, const cinfer_params *kv, int64_t depth,
                         int prompt_len, int gen_len, uint64_t seed, double *prefill_seconds,
                         double *decode_seconds, int64_t *kv_bytes) {
  const int vocab = cinfer_model_vocab_size(model);
  cinfer_params params = *kv;
  params.temperature = 0;
  params.ignore_eos = 1;
  params.max_tokens = gen_len + 1;
  params.prefill_chunk = prompt_len;
  params.context_size = (int)(depth + prompt_len + gen_len + 1);
  cinfer_session *session = NULL;
  int32_t *ids = malloc((size_t)prompt_len * sizeof *ids);
  int rc = 1;
  if (!ids) {
    fprintf(stderr, "cinfer bench: out of memory\n");
    return 1;
  }
  if (cinfer_session_create(model, &params, &session) != CINFER_OK ||
      cinfer_session_fill_synthetic(session, depth, seed) != CINFER_OK)
    goto failed;
  for (int i = 0; i < prompt_len; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    ids[i] = (int32_t)((seed >> 33) % (uint64_t)vocab);
  }
  double start = ci_now_seconds();
  if (cinfer_session_feed(session, ids, (size_t)prompt_len, NULL, 0) != CINFER_OK) goto failed;
  double prefilled = ci_now_seconds();
  for (int g = 0; gen_len > 0 && g <= gen_len; g++) {
    int32_t next;
    if (cinfer_session_step(session, &next) != CINFER_OK) goto failed;
  }
  *prefill_seconds = prefilled - start;
  *decode_seconds = ci_now_seconds() - prefilled;
  *kv_bytes = cinfer_session_kv_bytes(session);
  rc = 0;
  goto done;
failed:
  fprintf(stderr, "cinfer bench: %s\n", cinfer_last_error());
done:
  free(ids);
  cinfer_session_free(session);
  return rc;
}

/* One run, as llama-bench's two tests: the prompt of prompt_len ids prefilled at `depth`, then
 * in a fresh session gen_len tokens decoded at `depth` (after a one-token prompt), so the decode
 * figure does not depend on the prompt length. */
static int bench_run(cinfer_model *model, const cinfer_params *kv, int64_t depth, int prompt_len,
                     int gen_len, uint64_t seed, run_times *t) {
  double unused;
  int64_t prefill_kv_bytes;
  if (bench_session(model, kv, depth, prompt_len, 0, seed, &t->prefill_seconds, &unused,
                    &prefill_kv_bytes) ||
      bench_session(model, kv, depth, 1, gen_len, seed, &unused, &t->decode_seconds, &t->kv_bytes))
    return 1;
  if (prefill_kv_bytes > t->kv_bytes) t->kv_bytes = prefill_kv_bytes;
  return 0;
}

static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, compare_doubles);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int ci_verb_bench(int argc, char **argv) {
  ci_flag flags[] = {{"--model", "-m", 1, NULL},
                     {"--prompt-tokens", "-p", 1, NULL},
                     {"--gen-tokens", "-n", 1, NULL},
                     {"--runs", NULL, 1, NULL},
                     {"--warmup", NULL, 1, NULL},
                     {"--json", NULL, 0, NULL},
                     {"--help", "-h", 0, NULL},
                     {"--depth", NULL, 1, NULL},
                     CI_CLI_MODEL_FLAGS,
                     CI_CLI_KV_FLAGS};
  const int nf = sizeof flags / sizeof flags[0];
  if (ci_args_parse(argc, argv, flags, nf, "bench")) return 2;
  if (ci_args_get(flags, nf, "--help")) {
    fputs(usage, stdout);
    return 0;
  }
  const char *model_arg = ci_args_get(flags, nf, "--model");
  if (!model_arg) {
    fprintf(stderr, "cinfer bench: --model is required\n%s", usage);
    return 2;
  }
  long long prompt_len, gen_len, runs, warmup, depth;
  cinfer_params params;
  cinfer_params_init(&params, NULL);
  cinfer_model_options model_options;
  char kv_name[32];
  if (ci_cli_kv_flags(flags, nf, "bench", &params, kv_name, sizeof kv_name, NULL) ||
      ci_cli_model_options(flags, nf, "bench", &model_options))
    return 2;
  if (ci_args_int(flags, nf, "--prompt-tokens", 512, 1, 1 << 20, &prompt_len) ||
      ci_args_int(flags, nf, "--gen-tokens", 128, 1, 1 << 20, &gen_len) ||
      ci_args_int(flags, nf, "--runs", 3, 1, 1000, &runs) ||
      ci_args_int(flags, nf, "--warmup", 1, 0, 1000, &warmup) ||
      ci_args_int(flags, nf, "--depth", 0, 0, 1 << 24, &depth))
    return 2;
  cinfer_model *model = NULL;
  int rc = ci_cli_model_load(flags, nf, "bench", model_arg, &model);
  if (rc) return rc;
  double *prefill = calloc((size_t)runs, sizeof(double));
  double *decode = calloc((size_t)runs, sizeof(double));
  double *ttft = calloc((size_t)runs, sizeof(double));
  rc = 1;
  int64_t kv_bytes = 0;
  if (!prefill || !decode || !ttft) {
    fprintf(stderr, "cinfer bench: out of memory\n");
    goto done;
  }
  for (long long r = -warmup; r < runs; r++) {
    run_times t;
    if (bench_run(model, &params, depth, (int)prompt_len, (int)gen_len, (uint64_t)(r + 1000), &t))
      goto done;
    if (r < 0) continue;
    prefill[r] = (double)prompt_len / t.prefill_seconds;
    decode[r] = (double)gen_len / t.decode_seconds;
    ttft[r] = t.prefill_seconds * 1000.0;
    kv_bytes = t.kv_bytes;
  }
  double p = median(prefill, (int)runs), d = median(decode, (int)runs), f = median(ttft, (int)runs);
  int64_t weight_bytes = cinfer_model_weight_bytes(model);
  double rss_mb = (double)ci_peak_rss_bytes() / 1e6;
  if (ci_args_get(flags, nf, "--json")) {
    printf("{\"prefill_tok_s\": %.3f, \"decode_tok_s\": %.3f, \"ttft_ms\": %.3f, "
           "\"peak_rss_mb\": %.1f, \"weights_bytes\": %lld, \"prompt_tokens\": %lld, "
           "\"gen_tokens\": %lld, \"runs\": %lld, \"depth\": %lld, \"kv_codec\": \"%s\", "
           "\"kv_bytes\": %lld, \"precision\": \"%s\"}\n",
           p, d, f, rss_mb, (long long)weight_bytes, prompt_len, gen_len, runs, depth, kv_name,
           (long long)kv_bytes,
           model_options.precision == CINFER_PRECISION_EXACT ? "exact" : "fast");
  } else {
    printf("prefill %lld tok: %.1f tok/s (min %.1f, max %.1f) | decode %lld tok: %.2f tok/s "
           "(min %.2f, max %.2f) | ttft %.1f ms | weights/token %.1f MB | %.1f GB/s | peak %.0f "
           "MB\n",
           prompt_len, p, prefill[0], prefill[runs - 1], gen_len, d, decode[0], decode[runs - 1], f,
           (double)weight_bytes / 1e6, (double)weight_bytes * d / 1e9, rss_mb);
  }
  rc = 0;
done:
  free(prefill);
  free(decode);
  free(ttft);
  cinfer_model_free(model);
  return rc;
}
