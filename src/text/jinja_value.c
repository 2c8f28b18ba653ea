/* Jinja runtime values: strings with reference counts, containers in a per-render heap, and the
 * Python semantics of truth, equality, ordering, str() and repr() (see jinja_value.h). */
#include "text/jinja_value.h"

#include "base/error.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ==== Strings ==== */

/* A frozen string (refs < 0) is owned by a template and never counted. */
jv jv_dup(jv v) {
  if ((v.kind == JV_STR || v.kind == JV_UNDEF) && v.u.s && v.u.s->refs >= 0) v.u.s->refs++;
  return v;
}

void jv_drop(jv v) {
  if ((v.kind == JV_STR || v.kind == JV_UNDEF) && v.u.s && v.u.s->refs >= 0 && --v.u.s->refs == 0)
    free(v.u.s);
}

void jv_freeze(jv *v) {
  if ((v->kind == JV_STR || v->kind == JV_UNDEF) && v->u.s) v->u.s->refs = -1;
}

void jv_free_frozen(jv v) {
  if ((v.kind == JV_STR || v.kind == JV_UNDEF) && v.u.s && v.u.s->refs < 0)
    free(v.u.s);
  else
    jv_drop(v);
}

static jstr *jstr_new(const char *s, size_t len) {
  if (len > JV_MAX_STR) return NULL;
  jstr *str = malloc(sizeof *str + len + 1);
  if (!str) return NULL;
  str->refs = 1;
  str->len = len;
  if (len) memcpy(str->data, s, len);
  str->data[len] = '\0';
  return str;
}

jv jv_str(const char *s, size_t len) {
  jv v = {.kind = JV_STR};
  v.u.s = jstr_new(s, len);
  return v;
}

jv jv_cstr(const char *s) {
  return jv_str(s, strlen(s));
}

jv jv_undef_hint(const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  jv v = jv_undef();
  v.u.s = jstr_new(msg, n < 0 ? 0 : (size_t)n >= sizeof msg ? sizeof msg - 1 : (size_t)n);
  return v;
}

/* ==== Heap ==== */

struct jheap_obj {
  jheap_obj *next;
  void (*fini)(void *);
  size_t size;
  max_align_t payload[];
};

void ci_jheap_init(ci_jheap *h, size_t limit) {
  h->head = NULL;
  h->bytes = 0;
  h->limit = limit;
  h->over = 0;
}

void ci_jheap_free(ci_jheap *h) {
  jheap_obj *o = h->head;
  while (o) {
    jheap_obj *next = o->next;
    if (o->fini) o->fini(o->payload);
    free(o);
    o = next;
  }
  h->head = NULL;
  h->bytes = 0;
}

/* Charges `size` bytes to the heap's budget; 0 ok, -1 when over. */
static int jheap_charge(ci_jheap *h, size_t size) {
  if (h->over || size > h->limit - h->bytes) {
    h->over = 1;
    return -1;
  }
  h->bytes += size;
  return 0;
}

void *ci_jheap_alloc(ci_jheap *h, size_t size, void (*fini)(void *)) {
  if (jheap_charge(h, size + sizeof(jheap_obj))) return NULL;
  jheap_obj *o = calloc(1, sizeof *o + size);
  if (!o) {
    h->over = 1;
    return NULL;
  }
  o->fini = fini;
  o->size = size;
  o->next = h->head;
  h->head = o;
  return o->payload;
}

static void jlist_fini(void *p) {
  jlist *l = p;
  for (size_t i = 0; i < l->n; i++) jv_drop(l->items[i]);
  free(l->items);
}

static void jdict_fini(void *p) {
  jdict *d = p;
  for (size_t i = 0; i < d->n; i++) {
    jv_drop(d->keys[i]);
    jv_drop(d->vals[i]);
  }
  free(d->keys);
  free(d->vals);
}

jlist *jv_new_list(ci_jheap *h, size_t cap) {
  jlist *l = ci_jheap_alloc(h, sizeof *l, jlist_fini);
  if (!l) return NULL;
  if (cap) {
    if (jheap_charge(h, cap * sizeof(jv))) return NULL;
    l->items = malloc(cap * sizeof(jv));
    if (!l->items) return NULL;
    l->cap = cap;
  }
  return l;
}

jdict *jv_new_dict(ci_jheap *h, size_t cap) {
  jdict *d = ci_jheap_alloc(h, sizeof *d, jdict_fini);
  if (!d) return NULL;
  if (cap) {
    if (jheap_charge(h, 2 * cap * sizeof(jv))) return NULL;
    d->keys = malloc(cap * sizeof(jv));
    d->vals = malloc(cap * sizeof(jv));
    if (!d->keys || !d->vals) return NULL;
    d->cap = cap;
  }
  return d;
}

int jlist_push(ci_jheap *h, jlist *l, jv item) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 4;
    jv *items =
        jheap_charge(h, (cap - l->cap) * sizeof(jv)) ? NULL : realloc(l->items, cap * sizeof(jv));
    if (!items) {
      jv_drop(item);
      return -1;
    }
    l->items = items;
    l->cap = cap;
  }
  l->items[l->n++] = item;
  return 0;
}

jv *jdict_get(const jdict *d, const char *key, size_t len) {
  for (size_t i = 0; i < d->n; i++) {
    const jv k = d->keys[i];
    if (k.kind == JV_STR && k.u.s->len == len && !memcmp(k.u.s->data, key, len)) return &d->vals[i];
  }
  return NULL;
}

jv *jdict_get_v(const jdict *d, jv key) {
  if (key.kind == JV_STR) return jdict_get(d, key.u.s->data, key.u.s->len);
  for (size_t i = 0; i < d->n; i++)
    if (jv_equal(d->keys[i], key)) return &d->vals[i];
  return NULL;
}

int jdict_set(ci_jheap *h, jdict *d, jv key, jv val) {
  jv *slot = jdict_get_v(d, key);
  if (slot) {
    jv_drop(key);
    jv_drop(*slot);
    *slot = val;
    return 0;
  }
  if (d->n == d->cap) {
    size_t cap = d->cap ? d->cap * 2 : 4;
    if (jheap_charge(h, 2 * (cap - d->cap) * sizeof(jv))) goto fail;
    jv *keys = realloc(d->keys, cap * sizeof(jv));
    if (!keys) goto fail;
    d->keys = keys;
    jv *vals = realloc(d->vals, cap * sizeof(jv));
    if (!vals) goto fail;
    d->vals = vals;
    d->cap = cap;
  }
  d->keys[d->n] = key;
  d->vals[d->n] = val;
  d->n++;
  return 0;
fail:
  h->over = 1;
  jv_drop(key);
  jv_drop(val);
  return -1;
}

/* ==== Truth, equality, ordering ==== */

int jv_truthy(jv v) {
  switch (v.kind) {
  case JV_UNDEF:
  case JV_NONE:
    return 0;
  case JV_BOOL:
    return v.u.b;
  case JV_INT:
    return v.u.i != 0;
  case JV_FLOAT:
    return v.u.f != 0.0;
  case JV_STR:
    return v.u.s->len != 0;
  case JV_LIST:
    return v.u.l->n != 0;
  case JV_DICT:
    return v.u.d->is_namespace || v.u.d->n != 0;
  case JV_FUNC:
    return 1;
  }
  return 0;
}

static int is_number(jv v) {
  return v.kind == JV_BOOL || v.kind == JV_INT || v.kind == JV_FLOAT;
}

static double as_double(jv v) {
  return v.kind == JV_FLOAT ? v.u.f : v.kind == JV_BOOL ? (double)v.u.b : (double)v.u.i;
}

static int64_t as_int(jv v) {
  return v.kind == JV_BOOL ? v.u.b : v.u.i;
}

int jv_equal(jv a, jv b) {
  if (is_number(a) && is_number(b)) {
    if (a.kind == JV_FLOAT || b.kind == JV_FLOAT) return as_double(a) == as_double(b);
    return as_int(a) == as_int(b);
  }
  if (a.kind != b.kind) return 0;
  switch (a.kind) {
  case JV_UNDEF:
  case JV_NONE:
    return 1;
  case JV_STR:
    return a.u.s->len == b.u.s->len && !memcmp(a.u.s->data, b.u.s->data, a.u.s->len);
  case JV_LIST:
    if (a.u.l == b.u.l) return 1;
    if (a.u.l->is_tuple != b.u.l->is_tuple || a.u.l->n != b.u.l->n) return 0;
    for (size_t i = 0; i < a.u.l->n; i++)
      if (!jv_equal(a.u.l->items[i], b.u.l->items[i])) return 0;
    return 1;
  case JV_DICT:
    if (a.u.d == b.u.d) return 1;
    if (a.u.d->is_namespace || b.u.d->is_namespace || a.u.d->n != b.u.d->n) return 0;
    for (size_t i = 0; i < a.u.d->n; i++) {
      jv *other = jdict_get_v(b.u.d, a.u.d->keys[i]);
      if (!other || !jv_equal(a.u.d->vals[i], *other)) return 0;
    }
    return 1;
  case JV_FUNC:
    return a.u.fn == b.u.fn;
  default:
    return 0;
  }
}

const char *jv_type_name(jv v) {
  static const char *const names[] = {"Undefined", "NoneType", "bool", "int",     "float",
                                      "str",       "list",     "dict", "function"};
  if (v.kind == JV_LIST && v.u.l->is_tuple) return "tuple";
  if (v.kind == JV_DICT && v.u.d->is_namespace) return "Namespace";
  return names[v.kind];
}

int jv_compare(jv a, jv b, int *cmp) {
  if (is_number(a) && is_number(b)) {
    if (a.kind == JV_FLOAT || b.kind == JV_FLOAT) {
      double x = as_double(a), y = as_double(b);
      *cmp = x < y ? -1 : x > y ? 1 : 0;
    } else {
      int64_t x = as_int(a), y = as_int(b);
      *cmp = x < y ? -1 : x > y ? 1 : 0;
    }
    return 0;
  }
  if (a.kind == JV_STR && b.kind == JV_STR) {
    size_t n = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
    int c = memcmp(a.u.s->data, b.u.s->data, n);
    if (c == 0) c = a.u.s->len < b.u.s->len ? -1 : a.u.s->len > b.u.s->len ? 1 : 0;
    *cmp = c < 0 ? -1 : c > 0 ? 1 : 0;
    return 0;
  }
  if (a.kind == JV_LIST && b.kind == JV_LIST && a.u.l->is_tuple == b.u.l->is_tuple) {
    size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
    for (size_t i = 0; i < n; i++) {
      if (jv_equal(a.u.l->items[i], b.u.l->items[i])) continue;
      return jv_compare(a.u.l->items[i], b.u.l->items[i], cmp);
    }
    *cmp = a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n ? 1 : 0;
    return 0;
  }
  if (a.kind == JV_UNDEF || b.kind == JV_UNDEF) {
    jv u = a.kind == JV_UNDEF ? a : b;
    return ci_fail("%s", u.u.s ? u.u.s->data : "value is undefined");
  }
  return ci_fail("'<' not supported between instances of '%s' and '%s'", jv_type_name(a),
                 jv_type_name(b));
}

/* ==== Output buffer ==== */

void jbuf_put(jbuf *b, const char *s, size_t n) {
  if (b->failed || n == 0) return;
  if (n > JV_MAX_STR * (size_t)4 - b->len) {
    b->failed = 1;
    return;
  }
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + n + 1) cap *= 2;
    char *data = realloc(b->data, cap);
    if (!data) {
      b->failed = 1;
      return;
    }
    b->data = data;
    b->cap = cap;
  }
  memcpy(b->data + b->len, s, n);
  b->len += n;
  b->data[b->len] = '\0';
}

void jbuf_puts(jbuf *b, const char *s) {
  jbuf_put(b, s, strlen(s));
}

void jbuf_putc(jbuf *b, char c) {
  jbuf_put(b, &c, 1);
}

void jbuf_free(jbuf *b) {
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
  b->failed = 0;
}

jv jbuf_take(jbuf *b) {
  jv v = b->failed ? (jv){.kind = JV_STR, .u.s = NULL} : jv_str(b->data ? b->data : "", b->len);
  jbuf_free(b);
  return v;
}

/* ==== str() and repr() ==== */

void jv_write_float(jbuf *b, double f) {
  if (isnan(f)) return jbuf_puts(b, "nan");
  if (isinf(f)) return jbuf_puts(b, f < 0 ? "-inf" : "inf");
  char buf[40];
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
    if (strtod(buf, NULL) == f) break;
  }
  /* buf is [-]d[.ddd]e[+-]xx: split into sign, digits and decimal exponent. */
  const char *p = buf;
  if (*p == '-') jbuf_putc(b, *p++);
  char digits[24];
  int nd = 0;
  for (; *p && *p != 'e'; p++)
    if (*p != '.') digits[nd++] = *p;
  int exp = atoi(p + 1);
  while (nd > 1 && digits[nd - 1] == '0') nd--;
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      for (int i = 0; i <= exp; i++) jbuf_putc(b, i < nd ? digits[i] : '0');
      jbuf_putc(b, '.');
      if (nd > exp + 1)
        jbuf_put(b, digits + exp + 1, (size_t)(nd - exp - 1));
      else
        jbuf_putc(b, '0');
    } else {
      jbuf_puts(b, "0.");
      for (int i = 0; i < -exp - 1; i++) jbuf_putc(b, '0');
      jbuf_put(b, digits, (size_t)nd);
    }
  } else {
    jbuf_putc(b, digits[0]);
    if (nd > 1) {
      jbuf_putc(b, '.');
      jbuf_put(b, digits + 1, (size_t)(nd - 1));
    }
    char e[16];
    snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    jbuf_puts(b, e);
  }
}

/* Python's str.isprintable() for one code point. */
static int cp_printable(int32_t cp) {
  if (cp < 0x80) return cp >= 0x20 && cp < 0x7f;
  utf8proc_category_t c = utf8proc_category(cp);
  return !(c == UTF8PROC_CATEGORY_CC || c == UTF8PROC_CATEGORY_CF || c == UTF8PROC_CATEGORY_CS ||
           c == UTF8PROC_CATEGORY_CO || c == UTF8PROC_CATEGORY_CN || c == UTF8PROC_CATEGORY_ZL ||
           c == UTF8PROC_CATEGORY_ZP || c == UTF8PROC_CATEGORY_ZS);
}

static void write_str_repr(jbuf *b, const char *s, size_t len) {
  int has_single = memchr(s, '\'', len) != NULL, has_double = memchr(s, '"', len) != NULL;
  char quote = has_single && !has_double ? '"' : '\'';
  jbuf_putc(b, quote);
  for (size_t i = 0; i < len;) {
    int32_t cp;
    size_t n = ju8_decode(s + i, len - i, &cp);
    char esc[16];
    if (cp == quote || cp == '\\') {
      jbuf_putc(b, '\\');
      jbuf_putc(b, (char)cp);
    } else if (cp == '\n') {
      jbuf_puts(b, "\\n");
    } else if (cp == '\r') {
      jbuf_puts(b, "\\r");
    } else if (cp == '\t') {
      jbuf_puts(b, "\\t");
    } else if (cp_printable(cp)) {
      jbuf_put(b, s + i, n);
    } else {
      snprintf(esc, sizeof esc,
               cp < 0x100     ? "\\x%02x"
               : cp < 0x10000 ? "\\u%04x"
                              : "\\U%08x",
               (unsigned)cp);
      jbuf_puts(b, esc);
    }
    i += n;
  }
  jbuf_putc(b, quote);
}

static void write_value(jbuf *b, jv v, int repr, int depth) {
  char num[32];
  if (depth > 64) return jbuf_puts(b, "...");
  switch (v.kind) {
  case JV_UNDEF:
    return;
  case JV_NONE:
    return jbuf_puts(b, "None");
  case JV_BOOL:
    return jbuf_puts(b, v.u.b ? "True" : "False");
  case JV_INT:
    snprintf(num, sizeof num, "%lld", (long long)v.u.i);
    return jbuf_puts(b, num);
  case JV_FLOAT:
    return jv_write_float(b, v.u.f);
  case JV_STR:
    if (repr) return write_str_repr(b, v.u.s->data, v.u.s->len);
    return jbuf_put(b, v.u.s->data, v.u.s->len);
  case JV_LIST: {
    const jlist *l = v.u.l;
    jbuf_putc(b, l->is_tuple ? '(' : '[');
    for (size_t i = 0; i < l->n; i++) {
      if (i) jbuf_puts(b, ", ");
      write_value(b, l->items[i], 1, depth + 1);
    }
    if (l->is_tuple && l->n == 1) jbuf_putc(b, ',');
    return jbuf_putc(b, l->is_tuple ? ')' : ']');
  }
  case JV_DICT: {
    const jdict *d = v.u.d;
    if (d->is_namespace) jbuf_puts(b, "<Namespace ");
    jbuf_putc(b, '{');
    for (size_t i = 0; i < d->n; i++) {
      if (i) jbuf_puts(b, ", ");
      write_value(b, d->keys[i], 1, depth + 1);
      jbuf_puts(b, ": ");
      write_value(b, d->vals[i], 1, depth + 1);
    }
    jbuf_putc(b, '}');
    if (d->is_namespace) jbuf_putc(b, '>');
    return;
  }
  case JV_FUNC:
    return jbuf_puts(b, "<function>");
  }
}

void jv_write_str(jbuf *b, jv v) {
  write_value(b, v, 0, 0);
}

void jv_write_repr(jbuf *b, jv v) {
  write_value(b, v, 1, 0);
}

jv jv_to_str(jv v) {
  if (v.kind == JV_STR) return jv_dup(v);
  jbuf b = {0};
  jv_write_str(&b, v);
  return jbuf_take(&b);
}

/* ==== JSON ==== */

static int from_json(ci_jheap *h, const json_t *j, jv *out, int depth) {
  if (depth > 512) return ci_fail("JSON nested too deeply");
  switch (json_typeof(j)) {
  case JSON_OBJECT: {
    jdict *d = jv_new_dict(h, json_object_size(j));
    if (!d) return ci_fail("out of memory converting JSON");
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)j, key, val) {
      jv item;
      if (from_json(h, val, &item, depth + 1)) return CI_ERR;
      jv k = jv_cstr(key);
      if (jv_is_err(k) || jdict_set(h, d, k, item)) return ci_fail("out of memory converting JSON");
    }
    *out = jv_dict(d);
    return CI_OK;
  }
  case JSON_ARRAY: {
    jlist *l = jv_new_list(h, json_array_size(j));
    if (!l) return ci_fail("out of memory converting JSON");
    size_t i;
    json_t *val;
    json_array_foreach(j, i, val) {
      jv item;
      if (from_json(h, val, &item, depth + 1)) return CI_ERR;
      if (jlist_push(h, l, item)) return ci_fail("out of memory converting JSON");
    }
    *out = jv_list(l);
    return CI_OK;
  }
  case JSON_STRING:
    *out = jv_str(json_string_value(j), json_string_length(j));
    return jv_is_err(*out) ? ci_fail("JSON string too long") : CI_OK;
  case JSON_INTEGER:
    *out = jv_int((int64_t)json_integer_value(j));
    return CI_OK;
  case JSON_REAL:
    *out = jv_float(json_real_value(j));
    return CI_OK;
  case JSON_TRUE:
    *out = jv_bool(1);
    return CI_OK;
  case JSON_FALSE:
    *out = jv_bool(0);
    return CI_OK;
  case JSON_NULL:
    *out = jv_none();
    return CI_OK;
  }
  return ci_fail("unknown JSON type");
}

int jv_from_json(ci_jheap *h, const json_t *j, jv *out) {
  return from_json(h, j, out, 0);
}

/* ==== UTF-8 ==== */

size_t ju8_decode(const char *s, size_t len, int32_t *cp) {
  const unsigned char *u = (const unsigned char *)s;
  utf8proc_int32_t c;
  utf8proc_ssize_t n = utf8proc_iterate(u, (utf8proc_ssize_t)(len > 4 ? 4 : len), &c);
  if (n <= 0) {
    *cp = u[0];
    return 1;
  }
  *cp = c;
  return (size_t)n;
}

void ju8_encode(jbuf *b, int32_t cp) {
  utf8proc_uint8_t tmp[4];
  utf8proc_ssize_t n = utf8proc_encode_char(cp, tmp);
  jbuf_put(b, (const char *)tmp, (size_t)n);
}

size_t ju8_count(const char *s, size_t len) {
  size_t n = 0;
  for (size_t i = 0; i < len;) {
    int32_t cp;
    i += ju8_decode(s + i, len - i, &cp);
    n++;
  }
  return n;
}

size_t ju8_offset(const char *s, size_t len, size_t cp_index) {
  size_t i = 0;
  while (cp_index-- > 0 && i < len) {
    int32_t cp;
    i += ju8_decode(s + i, len - i, &cp);
  }
  return i;
}

int ju8_isspace(int32_t cp) {
  if (cp < 0x80) return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20);
  return cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}
