/* tojson: Python's json.dumps(x, ensure_ascii, indent, separators, sort_keys) byte for byte, as
 * transformers' tojson filter calls it (ensure_ascii=False by default, ", " and ": " separators
 * without indent, "," with one). */
#include "base/error.h"
#include "text/jinja_eval.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  ci_jctx *c;
  const char *indent; /* NULL: compact */
  const char *item_sep, *key_sep;
  int ensure_ascii, sort_keys;
  jbuf *out;
} json_writer;

static void write_json_string(json_writer *w, const char *s, size_t len) {
  jbuf *b = w->out;
  jbuf_putc(b, '"');
  size_t run = 0; /* start of the pending unescaped run */
  for (size_t i = 0; i < len;) {
    unsigned char ch = (unsigned char)s[i];
    const char *esc = NULL;
    char hex[16];
    size_t n = 1;
    switch (ch) {
    case '"':
      esc = "\\\"";
      break;
    case '\\':
      esc = "\\\\";
      break;
    case '\n':
      esc = "\\n";
      break;
    case '\r':
      esc = "\\r";
      break;
    case '\t':
      esc = "\\t";
      break;
    case '\b':
      esc = "\\b";
      break;
    case '\f':
      esc = "\\f";
      break;
    default:
      if (ch < 0x20 || (w->ensure_ascii && ch == 0x7f)) {
        snprintf(hex, sizeof hex, "\\u%04x", ch);
        esc = hex;
      } else if (ch >= 0x80 && w->ensure_ascii) {
        int32_t cp;
        n = ju8_decode(s + i, len - i, &cp);
        if (cp >= 0x10000) {
          cp -= 0x10000;
          snprintf(hex, sizeof hex, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
        } else {
          snprintf(hex, sizeof hex, "\\u%04x", (unsigned)cp);
        }
        esc = hex;
      }
    }
    if (esc) {
      jbuf_put(b, s + run, i - run);
      jbuf_puts(b, esc);
      run = i + n;
    }
    i += n;
  }
  jbuf_put(b, s + run, len - run);
  jbuf_putc(b, '"');
}

static void write_newline(json_writer *w, int level) {
  jbuf_putc(w->out, '\n');
  for (int i = 0; i < level; i++) jbuf_puts(w->out, w->indent);
}

static int write_number_or_const(json_writer *w, jv v) {
  char num[32];
  switch (v.kind) {
  case JV_NONE:
    jbuf_puts(w->out, "null");
    return 1;
  case JV_BOOL:
    jbuf_puts(w->out, v.u.b ? "true" : "false");
    return 1;
  case JV_INT:
    snprintf(num, sizeof num, "%lld", (long long)v.u.i);
    jbuf_puts(w->out, num);
    return 1;
  case JV_FLOAT:
    if (isnan(v.u.f))
      jbuf_puts(w->out, "NaN");
    else if (isinf(v.u.f))
      jbuf_puts(w->out, v.u.f > 0 ? "Infinity" : "-Infinity");
    else
      jv_write_float(w->out, v.u.f);
    return 1;
  default:
    return 0;
  }
}

/* Dict keys as json.dumps converts them: str as is; int, float, bool, None to their JSON text. */
static int key_text(json_writer *w, jv key, jbuf *text) {
  if (key.kind == JV_STR) {
    jbuf_put(text, key.u.s->data, key.u.s->len);
    return CI_OK;
  }
  jbuf *saved = w->out;
  w->out = text;
  int ok = write_number_or_const(w, key);
  w->out = saved;
  if (!ok) return ci_fail("keys must be str, int, float, bool or None, not %s", jv_type_name(key));
  return CI_OK;
}

static int write_json(json_writer *w, jv v, int level);

static int cmp_keys(const void *a, const void *b) {
  const jbuf *x = a, *y = b;
  size_t n = x->len < y->len ? x->len : y->len;
  int c = n ? memcmp(x->data, y->data, n) : 0;
  return c ? c : (x->len > y->len) - (x->len < y->len);
}

typedef struct {
  jbuf key; /* must stay first: cmp_keys compares entries as jbufs */
  size_t index;
} sorted_entry;

static int write_dict(json_writer *w, const jdict *d, int level) {
  if (d->n == 0) {
    jbuf_puts(w->out, "{}");
    return CI_OK;
  }
  sorted_entry *entries = calloc(d->n, sizeof *entries);
  if (!entries) return ci_fail("out of memory");
  int rc = CI_OK;
  for (size_t i = 0; i < d->n && rc == CI_OK; i++) {
    entries[i].index = i;
    rc = key_text(w, d->keys[i], &entries[i].key);
    if (rc == CI_OK && !entries[i].key.data) entries[i].key.data = calloc(1, 1);
    if (rc == CI_OK && !entries[i].key.data) rc = ci_fail("out of memory");
  }
  if (rc == CI_OK && w->sort_keys) {
    for (size_t i = 0; i < d->n; i++)
      if (d->keys[i].kind != d->keys[0].kind)
        rc = ci_fail("'<' not supported between instances of '%s' and '%s'",
                     jv_type_name(d->keys[i]), jv_type_name(d->keys[0]));
    if (rc == CI_OK) qsort(entries, d->n, sizeof *entries, cmp_keys);
  }
  if (rc == CI_OK) {
    jbuf_putc(w->out, '{');
    for (size_t i = 0; i < d->n && rc == CI_OK; i++) {
      if (i) jbuf_puts(w->out, w->item_sep);
      if (w->indent) write_newline(w, level + 1);
      write_json_string(w, entries[i].key.data, entries[i].key.len);
      jbuf_puts(w->out, w->key_sep);
      rc = write_json(w, d->vals[entries[i].index], level + 1);
    }
    if (w->indent) write_newline(w, level);
    jbuf_putc(w->out, '}');
  }
  for (size_t i = 0; i < d->n; i++) jbuf_free(&entries[i].key);
  free(entries);
  return rc;
}

static int write_json(json_writer *w, jv v, int level) {
  if (level > 256) return ci_fail("tojson: value nested too deeply (or circular)");
  if (write_number_or_const(w, v)) return CI_OK;
  switch (v.kind) {
  case JV_STR:
    write_json_string(w, v.u.s->data, v.u.s->len);
    return CI_OK;
  case JV_LIST: {
    const jlist *l = v.u.l;
    if (l->n == 0) {
      jbuf_puts(w->out, "[]");
      return CI_OK;
    }
    jbuf_putc(w->out, '[');
    for (size_t i = 0; i < l->n; i++) {
      if (i) jbuf_puts(w->out, w->item_sep);
      if (w->indent) write_newline(w, level + 1);
      if (write_json(w, l->items[i], level + 1)) return CI_ERR;
    }
    if (w->indent) write_newline(w, level);
    jbuf_putc(w->out, ']');
    return CI_OK;
  }
  case JV_DICT:
    if (!v.u.d->is_namespace) return write_dict(w, v.u.d, level);
    break;
  default:
    break;
  }
  return ci_fail("Object of type %s is not JSON serializable", jv_type_name(v));
}

int jinja_tojson(ci_jctx *c, jv v, int indent, const char *indent_str, const char *item_sep,
                 const char *key_sep, int ensure_ascii, int sort_keys, jbuf *out) {
  char spaces[256];
  const char *ind = indent_str;
  if (!ind && indent >= 0) {
    int n = indent < (int)sizeof spaces - 1 ? indent : (int)sizeof spaces - 1;
    memset(spaces, ' ', (size_t)n);
    spaces[n] = '\0';
    ind = spaces;
  }
  json_writer w = {
      .c = c,
      .indent = ind,
      .item_sep = item_sep ? item_sep
                  : ind    ? ","
                           : ", ",
      .key_sep = key_sep ? key_sep : ": ",
      .ensure_ascii = ensure_ascii,
      .sort_keys = sort_keys,
      .out = out,
  };
  return write_json(&w, v, 0);
}
