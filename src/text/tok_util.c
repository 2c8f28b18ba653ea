/* Tokenizer engine plumbing: growable buffers and vectors, the string -> id hash map behind every
 * vocabulary, and small JSON accessors. */
#include "base/error.h"
#include "text/tok_internal.h"

#include <stdlib.h>
#include <string.h>

/* ==== Buffers and vectors ==== */

static int grow(void **data, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return CI_OK;
  size_t next = *cap ? *cap : 16;
  while (next < need) next *= 2;
  void *p = realloc(*data, next * elem);
  if (!p) return ci_fail("tokenizer: out of memory");
  *data = p;
  *cap = next;
  return CI_OK;
}

int tok_buf_reserve(tok_buf *b, size_t extra) {
  if (grow((void **)&b->data, &b->cap, b->len + extra + 1, 1)) return CI_ERR;
  b->data[b->len] = '\0'; /* keep the NUL even before the first append */
  return CI_OK;
}

int tok_buf_append(tok_buf *b, const void *bytes, size_t n) {
  if (tok_buf_reserve(b, n)) return CI_ERR;
  if (n) memcpy(b->data + b->len, bytes, n);
  b->len += n;
  b->data[b->len] = '\0';
  return CI_OK;
}

void tok_buf_free(tok_buf *b) {
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
}

int tok_ids_push(tok_ids *ids, int32_t id) {
  if (grow((void **)&ids->v, &ids->cap, ids->n + 1, sizeof *ids->v)) return CI_ERR;
  ids->v[ids->n++] = id;
  return CI_OK;
}

int tok_ids_append(tok_ids *ids, const int32_t *src, size_t n) {
  if (grow((void **)&ids->v, &ids->cap, ids->n + n, sizeof *ids->v)) return CI_ERR;
  if (n) memcpy(ids->v + ids->n, src, n * sizeof *src);
  ids->n += n;
  return CI_OK;
}

void tok_ids_free(tok_ids *ids) {
  free(ids->v);
  ids->v = NULL;
  ids->n = ids->cap = 0;
}

int tok_spans_push(tok_spans *s, size_t off, size_t len, int at_start) {
  if (grow((void **)&s->v, &s->cap, s->n + 1, sizeof *s->v)) return CI_ERR;
  s->v[s->n++] = (tok_span){off, len, at_start};
  return CI_OK;
}

void tok_spans_free(tok_spans *s) {
  free(s->v);
  s->v = NULL;
  s->n = s->cap = 0;
}

void tok_segments_free(tok_segments *s) {
  free(s->v);
  s->v = NULL;
  s->n = s->cap = 0;
}

/* ==== Hash map ==== */

/* A fast 64-bit hash over 8-byte words (multiply-xorshift mixing). */
uint64_t tok_hash_bytes(const void *bytes, size_t n) {
  const unsigned char *s = bytes;
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, s, 8);
    h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
    s += 8;
    n -= 8;
  }
  uint64_t w = 0;
  memcpy(&w, s, n);
  h = (h ^ w) * 0x94d049bb133111ebull;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 32;
  return h;
}

static int strmap_rehash(tok_strmap *m, size_t n_slots) {
  uint32_t *slots = calloc(n_slots, sizeof *slots);
  if (!slots) return ci_fail("tokenizer: out of memory");
  size_t mask = n_slots - 1;
  for (size_t e = 0; e < m->n; e++) {
    size_t i = m->key_hash[e] & mask;
    while (slots[i]) i = (i + 1) & mask;
    slots[i] = (uint32_t)e + 1;
  }
  free(m->slots);
  m->slots = slots;
  m->mask = mask;
  return CI_OK;
}

long tok_strmap_find(const tok_strmap *m, const char *key, size_t len) {
  if (!m->slots) return -1;
  uint32_t h = (uint32_t)tok_hash_bytes(key, len);
  size_t i = h & m->mask;
  for (;;) {
    uint32_t e = m->slots[i];
    if (!e) return -1;
    e--;
    if (m->key_hash[e] == h && m->key_len[e] == len &&
        !memcmp(m->keys.data + m->key_off[e], key, len))
      return (long)e;
    i = (i + 1) & m->mask;
  }
}

int32_t tok_strmap_get(const tok_strmap *m, const char *key, size_t len) {
  long e = tok_strmap_find(m, key, len);
  return e < 0 ? -1 : m->value[e];
}

int tok_strmap_put(tok_strmap *m, const char *key, size_t len, int32_t value, size_t *entry_out) {
  long found = tok_strmap_find(m, key, len);
  if (found >= 0) {
    m->value[found] = value;
    if (entry_out) *entry_out = (size_t)found;
    return CI_OK;
  }
  if (len > UINT32_MAX || m->n >= UINT32_MAX - 1) return ci_fail("tokenizer: token too large");
  if (m->n + 1 > m->cap) {
    size_t cap = m->cap ? m->cap * 2 : 64;
    size_t *off = realloc(m->key_off, cap * sizeof *off);
    if (off) m->key_off = off;
    uint32_t *kl = realloc(m->key_len, cap * sizeof *kl);
    if (kl) m->key_len = kl;
    uint32_t *kh = realloc(m->key_hash, cap * sizeof *kh);
    if (kh) m->key_hash = kh;
    int32_t *val = realloc(m->value, cap * sizeof *val);
    if (val) m->value = val;
    if (!off || !kl || !kh || !val) return ci_fail("tokenizer: out of memory");
    m->cap = cap;
  }
  size_t e = m->n;
  m->key_off[e] = m->keys.len;
  m->key_len[e] = (uint32_t)len;
  m->key_hash[e] = (uint32_t)tok_hash_bytes(key, len);
  m->value[e] = value;
  if (tok_buf_append(&m->keys, key, len) || tok_buf_append(&m->keys, "", 1)) return CI_ERR;
  m->n++;
  if (!m->slots || m->n * 2 > m->mask + 1) {
    if (strmap_rehash(m, m->slots ? (m->mask + 1) * 2 : 128)) return CI_ERR;
  } else {
    size_t i = m->key_hash[e] & m->mask;
    while (m->slots[i]) i = (i + 1) & m->mask;
    m->slots[i] = (uint32_t)e + 1;
  }
  if (entry_out) *entry_out = e;
  return CI_OK;
}

const char *tok_strmap_key(const tok_strmap *m, size_t entry) {
  return m->keys.data + m->key_off[entry];
}

void tok_strmap_free(tok_strmap *m) {
  tok_buf_free(&m->keys);
  free(m->key_off);
  free(m->key_len);
  free(m->key_hash);
  free(m->value);
  free(m->slots);
  memset(m, 0, sizeof *m);
}

/* ==== Vocabulary ==== */

int tok_vocab_add(tok_vocab *v, const char *token, size_t len, int32_t id) {
  if (id < 0) return ci_fail("tokenizer: negative token id %d", (int)id);
  size_t entry;
  if (tok_strmap_put(&v->map, token, len, id, &entry)) return CI_ERR;
  if ((size_t)id >= v->n_ids) {
    size_t n = (size_t)id + 1;
    if (n > v->cap_ids) {
      size_t cap = v->cap_ids ? v->cap_ids : 256;
      while (cap < n) cap *= 2;
      long *p = realloc(v->entry_of_id, cap * sizeof *p);
      if (!p) return ci_fail("tokenizer: out of memory");
      v->entry_of_id = p;
      v->cap_ids = cap;
    }
    for (size_t i = v->n_ids; i < n; i++) v->entry_of_id[i] = -1;
    v->n_ids = n;
  }
  v->entry_of_id[id] = (long)entry;
  return CI_OK;
}

int32_t tok_vocab_get(const tok_vocab *v, const char *token, size_t len) {
  return tok_strmap_get(&v->map, token, len);
}

const char *tok_vocab_token(const tok_vocab *v, int32_t id, size_t *len_out) {
  if (id < 0 || (size_t)id >= v->n_ids || v->entry_of_id[id] < 0) return NULL;
  long e = v->entry_of_id[id];
  if (len_out) *len_out = v->map.key_len[e];
  return tok_strmap_key(&v->map, (size_t)e);
}

void tok_vocab_free(tok_vocab *v) {
  tok_strmap_free(&v->map);
  free(v->entry_of_id);
  memset(v, 0, sizeof *v);
}

/* ==== JSON ==== */

const char *tok_json_str(json_t *j, const char *key) {
  json_t *v = json_object_get(j, key);
  return json_is_string(v) ? json_string_value(v) : NULL;
}

int tok_json_bool(json_t *j, const char *key, int fallback) {
  json_t *v = json_object_get(j, key);
  return json_is_boolean(v) ? json_is_true(v) : fallback;
}
