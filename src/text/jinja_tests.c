/* Jinja tests ({% if x is name(args) %}) with Jinja2's semantics, as a table looked up by name. */
#include "base/error.h"
#include "text/jinja_eval.h"

#include <math.h>
#include <string.h>

static int arg0(const jargs *args, jv *out, const char *test) {
  if (args->n_pos >= 1)
    *out = args->pos[0];
  else if (args->n_kw >= 1)
    *out = args->kw[0];
  else
    return ci_fail("test '%s' needs an argument", test);
  return CI_OK;
}

static int is_number(jv v) {
  return v.kind == JV_INT || v.kind == JV_FLOAT || v.kind == JV_BOOL;
}

#define SIMPLE_TEST(name, expr)                                                                    \
  static int name(ci_jctx *c, jv v, const jargs *args, int *r) {                                   \
    *r = (expr);                                                                                   \
    return CI_OK;                                                                                  \
  }

SIMPLE_TEST(t_defined, v.kind != JV_UNDEF)
SIMPLE_TEST(t_undefined, v.kind == JV_UNDEF)
SIMPLE_TEST(t_none, v.kind == JV_NONE)
SIMPLE_TEST(t_string, v.kind == JV_STR)
SIMPLE_TEST(t_mapping, v.kind == JV_DICT && !v.u.d->is_namespace)
SIMPLE_TEST(t_iterable, v.kind == JV_STR || v.kind == JV_LIST || v.kind == JV_UNDEF ||
                            (v.kind == JV_DICT && !v.u.d->is_namespace))
SIMPLE_TEST(t_sequence, v.kind == JV_STR || v.kind == JV_LIST || v.kind == JV_UNDEF ||
                            (v.kind == JV_DICT && !v.u.d->is_namespace))
SIMPLE_TEST(t_number, is_number(v))
SIMPLE_TEST(t_integer, v.kind == JV_INT)
SIMPLE_TEST(t_float, v.kind == JV_FLOAT)
SIMPLE_TEST(t_boolean, v.kind == JV_BOOL)
SIMPLE_TEST(t_true, v.kind == JV_BOOL && v.u.b)
SIMPLE_TEST(t_false, v.kind == JV_BOOL && !v.u.b)
SIMPLE_TEST(t_callable, v.kind == JV_FUNC)
SIMPLE_TEST(t_escaped, 0)

static int parity(jv v, int want_odd, int *r) {
  if (v.kind == JV_INT || v.kind == JV_BOOL) {
    int64_t i = v.kind == JV_BOOL ? v.u.b : v.u.i;
    *r = ((i % 2) != 0) == want_odd;
    return CI_OK;
  }
  if (v.kind == JV_FLOAT) {
    double m = fmod(v.u.f, 2.0);
    *r = (m != 0.0) == want_odd;
    return CI_OK;
  }
  if (v.kind == JV_UNDEF) return jinja_undefined_error(v);
  return ci_fail("unsupported operand type(s) for %%: '%s' and 'int'", jv_type_name(v));
}

static int t_odd(ci_jctx *c, jv v, const jargs *args, int *r) {
  return parity(v, 1, r);
}
static int t_even(ci_jctx *c, jv v, const jargs *args, int *r) {
  return parity(v, 0, r);
}

static int t_divisibleby(ci_jctx *c, jv v, const jargs *args, int *r) {
  jv n;
  if (arg0(args, &n, "divisibleby")) return CI_ERR;
  if (!is_number(v) || !is_number(n))
    return ci_fail("divisibleby needs numbers, got '%s' and '%s'", jv_type_name(v),
                   jv_type_name(n));
  if (v.kind == JV_FLOAT || n.kind == JV_FLOAT) {
    double x = v.kind == JV_FLOAT ? v.u.f : (double)(v.kind == JV_BOOL ? v.u.b : v.u.i);
    double y = n.kind == JV_FLOAT ? n.u.f : (double)(n.kind == JV_BOOL ? n.u.b : n.u.i);
    if (y == 0) return ci_fail("float modulo");
    *r = fmod(x, y) == 0;
    return CI_OK;
  }
  int64_t x = v.kind == JV_BOOL ? v.u.b : v.u.i, y = n.kind == JV_BOOL ? n.u.b : n.u.i;
  if (y == 0) return ci_fail("integer division or modulo by zero");
  *r = y == -1 || x % y == 0;
  return CI_OK;
}

static int t_eq(ci_jctx *c, jv v, const jargs *args, int *r) {
  jv o;
  if (arg0(args, &o, "eq")) return CI_ERR;
  *r = jv_equal(v, o);
  return CI_OK;
}
static int t_ne(ci_jctx *c, jv v, const jargs *args, int *r) {
  jv o;
  if (arg0(args, &o, "ne")) return CI_ERR;
  *r = !jv_equal(v, o);
  return CI_OK;
}

static int ordered(jv v, const jargs *args, const char *name, int *cmp) {
  jv o;
  if (arg0(args, &o, name)) return CI_ERR;
  return jv_compare(v, o, cmp);
}
static int t_lt(ci_jctx *c, jv v, const jargs *args, int *r) {
  int cmp;
  if (ordered(v, args, "lt", &cmp)) return CI_ERR;
  *r = cmp < 0;
  return CI_OK;
}
static int t_le(ci_jctx *c, jv v, const jargs *args, int *r) {
  int cmp;
  if (ordered(v, args, "le", &cmp)) return CI_ERR;
  *r = cmp <= 0;
  return CI_OK;
}
static int t_gt(ci_jctx *c, jv v, const jargs *args, int *r) {
  int cmp;
  if (ordered(v, args, "gt", &cmp)) return CI_ERR;
  *r = cmp > 0;
  return CI_OK;
}
static int t_ge(ci_jctx *c, jv v, const jargs *args, int *r) {
  int cmp;
  if (ordered(v, args, "ge", &cmp)) return CI_ERR;
  *r = cmp >= 0;
  return CI_OK;
}

static int t_in(ci_jctx *c, jv v, const jargs *args, int *r) {
  jv seq;
  if (arg0(args, &seq, "in")) return CI_ERR;
  return jinja_contains(seq, v, r);
}

static int t_sameas(ci_jctx *c, jv v, const jargs *args, int *r) {
  jv o;
  if (arg0(args, &o, "sameas")) return CI_ERR;
  if (v.kind != o.kind)
    *r = 0;
  else if (v.kind == JV_LIST)
    *r = v.u.l == o.u.l;
  else if (v.kind == JV_DICT)
    *r = v.u.d == o.u.d;
  else if (v.kind == JV_FUNC)
    *r = v.u.fn == o.u.fn;
  else if (v.kind == JV_STR)
    *r = v.u.s == o.u.s;
  else
    *r = jv_equal(v, o);
  return CI_OK;
}

static int case_test(jv v, int upper, int *r) {
  if (v.kind != JV_STR)
    return ci_fail("'%s' object has no attribute '%s'", jv_type_name(v),
                   upper ? "isupper" : "islower");
  jv folded;
  if (jinja_change_case(v, upper ? CASE_UPPER : CASE_LOWER, &folded)) return CI_ERR;
  int has_cased = 0;
  jv other;
  if (jinja_change_case(v, upper ? CASE_LOWER : CASE_UPPER, &other)) {
    jv_drop(folded);
    return CI_ERR;
  }
  has_cased = !jv_equal(other, v) || !jv_equal(folded, v);
  *r = jv_equal(folded, v) && has_cased;
  jv_drop(folded);
  jv_drop(other);
  return CI_OK;
}
static int t_lower(ci_jctx *c, jv v, const jargs *args, int *r) {
  return case_test(v, 0, r);
}
static int t_upper(ci_jctx *c, jv v, const jargs *args, int *r) {
  return case_test(v, 1, r);
}

static int t_filter(ci_jctx *c, jv v, const jargs *args, int *r) {
  *r = v.kind == JV_STR && jinja_filter_find(v.u.s->data) != NULL;
  return CI_OK;
}
static int t_test(ci_jctx *c, jv v, const jargs *args, int *r) {
  *r = v.kind == JV_STR && jinja_test_find(v.u.s->data) != NULL;
  return CI_OK;
}

static const struct {
  const char *name;
  jtest_fn fn;
} tests[] = {
    {"defined", t_defined},
    {"undefined", t_undefined},
    {"none", t_none},
    {"string", t_string},
    {"mapping", t_mapping},
    {"iterable", t_iterable},
    {"sequence", t_sequence},
    {"number", t_number},
    {"integer", t_integer},
    {"float", t_float},
    {"boolean", t_boolean},
    {"true", t_true},
    {"false", t_false},
    {"callable", t_callable},
    {"odd", t_odd},
    {"even", t_even},
    {"divisibleby", t_divisibleby},
    {"eq", t_eq},
    {"equalto", t_eq},
    {"==", t_eq},
    {"ne", t_ne},
    {"!=", t_ne},
    {"lt", t_lt},
    {"lessthan", t_lt},
    {"<", t_lt},
    {"le", t_le},
    {"<=", t_le},
    {"gt", t_gt},
    {"greaterthan", t_gt},
    {">", t_gt},
    {"ge", t_ge},
    {">=", t_ge},
    {"in", t_in},
    {"sameas", t_sameas},
    {"lower", t_lower},
    {"upper", t_upper},
    {"escaped", t_escaped},
    {"filter", t_filter},
    {"test", t_test},
};

jtest_fn jinja_test_find(const char *name) {
  for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
    if (!strcmp(tests[i].name, name)) return tests[i].fn;
  return NULL;
}

int jinja_apply_test(ci_jctx *c, const char *name, jv value, const jargs *args, int *result) {
  jtest_fn t = jinja_test_find(name);
  if (!t) return ci_fail("no test named '%s'", name);
  return t(c, value, args, result);
}
