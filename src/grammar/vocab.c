/* Token byte strings and their preorder trie (grammar/vocab.h). The trie is built from the tokens
 * sorted by their bytes: consecutive tokens share their longest common prefix, so one pass with a
 * stack of open nodes lays the nodes out in preorder and gives each node's tokens a contiguous
 * run of the sorted ids. */
#include "grammar/vocab.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>

enum { MAX_TOKEN_BYTES = 65535 }; /* node depth is 16-bit */

typedef struct {
  const char *bytes;
  size_t len;
  int32_t id;
} sort_entry;

static int compare_entries(const void *a, const void *b) {
  const sort_entry *x = a, *y = b;
  const size_t n = x->len < y->len ? x->len : y->len;
  const int c = memcmp(x->bytes, y->bytes, n);
  if (c) return c;
  if (x->len != y->len) return x->len < y->len ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

void ci_grammar_vocab_free(ci_grammar_vocab *v) {
  if (!v) return;
  if (atomic_fetch_sub(&v->refs, 1) > 1) return;
  free(v->bytes);
  free(v->offset);
  free(v->nodes);
  free(v->plain);
  free(v->token_ids);
  free(v);
}

ci_grammar_vocab *ci_grammar_vocab_retain(ci_grammar_vocab *v) {
  atomic_fetch_add(&v->refs, 1);
  return v;
}

const char *ci_grammar_vocab_token(const ci_grammar_vocab *v, int32_t id, size_t *len) {
  *len = v->offset[id + 1] - v->offset[id];
  return v->bytes + v->offset[id];
}

/* Builds the trie over v->bytes / v->offset. */
typedef struct {
  uint8_t *node_byte;
  uint16_t *node_depth;
  int32_t *node_end;
  int32_t *node_tokens;
} trie_arrays;

static void trie_arrays_free(trie_arrays *a) {
  free(a->node_byte);
  free(a->node_depth);
  free(a->node_end);
  free(a->node_tokens);
}

static int build_trie_arrays(ci_grammar_vocab *v, trie_arrays *a);

/* v->plain: a node is plain when its byte is and all its children are (children come after
 * their parent in preorder, so one backward pass with each node's parent settles it). */
static int mark_plain(ci_grammar_vocab *v) {
  const int n = v->n_nodes;
  v->plain = malloc((size_t)n);
  int32_t *parent = malloc((size_t)n * sizeof *parent);
  int32_t *open = malloc(((size_t)v->max_depth + 1) * sizeof *open);
  if (!v->plain || !parent || !open) {
    free(parent);
    free(open);
    return ci_fail("grammar vocabulary: out of memory");
  }
  open[0] = 0;
  parent[0] = -1;
  for (int k = 1; k < n; k++) {
    const int d = v->nodes[k].depth;
    parent[k] = open[d - 1];
    open[d] = k;
    v->plain[k] = (uint8_t)ci_grammar_plain_byte(v->nodes[k].byte);
  }
  v->plain[0] = 0;
  for (int k = n - 1; k > 0; k--)
    if (!v->plain[k] && parent[k] > 0) v->plain[parent[k]] = 0;
  free(parent);
  free(open);
  return CI_OK;
}

/* Builds the trie, then packs it into v->nodes. */
static int build_trie(ci_grammar_vocab *v) {
  trie_arrays a = {0};
  int rc = build_trie_arrays(v, &a);
  if (!rc) {
    v->nodes = malloc((size_t)v->n_nodes * sizeof *v->nodes);
    if (!v->nodes) rc = ci_fail("grammar vocabulary: out of memory");
  }
  for (int k = 0; !rc && k < v->n_nodes; k++) {
    const int32_t n = a.node_tokens[2 * k + 1] - a.node_tokens[2 * k];
    if (n > 255) rc = ci_fail("grammar vocabulary: more than 255 tokens with the same bytes");
    v->nodes[k] = (ci_grammar_trie_node){a.node_end[k], a.node_tokens[2 * k], a.node_depth[k],
                                         a.node_byte[k], (uint8_t)n};
  }
  trie_arrays_free(&a);
  if (!rc) rc = mark_plain(v);
  return rc;
}

static int build_trie_arrays(ci_grammar_vocab *v, trie_arrays *a) {
  const int n = v->n_vocab;
  sort_entry *sorted = malloc(((size_t)n + 1) * sizeof *sorted);
  size_t total = 0;
  int n_sorted = 0;
  if (!sorted) return ci_fail("grammar vocabulary: out of memory");
  for (int id = 0; id < n; id++) {
    size_t len;
    const char *b = ci_grammar_vocab_token(v, id, &len);
    if (len == 0 || len > MAX_TOKEN_BYTES) continue;
    sorted[n_sorted++] = (sort_entry){b, len, id};
    total += len;
  }
  qsort(sorted, (size_t)n_sorted, sizeof *sorted, compare_entries);
  const size_t cap = total + 1; /* nodes never exceed the bytes plus the root */
  a->node_byte = malloc(cap);
  a->node_depth = malloc(cap * sizeof *a->node_depth);
  a->node_end = malloc(cap * sizeof *a->node_end);
  a->node_tokens = malloc((cap + 1) * sizeof *a->node_tokens);
  v->token_ids = malloc(((size_t)n_sorted + 1) * sizeof *v->token_ids);
  v->n_sorted = n_sorted;
  int32_t *open = malloc((MAX_TOKEN_BYTES + 2) * sizeof *open); /* open node at each depth */
  if (!a->node_byte || !a->node_depth || !a->node_end || !a->node_tokens || !v->token_ids ||
      !open) {
    free(sorted);
    free(open);
    return ci_fail("grammar vocabulary: out of memory");
  }
  int n_nodes = 1, depth = 0, max_depth = 0;
  a->node_byte[0] = 0;
  a->node_depth[0] = 0;
  a->node_tokens[0] = 0;
  open[0] = 0;
  const char *prev = "";
  size_t prev_len = 0;
  for (int i = 0; i < n_sorted; i++) {
    const sort_entry *e = &sorted[i];
    size_t lcp = 0;
    while (lcp < prev_len && lcp < e->len && prev[lcp] == e->bytes[lcp]) lcp++;
    while (depth > (int)lcp) a->node_end[open[depth--]] = n_nodes; /* close deeper nodes */
    for (size_t d = lcp; d < e->len; d++) {
      const int node = n_nodes++;
      a->node_byte[node] = (uint8_t)e->bytes[d];
      a->node_depth[node] = (uint16_t)(d + 1);
      a->node_tokens[node] = i; /* tokens ending here start at sorted index i (or later) */
      open[++depth] = node;
    }
    if (depth > max_depth) max_depth = depth;
    v->token_ids[i] = e->id;
    prev = e->bytes;
    prev_len = e->len;
  }
  while (depth >= 0) a->node_end[open[depth--]] = n_nodes;
  free(open);
  v->n_nodes = n_nodes;
  v->max_depth = max_depth;
  /* a node's tokens start at the sorted index of the entry that created it (node_tokens) and
   * run over that entry's equal-byte duplicates, if the entry ends there; the root holds none */
  int32_t *run_end = malloc(((size_t)n_nodes + 1) * sizeof *run_end);
  if (!run_end) {
    free(sorted);
    return ci_fail("grammar vocabulary: out of memory");
  }
  for (int k = 0; k < n_nodes; k++) {
    int first = a->node_tokens[k], b = first;
    if (k > 0)
      while (b < n_sorted && sorted[b].len == a->node_depth[k] &&
             memcmp(sorted[b].bytes, sorted[first].bytes, sorted[b].len) == 0)
        b++;
    run_end[k] = b;
  }
  free(sorted);
  /* node_tokens becomes pairs: begin at 2k, end at 2k+1 */
  int32_t *pairs = malloc(((size_t)n_nodes * 2 + 1) * sizeof *pairs);
  if (!pairs) {
    free(run_end);
    return ci_fail("grammar vocabulary: out of memory");
  }
  for (int k = 0; k < n_nodes; k++) {
    pairs[2 * k] = k > 0 ? a->node_tokens[k] : 0;
    pairs[2 * k + 1] = k > 0 ? run_end[k] : 0;
  }
  free(run_end);
  free(a->node_tokens);
  a->node_tokens = pairs;
  return CI_OK;
}

static ci_grammar_vocab *vocab_alloc(int n_vocab, size_t total) {
  ci_grammar_vocab *v = calloc(1, sizeof *v);
  if (!v) return NULL;
  atomic_init(&v->refs, 1);
  v->n_vocab = n_vocab;
  v->bytes = malloc(total + 1);
  v->offset = calloc((size_t)n_vocab + 1, sizeof *v->offset);
  if (!v->bytes || !v->offset) {
    ci_grammar_vocab_free(v);
    return NULL;
  }
  return v;
}

ci_grammar_vocab *ci_grammar_vocab_from_bytes(const char *const *bytes, const size_t *lens,
                                              int n_vocab) {
  if (n_vocab < 1) {
    ci_fail("grammar vocabulary: %d tokens", n_vocab);
    return NULL;
  }
  size_t total = 0;
  for (int i = 0; i < n_vocab; i++) total += lens[i];
  ci_grammar_vocab *v = vocab_alloc(n_vocab, total);
  if (!v) {
    ci_fail("grammar vocabulary: out of memory");
    return NULL;
  }
  size_t at = 0;
  for (int i = 0; i < n_vocab; i++) {
    v->offset[i] = at;
    if (lens[i]) memcpy(v->bytes + at, bytes[i], lens[i]);
    at += lens[i];
  }
  v->offset[n_vocab] = at;
  if (build_trie(v)) {
    ci_grammar_vocab_free(v);
    return NULL;
  }
  return v;
}

ci_grammar_vocab *ci_grammar_vocab_from_tokenizer(const ci_tokenizer *tok, int n_vocab) {
  const size_t n_tok = ci_tokenizer_vocab_size(tok);
  if (n_vocab < 1) {
    ci_fail("grammar vocabulary: %d tokens", n_vocab);
    return NULL;
  }
  char **bytes = calloc((size_t)n_vocab, sizeof *bytes);
  size_t *lens = calloc((size_t)n_vocab, sizeof *lens);
  ci_grammar_vocab *v = NULL;
  if (!bytes || !lens) {
    ci_fail("grammar vocabulary: out of memory");
    goto done;
  }
  for (int id = 0; id < n_vocab && (size_t)id < n_tok; id++) {
    if (!ci_tokenizer_id_to_token(tok, id) || ci_tokenizer_is_special(tok, id)) continue;
    if (ci_tokenizer_token_bytes(tok, id, &bytes[id], &lens[id])) goto done;
  }
  v = ci_grammar_vocab_from_bytes((const char *const *)bytes, lens, n_vocab);
done:
  if (bytes)
    for (int id = 0; id < n_vocab; id++) free(bytes[id]);
  free(bytes);
  free(lens);
  return v;
}
