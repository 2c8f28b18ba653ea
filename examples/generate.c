/* examples/generate.c: greedy generation with cinfer's public C API (only <cinfer.h>).
 *
 *   generate MODEL_DIR (--ids 1,2,3 | --prompt TEXT) [-n N] [--kv-codec C] [--ignore-eos]
 *            [--threads T]
 *
 * Loads the model, feeds the prompt (ids, or text encoded with the model's tokenizer and its
 * special tokens), samples up to N tokens at temperature 0 and prints their ids on one line,
 * comma-separated (as `cinfer generate --ids ... --temp 0` does); with --prompt the decoded text
 * follows on a second line.
 *
 * Build against an installed cinfer:
 *   cc generate.c $(pkg-config --cflags --libs --static cinfer) -o generate */
#include <cinfer.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Parses "1,2,3" into a malloc'd array; NULL on a malformed list. */
static int32_t *parse_ids(const char *csv, size_t *n) {
  size_t cap = 1;
  for (const char *c = csv; *c; c++) cap += *c == ',';
  int32_t *ids = malloc(cap * sizeof *ids);
  *n = 0;
  const char *p = csv;
  while (ids && *p) {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
      free(ids);
      return NULL;
    }
    ids[(*n)++] = (int32_t)v;
    p = *end ? end + 1 : end;
  }
  return ids;
}

static int fail(const char *what, cinfer_status status) {
  fprintf(stderr, "generate: %s: %s (%s)\n", what, cinfer_last_error(), cinfer_status_name(status));
  return 1;
}

int main(int argc, char **argv) {
  const char *model_dir = NULL, *ids_arg = NULL, *prompt = NULL, *kv_codec = NULL;
  int max_tokens = 16, ignore_eos = 0, threads = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *next = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--ids") && next)
      ids_arg = argv[++i];
    else if (!strcmp(a, "--prompt") && next)
      prompt = argv[++i];
    else if (!strcmp(a, "-n") && next)
      max_tokens = atoi(argv[++i]);
    else if (!strcmp(a, "--kv-codec") && next)
      kv_codec = argv[++i];
    else if (!strcmp(a, "--threads") && next)
      threads = atoi(argv[++i]);
    else if (!strcmp(a, "--ignore-eos"))
      ignore_eos = 1;
    else if (a[0] != '-' && !model_dir)
      model_dir = a;
    else {
      fprintf(stderr, "generate: unexpected argument %s\n", a);
      return 2;
    }
  }
  if (!model_dir || (!ids_arg == !prompt) || max_tokens < 1) {
    fprintf(stderr, "usage: generate MODEL_DIR (--ids 1,2,3 | --prompt TEXT) [-n N] "
                    "[--kv-codec C] [--ignore-eos] [--threads T]\n");
    return 2;
  }

  cinfer_model_options model_options;
  cinfer_model_options_init(&model_options);
  model_options.n_threads = threads;
  cinfer_model *model = NULL;
  cinfer_status status = cinfer_model_load(model_dir, &model_options, &model);
  if (status != CINFER_OK) return fail("cannot load the model", status);

  cinfer_params params;
  cinfer_params_init(&params, model);
  params.temperature = 0.0f; /* greedy */
  params.max_tokens = max_tokens;
  params.ignore_eos = ignore_eos;
  params.kv_codec = kv_codec;
  cinfer_session *session = NULL;
  int rc = 1;
  status = cinfer_session_create(model, &params, &session);
  if (status != CINFER_OK) {
    rc = fail("cannot create a session", status);
    goto done;
  }

  if (ids_arg) {
    size_t n_ids = 0;
    int32_t *ids = parse_ids(ids_arg, &n_ids);
    if (!ids || n_ids == 0) {
      fprintf(stderr, "generate: --ids: expected comma-separated token ids\n");
      free(ids);
      rc = 2;
      goto done;
    }
    status = cinfer_session_feed(session, ids, n_ids, NULL, 0);
    free(ids);
  } else {
    status = cinfer_session_feed_text(session, prompt, 1);
  }
  if (status != CINFER_OK) {
    rc = fail("cannot feed the prompt", status);
    goto done;
  }
  size_t n_prompt = 0;
  cinfer_session_tokens(session, &n_prompt);

  /* Step until done: each CINFER_OK is one new token; an EOS ends with CINFER_DONE. */
  int32_t token;
  size_t printed = 0;
  while ((status = cinfer_session_step(session, &token)) == CINFER_OK)
    printf("%s%d", printed++ ? "," : "", token);
  if (status != CINFER_DONE) {
    printf("\n");
    rc = fail("generation failed", status);
    goto done;
  }
  printf("\n");
  if (prompt) {
    size_t n_tokens = 0;
    const int32_t *tokens = cinfer_session_tokens(session, &n_tokens);
    char *text = NULL;
    status = cinfer_detokenize(model, tokens + n_prompt, n_tokens - n_prompt, 1, &text, NULL);
    if (status != CINFER_OK) {
      rc = fail("cannot decode the tokens", status);
      goto done;
    }
    printf("%s\n", text);
    cinfer_free(text);
  }
  rc = 0;
done:
  cinfer_session_free(session);
  cinfer_model_free(model);
  return rc;
}
