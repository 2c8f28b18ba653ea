/* Jinja evaluator: walks the syntax tree with Jinja2's semantics — scopes (a for-loop iteration
 * and a macro call get their own; if does not), Python operators, attribute/item fallbacks,
 * undefined values, loop variables, macros with caller(), and the render limits. */
#include "text/jinja.h"

#include "base/error.h"
#include "text/jinja_eval.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Flow results of executing statements, beyond CI_OK / CI_ERR. */
enum { FLOW_BREAK = 1, FLOW_CONTINUE = 2 };

/* ==== Scopes ==== */

struct jscope {
  jscope *parent;
  const char **names; /* borrowed: template or request strings that outlive the render */
  jv *vals;
  size_t n, cap;
  int captured; /* a macro or caller refers to it: freed only when the render ends */
  jscope *next_kept;
};

static jscope *scope_new(jscope *parent) {
  jscope *s = calloc(1, sizeof *s);
  if (!s)
    ci_fail("out of memory rendering the template");
  else
    s->parent = parent;
  return s;
}

static void scope_destroy(jscope *s) {
  for (size_t i = 0; i < s->n; i++) jv_drop(s->vals[i]);
  free(s->names);
  free(s->vals);
  free(s);
}

static void scope_release(ci_jctx *c, jscope *s) {
  if (!s) return;
  if (s->captured) {
    s->next_kept = c->kept;
    c->kept = s;
  } else {
    scope_destroy(s);
  }
}

static void scope_capture(jscope *s) {
  for (; s && !s->captured; s = s->parent) s->captured = 1;
}

static jv *scope_find_local(jscope *s, const char *name) {
  for (size_t i = 0; i < s->n; i++)
    if (!strcmp(s->names[i], name)) return &s->vals[i];
  return NULL;
}

static jv *scope_lookup(jscope *s, const char *name) {
  for (; s; s = s->parent) {
    jv *v = scope_find_local(s, name);
    if (v) return v;
  }
  return NULL;
}

/* Sets name in s (takes the reference). */
static int scope_set(jscope *s, const char *name, jv v) {
  jv *slot = scope_find_local(s, name);
  if (slot) {
    jv_drop(*slot);
    *slot = v;
    return CI_OK;
  }
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 8;
    const char **names = realloc(s->names, cap * sizeof *names);
    if (names) s->names = names;
    jv *vals = names ? realloc(s->vals, cap * sizeof *vals) : NULL;
    if (!vals) {
      jv_drop(v);
      return ci_fail("out of memory rendering the template");
    }
    s->vals = vals;
    s->cap = cap;
  }
  s->names[s->n] = name;
  s->vals[s->n] = v;
  s->n++;
  return CI_OK;
}

/* ==== Helpers shared with the builtins ==== */

int jinja_check_str(jv v) {
  if (jv_is_err(v))
    return ci_fail("string too long (over %d MiB) or out of memory", JV_MAX_STR >> 20);
  return CI_OK;
}

int jinja_undefined_error(jv undef) {
  return ci_fail("%s", undef.u.s ? undef.u.s->data : "value is undefined");
}

static void jfunc_fini(void *p) {
  jv_drop(((jfunc *)p)->self);
}

int jinja_make_func(ci_jctx *c, const char *name, jbuiltin_fn fn, jv self, jv *out) {
  jfunc *f = ci_jheap_alloc(&c->heap, sizeof *f, jfunc_fini);
  if (!f) return ci_fail("template exceeded its memory limit");
  f->name = name;
  f->fn = fn;
  f->self = jv_dup(self);
  out->kind = JV_FUNC;
  out->u.fn = f;
  return CI_OK;
}

int jargs_bind(const jargs *args, const char *const *names, size_t n_names, jv *slots,
               const char *what) {
  for (size_t i = 0; i < n_names; i++) slots[i] = jv_undef();
  if (args->n_pos > n_names)
    return ci_fail("%s takes at most %zu argument%s (%zu given)", what, n_names,
                   n_names == 1 ? "" : "s", args->n_pos);
  for (size_t i = 0; i < args->n_pos; i++) slots[i] = args->pos[i];
  for (size_t k = 0; k < args->n_kw; k++) {
    size_t i = 0;
    while (i < n_names && strcmp(names[i], args->kw_names[k])) i++;
    if (i == n_names)
      return ci_fail("%s got an unexpected keyword argument '%s'", what, args->kw_names[k]);
    slots[i] = args->kw[k];
  }
  return CI_OK;
}

static int64_t norm_index(int64_t i, size_t n) {
  return i < 0 ? i + (int64_t)n : i;
}

int jinja_getitem(ci_jctx *c, jv obj, jv key, jv *out) {
  if (obj.kind == JV_UNDEF) return jinja_undefined_error(obj);
  int int_key = key.kind == JV_INT || key.kind == JV_BOOL;
  int64_t k = key.kind == JV_BOOL ? key.u.b : key.u.i;
  if (obj.kind == JV_LIST && int_key) {
    int64_t i = norm_index(k, obj.u.l->n);
    if (i >= 0 && (size_t)i < obj.u.l->n) {
      *out = jv_dup(obj.u.l->items[i]);
      return CI_OK;
    }
    *out = jv_undef_hint("%s object has no element %lld", jv_type_name(obj), (long long)k);
    return CI_OK;
  }
  if (obj.kind == JV_STR && int_key) {
    size_t n = ju8_count(obj.u.s->data, obj.u.s->len);
    int64_t i = norm_index(k, n);
    if (i >= 0 && (size_t)i < n) {
      size_t a = ju8_offset(obj.u.s->data, obj.u.s->len, (size_t)i);
      size_t b = ju8_offset(obj.u.s->data, obj.u.s->len, (size_t)i + 1);
      *out = jv_str(obj.u.s->data + a, b - a);
      return jinja_check_str(*out);
    }
    *out = jv_undef_hint("str object has no element %lld", (long long)k);
    return CI_OK;
  }
  if (obj.kind == JV_DICT && !obj.u.d->is_namespace) {
    jv *v = jdict_get_v(obj.u.d, key);
    if (v) {
      *out = jv_dup(*v);
      return CI_OK;
    }
  }
  if (key.kind == JV_STR) {
    jbuiltin_fn m = jinja_method_find(obj, key.u.s->data);
    if (m) return jinja_make_func(c, key.u.s->data, m, obj, out);
    if (obj.kind == JV_DICT && obj.u.d->is_namespace) {
      jv *v = jdict_get_v(obj.u.d, key);
      if (v) {
        *out = jv_dup(*v);
        return CI_OK;
      }
    }
    *out = jv_undef_hint("'%s object' has no attribute '%s'", jv_type_name(obj), key.u.s->data);
    return CI_OK;
  }
  jbuf b = {0};
  jv_write_repr(&b, key);
  *out = jv_undef_hint("'%s object' has no attribute %s", jv_type_name(obj), b.data ? b.data : "");
  jbuf_free(&b);
  return CI_OK;
}

int jinja_getattr(ci_jctx *c, jv obj, const char *name, jv *out) {
  if (obj.kind == JV_UNDEF) return jinja_undefined_error(obj);
  jbuiltin_fn m = jinja_method_find(obj, name);
  if (m) return jinja_make_func(c, name, m, obj, out);
  if (obj.kind == JV_DICT) {
    jv *v = jdict_get(obj.u.d, name, strlen(name));
    if (v) {
      *out = jv_dup(*v);
      return CI_OK;
    }
  }
  if (obj.kind == JV_NONE)
    *out = jv_undef_hint("'None' has no attribute '%s'", name);
  else
    *out = jv_undef_hint("'%s object' has no attribute '%s'", jv_type_name(obj), name);
  return CI_OK;
}

int jinja_contains(jv container, jv item, int *result) {
  *result = 0;
  switch (container.kind) {
  case JV_STR:
    if (item.kind != JV_STR)
      return ci_fail("'in <string>' requires string as left operand, not %s", jv_type_name(item));
    *result = item.u.s->len == 0 ||
              memmem(container.u.s->data, container.u.s->len, item.u.s->data, item.u.s->len);
    return CI_OK;
  case JV_LIST:
    for (size_t i = 0; i < container.u.l->n && !*result; i++)
      *result = jv_equal(container.u.l->items[i], item);
    return CI_OK;
  case JV_DICT:
    *result = jdict_get_v(container.u.d, item) != NULL;
    return CI_OK;
  case JV_UNDEF:
    return CI_OK;
  default:
    return ci_fail("argument of type '%s' is not iterable", jv_type_name(container));
  }
}

int jinja_iterate(ci_jctx *c, jv v, jlist **out) {
  jlist *l;
  switch (v.kind) {
  case JV_LIST:
    l = jv_new_list(&c->heap, v.u.l->n);
    if (!l) break;
    for (size_t i = 0; i < v.u.l->n; i++) l->items[l->n++] = jv_dup(v.u.l->items[i]);
    *out = l;
    return CI_OK;
  case JV_DICT:
    l = jv_new_list(&c->heap, v.u.d->n);
    if (!l) break;
    for (size_t i = 0; i < v.u.d->n; i++) l->items[l->n++] = jv_dup(v.u.d->keys[i]);
    *out = l;
    return CI_OK;
  case JV_STR: {
    l = jv_new_list(&c->heap, 0);
    if (!l) break;
    const char *s = v.u.s->data;
    size_t len = v.u.s->len;
    for (size_t i = 0; i < len;) {
      int32_t cp;
      size_t n = ju8_decode(s + i, len - i, &cp);
      jv ch = jv_str(s + i, n);
      if (jv_is_err(ch) || jlist_push(&c->heap, l, ch)) return ci_fail("out of memory");
      i += n;
    }
    *out = l;
    return CI_OK;
  }
  case JV_UNDEF:
    if (!(l = jv_new_list(&c->heap, 0))) break;
    *out = l;
    return CI_OK;
  default:
    return ci_fail("'%s' object is not iterable", jv_type_name(v));
  }
  return ci_fail("template exceeded its memory limit");
}

/* ==== Arithmetic ==== */

static int is_num(jv v) {
  return v.kind == JV_INT || v.kind == JV_FLOAT || v.kind == JV_BOOL;
}

static double num_f(jv v) {
  return v.kind == JV_FLOAT ? v.u.f : v.kind == JV_BOOL ? v.u.b : (double)v.u.i;
}

static int64_t num_i(jv v) {
  return v.kind == JV_BOOL ? v.u.b : v.u.i;
}

static const char *const op_symbols[] = {
    "+", "-", "*",  "/",  "//", "%",  "**", "~",  "and", "or",    "not",
    "-", "+", "==", "!=", "<",  "<=", ">",  ">=", "in",  "not in"};

static int type_error(int op, jv a, jv b) {
  if (a.kind == JV_UNDEF) return jinja_undefined_error(a);
  if (b.kind == JV_UNDEF) return jinja_undefined_error(b);
  if (op == JOP_ADD && a.kind == JV_STR)
    return ci_fail("can only concatenate str (not \"%s\") to str", jv_type_name(b));
  return ci_fail("unsupported operand type(s) for %s: '%s' and '%s'", op_symbols[op],
                 jv_type_name(a), jv_type_name(b));
}

static int repeat(ci_jctx *c, jv seq, int64_t times, jv *out) {
  if (times < 0) times = 0;
  if (seq.kind == JV_STR) {
    if (seq.u.s->len && (uint64_t)times > JV_MAX_STR / seq.u.s->len)
      return ci_fail("string too long (over %d MiB)", JV_MAX_STR >> 20);
    jbuf b = {0};
    for (int64_t i = 0; i < times; i++) jbuf_put(&b, seq.u.s->data, seq.u.s->len);
    *out = jbuf_take(&b);
    return jinja_check_str(*out);
  }
  if (seq.u.l->n && (uint64_t)times > (JINJA_HEAP_LIMIT / sizeof(jv)) / seq.u.l->n)
    return ci_fail("template exceeded its memory limit");
  jlist *l = jv_new_list(&c->heap, seq.u.l->n * (size_t)times);
  if (!l) return ci_fail("template exceeded its memory limit");
  l->is_tuple = seq.u.l->is_tuple;
  for (int64_t i = 0; i < times; i++)
    for (size_t k = 0; k < seq.u.l->n; k++) l->items[l->n++] = jv_dup(seq.u.l->items[k]);
  *out = jv_list(l);
  return CI_OK;
}

static int arith(ci_jctx *c, int op, jv a, jv b, jv *out) {
  if (is_num(a) && is_num(b)) {
    int both_int = a.kind != JV_FLOAT && b.kind != JV_FLOAT;
    int64_t x = num_i(a), y = num_i(b), r;
    double fx = num_f(a), fy = num_f(b);
    switch (op) {
    case JOP_ADD:
      if (both_int) {
        if (__builtin_add_overflow(x, y, &r)) return ci_fail("integer overflow");
        *out = jv_int(r);
      } else
        *out = jv_float(fx + fy);
      return CI_OK;
    case JOP_SUB:
      if (both_int) {
        if (__builtin_sub_overflow(x, y, &r)) return ci_fail("integer overflow");
        *out = jv_int(r);
      } else
        *out = jv_float(fx - fy);
      return CI_OK;
    case JOP_MUL:
      if (both_int) {
        if (__builtin_mul_overflow(x, y, &r)) return ci_fail("integer overflow");
        *out = jv_int(r);
      } else
        *out = jv_float(fx * fy);
      return CI_OK;
    case JOP_DIV:
      if (fy == 0) return ci_fail("division by zero");
      *out = jv_float(fx / fy);
      return CI_OK;
    case JOP_FLOORDIV:
    case JOP_MOD:
      if (both_int) {
        if (y == 0) return ci_fail("integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) return ci_fail("integer overflow");
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          q--;
          m += y;
        }
        *out = jv_int(op == JOP_MOD ? m : q);
      } else {
        if (fy == 0) return ci_fail("float division by zero");
        double m = fmod(fx, fy);
        if (m != 0 && ((m < 0) != (fy < 0))) m += fy;
        *out = jv_float(op == JOP_MOD ? m : floor(fx / fy));
      }
      return CI_OK;
    case JOP_POW:
      if (both_int && y >= 0) {
        int64_t acc = 1, base = x;
        for (int64_t e = y; e > 0; e >>= 1) {
          if ((e & 1) && __builtin_mul_overflow(acc, base, &acc))
            return ci_fail("integer overflow");
          if (e > 1 && __builtin_mul_overflow(base, base, &base))
            return ci_fail("integer overflow");
        }
        *out = jv_int(acc);
      } else {
        if (fx == 0 && fy < 0) return ci_fail("0.0 cannot be raised to a negative power");
        *out = jv_float(pow(fx, fy));
      }
      return CI_OK;
    }
  }
  if (op == JOP_ADD && a.kind == JV_STR && b.kind == JV_STR) {
    if (a.u.s->len + b.u.s->len > JV_MAX_STR)
      return ci_fail("string too long (over %d MiB)", JV_MAX_STR >> 20);
    jbuf buf = {0};
    jbuf_put(&buf, a.u.s->data, a.u.s->len);
    jbuf_put(&buf, b.u.s->data, b.u.s->len);
    *out = jbuf_take(&buf);
    return jinja_check_str(*out);
  }
  if (op == JOP_ADD && a.kind == JV_LIST && b.kind == JV_LIST &&
      a.u.l->is_tuple == b.u.l->is_tuple) {
    jlist *l = jv_new_list(&c->heap, a.u.l->n + b.u.l->n);
    if (!l) return ci_fail("template exceeded its memory limit");
    l->is_tuple = a.u.l->is_tuple;
    for (size_t i = 0; i < a.u.l->n; i++) l->items[l->n++] = jv_dup(a.u.l->items[i]);
    for (size_t i = 0; i < b.u.l->n; i++) l->items[l->n++] = jv_dup(b.u.l->items[i]);
    *out = jv_list(l);
    return CI_OK;
  }
  if (op == JOP_MUL) {
    if ((a.kind == JV_STR || a.kind == JV_LIST) && (b.kind == JV_INT || b.kind == JV_BOOL))
      return repeat(c, a, num_i(b), out);
    if ((b.kind == JV_STR || b.kind == JV_LIST) && (a.kind == JV_INT || a.kind == JV_BOOL))
      return repeat(c, b, num_i(a), out);
  }
  if (op == JOP_MOD && a.kind == JV_STR) return jinja_str_format(c, a, b, out);
  return type_error(op, a, b);
}

static int compare_op(int op, jv a, jv b, int *result) {
  int cmp;
  switch (op) {
  case JOP_EQ:
    *result = jv_equal(a, b);
    return CI_OK;
  case JOP_NE:
    *result = !jv_equal(a, b);
    return CI_OK;
  case JOP_IN:
    return jinja_contains(b, a, result);
  case JOP_NOTIN:
    if (jinja_contains(b, a, result)) return CI_ERR;
    *result = !*result;
    return CI_OK;
  default:
    if (jv_compare(a, b, &cmp)) {
      if (a.kind != JV_UNDEF && b.kind != JV_UNDEF)
        return ci_fail("'%s' not supported between instances of '%s' and '%s'", op_symbols[op],
                       jv_type_name(a), jv_type_name(b));
      return CI_ERR;
    }
    *result = op == JOP_LT ? cmp < 0 : op == JOP_LE ? cmp <= 0 : op == JOP_GT ? cmp > 0 : cmp >= 0;
    return CI_OK;
  }
}

/* ==== Expressions ==== */

static int eval(ci_jctx *c, const jnode *n, jscope *s, jv *out);
static int exec_body(ci_jctx *c, jnode *const *body, size_t n, jscope *s, jbuf *out);

static int check_stack(ci_jctx *c) {
  char marker;
  uintptr_t here = (uintptr_t)&marker;
  if (c->stack_base > here && c->stack_base - here > JINJA_MAX_STACK)
    return ci_fail("template recursion too deep");
  return CI_OK;
}

/* Evaluates call arguments into owned arrays (freed by args_free); *list and **dict arguments are
 * spread (the dict of a ** stays referenced while its keys name keyword arguments). */
typedef struct {
  jv *pos, *kw;
  const char **kw_names;
  size_t n_pos, n_kw, cap_pos, cap_kw;
  jv spread; /* the ** mapping, kept for its keys */
} owned_args;

static void args_free(owned_args *a) {
  for (size_t i = 0; i < a->n_pos; i++) jv_drop(a->pos[i]);
  for (size_t i = 0; i < a->n_kw; i++) jv_drop(a->kw[i]);
  jv_drop(a->spread);
  free(a->pos);
  free(a->kw);
  free(a->kw_names);
}

/* Makes room for `more` positional and keyword arguments. */
static int args_grow(owned_args *a, size_t more_pos, size_t more_kw) {
  if (a->n_pos + more_pos > a->cap_pos) {
    const size_t cap = a->n_pos + more_pos;
    jv *p = realloc(a->pos, cap * sizeof *p);
    if (!p) return ci_fail("out of memory rendering the template");
    a->pos = p, a->cap_pos = cap;
  }
  if (a->n_kw + more_kw > a->cap_kw) {
    const size_t cap = a->n_kw + more_kw;
    jv *k = realloc(a->kw, cap * sizeof *k);
    if (k) a->kw = k;
    const char **names = k ? realloc(a->kw_names, cap * sizeof *names) : NULL;
    if (!names) return ci_fail("out of memory rendering the template");
    a->kw_names = names, a->cap_kw = cap;
  }
  return CI_OK;
}

static int add_kw(owned_args *a, const char *name, jv v /* taken */) {
  for (size_t i = 0; i < a->n_kw; i++)
    if (!strcmp(a->kw_names[i], name)) {
      jv_drop(v);
      return ci_fail("got multiple values for keyword argument '%s'", name);
    }
  a->kw_names[a->n_kw] = name;
  a->kw[a->n_kw++] = v;
  return CI_OK;
}

static int eval_args(ci_jctx *c, const jnode *n, jscope *s, owned_args *a, jv *extra_kw,
                     const char *extra_name) {
  memset(a, 0, sizeof *a);
  a->spread = jv_undef();
  if (args_grow(a, n->n_kids + 1, n->n_kids + 1)) {
    args_free(a);
    return CI_ERR;
  }
  for (size_t i = 0; i < n->n_kids; i++) {
    const jnode *k = n->kids[i];
    const int wrapped = k->kind == JN_KWARG || k->kind == JN_STARARG || k->kind == JN_DSTARARG;
    jv v;
    if (eval(c, wrapped ? k->a : k, s, &v)) {
      args_free(a);
      return CI_ERR;
    }
    int rc = CI_OK;
    if (k->kind == JN_KWARG) {
      rc = add_kw(a, k->name, v);
    } else if (k->kind == JN_STARARG) {
      if (v.kind != JV_LIST)
        rc = ci_fail("the argument after * must be a list or tuple, not %s", jv_type_name(v));
      else if (!(rc = args_grow(a, v.u.l->n, 0)))
        for (size_t j = 0; j < v.u.l->n; j++) a->pos[a->n_pos++] = jv_dup(v.u.l->items[j]);
      jv_drop(v);
    } else if (k->kind == JN_DSTARARG) {
      if (v.kind != JV_DICT) {
        rc = ci_fail("the argument after ** must be a mapping, not %s", jv_type_name(v));
        jv_drop(v);
      } else {
        a->spread = v;
        rc = args_grow(a, 0, v.u.d->n + 1);
        for (size_t j = 0; rc == CI_OK && j < v.u.d->n; j++)
          rc = v.u.d->keys[j].kind != JV_STR
                   ? ci_fail("keywords after ** must be strings")
                   : add_kw(a, v.u.d->keys[j].u.s->data, jv_dup(v.u.d->vals[j]));
      }
    } else {
      a->pos[a->n_pos++] = v;
    }
    if (rc) {
      args_free(a);
      return CI_ERR;
    }
  }
  if (extra_kw) {
    a->kw_names[a->n_kw] = extra_name;
    a->kw[a->n_kw++] = jv_dup(*extra_kw);
  }
  return CI_OK;
}

static jargs as_jargs(const owned_args *a) {
  return (jargs){a->pos, a->n_pos, a->kw_names, a->kw, a->n_kw};
}

static int call_macro(ci_jctx *c, const jfunc *f, const jargs *args, jv *out) {
  const jnode *m = f->macro;
  if (++c->call_depth > JINJA_MAX_CALL_DEPTH) {
    c->call_depth--;
    return ci_fail("macro recursion deeper than %d calls", JINJA_MAX_CALL_DEPTH);
  }
  if (++c->iterations > c->limits.max_iterations) {
    c->call_depth--;
    return ci_fail("template exceeded %llu loop iterations and macro calls",
                   (unsigned long long)c->limits.max_iterations);
  }
  jscope *s = scope_new(f->closure);
  int rc = s ? CI_OK : CI_ERR;
  jlist *varargs = jv_new_list(&c->heap, 0);
  jdict *kwargs = jv_new_dict(&c->heap, 0);
  if (!varargs || !kwargs)
    rc = ci_fail("template exceeded its memory limit");
  else
    varargs->is_tuple = 1;
  for (size_t i = 0; rc == CI_OK && i < m->n_kids; i++) {
    const jnode *param = m->kids[i];
    jv v = jv_undef();
    int have = 0;
    if (i < args->n_pos) {
      v = jv_dup(args->pos[i]);
      have = 1;
    }
    for (size_t k = 0; k < args->n_kw && !have; k++) {
      if (!strcmp(args->kw_names[k], param->name)) {
        v = jv_dup(args->kw[k]);
        have = 1;
      }
    }
    if (!have && param->a) {
      rc = eval(c, param->a, s, &v);
      if (rc) break;
    } else if (!have) {
      v = jv_undef_hint("parameter '%s' was not provided", param->name);
    }
    rc = scope_set(s, param->name, v);
  }
  for (size_t i = m->n_kids; rc == CI_OK && i < args->n_pos; i++)
    if (jlist_push(&c->heap, varargs, jv_dup(args->pos[i])))
      rc = ci_fail("template exceeded its memory limit");
  for (size_t k = 0; rc == CI_OK && k < args->n_kw; k++) {
    const char *name = args->kw_names[k];
    int is_param = 0;
    for (size_t i = 0; i < m->n_kids; i++) is_param |= !strcmp(m->kids[i]->name, name);
    if (!strcmp(name, "caller"))
      rc = scope_set(s, "caller", jv_dup(args->kw[k]));
    else if (!is_param) {
      jv key = jv_cstr(name);
      if (jinja_check_str(key) || jdict_set(&c->heap, kwargs, key, jv_dup(args->kw[k])))
        rc = ci_fail("template exceeded its memory limit");
    }
  }
  if (rc == CI_OK) rc = scope_set(s, "varargs", jv_list(varargs));
  if (rc == CI_OK) rc = scope_set(s, "kwargs", jv_dict(kwargs));
  jbuf buf = {0};
  if (rc == CI_OK) {
    rc = exec_body(c, m->body, m->n_body, s, &buf);
    if (rc > 0) rc = CI_OK;
  }
  if (rc == CI_OK) {
    *out = jbuf_take(&buf);
    rc = jinja_check_str(*out);
  } else {
    jbuf_free(&buf);
  }
  scope_release(c, s);
  c->call_depth--;
  return rc;
}

int jinja_call(ci_jctx *c, jv fn, const jargs *args, jv *out) {
  if (fn.kind == JV_UNDEF) return jinja_undefined_error(fn);
  if (fn.kind != JV_FUNC) return ci_fail("'%s' object is not callable", jv_type_name(fn));
  const jfunc *f = fn.u.fn;
  if (f->macro) return call_macro(c, f, args, out);
  return f->fn(c, f->self, args, out);
}

static int eval_call(ci_jctx *c, const jnode *n, jscope *s, jv *extra_caller, jv *out) {
  owned_args a;
  const jnode *callee = n->a;
  jv obj = jv_undef(), fn = jv_undef();
  jbuiltin_fn method = NULL;
  if (callee->kind == JN_GETATTR) {
    /* obj.method(...) calls the method directly, without a bound-function value */
    if (eval(c, callee->a, s, &obj)) return CI_ERR;
    if (obj.kind == JV_UNDEF) {
      int rc = jinja_undefined_error(obj);
      jv_drop(obj);
      return rc;
    }
    method = jinja_method_find(obj, callee->name);
    if (!method && jinja_getattr(c, obj, callee->name, &fn)) {
      jv_drop(obj);
      return CI_ERR;
    }
  } else if (eval(c, callee, s, &fn)) {
    return CI_ERR;
  }
  int rc = eval_args(c, n, s, &a, extra_caller, "caller");
  if (rc == CI_OK) {
    jargs args = as_jargs(&a);
    if (method)
      rc = method(c, obj, &args, out);
    else if (fn.kind == JV_UNDEF && callee->kind == JN_NAME)
      rc = ci_fail("'%s' is undefined", callee->name);
    else
      rc = jinja_call(c, fn, &args, out);
    args_free(&a);
  }
  jv_drop(obj);
  jv_drop(fn);
  return rc;
}

static int eval_slice(ci_jctx *c, const jnode *n, jscope *s, jv *out) {
  jv obj;
  if (eval(c, n->a, s, &obj)) return CI_ERR;
  int64_t bounds[3];
  int given[3] = {0, 0, 0};
  for (int k = 0; k < 3; k++) {
    if (!n->kids[k]) continue;
    jv v;
    if (eval(c, n->kids[k], s, &v)) {
      jv_drop(obj);
      return CI_ERR;
    }
    if (v.kind == JV_NONE) continue;
    if (v.kind != JV_INT && v.kind != JV_BOOL) {
      jv_drop(v);
      jv_drop(obj);
      return ci_fail("slice indices must be integers or None");
    }
    bounds[k] = num_i(v);
    given[k] = 1;
  }
  int64_t step = given[2] ? bounds[2] : 1;
  if (step == 0) {
    jv_drop(obj);
    return ci_fail("slice step cannot be zero");
  }
  if (obj.kind == JV_UNDEF) {
    int rc = jinja_undefined_error(obj);
    jv_drop(obj);
    return rc;
  }
  if (obj.kind != JV_LIST && obj.kind != JV_STR) {
    jv_drop(obj);
    return ci_fail("'%s' object is not subscriptable", jv_type_name(obj));
  }
  /* For strings, work on code point offsets. */
  size_t *offsets = NULL;
  int64_t len;
  if (obj.kind == JV_STR) {
    size_t count = ju8_count(obj.u.s->data, obj.u.s->len);
    offsets = malloc((count + 1) * sizeof *offsets);
    if (!offsets) {
      jv_drop(obj);
      return ci_fail("out of memory");
    }
    size_t i = 0, k = 0;
    while (i < obj.u.s->len) {
      offsets[k++] = i;
      int32_t cp;
      i += ju8_decode(obj.u.s->data + i, obj.u.s->len - i, &cp);
    }
    offsets[k] = obj.u.s->len;
    len = (int64_t)count;
  } else {
    len = (int64_t)obj.u.l->n;
  }
  /* Python's slice.indices */
  int64_t start, stop;
  if (step > 0) {
    start = given[0] ? bounds[0] : 0;
    stop = given[1] ? bounds[1] : len;
    if (start < 0) start = start + len < 0 ? 0 : start + len;
    if (start > len) start = len;
    if (stop < 0) stop = stop + len < 0 ? 0 : stop + len;
    if (stop > len) stop = len;
  } else {
    start = given[0] ? bounds[0] : len - 1;
    stop = given[1] ? bounds[1] : -1 - len;
    if (start < 0) start = start + len < 0 ? -1 : start + len;
    if (start >= len) start = len - 1;
    if (stop < 0) stop = stop + len < 0 ? -1 : stop + len;
    if (stop >= len) stop = len - 1;
  }
  int rc = CI_OK;
  if (obj.kind == JV_STR) {
    jbuf b = {0};
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
      jbuf_put(&b, obj.u.s->data + offsets[i], offsets[i + 1] - offsets[i]);
    *out = jbuf_take(&b);
    rc = jinja_check_str(*out);
  } else {
    jlist *l = jv_new_list(&c->heap, 0);
    if (!l) rc = ci_fail("template exceeded its memory limit");
    for (int64_t i = start; rc == CI_OK && (step > 0 ? i < stop : i > stop); i += step)
      if (jlist_push(&c->heap, l, jv_dup(obj.u.l->items[i])))
        rc = ci_fail("template exceeded its memory limit");
    if (rc == CI_OK) {
      l->is_tuple = obj.u.l->is_tuple;
      *out = jv_list(l);
    }
  }
  free(offsets);
  jv_drop(obj);
  return rc;
}

static int eval_test(ci_jctx *c, const jnode *n, jscope *s, jv *out) {
  jtest_fn test = jinja_test_find(n->name);
  if (!test) return ci_fail("no test named '%s'", n->name);
  jv value;
  if (eval(c, n->a, s, &value)) return CI_ERR;
  owned_args a;
  int rc = eval_args(c, n, s, &a, NULL, NULL);
  if (rc == CI_OK) {
    jargs args = as_jargs(&a);
    int result = 0;
    rc = test(c, value, &args, &result);
    if (rc == CI_OK) *out = jv_bool(n->op ? !result : result);
    args_free(&a);
  }
  jv_drop(value);
  return rc;
}

static int eval_filter(ci_jctx *c, const jnode *n, jscope *s, jv *out) {
  jbuiltin_fn filter = jinja_filter_find(n->name);
  if (!filter) return ci_fail("no filter named '%s'", n->name);
  jv value;
  if (n->a) {
    if (eval(c, n->a, s, &value)) return CI_ERR;
  } else {
    value = jv_dup(c->pipe_in);
  }
  owned_args a;
  int rc = eval_args(c, n, s, &a, NULL, NULL);
  if (rc == CI_OK) {
    jargs args = as_jargs(&a);
    rc = filter(c, value, &args, out);
    args_free(&a);
  }
  jv_drop(value);
  return rc;
}

static int eval_collection(ci_jctx *c, const jnode *n, jscope *s, jv *out) {
  if (n->kind == JN_DICT) {
    jdict *d = jv_new_dict(&c->heap, n->n_kids / 2);
    if (!d) return ci_fail("template exceeded its memory limit");
    for (size_t i = 0; i + 1 < n->n_kids; i += 2) {
      jv k, v;
      if (eval(c, n->kids[i], s, &k)) return CI_ERR;
      if (k.kind == JV_LIST && !k.u.l->is_tuple) {
        jv_drop(k);
        return ci_fail("unhashable type: 'list'");
      }
      if (k.kind == JV_DICT) return ci_fail("unhashable type: 'dict'");
      if (eval(c, n->kids[i + 1], s, &v)) {
        jv_drop(k);
        return CI_ERR;
      }
      if (jdict_set(&c->heap, d, k, v)) return ci_fail("template exceeded its memory limit");
    }
    *out = jv_dict(d);
    return CI_OK;
  }
  jlist *l = jv_new_list(&c->heap, n->n_kids);
  if (!l) return ci_fail("template exceeded its memory limit");
  l->is_tuple = n->kind == JN_TUPLE;
  for (size_t i = 0; i < n->n_kids; i++) {
    if (eval(c, n->kids[i], s, &l->items[l->n])) return CI_ERR;
    l->n++;
  }
  *out = jv_list(l);
  return CI_OK;
}

static int eval_inner(ci_jctx *c, const jnode *n, jscope *s, jv *out) {
  jv a, b;
  int rc;
  switch (n->kind) {
  case JN_LITERAL:
    *out = jv_dup(n->lit);
    return CI_OK;
  case JN_NAME: {
    jv *v = scope_lookup(s, n->name);
    if (v) {
      *out = jv_dup(*v);
      return CI_OK;
    }
    jbuiltin_fn g = jinja_global_find(n->name);
    if (g) return jinja_make_func(c, n->name, g, jv_undef(), out);
    *out = jv_undef_hint("'%s' is undefined", n->name);
    return CI_OK;
  }
  case JN_LIST:
  case JN_TUPLE:
  case JN_DICT:
    return eval_collection(c, n, s, out);
  case JN_GETATTR:
    if (eval(c, n->a, s, &a)) return CI_ERR;
    rc = jinja_getattr(c, a, n->name, out);
    jv_drop(a);
    return rc;
  case JN_GETITEM:
    if (eval(c, n->a, s, &a)) return CI_ERR;
    if (eval(c, n->b, s, &b)) {
      jv_drop(a);
      return CI_ERR;
    }
    rc = jinja_getitem(c, a, b, out);
    jv_drop(a);
    jv_drop(b);
    return rc;
  case JN_SLICE:
    return eval_slice(c, n, s, out);
  case JN_CALL:
    return eval_call(c, n, s, NULL, out);
  case JN_FILTER:
    return eval_filter(c, n, s, out);
  case JN_TEST:
    return eval_test(c, n, s, out);
  case JN_UNARY:
    if (eval(c, n->a, s, &a)) return CI_ERR;
    rc = CI_OK;
    if (n->op == JOP_NOT)
      *out = jv_bool(!jv_truthy(a));
    else if (a.kind == JV_INT || a.kind == JV_BOOL) {
      if (n->op == JOP_NEG && num_i(a) == INT64_MIN)
        rc = ci_fail("integer overflow");
      else
        *out = jv_int(n->op == JOP_NEG ? -num_i(a) : num_i(a));
    } else if (a.kind == JV_FLOAT)
      *out = jv_float(n->op == JOP_NEG ? -a.u.f : a.u.f);
    else if (a.kind == JV_UNDEF)
      rc = jinja_undefined_error(a);
    else
      rc = ci_fail("bad operand type for unary %s: '%s'", n->op == JOP_NEG ? "-" : "+",
                   jv_type_name(a));
    jv_drop(a);
    return rc;
  case JN_BINARY:
    if (eval(c, n->a, s, &a)) return CI_ERR;
    if (n->op == JOP_AND || n->op == JOP_OR) {
      int t = jv_truthy(a);
      if ((n->op == JOP_AND) != t) {
        *out = a;
        return CI_OK;
      }
      jv_drop(a);
      return eval(c, n->b, s, out);
    }
    if (eval(c, n->b, s, &b)) {
      jv_drop(a);
      return CI_ERR;
    }
    if (n->op == JOP_CONCAT) {
      jbuf buf = {0};
      jv_write_str(&buf, a);
      jv_write_str(&buf, b);
      *out = jbuf_take(&buf);
      rc = jinja_check_str(*out);
    } else {
      rc = arith(c, n->op, a, b, out);
    }
    jv_drop(a);
    jv_drop(b);
    return rc;
  case JN_COMPARE: {
    if (eval(c, n->a, s, &a)) return CI_ERR;
    int result = 1;
    for (size_t i = 0; i < n->n_kids && result; i++) {
      if (eval(c, n->kids[i], s, &b)) {
        jv_drop(a);
        return CI_ERR;
      }
      rc = compare_op(n->ops[i], a, b, &result);
      jv_drop(a);
      a = b;
      if (rc) {
        jv_drop(a);
        return CI_ERR;
      }
    }
    jv_drop(a);
    *out = jv_bool(result);
    return CI_OK;
  }
  case JN_COND:
    if (eval(c, n->a, s, &a)) return CI_ERR;
    rc = jv_truthy(a);
    jv_drop(a);
    if (rc) return eval(c, n->b, s, out);
    if (n->c) return eval(c, n->c, s, out);
    *out = jv_undef_hint(
        "the inline if-expression evaluated to false and no else section was defined");
    return CI_OK;
  default:
    return ci_fail("not an expression");
  }
}

/* Evaluation with the stack guard and the error position. */
static int eval(ci_jctx *c, const jnode *n, jscope *s, jv *out) {
  int rc = check_stack(c);
  if (rc == CI_OK) rc = eval_inner(c, n, s, out);
  if (rc == CI_OK && out->kind == JV_STR) {
    c->work += out->u.s->len;
    if (c->work > c->limits.max_work) {
      jv_drop(*out);
      rc = ci_fail("template exceeded its work limit (%llu bytes of strings built)",
                   (unsigned long long)c->limits.max_work);
    }
  }
  if (rc && !c->located) {
    c->located = 1;
    ci_fail_context("line %d, column %d", n->line, n->col);
  }
  return rc;
}

/* ==== Statements ==== */

static int assign(ci_jctx *c, const jnode *target, jscope *s, jv value) {
  if (target->kind == JN_NAME) return scope_set(s, target->name, value);
  if (target->kind == JN_NSREF) {
    jv *ns = scope_lookup(s, target->name);
    if (!ns || ns->kind != JV_DICT || !ns->u.d->is_namespace) {
      jv_drop(value);
      return ci_fail("cannot assign attribute on non-namespace object");
    }
    jv key = jv_cstr(target->name2);
    if (jinja_check_str(key)) {
      jv_drop(value);
      return CI_ERR;
    }
    if (jdict_set(&c->heap, ns->u.d, key, value))
      return ci_fail("template exceeded its memory limit");
    return CI_OK;
  }
  /* tuple unpacking */
  jlist *items;
  if (jinja_iterate(c, value, &items)) {
    jv_drop(value);
    return CI_ERR;
  }
  jv_drop(value);
  if (items->n != target->n_kids)
    return ci_fail(items->n > target->n_kids ? "too many values to unpack (expected %zu)"
                                             : "not enough values to unpack (expected %zu)",
                   target->n_kids);
  for (size_t i = 0; i < target->n_kids; i++)
    if (scope_set(s, target->kids[i]->name, jv_dup(items->items[i]))) return CI_ERR;
  return CI_OK;
}

static int set_loop(ci_jctx *c, jdict *loop, const char *key, jv v) {
  jv k = jv_cstr(key);
  if (jinja_check_str(k)) return CI_ERR;
  if (jdict_set(&c->heap, loop, k, v)) return ci_fail("template exceeded its memory limit");
  return CI_OK;
}

static int loop_cycle(ci_jctx *c, jv self, const jargs *args, jv *out) {
  if (args->n_pos == 0) return ci_fail("no items for cycling given");
  jv *index0 = jdict_get(self.u.d, "index0", 6);
  int64_t i = index0 && index0->kind == JV_INT ? index0->u.i : 0;
  *out = jv_dup(args->pos[(size_t)i % args->n_pos]);
  return CI_OK;
}

static int exec_for(ci_jctx *c, const jnode *n, jscope *s, jbuf *out) {
  jv iterable;
  if (eval(c, n->b, s, &iterable)) return CI_ERR;
  jlist *items;
  int rc = jinja_iterate(c, iterable, &items);
  jv_drop(iterable);
  if (rc) return CI_ERR;
  if (n->c) { /* {% for x in xs if cond %}: filter first, so loop.length counts the kept */
    jlist *kept = jv_new_list(&c->heap, items->n);
    if (!kept) return ci_fail("template exceeded its memory limit");
    for (size_t i = 0; i < items->n; i++) {
      jscope *probe = scope_new(s);
      jv cond;
      rc = probe ? assign(c, n->a, probe, jv_dup(items->items[i])) : CI_ERR;
      if (rc == CI_OK) rc = eval(c, n->c, probe, &cond);
      scope_release(c, probe);
      if (rc) return CI_ERR;
      if (jv_truthy(cond)) kept->items[kept->n++] = jv_dup(items->items[i]);
      jv_drop(cond);
    }
    items = kept;
  }
  if (items->n == 0) return exec_body(c, n->orelse, n->n_orelse, s, out);
  /* The loop object is one dict per loop, updated in place through slots. */
  static const char *const keys[] = {"index",  "index0", "revindex", "revindex0",
                                     "first",  "last",   "previtem", "nextitem",
                                     "length", "depth",  "depth0",   "cycle"};
  enum {
    K_INDEX,
    K_INDEX0,
    K_REVINDEX,
    K_REVINDEX0,
    K_FIRST,
    K_LAST,
    K_PREV,
    K_NEXT,
    K_COUNT = 12
  };
  jdict *loop = jv_new_dict(&c->heap, K_COUNT);
  jv cycle;
  if (!loop || jinja_make_func(c, "cycle", loop_cycle, jv_dict(loop), &cycle))
    return ci_fail("template exceeded its memory limit");
  const int64_t len = (int64_t)items->n;
  for (int k = 0; k < K_COUNT; k++) {
    jv init = k == 8    ? jv_int(len)
              : k == 9  ? jv_int(1)
              : k == 10 ? jv_int(0)
              : k == 11 ? cycle
                        : jv_none();
    if (set_loop(c, loop, keys[k], init)) return CI_ERR;
  }
  jv *slot = loop->vals; /* keys were added in order, and nothing can add more */
  for (int64_t i = 0; i < len; i++) {
    if (++c->iterations > c->limits.max_iterations)
      return ci_fail("template exceeded %llu loop iterations and macro calls",
                     (unsigned long long)c->limits.max_iterations);
    slot[K_INDEX] = jv_int(i + 1);
    slot[K_INDEX0] = jv_int(i);
    slot[K_REVINDEX] = jv_int(len - i);
    slot[K_REVINDEX0] = jv_int(len - i - 1);
    slot[K_FIRST] = jv_bool(i == 0);
    slot[K_LAST] = jv_bool(i == len - 1);
    jv_drop(slot[K_PREV]);
    slot[K_PREV] = i > 0 ? jv_dup(items->items[i - 1]) : jv_undef_hint("there is no previous item");
    jv_drop(slot[K_NEXT]);
    slot[K_NEXT] =
        i < len - 1 ? jv_dup(items->items[i + 1]) : jv_undef_hint("there is no next item");
    jscope *iter = scope_new(s);
    if (!iter) return CI_ERR;
    rc = scope_set(iter, "loop", jv_dict(loop));
    if (rc == CI_OK) rc = assign(c, n->a, iter, jv_dup(items->items[i]));
    if (rc == CI_OK) rc = exec_body(c, n->body, n->n_body, iter, out);
    scope_release(c, iter);
    if (rc == FLOW_BREAK) break;
    if (rc < 0) return rc;
  }
  return CI_OK;
}

/* Renders body into a new string with a child scope (block set, filter block). */
static int capture(ci_jctx *c, jnode *const *body, size_t n, jscope *s, jv *out) {
  jscope *inner = scope_new(s);
  if (!inner) return CI_ERR;
  jbuf buf = {0};
  int rc = exec_body(c, body, n, inner, &buf);
  scope_release(c, inner);
  if (rc < 0) {
    jbuf_free(&buf);
    return rc;
  }
  *out = jbuf_take(&buf);
  return jinja_check_str(*out);
}

/* Applies a filter chain (innermost operand NULL) to the captured text. */
static int apply_chain(ci_jctx *c, const jnode *chain, jscope *s, jv text, jv *out) {
  jv saved = c->pipe_in;
  c->pipe_in = text;
  int rc = eval(c, chain, s, out);
  c->pipe_in = saved;
  jv_drop(text);
  return rc;
}

static int exec_stmt(ci_jctx *c, const jnode *n, jscope *s, jbuf *out) {
  jv v;
  int rc;
  switch (n->kind) {
  case JN_TEXT:
    jbuf_put(out, n->lit.u.s->data, n->lit.u.s->len);
    return CI_OK;
  case JN_OUTPUT:
    if (eval(c, n->a, s, &v)) return CI_ERR;
    jv_write_str(out, v);
    jv_drop(v);
    return CI_OK;
  case JN_IF:
    if (eval(c, n->a, s, &v)) return CI_ERR;
    rc = jv_truthy(v);
    jv_drop(v);
    return rc ? exec_body(c, n->body, n->n_body, s, out)
              : exec_body(c, n->orelse, n->n_orelse, s, out);
  case JN_FOR:
    return exec_for(c, n, s, out);
  case JN_SET:
    if (eval(c, n->b, s, &v)) return CI_ERR;
    return assign(c, n->a, s, v);
  case JN_SETBLOCK:
    if (capture(c, n->body, n->n_body, s, &v)) return CI_ERR;
    if (n->c) {
      jv filtered;
      if (apply_chain(c, n->c, s, v, &filtered)) return CI_ERR;
      v = filtered;
    }
    return assign(c, n->a, s, v);
  case JN_MACRO: {
    jfunc *f = ci_jheap_alloc(&c->heap, sizeof *f, jfunc_fini);
    if (!f) return ci_fail("template exceeded its memory limit");
    f->name = n->name;
    f->macro = n;
    f->closure = s;
    f->self = jv_undef();
    scope_capture(s);
    jv fn = {.kind = JV_FUNC};
    fn.u.fn = f;
    return scope_set(s, n->name, fn);
  }
  case JN_CALLBLOCK: {
    jfunc *f = ci_jheap_alloc(&c->heap, sizeof *f, jfunc_fini);
    if (!f) return ci_fail("template exceeded its memory limit");
    f->name = "caller";
    f->macro = n;
    f->closure = s;
    f->self = jv_undef();
    scope_capture(s);
    jv caller = {.kind = JV_FUNC};
    caller.u.fn = f;
    if (eval_call(c, n->a, s, &caller, &v)) {
      if (!c->located) {
        c->located = 1;
        ci_fail_context("line %d, column %d", n->line, n->col);
      }
      return CI_ERR;
    }
    jv_write_str(out, v);
    jv_drop(v);
    return CI_OK;
  }
  case JN_FILTERBLOCK:
    if (capture(c, n->body, n->n_body, s, &v)) return CI_ERR;
    if (apply_chain(c, n->c, s, v, &v)) return CI_ERR;
    jv_write_str(out, v);
    jv_drop(v);
    return CI_OK;
  case JN_BREAK:
    return FLOW_BREAK;
  case JN_CONTINUE:
    return FLOW_CONTINUE;
  default:
    return ci_fail("not a statement");
  }
}

static int exec_body(ci_jctx *c, jnode *const *body, size_t n, jscope *s, jbuf *out) {
  for (size_t i = 0; i < n; i++) {
    int rc = check_stack(c);
    if (rc == CI_OK) rc = exec_stmt(c, body[i], s, out);
    if (rc < 0 && !c->located) {
      c->located = 1;
      ci_fail_context("line %d, column %d", body[i]->line, body[i]->col);
    }
    if (rc) return rc;
    if (out->failed)
      return ci_fail("template output too large (over %d MiB)", JV_MAX_STR * 4 >> 20);
  }
  return CI_OK;
}

ci_jinja_limits ci_jinja_default_limits(void) {
  return (ci_jinja_limits){
      .max_iterations = 1000000, .max_work = (uint64_t)4 << 30, .max_output = (size_t)256 << 20};
}

int jinja_raise(ci_jctx *c, const char *msg) {
  c->located = 1;
  return ci_fail("%s", msg);
}

int ci_jinja_render(const ci_jinja_template *t, const json_t *vars, char **out, size_t *out_len) {
  return ci_jinja_render_limited(t, vars, NULL, out, out_len);
}

int ci_jinja_render_limited(const ci_jinja_template *t, const json_t *vars,
                            const ci_jinja_limits *limits, char **out, size_t *out_len) {
  *out = NULL;
  if (out_len) *out_len = 0;
  char base_marker;
  ci_jctx c = {.stack_base = (uintptr_t)&base_marker, .pipe_in = jv_undef()};
  c.limits = limits ? *limits : ci_jinja_default_limits();
  ci_jheap_init(&c.heap, JINJA_HEAP_LIMIT);
  jscope *root = scope_new(NULL);
  int rc = root ? CI_OK : CI_ERR;
  if (rc == CI_OK && vars && json_is_object(vars)) {
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)vars, key, val) {
      jv v;
      if ((rc = jv_from_json(&c.heap, val, &v))) break;
      if ((rc = scope_set(root, key, v))) break;
    }
  }
  jbuf buf = {0};
  if (rc == CI_OK) rc = exec_body(&c, t->body, t->n_body, root, &buf);
  if (rc == CI_OK && (buf.failed || buf.len > c.limits.max_output))
    rc = ci_fail("template output too large (over %zu bytes)", c.limits.max_output);
  if (root) scope_release(&c, root);
  while (c.kept) {
    jscope *next = c.kept->next_kept;
    scope_destroy(c.kept);
    c.kept = next;
  }
  ci_jheap_free(&c.heap);
  if (rc) {
    jbuf_free(&buf);
    return CI_ERR;
  }
  if (!buf.data) {
    buf.data = calloc(1, 1);
    if (!buf.data) return ci_fail("out of memory rendering the template");
  }
  *out = buf.data;
  if (out_len) *out_len = buf.len;
  return CI_OK;
}
