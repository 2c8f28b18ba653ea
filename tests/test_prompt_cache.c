/* Prompt cache on disk (engine/prompt_cache.h, docs/kv-cache.md "Prompt cache on disk"): an engine
 * writes its prefix cache's blocks to a directory; a second engine (a restart) over the same
 * directory reuses them, and its tokens and log-probabilities are bit-identical to the fresh
 * prefill's, for bf16 and quantized plans (converted and not yet converted blocks). A truncated,
 * oversized, corrupt (header or payload checksum), foreign (other model, other codec state, other
 * version) file, a symbolic link and a directory in a block's place are skipped with a warning and
 * never loaded; a block name that is a symbolic link is replaced, never written through; the
 * bounded queue drops blocks and an explicit save writes them; an explicit load warms the prefix
 * cache; scan and prune; sliding-window layers whose early blocks are absent from their files. Also
 * the xxHash64 test vectors the checksums rely on. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "backend/cpu/cpu_backend.h"
#include "base/error.h"
#include "base/hash64.h"
#include "engine/engine.h"
#include "engine/prompt_cache.h"
#include "kv/block_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define STARTER CI_FIXTURE_DIR "/../../models/starter"

enum { P = 70, GEN = 6, TOP = 20, T = 16, FULL_BLOCKS = (P - 1) / T };

typedef struct {
  ci_backend *be;
  ci_model *model;
} fixture;

/* What a greedy run produced: tokens, and every token's log-probability and top 20. */
typedef struct {
  int n;
  int32_t tokens[GEN];
  float logprob[GEN];
  int32_t top_ids[GEN][TOP];
  float top_lp[GEN][TOP];
  int cached;
} run_result;

/* Collected warnings. */
typedef struct {
  int n;
  char text[16][512];
} warnings;

static void on_warn(void *arg, const char *message) {
  warnings *w = arg;
  if (w->n < 16) snprintf(w->text[w->n++], sizeof w->text[0], "%s", message);
}

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  f->be = ci_cpu_backend_create(1);
  f->model = f->be ? ci_model_load(STARTER, f->be) : NULL;
  if (!f->model) {
    fprintf(stderr, "cannot load %s: %s\n", STARTER, ci_last_error());
    return -1;
  }
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  ci_model_free(f->model);
  f->be->ops->destroy(f->be);
  free(f);
  return 0;
}

/* Plans: 0 bf16, 1 affine 4 from the first chunk (converted blocks), 2 turbo 4 from position 40
 * (converted at 40), 3 affine 8 from 100 (bf16 blocks below the start). */
static void make_job(int plan, int32_t *prompt, ci_engine_job *job) {
  memset(job, 0, sizeof *job);
  for (int t = 0; t < P; t++) prompt[t] = 200 + (int32_t)((t * 53 + plan * 7) % 2500);
  job->prompt = prompt;
  job->n_prompt = P;
  job->max_tokens = GEN;
  job->top_logprobs = TOP;
  ci_sampler_params_default(&job->sampling);
  job->sampling.temperature = 0;
  if (plan == 0) return;
  static const char *const codecs[4] = {"", "affine", "turbo", "affine"};
  static const int bits[4] = {0, 4, 4, 8};
  static const int64_t starts[4] = {0, 0, 40, 100};
  job->kv_plan = CI_KV_PLAN_TARGET;
  assert_int_equal(ci_kv_format_parse(codecs[plan], bits[plan], 0, 64, &job->kv_target), 0);
  job->kv_start = starts[plan];
}

static ci_engine *make_engine(fixture *f, const char *dir, warnings *w, int64_t queue_bytes) {
  ci_engine_options o;
  ci_engine_options_default(&o);
  o.prefill_chunk = 7;
  o.batch_tokens = 64;
  o.ctx_size = 256;
  o.prefix_cache_bytes = 64 << 20;
  o.prompt_cache_dir = dir;
  o.prompt_cache_queue_bytes = queue_bytes;
  o.prompt_cache_warn = on_warn;
  o.prompt_cache_warn_arg = w;
  ci_engine *e = ci_engine_create(f->model, &o);
  if (!e) fprintf(stderr, "%s\n", ci_last_error());
  assert_non_null(e);
  return e;
}

static void run(ci_engine *e, const ci_engine_job *job, run_result *out) {
  memset(out, 0, sizeof *out);
  ci_engine_request *r;
  assert_int_equal(ci_engine_submit(e, job, &r), CI_ENGINE_SUBMITTED);
  ci_engine_event ev;
  for (;;) {
    assert_int_equal(ci_engine_request_next(r, &ev, 120.0), 1);
    if (ev.kind != CI_ENGINE_EVENT_TOKEN) break;
    assert_true(out->n < GEN);
    out->tokens[out->n] = ev.token;
    out->logprob[out->n] = ev.logprob;
    assert_int_equal(ev.n_top, TOP);
    memcpy(out->top_ids[out->n], ev.top_ids, sizeof out->top_ids[0]);
    memcpy(out->top_lp[out->n], ev.top_logprobs, sizeof out->top_lp[0]);
    out->n++;
  }
  assert_int_equal(ev.kind, CI_ENGINE_EVENT_DONE);
  out->cached = ev.cached_tokens;
  ci_engine_request_release(r);
}

/* Bit-identical tokens and log-probabilities. */
static void assert_same(const run_result *a, const run_result *b) {
  assert_int_equal(a->n, b->n);
  assert_memory_equal(a->tokens, b->tokens, sizeof a->tokens);
  assert_memory_equal(a->logprob, b->logprob, sizeof a->logprob);
  assert_memory_equal(a->top_ids, b->top_ids, sizeof a->top_ids);
  assert_memory_equal(a->top_lp, b->top_lp, sizeof a->top_lp);
}

/* ==== Directory helpers ==== */

static void make_dir(char *buf, size_t size) {
  snprintf(buf, size, "/tmp/cinfer-pcache-XXXXXX");
  assert_non_null(mkdtemp(buf));
}

static void remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char path[1024];
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    struct stat st;
    if (!lstat(path, &st) && S_ISDIR(st.st_mode))
      remove_dir(path);
    else
      unlink(path);
  }
  closedir(d);
  rmdir(dir);
}

typedef struct {
  char names[64][CI_BLOCK_FILE_NAME_MAX]; /* by block index */
  int n_valid, n_files;
  int64_t bytes;
} listing;

static int list_one(void *arg, const ci_prompt_cache_file *f) {
  listing *l = arg;
  l->n_files++;
  if (f->valid && f->index < 64) {
    snprintf(l->names[f->index], sizeof l->names[0], "%s", f->name);
    l->n_valid++;
    l->bytes += f->bytes;
  }
  return CI_OK;
}

static void list_dir(const char *dir, listing *l) {
  memset(l, 0, sizeof *l);
  assert_int_equal(ci_prompt_cache_scan(dir, 1, list_one, l), CI_OK);
}

static uint8_t *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  *len = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc(*len);
  assert_int_equal(fread(buf, 1, *len, f), *len);
  fclose(f);
  return buf;
}

static void write_all(const char *path, const uint8_t *buf, size_t len) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(buf, 1, len, f), len);
  fclose(f);
}

static void copy_dir(const char *from, const char *to) {
  DIR *d = opendir(from);
  assert_non_null(d);
  struct dirent *e;
  char a[1024], b[1024];
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    snprintf(a, sizeof a, "%s/%s", from, e->d_name);
    snprintf(b, sizeof b, "%s/%s", to, e->d_name);
    size_t len;
    uint8_t *buf = read_all(a, &len);
    write_all(b, buf, len);
    free(buf);
  }
  closedir(d);
}

/* Rewrites a block file with its key text passed through `edit` (replace `from` by `to`) and,
 * when version > 0, that version number; both checksums are recomputed, so only the meaning
 * differs (a foreign file). */
static void rewrite_file(const char *path, const char *from, const char *to, uint32_t version) {
  size_t len;
  uint8_t *buf = read_all(path, &len);
  ci_block_file_view v;
  assert_int_equal(ci_block_file_parse(buf, len, 0, &v), CI_OK);
  char key[4096];
  snprintf(key, sizeof key, "%.*s", (int)v.key_bytes, v.key);
  if (from) {
    char *at = strstr(key, from);
    assert_non_null(at);
    char rest[4096];
    snprintf(rest, sizeof rest, "%s", at + strlen(from));
    snprintf(at, sizeof key - (size_t)(at - key), "%s%s", to, rest);
  }
  int32_t tokens[64];
  for (int t = 0; t < v.block_tokens; t++) tokens[t] = ci_block_file_token(&v, t);
  const size_t header = ci_block_file_header_bytes(strlen(key), v.block_tokens, v.n_groups);
  const size_t out_len = header + v.payload_bytes;
  uint8_t *out = malloc(out_len);
  ci_block_file_write_header(out, v.hash, v.parent, v.index, tokens, v.block_tokens, key,
                             strlen(key), v.groups, v.n_groups);
  memcpy(out + header, v.payload, v.payload_bytes);
  if (version) {
    for (int i = 0; i < 4; i++) out[8 + i] = (uint8_t)(version >> (8 * i));
  }
  ci_block_file_seal(out, out_len);
  write_all(path, out, out_len);
  ci_block_file_view_free(&v);
  free(out);
  free(buf);
}

/* ==== Tests ==== */

static void test_hash64_vectors(void **state) {
  (void)state;
  assert_true(ci_hash64("", 0, 0) == 0xEF46DB3751D8E999ULL);
  assert_true(ci_hash64("abc", 3, 0) == 0x44BC2CF5AD770999ULL);
  /* streaming in odd pieces equals one call */
  uint8_t data[1000];
  for (int i = 0; i < 1000; i++) data[i] = (uint8_t)(i * 7 + 3);
  ci_hash64_state s;
  ci_hash64_init(&s, 42);
  for (int at = 0; at < 1000;) {
    const int n = at % 37 + 1 < 1000 - at ? at % 37 + 1 : 1000 - at;
    ci_hash64_update(&s, data + at, (size_t)n);
    at += n;
  }
  assert_true(ci_hash64_digest(&s) == ci_hash64(data, 1000, 42));
}

/* Restart reuse: engine A prefills and writes; engine B (fresh, same directory) attaches the
 * blocks from disk and gives bit-identical results. */
static void test_restart_reuse(void **state) {
  fixture *f = *state;
  for (int plan = 0; plan < 4; plan++) {
    char dir[64];
    make_dir(dir, sizeof dir);
    int32_t prompt[P];
    ci_engine_job job;
    make_job(plan, prompt, &job);
    warnings w = {0};
    run_result fresh, again;
    ci_engine *a = make_engine(f, dir, &w, 0);
    run(a, &job, &fresh);
    assert_int_equal(fresh.cached, 0);
    ci_engine_free(a); /* writes out what is queued */
    listing l;
    list_dir(dir, &l);
    assert_true(l.n_valid >= FULL_BLOCKS);
    ci_engine *b = make_engine(f, dir, &w, 0);
    run(b, &job, &again);
    assert_int_equal(again.cached, FULL_BLOCKS * T);
    assert_same(&fresh, &again);
    ci_engine_stats st;
    ci_engine_get_stats(b, &st);
    assert_int_equal(st.prompt_cache_blocks_loaded, FULL_BLOCKS);
    assert_int_equal(st.prompt_cache_files_rejected, 0);
    ci_engine_free(b);
    assert_int_equal(w.n, 0);
    remove_dir(dir);
  }
}

/* Sliding-window layers (window 256): a 400-token prompt prefilled in chunks of 300 releases the
 * sliding group's blocks 0 and 1 before the prefix cache takes them, so their files hold the
 * full-attention group only (an absent group); a restart still attaches 384 positions (the
 * window's blocks are there) and continues bit-identically to an in-memory hit. */
static void test_restart_sliding_window(void **state) {
  fixture *f = *state;
  enum { P2 = 400 };
  char dir[64];
  make_dir(dir, sizeof dir);
  int32_t prompt[P2];
  ci_engine_job job;
  make_job(0, prompt, &job);
  for (int t = 0; t < P2; t++) prompt[t] = 300 + (int32_t)((t * 31) % 2000);
  job.n_prompt = P2;
  warnings w = {0};
  run_result fresh, hit, again;
  for (int pass = 0; pass < 2; pass++) {
    ci_engine_options o;
    ci_engine_options_default(&o);
    o.prefill_chunk = 300;
    o.batch_tokens = 512;
    o.ctx_size = 1024;
    o.prefix_cache_bytes = 64 << 20;
    o.prompt_cache_dir = dir;
    o.prompt_cache_warn = on_warn;
    o.prompt_cache_warn_arg = &w;
    ci_engine *e = ci_engine_create(f->model, &o);
    assert_non_null(e);
    if (pass == 0) {
      run(e, &job, &fresh);
      run(e, &job, &hit); /* the in-memory prefix cache */
    } else {
      run(e, &job, &again); /* the same blocks, from disk */
    }
    ci_engine_free(e);
  }
  assert_int_equal(fresh.cached, 0);
  assert_int_equal(hit.cached, (P2 - 1) / T * T);
  assert_int_equal(again.cached, hit.cached);
  /* a 16-row last chunk rounds differently from the fresh run's 100-row one, so the restart is
     compared bit for bit with the in-memory hit, and by greedy tokens with the fresh run */
  assert_same(&hit, &again);
  assert_memory_equal(fresh.tokens, again.tokens, sizeof fresh.tokens);
  /* block 0's file has the full group only */
  listing l;
  list_dir(dir, &l);
  char path[256];
  snprintf(path, sizeof path, "%s/%s", dir, l.names[0]);
  size_t len;
  uint8_t *buf = read_all(path, &len);
  ci_block_file_view v;
  assert_int_equal(ci_block_file_parse(buf, len, 0, &v), CI_OK);
  int absent = 0;
  for (int g = 0; g < v.n_groups; g++) absent += !v.groups[g].present;
  assert_int_equal(absent, 1);
  ci_block_file_view_free(&v);
  free(buf);
  assert_int_equal(w.n, 0);
  remove_dir(dir);
}

/* Every kind of bad file is skipped with a warning naming the problem; the blocks before it are
 * used and the result stays identical to a fresh prefill. */
static void test_bad_files_skipped(void **state) {
  fixture *f = *state;
  char good[64];
  make_dir(good, sizeof good);
  int32_t prompt[P];
  ci_engine_job job;
  make_job(0, prompt, &job);
  warnings w = {0};
  run_result fresh;
  ci_engine *a = make_engine(f, good, &w, 0);
  run(a, &job, &fresh);
  ci_engine_free(a);
  listing l;
  list_dir(good, &l);
  enum { BAD = 2 }; /* the block broken in each case: blocks 0 and 1 still load */
  static const struct {
    const char *what;
    const char *expect; /* in the warning */
  } cases[] = {
      {"truncated", "truncated"},           {"payload byte", "checksum"},
      {"header byte", "checksum"},          {"other model", "model differs"},
      {"other codec", "plan differs"},      {"other backend", "backend differs"},
      {"other adapter", "adapter differs"}, {"version", "version 2"},
      {"symlink", "symbolic link"},         {"directory", "not a regular file"},
      {"not a block", "bad magic"},         {"oversized", "bytes of payload"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    char dir[64], path[256], outside[128];
    make_dir(dir, sizeof dir);
    copy_dir(good, dir);
    snprintf(path, sizeof path, "%s/%s", dir, l.names[BAD]);
    snprintf(outside, sizeof outside, "%s.outside", dir);
    size_t len;
    uint8_t *buf = read_all(path, &len);
    switch (c) {
    case 0:
      write_all(path, buf, len / 2);
      break;
    case 1:
      buf[len - 5] ^= 0x40;
      write_all(path, buf, len);
      break;
    case 2:
      buf[100] ^= 0x01; /* inside the key text */
      write_all(path, buf, len);
      break;
    case 3:
      rewrite_file(path, "model=", "model=0", 0);
      break;
    case 4:
      rewrite_file(path, "plan=none", "plan=affine:4:64", 0);
      break;
    case 5:
      rewrite_file(path, "backend=cpu", "backend=cuda", 0);
      break;
    case 6:
      rewrite_file(path, "adapter=", "adapter=sql-lora", 0);
      break;
    case 7:
      rewrite_file(path, NULL, NULL, 2);
      break;
    case 8: /* a valid block outside, reached through a link: never followed */
      write_all(outside, buf, len);
      unlink(path);
      assert_int_equal(symlink(outside, path), 0);
      break;
    case 9:
      unlink(path);
      assert_int_equal(mkdir(path, 0700), 0);
      break;
    case 10:
      memset(buf, 'x', 64);
      write_all(path, buf, len);
      break;
    case 11: { /* valid, with bytes appended */
      uint8_t *big = calloc(1, len + 4096);
      memcpy(big, buf, len);
      write_all(path, big, len + 4096);
      free(big);
      break;
    }
    }
    free(buf);
    warnings wb = {0};
    ci_engine *b = make_engine(f, dir, &wb, 0);
    run_result got;
    run(b, &job, &got);
    ci_engine_stats st;
    ci_engine_get_stats(b, &st);
    ci_engine_free(b);
    if (got.cached != BAD * T || wb.n < 1 || !strstr(wb.text[0], cases[c].expect))
      fprintf(stderr, "case %s: cached %d, warning: %s\n", cases[c].what, got.cached,
              wb.n ? wb.text[0] : "(none)");
    assert_int_equal(got.cached, BAD * T);
    assert_true(wb.n >= 1);
    assert_non_null(strstr(wb.text[0], cases[c].expect));
    assert_non_null(strstr(wb.text[0], l.names[BAD]));
    assert_int_equal(st.prompt_cache_files_rejected, 1);
    assert_int_equal(st.prompt_cache_blocks_loaded, BAD);
    assert_same(&fresh, &got);
    if (c == 8) { /* the link was replaced by the block, the outside file left alone */
      struct stat sb;
      assert_int_equal(lstat(path, &sb), 0);
      assert_true(S_ISREG(sb.st_mode));
      size_t outside_len;
      uint8_t *o = read_all(outside, &outside_len);
      assert_int_equal(outside_len, len);
      free(o);
      unlink(outside);
    }
    remove_dir(dir);
  }
  remove_dir(good);
}

/* A block name that is a symbolic link to a file outside: the writer replaces the link with its
 * own file and never writes through it. */
static void test_symlink_never_written_through(void **state) {
  fixture *f = *state;
  char first[64], dir[64], victim[128];
  make_dir(first, sizeof first);
  make_dir(dir, sizeof dir);
  snprintf(victim, sizeof victim, "%s/victim", first);
  int32_t prompt[P];
  ci_engine_job job;
  make_job(0, prompt, &job);
  warnings w = {0};
  run_result r;
  ci_engine *a = make_engine(f, first, &w, 0);
  run(a, &job, &r);
  ci_engine_free(a);
  listing l;
  list_dir(first, &l);
  write_all(victim, (const uint8_t *)"precious", 8);
  char path[256];
  for (int i = 0; i < FULL_BLOCKS; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, l.names[i]);
    assert_int_equal(symlink(victim, path), 0);
  }
  warnings wb = {0};
  ci_engine *b = make_engine(f, dir, &wb, 0);
  run(b, &job, &r);
  ci_engine_free(b);
  assert_int_equal(r.cached, 0);
  assert_true(wb.n >= 1 && strstr(wb.text[0], "symbolic link"));
  size_t len;
  uint8_t *content = read_all(victim, &len);
  assert_int_equal(len, 8);
  assert_memory_equal(content, "precious", 8);
  free(content);
  listing after;
  list_dir(dir, &after);
  assert_true(after.n_valid >= FULL_BLOCKS); /* the links became real blocks */
  remove_dir(dir);
  remove_dir(first);
}

/* A queue with room for one block drops the others (counted); an explicit save writes them all
 * and returns once they are on disk; an explicit load in a new engine warms the prefix cache. */
static void test_queue_save_load(void **state) {
  fixture *f = *state;
  char dir[64];
  make_dir(dir, sizeof dir);
  int32_t prompt[P];
  ci_engine_job job;
  make_job(1, prompt, &job);
  warnings w = {0};
  run_result fresh, got;
  ci_engine *a = make_engine(f, dir, &w, 1); /* 1 byte: only an idle writer takes a block */
  run(a, &job, &fresh);
  ci_engine_stats st;
  ci_engine_get_stats(a, &st);
  const int64_t dropped = st.prompt_cache_blocks_dropped;
  int64_t saved = -1;
  assert_int_equal(ci_engine_prompt_cache_save(a, &saved), CI_OK);
  assert_int_equal(saved, dropped);
  ci_engine_get_stats(a, &st);
  assert_int_equal(st.prompt_cache_queued_bytes, 0);
  listing l;
  list_dir(dir, &l);
  assert_int_equal(l.n_valid, (int)st.prompt_cache_blocks_written);
  assert_true(l.n_valid >= FULL_BLOCKS);
  assert_int_equal(ci_engine_prompt_cache_save(a, &saved), CI_OK); /* nothing left */
  assert_int_equal(saved, 0);
  ci_engine_free(a);

  ci_engine *b = make_engine(f, dir, &w, 0);
  int64_t cached = 0, loaded = 0;
  assert_int_equal(ci_engine_prompt_cache_load(b, &job, &cached, &loaded), CI_OK);
  assert_int_equal(cached, (P / T) * T);
  assert_int_equal(loaded, P / T);
  ci_engine_get_stats(b, &st);
  assert_int_equal(st.prompt_cache_blocks_loaded, P / T);
  run(b, &job, &got);
  assert_int_equal(got.cached, FULL_BLOCKS * T);
  assert_same(&fresh, &got);
  ci_engine_get_stats(b, &st);
  assert_int_equal(st.prompt_cache_blocks_loaded, P / T); /* the request read nothing more */
  ci_engine_free(b);
  assert_int_equal(w.n, 0);
  remove_dir(dir);
}

/* Scan and prune: invalid files and stale temporary files go; a byte cap removes the deepest
 * blocks of the least recently used prompts first, so what stays is a prefix that still loads. */
static void test_scan_prune(void **state) {
  fixture *f = *state;
  char dir[64], path[256];
  make_dir(dir, sizeof dir);
  int32_t prompt[P];
  ci_engine_job job;
  make_job(0, prompt, &job);
  warnings w = {0};
  run_result fresh, got;
  ci_engine *a = make_engine(f, dir, &w, 0);
  run(a, &job, &fresh);
  ci_engine_free(a);
  listing l;
  list_dir(dir, &l);
  const int n = l.n_valid;
  assert_true(n >= FULL_BLOCKS);
  const int64_t per_file = l.bytes / n;
  /* junk: a corrupt block file, a stale temporary file, an unrelated file (left alone) */
  snprintf(path, sizeof path, "%s/0123456789abcdef0123456789abcdef.kvb", dir);
  write_all(path, (const uint8_t *)"garbage", 7);
  snprintf(path, sizeof path, "%s/.tmp-stale", dir);
  write_all(path, (const uint8_t *)"partial", 7);
  struct timespec old[2] = {{1000, 0}, {1000, 0}};
  assert_int_equal(utimensat(AT_FDCWD, path, old, 0), 0);
  snprintf(path, sizeof path, "%s/notes.txt", dir);
  write_all(path, (const uint8_t *)"mine", 4);
  int64_t removed = 0, freed = 0;
  assert_int_equal(ci_prompt_cache_prune(dir, -1, &removed, &freed), CI_OK);
  assert_int_equal(removed, 2);
  assert_int_equal(freed, 14);
  assert_int_equal(access(path, F_OK), 0);
  /* cap at two blocks: blocks 0 and 1 stay */
  assert_int_equal(ci_prompt_cache_prune(dir, 2 * per_file, &removed, &freed), CI_OK);
  assert_int_equal(removed, n - 2);
  list_dir(dir, &l);
  assert_int_equal(l.n_valid, 2);
  assert_true(l.names[0][0] && l.names[1][0]);
  ci_engine *b = make_engine(f, dir, &w, 0);
  run(b, &job, &got);
  ci_engine_free(b);
  assert_int_equal(got.cached, 2 * T);
  assert_same(&fresh, &got);
  assert_int_equal(w.n, 0);
  /* a chain whose first block is damaged can never load: prune takes the rest with it */
  list_dir(dir, &l); /* b wrote the blocks after the two it read again */
  const int chain = l.n_valid;
  assert_true(chain >= FULL_BLOCKS);
  snprintf(path, sizeof path, "%s/%s", dir, l.names[0]);
  assert_int_equal(truncate(path, 50), 0);
  assert_int_equal(ci_prompt_cache_prune(dir, -1, &removed, &freed), CI_OK);
  list_dir(dir, &l);
  assert_int_equal(l.n_valid, 0);
  assert_int_equal(removed, chain);
  remove_dir(dir);
}

/* The parser on damaged images: every truncation and every single flipped byte of a real block
 * file is rejected with a message (the checksums see every byte), and nothing crashes. */
static void test_parse_damaged(void **state) {
  fixture *f = *state;
  char dir[64], path[256];
  make_dir(dir, sizeof dir);
  int32_t prompt[P];
  ci_engine_job job;
  make_job(2, prompt, &job);
  warnings w = {0};
  run_result r;
  ci_engine *a = make_engine(f, dir, &w, 0);
  run(a, &job, &r);
  ci_engine_free(a);
  listing l;
  list_dir(dir, &l);
  snprintf(path, sizeof path, "%s/%s", dir, l.names[1]);
  size_t len;
  uint8_t *buf = read_all(path, &len);
  ci_block_file_view v;
  assert_int_equal(ci_block_file_parse(buf, len, 0, &v), CI_OK);
  ci_block_file_view_free(&v);
  for (size_t n = 0; n < len; n += n < 512 ? 1 : 97) {
    assert_int_equal(ci_block_file_parse(buf, n, 0, &v), CI_ERR);
    assert_true(strlen(ci_last_error()) > 0);
  }
  for (size_t at = 0; at < len; at += at < 1024 ? 1 : 61) {
    buf[at] ^= 0x10;
    assert_int_equal(ci_block_file_parse(buf, len, 0, &v), CI_ERR);
    buf[at] ^= 0x10;
  }
  free(buf);
  remove_dir(dir);
}

/* A directory that cannot be made is an error naming it. */
static void test_bad_directory(void **state) {
  fixture *f = *state;
  ci_engine_options o;
  ci_engine_options_default(&o);
  o.ctx_size = 256;
  o.prompt_cache_dir = "/proc/cinfer-no-such-dir/x";
  assert_null(ci_engine_create(f->model, &o));
  assert_non_null(strstr(ci_last_error(), "/proc/cinfer-no-such-dir/x"));
  o.prompt_cache_dir = "/tmp";
  o.prefix_cache_bytes = 0;
  assert_null(ci_engine_create(f->model, &o));
  assert_non_null(strstr(ci_last_error(), "prefix cache"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hash64_vectors),
      cmocka_unit_test(test_restart_reuse),
      cmocka_unit_test(test_restart_sliding_window),
      cmocka_unit_test(test_bad_files_skipped),
      cmocka_unit_test(test_symlink_never_written_through),
      cmocka_unit_test(test_queue_save_load),
      cmocka_unit_test(test_scan_prune),
      cmocka_unit_test(test_parse_damaged),
      cmocka_unit_test(test_bad_directory),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
