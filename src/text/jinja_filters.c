/* Jinja filters ({{ x | name(args) }}), with Jinja2's semantics and transformers' tojson, as a
 * table looked up by name. */
#include "base/error.h"
#include "text/jinja_eval.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BIND(names, what)                                                                          \
  jv a[sizeof names / sizeof names[0]];                                                            \
  if (jargs_bind(args, names, sizeof names / sizeof names[0], a, what)) return CI_ERR

static int given(jv v) {
  return v.kind != JV_UNDEF;
}

static int oom(void) {
  return ci_fail("template exceeded its memory limit");
}

/* Filters that work on str(value). */
static int with_str(jv value, jv *s) {
  *s = jv_to_str(value);
  return jinja_check_str(*s);
}

static int opt_bool(jv v, int fallback) {
  return given(v) ? jv_truthy(v) : fallback;
}

/* ==== Attribute paths (map(attribute=), sort(attribute=), ...) ==== */

/* Follows "a.b.0" through getitem semantics; a missing step gives undefined. */
static int attr_path(ci_jctx *c, jv obj, jv path, jv *out) {
  if (path.kind == JV_INT) return jinja_getitem(c, obj, path, out);
  if (path.kind != JV_STR) return ci_fail("attribute must be a string or an integer");
  jv cur = jv_dup(obj);
  const char *p = path.u.s->data, *end = p + path.u.s->len;
  while (p <= end) {
    const char *dot = memchr(p, '.', (size_t)(end - p));
    size_t n = dot ? (size_t)(dot - p) : (size_t)(end - p);
    jv key;
    int digits = n > 0;
    for (size_t i = 0; i < n; i++) digits &= p[i] >= '0' && p[i] <= '9';
    if (digits && n < 18)
      key = jv_int(strtoll(p, NULL, 10));
    else if (jinja_check_str(key = jv_str(p, n))) {
      jv_drop(cur);
      return CI_ERR;
    }
    jv next;
    int rc = cur.kind == JV_UNDEF ? (next = jv_dup(cur), CI_OK) : jinja_getitem(c, cur, key, &next);
    jv_drop(key);
    jv_drop(cur);
    if (rc) return CI_ERR;
    cur = next;
    if (!dot) break;
    p = dot + 1;
  }
  *out = cur;
  return CI_OK;
}

/* Lower-cases strings for case-insensitive sort/unique/dictsort. */
static jv fold(jv v, int case_sensitive) {
  jv lowered;
  if (case_sensitive || v.kind != JV_STR || jinja_change_case(v, CASE_LOWER, &lowered))
    return jv_dup(v);
  return lowered;
}

static int iterate_or_fail(ci_jctx *c, jv v, jlist **items) {
  return jinja_iterate(c, v, items);
}

/* ==== Sorting (stable merge sort with Python comparisons) ==== */

typedef struct {
  jv key;
  jv item;
} sort_pair;

static int merge_sort(sort_pair *v, sort_pair *tmp, size_t n, int reverse) {
  if (n < 2) return CI_OK;
  size_t h = n / 2;
  if (merge_sort(v, tmp, h, reverse) || merge_sort(v + h, tmp, n - h, reverse)) return CI_ERR;
  size_t i = 0, j = h, k = 0;
  while (i < h && j < n) {
    int cmp;
    if (jv_compare(v[j].key, v[i].key, &cmp)) return CI_ERR;
    if (reverse ? cmp > 0 : cmp < 0)
      tmp[k++] = v[j++];
    else
      tmp[k++] = v[i++];
  }
  while (i < h) tmp[k++] = v[i++];
  while (j < n) tmp[k++] = v[j++];
  memcpy(v, tmp, n * sizeof *v);
  return CI_OK;
}

static int sort_items(ci_jctx *c, jlist *items, jv attribute, int case_sensitive, int reverse,
                      int by_value_of_pair) {
  size_t n = items->n;
  sort_pair *pairs = calloc(n + 1, sizeof *pairs), *tmp = calloc(n + 1, sizeof *tmp);
  int rc = pairs && tmp ? CI_OK : ci_fail("out of memory");
  size_t made = 0;
  for (; rc == CI_OK && made < n; made++) {
    jv key = items->items[made];
    jv raw;
    if (by_value_of_pair >= 0)
      raw = jv_dup(key.u.l->items[by_value_of_pair]);
    else if (given(attribute)) {
      if ((rc = attr_path(c, key, attribute, &raw))) break;
    } else
      raw = jv_dup(key);
    pairs[made].key = fold(raw, case_sensitive);
    jv_drop(raw);
    pairs[made].item = key;
  }
  if (rc == CI_OK) rc = merge_sort(pairs, tmp, n, reverse);
  if (rc == CI_OK)
    for (size_t i = 0; i < n; i++) items->items[i] = pairs[i].item;
  for (size_t i = 0; pairs && i < made; i++) jv_drop(pairs[i].key);
  free(pairs);
  free(tmp);
  return rc;
}

/* ==== Filters ==== */

static int f_abs(ci_jctx *c, jv v, const jargs *args, jv *out) {
  if (v.kind == JV_INT) {
    if (v.u.i == INT64_MIN) return ci_fail("integer overflow");
    *out = jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
  } else if (v.kind == JV_BOOL)
    *out = jv_int(v.u.b);
  else if (v.kind == JV_FLOAT)
    *out = jv_float(fabs(v.u.f));
  else
    return ci_fail("bad operand type for abs(): '%s'", jv_type_name(v));
  return CI_OK;
}

static int f_attr(ci_jctx *c, jv v, const jargs *args, jv *out) {
  static const char *const names[] = {"name"};
  BIND(names, "attr");
  if (a[0].kind != JV_STR) return ci_fail("attribute name must be a string");
  if (v.kind == JV_UNDEF) return jinja_undefined_error(v);
  jbuiltin_fn m = jinja_method_find(v, a[0].u.s->data);
  if (m) return jinja_make_func(c, a[0].u.s->data, m, v, out);
  if (v.kind == JV_DICT && v.u.d->is_namespace) {
    jv *hit = jdict_get(v.u.d, a[0].u.s->data, a[0].u.s->len);
    if (hit) {
      *out = jv_dup(*hit);
      return CI_OK;
    }
  }
  *out = jv_undef_hint("'%s object' has no attribute '%s'", jv_type_name(v), a[0].u.s->data);
  return CI_OK;
}

static int f_case(jv v, int mode, jv *out) {
  jv s;
  if (with_str(v, &s)) return CI_ERR;
  int rc = jinja_change_case(s, mode, out);
  jv_drop(s);
  return rc;
}
static int f_upper(ci_jctx *c, jv v, const jargs *args, jv *out) {
  return f_case(v, CASE_UPPER, out);
}
static int f_lower(ci_jctx *c, jv v, const jargs *args, jv *out) {
  return f_case(v, CASE_LOWER, out);
}
static int f_capitalize(ci_jctx *c, jv v, const jargs *args, jv *out) {
  return f_case(v, CASE_CAPITALIZE, out);
}

/* Jinja2's title filter: upper-case after start, '-', whitespace, '(', '{', '[' or '<'. */
static int f_title(ci_jctx *c, jv v, const jargs *args, jv *out) {
  jv s;
  if (with_str(v, &s)) return CI_ERR;
  jbuf b = {0};
  int at_word_start = 1;
  for (size_t i = 0; i < s.u.s->len;) {
    int32_t cp;
    size_t n = ju8_decode(s.u.s->data + i, s.u.s->len - i, &cp);
    int delim = ju8_isspace(cp) || (cp < 0x80 && strchr("-({[<", (int)cp));
    jv one = jv_str(s.u.s->data + i, n), mapped;
    if (jinja_check_str(one) ||
        jinja_change_case(one, at_word_start && !delim ? CASE_UPPER : CASE_LOWER, &mapped)) {
      jv_drop(one);
      jv_drop(s);
      jbuf_free(&b);
      return CI_ERR;
    }
    if (delim)
      jbuf_put(&b, s.u.s->data + i, n);
    else
      jbuf_put(&b, mapped.u.s->data, mapped.u.s->len);
    jv_drop(one);
    jv_drop(mapped);
    at_word_start = delim;
    i += n;
  }
  jv_drop(s);
  *out = jbuf_take(&b);
  return jinja_check_str(*out);
}

static int f_length(ci_jctx *c, jv v, const jargs *args, jv *out) {
  switch (v.kind) {
  case JV_STR:
    *out = jv_int((int64_t)ju8_count(v.u.s->data, v.u.s->len));
    return CI_OK;
  case JV_LIST:
    *out = jv_int((int64_t)v.u.l->n);
    return CI_OK;
  case JV_DICT:
    if (v.u.d->is_namespace) break;
    *out = jv_int((int64_t)v.u.d->n);
    return CI_OK;
  case JV_UNDEF:
    *out = jv_int(0);
    return CI_OK;
  default:
    break;
  }
  return ci_fail("object of type '%s' has no len()", jv_type_name(v));
}

static int f_default(ci_jctx *c, jv v, const jargs *args, jv *out) {
  static const char *const names[] = {"default_value", "boolean"};
  BIND(names, "default");
  if (v.kind == JV_UNDEF || (opt_bool(a[1], 0) && !jv_truthy(v))) {
    if (given(a[0]))
      *out = jv_dup(a[0]);
    else if (jinja_check_str(*out = jv_cstr("")))
      return CI_ERR;
  } else {
    *out = jv_dup(v);
  }
  return CI_OK;
}

static int f_dictsort(ci_jctx *c, jv v, const jargs *args, jv *out) {
  static const char *const names[] = {"case_sensitive", "by", "reverse"};
  BIND(names, "dictsort");
  if (v.kind != JV_DICT || v.u.d->is_namespace)
    return ci_fail("dictsort: can only sort a mapping, not %s", jv_type_name(v));
  int by_value = 0;
  if (given(a[1])) {
    if (a[1].kind != JV_STR || (strcmp(a[1].u.s->data, "key") && strcmp(a[1].u.s->data, "value")))
      return ci_fail("You can only sort by either \"key\" or \"value\"");
    by_value = !strcmp(a[1].u.s->data, "value");
  }
  jbuiltin_fn items = jinja_method_find(v, "items");
  jargs none = {0};
  if (items(c, v, &none, out)) return CI_ERR;
  return sort_items(c, out->u.l, jv_undef(), opt_bool(a[0], 0), opt_bool(a[2], 0), by_value);
}

static int f_escape(ci_jctx *c, jv v, const jargs *args, jv *out) {
  jv s;
  if (with_str(v, &s)) return CI_ERR;
  jbuf b = {0};
  for (size_t i = 0; i < s.u.s->len; i++) {
    char ch = s.u.s->data[i];
    const char *rep = ch == '&'    ? "&amp;"
                      : ch == '<'  ? "&lt;"
                      : ch == '>'  ? "&gt;"
                      : ch == '"'  ? "&#34;"
                      : ch == '\'' ? "&#39;"
                                   : NULL;
    if (rep)
      jbuf_puts(&b, rep);
    else
      jbuf_putc(&b, ch);
  }
  jv_drop(s);
  *out = jbuf_take(&b);
  return jinja_check_str(*out);
}

static int f_first(ci_jctx *c, jv v, const jargs *args, jv *out) {
  jlist *items;
  if (v.kind == JV_LIST)
    items = v.u.l;
  else if (iterate_or_fail(c, v, &items))
    return CI_ERR;
  *out = items->n ? jv_dup(items->items[0]) : jv_undef_hint("No first item, sequence was empty.");
  return CI_OK;
}

static int f_last(ci_jctx *c, jv v, const jargs *args, jv *out) {
  jlist *items;
  if (v.kind == JV_LIST)
    items = v.u.l;
  else if (iterate_or_fail(c, v, &items))
    return CI_ERR;
  *out = items->n ? jv_dup(items->items[items->n - 1])
                  : jv_undef_hint("No last item, sequence was empty.");
  return CI_OK;
}

/* Parses a Python int literal ("  -42 ", "4_2"); 0 on success. */
static int parse_int_text(const char *s, int base, int64_t *out) {
  while (*s && ju8_isspace((unsigned char)*s)) s++;
  char digits[80];
  size_t n = 0;
  if (*s == '+' || *s == '-') digits[n++] = *s++;
  /* a 0x / 0o / 0b prefix is allowed when it matches the base, as in Python's int(s, base) */
  if (s[0] == '0' && s[1] &&
      (((s[1] | 32) == 'x' && base == 16) || ((s[1] | 32) == 'o' && base == 8) ||
       ((s[1] | 32) == 'b' && base == 2)))
    s += 2;
  int any = 0;
  for (; *s && n < sizeof digits - 1; s++) {
    if (*s == '_' && any && s[1] && s[1] != '_') continue;
    int d = *s >= '0' && *s <= '9'                 ? *s - '0'
            : (*s | 32) >= 'a' && (*s | 32) <= 'z' ? (*s | 32) - 'a' + 10
                                                   : 99;
    if (d >= base) break;
    digits[n++] = *s;
    any = 1;
  }
  while (*s && ju8_isspace((unsigned char)*s)) s++;
  if (!any || *s) return -1;
  digits[n] = '\0';
  char *end;
  long long v = strtoll(digits, &end, base);
  if (*end) return -1;
  *out = v;
  return 0;
}

static int parse_float_text(const char *s, double *out) {
  while (*s && ju8_isspace((unsigned char)*s)) s++;
  if (!*s) return -1;
  char *end;
  double f = strtod(s, &end);
  if (end == s) return -1;
  while (*end && ju8_isspace((unsigned char)*end)) end++;
  if (*end) return -1;
  if ((s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) ||
      (s[0] && (s[1] == '0') && (s[2] == 'x' || s[2] == 'X')))
    return -1; /* Python's float() has no hex literals */
  *out = f;
  return 0;
}

static int f_int(ci_jctx *c, jv v, const jargs *args, jv *out) {
  static const char *const names[] = {"default", "base"};
  BIND(names, "int");
  jv fallback = given(a[0]) ? a[0] : jv_int(0);
  int64_t base = given(a[1]) && a[1].kind == JV_INT ? a[1].u.i : 10;
  if (base < 2 || base > 36) base = 10;
  switch (v.kind) {
  case JV_INT:
    *out = v;
    return CI_OK;
  case JV_BOOL:
    *out = jv_int(v.u.b);
    return CI_OK;
  case JV_FLOAT:
    if (isnan(v.u.f) || isinf(v.u.f) || fabs(v.u.f) >= 9.2e18)
      return ci_fail("cannot convert float %s to integer", isnan(v.u.f) ? "NaN" : "infinity");
    *out = jv_int((int64_t)v.u.f);
    return CI_OK;
  case JV_STR: {
    int64_t i;
    double f;
    if (!parse_int_text(v.u.s->data, (int)base, &i)) {
      *out = jv_int(i);
      return CI_OK;
    }
    if (!parse_float_text(v.u.s->data, &f) && !isnan(f) && fabs(f) < 9.2e18) {
      *out = jv_int((int64_t)f);
      return CI_OK;
    }
    break;
  }
  default:
    break;
  }
  *out = jv_dup(fallback);
  return CI_OK;
}

static int f_float(ci_jctx *c, jv v, const jargs *args, jv *out) {
  static const char *const names[] = {"default"};
  BIND(names, "float");
  double f;
  if (v.kind == JV_FLOAT)
    *out = v;
  else if (v.kind == JV_INT || v.kind == JV_BOOL)
    *out = jv_float(v.kind == JV_INT ? (double)v.u.i : v.u.b);
  else if (v.kind == JV_STR && !parse_float_text(v.u.s->data, &f))
    *out = jv_float(f);
  else
    *out = given(a[0]) ? jv_dup(a[0]) : jv_float(0.0);
  return CI_OK;
}

static int f_format(ci_jctx *c, jv v, const jargs *args, jv *out) {
  jv s;
  if (with_str(v, &s)) return CI_ERR;
  jv params;
  int rc = CI_OK;
  if (args->n_kw) {
    jdict *d = jv_new_dict(&c->heap, args->n_kw);
    if (!d) rc = oom();
    for (size_t i = 0; rc == CI_OK && i < args->n_kw; i++) {
      jv key = jv_cstr(args->kw_names[i]);
      if (jinja_check_str(key) || jdict_set(&c->heap, d, key, jv_dup(args->kw[i]))) rc = oom();
    }
    params = jv_dict(d);
  } else {
    jlist *l = jv_new_list(&c->heap, args->n_pos);
    if (!l)
      rc = oom();
    else {
      l->is_tuple = 1;
      for (size_t i = 0; i < args->n_pos; i++) l->items[l->n++] = jv_dup(args->pos[i]);
    }
    params = jv_list(l);
  }
  if (rc == CI_OK) rc = jinja_str_format(c, s, params, out);
  jv_drop(s);
  return rc;
}

/* The length of the line break Python's str.splitlines() sees at d[i] (\r\n is one; \n, \r,
 * \v, \f, \x1c-\x1e, U+0085, U+2028, U+2029), or 0. */
static size_t line_break(const char *d, size_t len, size_t i) {
  if (i >= len) return 0;
  const unsigned char c = (unsigned char)d[i];
  if (c == '\r') return i + 1 < len && d[i + 1] == '\n' ? 2 : 1;
  if (c == '\n' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e)) return 1;
  if (c == 0xc2 && i + 1 < len && (unsigned char)d[i + 1] == 0x85) return 2;
  if (c == 0xe2 && i + 2 < len && (unsigned char)d[i + 1] == 0x80 &&
      ((unsigned char)d[i + 2] == 0xa8 || (unsigned char)d[i + 2] == 0xa9))
    return 3;
  return 0;
}

/* Jinja2's indent: the first line and blank lines are left alone unless asked. */
static int f_indent(ci_jctx *c, jv v, const jargs *args, jv *out) {
  static const char *const names[] = {"width", "first", "blank"};
  BIND(names, "indent");
  jbuf pad = {0};
  if (a[0].kind == JV_STR)
    jbuf_put(&pad, a[0].u.s->data, a[0].u.s->len);
  else {
    int64_t w = a[0].kind == JV_INT ? a[0].u.i : given(a[0]) ? -1 : 4;
    if (w < 0 || w > 4096) {
      jbuf_free(&pad);
      return ci_fail("indent width must be an integer or a string");
    }
    for (int64_t i = 0; i < w; i++) jbuf_putc(&pad, ' ');
  }
  const char *ind = pad.data ? pad.data : "";
  jv s;
  if (with_str(v, &s)) {
    jbuf_free(&pad);
    return CI_ERR;
  }
  int first = opt_bool(a[1], 0), blank = opt_bool(a[2], 0);
  /* as Jinja2 3.1: lines = (s + "\n").splitlines(); with blank every line after the first gets the
     indent, else every non-empty one; joined by "\n" (so a trailing newline stays, indented only
     with blank) */
  jbuf b = {0};
  if (first) jbuf_puts(&b, ind);
  const char *d = s.u.s->data;
  const size_t len = s.u.s->len;
  size_t start = 0;
  for (int line_no = 0; start <= len; line_no++) {
    /* a line of s + "\n" ends at a break or at the appended newline (at len) */
    size_t end = start, next;
    for (;;) {
      const size_t brk = line_break(d, len, end);
      if (end >= len || brk) {
        next = end >= len ? len + 1 : end + brk;
        break;
      }
      end++;
    }
    if (line_no > 0) {
      jbuf_putc(&b, '\n');
      if (blank || end > start) jbuf_puts(&b, ind);
    }
    jbuf_put(&b, d + start, end - start);
    start = next;
  }
  jv_drop(s);
  jbuf_free(&pad);
  *out = jbuf_take(&b);
  return jinja_check_str(*out);
}

static int f_items(ci_jctx *c, jv v, const jargs *args, jv *out) {
  if (v.kind == JV_UNDEF) {
    jlist *l = jv_new_list(&c->heap, 0);
    if (!l) return oom();
    *out = jv_list(l);
    return CI_OK;
  }
  if (v.kind != JV_DICT || v.u.d->is_namespace)
    return ci_fail("Can only get item pairs from a mapping.");
  return jinja_method_find(v, "items")(c, v, &(jargs){0}, out);
}

static int f_join(ci_jctx *c, jv v, const jargs *args, jv *out) {
  static const char *const names[] = {"d", "attribute"};
  BIND(names, "join");
  jlist *items;
  if (iterate_or_fail(c, v, &items)) return CI_ERR;
  jbuf b = {0};
  for (size_t i = 0; i < items->n; i++) {
    if (i && given(a[0])) jv_write_str(&b, a[0]);
    if (given(a[1])) {
      jv item;
      if (attr_path(c, items->items[i], a[1], &item)) {
        jbuf_free(&b);
        return CI_ERR;
      }
      jv_write_str(&b, item);
      jv_drop(item);
    } else {
      jv_write_str(&b, items->items[i]);
    }
  }
  *out = jbuf_take(&b);
  return jinja_check_str(*out);
}

static int f_list(ci_jctx *c, jv v, const jargs *args, jv *out) {
  jlist *items;
  if (iterate_or_fail(c, v, &items)) return CI_ERR;
  *out = jv_list(items);
  return CI_OK;
}

/* map('filter', args...) or map(attribute='a.b', default=x) */
static int f_map(ci_jctx *c, jv v, const jargs *args, jv *out) {
  jlist *items, *result;
  if (iterate_or_fail(c, v, &items) || !(result = jv_new_list(&c->heap, items->n)))
    return ci_fail_context("map");
  const jv *attribute = NULL, *fallback = NULL;
  for (size_t k = 0; k < args->n_kw; k++) {
    if (!strcmp(args->kw_names[k], "attribute"))
      attribute = &args->kw[k];
    else if (!strcmp(args->kw_names[k], "default"))
      fallback = &args->kw[k];
  }
  if (!attribute && (args->n_pos == 0 || args->pos[0].kind != JV_STR))
    return ci_fail("map requires a filter name or attribute=");
  for (size_t i = 0; i < items->n; i++) {
    jv r;
    if (attribute) {
      if (attr_path(c, items->items[i], *attribute, &r)) return CI_ERR;
      if (r.kind == JV_UNDEF && fallback) {
        jv_drop(r);
        r = jv_dup(*fallback);
      }
    } else {
      jargs rest = {args->pos + 1, args->n_pos - 1, args->kw_names, args->kw, args->n_kw};
      if (jinja_apply_filter(c, args->pos[0].u.s->data, items->items[i], &rest, &r)) return CI_ERR;
    }
    result->items[result->n++] = r;
  }
  *out = jv_list(result);
  return CI_OK;
}

static int f_minmax(ci_jctx *c, jv v, const jargs *args, jv *out, int want_max) {
  static const char *const names[] = {"case_sensitive", "attribute"};
  BIND(names, want_max ? "max" : "min");
  jlist *items;
  if (iterate_or_fail(c, v, &items)) return CI_ERR;
  if (items->n == 0) {
    *out = jv_undef_hint("No aggregated item, sequence was empty.");
    return CI_OK;
  }
  /* a stable sort puts the first smallest (or, reversed, the first largest) first */
  if (sort_items(c, items, a[1], opt_bool(a[0], 0), want_max, -1)) return CI_ERR;
  *out = jv_dup(items->items[0]);
  return CI_OK;
}
static int f_max(ci_jctx *c, jv v, const jargs *args, jv *out) {
  return f_minmax(c, v, args, out, 1);
}
static int f_min(ci_jctx *c, jv v, const jargs *args, jv *out) {
  return f_minmax(c, v, args, out, 0);
}

/* select/reject(test, args...) and selectattr/rejectattr(attr, test, args...) */
static int select_common(ci_jctx *c, jv v, const jargs *args, jv *out, int by_attr, int keep) {
  jlist *items, *result;
  if (iterate_or_fail(c, v, &items) || !(result = jv_new_list(&c->heap, items->n))) return CI_ERR;
  size_t first_arg = by_attr ? 1 : 0;
  if (by_attr && args->n_pos < 1) return ci_fail("selectattr/rejectattr need an attribute name");
  const char *test = NULL;
  if (args->n_pos > first_arg) {
    if (args->pos[first_arg].kind != JV_STR) return ci_fail("test name must be a string");
    test = args->pos[first_arg].u.s->data;
  }
  jargs rest = {args->pos + first_arg + 1,
                args->n_pos > first_arg + 1 ? args->n_pos - first_arg - 1 : 0, args->kw_names,
                args->kw, args->n_kw};
  for (size_t i = 0; i < items->n; i++) {
    jv subject;
    if (by_attr) {
      if (attr_path(c, items->items[i], args->pos[0], &subject)) return CI_ERR;
    } else
      subject = jv_dup(items->items[i]);
    int pass;
    int rc = test ? jinja_apply_test(c, test, subject, &rest, &pass) : CI_OK;
    if (!test) pass = jv_truthy(subject);
    jv_drop(subject);
    if (rc) return CI_ERR;
    if (pass == keep) result->items[result->n++] = jv_dup(items->items[i]);
  }
  *out = jv_list(result);
  return CI_OK;
}
static int f_select(ci_jctx *c, jv v, const jargs *args, jv *out) {
  return select_common(c, v, args, out, 0, 1);
}
static int f_reject(ci_jctx *c, jv v, const jargs *args, jv *out) {
  return select_common(c, v, args, out, 0, 0);
}
static int f_selectattr(ci_jctx *c, jv v, const jargs *args, jv *out) {
  return select_common(c, v, args, out, 1, 1);
}
static int f_rejectattr(ci_jctx *c, jv v, const jargs *args, jv *out) {
  return select_common(c, v, args, out, 1, 0);
}

static int f_replace(ci_jctx *c, jv v, const jargs *args, jv *out) {
  static const char *const names[] = {"old", "new", "count"};
  BIND(names, "replace");
  jv s, old, repl;
  if (with_str(v, &s)) return CI_ERR;
  old = jv_to_str(a[0]);
  repl = jv_to_str(a[1]);
  int rc = jinja_check_str(old) || jinja_check_str(repl) ? CI_ERR : CI_OK;
  int64_t count = a[2].kind == JV_INT ? a[2].u.i : -1;
  if (rc == CI_OK) rc = jinja_replace(s, old, repl, count, out);
  jv_drop(s);
  jv_drop(old);
  jv_drop(repl);
  return rc;
}

static int f_reverse(ci_jctx *c, jv v, const jargs *args, jv *out) {
  if (v.kind == JV_STR) {
    jbuf b = {0};
    const char *d = v.u.s->data;
    size_t end = v.u.s->len;
    while (end > 0) {
      size_t back = end - 1;
      while (back > 0 && ((unsigned char)d[back] & 0xc0) == 0x80) back--;
      jbuf_put(&b, d + back, end - back);
      end = back;
    }
    *out = jbuf_take(&b);
    return jinja_check_str(*out);
  }
  jlist *items;
  if (iterate_or_fail(c, v, &items)) return CI_ERR;
  for (size_t i = 0, j = items->n ? items->n - 1 : 0; i < j; i++, j--) {
    jv t = items->items[i];
    items->items[i] = items->items[j];
    items->items[j] = t;
  }
  *out = jv_list(items);
  return CI_OK;
}

static int f_round(ci_jctx *c, jv v, const jargs *args, jv *out) {
  static const char *const names[] = {"precision", "method"};
  BIND(names, "round");
  int64_t precision = a[0].kind == JV_INT ? a[0].u.i : 0;
  const char *method = a[1].kind == JV_STR ? a[1].u.s->data : "common";
  if (strcmp(method, "common") && strcmp(method, "ceil") && strcmp(method, "floor"))
    return ci_fail("method must be common, ceil or floor");
  if (v.kind != JV_INT && v.kind != JV_FLOAT && v.kind != JV_BOOL)
    return ci_fail("type %s doesn't define __round__ method", jv_type_name(v));
  if (v.kind != JV_FLOAT && !strcmp(method, "common") && precision >= 0) {
    *out = jv_int(v.kind == JV_BOOL ? v.u.b : v.u.i);
    return CI_OK;
  }
  double x = v.kind == JV_FLOAT ? v.u.f : v.kind == JV_BOOL ? v.u.b : (double)v.u.i;
  if (precision > 300) precision = 300;
  if (precision < -300) precision = -300;
  double scale = pow(10.0, (double)precision);
  if (!strcmp(method, "ceil"))
    x = ceil(x * scale) / scale;
  else if (!strcmp(method, "floor"))
    x = floor(x * scale) / scale;
  else if (isfinite(x) && precision >= 0) {
    char buf[400];
    snprintf(buf, sizeof buf, "%.*f", (int)precision, x); /* exact, ties to even like Python */
    x = strtod(buf, NULL);
  } else if (isfinite(x)) {
    x = nearbyint(x * scale) / scale;
  }
  *out = jv_float(x);
  return CI_OK;
}

static int f_safe(ci_jctx *c, jv v, const jargs *args, jv *out) {
  *out = jv_dup(v);
  return CI_OK;
}

static int f_sort(ci_jctx *c, jv v, const jargs *args, jv *out) {
  static const char *const names[] = {"reverse", "case_sensitive", "attribute"};
  BIND(names, "sort");
  jlist *items;
  if (iterate_or_fail(c, v, &items)) return CI_ERR;
  if (sort_items(c, items, a[2], opt_bool(a[1], 0), opt_bool(a[0], 0), -1)) return CI_ERR;
  *out = jv_list(items);
  return CI_OK;
}

static int f_string(ci_jctx *c, jv v, const jargs *args, jv *out) {
  return with_str(v, out);
}

static int f_sum(ci_jctx *c, jv v, const jargs *args, jv *out) {
  static const char *const names[] = {"attribute", "start"};
  BIND(names, "sum");
  jlist *items;
  if (iterate_or_fail(c, v, &items)) return CI_ERR;
  jv total = given(a[1]) ? jv_dup(a[1]) : jv_int(0);
  for (size_t i = 0; i < items->n; i++) {
    jv item;
    if (given(a[0])) {
      if (attr_path(c, items->items[i], a[0], &item)) return CI_ERR;
    } else
      item = jv_dup(items->items[i]);
    int is_num = item.kind == JV_INT || item.kind == JV_FLOAT || item.kind == JV_BOOL;
    if (!is_num || (total.kind != JV_INT && total.kind != JV_FLOAT && total.kind != JV_BOOL)) {
      jv_drop(item);
      jv_drop(total);
      return ci_fail("unsupported operand type(s) for +: '%s' and '%s'", jv_type_name(total),
                     jv_type_name(item));
    }
    if (total.kind == JV_FLOAT || item.kind == JV_FLOAT) {
      double x = total.kind == JV_FLOAT  ? total.u.f
                 : total.kind == JV_BOOL ? total.u.b
                                         : (double)total.u.i;
      double y = item.kind == JV_FLOAT  ? item.u.f
                 : item.kind == JV_BOOL ? item.u.b
                                        : (double)item.u.i;
      total = jv_float(x + y);
    } else {
      int64_t x = total.kind == JV_BOOL ? total.u.b : total.u.i;
      int64_t y = item.kind == JV_BOOL ? item.u.b : item.u.i;
      int64_t r;
      if (__builtin_add_overflow(x, y, &r)) return ci_fail("integer overflow");
      total = jv_int(r);
    }
  }
  *out = total;
  return CI_OK;
}

/* transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
static int f_tojson(ci_jctx *c, jv v, const jargs *args, jv *out) {
  static const char *const names[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
  BIND(names, "tojson");
  int indent = -1;
  const char *indent_str = NULL;
  if (a[1].kind == JV_INT)
    indent = a[1].u.i < 0 ? 0 : a[1].u.i > 200 ? 200 : (int)a[1].u.i;
  else if (a[1].kind == JV_STR)
    indent_str = a[1].u.s->data;
  else if (given(a[1]) && a[1].kind != JV_NONE)
    return ci_fail("tojson: bad indent");
  const char *item_sep = NULL, *key_sep = NULL;
  if (given(a[2]) && a[2].kind != JV_NONE) {
    if (a[2].kind != JV_LIST || a[2].u.l->n != 2 || a[2].u.l->items[0].kind != JV_STR ||
        a[2].u.l->items[1].kind != JV_STR)
      return ci_fail("tojson: separators must be a pair of strings");
    item_sep = a[2].u.l->items[0].u.s->data;
    key_sep = a[2].u.l->items[1].u.s->data;
  }
  jbuf b = {0};
  if (jinja_tojson(c, v, indent, indent_str, item_sep, key_sep, opt_bool(a[0], 0),
                   opt_bool(a[3], 0), &b)) {
    jbuf_free(&b);
    return CI_ERR;
  }
  *out = jbuf_take(&b);
  return jinja_check_str(*out);
}

static int f_trim(ci_jctx *c, jv v, const jargs *args, jv *out) {
  static const char *const names[] = {"chars"};
  BIND(names, "trim");
  jv s;
  if (with_str(v, &s)) return CI_ERR;
  int rc;
  if (a[0].kind == JV_STR)
    rc = jinja_strip(s, a[0].u.s->data, a[0].u.s->len, 1, 1, out);
  else
    rc = jinja_strip(s, NULL, 0, 1, 1, out);
  jv_drop(s);
  return rc;
}

static int f_unique(ci_jctx *c, jv v, const jargs *args, jv *out) {
  static const char *const names[] = {"case_sensitive", "attribute"};
  BIND(names, "unique");
  jlist *items, *result, *seen;
  if (iterate_or_fail(c, v, &items) || !(result = jv_new_list(&c->heap, items->n)) ||
      !(seen = jv_new_list(&c->heap, items->n)))
    return CI_ERR;
  int cs = opt_bool(a[0], 0);
  for (size_t i = 0; i < items->n; i++) {
    jv key;
    if (given(a[1])) {
      jv raw;
      if (attr_path(c, items->items[i], a[1], &raw)) return CI_ERR;
      key = fold(raw, cs);
      jv_drop(raw);
    } else
      key = fold(items->items[i], cs);
    int dup = 0;
    for (size_t k = 0; k < seen->n && !dup; k++) dup = jv_equal(seen->items[k], key);
    if (dup) {
      jv_drop(key);
      continue;
    }
    seen->items[seen->n++] = key;
    result->items[result->n++] = jv_dup(items->items[i]);
  }
  *out = jv_list(result);
  return CI_OK;
}

static int f_wordcount(ci_jctx *c, jv v, const jargs *args, jv *out) {
  jv s;
  if (with_str(v, &s)) return CI_ERR;
  int64_t words = 0;
  int in_word = 0;
  for (size_t i = 0; i < s.u.s->len;) {
    int32_t cp;
    i += ju8_decode(s.u.s->data + i, s.u.s->len - i, &cp);
    int w =
        cp == '_' || (cp < 0x80 ? (cp >= '0' && cp <= '9') || ((cp | 32) >= 'a' && (cp | 32) <= 'z')
                                : !ju8_isspace(cp));
    if (w && !in_word) words++;
    in_word = w;
  }
  jv_drop(s);
  *out = jv_int(words);
  return CI_OK;
}

static int f_center(ci_jctx *c, jv v, const jargs *args, jv *out) {
  static const char *const names[] = {"width"};
  BIND(names, "center");
  int64_t width = a[0].kind == JV_INT ? a[0].u.i : 80;
  jv s;
  if (with_str(v, &s)) return CI_ERR;
  int64_t n = (int64_t)ju8_count(s.u.s->data, s.u.s->len);
  if (width > 1 << 20) width = 1 << 20;
  jbuf b = {0};
  int64_t pad = width > n ? width - n : 0;
  int64_t left = pad / 2 + (pad & width & 1); /* Python's str.center placement */
  for (int64_t i = 0; i < left; i++) jbuf_putc(&b, ' ');
  jbuf_put(&b, s.u.s->data, s.u.s->len);
  for (int64_t i = 0; i < pad - left; i++) jbuf_putc(&b, ' ');
  jv_drop(s);
  *out = jbuf_take(&b);
  return jinja_check_str(*out);
}

static const struct {
  const char *name;
  jbuiltin_fn fn;
} filters[] = {
    {"abs", f_abs},
    {"attr", f_attr},
    {"capitalize", f_capitalize},
    {"center", f_center},
    {"count", f_length},
    {"d", f_default},
    {"default", f_default},
    {"dictsort", f_dictsort},
    {"e", f_escape},
    {"escape", f_escape},
    {"first", f_first},
    {"float", f_float},
    {"forceescape", f_escape},
    {"format", f_format},
    {"indent", f_indent},
    {"int", f_int},
    {"items", f_items},
    {"join", f_join},
    {"last", f_last},
    {"length", f_length},
    {"list", f_list},
    {"lower", f_lower},
    {"map", f_map},
    {"max", f_max},
    {"min", f_min},
    {"reject", f_reject},
    {"rejectattr", f_rejectattr},
    {"replace", f_replace},
    {"reverse", f_reverse},
    {"round", f_round},
    {"safe", f_safe},
    {"select", f_select},
    {"selectattr", f_selectattr},
    {"sort", f_sort},
    {"string", f_string},
    {"sum", f_sum},
    {"title", f_title},
    {"tojson", f_tojson},
    {"trim", f_trim},
    {"unique", f_unique},
    {"upper", f_upper},
    {"wordcount", f_wordcount},
};

jbuiltin_fn jinja_filter_find(const char *name) {
  for (size_t i = 0; i < sizeof filters / sizeof filters[0]; i++)
    if (!strcmp(filters[i].name, name)) return filters[i].fn;
  return NULL;
}

int jinja_apply_filter(ci_jctx *c, const char *name, jv value, const jargs *args, jv *out) {
  jbuiltin_fn f = jinja_filter_find(name);
  if (!f) return ci_fail("no filter named '%s'", name);
  return f(c, value, args, out);
}
