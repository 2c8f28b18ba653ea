/* The grammar matcher (grammar/matcher.h): parse-stack sets interned as DFA states, byte
 * transitions computed on first use, the trie walk that builds a token mask, and the per-state
 * mask cache. */
#include "grammar/matcher.h"

#include "base/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum {
  MAX_STATES = 8192,          /* interned states before the tables are rebuilt */
  MAX_KEY_INTS = 1 << 22,     /* ints of state keys before the tables are rebuilt */
  MAX_STACK = 4096,           /* a parse stack deeper than this is dropped (nesting limit) */
  MAX_STACKS = 1 << 16,       /* stacks one state may hold */
  MASK_CACHE_BYTES = 4 << 20, /* cached masks per matcher */
  T_UNKNOWN = -2,
  T_DEAD = -1,
  PARTIAL_ANY = -2 /* partial character whose exact value no stack cares about */
};

/* Growable int32 vector. */
typedef struct {
  int32_t *v;
  size_t n, cap;
} ivec;

static int ivec_reserve(ivec *a, size_t extra) {
  if (a->n + extra <= a->cap) return CI_OK;
  size_t cap = a->cap ? a->cap : 64;
  while (cap < a->n + extra) cap *= 2;
  int32_t *bigger = realloc(a->v, cap * sizeof *bigger);
  if (!bigger) return ci_fail("grammar matcher: out of memory");
  a->v = bigger;
  a->cap = cap;
  return CI_OK;
}

/* A stack inside some buffer. */
typedef struct {
  const int32_t *e;
  int32_t len;
} stack_ref;

struct ci_grammar_matcher {
  ci_grammar *g;
  ci_grammar_vocab *vocab;
  /* interned states: key = [partial value, bytes remaining, n stacks, (len, positions...)...] */
  ivec keys;
  size_t *key_off;
  uint32_t *key_hash;
  uint8_t *complete;
  int8_t *plain_loop; /* every plain byte leads back to the state: 1, 0, -1 not known yet */
  int32_t *mask_slot; /* cached mask slot of each state, -1 none */
  int32_t *trans;     /* [n_states * 256] */
  int n_states, cap_states;
  uint32_t *table; /* open addressing: state + 1, 0 empty */
  size_t table_mask;
  int current;
  /* scratch */
  ivec out, key;
  int32_t *stack; /* [MAX_STACK + 2] the stack being expanded */
  int n_out;      /* stacks in out */
  stack_ref *refs;
  size_t cap_refs;
  int32_t *walk; /* [max_depth + 1] state at each trie depth */
  /* mask cache */
  int words;
  int n_slots, next_slot;
  uint32_t *masks; /* [n_slots * words] */
  int32_t *slot_state;
  uint32_t *scratch_mask; /* [words] when the cache has no slot */
};

/* ==== Interning ==== */

static uint32_t hash_key(const int32_t *k, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) {
    h ^= (uint32_t)k[i];
    h *= 1099511628211ull;
  }
  return (uint32_t)(h ^ h >> 32);
}

static size_t key_len(const ci_grammar_matcher *m, int s) {
  const size_t end = s + 1 < m->n_states ? m->key_off[s + 1] : m->keys.n;
  return end - m->key_off[s];
}

static int grow_table(ci_grammar_matcher *m) {
  const size_t size = m->table ? (m->table_mask + 1) * 2 : 1024;
  uint32_t *t = calloc(size, sizeof *t);
  if (!t) return ci_fail("grammar matcher: out of memory");
  for (int s = 0; s < m->n_states; s++) {
    size_t i = m->key_hash[s] & (size - 1);
    while (t[i]) i = (i + 1) & (size - 1);
    t[i] = (uint32_t)s + 1;
  }
  free(m->table);
  m->table = t;
  m->table_mask = size - 1;
  return CI_OK;
}

static int grow_states(ci_grammar_matcher *m) {
  const int cap = m->cap_states ? m->cap_states * 2 : 64;
  size_t *off = realloc(m->key_off, (size_t)cap * sizeof *off);
  if (off) m->key_off = off;
  uint32_t *hash = realloc(m->key_hash, (size_t)cap * sizeof *hash);
  if (hash) m->key_hash = hash;
  uint8_t *complete = realloc(m->complete, (size_t)cap);
  if (complete) m->complete = complete;
  int8_t *loop = realloc(m->plain_loop, (size_t)cap);
  if (loop) m->plain_loop = loop;
  int32_t *slot = realloc(m->mask_slot, (size_t)cap * sizeof *slot);
  if (slot) m->mask_slot = slot;
  int32_t *trans = realloc(m->trans, (size_t)cap * 256 * sizeof *trans);
  if (trans) m->trans = trans;
  if (!off || !hash || !complete || !loop || !slot || !trans)
    return ci_fail("grammar matcher: out of memory");
  m->cap_states = cap;
  return CI_OK;
}

/* The state of key[0..n); -1 on out of memory. */
static int intern(ci_grammar_matcher *m, const int32_t *key, size_t n) {
  const uint32_t h = hash_key(key, n);
  if (m->table)
    for (size_t i = h & m->table_mask; m->table[i]; i = (i + 1) & m->table_mask) {
      const int s = (int)m->table[i] - 1;
      if (m->key_hash[s] == h && key_len(m, s) == n &&
          memcmp(m->keys.v + m->key_off[s], key, n * sizeof *key) == 0)
        return s;
    }
  if (m->n_states == m->cap_states && grow_states(m)) return -1;
  if ((size_t)(m->n_states + 1) * 2 > (m->table ? m->table_mask + 1 : 0) && grow_table(m))
    return -1;
  if (ivec_reserve(&m->keys, n)) return -1;
  const int s = m->n_states++;
  m->key_off[s] = m->keys.n;
  memcpy(m->keys.v + m->keys.n, key, n * sizeof *key);
  m->keys.n += n;
  m->key_hash[s] = h;
  m->mask_slot[s] = -1;
  for (int b = 0; b < 256; b++) m->trans[(size_t)s * 256 + (size_t)b] = T_UNKNOWN;
  /* complete: no partial character and an empty stack */
  int complete = 0;
  if (key[1] == 0)
    for (size_t i = 3, k = 0; k < (size_t)key[2]; k++, i += 1 + (size_t)key[i])
      if (key[i] == 0) complete = 1;
  m->complete[s] = (uint8_t)complete;
  m->plain_loop[s] = -1;
  size_t i = h & m->table_mask;
  while (m->table[i]) i = (i + 1) & m->table_mask;
  m->table[i] = (uint32_t)s + 1;
  return s;
}

/* ==== Stacks ==== */

static int is_end(const ci_grammar *g, int32_t pos) {
  const uint8_t t = g->elements[pos].type;
  return t == CI_GE_END || t == CI_GE_ALT;
}

/* Expands stack[0..len) (in m->stack, which has room up to MAX_STACK) until every resulting
 * stack has a terminal or nothing on top, and appends them to m->out as (len, positions...).
 * stack[0..len) is as before on return. */
static int advance(ci_grammar_matcher *m, int32_t len, int depth) {
  const ci_grammar *g = m->g;
  int32_t *stack = m->stack;
  if (len == 0 || g->elements[stack[len - 1]].type != CI_GE_RULE_REF) {
    if (++m->n_out > MAX_STACKS)
      return ci_fail("grammar: more than %d parses at once (an ambiguous grammar)", MAX_STACKS);
    if (ivec_reserve(&m->out, (size_t)len + 1)) return CI_ERR;
    m->out.v[m->out.n++] = len;
    memcpy(m->out.v + m->out.n, stack, (size_t)len * sizeof *stack);
    m->out.n += (size_t)len;
    return CI_OK;
  }
  if (depth > MAX_STACK) return ci_fail("grammar: rules nested deeper than %d", MAX_STACK);
  const int32_t top = stack[len - 1];
  const int32_t cont = top + 1;
  int32_t base = len - 1;
  if (!is_end(g, cont)) stack[base++] = cont;
  int status = CI_OK;
  for (int32_t pos = g->rule_start[g->elements[top].value];;) {
    int32_t n = base;
    if (!is_end(g, pos)) {
      if (n >= MAX_STACK) {
        status = ci_fail("grammar: nesting deeper than %d", MAX_STACK);
        break;
      }
      stack[n++] = pos;
    }
    if ((status = advance(m, n, depth + 1))) break;
    while (!is_end(g, pos)) pos++;
    if (g->elements[pos].type == CI_GE_END) break;
    pos++;
  }
  stack[len - 1] = top;
  return status;
}

static int compare_stacks(const void *a, const void *b) {
  const stack_ref *x = a, *y = b;
  if (x->len != y->len) return x->len < y->len ? -1 : 1;
  return memcmp(x->e, y->e, (size_t)x->len * sizeof *x->e);
}

/* Interns the stacks in m->out with a partial character (value, remaining): the state, or -1. */
static int intern_out(ci_grammar_matcher *m, int32_t value, int32_t remaining) {
  if ((size_t)m->n_out > m->cap_refs) {
    stack_ref *r = realloc(m->refs, (size_t)m->n_out * sizeof *r);
    if (!r) return ci_fail("grammar matcher: out of memory"), -1;
    m->refs = r;
    m->cap_refs = (size_t)m->n_out;
  }
  size_t n = 0;
  for (size_t i = 0; i < m->out.n; i += 1 + (size_t)m->out.v[i])
    m->refs[n++] = (stack_ref){m->out.v + i + 1, m->out.v[i]};
  qsort(m->refs, n, sizeof *m->refs, compare_stacks);
  m->key.n = 0;
  if (ivec_reserve(&m->key, m->out.n + 3)) return -1;
  m->key.v[0] = value;
  m->key.v[1] = remaining;
  m->key.n = 3;
  int32_t unique = 0;
  for (size_t i = 0; i < n; i++) {
    if (i > 0 && compare_stacks(&m->refs[i - 1], &m->refs[i]) == 0) continue;
    m->key.v[m->key.n++] = m->refs[i].len;
    memcpy(m->key.v + m->key.n, m->refs[i].e, (size_t)m->refs[i].len * sizeof *m->key.v);
    m->key.n += (size_t)m->refs[i].len;
    unique++;
  }
  m->key.v[2] = unique;
  return intern(m, m->key.v, m->key.n);
}

/* ==== Transitions ==== */

/* Whether the terminal at pos accepts every code point from U+0080 up (`.`, and negated
 * classes of ASCII only, such as a JSON string's characters). */
static int takes_all_non_ascii(const ci_grammar *g, int32_t pos) {
  const ci_grammar_element *e = g->elements + pos;
  if (e->type == CI_GE_CHAR_ANY) return 1;
  const int negated = e->type == CI_GE_CHAR_NOT;
  do {
    const uint32_t a = e->value, b = e[1].type == CI_GE_CHAR_RNG_UPPER ? e[1].value : a;
    if (negated && b >= 0x80) return 0;
    if (!negated && a <= 0x80 && b >= 0x10FFFF) return 1;
    e += e[1].type == CI_GE_CHAR_RNG_UPPER ? 2 : 1;
  } while (e->type == CI_GE_CHAR_ALT);
  return negated;
}

/* The state after code point c from the stacks of state s; T_DEAD when no stack takes it;
 * -3 on failure. */
static int take_char(ci_grammar_matcher *m, int s, uint32_t c) {
  m->out.n = 0;
  m->n_out = 0;
  for (size_t k = 0, i = 3;; k++) {
    const int32_t *key = m->keys.v + m->key_off[s]; /* re-read: advance may grow m->keys? no */
    if (k >= (size_t)key[2]) break;
    const int32_t len = key[i];
    const int32_t *st = key + i + 1;
    i += 1 + (size_t)len;
    if (len == 0 || !ci_grammar_char_matches(m->g, st[len - 1], c)) continue;
    memcpy(m->stack, st, (size_t)(len - 1) * sizeof *st);
    int32_t n = len - 1;
    const int32_t after = ci_grammar_after_terminal(m->g, st[len - 1]);
    if (!is_end(m->g, after)) m->stack[n++] = after;
    if (advance(m, n, 0)) return -3;
  }
  if (m->n_out == 0) return T_DEAD;
  const int t = intern_out(m, 0, 0);
  return t < 0 ? -3 : t;
}

/* Whether continuation byte b, the first after a lead byte, makes an overlong encoding, a
 * surrogate or a code point past U+10FFFF (value, remaining: the partial character so far; a
 * 3-byte lead leaves value < 0x10 with 2 bytes to go, a 4-byte lead 3 to go). */
static int overlong_or_surrogate(int32_t value, int32_t remaining, int b) {
  if (remaining == 2 && value < 0x10)
    return (value == 0 && b < 0xA0) || (value == 0x0D && b > 0x9F);
  if (remaining == 3) return (value == 0 && b < 0x90) || (value == 4 && b > 0x8F);
  return 0;
}

/* The state after byte b from state s (T_DEAD, or -3 on failure), computed and remembered. */
static int compute_transition(ci_grammar_matcher *m, int s, int b) {
  const int32_t *key = m->keys.v + m->key_off[s];
  int32_t value = key[0], remaining = key[1];
  int t;
  uint32_t cp = 0;
  int full = 0;
  if (remaining == 0) {
    if (b < 0x80) {
      cp = (uint32_t)b;
      full = 1;
    } else if (b >= 0xC2 && b <= 0xDF) {
      value = b & 0x1F;
      remaining = 1;
    } else if ((b & 0xF0) == 0xE0) {
      value = b & 0x0F;
      remaining = 2;
    } else if (b >= 0xF0 && b <= 0xF4) {
      value = b & 0x07;
      remaining = 3;
    } else {
      value = -1;
    }
  } else if ((b & 0xC0) != 0x80) {
    value = -1;
  } else if (value == PARTIAL_ANY) { /* any continuation does */
    if (--remaining == 0) {
      cp = 0x80; /* every stack takes every non-ASCII character alike */
      full = 1;
    }
  } else if (!overlong_or_surrogate(value, remaining, b)) {
    value = value << 6 | (b & 0x3F);
    if (--remaining == 0) {
      cp = (uint32_t)value;
      full = 1;
    }
  } else {
    value = -1;
  }
  if (value == -1 || (full && cp > 0x10FFFF)) {
    t = T_DEAD;
  } else if (full) {
    t = take_char(m, s, cp);
  } else if (value == PARTIAL_ANY) {
    const size_t n = key_len(m, s);
    m->key.n = 0;
    if (ivec_reserve(&m->key, n)) return -3;
    memcpy(m->key.v, m->keys.v + m->key_off[s], n * sizeof *m->key.v);
    m->key.v[1] = remaining;
    t = intern(m, m->key.v, n);
    if (t < 0) return -3;
  } else {
    uint32_t lo = (uint32_t)value << (6 * remaining);
    uint32_t hi = lo | ((1u << (6 * remaining)) - 1);
    /* a 3- or 4-byte lead alone: the shortest form starts at U+0800 / U+10000 */
    if (remaining == 2 && value < 0x10 && lo < 0x800) lo = 0x800;
    if (remaining == 3 && lo < 0x10000) lo = 0x10000;
    if (hi > 0x10FFFF) hi = 0x10FFFF;
    /* the new partial state keeps only the stacks that may take the character; when every such
     * stack takes any non-ASCII character the value only matters for ruling out overlong forms
     * and surrogates at the first continuation byte: a lead byte keeps just its class (E0, ED,
     * other E*; F0, F4, other F*), and past that byte the value is dropped, so all such partial
     * characters share a few states */
    const size_t n = key_len(m, s);
    m->key.n = 0;
    if (ivec_reserve(&m->key, n)) return -3;
    const int32_t *old = m->keys.v + m->key_off[s];
    int32_t kept = 0;
    int all_wide = 1;
    size_t at = 3;
    for (size_t i = 3, k = 0; k < (size_t)old[2]; k++, i += 1 + (size_t)old[i]) {
      const int32_t len = old[i];
      if (len == 0 || !ci_grammar_char_range_may_match(m->g, old[i + (size_t)len], lo, hi))
        continue;
      all_wide &= takes_all_non_ascii(m->g, old[i + (size_t)len]);
      memcpy(m->key.v + at, old + i, ((size_t)len + 1) * sizeof *old);
      at += (size_t)len + 1;
      kept++;
    }
    if (kept == 0) {
      t = T_DEAD;
    } else {
      const int past_first = remaining == 1 || (remaining == 2 && value >= 0x10);
      int32_t keep = value;
      if (all_wide && past_first)
        keep = PARTIAL_ANY;
      else if (all_wide && remaining == 2) /* 3-byte lead: E0, ED or any other */
        keep = value == 0 || value == 0x0D ? value : 1;
      else if (all_wide && remaining == 3) /* 4-byte lead: F0, F4 or any other */
        keep = value == 0 || value == 4 ? value : 1;
      m->key.v[0] = keep;
      m->key.v[1] = remaining;
      m->key.v[2] = kept;
      m->key.n = at;
      t = intern(m, m->key.v, at);
      if (t < 0) return -3;
    }
  }
  if (t >= T_DEAD) m->trans[(size_t)s * 256 + (size_t)b] = t;
  return t;
}

static inline int transition(ci_grammar_matcher *m, int s, int b) {
  const int t = m->trans[(size_t)s * 256 + (size_t)b];
  return t != T_UNKNOWN ? t : compute_transition(m, s, b);
}

/* ==== Tables ==== */

static void drop_tables(ci_grammar_matcher *m) {
  m->n_states = 0;
  m->keys.n = 0;
  if (m->table) memset(m->table, 0, (m->table_mask + 1) * sizeof *m->table);
  for (int i = 0; i < m->n_slots; i++) m->slot_state[i] = -1;
}

/* Rebuilds the tables from the current state alone when they grew past their limits. */
static int maybe_shrink(ci_grammar_matcher *m) {
  if (m->n_states <= MAX_STATES && m->keys.n <= MAX_KEY_INTS) return CI_OK;
  return ci_grammar_matcher_clear_cache(m);
}

int ci_grammar_matcher_clear_cache(ci_grammar_matcher *m) {
  const size_t n = key_len(m, m->current);
  ivec saved = {0};
  if (ivec_reserve(&saved, n)) return CI_ERR;
  memcpy(saved.v, m->keys.v + m->key_off[m->current], n * sizeof *saved.v);
  drop_tables(m);
  m->current = intern(m, saved.v, n);
  free(saved.v);
  return m->current < 0 ? CI_ERR : CI_OK;
}

/* ==== Creation ==== */

void ci_grammar_matcher_free(ci_grammar_matcher *m) {
  if (!m) return;
  ci_grammar_free(m->g);
  ci_grammar_vocab_free(m->vocab);
  free(m->keys.v);
  free(m->key_off);
  free(m->key_hash);
  free(m->complete);
  free(m->plain_loop);
  free(m->mask_slot);
  free(m->trans);
  free(m->table);
  free(m->out.v);
  free(m->key.v);
  free(m->stack);
  free(m->refs);
  free(m->walk);
  free(m->masks);
  free(m->slot_state);
  free(m->scratch_mask);
  free(m);
}

ci_grammar_matcher *ci_grammar_matcher_create(ci_grammar *grammar, ci_grammar_vocab *vocab) {
  ci_grammar_matcher *m = calloc(1, sizeof *m);
  if (!m) {
    ci_fail("grammar matcher: out of memory");
    return NULL;
  }
  m->g = ci_grammar_retain(grammar);
  m->vocab = vocab ? ci_grammar_vocab_retain(vocab) : NULL;
  m->stack = malloc((MAX_STACK + 2) * sizeof *m->stack);
  int ok = m->stack != NULL;
  if (ok && vocab) {
    m->words = (vocab->n_vocab + 31) / 32;
    m->n_slots = (int)(MASK_CACHE_BYTES / ((size_t)m->words * 4));
    if (m->n_slots < 4) m->n_slots = 4;
    if (m->n_slots > 256) m->n_slots = 256;
    m->masks = malloc((size_t)m->n_slots * (size_t)m->words * sizeof *m->masks);
    m->slot_state = malloc((size_t)m->n_slots * sizeof *m->slot_state);
    m->walk = malloc(((size_t)vocab->max_depth + 1) * sizeof *m->walk);
    ok = m->masks && m->slot_state && m->walk;
    for (int i = 0; ok && i < m->n_slots; i++) m->slot_state[i] = -1;
  }
  if (!ok) {
    ci_grammar_matcher_free(m);
    ci_fail("grammar matcher: out of memory");
    return NULL;
  }
  /* the start state: each alternative of the root rule, expanded */
  m->out.n = 0;
  m->n_out = 0;
  int status = CI_OK;
  for (int32_t pos = grammar->rule_start[grammar->root]; !status;) {
    int32_t n = 0;
    if (!is_end(grammar, pos)) m->stack[n++] = pos;
    status = advance(m, n, 0);
    while (!is_end(grammar, pos)) pos++;
    if (grammar->elements[pos].type == CI_GE_END) break;
    pos++;
  }
  m->current = status ? -1 : intern_out(m, 0, 0);
  if (m->current < 0) {
    ci_grammar_matcher_free(m);
    return NULL;
  }
  return m;
}

/* ==== Accepting ==== */

int ci_grammar_matcher_allows(ci_grammar_matcher *m, const char *bytes, size_t n) {
  if (maybe_shrink(m)) return 0;
  int s = m->current;
  for (size_t i = 0; i < n && s >= 0; i++) s = transition(m, s, (uint8_t)bytes[i]);
  return s >= 0;
}

int ci_grammar_matcher_accept_bytes(ci_grammar_matcher *m, const char *bytes, size_t n) {
  if (maybe_shrink(m)) return CI_ERR;
  int s = m->current;
  for (size_t i = 0; i < n; i++) {
    const int t = transition(m, s, (uint8_t)bytes[i]);
    if (t == -3) return CI_ERR;
    if (t < 0)
      return ci_fail("the grammar does not allow byte %zu (0x%02x) of \"%.*s\"", i,
                     (unsigned)(uint8_t)bytes[i], (int)(n < 64 ? n : 64), bytes);
    s = t;
  }
  m->current = s;
  return CI_OK;
}

int ci_grammar_matcher_accept_token(ci_grammar_matcher *m, int32_t id) {
  if (!m->vocab || id < 0 || id >= m->vocab->n_vocab)
    return ci_fail("grammar: token %d is not in the vocabulary", (int)id);
  size_t len;
  const char *b = ci_grammar_vocab_token(m->vocab, id, &len);
  if (len == 0) return ci_fail("the grammar does not allow token %d (it has no text)", (int)id);
  return ci_grammar_matcher_accept_bytes(m, b, len);
}

int ci_grammar_matcher_is_complete(const ci_grammar_matcher *m) {
  return m->complete[m->current];
}

int ci_grammar_matcher_is_finished(ci_grammar_matcher *m) {
  if (!m->complete[m->current]) return 0;
  for (int b = 0; b < 256; b++)
    if (transition(m, m->current, b) >= 0) return 0;
  return 1;
}

int ci_grammar_matcher_n_states(const ci_grammar_matcher *m) {
  return m->n_states;
}

/* ==== Masks ==== */

/* Whether every plain byte leads from s back to s (inside a JSON string, say): 1, 0, or -3 on
 * failure. Most states fail on the first bytes tried. */
static int plain_loop(ci_grammar_matcher *m, int s) {
  if (m->plain_loop[s] >= 0) return m->plain_loop[s];
  static const uint8_t probe[] = {'a', ' ', 'Z', '0', '{', '}', ':', ','};
  int loops = 1;
  for (size_t i = 0; i < sizeof probe && loops; i++) {
    const int t = transition(m, s, probe[i]);
    if (t == -3) return -3;
    loops = t == s;
  }
  for (int b = 0x20; b <= 0x7E && loops; b++) {
    if (!ci_grammar_plain_byte((uint8_t)b)) continue;
    const int t = transition(m, s, b);
    if (t == -3) return -3;
    loops = t == s;
  }
  m->plain_loop[s] = (int8_t)loops;
  return loops;
}

/* The trie walk: every token whose bytes lead from the current state to a live state. A plain
 * subtree under a state that every plain byte keeps is allowed whole: its tokens are a
 * contiguous run of token_ids, set without walking it. */
static int walk_trie(ci_grammar_matcher *m, uint32_t *bits) {
  const ci_grammar_vocab *v = m->vocab;
  memset(bits, 0, (size_t)m->words * sizeof *bits);
  int32_t *st = m->walk;
  st[0] = m->current;
  const ci_grammar_trie_node *nodes = v->nodes;
  const uint8_t *plain = v->plain;
  const int32_t *ids = v->token_ids;
  const int32_t *trans = m->trans; /* re-read after a transition is computed (may move) */
  for (int32_t k = 1; k < v->n_nodes;) {
    const ci_grammar_trie_node node = nodes[k];
    const int parent = st[node.depth - 1];
    if (plain[k]) {
      const int loops = plain_loop(m, parent);
      if (loops == -3) return CI_ERR;
      trans = m->trans;
      if (loops) {
        const int32_t last = node.end < v->n_nodes ? nodes[node.end].tokens : v->n_sorted;
        for (int32_t t = node.tokens; t < last; t++) bits[ids[t] >> 5] |= 1u << (ids[t] & 31);
        k = node.end;
        continue;
      }
    }
    int s = trans[(size_t)parent * 256 + node.byte];
    if (s == T_UNKNOWN) {
      s = compute_transition(m, parent, node.byte);
      if (s == -3) return CI_ERR;
      trans = m->trans;
    }
    if (s < 0) {
      k = node.end;
      continue;
    }
    st[node.depth] = s;
    for (int32_t t = node.tokens; t < node.tokens + node.n_tokens; t++)
      bits[ids[t] >> 5] |= 1u << (ids[t] & 31);
    k++;
  }
  return CI_OK;
}

const uint32_t *ci_grammar_matcher_mask(ci_grammar_matcher *m) {
  if (!m->vocab) {
    ci_fail("grammar matcher: no vocabulary");
    return NULL;
  }
  if (maybe_shrink(m)) return NULL;
  const int s = m->current;
  if (m->mask_slot[s] >= 0) return m->masks + (size_t)m->mask_slot[s] * (size_t)m->words;
  const int slot = m->next_slot;
  m->next_slot = (m->next_slot + 1) % m->n_slots;
  if (m->slot_state[slot] >= 0) m->mask_slot[m->slot_state[slot]] = -1;
  m->slot_state[slot] = -1;
  uint32_t *bits = m->masks + (size_t)slot * (size_t)m->words;
  if (walk_trie(m, bits)) return NULL;
  /* the walk may have rebuilt nothing (tables only shrink in maybe_shrink), so s is valid */
  m->slot_state[slot] = s;
  m->mask_slot[s] = slot;
  return bits;
}

int ci_grammar_matcher_apply(ci_grammar_matcher *m, float *logits, const int32_t *eos, int n_eos) {
  const uint32_t *bits = ci_grammar_matcher_mask(m);
  if (!bits) return -1;
  const int n = m->vocab->n_vocab;
  const int complete = ci_grammar_matcher_is_complete(m);
  float kept[64];
  if (n_eos > 64) n_eos = 64;
  for (int i = 0; i < n_eos; i++) kept[i] = eos[i] >= 0 && eos[i] < n ? logits[eos[i]] : 0.0f;
  int allowed = 0;
  for (int w = 0; w < m->words; w++) {
    const uint32_t word = bits[w];
    const int base = w * 32;
    const int end = base + 32 < n ? base + 32 : n;
    if (word == 0xFFFFFFFFu && end - base == 32) {
      allowed += 32;
      continue;
    }
    for (int i = base; i < end; i++) {
      if (word >> (i - base) & 1)
        allowed++;
      else
        logits[i] = -INFINITY;
    }
  }
  for (int i = 0; i < n_eos; i++) {
    if (eos[i] < 0 || eos[i] >= n) continue;
    const int was_allowed = bits[eos[i] >> 5] >> (eos[i] & 31) & 1;
    if (complete) {
      if (!was_allowed && logits[eos[i]] == -INFINITY && kept[i] > -INFINITY) allowed++;
      logits[eos[i]] = kept[i];
    } else if (was_allowed && logits[eos[i]] > -INFINITY) {
      logits[eos[i]] = -INFINITY; /* EOS never cuts an incomplete sentence */
      allowed--;
    }
  }
  return allowed;
}
