/* `cinfer perplexity`: teacher-forced mean negative log-likelihood and perplexity of token
 * sequences (like llama.cpp's llama-perplexity), each sequence in its own KV sequence, fed in
 * chunks. Sequences come from a JSON file: an array of ids, an array of id arrays, or an object
 * with "sequences" (the eval_ids.json the starter-model trainer writes). */
#include "base/error.h"
#include "base/timing.h"
#include "cinfer.h"
#include "cli/args.h"
#include "cli/kv_flags.h"
#include "cli/verbs.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static const char usage[] = "usage: cinfer perplexity --model DIR --ids-file FILE.json [--chunk N] "
                            "[--json]\n" CI_CLI_MODEL_USAGE CI_CLI_KV_USAGE;

/* Mean NLL of seq[1..n) given its prefix, in a session of its own; adds to *sum and *count. */
static int score_sequence(cinfer_model *model, const cinfer_params *kv, const int32_t *ids, int n,
                          int chunk, double *sum, long long *count) {
  const int V = cinfer_model_vocab_size(model);
  cinfer_params params = *kv;
  params.prefill_chunk = chunk; /* each chunk one forward pass */
  params.context_size = n;
  cinfer_session *session = NULL;
  float *logits = malloc((size_t)chunk * V * sizeof(float));
  int rc = 1;
  if (!logits) {
    fprintf(stderr, "cinfer perplexity: out of memory\n");
    goto done;
  }
  if (cinfer_session_create(model, &params, &session) != CINFER_OK) goto failed;
  for (int start = 0; start < n - 1; start += chunk) {
    const int len = n - 1 - start < chunk ? n - 1 - start : chunk;
    if (cinfer_session_feed(session, ids + start, (size_t)len, logits, (size_t)len) != CINFER_OK)
      goto failed;
    for (int r = 0; r < len; r++) {
      const float *row = logits + (size_t)r * V;
      double max = row[0], total = 0.0;
      for (int i = 1; i < V; i++)
        if (row[i] > max) max = row[i];
      for (int i = 0; i < V; i++) total += exp((double)row[i] - max);
      *sum += log(total) + max - row[ids[start + r + 1]];
      (*count)++;
    }
  }
  rc = 0;
  goto done;
failed:
  fprintf(stderr, "cinfer perplexity: %s\n", cinfer_last_error());
done:
  free(logits);
  cinfer_session_free(session);
  return rc;
}

/* Appends the id arrays of `node` to *seqs. Prints what is wrong (prefixed with path) and
 * returns 1, else 0. */
static int collect(json_t *node, json_t *seqs, const char *path) {
  if (json_is_object(node)) node = json_object_get(node, "sequences");
  if (!json_is_array(node) || json_array_size(node) == 0) {
    fprintf(stderr,
            "cinfer perplexity: %s: expected an array of ids, an array of id arrays, or "
            "{\"sequences\": ...}\n",
            path);
    return 1;
  }
  if (json_is_integer(json_array_get(node, 0))) return json_array_append(seqs, node) ? 1 : 0;
  size_t i;
  json_t *v;
  json_array_foreach(node, i, v) {
    if (!json_is_array(v)) {
      fprintf(stderr, "cinfer perplexity: %s: sequence %zu is not an array of ids\n", path, i);
      return 1;
    }
    if (json_array_append(seqs, v)) return 1;
  }
  return 0;
}

int ci_verb_perplexity(int argc, char **argv) {
  ci_flag flags[] = {{"--model", "-m", 1, NULL},
                     {"--ids-file", NULL, 1, NULL},
                     {"--chunk", NULL, 1, NULL},
                     {"--json", NULL, 0, NULL},
                     {"--help", "-h", 0, NULL},
                     CI_CLI_MODEL_FLAGS,
                     CI_CLI_KV_FLAGS};
  const int nf = sizeof flags / sizeof flags[0];
  if (ci_args_parse(argc, argv, flags, nf, "perplexity")) return 2;
  if (ci_args_get(flags, nf, "--help")) {
    fputs(usage, stdout);
    return 0;
  }
  const char *model_arg = ci_args_get(flags, nf, "--model");
  const char *path = ci_args_get(flags, nf, "--ids-file");
  long long chunk;
  cinfer_params params;
  cinfer_params_init(&params, NULL);
  cinfer_model_options model_options;
  if (!model_arg || !path) {
    fprintf(stderr, "cinfer perplexity: --model and --ids-file are required\n%s", usage);
    return 2;
  }
  if (ci_args_int(flags, nf, "--chunk", 512, 1, 1 << 20, &chunk) ||
      ci_cli_model_options(flags, nf, "perplexity", &model_options) ||
      ci_cli_kv_flags(flags, nf, "perplexity", &params, NULL, 0, NULL))
    return 2;
  json_error_t err;
  json_t *root = json_load_file(path, 0, &err);
  if (!root) {
    if (ci_fail_if_unopenable(path))
      fprintf(stderr, "cinfer perplexity: %s\n", ci_last_error());
    else
      fprintf(stderr, "cinfer perplexity: %s: %s (line %d)\n", path, err.text, err.line);
    return 1;
  }
  json_t *seqs = json_array();
  if (!seqs || collect(root, seqs, path)) {
    json_decref(root);
    json_decref(seqs);
    return 1;
  }
  cinfer_model *model = NULL;
  int rc = ci_cli_model_load(flags, nf, "perplexity", model_arg, &model);
  if (rc) {
    json_decref(root);
    json_decref(seqs);
    return rc;
  }
  double sum = 0.0;
  long long count = 0;
  const double t0 = ci_now_seconds();
  size_t s;
  json_t *seq;
  json_array_foreach(seqs, s, seq) {
    const int n = (int)json_array_size(seq);
    int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    if (!ids) {
      fprintf(stderr, "cinfer perplexity: out of memory\n");
      rc = 1;
    }
    for (int i = 0; ids && rc == 0 && i < n; i++) {
      json_t *v = json_array_get(seq, (size_t)i);
      long long id = json_is_integer(v) ? json_integer_value(v) : -1;
      if (id < 0 || id >= cinfer_model_vocab_size(model)) {
        fprintf(stderr, "cinfer perplexity: sequence %zu, position %d: bad token id\n", s, i);
        rc = 1;
        break;
      }
      ids[i] = (int32_t)id;
    }
    if (rc == 0 && n >= 2) rc = score_sequence(model, &params, ids, n, (int)chunk, &sum, &count);
    free(ids);
    if (rc) break;
  }
  if (rc == 0) {
    if (count == 0) {
      fprintf(stderr, "cinfer perplexity: no predicted positions\n");
      rc = 1;
    } else if (ci_args_get(flags, nf, "--json")) {
      printf("{\"sequences\": %zu, \"predicted\": %lld, \"mean_nll\": %.6f, \"perplexity\": %.4f, "
             "\"seconds\": %.2f}\n",
             json_array_size(seqs), count, sum / count, exp(sum / count), ci_now_seconds() - t0);
    } else {
      printf("%zu sequences, %lld predicted tokens: mean NLL %.6f, perplexity %.4f\n",
             json_array_size(seqs), count, sum / count, exp(sum / count));
    }
  }
  json_decref(root);
  json_decref(seqs);
  cinfer_model_free(model);
  return rc;
}
