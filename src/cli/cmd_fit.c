/* `cinfer fit MODEL`: whether a model fits this machine's memory at a context length, per KV
 * codec — weights, KV cache and workspace bytes against the memory available, and the largest
 * context that fits (cinfer_fit). */
#include "cinfer.h"
#include "cli/hub_verbs.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: cinfer fit MODEL [--ctx N] [--kv-codec LIST] [--batch N] [--device cpu]\n"
    "                  [--memory SIZE] [--draft-max N] [--json] [--pull]\n"
    "  Estimates the memory MODEL (a folder or a Hugging Face cache id) needs: weights (from the\n"
    "  safetensors headers), KV cache and workspace, against this machine's memory, and the\n"
    "  largest context that fits, for each KV codec.\n"
    "  --ctx N          tokens per sequence (the model's context length)\n"
    "  --kv-codec LIST  comma-separated codecs: bf16, f32, affine:BITS[:GROUP], "
    "turbo:BITS[:VBITS],\n"
    "                   turbo-v:KBITS:VBITS (bf16,affine:8,affine:4,turbo:4,turbo:3,turbo:2)\n"
    "  --batch N        sequences held at once (1)\n"
    "  --device D       cpu (GPU memory is not read yet)\n"
    "  --memory SIZE    check against SIZE bytes (K, M, G, T suffixes: powers of 1024) instead\n"
    "                   of the memory available now\n"
    "  --draft-max N    requests speculate with up to N drafts a round (a hybrid model such as\n"
    "                   Qwen3.5 then holds state checkpoints; 0: no speculation, the default)\n"
    "  --json           one JSON object per codec, one per line\n"
    "  --pull           pull MODEL from the Hub first when it is not in the cache\n";

static const char default_codecs[] = "bf16,affine:8,affine:4,turbo:4,turbo:3,turbo:2";

/* Parses "codec[:a[:b]]" into the options' codec fields (codec points into buf). Returns 0, or
 * 2 after printing the error. */
static int parse_codec(char *buf, cinfer_fit_options *o) {
  char *a = strchr(buf, ':'), *b = NULL;
  if (a) {
    *a++ = '\0';
    b = strchr(a, ':');
    if (b) *b++ = '\0';
  }
  o->kv_codec = buf;
  o->kv_bits = o->kv_value_bits = o->kv_group_size = 0;
  long v[2] = {0, 0};
  const char *parts[2] = {a, b};
  for (int i = 0; i < 2; i++) {
    if (!parts[i]) continue;
    char *end;
    errno = 0;
    v[i] = strtol(parts[i], &end, 10);
    if (errno || end == parts[i] || *end || v[i] < 1 || v[i] > 1024) {
      fprintf(stderr, "cinfer fit: bad number '%s' in --kv-codec %s\n", parts[i], buf);
      return 2;
    }
  }
  o->kv_bits = (int)v[0];
  if (!strcmp(buf, "affine"))
    o->kv_group_size = (int)v[1];
  else
    o->kv_value_bits = (int)v[1];
  return 0;
}

/* "16G", "512M", "1000000" -> bytes; -1 when malformed. */
static long long parse_size(const char *s) {
  char *end;
  errno = 0;
  const double v = strtod(s, &end);
  if (errno || end == s || v <= 0) return -1;
  double scale = 1;
  switch (*end) {
  case 'K':
  case 'k':
    scale = 1024.0;
    end++;
    break;
  case 'M':
    scale = 1024.0 * 1024;
    end++;
    break;
  case 'G':
    scale = 1024.0 * 1024 * 1024;
    end++;
    break;
  case 'T':
    scale = 1024.0 * 1024 * 1024 * 1024;
    end++;
    break;
  default:
    break;
  }
  if (*end == 'i') end++;
  if (*end == 'B') end++;
  if (*end || v * scale > 9e18) return -1;
  return (long long)(v * scale);
}

static void print_json(const cinfer_fit_result *r) {
  json_t *o = json_pack(
      "{s:s, s:I, s:I, s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:b, s:I, s:I, s:i}", "kv_codec",
      r->kv_codec, "context", (json_int_t)r->context, "context_limit", (json_int_t)r->context_limit,
      "batch", r->batch, "weights_bytes", (json_int_t)r->weights_bytes, "kv_bytes",
      (json_int_t)r->kv_bytes, "kv_bytes_per_token", (json_int_t)r->kv_bytes_per_token,
      "workspace_bytes", (json_int_t)r->workspace_bytes, "total_bytes", (json_int_t)r->total_bytes,
      "memory_available", (json_int_t)r->memory_available, "memory_total",
      (json_int_t)r->memory_total, "fits", r->fits, "max_context", (json_int_t)r->max_context,
      "state_bytes", (json_int_t)r->state_bytes, "draft_max", r->draft_max);
  char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
  if (text) printf("%s\n", text);
  free(text);
  json_decref(o);
}

static void print_header(const char *model, const cinfer_fit_result *r, int measured) {
  char avail[32], total[32], weights[32], ws[32];
  ci_cli_format_bytes(r->memory_available, avail, sizeof avail);
  ci_cli_format_bytes(r->memory_total, total, sizeof total);
  ci_cli_format_bytes(r->weights_bytes, weights, sizeof weights);
  ci_cli_format_bytes(r->workspace_bytes, ws, sizeof ws);
  printf("model    %s (context length %lld)\n", model, (long long)r->context_limit);
  if (measured)
    printf("memory   %s available of %s (cpu)\n", avail, total);
  else
    printf("memory   %s (--memory)\n", avail);
  printf("needs    weights %s + workspace %s + KV cache for %d x %lld tokens", weights, ws,
         r->batch, (long long)r->context);
  if (r->state_bytes > 0) {
    char state[32];
    ci_cli_format_bytes(r->state_bytes, state, sizeof state);
    printf(",\n         each with %s of recurrent state%s", state,
           r->draft_max > 0 ? " and speculative checkpoints" : "");
  }
  printf(":\n\n");
  printf("%-14s %10s %10s %10s  %-4s %12s\n", "KV CODEC", "KV/TOKEN", "KV", "TOTAL", "FITS",
         "MAX CONTEXT");
}

static void print_row(const cinfer_fit_result *r) {
  char per_token[32], kv[32], total[32];
  ci_cli_format_bytes(r->kv_bytes_per_token, per_token, sizeof per_token);
  ci_cli_format_bytes(r->kv_bytes, kv, sizeof kv);
  ci_cli_format_bytes(r->total_bytes, total, sizeof total);
  printf("%-14s %10s %10s %10s  %-4s %12lld\n", r->kv_codec, per_token, kv, total,
         r->fits ? "yes" : "no", (long long)r->max_context);
}

int ci_verb_fit(int argc, char **argv) {
  ci_flag flags[] = {
      {"--ctx", "-c", 1, NULL},    {"--kv-codec", NULL, 1, NULL}, {"--batch", NULL, 1, NULL},
      {"--device", NULL, 1, NULL}, {"--memory", NULL, 1, NULL},   {"--json", NULL, 0, NULL},
      {"--pull", NULL, 0, NULL},   {"--help", "-h", 0, NULL},     {"--draft-max", NULL, 1, NULL}};
  const int nf = (int)(sizeof flags / sizeof flags[0]);
  const char *model = NULL;
  int rc = ci_cli_args_positional(argc, argv, flags, nf, "fit", &model);
  if (rc) return rc;
  if (ci_args_get(flags, nf, "--help")) {
    fputs(usage, stdout);
    return 0;
  }
  if (!model) {
    fprintf(stderr, "cinfer fit: which model? (cinfer fit MODEL)\n%s", usage);
    return 2;
  }
  cinfer_fit_options o;
  cinfer_fit_options_init(&o);
  long long ctx, batch, draft_max;
  if (ci_args_int(flags, nf, "--ctx", 0, 1, 1LL << 40, &ctx) ||
      ci_args_int(flags, nf, "--batch", 1, 1, 4096, &batch) ||
      ci_args_int(flags, nf, "--draft-max", 0, 0, 32, &draft_max))
    return 2;
  o.draft_max = (int)draft_max;
  o.context = ctx;
  o.batch = (int)batch;
  o.device = ci_args_get(flags, nf, "--device");
  const char *memory = ci_args_get(flags, nf, "--memory");
  if (memory && (o.memory_bytes = parse_size(memory)) < 0) {
    fprintf(stderr, "cinfer fit: --memory must be a size such as 16G or 8000000000, got '%s'\n",
            memory);
    return 2;
  }
  const int json = ci_args_get(flags, nf, "--json") != NULL;

  char *dir = NULL;
  if (cinfer_model_resolve(model, &dir) != CINFER_OK) {
    if (cinfer_is_repo_id(model) && ci_args_get(flags, nf, "--pull")) {
      if (ci_cli_pull(model, 0, &dir)) return 1;
    } else if (cinfer_is_repo_id(model)) {
      fprintf(stderr,
              "cinfer fit: %s is not in the Hugging Face cache: run `cinfer pull %s` first, or "
              "add --pull to download it now\n",
              model, model);
      return 1;
    } else {
      fprintf(stderr, "cinfer fit: %s\n", cinfer_last_error());
      return 1;
    }
  }

  const char *list = ci_args_get(flags, nf, "--kv-codec");
  char *codecs = strdup(list ? list : default_codecs);
  if (!codecs) {
    cinfer_free(dir);
    fprintf(stderr, "cinfer fit: out of memory\n");
    return 1;
  }
  rc = 0;
  int n_rows = 0;
  char *save = NULL;
  for (char *item = strtok_r(codecs, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
    if ((rc = parse_codec(item, &o))) break;
    cinfer_fit_result r;
    const cinfer_status st = cinfer_fit(dir, &o, &r);
    if (st != CINFER_OK) {
      fprintf(stderr, "cinfer fit: %s\n", cinfer_last_error());
      rc = st == CINFER_INVALID_ARGUMENT ? 2 : 1;
      break;
    }
    if (json) {
      print_json(&r);
    } else {
      if (n_rows == 0) print_header(dir, &r, memory == NULL);
      print_row(&r);
    }
    n_rows++;
  }
  if (rc == 0 && n_rows == 0) {
    fprintf(stderr, "cinfer fit: --kv-codec lists no codec\n");
    rc = 2;
  }
  free(codecs);
  cinfer_free(dir);
  return rc;
}
