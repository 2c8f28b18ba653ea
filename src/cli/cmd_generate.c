/* `cinfer generate`: greedy continuation of a token-id prompt through the paged KV cache,
 * printing the generated ids and a stats line (text in and out arrives with the tokenizer). */
#include "base/error.h"
#include "base/timing.h"
#include "cli/args.h"
#include "cli/verbs.h"
#include "sample/greedy.h"

#include <stdio.h>
#include <stdlib.h>

static const char usage[] =
    "usage: cinfer generate --model DIR --ids CSV [-n|--max-tokens N] [--threads N] [--json]\n";

static int is_eos(const ci_model_spec *spec, int id) {
  for (int i = 0; i < spec->n_eos; i++)
    if (spec->eos_ids[i] == id) return 1;
  return 0;
}

int ci_verb_generate(int argc, char **argv) {
  ci_flag flags[] = {{"--model", "-m", 1, NULL},      {"--ids", NULL, 1, NULL},
                     {"--max-tokens", "-n", 1, NULL}, {"--threads", "-t", 1, NULL},
                     {"--json", NULL, 0, NULL},       {"--help", "-h", 0, NULL}};
  const int nf = sizeof flags / sizeof flags[0];
  if (ci_args_parse(argc, argv, flags, nf, "generate")) return 2;
  if (ci_args_get(flags, nf, "--help")) {
    fputs(usage, stdout);
    return 0;
  }
  const char *model_arg = ci_args_get(flags, nf, "--model");
  const char *ids_arg = ci_args_get(flags, nf, "--ids");
  if (!model_arg || !ids_arg) {
    fprintf(stderr,
            "cinfer generate: --model and --ids are required (text prompts need the "
            "tokenizer, not yet built)\n%s",
            usage);
    return 2;
  }
  long long max_tokens, threads;
  if (ci_args_int(flags, nf, "--max-tokens", 256, 1, 1 << 24, &max_tokens) ||
      ci_args_int(flags, nf, "--threads", 0, 1, 4096, &threads))
    return 2;
  int n_ids = 0;
  int32_t *ids = ci_parse_id_list(ids_arg, &n_ids);
  if (!ids) return 2;
  ci_cli_model cm;
  if (ci_cli_model_open(model_arg, (int)threads, &cm)) {
    free(ids);
    return 1;
  }
  const ci_model_spec *spec = &cm.model->spec;
  int rc = 1;
  ci_kv_cache *cache = ci_model_kv_cache_create(cm.model, CI_KV_BF16, 16, 0);
  ci_kv_seq *seq = cache ? ci_kv_seq_create(cache) : NULL;
  float *logits = malloc((size_t)spec->vocab * sizeof(float));
  int32_t *out = malloc((size_t)max_tokens * sizeof(int32_t));
  if (!seq || !logits || !out) {
    fprintf(stderr, "cinfer generate: %s\n", ci_last_error());
    goto done;
  }
  double start = ci_now_seconds();
  if (ci_model_forward(cm.model, seq, ids, n_ids, logits, 1)) {
    fprintf(stderr, "cinfer generate: %s\n", ci_last_error());
    goto done;
  }
  double first = ci_now_seconds();
  int n_out = 0;
  const char *finish = "length";
  int json = ci_args_get(flags, nf, "--json") != NULL;
  while (n_out < max_tokens) {
    int32_t next = ci_argmax(logits, spec->vocab);
    out[n_out++] = next;
    if (is_eos(spec, next)) {
      finish = "stop";
      break;
    }
    if (!json) {
      printf("%s%d", n_out > 1 ? "," : "", next);
      fflush(stdout);
    }
    if (n_out == max_tokens) break;
    if (ci_model_forward(cm.model, seq, &next, 1, logits, 1)) {
      fprintf(stderr, "\ncinfer generate: %s\n", ci_last_error());
      goto done;
    }
  }
  double end = ci_now_seconds();
  if (json) {
    printf("{\"ids\": [");
    for (int i = 0; i < n_out; i++) printf("%s%d", i ? ", " : "", out[i]);
    printf("], \"finish_reason\": \"%s\", \"stats\": {\"prompt_tokens\": %d, "
           "\"prefill_tok_s\": %.2f, \"gen_tokens\": %d, \"decode_tok_s\": %.2f, "
           "\"ttft_ms\": %.2f}}\n",
           finish, n_ids, n_ids / (first - start), n_out,
           n_out > 1 ? (n_out - 1) / (end - first) : 0.0, (first - start) * 1000);
  } else {
    printf("\n");
  }
  fflush(stdout);
  fprintf(stderr,
          "prompt %d tok %.1f tok/s | gen %d tok %.1f tok/s | ttft %.1f ms | peak %.2f GB\n", n_ids,
          n_ids / (first - start), n_out, n_out > 1 ? (n_out - 1) / (end - first) : 0.0,
          (first - start) * 1000, (double)ci_peak_rss_bytes() / 1e9);
  rc = 0;
done:
  free(out);
  free(logits);
  ci_kv_seq_free(seq);
  ci_kv_cache_free(cache);
  free(ids);
  ci_cli_model_close(&cm);
  return rc;
}
