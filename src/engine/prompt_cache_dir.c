/* A prompt-cache directory without an engine (see prompt_cache.h): the scan behind `cinfer cache
 * ls` and the pruning behind `cinfer cache prune`. */
#include "engine/prompt_cache.h"

#include "base/error.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { TMP_MAX_AGE_S = 600 }; /* a temporary file older than this was left by a crash */

/* Reads the header of (or, when verify, all of) the block file `name`. */
static void describe_file(int dirfd, const char *name, int verify, ci_prompt_cache_file *f,
                          uint8_t **keep, char *problem, size_t problem_size) {
  *keep = NULL;
  uint8_t *buf = NULL;
  size_t len = 0;
  int missing = 0;
  if (verify) {
    if (ci_block_file_read_at(dirfd, name, CI_BLOCK_FILE_MAX_BYTES, 0, &buf, &len, &missing)) {
      snprintf(problem, problem_size, "%s", missing ? "vanished" : ci_last_error());
      return;
    }
  } else {
    const int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
      snprintf(problem, problem_size, "%s",
               fd < 0 && errno == ELOOP ? "a symbolic link (never followed)"
                                        : "not a readable regular file");
      if (fd >= 0) close(fd);
      return;
    }
    const size_t want = 96 + CI_BLOCK_FILE_MAX_KEY + 4 * 64 +
                        (size_t)CI_BLOCK_FILE_GROUP_BYTES * CI_BLOCK_FILE_MAX_GROUPS;
    const size_t cap = (size_t)st.st_size < want ? (size_t)st.st_size : want;
    buf = malloc(cap ? cap : 1);
    if (buf) {
      ssize_t n;
      while (len < cap && (n = read(fd, buf + len, cap - len)) > 0) len += (size_t)n;
    }
    close(fd);
    if (!buf) {
      snprintf(problem, problem_size, "out of memory");
      return;
    }
  }
  ci_block_file_view v;
  if (ci_block_file_parse(buf, len, !verify, &v)) {
    snprintf(problem, problem_size, "%s", ci_last_error());
    free(buf);
    return;
  }
  char expected[CI_BLOCK_FILE_NAME_MAX];
  ci_block_file_name(v.hash, expected, sizeof expected);
  if (strcmp(expected, name)) {
    snprintf(problem, problem_size, "corrupt: its name does not match its hashes");
    ci_block_file_view_free(&v);
    free(buf);
    return;
  }
  if (!verify && f->bytes != (int64_t)(v.header_bytes + v.payload_bytes))
    snprintf(problem, problem_size, "%s: %lld bytes, %llu expected",
             f->bytes < (int64_t)(v.header_bytes + v.payload_bytes) ? "truncated" : "corrupt",
             (long long)f->bytes, (unsigned long long)(v.header_bytes + v.payload_bytes));
  else
    f->valid = 1;
  f->key = v.key;
  f->key_bytes = v.key_bytes;
  f->index = v.index;
  f->block_tokens = v.block_tokens;
  memcpy(f->hash, v.hash, sizeof f->hash);
  memcpy(f->parent, v.parent, sizeof f->parent);
  ci_block_file_view_free(&v);
  *keep = buf;
}

int ci_prompt_cache_scan(const char *dir, int verify,
                         int (*fn)(void *arg, const ci_prompt_cache_file *file), void *arg) {
  const int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *d = dirfd >= 0 ? fdopendir(dirfd) : NULL;
  if (!d) {
    const int err = errno;
    if (dirfd >= 0) close(dirfd);
    return ci_fail("cannot read the prompt cache directory %s: %s", dir, strerror(err));
  }
  int status = CI_OK;
  struct dirent *e;
  while (status == CI_OK && (e = readdir(d))) {
    const int tmp =
        !strncmp(e->d_name, CI_PROMPT_CACHE_TMP_PREFIX, sizeof CI_PROMPT_CACHE_TMP_PREFIX - 1);
    if (!tmp && !ci_block_file_name_valid(e->d_name)) continue;
    ci_prompt_cache_file f;
    memset(&f, 0, sizeof f);
    f.name = e->d_name;
    struct stat st;
    if (fstatat(dirfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW)) continue;
    f.bytes = (int64_t)st.st_size;
    f.mtime = st.st_mtime;
    char problem[300] = "";
    uint8_t *keep = NULL;
    if (tmp)
      snprintf(problem, sizeof problem, "temporary file (a write in progress, or a crash's)");
    else
      describe_file(dirfd, e->d_name, verify, &f, &keep, problem, sizeof problem);
    f.problem = f.valid ? NULL : problem;
    status = fn(arg, &f);
    free(keep);
  }
  closedir(d);
  return status;
}

/* ==== Pruning ==== */

typedef struct {
  char name[CI_BLOCK_FILE_NAME_MAX + 64];
  int64_t bytes;
  time_t mtime, used; /* used: the latest mtime over the block and its descendants */
  int64_t index;
  uint64_t hash[2], parent[2];
  int valid, tmp;
  int gone; /* deleted by this prune */
} prune_entry;

typedef struct {
  prune_entry *items;
  size_t n, cap;
  int oom;
} prune_list;

static int collect(void *arg, const ci_prompt_cache_file *f) {
  prune_list *l = arg;
  if (l->n == l->cap) {
    const size_t cap = l->cap ? l->cap * 2 : 256;
    prune_entry *bigger = realloc(l->items, cap * sizeof *bigger);
    if (!bigger) {
      l->oom = 1;
      return ci_fail("out of memory");
    }
    l->items = bigger;
    l->cap = cap;
  }
  prune_entry *x = &l->items[l->n++];
  memset(x, 0, sizeof *x);
  snprintf(x->name, sizeof x->name, "%s", f->name);
  x->bytes = f->bytes;
  x->mtime = x->used = f->mtime;
  x->index = f->index;
  memcpy(x->hash, f->hash, sizeof x->hash);
  memcpy(x->parent, f->parent, sizeof x->parent);
  x->valid = f->valid;
  x->tmp = !strncmp(f->name, CI_PROMPT_CACHE_TMP_PREFIX, sizeof CI_PROMPT_CACHE_TMP_PREFIX - 1);
  return CI_OK;
}

static int by_hash(const void *a, const void *b) {
  const prune_entry *x = a, *y = b;
  if (x->hash[0] != y->hash[0]) return x->hash[0] < y->hash[0] ? -1 : 1;
  if (x->hash[1] != y->hash[1]) return x->hash[1] < y->hash[1] ? -1 : 1;
  return 0;
}

/* Deepest blocks first, so a child's use reaches its parent before the parent's goes up. */
static int by_index_desc(const void *a, const void *b) {
  const prune_entry *x = *(prune_entry *const *)a, *y = *(prune_entry *const *)b;
  return x->index > y->index ? -1 : x->index < y->index;
}

/* Least recently used chains first; within one, leaves first. */
static int by_eviction(const void *a, const void *b) {
  const prune_entry *x = *(prune_entry *const *)a, *y = *(prune_entry *const *)b;
  if (x->used != y->used) return x->used < y->used ? -1 : 1;
  return x->index > y->index ? -1 : x->index < y->index;
}

int ci_prompt_cache_prune(const char *dir, int64_t max_bytes, int64_t *removed_out,
                          int64_t *freed_out) {
  prune_list l = {0};
  if (ci_prompt_cache_scan(dir, 1, collect, &l)) {
    free(l.items);
    return CI_ERR;
  }
  const int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirfd < 0) {
    free(l.items);
    return ci_fail("cannot open %s: %s", dir, strerror(errno));
  }
  int64_t removed = 0, freed = 0, total = 0;
  const time_t now = time(NULL);
  size_t n_valid = 0;
  for (size_t i = 0; i < l.n; i++) {
    prune_entry *x = &l.items[i];
    const int stale_tmp = x->tmp && now - x->mtime > TMP_MAX_AGE_S;
    if ((!x->valid && !x->tmp) || stale_tmp) {
      if (unlinkat(dirfd, x->name, 0) == 0) removed++, freed += x->bytes;
    } else if (x->valid) {
      l.items[n_valid++] = *x;
      total += x->bytes;
    }
  }
  int status = CI_OK;
  qsort(l.items, n_valid, sizeof *l.items, by_hash);
  prune_entry **order = malloc((n_valid ? n_valid : 1) * sizeof *order);
  if (!order) {
    close(dirfd);
    free(l.items);
    return ci_fail("out of memory");
  }
  for (size_t i = 0; i < n_valid; i++) order[i] = &l.items[i];
  /* orphans: a chain is read from its first block on, so a block whose predecessor is gone can
     never load (shallowest first, so a removed block's descendants follow it) */
  qsort(order, n_valid, sizeof *order, by_index_desc);
  for (size_t k = n_valid; k-- > 0;) {
    prune_entry *x = order[k];
    if (x->index == 0) continue;
    prune_entry probe;
    memcpy(probe.hash, x->parent, sizeof probe.hash);
    const prune_entry *parent = bsearch(&probe, l.items, n_valid, sizeof *l.items, by_hash);
    if ((!parent || parent->gone) && unlinkat(dirfd, x->name, 0) == 0) {
      x->gone = 1;
      removed++;
      freed += x->bytes;
      total -= x->bytes;
    }
  }
  if (max_bytes >= 0 && total > max_bytes) {
    for (size_t i = 0; i < n_valid; i++) { /* deepest first: a child's use reaches the root */
      if (order[i]->gone) continue;
      prune_entry probe;
      memcpy(probe.hash, order[i]->parent, sizeof probe.hash);
      prune_entry *parent = bsearch(&probe, l.items, n_valid, sizeof *l.items, by_hash);
      if (parent && parent->used < order[i]->used) parent->used = order[i]->used;
    }
    qsort(order, n_valid, sizeof *order, by_eviction);
    for (size_t i = 0; i < n_valid && total > max_bytes; i++)
      if (!order[i]->gone && unlinkat(dirfd, order[i]->name, 0) == 0) {
        order[i]->gone = 1;
        removed++;
        freed += order[i]->bytes;
        total -= order[i]->bytes;
      }
  }
  free(order);
  close(dirfd);
  free(l.items);
  if (removed_out) *removed_out = removed;
  if (freed_out) *freed_out = freed;
  return status;
}
