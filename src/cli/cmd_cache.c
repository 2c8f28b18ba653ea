/* `cinfer cache ls|prune DIR`: the prompt-cache directory a server keeps with --prompt-cache-dir.
 * ls lists what is there by key (model identity, backend, KV codec state, adapter: one line per
 * key with its blocks, bytes, the longest prompt prefix it covers and when it was last used) and
 * every file that would be skipped and why; prune deletes what can never be loaded and, with
 * --max-bytes, the least recently used prompts' blocks (deepest first) until the directory fits. */
#include "cinfer.h"
#include "cli/hub_verbs.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char usage[] =
    "usage: cinfer cache ls DIR [--verify]\n"
    "       cinfer cache prune DIR [--max-bytes N[K|M|G]]\n"
    "  DIR is a prompt cache directory (cinfer serve --prompt-cache-dir DIR). ls lists its KV\n"
    "  blocks by key (model, backend, KV codec state, adapter) and every file a server would\n"
    "  skip, with the reason (--verify also checks every payload checksum). prune deletes those\n"
    "  files and blocks whose predecessor is gone, then, with --max-bytes, the least recently\n"
    "  used prompts' blocks until the blocks take at most N bytes. Both are safe while a server\n"
    "  uses the directory.\n";

typedef struct {
  char *key;
  int64_t blocks, bytes, longest; /* longest: tokens of the deepest block's prefix */
  long long last_used;
} key_group;

typedef struct {
  key_group *groups;
  int n, cap;
  int64_t problems, oom;
} listing;

static int list_file(void *user, const cinfer_prompt_cache_file *f) {
  listing *l = user;
  if (!f->valid) {
    printf("skipped  %s  %s\n", f->name, f->problem ? f->problem : "invalid");
    l->problems++;
    return 0;
  }
  int g = 0;
  while (g < l->n && (strlen(l->groups[g].key) != f->key_bytes ||
                      memcmp(l->groups[g].key, f->key, f->key_bytes)))
    g++;
  if (g == l->n) {
    if (l->n == l->cap) {
      const int cap = l->cap ? 2 * l->cap : 8;
      key_group *bigger = realloc(l->groups, (size_t)cap * sizeof *bigger);
      if (!bigger) return l->oom = 1;
      l->groups = bigger;
      l->cap = cap;
    }
    key_group *x = &l->groups[l->n];
    memset(x, 0, sizeof *x);
    if (!(x->key = strndup(f->key, f->key_bytes))) return l->oom = 1;
    l->n++;
  }
  key_group *x = &l->groups[g];
  x->blocks++;
  x->bytes += f->bytes;
  const int64_t covered = (f->index + 1) * f->block_tokens;
  if (covered > x->longest) x->longest = covered;
  if (f->mtime > x->last_used) x->last_used = f->mtime;
  return 0;
}

static int cache_ls(const char *dir, int verify) {
  listing l;
  memset(&l, 0, sizeof l);
  const cinfer_status st = cinfer_prompt_cache_scan(dir, verify, list_file, &l);
  int rc = 0;
  if (st != CINFER_OK || l.oom) {
    fprintf(stderr, "cinfer cache ls: %s\n", l.oom ? "out of memory" : cinfer_last_error());
    rc = 1;
  } else {
    int64_t blocks = 0, bytes = 0;
    for (int g = 0; g < l.n; g++) {
      const key_group *x = &l.groups[g];
      char size[32], when[32];
      ci_cli_format_bytes(x->bytes, size, sizeof size);
      const time_t t = (time_t)x->last_used;
      struct tm tm;
      strftime(when, sizeof when, "%Y-%m-%d %H:%M", localtime_r(&t, &tm));
      printf("%6lld blocks  %9s  prefixes up to %lld tokens  last used %s\n  %s\n",
             (long long)x->blocks, size, (long long)x->longest, when, x->key);
      blocks += x->blocks;
      bytes += x->bytes;
    }
    char size[32];
    ci_cli_format_bytes(bytes, size, sizeof size);
    printf("%s: %lld blocks under %d keys, %s; %lld files skipped\n", dir, (long long)blocks, l.n,
           size, (long long)l.problems);
  }
  for (int g = 0; g < l.n; g++) free(l.groups[g].key);
  free(l.groups);
  return rc;
}

/* "N", "N K|M|G" (binary multiples, an optional "iB"/"B"). Returns 0, or -1. */
static int parse_bytes(const char *text, int64_t *out) {
  errno = 0;
  char *end;
  const double v = strtod(text, &end);
  if (errno || end == text || !(v >= 0)) return -1;
  double scale = 1;
  if (*end == 'K' || *end == 'k')
    scale = 1024.0, end++;
  else if (*end == 'M' || *end == 'm')
    scale = 1024.0 * 1024, end++;
  else if (*end == 'G' || *end == 'g')
    scale = 1024.0 * 1024 * 1024, end++;
  if (scale > 1 && *end == 'i') end++;
  if (*end == 'B') end++;
  if (*end || v * scale > 9e18) return -1;
  *out = (int64_t)(v * scale);
  return 0;
}

int ci_verb_cache(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    fputs(usage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const char *sub = argv[1];
  const int ls = !strcmp(sub, "ls"), prune = !strcmp(sub, "prune");
  if (!ls && !prune) {
    fprintf(stderr, "cinfer cache: unknown subcommand '%s' (ls or prune)\n%s", sub, usage);
    return 2;
  }
  ci_flag flags[] = {
      {"--verify", NULL, 0, NULL}, {"--max-bytes", NULL, 1, NULL}, {"--help", "-h", 0, NULL}};
  const int nf = (int)(sizeof flags / sizeof flags[0]);
  const char *dir = NULL;
  const int rc =
      ci_cli_args_positional(argc - 1, argv + 1, flags, nf, ls ? "cache ls" : "cache prune", &dir);
  if (rc) return rc;
  if (ci_args_get(flags, nf, "--help")) {
    fputs(usage, stdout);
    return 0;
  }
  if (!dir) {
    fprintf(stderr, "cinfer cache %s: which directory? (the --prompt-cache-dir of serve)\n", sub);
    return 2;
  }
  if (ls) {
    if (ci_args_get(flags, nf, "--max-bytes")) {
      fprintf(stderr, "cinfer cache ls: --max-bytes belongs to prune\n");
      return 2;
    }
    return cache_ls(dir, ci_args_get(flags, nf, "--verify") != NULL);
  }
  int64_t max_bytes = -1;
  const char *cap = ci_args_get(flags, nf, "--max-bytes");
  if (cap && parse_bytes(cap, &max_bytes)) {
    fprintf(stderr,
            "cinfer cache prune: --max-bytes must be a byte count like 500M or 2G (got "
            "'%s')\n",
            cap);
    return 2;
  }
  int64_t removed = 0, freed = 0;
  if (cinfer_prompt_cache_prune(dir, max_bytes, &removed, &freed) != CINFER_OK) {
    fprintf(stderr, "cinfer cache prune: %s\n", cinfer_last_error());
    return 1;
  }
  char size[32];
  ci_cli_format_bytes(freed, size, sizeof size);
  printf("removed %lld files (%s) from %s\n", (long long)removed, size, dir);
  return 0;
}
