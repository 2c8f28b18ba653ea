/* Jinja parser: tokens → syntax tree, following Jinja2's grammar and operator precedence
 * (condexpr < or < and < not < compare < + - < ~ < * / // % < ** < unary < filters/tests <
 * postfix), with nesting bounded so malicious templates cannot exhaust the stack. */
#include "text/jinja.h"

#include "base/error.h"
#include "text/jinja_ast.h"
#include "text/jinja_lexer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_NESTING = 120 };

typedef struct {
  jtok *toks;
  size_t n, pos;
  ci_jinja_template *t;
  int depth;
  int loop_depth; /* enclosing for loops (break/continue are only valid inside one) */
} parser;

/* A growable array of nodes while parsing a list. */
typedef struct {
  jnode **items;
  size_t n, cap;
} nvec;

static int nvec_push(nvec *v, jnode *node) {
  if (v->n == v->cap) {
    size_t cap = v->cap ? v->cap * 2 : 4;
    jnode **items = realloc(v->items, cap * sizeof *items);
    if (!items) return ci_fail("out of memory parsing the template");
    v->items = items;
    v->cap = cap;
  }
  v->items[v->n++] = node;
  return CI_OK;
}

static jtok *peek(parser *p) {
  return &p->toks[p->pos];
}

static jtok *peek_at(parser *p, size_t ahead) {
  size_t i = p->pos + ahead;
  return &p->toks[i < p->n ? i : p->n - 1];
}

static int is_op(const jtok *t, const char *op) {
  return t->kind == JT_OP && !strcmp(t->text, op);
}

static int is_name(const jtok *t, const char *name) {
  return t->kind == JT_NAME && !strcmp(t->text, name);
}

static const char *describe(const jtok *t) {
  switch (t->kind) {
  case JT_TEXT:
    return "template text";
  case JT_VAR_BEGIN:
    return "'{{'";
  case JT_VAR_END:
    return "'}}'";
  case JT_BLOCK_BEGIN:
    return "'{%'";
  case JT_BLOCK_END:
    return "'%}'";
  case JT_NAME:
  case JT_OP:
    return t->text;
  case JT_STRING:
    return "a string";
  case JT_INT:
  case JT_FLOAT:
    return "a number";
  case JT_EOF:
    return "the end of the template";
  }
  return "?";
}

static int fail_at(const jtok *t, const char *fmt, const char *arg) {
  char msg[256];
  snprintf(msg, sizeof msg, fmt, arg);
  return ci_fail("line %d, column %d: %s", t->line, t->col, msg);
}

static jnode *new_node(parser *p, jnode_kind kind, const jtok *at) {
  ci_jinja_template *t = p->t;
  if (t->n_nodes == t->cap_nodes) {
    size_t cap = t->cap_nodes ? t->cap_nodes * 2 : 64;
    jnode **nodes = realloc(t->nodes, cap * sizeof *nodes);
    if (!nodes) {
      ci_fail("out of memory parsing the template");
      return NULL;
    }
    t->nodes = nodes;
    t->cap_nodes = cap;
  }
  jnode *node = calloc(1, sizeof *node);
  if (!node) {
    ci_fail("out of memory parsing the template");
    return NULL;
  }
  node->kind = kind;
  node->line = at->line;
  node->col = at->col;
  node->lit = jv_undef();
  t->nodes[t->n_nodes++] = node;
  return node;
}

static char *dup_text(const char *s) {
  char *d = strdup(s);
  if (!d) ci_fail("out of memory parsing the template");
  return d;
}

static int expect_op(parser *p, const char *op) {
  jtok *t = peek(p);
  if (!is_op(t, op))
    return ci_fail("line %d, column %d: expected '%s', got '%s'", t->line, t->col, op, describe(t));
  p->pos++;
  return CI_OK;
}

static int expect_kind(parser *p, jtok_kind kind, const char *what) {
  jtok *t = peek(p);
  if (t->kind != kind)
    return ci_fail("line %d, column %d: expected %s, got '%s'", t->line, t->col, what, describe(t));
  p->pos++;
  return CI_OK;
}

static jnode *parse_expression(parser *p, int with_condexpr);
static jnode *parse_tuple(parser *p, int with_condexpr, int explicit_only);
static jnode *parse_unary(parser *p, int with_filter);
static jnode *parse_primary(parser *p);
static jnode *parse_filter_expr(parser *p, jnode *node);

static int enter(parser *p) {
  if (++p->depth > MAX_NESTING) {
    fail_at(peek(p), "template nested too deeply (more than %s levels)", "120");
    return CI_ERR;
  }
  return CI_OK;
}

/* ==== Expressions ==== */

/* ( args ) after the '(' is consumed: positional expressions, name=value keywords, *iterable and
 * **mapping, in Jinja2's order (positional arguments before keywords and before * or **, one *
 * before one **, keywords before **). */
static int parse_call_args(parser *p, jnode *call) {
  nvec args = {0};
  int seen_kw = 0, seen_star = 0, seen_dstar = 0;
  while (!is_op(peek(p), ")")) {
    if (args.n && expect_op(p, ",")) goto fail;
    if (is_op(peek(p), ")")) break;
    jtok *at = peek(p);
    jnode *arg;
    int ok;
    if (is_op(at, "*") || is_op(at, "**")) {
      const int dstar = is_op(at, "**");
      ok = dstar ? !seen_dstar : !seen_star && !seen_dstar;
      seen_star |= !dstar;
      seen_dstar |= dstar;
      arg = ok ? new_node(p, dstar ? JN_DSTARARG : JN_STARARG, at) : NULL;
      p->pos++;
      if (arg && !(arg->a = parse_expression(p, 1))) goto fail;
    } else if (at->kind == JT_NAME && is_op(peek_at(p, 1), "=")) {
      ok = !seen_dstar;
      seen_kw = 1;
      arg = ok ? new_node(p, JN_KWARG, at) : NULL;
      if (arg && !(arg->name = dup_text(at->text))) goto fail;
      p->pos += 2;
      if (arg && !(arg->a = parse_expression(p, 1))) goto fail;
    } else {
      ok = !seen_kw && !seen_star && !seen_dstar;
      arg = ok ? parse_expression(p, 1) : NULL;
    }
    if (!ok) {
      fail_at(at, "invalid syntax for function call expression (%s)",
              "positional arguments come first, then keywords and *args, then **kwargs");
      goto fail;
    }
    if (!arg || nvec_push(&args, arg)) goto fail;
  }
  p->pos++; /* ')' */
  call->kids = args.items;
  call->n_kids = args.n;
  return CI_OK;
fail:
  free(args.items);
  return CI_ERR;
}

static jnode *parse_subscript(parser *p, jnode *obj, const jtok *at) {
  jnode *parts[3] = {NULL, NULL, NULL};
  int is_slice = 0;
  for (int k = 0; k < 3; k++) {
    if (!is_op(peek(p), ":") && !is_op(peek(p), "]")) {
      if (!(parts[k] = parse_expression(p, 1))) return NULL;
    }
    if (k < 2 && is_op(peek(p), ":")) {
      p->pos++;
      is_slice = 1;
      continue;
    }
    break;
  }
  if (expect_op(p, "]")) return NULL;
  jnode *node = new_node(p, is_slice ? JN_SLICE : JN_GETITEM, at);
  if (!node) return NULL;
  node->a = obj;
  if (!is_slice) {
    if (!parts[0]) {
      fail_at(at, "expected an index inside %s", "[]");
      return NULL;
    }
    node->b = parts[0];
    return node;
  }
  node->kids = calloc(3, sizeof *node->kids);
  if (!node->kids) {
    ci_fail("out of memory parsing the template");
    return NULL;
  }
  node->n_kids = 3;
  memcpy(node->kids, parts, sizeof parts);
  return node;
}

static jnode *parse_postfix(parser *p, jnode *node) {
  for (;;) {
    jtok *t = peek(p);
    if (is_op(t, ".")) {
      p->pos++;
      jtok *attr = peek(p);
      jnode *get;
      if (attr->kind == JT_NAME) {
        if (!(get = new_node(p, JN_GETATTR, t)) || !(get->name = dup_text(attr->text))) return NULL;
      } else if (attr->kind == JT_INT) {
        jnode *index = new_node(p, JN_LITERAL, attr);
        if (!index || !(get = new_node(p, JN_GETITEM, t))) return NULL;
        index->lit = jv_int(attr->i);
        get->b = index;
      } else {
        fail_at(attr, "expected an attribute name after '.', got '%s'", describe(attr));
        return NULL;
      }
      p->pos++;
      get->a = node;
      node = get;
    } else if (is_op(t, "[")) {
      p->pos++;
      if (!(node = parse_subscript(p, node, t))) return NULL;
    } else if (is_op(t, "(")) {
      p->pos++;
      jnode *call = new_node(p, JN_CALL, t);
      if (!call) return NULL;
      call->a = node;
      if (parse_call_args(p, call)) return NULL;
      node = call;
    } else {
      return node;
    }
  }
}

/* A filter whose name is the current token (the '|' before it, if any, already consumed). */
static jnode *parse_filter_named(parser *p, jnode *operand, const jtok *at) {
  jtok *name = peek(p);
  if (name->kind != JT_NAME) {
    fail_at(name, "expected a filter name, got '%s'", describe(name));
    return NULL;
  }
  jnode *f = new_node(p, JN_FILTER, at);
  if (!f || !(f->name = dup_text(name->text))) return NULL;
  p->pos++;
  while (is_op(peek(p), ".") && peek_at(p, 1)->kind == JT_NAME) {
    /* dotted filter names (extensions) are kept whole */
    size_t n = strlen(f->name) + 1 + peek_at(p, 1)->len + 1;
    char *joined = malloc(n);
    if (!joined) return NULL;
    snprintf(joined, n, "%s.%s", f->name, peek_at(p, 1)->text);
    free(f->name);
    f->name = joined;
    p->pos += 2;
  }
  f->a = operand;
  if (is_op(peek(p), "(")) {
    p->pos++;
    if (parse_call_args(p, f)) return NULL;
  }
  return f;
}

static jnode *parse_filter(parser *p, jnode *operand) {
  jtok *at = peek(p);
  p->pos++; /* '|' */
  return parse_filter_named(p, operand, at);
}

static jnode *parse_test(parser *p, jnode *operand) {
  jtok *at = peek(p);
  p->pos++; /* 'is' */
  jnode *test = new_node(p, JN_TEST, at);
  if (!test) return NULL;
  if (is_name(peek(p), "not")) {
    test->op = 1;
    p->pos++;
  }
  jtok *name = peek(p);
  if (name->kind != JT_NAME) {
    fail_at(name, "expected a test name after 'is', got '%s'", describe(name));
    return NULL;
  }
  if (!(test->name = dup_text(name->text))) return NULL;
  p->pos++;
  test->a = operand;
  jtok *next = peek(p);
  if (is_op(next, "(")) {
    p->pos++;
    if (parse_call_args(p, test)) return NULL;
  } else if ((next->kind == JT_NAME || next->kind == JT_STRING || next->kind == JT_INT ||
              next->kind == JT_FLOAT || is_op(next, "[") || is_op(next, "{")) &&
             !is_name(next, "else") && !is_name(next, "or") && !is_name(next, "and") &&
             !is_name(next, "if") && !is_name(next, "is") && !is_name(next, "in") &&
             !is_name(next, "not") && !is_name(next, "recursive")) {
    jnode *arg = parse_primary(p);
    if (!arg || !(arg = parse_postfix(p, arg))) return NULL;
    test->kids = malloc(sizeof *test->kids);
    if (!test->kids) return NULL;
    test->kids[0] = arg;
    test->n_kids = 1;
  }
  return test;
}

static jnode *parse_filter_expr(parser *p, jnode *node) {
  for (;;) {
    jtok *t = peek(p);
    if (is_op(t, "|"))
      node = parse_filter(p, node);
    else if (is_name(t, "is"))
      node = parse_test(p, node);
    else if (is_op(t, "(")) {
      p->pos++;
      jnode *call = new_node(p, JN_CALL, t);
      if (!call) return NULL;
      call->a = node;
      if (parse_call_args(p, call)) return NULL;
      node = call;
    } else
      return node;
    if (!node) return NULL;
  }
}

static jnode *literal(parser *p, const jtok *at, jv value) {
  jnode *node = new_node(p, JN_LITERAL, at);
  if (!node) {
    jv_drop(value);
    return NULL;
  }
  node->lit = value;
  return node;
}

/* [ a, b ] or { k: v } or ( a, b ) after the opener is consumed. */
static jnode *parse_collection(parser *p, const jtok *at, jnode_kind kind, const char *close) {
  jnode *node = new_node(p, kind, at);
  if (!node) return NULL;
  nvec items = {0};
  while (!is_op(peek(p), close)) {
    if (items.n && expect_op(p, ",")) goto fail;
    if (is_op(peek(p), close)) break;
    jnode *item = parse_expression(p, 1);
    if (!item || nvec_push(&items, item)) goto fail;
    if (kind == JN_DICT) {
      if (expect_op(p, ":")) goto fail;
      jnode *val = parse_expression(p, 1);
      if (!val || nvec_push(&items, val)) goto fail;
    }
  }
  p->pos++;
  node->kids = items.items;
  node->n_kids = items.n;
  return node;
fail:
  free(items.items);
  return NULL;
}

static jnode *parse_primary(parser *p) {
  if (enter(p)) return NULL;
  jtok *t = peek(p);
  jnode *node = NULL;
  switch (t->kind) {
  case JT_NAME:
    p->pos++;
    if (!strcmp(t->text, "true") || !strcmp(t->text, "True"))
      node = literal(p, t, jv_bool(1));
    else if (!strcmp(t->text, "false") || !strcmp(t->text, "False"))
      node = literal(p, t, jv_bool(0));
    else if (!strcmp(t->text, "none") || !strcmp(t->text, "None"))
      node = literal(p, t, jv_none());
    else if ((node = new_node(p, JN_NAME, t)) && !(node->name = dup_text(t->text)))
      node = NULL;
    break;
  case JT_STRING: {
    /* adjacent string literals concatenate */
    jbuf b = {0};
    while (peek(p)->kind == JT_STRING) {
      jbuf_put(&b, peek(p)->text, peek(p)->len);
      p->pos++;
    }
    jv s = jbuf_take(&b);
    if (jv_is_err(s))
      ci_fail("string literal too long");
    else
      node = literal(p, t, s);
    break;
  }
  case JT_INT:
    p->pos++;
    node = literal(p, t, jv_int(t->i));
    break;
  case JT_FLOAT:
    p->pos++;
    node = literal(p, t, jv_float(t->f));
    break;
  case JT_OP:
    p->pos++;
    if (!strcmp(t->text, "(")) {
      if (is_op(peek(p), ")")) {
        p->pos++;
        node = new_node(p, JN_TUPLE, t);
        break;
      }
      node = parse_tuple(p, 1, 1);
      if (node && expect_op(p, ")")) node = NULL;
    } else if (!strcmp(t->text, "[")) {
      node = parse_collection(p, t, JN_LIST, "]");
    } else if (!strcmp(t->text, "{")) {
      node = parse_collection(p, t, JN_DICT, "}");
    } else {
      fail_at(t, "unexpected '%s'", t->text);
    }
    break;
  default:
    fail_at(t, "expected an expression, got %s", describe(t));
  }
  p->depth--;
  return node;
}

static jnode *binary(parser *p, const jtok *at, int op, jnode *a, jnode *b) {
  if (!a || !b) return NULL;
  jnode *node = new_node(p, JN_BINARY, at);
  if (!node) return NULL;
  node->op = op;
  node->a = a;
  node->b = b;
  return node;
}

static jnode *parse_unary(parser *p, int with_filter) {
  if (enter(p)) return NULL;
  jtok *t = peek(p);
  jnode *node;
  if (is_op(t, "-") || is_op(t, "+")) {
    p->pos++;
    node = new_node(p, JN_UNARY, t);
    if (node) {
      node->op = t->text[0] == '-' ? JOP_NEG : JOP_POS;
      if (!(node->a = parse_unary(p, 0))) node = NULL;
    }
  } else {
    node = parse_primary(p);
  }
  if (node) node = parse_postfix(p, node);
  if (node && with_filter) node = parse_filter_expr(p, node);
  p->depth--;
  return node;
}

static jnode *parse_pow(parser *p) {
  jnode *left = parse_unary(p, 1);
  while (left && is_op(peek(p), "**")) {
    jtok *t = peek(p);
    p->pos++;
    left = binary(p, t, JOP_POW, left, parse_unary(p, 1));
  }
  return left;
}

static jnode *parse_math2(parser *p) {
  jnode *left = parse_pow(p);
  for (;;) {
    jtok *t = peek(p);
    int op = is_op(t, "*")    ? JOP_MUL
             : is_op(t, "/")  ? JOP_DIV
             : is_op(t, "//") ? JOP_FLOORDIV
             : is_op(t, "%")  ? JOP_MOD
                              : -1;
    if (!left || op < 0) return left;
    p->pos++;
    left = binary(p, t, op, left, parse_pow(p));
  }
}

static jnode *parse_concat(parser *p) {
  jnode *left = parse_math2(p);
  while (left && is_op(peek(p), "~")) {
    jtok *t = peek(p);
    p->pos++;
    left = binary(p, t, JOP_CONCAT, left, parse_math2(p));
  }
  return left;
}

static jnode *parse_math1(parser *p) {
  jnode *left = parse_concat(p);
  for (;;) {
    jtok *t = peek(p);
    int op = is_op(t, "+") ? JOP_ADD : is_op(t, "-") ? JOP_SUB : -1;
    if (!left || op < 0) return left;
    p->pos++;
    left = binary(p, t, op, left, parse_concat(p));
  }
}

static jnode *parse_compare(parser *p) {
  jtok *at = peek(p);
  jnode *first = parse_math1(p);
  if (!first) return NULL;
  nvec operands = {0};
  int *ops = NULL;
  for (;;) {
    jtok *t = peek(p);
    int op = is_op(t, "==")                                        ? JOP_EQ
             : is_op(t, "!=")                                      ? JOP_NE
             : is_op(t, "<")                                       ? JOP_LT
             : is_op(t, "<=")                                      ? JOP_LE
             : is_op(t, ">")                                       ? JOP_GT
             : is_op(t, ">=")                                      ? JOP_GE
             : is_name(t, "in")                                    ? JOP_IN
             : (is_name(t, "not") && is_name(peek_at(p, 1), "in")) ? JOP_NOTIN
                                                                   : -1;
    if (op < 0) break;
    p->pos += op == JOP_NOTIN ? 2 : 1;
    jnode *operand = parse_math1(p);
    int *grown = operand ? realloc(ops, (operands.n + 1) * sizeof *ops) : NULL;
    if (!grown) goto fail;
    ops = grown;
    ops[operands.n] = op;
    if (nvec_push(&operands, operand)) goto fail;
  }
  if (!operands.n) return first;
  jnode *node = new_node(p, JN_COMPARE, at);
  if (!node) goto fail;
  node->a = first;
  node->kids = operands.items;
  node->n_kids = operands.n;
  node->ops = ops;
  return node;
fail:
  free(operands.items);
  free(ops);
  return NULL;
}

static jnode *parse_not(parser *p) {
  jtok *t = peek(p);
  if (is_name(t, "not")) {
    if (enter(p)) return NULL;
    p->pos++;
    jnode *node = new_node(p, JN_UNARY, t);
    if (node) {
      node->op = JOP_NOT;
      if (!(node->a = parse_not(p))) node = NULL;
    }
    p->depth--;
    return node;
  }
  return parse_compare(p);
}

static jnode *parse_and(parser *p) {
  jnode *left = parse_not(p);
  while (left && is_name(peek(p), "and")) {
    jtok *t = peek(p);
    p->pos++;
    left = binary(p, t, JOP_AND, left, parse_not(p));
  }
  return left;
}

static jnode *parse_or(parser *p) {
  jnode *left = parse_and(p);
  while (left && is_name(peek(p), "or")) {
    jtok *t = peek(p);
    p->pos++;
    left = binary(p, t, JOP_OR, left, parse_and(p));
  }
  return left;
}

static jnode *parse_expression(parser *p, int with_condexpr) {
  if (enter(p)) return NULL;
  jnode *expr = parse_or(p);
  while (expr && with_condexpr && is_name(peek(p), "if")) {
    jtok *t = peek(p);
    p->pos++;
    jnode *cond = new_node(p, JN_COND, t);
    if (!cond) return NULL;
    cond->b = expr;
    if (!(cond->a = parse_or(p))) return NULL;
    if (is_name(peek(p), "else")) {
      p->pos++;
      if (!(cond->c = parse_expression(p, 1))) return NULL;
    }
    expr = cond;
  }
  p->depth--;
  return expr;
}

/* An expression or a bare comma-separated tuple of them. explicit_only: inside parentheses. */
static jnode *parse_tuple(parser *p, int with_condexpr, int explicit_only) {
  jtok *at = peek(p);
  nvec items = {0};
  int saw_comma = 0;
  for (;;) {
    if (items.n) {
      if (!is_op(peek(p), ",")) break;
      p->pos++;
      saw_comma = 1;
      jtok *t = peek(p);
      if (t->kind == JT_VAR_END || t->kind == JT_BLOCK_END || is_op(t, ")") || is_name(t, "if") ||
          is_name(t, "recursive"))
        break;
    }
    jnode *item = parse_expression(p, with_condexpr);
    if (!item || nvec_push(&items, item)) goto fail;
  }
  (void)explicit_only;
  if (!saw_comma) {
    jnode *only = items.items[0];
    free(items.items);
    return only;
  }
  jnode *node = new_node(p, JN_TUPLE, at);
  if (!node) goto fail;
  node->kids = items.items;
  node->n_kids = items.n;
  return node;
fail:
  free(items.items);
  return NULL;
}

/* ==== Statements ==== */

static int parse_body(parser *p, const char *const *ends, jnode ***body, size_t *n_body,
                      const char *block);

static int expect_block_end(parser *p) {
  return expect_kind(p, JT_BLOCK_END, "'%}'");
}

/* Consumes an end tag's name (the current token) and its '%}'. */
static int end_tag(parser *p) {
  p->pos++;
  return expect_block_end(p);
}

/* Assignment target: name, name.attr (namespace), or a tuple of names. */
static jnode *parse_assign_target(parser *p, int allow_tuple, int allow_nsref) {
  jtok *t = peek(p);
  if (t->kind != JT_NAME) {
    fail_at(t, "expected a variable name to assign to, got '%s'", describe(t));
    return NULL;
  }
  if (allow_nsref && is_op(peek_at(p, 1), ".") && peek_at(p, 2)->kind == JT_NAME) {
    jnode *ref = new_node(p, JN_NSREF, t);
    if (!ref || !(ref->name = dup_text(t->text)) || !(ref->name2 = dup_text(peek_at(p, 2)->text)))
      return NULL;
    p->pos += 3;
    return ref;
  }
  nvec names = {0};
  for (;;) {
    jtok *n = peek(p);
    if (n->kind != JT_NAME) {
      fail_at(n, "expected a variable name to assign to, got '%s'", describe(n));
      goto fail;
    }
    jnode *name = new_node(p, JN_NAME, n);
    if (!name || !(name->name = dup_text(n->text)) || nvec_push(&names, name)) goto fail;
    p->pos++;
    if (!allow_tuple || !is_op(peek(p), ",")) break;
    p->pos++;
  }
  if (names.n == 1) {
    jnode *only = names.items[0];
    free(names.items);
    return only;
  }
  jnode *tuple = new_node(p, JN_TUPLE, t);
  if (!tuple) goto fail;
  tuple->kids = names.items;
  tuple->n_kids = names.n;
  return tuple;
fail:
  free(names.items);
  return NULL;
}

static jnode *parse_for(parser *p, const jtok *at) {
  jnode *node = new_node(p, JN_FOR, at);
  if (!node || !(node->a = parse_assign_target(p, 1, 0))) return NULL;
  if (!is_name(peek(p), "in")) {
    fail_at(peek(p), "expected 'in' in for loop, got '%s'", describe(peek(p)));
    return NULL;
  }
  p->pos++;
  if (!(node->b = parse_tuple(p, 0, 0))) return NULL;
  if (is_name(peek(p), "if")) {
    p->pos++;
    if (!(node->c = parse_expression(p, 1))) return NULL;
  }
  if (is_name(peek(p), "recursive")) {
    fail_at(peek(p), "%s loops are not supported", "recursive");
    return NULL;
  }
  if (expect_block_end(p)) return NULL;
  static const char *const ends[] = {"endfor", "else", NULL};
  p->loop_depth++;
  int rc = parse_body(p, ends, &node->body, &node->n_body, "for");
  p->loop_depth--;
  if (rc) return NULL;
  if (is_name(peek(p), "else")) {
    p->pos++;
    if (expect_block_end(p)) return NULL;
    static const char *const end_for[] = {"endfor", NULL};
    if (parse_body(p, end_for, &node->orelse, &node->n_orelse, "for")) return NULL;
  }
  if (end_tag(p)) return NULL;
  return node;
}

static jnode *parse_if(parser *p, const jtok *at) {
  jnode *node = new_node(p, JN_IF, at);
  if (!node || !(node->a = parse_tuple(p, 1, 0)) || expect_block_end(p)) return NULL;
  static const char *const ends[] = {"elif", "else", "endif", NULL};
  if (parse_body(p, ends, &node->body, &node->n_body, "if")) return NULL;
  jtok *t = peek(p);
  if (is_name(t, "elif")) {
    p->pos++;
    jnode *elif = parse_if(p, t); /* consumes through endif */
    if (!elif) return NULL;
    node->orelse = malloc(sizeof *node->orelse);
    if (!node->orelse) return NULL;
    node->orelse[0] = elif;
    node->n_orelse = 1;
    return node;
  }
  if (is_name(t, "else")) {
    p->pos++;
    if (expect_block_end(p)) return NULL;
    static const char *const end_if[] = {"endif", NULL};
    if (parse_body(p, end_if, &node->orelse, &node->n_orelse, "if")) return NULL;
  }
  if (end_tag(p)) return NULL;
  return node;
}

/* | filter(args) | filter ... applied to a captured body (innermost operand NULL). */
static jnode *parse_filter_chain(parser *p, int need_first) {
  jnode *chain = NULL;
  if (need_first && !(chain = parse_filter_named(p, NULL, peek(p)))) return NULL;
  while (is_op(peek(p), "|")) {
    if (!(chain = parse_filter(p, chain))) return NULL;
  }
  return chain;
}

static jnode *parse_set(parser *p, const jtok *at) {
  jnode *target = parse_assign_target(p, 1, 1);
  if (!target) return NULL;
  if (is_op(peek(p), "=")) {
    p->pos++;
    jnode *node = new_node(p, JN_SET, at);
    if (!node) return NULL;
    node->a = target;
    if (!(node->b = parse_tuple(p, 1, 0)) || expect_block_end(p)) return NULL;
    return node;
  }
  jnode *node = new_node(p, JN_SETBLOCK, at);
  if (!node) return NULL;
  node->a = target;
  if (target->kind == JN_TUPLE) {
    fail_at(at, "a block %s can only assign one variable", "set");
    return NULL;
  }
  if (is_op(peek(p), "|") && !(node->c = parse_filter_chain(p, 0))) return NULL;
  if (expect_block_end(p)) return NULL;
  static const char *const ends[] = {"endset", NULL};
  if (parse_body(p, ends, &node->body, &node->n_body, "set")) return NULL;
  if (end_tag(p)) return NULL;
  return node;
}

/* (a, b=default, ...) parameter list of a macro or call block; '(' already consumed. */
static int parse_params(parser *p, jnode *owner) {
  nvec params = {0};
  while (!is_op(peek(p), ")")) {
    if (params.n && expect_op(p, ",")) goto fail;
    if (is_op(peek(p), ")")) break;
    jtok *n = peek(p);
    if (n->kind != JT_NAME) {
      fail_at(n, "expected a parameter name, got '%s'", describe(n));
      goto fail;
    }
    jnode *param = new_node(p, JN_PARAM, n);
    if (!param || !(param->name = dup_text(n->text))) goto fail;
    p->pos++;
    if (is_op(peek(p), "=")) {
      p->pos++;
      if (!(param->a = parse_expression(p, 1))) goto fail;
    }
    if (nvec_push(&params, param)) goto fail;
  }
  p->pos++;
  owner->kids = params.items;
  owner->n_kids = params.n;
  return CI_OK;
fail:
  free(params.items);
  return CI_ERR;
}

static jnode *parse_macro(parser *p, const jtok *at) {
  jtok *name = peek(p);
  if (name->kind != JT_NAME) {
    fail_at(name, "expected a macro name, got '%s'", describe(name));
    return NULL;
  }
  jnode *node = new_node(p, JN_MACRO, at);
  if (!node || !(node->name = dup_text(name->text))) return NULL;
  p->pos++;
  if (expect_op(p, "(") || parse_params(p, node) || expect_block_end(p)) return NULL;
  static const char *const ends[] = {"endmacro", NULL};
  int saved_loops = p->loop_depth;
  p->loop_depth = 0;
  int rc = parse_body(p, ends, &node->body, &node->n_body, "macro");
  p->loop_depth = saved_loops;
  if (rc) return NULL;
  if (end_tag(p)) return NULL;
  return node;
}

static jnode *parse_call_block(parser *p, const jtok *at) {
  jnode *node = new_node(p, JN_CALLBLOCK, at);
  if (!node) return NULL;
  if (is_op(peek(p), "(")) {
    p->pos++;
    if (parse_params(p, node)) return NULL;
  }
  if (!(node->a = parse_expression(p, 1))) return NULL;
  if (node->a->kind != JN_CALL) {
    fail_at(at, "expected a macro call after '%s'", "call");
    return NULL;
  }
  if (expect_block_end(p)) return NULL;
  static const char *const ends[] = {"endcall", NULL};
  int saved_loops = p->loop_depth;
  p->loop_depth = 0;
  int rc = parse_body(p, ends, &node->body, &node->n_body, "call");
  p->loop_depth = saved_loops;
  if (rc) return NULL;
  if (end_tag(p)) return NULL;
  return node;
}

static jnode *parse_filter_block(parser *p, const jtok *at) {
  jnode *node = new_node(p, JN_FILTERBLOCK, at);
  if (!node || !(node->c = parse_filter_chain(p, 1)) || expect_block_end(p)) return NULL;
  static const char *const ends[] = {"endfilter", NULL};
  if (parse_body(p, ends, &node->body, &node->n_body, "filter")) return NULL;
  if (end_tag(p)) return NULL;
  return node;
}

/* {% generation %} ... {% endgeneration %} renders its body (transformers' AssistantTracker). */
static jnode *parse_generation(parser *p, const jtok *at) {
  jnode *node = new_node(p, JN_IF, at);
  if (!node || !(node->a = literal(p, at, jv_bool(1))) || expect_block_end(p)) return NULL;
  static const char *const ends[] = {"endgeneration", NULL};
  if (parse_body(p, ends, &node->body, &node->n_body, "generation")) return NULL;
  if (end_tag(p)) return NULL;
  return node;
}

static jnode *parse_statement(parser *p) {
  jtok *t = peek(p);
  if (t->kind != JT_NAME) {
    fail_at(t, "expected a tag name after '{%%', got '%s'", describe(t));
    return NULL;
  }
  if (enter(p)) return NULL;
  p->pos++;
  jnode *node = NULL;
  const char *n = t->text;
  if (!strcmp(n, "for"))
    node = parse_for(p, t);
  else if (!strcmp(n, "if"))
    node = parse_if(p, t);
  else if (!strcmp(n, "set"))
    node = parse_set(p, t);
  else if (!strcmp(n, "macro"))
    node = parse_macro(p, t);
  else if (!strcmp(n, "call"))
    node = parse_call_block(p, t);
  else if (!strcmp(n, "filter"))
    node = parse_filter_block(p, t);
  else if (!strcmp(n, "generation"))
    node = parse_generation(p, t);
  else if (!strcmp(n, "break") || !strcmp(n, "continue")) {
    if (!p->loop_depth)
      fail_at(t, "'%s' outside of a loop", n);
    else if ((node = new_node(p, n[0] == 'b' ? JN_BREAK : JN_CONTINUE, t)) && expect_block_end(p))
      node = NULL;
  } else {
    fail_at(t, "unknown tag '%s'", n);
  }
  p->depth--;
  return node;
}

/* Parses statements until a {% tag %} whose name is in `ends` (left as the current token) or
 * the end of the template (an error when `ends` is non-empty). */
static int parse_body(parser *p, const char *const *ends, jnode ***body, size_t *n_body,
                      const char *block) {
  nvec stmts = {0};
  for (;;) {
    jtok *t = peek(p);
    jnode *node = NULL;
    if (t->kind == JT_EOF) {
      if (ends && ends[0]) {
        fail_at(t, "unexpected end of template: the '%s' block is not closed", block);
        goto fail;
      }
      break;
    }
    if (t->kind == JT_TEXT) {
      p->pos++;
      jv s = jv_str(t->text, t->len);
      if (jv_is_err(s)) {
        ci_fail("template text too long");
        goto fail;
      }
      if (!(node = literal(p, t, s))) goto fail;
      node->kind = JN_TEXT;
    } else if (t->kind == JT_VAR_BEGIN) {
      p->pos++;
      if (!(node = new_node(p, JN_OUTPUT, t)) || !(node->a = parse_tuple(p, 1, 0)) ||
          expect_kind(p, JT_VAR_END, "'}}'"))
        goto fail;
    } else if (t->kind == JT_BLOCK_BEGIN) {
      p->pos++;
      jtok *name = peek(p);
      int is_end = 0;
      for (size_t i = 0; ends && ends[i]; i++)
        if (is_name(name, ends[i])) is_end = 1;
      if (is_end) break;
      if (name->kind == JT_NAME && (!strncmp(name->text, "end", 3) || !strcmp(name->text, "else") ||
                                    !strcmp(name->text, "elif"))) {
        if (ends && ends[0])
          fail_at(name, "unexpected '%s' inside a block that needs its end tag first", name->text);
        else
          fail_at(name, "unexpected '%s': there is no open block it could close", name->text);
        goto fail;
      }
      if (!(node = parse_statement(p))) goto fail;
    } else {
      fail_at(t, "unexpected %s", describe(t));
      goto fail;
    }
    if (nvec_push(&stmts, node)) goto fail;
  }
  *body = stmts.items;
  *n_body = stmts.n;
  return CI_OK;
fail:
  free(stmts.items);
  return CI_ERR;
}

void ci_jinja_free(ci_jinja_template *t) {
  if (!t) return;
  for (size_t i = 0; i < t->n_nodes; i++) {
    jnode *n = t->nodes[i];
    jv_free_frozen(n->lit);
    free(n->kids);
    free(n->ops);
    free(n->body);
    free(n->orelse);
    free(n->name);
    free(n->name2);
    free(n);
  }
  free(t->nodes);
  free(t->body);
  free(t);
}

ci_jinja_template *ci_jinja_parse(const char *source, size_t len) {
  ci_jinja_template *t = calloc(1, sizeof *t);
  if (!t) {
    ci_fail("out of memory parsing the template");
    return NULL;
  }
  jtok_list toks;
  if (ci_jinja_tokenize(source, len, &toks)) {
    ci_jinja_tokens_free(&toks);
    ci_jinja_free(t);
    return NULL;
  }
  parser p = {.toks = toks.toks, .n = toks.n, .t = t};
  int rc = parse_body(&p, NULL, &t->body, &t->n_body, NULL);
  ci_jinja_tokens_free(&toks);
  if (rc) {
    ci_jinja_free(t);
    return NULL;
  }
  /* The literals belong to the template, which renders may share across threads: frozen, so
   * that renders never touch their reference counts. */
  for (size_t i = 0; i < t->n_nodes; i++) jv_freeze(&t->nodes[i]->lit);
  return t;
}
