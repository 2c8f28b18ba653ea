/* Prompt cache on disk (see prompt_cache.h): the bounded write queue and its writer thread, and
 * the chain walk that loads blocks at admission. The directory tools are prompt_cache_dir.c. */
#include "engine/prompt_cache.h"

#include "base/error.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const int64_t DEFAULT_QUEUE_BYTES = (int64_t)256 << 20;

typedef struct job {
  struct job *next;
  uint8_t *buf; /* the whole file image */
  size_t len;
  char name[CI_BLOCK_FILE_NAME_MAX];
} job;

struct ci_prompt_cache {
  char *dir;
  int dirfd;
  ci_kv_cache *kv;
  ci_prompt_cache_warn_fn warn;
  void *warn_arg;
  int64_t cap;
  pthread_t writer;
  int writer_started;
  pthread_mutex_t mu; /* everything below */
  pthread_cond_t work, idle;
  job *head, *tail;
  int busy; /* the writer holds a job */
  int stopping;
  unsigned long tmp_counter;
  ci_prompt_cache_stats stats;
};

static void warnf(ci_prompt_cache *pc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warnf(ci_prompt_cache *pc, const char *fmt, ...) {
  if (!pc->warn) return;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pc->warn(pc->warn_arg, msg);
}

/* ==== Files ==== */

/* Writes one file image atomically: a temporary file of our own (created exclusively, never
 * through a link), renamed over the name. Returns CI_OK or CI_ERR. */
static int write_file_at(ci_prompt_cache *pc, const job *j, unsigned long counter) {
  char tmp[96];
  snprintf(tmp, sizeof tmp, "%s%s-%ld-%lu", CI_PROMPT_CACHE_TMP_PREFIX, j->name, (long)getpid(),
           counter);
  const int fd = openat(pc->dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return ci_fail("cannot create %s/%s: %s", pc->dir, tmp, strerror(errno));
  size_t done = 0;
  while (done < j->len) {
    const ssize_t n = write(fd, j->buf + done, j->len - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += (size_t)n;
  }
  const int failed = done < j->len || close(fd) != 0;
  if (failed || renameat(pc->dirfd, tmp, pc->dirfd, j->name)) {
    const int err = errno;
    unlinkat(pc->dirfd, tmp, 0);
    return ci_fail("cannot write %s/%s: %s", pc->dir, j->name, strerror(err));
  }
  return CI_OK;
}

/* ==== The writer ==== */

static void *writer_main(void *arg) {
  ci_prompt_cache *pc = arg;
  pthread_mutex_lock(&pc->mu);
  for (;;) {
    while (!pc->head && !pc->stopping) pthread_cond_wait(&pc->work, &pc->mu);
    if (!pc->head) break; /* stopping and drained */
    job *j = pc->head;
    pc->head = j->next;
    if (!pc->head) pc->tail = NULL;
    pc->busy = 1;
    const unsigned long counter = pc->tmp_counter++;
    pthread_mutex_unlock(&pc->mu);
    ci_block_file_seal(j->buf, j->len);
    const int status = write_file_at(pc, j, counter);
    pthread_mutex_lock(&pc->mu);
    const int64_t errors = pc->stats.write_errors;
    pthread_mutex_unlock(&pc->mu);
    /* a full or read-only disk fails every write: say so a few times, then now and then */
    if (status && (errors < 3 || errors % 1000 == 0))
      warnf(pc, "prompt cache: %s%s", ci_last_error(),
            errors == 2 ? " (further write errors are only counted, see /stats)" : "");
    pthread_mutex_lock(&pc->mu);
    pc->stats.queued_bytes -= (int64_t)j->len;
    if (status) {
      pc->stats.write_errors++;
    } else {
      pc->stats.blocks_written++;
      pc->stats.bytes_written += (int64_t)j->len;
    }
    pc->busy = 0;
    if (!pc->head) pthread_cond_broadcast(&pc->idle);
    free(j->buf);
    free(j);
  }
  pthread_cond_broadcast(&pc->idle);
  pthread_mutex_unlock(&pc->mu);
  return NULL;
}

ci_prompt_cache *ci_prompt_cache_open(const char *dir, ci_kv_cache *kv, int64_t queue_bytes,
                                      ci_prompt_cache_warn_fn warn, void *warn_arg) {
  if (!dir || !*dir) return ci_fail("prompt cache: no directory given"), NULL;
  if (kv->n_ranks > 1)
    return ci_fail("prompt cache: a model split over ranks (--tensor-parallel) cannot keep its KV "
                   "on disk yet"),
           NULL;
  if (mkdir(dir, 0700) && errno != EEXIST)
    return ci_fail("prompt cache: cannot create %s: %s", dir, strerror(errno)), NULL;
  ci_prompt_cache *pc = calloc(1, sizeof *pc);
  if (!pc || !(pc->dir = strdup(dir))) {
    free(pc);
    return ci_fail("prompt cache: out of memory"), NULL;
  }
  pc->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (pc->dirfd < 0) {
    ci_fail("prompt cache: %s is not a directory we can open: %s", dir, strerror(errno));
    free(pc->dir);
    free(pc);
    return NULL;
  }
  pc->kv = kv;
  pc->cap = queue_bytes > 0 ? queue_bytes : DEFAULT_QUEUE_BYTES;
  pc->warn = warn;
  pc->warn_arg = warn_arg;
  pthread_mutex_init(&pc->mu, NULL);
  pthread_cond_init(&pc->work, NULL);
  pthread_cond_init(&pc->idle, NULL);
  if (pthread_create(&pc->writer, NULL, writer_main, pc)) {
    ci_prompt_cache_close(pc);
    return ci_fail("prompt cache: cannot start the writer thread"), NULL;
  }
  pc->writer_started = 1;
  return pc;
}

void ci_prompt_cache_close(ci_prompt_cache *pc) {
  if (!pc) return;
  pthread_mutex_lock(&pc->mu);
  pc->stopping = 1;
  pthread_cond_signal(&pc->work);
  pthread_mutex_unlock(&pc->mu);
  if (pc->writer_started) pthread_join(pc->writer, NULL);
  for (job *j = pc->head, *next; j; j = next) { /* only when the writer never started */
    next = j->next;
    free(j->buf);
    free(j);
  }
  pthread_mutex_destroy(&pc->mu);
  pthread_cond_destroy(&pc->work);
  pthread_cond_destroy(&pc->idle);
  close(pc->dirfd);
  free(pc->dir);
  free(pc);
}

void ci_prompt_cache_flush(ci_prompt_cache *pc) {
  pthread_mutex_lock(&pc->mu);
  while (pc->head || pc->busy) pthread_cond_wait(&pc->idle, &pc->mu);
  pthread_mutex_unlock(&pc->mu);
}

void ci_prompt_cache_count_drop(ci_prompt_cache *pc) {
  pthread_mutex_lock(&pc->mu);
  pc->stats.blocks_dropped++;
  pthread_mutex_unlock(&pc->mu);
}

void ci_prompt_cache_get_stats(ci_prompt_cache *pc, ci_prompt_cache_stats *stats) {
  pthread_mutex_lock(&pc->mu);
  *stats = pc->stats;
  pthread_mutex_unlock(&pc->mu);
}

/* ==== Engine thread: queueing a block ==== */

int ci_prompt_cache_enqueue(ci_prompt_cache *pc, const char *key_text, const ci_prefix_block *b) {
  ci_block_file_group *groups = calloc((size_t)b->n_groups, sizeof *groups);
  if (!groups) return 0;
  size_t payload = 0;
  for (int g = 0; g < b->n_groups; g++) {
    const ci_kv_block_ref *ref = &b->refs[g];
    groups[g].present = ref->id >= 0;
    groups[g].format = ref->id >= 0 ? ref->pool->format : ci_kv_format_plain(CI_KV_BF16);
    groups[g].bytes = ref->id >= 0 ? ref->pool->block_stride : 0;
    payload += groups[g].bytes;
  }
  const size_t key_bytes = strlen(key_text);
  const size_t header = ci_block_file_header_bytes(key_bytes, b->block_tokens, b->n_groups);
  const size_t len = header + payload;
  pthread_mutex_lock(&pc->mu);
  const int room = (!pc->head && !pc->busy) || pc->stats.queued_bytes + (int64_t)len <= pc->cap;
  pthread_mutex_unlock(&pc->mu);
  job *j = room ? calloc(1, sizeof *j) : NULL;
  uint8_t *buf = j ? malloc(len) : NULL;
  if (!buf) { /* no room (or out of memory): not persisted now */
    free(j);
    free(groups);
    return 0;
  }
  ci_block_file_write_header(buf, b->hash, b->parent, b->index, b->tokens, b->block_tokens,
                             key_text, key_bytes, groups, b->n_groups);
  size_t at = header;
  for (int g = 0; g < b->n_groups; g++) {
    if (!groups[g].present) continue;
    const ci_kv_pool *pool = b->refs[g].pool;
    pool->be->ops->download(pool->be, buf + at, ci_kv_pool_block_at(pool, b->refs[g].id, 0, 0),
                            pool->block_stride);
    at += pool->block_stride;
  }
  free(groups);
  j->buf = buf;
  j->len = len;
  ci_block_file_name(b->hash, j->name, sizeof j->name);
  pthread_mutex_lock(&pc->mu);
  if (pc->tail)
    pc->tail->next = j;
  else
    pc->head = j;
  pc->tail = j;
  pc->stats.queued_bytes += (int64_t)len;
  pthread_cond_signal(&pc->work);
  pthread_mutex_unlock(&pc->mu);
  return 1;
}

/* ==== Engine thread: loading a chain ==== */

/* The first space-separated field of two key texts that differs ("model", "codec", ...), for the
 * warning about a file written under another key. */
static void key_difference(const char *a, size_t na, const char *b, char *out, size_t size) {
  size_t i = 0, j = 0;
  const size_t nb = strlen(b);
  while (i < na || j < nb) {
    size_t ie = i, je = j;
    while (ie < na && a[ie] != ' ') ie++;
    while (je < nb && b[je] != ' ') je++;
    if (ie - i != je - j || memcmp(a + i, b + j, ie - i)) {
      size_t k = j;
      while (k < je && b[k] != '=') k++;
      snprintf(out, size, "%.*s", (int)(k - j), b + j);
      return;
    }
    i = ie < na ? ie + 1 : ie;
    j = je < nb ? je + 1 : je;
  }
  snprintf(out, size, "key");
}

/* Checks a parsed file against what block `index` of this chain must be. CI_ERR naming the
 * mismatch. */
static int check_block(const ci_prompt_cache *pc, const ci_block_file_view *v, const char *key_text,
                       const uint64_t hash[2], const uint64_t parent[2], int64_t index,
                       const int32_t *tokens, const ci_kv_format *formats) {
  const ci_kv_cache *kv = pc->kv;
  if (v->key_bytes != strlen(key_text) || memcmp(v->key, key_text, v->key_bytes)) {
    char field[64];
    key_difference(v->key, v->key_bytes, key_text, field, sizeof field);
    return ci_fail("foreign: written under another key (its %s differs%s)", field,
                   !strcmp(field, "model") ? ": another model or other weights" : "");
  }
  if (v->block_tokens != kv->block_tokens || v->n_groups != kv->n_groups)
    return ci_fail("foreign: block size or layer groups differ");
  if (v->index != index || v->hash[0] != hash[0] || v->hash[1] != hash[1] ||
      v->parent[0] != parent[0] || v->parent[1] != parent[1])
    return ci_fail("foreign: not this prompt's block %lld (hash mismatch)", (long long)index);
  for (int t = 0; t < kv->block_tokens; t++)
    if (ci_block_file_token(v, t) != tokens[index * kv->block_tokens + t])
      return ci_fail("foreign: its token ids differ from the prompt's");
  for (int g = 0; g < kv->n_groups; g++) {
    const ci_block_file_group *x = &v->groups[g];
    if (!x->present) continue;
    if (!ci_kv_format_equal(&x->format, &formats[g]))
      return ci_fail("foreign: layer group %d is in another KV format", g);
    const size_t want = ci_kv_block_stride(&formats[g], kv->block_tokens, kv->groups[g].n_layers,
                                           kv->groups[g].n_kv_heads, kv->groups[g].head_dim);
    if (x->bytes != want)
      return ci_fail("foreign: layer group %d holds %llu bytes per block, %zu expected", g,
                     (unsigned long long)x->bytes, want);
  }
  return CI_OK;
}

/* Takes a block in each present group's pool and uploads the payload into it; refs[g] gets the
 * block (id -1 for absent groups). CI_ERR (blocks given back) when the KV memory is used up. */
static int restore_blocks(ci_prompt_cache *pc, const ci_block_file_view *v,
                          const ci_kv_format *formats, ci_kv_block_ref *refs) {
  ci_kv_cache *kv = pc->kv;
  const uint8_t *at = v->payload;
  for (int g = 0; g < kv->n_groups; g++) refs[g] = (ci_kv_block_ref){NULL, -1};
  for (int g = 0; g < kv->n_groups; g++) {
    if (!v->groups[g].present) continue;
    ci_kv_pool *pool = ci_kv_cache_pool(kv, g, &formats[g]);
    const int32_t id = pool ? ci_kv_pool_alloc(pool) : -1;
    if (id < 0) {
      for (int h = 0; h < g; h++)
        if (refs[h].id >= 0) ci_kv_pool_release(refs[h].pool, refs[h].id);
      return CI_ERR;
    }
    pool->be->ops->upload(pool->be, ci_kv_pool_block_at(pool, id, 0, 0), at, pool->block_stride);
    at += pool->block_stride;
    refs[g] = (ci_kv_block_ref){pool, id};
  }
  return CI_OK;
}

int64_t ci_prompt_cache_fill(ci_prompt_cache *pc, ci_prefix_cache *prefix, uint64_t key,
                             const char *key_text, const ci_kv_format *formats,
                             const int32_t *tokens, int64_t max_blocks, int64_t max_bytes) {
  const int64_t first = ci_prefix_cache_lookup(prefix, key, tokens, max_blocks);
  if (first >= max_blocks) return 0;
  const int T = pc->kv->block_tokens;
  uint64_t(*hashes)[2] = malloc((size_t)max_blocks * sizeof *hashes);
  ci_kv_block_ref *refs = malloc((size_t)pc->kv->n_groups * sizeof *refs);
  if (!hashes || !refs) {
    free(hashes);
    free(refs);
    return 0;
  }
  ci_prefix_chain_hashes(key, tokens, T, max_blocks, hashes);
  uint64_t seeds[2];
  ci_prefix_chain_seeds(key, seeds);
  int64_t loaded = 0, bytes = 0;
  for (int64_t i = first; i < max_blocks; i++) {
    char name[CI_BLOCK_FILE_NAME_MAX];
    ci_block_file_name(hashes[i], name, sizeof name);
    uint8_t *buf;
    size_t len;
    int missing;
    if (ci_block_file_read_at(pc->dirfd, name, CI_BLOCK_FILE_MAX_BYTES, 1, &buf, &len, &missing)) {
      if (!missing) {
        warnf(pc, "prompt cache: skipped %s/%s: %s", pc->dir, name, ci_last_error());
        pthread_mutex_lock(&pc->mu);
        pc->stats.files_rejected++;
        pthread_mutex_unlock(&pc->mu);
      }
      break;
    }
    ci_block_file_view v;
    int status = ci_block_file_parse(buf, len, 0, &v);
    if (status == CI_OK) {
      status =
          check_block(pc, &v, key_text, hashes[i], i ? hashes[i - 1] : seeds, i, tokens, formats);
      if (status == CI_OK && bytes + (int64_t)v.payload_bytes > max_bytes) {
        ci_block_file_view_free(&v);
        free(buf);
        break; /* no room: not the file's fault */
      }
    }
    if (status) {
      warnf(pc, "prompt cache: skipped %s/%s: %s", pc->dir, name, ci_last_error());
      pthread_mutex_lock(&pc->mu);
      pc->stats.files_rejected++;
      pthread_mutex_unlock(&pc->mu);
      ci_block_file_view_free(&v);
      free(buf);
      break;
    }
    const int restored = restore_blocks(pc, &v, formats, refs) == CI_OK;
    const int64_t payload = (int64_t)v.payload_bytes;
    ci_block_file_view_free(&v);
    free(buf);
    if (!restored) break; /* KV memory used up: what is loaded stays */
    status = ci_prefix_cache_add_block(prefix, key, tokens, i, refs, 1);
    for (int g = 0; g < pc->kv->n_groups; g++) /* the prefix cache holds its own reference */
      if (refs[g].id >= 0) ci_kv_pool_release(refs[g].pool, refs[g].id);
    if (status) break;
    loaded++;
    bytes += payload;
  }
  pthread_mutex_lock(&pc->mu);
  pc->stats.blocks_loaded += loaded;
  pc->stats.bytes_loaded += bytes;
  pthread_mutex_unlock(&pc->mu);
  free(hashes);
  free(refs);
  return loaded;
}
