/* `cinfer tokenize` (text file -> JSON array of ids, or an encode throughput measurement) and
 * `cinfer detokenize` (comma-separated ids -> exactly the decoded text). */
#include "base/timing.h"
#include "cinfer.h"
#include "cli/args.h"
#include "cli/verbs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char tokenize_usage[] =
    "usage: cinfer tokenize --model DIR --file TEXT [--add-special] [--bench N]\n"
    "  --model DIR     folder with tokenizer.json (or the tokenizer.json file itself)\n"
    "  --file TEXT     UTF-8 text file to encode ('-' = stdin)\n"
    "  --add-special   add the post-processor's special tokens (add_special_tokens=True)\n"
    "  --bench N       encode N times and print one JSON line of throughput instead of ids\n";

static const char detokenize_usage[] =
    "usage: cinfer detokenize --model DIR --ids CSV [--skip-special]\n"
    "  prints exactly the decoded text (no newline added)\n";

/* Loads a tokenizer from a model folder or a tokenizer.json path; prints the error. */
static cinfer_tokenizer *open_tokenizer(const char *verb, const char *path) {
  cinfer_tokenizer *tok = NULL;
  if (cinfer_tokenizer_load(path, &tok) != CINFER_OK)
    fprintf(stderr, "cinfer %s: %s\n", verb, cinfer_last_error());
  return tok;
}

/* Reads a whole file ('-' = stdin) into a malloc'd buffer. */
static char *read_all(const char *path, size_t *len) {
  FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
  if (!f) return NULL;
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  while (buf) {
    if (n == cap) {
      char *grown = realloc(buf, cap *= 2);
      if (!grown) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = grown;
    }
    size_t got = fread(buf + n, 1, cap - n, f);
    n += got;
    if (got == 0) break;
  }
  int failed = ferror(f);
  if (f != stdin) fclose(f);
  if (failed) {
    free(buf);
    return NULL;
  }
  *len = n;
  return buf;
}

static int run_bench(const cinfer_tokenizer *tok, const char *text, size_t len, int add_special,
                     long long reps) {
  size_t n_ids = 0;
  double best = 1e30, total = 0;
  for (long long r = 0; r < reps; r++) {
    int32_t *ids;
    double t0 = ci_now_seconds();
    if (cinfer_tokenizer_encode(tok, text, len, add_special, &ids, &n_ids) != CINFER_OK) {
      fprintf(stderr, "cinfer tokenize: %s\n", cinfer_last_error());
      return 1;
    }
    double dt = ci_now_seconds() - t0;
    cinfer_free(ids);
    total += dt;
    if (dt < best) best = dt;
  }
  printf("{\"bytes\":%zu,\"tokens\":%zu,\"reps\":%lld,\"best_s\":%.6f,\"mean_s\":%.6f,"
         "\"mb_per_s\":%.2f}\n",
         len, n_ids, reps, best, total / (double)reps, (double)len / 1e6 / best);
  return 0;
}

int ci_verb_tokenize(int argc, char **argv) {
  ci_flag flags[] = {{"--model", "-m", 1, NULL},
                     {"--file", "-f", 1, NULL},
                     {"--add-special", NULL, 0, NULL},
                     {"--bench", NULL, 1, NULL},
                     {"--help", "-h", 0, NULL}};
  const int nf = sizeof flags / sizeof flags[0];
  if (ci_args_parse(argc, argv, flags, nf, "tokenize")) return 2;
  if (ci_args_get(flags, nf, "--help")) {
    fputs(tokenize_usage, stdout);
    return 0;
  }
  const char *model = ci_args_get(flags, nf, "--model");
  const char *file = ci_args_get(flags, nf, "--file");
  long long reps;
  if (!model || !file) {
    fprintf(stderr, "cinfer tokenize: --model and --file are required\n");
    return 2;
  }
  if (ci_args_int(flags, nf, "--bench", 0, 1, 1000000, &reps)) return 2;
  size_t len = 0;
  char *text = read_all(file, &len);
  if (!text) {
    fprintf(stderr, "cinfer tokenize: cannot read %s\n", file);
    return 1;
  }
  cinfer_tokenizer *tok = open_tokenizer("tokenize", model);
  if (!tok) {
    free(text);
    return 1;
  }
  int add_special = ci_args_get(flags, nf, "--add-special") != NULL;
  int rc = 0;
  if (reps > 0) {
    rc = run_bench(tok, text, len, add_special, reps);
  } else {
    int32_t *ids;
    size_t n;
    if (cinfer_tokenizer_encode(tok, text, len, add_special, &ids, &n) != CINFER_OK) {
      fprintf(stderr, "cinfer tokenize: %s\n", cinfer_last_error());
      rc = 1;
    } else {
      putchar('[');
      for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", (int)ids[i]);
      puts("]");
      cinfer_free(ids);
    }
  }
  cinfer_tokenizer_free(tok);
  free(text);
  return rc;
}

int ci_verb_detokenize(int argc, char **argv) {
  ci_flag flags[] = {{"--model", "-m", 1, NULL},
                     {"--ids", NULL, 1, NULL},
                     {"--skip-special", NULL, 0, NULL},
                     {"--help", "-h", 0, NULL}};
  const int nf = sizeof flags / sizeof flags[0];
  if (ci_args_parse(argc, argv, flags, nf, "detokenize")) return 2;
  if (ci_args_get(flags, nf, "--help")) {
    fputs(detokenize_usage, stdout);
    return 0;
  }
  const char *model = ci_args_get(flags, nf, "--model");
  const char *csv = ci_args_get(flags, nf, "--ids");
  if (!model || !csv) {
    fprintf(stderr, "cinfer detokenize: --model and --ids are required\n");
    return 2;
  }
  int n = 0;
  int32_t *ids = NULL;
  if (strspn(csv, " \t\r\n") != strlen(csv) && !(ids = ci_parse_id_list(csv, &n))) return 2;
  cinfer_tokenizer *tok = open_tokenizer("detokenize", model);
  if (!tok) {
    free(ids);
    return 1;
  }
  char *text;
  size_t len;
  int rc = 0;
  if (cinfer_tokenizer_decode(tok, ids, (size_t)n, ci_args_get(flags, nf, "--skip-special") != NULL,
                              &text, &len) != CINFER_OK) {
    fprintf(stderr, "cinfer detokenize: %s\n", cinfer_last_error());
    rc = 1;
  } else {
    fwrite(text, 1, len, stdout);
    cinfer_free(text);
  }
  cinfer_tokenizer_free(tok);
  free(ids);
  return rc;
}
