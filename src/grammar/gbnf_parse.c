/* The GBNF parser: text -> ci_grammar (grammar.h), with repetitions and groups expanded into
 * generated rules, then the checks every grammar must pass (all referenced rules defined, a start
 * rule, no left recursion). Errors name the line and column. */
#include "grammar/grammar.h"

#include "base/error.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  MAX_REPEAT = 100000,    /* upper bound of {m,n} */
  MAX_ELEMENTS = 1 << 24, /* elements a grammar may expand to */
  MAX_NESTING = 512       /* nested groups */
};

typedef struct {
  ci_grammar_element *v;
  int n, cap;
} evec;

typedef struct {
  char *name;
  evec body;
  int defined;
  size_t first_use; /* offset of the first reference (for "undefined rule" errors) */
} prule;

typedef struct {
  const char *text;
  size_t len, pos;
  prule *rules;
  int n_rules, cap_rules;
  int total_elements;
  int depth;
  int failed;
} parser;

static int evec_push(evec *e, uint8_t type, uint32_t value) {
  if (e->n == e->cap) {
    int cap = e->cap ? e->cap * 2 : 16;
    ci_grammar_element *bigger = realloc(e->v, (size_t)cap * sizeof *bigger);
    if (!bigger) return ci_fail("grammar: out of memory");
    e->v = bigger;
    e->cap = cap;
  }
  e->v[e->n++] = (ci_grammar_element){type, value};
  return CI_OK;
}

static int evec_append(evec *e, const ci_grammar_element *src, int n) {
  for (int i = 0; i < n; i++)
    if (evec_push(e, src[i].type, src[i].value)) return CI_ERR;
  return CI_OK;
}

/* ==== Errors with positions ==== */

static int fail_at(parser *p, size_t pos, const char *what) {
  int line = 1, col = 1;
  for (size_t i = 0; i < pos && i < p->len; i++) {
    if (p->text[i] == '\n') {
      line++;
      col = 1;
    } else if (((unsigned char)p->text[i] & 0xC0) != 0x80) {
      col++;
    }
  }
  p->failed = 1;
  return ci_fail("grammar line %d, column %d: %s", line, col, what);
}

/* ==== Rules ==== */

static int rule_id(parser *p, const char *name, size_t n, size_t use_pos) {
  for (int i = 0; i < p->n_rules; i++)
    if (strlen(p->rules[i].name) == n && memcmp(p->rules[i].name, name, n) == 0) return i;
  if (p->n_rules == p->cap_rules) {
    int cap = p->cap_rules ? p->cap_rules * 2 : 32;
    prule *bigger = realloc(p->rules, (size_t)cap * sizeof *bigger);
    if (!bigger) return ci_fail("grammar: out of memory"), -1;
    p->rules = bigger;
    p->cap_rules = cap;
  }
  prule *r = &p->rules[p->n_rules];
  memset(r, 0, sizeof *r);
  r->name = malloc(n + 1);
  if (!r->name) return ci_fail("grammar: out of memory"), -1;
  memcpy(r->name, name, n);
  r->name[n] = 0;
  r->first_use = use_pos;
  return p->n_rules++;
}

/* A fresh rule named after its parent ("parent_N"). */
static int generated_rule(parser *p, int parent) {
  char name[256];
  snprintf(name, sizeof name, "%.200s/%d", p->rules[parent].name, p->n_rules);
  const int id = rule_id(p, name, strlen(name), p->pos);
  if (id >= 0) p->rules[id].defined = 1;
  return id;
}

static int set_rule_body(parser *p, int id, evec *body) {
  p->total_elements += body->n;
  if (p->total_elements > MAX_ELEMENTS) {
    free(body->v);
    return fail_at(p, p->pos, "the grammar expands to too many elements");
  }
  free(p->rules[id].body.v);
  p->rules[id].body = *body;
  p->rules[id].defined = 1;
  return CI_OK;
}

/* ==== Lexing ==== */

static int at_end(const parser *p) {
  return p->pos >= p->len;
}

static char peek(const parser *p, size_t ahead) {
  return p->pos + ahead < p->len ? p->text[p->pos + ahead] : 0;
}

static void skip_space(parser *p, int newline_ok) {
  while (!at_end(p)) {
    const char c = p->text[p->pos];
    if (c == ' ' || c == '\t') {
      p->pos++;
    } else if (c == '#') {
      while (!at_end(p) && p->text[p->pos] != '\n') p->pos++;
    } else if (newline_ok && (c == '\r' || c == '\n')) {
      p->pos++;
    } else {
      break;
    }
  }
}

static int is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

static int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* One UTF-8 character of the grammar text. */
static int decode_utf8(parser *p, uint32_t *cp) {
  const unsigned char c = (unsigned char)p->text[p->pos];
  int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (n == 0 || p->pos + (size_t)n > p->len) return fail_at(p, p->pos, "invalid UTF-8");
  uint32_t v = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
  for (int i = 1; i < n; i++) {
    const unsigned char k = (unsigned char)p->text[p->pos + (size_t)i];
    if ((k & 0xC0) != 0x80) return fail_at(p, p->pos, "invalid UTF-8");
    v = v << 6 | (k & 0x3F);
  }
  p->pos += (size_t)n;
  *cp = v;
  return CI_OK;
}

/* One character of a literal or class, with escapes. */
static int parse_char(parser *p, uint32_t *cp) {
  if (at_end(p)) return fail_at(p, p->pos, "unexpected end of input");
  if (p->text[p->pos] != '\\') return decode_utf8(p, cp);
  const size_t start = p->pos;
  const char e = peek(p, 1);
  p->pos += 2;
  int digits = 0;
  switch (e) {
  case 'n':
    *cp = '\n';
    return CI_OK;
  case 'r':
    *cp = '\r';
    return CI_OK;
  case 't':
    *cp = '\t';
    return CI_OK;
  case '\\':
  case '"':
  case '[':
  case ']':
  case '-':
  case '^':
  case '/':
  case '\'':
    *cp = (uint32_t)e;
    return CI_OK;
  case 'x':
    digits = 2;
    break;
  case 'u':
    digits = 4;
    break;
  case 'U':
    digits = 8;
    break;
  default:
    return fail_at(p, start, "unknown escape sequence");
  }
  uint32_t v = 0;
  for (int i = 0; i < digits; i++) {
    const int h = hex_value(peek(p, 0));
    if (h < 0) return fail_at(p, start, "expected hex digits in escape");
    v = v << 4 | (uint32_t)h;
    p->pos++;
  }
  if (v > 0x10FFFF) return fail_at(p, start, "code point out of range");
  *cp = v;
  return CI_OK;
}

static int parse_uint(parser *p, int *out) {
  if (!(peek(p, 0) >= '0' && peek(p, 0) <= '9')) return fail_at(p, p->pos, "expected a number");
  long v = 0;
  while (peek(p, 0) >= '0' && peek(p, 0) <= '9') {
    v = v * 10 + (peek(p, 0) - '0');
    if (v > MAX_REPEAT) return fail_at(p, p->pos, "repetition count too large");
    p->pos++;
  }
  *out = (int)v;
  return CI_OK;
}

/* ==== Repetitions ==== */

/* Replaces out[last..] (one symbol S) by S{min,max} (max < 0: unbounded), as llama.cpp expands
 * it: S copied min times, then a chain of optional generated rules. */
static int repeat(parser *p, int rule, evec *out, int last, int min, int max) {
  if (last == out->n) return fail_at(p, p->pos, "expecting an item before the repetition operator");
  if (max >= 0 && max < min) return fail_at(p, p->pos, "repetition maximum below its minimum");
  const int n_sym = out->n - last;
  ci_grammar_element *sym = malloc((size_t)n_sym * sizeof *sym);
  if (!sym) return ci_fail("grammar: out of memory");
  memcpy(sym, out->v + last, (size_t)n_sym * sizeof *sym);
  int status = CI_OK;
  if (min == 0) out->n = last;
  if ((long)n_sym * (min > 0 ? min : 1) + p->total_elements > MAX_ELEMENTS)
    status = fail_at(p, p->pos, "the grammar expands to too many elements");
  for (int i = 1; i < min && !status; i++) status = evec_append(out, sym, n_sym);
  const int n_opt = max < 0 ? 1 : max - min;
  int last_rec = -1;
  for (int i = 0; i < n_opt && !status; i++) {
    const int id = generated_rule(p, rule);
    evec body = {0};
    status = id < 0 ? CI_ERR : evec_append(&body, sym, n_sym);
    if (!status && (i > 0 || max < 0))
      status = evec_push(&body, CI_GE_RULE_REF, (uint32_t)(max < 0 ? id : last_rec));
    if (!status) status = evec_push(&body, CI_GE_ALT, 0);
    if (!status) status = evec_push(&body, CI_GE_END, 0);
    if (!status)
      status = set_rule_body(p, id, &body);
    else
      free(body.v);
    last_rec = id;
  }
  if (!status && n_opt > 0) status = evec_push(out, CI_GE_RULE_REF, (uint32_t)last_rec);
  free(sym);
  return status;
}

/* ==== Sequences and alternatives ==== */

static int parse_alternates(parser *p, int rule, evec *out, int nested);

static int parse_sequence(parser *p, int rule, evec *out, int nested) {
  int last = out->n;
  while (!at_end(p) && !p->failed) {
    const char c = peek(p, 0);
    const size_t start = p->pos;
    if (c == '"') {
      p->pos++;
      last = out->n;
      while (!at_end(p) && peek(p, 0) != '"') {
        uint32_t cp;
        if (parse_char(p, &cp) || evec_push(out, CI_GE_CHAR, cp)) return CI_ERR;
      }
      if (at_end(p)) return fail_at(p, start, "unterminated string literal");
      p->pos++;
    } else if (c == '[') {
      p->pos++;
      last = out->n;
      uint8_t first = CI_GE_CHAR;
      if (peek(p, 0) == '^') {
        p->pos++;
        first = CI_GE_CHAR_NOT;
      }
      while (!at_end(p) && peek(p, 0) != ']') {
        uint32_t lo;
        if (parse_char(p, &lo)) return CI_ERR;
        if (evec_push(out, out->n == last ? first : CI_GE_CHAR_ALT, lo)) return CI_ERR;
        if (peek(p, 0) == '-' && peek(p, 1) != ']' && p->pos + 1 < p->len) {
          p->pos++;
          uint32_t hi;
          if (parse_char(p, &hi)) return CI_ERR;
          if (hi < lo) return fail_at(p, start, "character range with its end before its start");
          if (evec_push(out, CI_GE_CHAR_RNG_UPPER, hi)) return CI_ERR;
        }
      }
      if (at_end(p)) return fail_at(p, start, "unterminated character class");
      if (out->n == last) return fail_at(p, start, "empty character class");
      p->pos++;
    } else if (is_name_char(c)) {
      size_t end = p->pos;
      while (end < p->len && is_name_char(p->text[end])) end++;
      const int id = rule_id(p, p->text + p->pos, end - p->pos, p->pos);
      if (id < 0) return CI_ERR;
      p->pos = end;
      last = out->n;
      if (evec_push(out, CI_GE_RULE_REF, (uint32_t)id)) return CI_ERR;
    } else if (c == '(') {
      if (++p->depth > MAX_NESTING) return fail_at(p, start, "groups nested too deeply");
      p->pos++;
      skip_space(p, 1);
      const int sub = generated_rule(p, rule);
      if (sub < 0) return CI_ERR;
      evec body = {0};
      if (parse_alternates(p, rule, &body, 1)) {
        free(body.v);
        return CI_ERR;
      }
      if (set_rule_body(p, sub, &body)) return CI_ERR;
      if (peek(p, 0) != ')') return fail_at(p, start, "expecting ')' to close this group");
      p->pos++;
      p->depth--;
      last = out->n;
      if (evec_push(out, CI_GE_RULE_REF, (uint32_t)sub)) return CI_ERR;
    } else if (c == '.') {
      p->pos++;
      last = out->n;
      if (evec_push(out, CI_GE_CHAR_ANY, 0)) return CI_ERR;
    } else if (c == '*' || c == '+' || c == '?') {
      p->pos++;
      if (repeat(p, rule, out, last, c == '+', c == '?' ? 1 : -1)) return CI_ERR;
    } else if (c == '{') {
      p->pos++;
      skip_space(p, nested);
      int min = 0, max = -1;
      if (parse_uint(p, &min)) return CI_ERR;
      skip_space(p, nested);
      if (peek(p, 0) == ',') {
        p->pos++;
        skip_space(p, nested);
        if (peek(p, 0) >= '0' && peek(p, 0) <= '9' && parse_uint(p, &max)) return CI_ERR;
        skip_space(p, nested);
      } else {
        max = min;
      }
      if (peek(p, 0) != '}') return fail_at(p, start, "expecting '}' to close the repetition");
      p->pos++;
      if (repeat(p, rule, out, last, min, max)) return CI_ERR;
    } else {
      break;
    }
    skip_space(p, nested);
  }
  return p->failed ? CI_ERR : CI_OK;
}

static int parse_alternates(parser *p, int rule, evec *out, int nested) {
  if (parse_sequence(p, rule, out, nested)) return CI_ERR;
  for (;;) {
    const size_t mark = p->pos;
    skip_space(p, 1); /* an alternative may start on the next line */
    if (peek(p, 0) != '|') {
      p->pos = mark;
      break;
    }
    p->pos++;
    skip_space(p, 1);
    if (evec_push(out, CI_GE_ALT, 0) || parse_sequence(p, rule, out, nested)) return CI_ERR;
  }
  return evec_push(out, CI_GE_END, 0);
}

static int parse_rule(parser *p) {
  const size_t start = p->pos;
  size_t end = p->pos;
  while (end < p->len && is_name_char(p->text[end])) end++;
  if (end == p->pos) return fail_at(p, start, "expecting a rule name");
  const int id = rule_id(p, p->text + p->pos, end - p->pos, start);
  if (id < 0) return CI_ERR;
  if (p->rules[id].defined) return fail_at(p, start, "rule defined twice");
  p->rules[id].defined = 1; /* a generated rule of its own body must not take its name */
  p->pos = end;
  skip_space(p, 0);
  if (!(peek(p, 0) == ':' && peek(p, 1) == ':' && peek(p, 2) == '='))
    return fail_at(p, p->pos, "expecting ::=");
  p->pos += 3;
  skip_space(p, 1);
  evec body = {0};
  if (parse_alternates(p, id, &body, 0)) {
    free(body.v);
    return CI_ERR;
  }
  if (set_rule_body(p, id, &body)) return CI_ERR;
  if (peek(p, 0) == '\r') p->pos++;
  if (peek(p, 0) == '\n')
    p->pos++;
  else if (!at_end(p))
    return fail_at(p, p->pos, "expecting a newline or the end of the grammar");
  skip_space(p, 1);
  return CI_OK;
}

/* ==== Checks ==== */

/* Left recursion: a rule reaching itself through leftmost references, where every reference
 * before the one taken can match the empty string. */
static int check_left_recursion(ci_grammar *g) {
  const int n = g->n_rules;
  char *nullable = calloc((size_t)n, 1);
  char *color = calloc((size_t)n, 1);
  int *stack = malloc((size_t)n * 2 * sizeof *stack);
  if (!nullable || !color || !stack) {
    free(nullable);
    free(color);
    free(stack);
    return ci_fail("grammar: out of memory");
  }
  for (int changed = 1; changed;) {
    changed = 0;
    for (int r = 0; r < n; r++) {
      if (nullable[r]) continue;
      int pos = g->rule_start[r], all = 1;
      for (;; pos++) {
        const ci_grammar_element e = g->elements[pos];
        if (e.type == CI_GE_END || e.type == CI_GE_ALT) {
          if (all) {
            nullable[r] = 1;
            changed = 1;
            break;
          }
          if (e.type == CI_GE_END) break;
          all = 1;
        } else if (e.type != CI_GE_RULE_REF || !nullable[e.value]) {
          all = 0;
        }
      }
    }
  }
  /* iterative DFS over leftmost edges: stack of (rule, next element to scan) */
  int status = CI_OK;
  for (int root = 0; root < n && !status; root++) {
    if (color[root]) continue;
    int top = 0;
    stack[0] = root;
    stack[1] = g->rule_start[root];
    color[root] = 1;
    while (top >= 0 && !status) {
      const int r = stack[2 * top];
      int pos = stack[2 * top + 1];
      int next = -1;
      while (next < 0) {
        const ci_grammar_element e = g->elements[pos];
        if (e.type == CI_GE_END) break;
        if (e.type == CI_GE_ALT) {
          pos++;
          continue;
        }
        /* element at the start of its alternative, or after nullable refs only */
        int prev = pos - 1, leftmost = 1;
        while (prev >= g->rule_start[r] && g->elements[prev].type != CI_GE_ALT) {
          const ci_grammar_element q = g->elements[prev];
          if (q.type != CI_GE_RULE_REF || !nullable[q.value]) {
            leftmost = 0;
            break;
          }
          prev--;
        }
        if (leftmost && e.type == CI_GE_RULE_REF) next = (int)e.value;
        pos++;
      }
      stack[2 * top + 1] = pos;
      if (next < 0) {
        color[r] = 2;
        top--;
      } else if (color[next] == 1) {
        status = ci_fail("grammar: left recursion in rule \"%s\" (it can reach itself before "
                         "matching a character)",
                         g->rule_names[next]);
      } else if (color[next] == 0) {
        color[next] = 1;
        top++;
        stack[2 * top] = next;
        stack[2 * top + 1] = g->rule_start[next];
      }
    }
  }
  free(nullable);
  free(color);
  free(stack);
  return status;
}

/* ==== Building ==== */

static void parser_free(parser *p) {
  for (int i = 0; i < p->n_rules; i++) {
    free(p->rules[i].name);
    free(p->rules[i].body.v);
  }
  free(p->rules);
}

static ci_grammar *build(parser *p, const char *root_rule) {
  for (int i = 0; i < p->n_rules; i++)
    if (!p->rules[i].defined) {
      char what[300];
      snprintf(what, sizeof what, "undefined rule \"%.200s\"", p->rules[i].name);
      fail_at(p, p->rules[i].first_use, what);
      return NULL;
    }
  int root = -1;
  for (int i = 0; i < p->n_rules; i++)
    if (strcmp(p->rules[i].name, root_rule) == 0) root = i;
  if (root < 0) {
    ci_fail("grammar: no rule named \"%s\" (the start rule)", root_rule);
    return NULL;
  }
  ci_grammar *g = calloc(1, sizeof *g);
  if (!g) goto oom;
  atomic_init(&g->refs, 1);
  g->n_rules = p->n_rules;
  g->root = root;
  g->rule_start = malloc((size_t)p->n_rules * sizeof *g->rule_start);
  g->rule_names = calloc((size_t)p->n_rules, sizeof *g->rule_names);
  g->elements = malloc(((size_t)p->total_elements + 1) * sizeof *g->elements);
  if (!g->rule_start || !g->rule_names || !g->elements) goto oom;
  for (int i = 0; i < p->n_rules; i++) {
    g->rule_start[i] = g->n_elements;
    memcpy(g->elements + g->n_elements, p->rules[i].body.v,
           (size_t)p->rules[i].body.n * sizeof *g->elements);
    g->n_elements += p->rules[i].body.n;
    g->rule_names[i] = p->rules[i].name;
    p->rules[i].name = NULL;
  }
  if (check_left_recursion(g)) {
    ci_grammar_free(g);
    return NULL;
  }
  return g;
oom:
  ci_grammar_free(g);
  ci_fail("grammar: out of memory");
  return NULL;
}

ci_grammar *ci_grammar_parse(const char *text, size_t len, const char *root_rule) {
  if (!text || !root_rule) {
    ci_fail("grammar: no text");
    return NULL;
  }
  parser p = {.text = text, .len = len};
  skip_space(&p, 1);
  while (!at_end(&p))
    if (parse_rule(&p)) {
      parser_free(&p);
      return NULL;
    }
  ci_grammar *g = build(&p, root_rule);
  parser_free(&p);
  return g;
}

ci_grammar *ci_grammar_retain(ci_grammar *g) {
  atomic_fetch_add(&g->refs, 1);
  return g;
}

void ci_grammar_free(ci_grammar *g) {
  if (!g) return;
  if (atomic_fetch_sub(&g->refs, 1) > 1) return;
  if (g->rule_names)
    for (int i = 0; i < g->n_rules; i++) free(g->rule_names[i]);
  free(g->rule_names);
  free(g->rule_start);
  free(g->elements);
  free(g);
}

/* ==== Terminals ==== */

int ci_grammar_char_matches(const ci_grammar *g, int pos, uint32_t c) {
  const ci_grammar_element *e = g->elements + pos;
  if (e->type == CI_GE_CHAR_ANY) return 1;
  const int negated = e->type == CI_GE_CHAR_NOT;
  int found = 0;
  do {
    if (e[1].type == CI_GE_CHAR_RNG_UPPER) {
      if (e->value <= c && c <= e[1].value) found = 1;
      e += 2;
    } else {
      if (e->value == c) found = 1;
      e += 1;
    }
  } while (e->type == CI_GE_CHAR_ALT);
  return found != negated;
}

int ci_grammar_char_range_may_match(const ci_grammar *g, int pos, uint32_t lo, uint32_t hi) {
  const ci_grammar_element *e = g->elements + pos;
  if (e->type == CI_GE_CHAR_ANY || e->type == CI_GE_CHAR_NOT) return 1;
  do {
    const uint32_t a = e->value;
    const uint32_t b = e[1].type == CI_GE_CHAR_RNG_UPPER ? e[1].value : a;
    if (a <= hi && lo <= b) return 1;
    e += e[1].type == CI_GE_CHAR_RNG_UPPER ? 2 : 1;
  } while (e->type == CI_GE_CHAR_ALT);
  return 0;
}

int ci_grammar_after_terminal(const ci_grammar *g, int pos) {
  const ci_grammar_element *e = g->elements;
  if (e[pos].type == CI_GE_CHAR_ANY) return pos + 1;
  pos++;
  while (e[pos].type == CI_GE_CHAR_RNG_UPPER || e[pos].type == CI_GE_CHAR_ALT) pos++;
  return pos;
}
