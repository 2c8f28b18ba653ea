/* `cinfer logits`: teacher-forced logits of a token-id prompt, every position, written as raw
 * little-endian f32 rows of vocab_size — the parity probe against transformers. */
#include "cinfer.h"
#include "cli/args.h"
#include "cli/kv_flags.h"
#include "cli/verbs.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

static const char usage[] =
    "usage: cinfer logits --model DIR --ids CSV --out FILE [--chunk N]\n" CI_CLI_MODEL_USAGE
        CI_CLI_KV_USAGE;

int ci_verb_logits(int argc, char **argv) {
  ci_flag flags[] = {{"--model", "-m", 1, NULL},
                     {"--ids", NULL, 1, NULL},
                     {"--out", "-o", 1, NULL},
                     {"--chunk", NULL, 1, NULL},
                     {"--help", "-h", 0, NULL},
                     CI_CLI_MODEL_FLAGS,
                     CI_CLI_KV_FLAGS};
  const int nf = sizeof flags / sizeof flags[0];
  if (ci_args_parse(argc, argv, flags, nf, "logits")) return 2;
  if (ci_args_get(flags, nf, "--help")) {
    fputs(usage, stdout);
    return 0;
  }
  const char *model_arg = ci_args_get(flags, nf, "--model");
  const char *ids_arg = ci_args_get(flags, nf, "--ids");
  const char *out_path = ci_args_get(flags, nf, "--out");
  if (!model_arg || !ids_arg || !out_path) {
    fprintf(stderr, "cinfer logits: --model, --ids and --out are required\n%s", usage);
    return 2;
  }
  long long chunk;
  cinfer_params params;
  cinfer_params_init(&params, NULL);
  cinfer_model_options model_options;
  if (ci_args_int(flags, nf, "--chunk", 0, 1, 1 << 24, &chunk) ||
      ci_cli_model_options(flags, nf, "logits", &model_options) ||
      ci_cli_kv_flags(flags, nf, "logits", &params, NULL, 0, NULL))
    return 2;
  int n_ids = 0;
  int32_t *ids = ci_parse_id_list(ids_arg, &n_ids);
  if (!ids) return 2;

  cinfer_model *model = NULL;
  int rc = ci_cli_model_load(flags, nf, "logits", model_arg, &model);
  if (rc) {
    free(ids);
    return rc;
  }
  rc = 1;
  const int vocab = cinfer_model_vocab_size(model);
  cinfer_session *session = NULL;
  float *rows = NULL;
  FILE *out = NULL;
  for (int i = 0; i < n_ids; i++) {
    if (ids[i] >= vocab) {
      fprintf(stderr, "cinfer logits: token id %d at index %d is out of range [0, %d)\n", ids[i], i,
              vocab);
      goto done;
    }
  }
  if (chunk == 0) chunk = n_ids;
  /* Every chunk is one forward pass; the sequence may run past the model's context length. */
  params.prefill_chunk = (int)chunk;
  params.context_size = n_ids;
  if (cinfer_session_create(model, &params, &session) != CINFER_OK) {
    fprintf(stderr, "cinfer logits: %s\n", cinfer_last_error());
    goto done;
  }
  rows = malloc((size_t)chunk * (size_t)vocab * sizeof(float));
  out = fopen(out_path, "wb");
  if (!rows || !out) {
    fprintf(stderr, "cinfer logits: %s\n", !out ? "cannot open the output file" : "out of memory");
  } else {
    rc = 0;
    for (int start = 0; start < n_ids && rc == 0; start += (int)chunk) {
      int n = n_ids - start < chunk ? n_ids - start : (int)chunk;
      if (cinfer_session_feed(session, ids + start, (size_t)n, rows, (size_t)n) != CINFER_OK) {
        fprintf(stderr, "cinfer logits: %s\n", cinfer_last_error());
        rc = 1;
      } else if (fwrite(rows, sizeof(float) * (size_t)vocab, (size_t)n, out) != (size_t)n) {
        fprintf(stderr, "cinfer logits: write to %s failed\n", out_path);
        rc = 1;
      }
    }
  }
  if (out && fclose(out) != 0 && rc == 0) {
    fprintf(stderr, "cinfer logits: write to %s failed\n", out_path);
    rc = 1;
  }
done:
  free(rows);
  cinfer_session_free(session);
  free(ids);
  cinfer_model_free(model);
  return rc;
}
