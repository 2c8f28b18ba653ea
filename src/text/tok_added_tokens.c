/* Added tokens: the vocabulary of special and normal added tokens, and the splitting of text
 * around them (leftmost-longest matching in a byte trie, like HF's Aho-Corasick with
 * LeftmostLongest), with the single_word, lstrip and rstrip rules. Tokens with normalized = true
 * are matched in normalized text against their normalized form. */
#include "base/error.h"
#include "text/tok_internal.h"

#include <stdlib.h>
#include <string.h>

/* ==== Byte trie ==== */

typedef struct {
  int32_t first_child, next_sibling;
  int32_t token; /* index into the added tokens, -1 if no token ends here */
  uint8_t byte;
} trie_node;

struct tok_trie {
  trie_node *nodes;
  size_t n, cap;
  int32_t root[256]; /* children of the root by byte, -1 = none */
};

static tok_trie *trie_new(void) {
  tok_trie *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  for (int i = 0; i < 256; i++) t->root[i] = -1;
  return t;
}

static void trie_free(tok_trie *t) {
  if (!t) return;
  free(t->nodes);
  free(t);
}

static int32_t trie_node_new(tok_trie *t, uint8_t byte) {
  if (t->n == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 256;
    trie_node *nodes = realloc(t->nodes, cap * sizeof *nodes);
    if (!nodes) return -1;
    t->nodes = nodes;
    t->cap = cap;
  }
  t->nodes[t->n] = (trie_node){-1, -1, -1, byte};
  return (int32_t)t->n++;
}

static int32_t trie_child(const tok_trie *t, int32_t node, uint8_t byte) {
  if (node < 0) return t->root[byte];
  for (int32_t c = t->nodes[node].first_child; c >= 0; c = t->nodes[c].next_sibling)
    if (t->nodes[c].byte == byte) return c;
  return -1;
}

static int trie_insert(tok_trie *t, const char *s, size_t n, int32_t token) {
  int32_t node = -1;
  for (size_t i = 0; i < n; i++) {
    uint8_t b = (uint8_t)s[i];
    int32_t next = trie_child(t, node, b);
    if (next < 0) {
      if ((next = trie_node_new(t, b)) < 0) return ci_fail("tokenizer: out of memory");
      if (node < 0) {
        t->root[b] = next;
      } else {
        t->nodes[next].next_sibling = t->nodes[node].first_child;
        t->nodes[node].first_child = next;
      }
    }
    node = next;
  }
  if (node >= 0 && t->nodes[node].token < 0) t->nodes[node].token = token;
  return CI_OK;
}

/* Longest token starting at s[i]; returns its length (0 = none) and its index in *token. */
static size_t trie_longest(const tok_trie *t, const char *s, size_t n, size_t i, int32_t *token) {
  int32_t node = t->root[(uint8_t)s[i]];
  size_t best = 0;
  for (size_t k = i; node >= 0;) {
    k++;
    if (t->nodes[node].token >= 0) {
      best = k - i;
      *token = t->nodes[node].token;
    }
    if (k >= n) break;
    node = trie_child(t, node, (uint8_t)s[k]);
  }
  return best;
}

/* ==== Vocabulary ==== */

int tok_added_add(tok_added_vocab *av, const char *content, size_t len, int32_t id, int special,
                  int lstrip, int rstrip, int single_word, int normalized) {
  if (len == 0) return CI_OK; /* HF ignores empty added tokens */
  int32_t existing = tok_strmap_get(&av->by_content, content, len);
  size_t idx;
  if (existing >= 0) {
    idx = (size_t)existing;
    free(av->tokens[idx].content);
  } else {
    if (av->n == av->cap) {
      size_t cap = av->cap ? av->cap * 2 : 64;
      tok_added_token *t = realloc(av->tokens, cap * sizeof *t);
      if (!t) return ci_fail("tokenizer: out of memory");
      av->tokens = t;
      av->cap = cap;
    }
    idx = av->n++;
  }
  tok_added_token *t = &av->tokens[idx];
  *t =
      (tok_added_token){malloc(len + 1), len, id, special, lstrip, rstrip, single_word, normalized};
  if (!t->content) return ci_fail("tokenizer: out of memory");
  memcpy(t->content, content, len);
  t->content[len] = '\0';
  return tok_strmap_put(&av->by_content, content, len, (int32_t)idx, NULL);
}

int tok_added_build(tok_added_vocab *av, const tok_normalizer *nz) {
  size_t n_ids = 0;
  for (size_t i = 0; i < av->n; i++)
    if ((size_t)av->tokens[i].id + 1 > n_ids) n_ids = (size_t)av->tokens[i].id + 1;
  av->index_of_id = malloc((n_ids + 1) * sizeof *av->index_of_id);
  av->norm_contents = calloc(av->n + 1, sizeof *av->norm_contents);
  av->norm_lens = calloc(av->n + 1, sizeof *av->norm_lens);
  av->raw_trie = trie_new();
  av->norm_trie = trie_new();
  if (!av->index_of_id || !av->norm_contents || !av->norm_lens || !av->raw_trie || !av->norm_trie)
    return ci_fail("tokenizer: out of memory");
  av->n_ids = n_ids;
  for (size_t i = 0; i < n_ids; i++) av->index_of_id[i] = -1;
  tok_buf normalized = {0};
  int rc = CI_OK;
  for (size_t i = 0; i < av->n && rc == CI_OK; i++) {
    const tok_added_token *t = &av->tokens[i];
    av->index_of_id[t->id] = (int32_t)i;
    if (!t->normalized) {
      rc = trie_insert(av->raw_trie, t->content, t->len, (int32_t)i);
      continue;
    }
    int keeps_start = 1;
    if (nz) {
      rc = tok_normalizer_apply(nz, t->content, t->len, &normalized, &keeps_start);
    } else {
      normalized.len = 0;
      rc = tok_buf_append(&normalized, t->content, t->len);
    }
    if (rc) break;
    av->norm_contents[i] = malloc(normalized.len + 1);
    if (!av->norm_contents[i]) {
      rc = ci_fail("tokenizer: out of memory");
      break;
    }
    memcpy(av->norm_contents[i], normalized.data, normalized.len + 1);
    av->norm_lens[i] = normalized.len;
    rc = trie_insert(av->norm_trie, normalized.data, normalized.len, (int32_t)i);
  }
  tok_buf_free(&normalized);
  return rc;
}

void tok_added_free(tok_added_vocab *av) {
  for (size_t i = 0; i < av->n; i++) {
    free(av->tokens[i].content);
    if (av->norm_contents) free(av->norm_contents[i]);
  }
  free(av->tokens);
  free(av->norm_contents);
  free(av->norm_lens);
  free(av->index_of_id);
  tok_strmap_free(&av->by_content);
  trie_free(av->raw_trie);
  trie_free(av->norm_trie);
  memset(av, 0, sizeof *av);
}

const tok_added_token *tok_added_by_id(const tok_added_vocab *av, int32_t id) {
  if (id < 0 || (size_t)id >= av->n_ids || av->index_of_id[id] < 0) return NULL;
  return &av->tokens[av->index_of_id[id]];
}

const tok_added_token *tok_added_by_content(const tok_added_vocab *av, const char *s, size_t n) {
  int32_t i = tok_strmap_get(&av->by_content, s, n);
  return i < 0 ? NULL : &av->tokens[i];
}

/* ==== Splitting ==== */

/* The regex-crate word test on the character before s[i] / at s[i]. */
static int word_before(const char *s, size_t i) {
  if (i == 0) return 0;
  uint32_t cp;
  tok_utf8_next(s, i, i - tok_utf8_prev_len(s, i), &cp);
  return tok_is_word_char(cp);
}

static int word_at(const char *s, size_t n, size_t i) {
  if (i >= n) return 0;
  uint32_t cp;
  tok_utf8_next(s, n, i, &cp);
  return tok_is_word_char(cp);
}

static int push_segment(tok_segments *out, size_t off, size_t len, int32_t id) {
  if (out->n == out->cap) {
    size_t cap = out->cap ? out->cap * 2 : 16;
    tok_segment *v = realloc(out->v, cap * sizeof *v);
    if (!v) return ci_fail("tokenizer: out of memory");
    out->v = v;
    out->cap = cap;
  }
  out->v[out->n++] = (tok_segment){off, len, id};
  return CI_OK;
}

int tok_added_split(const tok_added_vocab *av, int normalized_set, const char *s, size_t n,
                    tok_segments *out) {
  const tok_trie *trie = normalized_set ? av->norm_trie : av->raw_trie;
  size_t start_offset = 0;
  if (trie && trie->n) {
    for (size_t i = 0; i < n;) {
      int32_t idx;
      size_t mlen = trie->root[(uint8_t)s[i]] >= 0 ? trie_longest(trie, s, n, i, &idx) : 0;
      if (!mlen) {
        i++;
        continue;
      }
      size_t start = i, stop = i + mlen;
      i = stop; /* the next search starts after this match, kept or not */
      const tok_added_token *t = &av->tokens[idx];
      if (t->single_word && (word_before(s, start) || word_at(s, n, stop))) continue;
      if (t->lstrip) {
        size_t ns = start;
        while (ns > 0) {
          uint32_t cp;
          size_t l = tok_utf8_prev_len(s, ns);
          tok_utf8_next(s, n, ns - l, &cp);
          if (!tok_is_whitespace(cp)) break;
          ns -= l;
        }
        start = ns > start_offset ? ns : start_offset;
      }
      if (t->rstrip) {
        while (stop < n) {
          uint32_t cp;
          size_t l = tok_utf8_next(s, n, stop, &cp);
          if (!tok_is_whitespace(cp)) break;
          stop += l;
        }
      }
      if (start_offset < start && push_segment(out, start_offset, start - start_offset, -1))
        return CI_ERR;
      if (push_segment(out, start, stop - start, t->id)) return CI_ERR;
      start_offset = stop;
    }
  }
  if (start_offset < n && push_segment(out, start_offset, n - start_offset, -1)) return CI_ERR;
  return CI_OK;
}
