/* BPE model: merges ranked in a (left id, right id) -> (rank, merged id) hash table, words merged
 * lowest-rank-first with a binary heap over a linked list of symbols (HF's Word::merge_all), byte
 * fallback, unk fusing, ignore_merges, continuing-subword prefix and end-of-word suffix, and a
 * per-call cache of words already seen. */
#include "base/error.h"
#include "text/tok_model.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  uint64_t *keys; /* (left << 32 | right), UINT64_MAX = empty */
  uint64_t *vals; /* (rank << 32 | merged id) */
  size_t mask;
} merge_table;

typedef struct {
  merge_table merges;
  int32_t unk_id; /* -1 none, -2 named but missing from the vocab */
  char *unk_token;
  char *prefix, *suffix; /* NULL when absent or empty */
  size_t prefix_len, suffix_len;
  int fuse_unk, byte_fallback, ignore_merges;
  int32_t byte_ids[256]; /* "<0xXX>" ids, -1 when absent */
  int32_t *bmp_ids;      /* single-character tokens below U+10000 (only without prefix/suffix) */
} bpe;

typedef struct {
  int32_t id, prev, next;
  uint32_t len; /* bytes; 0 = merged away */
} symbol;

typedef struct {
  uint32_t rank, pos;
  int32_t new_id;
} merge_item;

/* Per-call memory; handed around as the opaque tok_model_work. */
typedef struct {
  symbol *syms;
  size_t syms_cap;
  merge_item *heap;
  size_t heap_n, heap_cap;
  tok_strmap cache; /* word -> index into cache_ids (count, then ids) */
  tok_ids cache_ids;
  tok_buf scratch;
} bpe_work;

enum { CACHE_MAX_WORD = 256, CACHE_MAX_ENTRIES = 1 << 18 };

/* ==== Merge table ==== */

static uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

static int merge_table_init(merge_table *t, size_t n) {
  size_t slots = 16;
  while (slots < 2 * n + 16) slots *= 2;
  t->keys = malloc(slots * sizeof *t->keys);
  t->vals = malloc(slots * sizeof *t->vals);
  if (!t->keys || !t->vals) return ci_fail("tokenizer: out of memory");
  memset(t->keys, 0xFF, slots * sizeof *t->keys);
  t->mask = slots - 1;
  return CI_OK;
}

/* Later merges of the same pair overwrite earlier ones (HF collects them into a HashMap). */
static void merge_table_put(merge_table *t, uint64_t key, uint64_t val) {
  size_t i = mix64(key) & t->mask;
  while (t->keys[i] != UINT64_MAX && t->keys[i] != key) i = (i + 1) & t->mask;
  t->keys[i] = key;
  t->vals[i] = val;
}

static inline int merge_table_get(const merge_table *t, int32_t a, int32_t b, uint32_t *rank,
                                  int32_t *new_id) {
  uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
  size_t i = mix64(key) & t->mask;
  for (;;) {
    uint64_t k = t->keys[i];
    if (k == key) {
      *rank = (uint32_t)(t->vals[i] >> 32);
      *new_id = (int32_t)(uint32_t)t->vals[i];
      return 1;
    }
    if (k == UINT64_MAX) return 0;
    i = (i + 1) & t->mask;
  }
}

/* ==== Parse ==== */

static int dup_opt_string(json_t *j, const char *key, char **out, size_t *len) {
  json_t *v = json_object_get(j, key);
  *out = NULL;
  if (len) *len = 0;
  if (!v || json_is_null(v)) return CI_OK;
  if (!json_is_string(v)) return ci_fail("model BPE: \"%s\" must be a string or null", key);
  size_t n = json_string_length(v);
  if (n == 0 && len) return CI_OK; /* an empty prefix/suffix changes nothing */
  *out = malloc(n + 1);
  if (!*out) return ci_fail("tokenizer: out of memory");
  memcpy(*out, json_string_value(v), n + 1);
  if (len) *len = n;
  return CI_OK;
}

static void bpe_free(void *impl) {
  bpe *b = impl;
  free(b->merges.keys);
  free(b->merges.vals);
  free(b->unk_token);
  free(b->prefix);
  free(b->suffix);
  free(b->bmp_ids);
  free(b);
}

static int read_merge(json_t *item, size_t i, const char **a, size_t *a_len, const char **b,
                      size_t *b_len) {
  if (json_is_string(item)) {
    const char *s = json_string_value(item);
    const char *space = strchr(s, ' ');
    if (!space) return ci_fail("model BPE: merge %zu (\"%.80s\") is not \"left right\"", i, s);
    *a = s;
    *a_len = (size_t)(space - s);
    *b = space + 1;
    *b_len = json_string_length(item) - *a_len - 1;
    return CI_OK;
  }
  if (json_is_array(item) && json_array_size(item) == 2 &&
      json_is_string(json_array_get(item, 0)) && json_is_string(json_array_get(item, 1))) {
    *a = json_string_value(json_array_get(item, 0));
    *a_len = json_string_length(json_array_get(item, 0));
    *b = json_string_value(json_array_get(item, 1));
    *b_len = json_string_length(json_array_get(item, 1));
    return CI_OK;
  }
  return ci_fail("model BPE: merge %zu must be a \"left right\" string or a pair of strings", i);
}

static int bpe_parse_merges(tok_model *m, bpe *b, json_t *merges) {
  if (!merges || json_is_null(merges))
    merges = NULL;
  else if (!json_is_array(merges))
    return ci_fail("model BPE: \"merges\" must be a list");
  size_t n = merges ? json_array_size(merges) : 0;
  if (n > UINT32_MAX) return ci_fail("model BPE: too many merges");
  if (merge_table_init(&b->merges, n)) return CI_ERR;
  tok_buf joined = {0};
  int rc = CI_OK;
  for (size_t i = 0; i < n && rc == CI_OK; i++) {
    const char *l = NULL, *r = NULL;
    size_t ll = 0, rl = 0;
    if ((rc = read_merge(json_array_get(merges, i), i, &l, &ll, &r, &rl))) break;
    int32_t a = tok_vocab_get(&m->vocab, l, ll), c = tok_vocab_get(&m->vocab, r, rl);
    if (a < 0 || c < 0) {
      rc = ci_fail("model BPE: merge %zu uses token \"%.*s\" missing from the vocab", i,
                   (int)(a < 0 ? (ll > 80 ? 80 : ll) : (rl > 80 ? 80 : rl)), a < 0 ? l : r);
      break;
    }
    size_t skip = b->prefix_len && rl >= b->prefix_len ? b->prefix_len : 0;
    joined.len = 0;
    if ((rc = tok_buf_append(&joined, l, ll)) ||
        (rc = tok_buf_append(&joined, r + skip, rl - skip)))
      break;
    int32_t merged = tok_vocab_get(&m->vocab, joined.data, joined.len);
    if (merged < 0) {
      rc = ci_fail("model BPE: merge %zu result \"%.*s\" is missing from the vocab", i,
                   (int)(joined.len > 80 ? 80 : joined.len), joined.data);
      break;
    }
    merge_table_put(&b->merges, (uint64_t)(uint32_t)a << 32 | (uint32_t)c,
                    (uint64_t)i << 32 | (uint32_t)merged);
  }
  tok_buf_free(&joined);
  return rc;
}

static int bpe_parse(tok_model *m, json_t *j) {
  bpe *b = calloc(1, sizeof *b);
  if (!b) return ci_fail("tokenizer: out of memory");
  m->impl = b;
  if (tok_model_read_vocab_object(json_object_get(j, "vocab"), &m->vocab, "BPE")) return CI_ERR;
  if (dup_opt_string(j, "unk_token", &b->unk_token, NULL) ||
      dup_opt_string(j, "continuing_subword_prefix", &b->prefix, &b->prefix_len) ||
      dup_opt_string(j, "end_of_word_suffix", &b->suffix, &b->suffix_len))
    return CI_ERR;
  b->fuse_unk = tok_json_bool(j, "fuse_unk", 0);
  b->byte_fallback = tok_json_bool(j, "byte_fallback", 0);
  b->ignore_merges = tok_json_bool(j, "ignore_merges", 0);
  b->unk_id = -1;
  if (b->unk_token) {
    b->unk_id = tok_vocab_get(&m->vocab, b->unk_token, strlen(b->unk_token));
    if (b->unk_id < 0) b->unk_id = -2;
  }
  for (int i = 0; i < 256; i++) {
    char name[8];
    static const char hex[] = "0123456789ABCDEF";
    memcpy(name, "<0x", 3);
    name[3] = hex[i >> 4];
    name[4] = hex[i & 15];
    name[5] = '>';
    b->byte_ids[i] = tok_vocab_get(&m->vocab, name, 6);
  }
  if (!b->prefix && !b->suffix) {
    b->bmp_ids = malloc(0x10000 * sizeof *b->bmp_ids);
    if (!b->bmp_ids) return ci_fail("tokenizer: out of memory");
    for (size_t i = 0; i < 0x10000; i++) b->bmp_ids[i] = -1;
    for (size_t e = 0; e < m->vocab.map.n; e++) {
      size_t len = m->vocab.map.key_len[e];
      const char *key = tok_strmap_key(&m->vocab.map, e);
      uint32_t cp;
      if (len == 0 || len > 3 || tok_utf8_valid_prefix(key, len) != len ||
          tok_utf8_next(key, len, 0, &cp) != len)
        continue;
      b->bmp_ids[cp] = m->vocab.map.value[e];
    }
  }
  return bpe_parse_merges(m, b, json_object_get(j, "merges"));
}

/* ==== Merge loop ==== */

static inline int item_less(const merge_item *x, const merge_item *y) {
  return x->rank != y->rank ? x->rank < y->rank : x->pos < y->pos;
}

static int heap_push(bpe_work *w, merge_item it) {
  if (w->heap_n == w->heap_cap) {
    size_t cap = w->heap_cap ? w->heap_cap * 2 : 64;
    merge_item *h = realloc(w->heap, cap * sizeof *h);
    if (!h) return ci_fail("tokenizer: out of memory");
    w->heap = h;
    w->heap_cap = cap;
  }
  size_t i = w->heap_n++;
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (!item_less(&it, &w->heap[parent])) break;
    w->heap[i] = w->heap[parent];
    i = parent;
  }
  w->heap[i] = it;
  return CI_OK;
}

static merge_item heap_pop(bpe_work *w) {
  merge_item top = w->heap[0], last = w->heap[--w->heap_n];
  size_t i = 0, n = w->heap_n;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && item_less(&w->heap[c + 1], &w->heap[c])) c++;
    if (!item_less(&w->heap[c], &last)) break;
    w->heap[i] = w->heap[c];
    i = c;
  }
  if (n) w->heap[i] = last;
  return top;
}

static int push_pair(const bpe *b, bpe_work *w, size_t pos) {
  const symbol *s = w->syms;
  uint32_t rank;
  int32_t new_id;
  if (s[pos].next < 0) return CI_OK;
  if (!merge_table_get(&b->merges, s[pos].id, s[s[pos].next].id, &rank, &new_id)) return CI_OK;
  return heap_push(w, (merge_item){rank, (uint32_t)pos, new_id});
}

static int merge_all(const bpe *b, bpe_work *w, size_t n_syms) {
  symbol *s = w->syms;
  w->heap_n = 0;
  for (size_t i = 0; i + 1 < n_syms; i++)
    if (push_pair(b, w, i)) return CI_ERR;
  while (w->heap_n) {
    merge_item top = heap_pop(w);
    symbol *left = &s[top.pos];
    if (left->len == 0 || left->next < 0) continue;
    symbol *right = &s[left->next];
    uint32_t rank;
    int32_t new_id;
    if (!merge_table_get(&b->merges, left->id, right->id, &rank, &new_id) || new_id != top.new_id)
      continue;
    left->id = top.new_id;
    left->len += right->len;
    left->next = right->next;
    right->len = 0;
    if (left->next >= 0) s[left->next].prev = (int32_t)top.pos;
    if (left->prev >= 0 && push_pair(b, w, (size_t)left->prev)) return CI_ERR;
    if (push_pair(b, w, top.pos)) return CI_ERR;
  }
  return CI_OK;
}

/* ==== Word -> symbols ==== */

static int add_symbol(bpe_work *w, size_t *n, int32_t id, uint32_t len) {
  if (*n == w->syms_cap) {
    size_t cap = w->syms_cap ? w->syms_cap * 2 : 64;
    symbol *s = realloc(w->syms, cap * sizeof *s);
    if (!s) return ci_fail("tokenizer: out of memory");
    w->syms = s;
    w->syms_cap = cap;
  }
  w->syms[*n] = (symbol){id, *n ? (int32_t)(*n - 1) : -1, -1, len};
  if (*n) w->syms[*n - 1].next = (int32_t)*n;
  (*n)++;
  return CI_OK;
}

/* The id of one character of the word, with the prefix (not first) / suffix (last) applied;
 * s/len receive the looked-up string (for byte fallback). */
static int32_t char_id(const bpe *b, const tok_model *m, bpe_work *w, const char *c, size_t cl,
                       uint32_t cp, int first, int last, const char **s, size_t *len) {
  *s = c;
  *len = cl;
  if (b->bmp_ids) return cp < 0x10000 ? b->bmp_ids[cp] : tok_vocab_get(&m->vocab, c, cl);
  int use_prefix = b->prefix && !first, use_suffix = b->suffix && last;
  if (!use_prefix && !use_suffix) return tok_vocab_get(&m->vocab, c, cl);
  w->scratch.len = 0;
  if ((use_prefix && tok_buf_append(&w->scratch, b->prefix, b->prefix_len)) ||
      tok_buf_append(&w->scratch, c, cl) ||
      (use_suffix && tok_buf_append(&w->scratch, b->suffix, b->suffix_len)))
    return -3;
  *s = w->scratch.data;
  *len = w->scratch.len;
  return tok_vocab_get(&m->vocab, w->scratch.data, w->scratch.len);
}

static int merge_word(const tok_model *m, const bpe *b, bpe_work *w, const char *word, size_t n,
                      size_t *n_syms) {
  size_t count = 0;
  int32_t pending_unk = -1;
  uint32_t pending_len = 0;
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    size_t cl = tok_utf8_next(word, n, i, &cp);
    const char *s;
    size_t sl;
    int32_t id = char_id(b, m, w, word + i, cl, cp, i == 0, i + cl == n, &s, &sl);
    if (id == -3) return CI_ERR;
    i += cl;
    if (id >= 0) {
      if (pending_unk >= 0 && add_symbol(w, &count, pending_unk, pending_len)) return CI_ERR;
      pending_unk = -1;
      if (add_symbol(w, &count, id, (uint32_t)cl)) return CI_ERR;
      continue;
    }
    if (b->byte_fallback) {
      int all = 1;
      for (size_t k = 0; k < sl; k++) all &= b->byte_ids[(unsigned char)s[k]] >= 0;
      if (all) { /* HF leaves a pending unk pending here */
        for (size_t k = 0; k < sl; k++)
          if (add_symbol(w, &count, b->byte_ids[(unsigned char)s[k]], 1)) return CI_ERR;
        continue;
      }
    }
    if (b->unk_id == -1) continue; /* no unk token: the character is dropped */
    if (b->unk_id == -2)
      return ci_fail("model BPE: unk_token \"%s\" is not in the vocab", b->unk_token);
    if (pending_unk >= 0 && b->fuse_unk) {
      pending_len += (uint32_t)cl;
      continue;
    }
    if (pending_unk >= 0 && add_symbol(w, &count, pending_unk, pending_len)) return CI_ERR;
    pending_unk = b->unk_id;
    pending_len = (uint32_t)cl;
  }
  if (pending_unk >= 0 && add_symbol(w, &count, pending_unk, pending_len)) return CI_ERR;
  *n_syms = count;
  return merge_all(b, w, count);
}

/* ==== Tokenize ==== */

static int bpe_tokenize(const tok_model *m, const char *word, size_t n, tok_model_work **work,
                        tok_ids *out) {
  const bpe *b = m->impl;
  if (n == 0) return CI_OK;
  if (b->ignore_merges) {
    int32_t id = tok_vocab_get(&m->vocab, word, n);
    if (id >= 0) return tok_ids_push(out, id);
  }
  if (!*work && !(*work = calloc(1, sizeof(bpe_work)))) return ci_fail("tokenizer: out of memory");
  bpe_work *w = (bpe_work *)*work;
  int cacheable = n <= CACHE_MAX_WORD;
  if (cacheable) {
    int32_t at = tok_strmap_get(&w->cache, word, n);
    if (at >= 0) return tok_ids_append(out, w->cache_ids.v + at + 1, (size_t)w->cache_ids.v[at]);
  }
  size_t n_syms = 0;
  if (merge_word(m, b, w, word, n, &n_syms)) return CI_ERR;
  size_t first_out = out->n;
  for (int32_t i = n_syms ? 0 : -1; i >= 0; i = w->syms[i].next)
    if (tok_ids_push(out, w->syms[i].id)) return CI_ERR;
  if (cacheable && out->n > first_out && w->cache.n < CACHE_MAX_ENTRIES &&
      w->cache_ids.n < INT32_MAX / 2) {
    int32_t at = (int32_t)w->cache_ids.n;
    if (tok_ids_push(&w->cache_ids, (int32_t)(out->n - first_out)) ||
        tok_ids_append(&w->cache_ids, out->v + first_out, out->n - first_out) ||
        tok_strmap_put(&w->cache, word, n, at, NULL))
      return CI_ERR;
  }
  return CI_OK;
}

static void bpe_free_work(tok_model_work *work) {
  bpe_work *w = (bpe_work *)work;
  free(w->syms);
  free(w->heap);
  tok_strmap_free(&w->cache);
  tok_ids_free(&w->cache_ids);
  tok_buf_free(&w->scratch);
  free(w);
}

const tok_model_kind tok_bpe_kind = {"BPE", bpe_parse, bpe_free, bpe_tokenize, bpe_free_work};
