/* Python methods templates call on values (str.strip, str.split, dict.items, list.append, ...)
 * and the template globals (range, namespace, dict, raise_exception, strftime_now), as tables
 * looked up by name; plus Python's printf-style `str % args` formatting. */
#include "base/error.h"
#include "text/jinja_eval.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

/* ==== String helpers (shared with the filters through jinja_strings) ==== */

static int want_str(jv v, const char *what) {
  if (v.kind == JV_STR) return CI_OK;
  if (v.kind == JV_UNDEF) return jinja_undefined_error(v);
  return ci_fail("%s must be str, not %s", what, jv_type_name(v));
}

/* Is cp one of the code points of set (UTF-8)? */
static int in_set(int32_t cp, const char *set, size_t len) {
  for (size_t i = 0; i < len;) {
    int32_t other;
    i += ju8_decode(set + i, len - i, &other);
    if (other == cp) return 1;
  }
  return 0;
}

/* Python str.strip/lstrip/rstrip: chars NULL strips whitespace. */
int jinja_strip(jv s, const char *chars, size_t chars_len, int left, int right, jv *out) {
  const char *d = s.u.s->data;
  size_t start = 0, end = s.u.s->len;
  while (left && start < end) {
    int32_t cp;
    size_t n = ju8_decode(d + start, end - start, &cp);
    if (chars ? !in_set(cp, chars, chars_len) : !ju8_isspace(cp)) break;
    start += n;
  }
  while (right && end > start) {
    size_t back = end - 1;
    while (back > start && ((unsigned char)d[back] & 0xc0) == 0x80) back--;
    int32_t cp;
    ju8_decode(d + back, end - back, &cp);
    if (chars ? !in_set(cp, chars, chars_len) : !ju8_isspace(cp)) break;
    end = back;
  }
  *out = jv_str(d + start, end - start);
  return jinja_check_str(*out);
}

static int is_cased(int32_t cp) {
  utf8proc_category_t cat = utf8proc_category(cp);
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

/* Python's str.upper/lower/title/capitalize/swapcase (simple case mappings). */
int jinja_change_case(jv s, int mode, jv *out) {
  jbuf b = {0};
  const char *d = s.u.s->data;
  size_t len = s.u.s->len;
  int prev_cased = 0, first = 1;
  for (size_t i = 0; i < len;) {
    int32_t cp;
    i += ju8_decode(d + i, len - i, &cp);
    int32_t m = cp;
    switch (mode) {
    case CASE_UPPER:
      if (cp == 0xdf) { /* the one full case mapping templates meet: German sharp s */
        jbuf_puts(&b, "SS");
        continue;
      }
      m = utf8proc_toupper(cp);
      break;
    case CASE_LOWER:
      m = utf8proc_tolower(cp);
      break;
    case CASE_TITLE:
      m = prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp);
      prev_cased = is_cased(cp);
      break;
    case CASE_CAPITALIZE:
      m = first ? utf8proc_totitle(cp) : utf8proc_tolower(cp);
      break;
    case CASE_SWAP:
      m = utf8proc_toupper(cp) != cp ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
      break;
    }
    first = 0;
    ju8_encode(&b, m);
  }
  *out = jbuf_take(&b);
  return jinja_check_str(*out);
}

/* Python str.replace(old, new, count). */
int jinja_replace(jv s, jv old, jv repl, int64_t count, jv *out) {
  jbuf b = {0};
  const char *d = s.u.s->data;
  size_t len = s.u.s->len, i = 0;
  int64_t done = 0;
  if (old.u.s->len == 0) {
    /* an empty pattern matches between every character */
    while (count < 0 || done < count) {
      jbuf_put(&b, repl.u.s->data, repl.u.s->len);
      done++;
      if (i >= len) break;
      int32_t cp;
      size_t n = ju8_decode(d + i, len - i, &cp);
      jbuf_put(&b, d + i, n);
      i += n;
    }
    jbuf_put(&b, d + i, len - i);
  } else {
    while (i <= len && (count < 0 || done < count)) {
      const char *hit = memmem(d + i, len - i, old.u.s->data, old.u.s->len);
      if (!hit) break;
      jbuf_put(&b, d + i, (size_t)(hit - (d + i)));
      jbuf_put(&b, repl.u.s->data, repl.u.s->len);
      i = (size_t)(hit - d) + old.u.s->len;
      done++;
    }
    jbuf_put(&b, d + i, len - i);
  }
  *out = jbuf_take(&b);
  return jinja_check_str(*out);
}

static int push_str(ci_jctx *c, jlist *l, const char *s, size_t n) {
  jv v = jv_str(s, n);
  if (jinja_check_str(v)) return CI_ERR;
  if (jlist_push(&c->heap, l, v)) return ci_fail("template exceeded its memory limit");
  return CI_OK;
}

/* Python str.split / rsplit. */
static int split(ci_jctx *c, jv s, jv sep, int64_t maxsplit, int from_right, jv *out) {
  jlist *l = jv_new_list(&c->heap, 0);
  if (!l) return ci_fail("template exceeded its memory limit");
  const char *d = s.u.s->data;
  size_t len = s.u.s->len;
  if (sep.kind == JV_STR) {
    if (sep.u.s->len == 0) return ci_fail("empty separator");
    const char *p = sep.u.s->data;
    size_t pn = sep.u.s->len;
    if (!from_right) {
      size_t i = 0;
      int64_t done = 0;
      for (;;) {
        const char *hit = (maxsplit < 0 || done < maxsplit) ? memmem(d + i, len - i, p, pn) : NULL;
        if (!hit) break;
        if (push_str(c, l, d + i, (size_t)(hit - d) - i)) return CI_ERR;
        i = (size_t)(hit - d) + pn;
        done++;
      }
      if (push_str(c, l, d + i, len - i)) return CI_ERR;
    } else {
      /* collect from the right, then reverse */
      size_t end = len;
      int64_t done = 0;
      while (maxsplit < 0 || done < maxsplit) {
        size_t found = (size_t)-1;
        for (size_t k = end >= pn ? end - pn + 1 : 0; k-- > 0;)
          if (!memcmp(d + k, p, pn)) {
            found = k;
            break;
          }
        if (found == (size_t)-1) break;
        if (push_str(c, l, d + found + pn, end - found - pn)) return CI_ERR;
        end = found;
        done++;
      }
      if (push_str(c, l, d, end)) return CI_ERR;
      for (size_t a = 0, b = l->n - 1; a < b; a++, b--) {
        jv t = l->items[a];
        l->items[a] = l->items[b];
        l->items[b] = t;
      }
    }
  } else {
    /* whitespace runs; leading/trailing whitespace yields no empty strings */
    size_t i = 0;
    int64_t done = 0;
    if (from_right) {
      size_t end = len;
      for (;;) {
        while (end > 0) {
          size_t back = end - 1;
          while (back > 0 && ((unsigned char)d[back] & 0xc0) == 0x80) back--;
          int32_t cp;
          ju8_decode(d + back, end - back, &cp);
          if (!ju8_isspace(cp)) break;
          end = back;
        }
        if (end == 0) break;
        size_t start = end;
        if (maxsplit >= 0 && done >= maxsplit)
          start = 0;
        else {
          while (start > 0) {
            size_t back = start - 1;
            while (back > 0 && ((unsigned char)d[back] & 0xc0) == 0x80) back--;
            int32_t cp;
            ju8_decode(d + back, start - back, &cp);
            if (ju8_isspace(cp)) break;
            start = back;
          }
        }
        if (push_str(c, l, d + start, end - start)) return CI_ERR;
        done++;
        end = start;
        if (start == 0) break;
      }
      for (size_t a = 0, b = l->n ? l->n - 1 : 0; a < b; a++, b--) {
        jv t = l->items[a];
        l->items[a] = l->items[b];
        l->items[b] = t;
      }
    } else {
      for (;;) {
        while (i < len) {
          int32_t cp;
          size_t n = ju8_decode(d + i, len - i, &cp);
          if (!ju8_isspace(cp)) break;
          i += n;
        }
        if (i >= len) break;
        size_t start = i;
        if (maxsplit >= 0 && done >= maxsplit) {
          /* the rest, as is */
          if (push_str(c, l, d + start, len - start)) return CI_ERR;
          break;
        }
        while (i < len) {
          int32_t cp;
          size_t n = ju8_decode(d + i, len - i, &cp);
          if (ju8_isspace(cp)) break;
          i += n;
        }
        if (push_str(c, l, d + start, i - start)) return CI_ERR;
        done++;
      }
    }
  }
  *out = jv_list(l);
  return CI_OK;
}

/* ==== String methods ==== */

#define BIND(names, what)                                                                          \
  jv a[sizeof names / sizeof names[0]];                                                            \
  if (jargs_bind(args, names, sizeof names / sizeof names[0], a, what)) return CI_ERR

static int opt_chars(jv v, const char **chars, size_t *len) {
  *chars = NULL;
  *len = 0;
  if (v.kind == JV_UNDEF || v.kind == JV_NONE) return CI_OK;
  if (want_str(v, "strip argument")) return CI_ERR;
  *chars = v.u.s->data;
  *len = v.u.s->len;
  return CI_OK;
}

static int strip_method(jv self, const jargs *args, int left, int right, jv *out) {
  static const char *const names[] = {"chars"};
  BIND(names, "strip()");
  const char *chars;
  size_t n;
  if (opt_chars(a[0], &chars, &n)) return CI_ERR;
  return jinja_strip(self, chars, n, left, right, out);
}

static int m_strip(ci_jctx *c, jv self, const jargs *args, jv *out) {
  return strip_method(self, args, 1, 1, out);
}
static int m_lstrip(ci_jctx *c, jv self, const jargs *args, jv *out) {
  return strip_method(self, args, 1, 0, out);
}
static int m_rstrip(ci_jctx *c, jv self, const jargs *args, jv *out) {
  return strip_method(self, args, 0, 1, out);
}

static int opt_int(jv v, int64_t fallback, int64_t *out, const char *what) {
  if (v.kind == JV_UNDEF || v.kind == JV_NONE)
    *out = fallback;
  else if (v.kind == JV_INT)
    *out = v.u.i;
  else if (v.kind == JV_BOOL)
    *out = v.u.b;
  else
    return ci_fail("%s must be an integer, not %s", what, jv_type_name(v));
  return CI_OK;
}

static int split_method(ci_jctx *c, jv self, const jargs *args, int from_right, jv *out) {
  static const char *const names[] = {"sep", "maxsplit"};
  BIND(names, "split()");
  int64_t maxsplit = -1;
  if (opt_int(a[1], -1, &maxsplit, "maxsplit")) return CI_ERR;
  if (a[0].kind != JV_UNDEF && a[0].kind != JV_NONE && want_str(a[0], "separator")) return CI_ERR;
  return split(c, self, a[0], maxsplit, from_right, out);
}

static int m_split(ci_jctx *c, jv self, const jargs *args, jv *out) {
  return split_method(c, self, args, 0, out);
}
static int m_rsplit(ci_jctx *c, jv self, const jargs *args, jv *out) {
  return split_method(c, self, args, 1, out);
}

static int m_splitlines(ci_jctx *c, jv self, const jargs *args, jv *out) {
  jlist *l = jv_new_list(&c->heap, 0);
  if (!l) return ci_fail("template exceeded its memory limit");
  const char *d = self.u.s->data;
  size_t len = self.u.s->len, start = 0;
  for (size_t i = 0; i < len;) {
    if (d[i] == '\n' || d[i] == '\r') {
      if (push_str(c, l, d + start, i - start)) return CI_ERR;
      i += d[i] == '\r' && i + 1 < len && d[i + 1] == '\n' ? 2 : 1;
      start = i;
    } else {
      i++;
    }
  }
  if (start < len && push_str(c, l, d + start, len - start)) return CI_ERR;
  *out = jv_list(l);
  return CI_OK;
}

static int affix_method(jv self, const jargs *args, int at_end, jv *out) {
  static const char *const names[] = {"prefix"};
  BIND(names, at_end ? "endswith()" : "startswith()");
  jv p = a[0];
  const jv *cands = &p;
  size_t n = 1;
  if (p.kind == JV_LIST && p.u.l->is_tuple) {
    cands = p.u.l->items;
    n = p.u.l->n;
  }
  int hit = 0;
  for (size_t i = 0; i < n && !hit; i++) {
    if (cands[i].kind != JV_STR)
      return ci_fail("%s arg must be str or a tuple of str, not %s",
                     at_end ? "endswith" : "startswith", jv_type_name(cands[i]));
    size_t k = cands[i].u.s->len;
    if (k > self.u.s->len) continue;
    const char *at = at_end ? self.u.s->data + self.u.s->len - k : self.u.s->data;
    hit = !memcmp(at, cands[i].u.s->data, k);
  }
  *out = jv_bool(hit);
  return CI_OK;
}

static int m_startswith(ci_jctx *c, jv self, const jargs *args, jv *out) {
  return affix_method(self, args, 0, out);
}
static int m_endswith(ci_jctx *c, jv self, const jargs *args, jv *out) {
  return affix_method(self, args, 1, out);
}

static int m_replace(ci_jctx *c, jv self, const jargs *args, jv *out) {
  static const char *const names[] = {"old", "new", "count"};
  BIND(names, "replace()");
  int64_t count = -1;
  if (want_str(a[0], "replace() argument 1") || want_str(a[1], "replace() argument 2") ||
      opt_int(a[2], -1, &count, "count"))
    return CI_ERR;
  return jinja_replace(self, a[0], a[1], count, out);
}

static int m_upper(ci_jctx *c, jv self, const jargs *args, jv *out) {
  return jinja_change_case(self, CASE_UPPER, out);
}
static int m_lower(ci_jctx *c, jv self, const jargs *args, jv *out) {
  return jinja_change_case(self, CASE_LOWER, out);
}
static int m_title(ci_jctx *c, jv self, const jargs *args, jv *out) {
  return jinja_change_case(self, CASE_TITLE, out);
}
static int m_capitalize(ci_jctx *c, jv self, const jargs *args, jv *out) {
  return jinja_change_case(self, CASE_CAPITALIZE, out);
}
static int m_swapcase(ci_jctx *c, jv self, const jargs *args, jv *out) {
  return jinja_change_case(self, CASE_SWAP, out);
}

/* find/rfind/index/count share substring search over code point positions. */
static int search(jv self, const jargs *args, int from_right, int64_t *cp_pos, int64_t *count) {
  static const char *const names[] = {"sub", "start", "end"};
  BIND(names, "find()");
  if (want_str(a[0], "substring")) return CI_ERR;
  int64_t n = (int64_t)ju8_count(self.u.s->data, self.u.s->len), start = 0, end = 0;
  if (opt_int(a[1], 0, &start, "start") || opt_int(a[2], n, &end, "end")) return CI_ERR;
  if (start < 0) start = start + n < 0 ? 0 : start + n;
  if (end < 0) end = end + n < 0 ? 0 : end + n;
  if (end > n) end = n;
  *cp_pos = -1;
  *count = 0;
  if (start > end) return CI_OK;
  size_t bs = ju8_offset(self.u.s->data, self.u.s->len, (size_t)start);
  size_t be = ju8_offset(self.u.s->data, self.u.s->len, (size_t)end);
  const char *d = self.u.s->data, *p = a[0].u.s->data;
  size_t pn = a[0].u.s->len;
  if (pn == 0) {
    *cp_pos = from_right ? end : start;
    *count = end - start + 1;
    return CI_OK;
  }
  if (!from_right) {
    for (size_t i = bs; i + pn <= be;) {
      const char *hit = memmem(d + i, be - i, p, pn);
      if (!hit) break;
      size_t at = (size_t)(hit - d);
      if (*count == 0) *cp_pos = (int64_t)ju8_count(d, at);
      (*count)++;
      i = at + pn;
    }
  } else {
    for (size_t k = be - pn + 1; pn <= be - bs && k-- > bs;)
      if (!memcmp(d + k, p, pn)) {
        *cp_pos = (int64_t)ju8_count(d, k);
        *count = 1;
        break;
      }
  }
  return CI_OK;
}

static int m_find(ci_jctx *c, jv self, const jargs *args, jv *out) {
  int64_t pos, count;
  if (search(self, args, 0, &pos, &count)) return CI_ERR;
  *out = jv_int(pos);
  return CI_OK;
}
static int m_rfind(ci_jctx *c, jv self, const jargs *args, jv *out) {
  int64_t pos, count;
  if (search(self, args, 1, &pos, &count)) return CI_ERR;
  *out = jv_int(pos);
  return CI_OK;
}
static int m_str_index(ci_jctx *c, jv self, const jargs *args, jv *out) {
  int64_t pos, count;
  if (search(self, args, 0, &pos, &count)) return CI_ERR;
  if (pos < 0) return ci_fail("substring not found");
  *out = jv_int(pos);
  return CI_OK;
}
static int m_str_count(ci_jctx *c, jv self, const jargs *args, jv *out) {
  int64_t pos, count;
  if (search(self, args, 0, &pos, &count)) return CI_ERR;
  *out = jv_int(count);
  return CI_OK;
}

static int m_join(ci_jctx *c, jv self, const jargs *args, jv *out) {
  static const char *const names[] = {"iterable"};
  BIND(names, "join()");
  jlist *items;
  if (jinja_iterate(c, a[0], &items)) return CI_ERR;
  jbuf b = {0};
  for (size_t i = 0; i < items->n; i++) {
    if (items->items[i].kind != JV_STR) {
      jbuf_free(&b);
      return ci_fail("sequence item %zu: expected str instance, %s found", i,
                     jv_type_name(items->items[i]));
    }
    if (i) jbuf_put(&b, self.u.s->data, self.u.s->len);
    jbuf_put(&b, items->items[i].u.s->data, items->items[i].u.s->len);
  }
  *out = jbuf_take(&b);
  return jinja_check_str(*out);
}

/* Character-class predicates (isdigit, isalpha, ...): all code points pass and there is one. */
static int all_chars(jv self, int (*pred)(int32_t), jv *out) {
  const char *d = self.u.s->data;
  size_t len = self.u.s->len;
  int ok = len > 0;
  for (size_t i = 0; i < len && ok;) {
    int32_t cp;
    i += ju8_decode(d + i, len - i, &cp);
    ok = pred(cp);
  }
  *out = jv_bool(ok);
  return CI_OK;
}

static int is_digit_cp(int32_t cp) {
  return utf8proc_category(cp) == UTF8PROC_CATEGORY_ND;
}
static int is_alpha_cp(int32_t cp) {
  utf8proc_category_t k = utf8proc_category(cp);
  return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}
static int is_alnum_cp(int32_t cp) {
  utf8proc_category_t k = utf8proc_category(cp);
  return is_alpha_cp(cp) || (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}

static int m_isdigit(ci_jctx *c, jv self, const jargs *args, jv *out) {
  return all_chars(self, is_digit_cp, out);
}
static int m_isalpha(ci_jctx *c, jv self, const jargs *args, jv *out) {
  return all_chars(self, is_alpha_cp, out);
}
static int m_isalnum(ci_jctx *c, jv self, const jargs *args, jv *out) {
  return all_chars(self, is_alnum_cp, out);
}
static int m_isspace(ci_jctx *c, jv self, const jargs *args, jv *out) {
  return all_chars(self, ju8_isspace, out);
}

static int case_pred(jv self, int want_upper, jv *out) {
  const char *d = self.u.s->data;
  size_t len = self.u.s->len;
  int cased = 0, ok = 1;
  for (size_t i = 0; i < len && ok;) {
    int32_t cp;
    i += ju8_decode(d + i, len - i, &cp);
    utf8proc_category_t k = utf8proc_category(cp);
    if (k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT) {
      cased = 1;
      ok = want_upper;
    } else if (k == UTF8PROC_CATEGORY_LL) {
      cased = 1;
      ok = !want_upper;
    }
  }
  *out = jv_bool(ok && cased);
  return CI_OK;
}
static int m_isupper(ci_jctx *c, jv self, const jargs *args, jv *out) {
  return case_pred(self, 1, out);
}
static int m_islower(ci_jctx *c, jv self, const jargs *args, jv *out) {
  return case_pred(self, 0, out);
}

static int affix_remove(jv self, const jargs *args, int at_end, jv *out) {
  static const char *const names[] = {"affix"};
  BIND(names, at_end ? "removesuffix()" : "removeprefix()");
  if (want_str(a[0], "argument")) return CI_ERR;
  size_t k = a[0].u.s->len, len = self.u.s->len;
  const char *d = self.u.s->data;
  if (k <= len && !memcmp(at_end ? d + len - k : d, a[0].u.s->data, k))
    *out = at_end ? jv_str(d, len - k) : jv_str(d + k, len - k);
  else
    *out = jv_dup(self);
  return jinja_check_str(*out);
}
static int m_removeprefix(ci_jctx *c, jv self, const jargs *args, jv *out) {
  return affix_remove(self, args, 0, out);
}
static int m_removesuffix(ci_jctx *c, jv self, const jargs *args, jv *out) {
  return affix_remove(self, args, 1, out);
}

/* str.format: {} {0} {name} fields (format specs are ignored), {{ and }} escapes. */
static int m_format(ci_jctx *c, jv self, const jargs *args, jv *out) {
  jbuf b = {0};
  const char *d = self.u.s->data;
  size_t len = self.u.s->len, auto_index = 0;
  for (size_t i = 0; i < len; i++) {
    if ((d[i] == '{' || d[i] == '}') && i + 1 < len && d[i + 1] == d[i]) {
      jbuf_putc(&b, d[i++]);
      continue;
    }
    if (d[i] == '}') {
      jbuf_free(&b);
      return ci_fail("Single '}' encountered in format string");
    }
    if (d[i] != '{') {
      jbuf_putc(&b, d[i]);
      continue;
    }
    const char *close = memchr(d + i, '}', len - i);
    if (!close) {
      jbuf_free(&b);
      return ci_fail("Single '{' encountered in format string");
    }
    size_t field_len = (size_t)(close - (d + i + 1));
    const char *field = d + i + 1;
    const char *colon = memchr(field, ':', field_len);
    size_t name_len = colon ? (size_t)(colon - field) : field_len;
    const jv *value = NULL;
    if (name_len == 0) {
      if (auto_index < args->n_pos) value = &args->pos[auto_index];
      auto_index++;
    } else if (field[0] >= '0' && field[0] <= '9') {
      size_t idx = (size_t)strtoul(field, NULL, 10);
      if (idx < args->n_pos) value = &args->pos[idx];
    } else {
      for (size_t k = 0; k < args->n_kw; k++)
        if (strlen(args->kw_names[k]) == name_len && !memcmp(args->kw_names[k], field, name_len))
          value = &args->kw[k];
    }
    if (!value) {
      jbuf_free(&b);
      return ci_fail("format(): replacement field '%.*s' has no argument", (int)name_len, field);
    }
    jv_write_str(&b, *value);
    i = (size_t)(close - d);
  }
  *out = jbuf_take(&b);
  return jinja_check_str(*out);
}

/* ==== Dict and list methods ==== */

static int m_items(ci_jctx *c, jv self, const jargs *args, jv *out) {
  const jdict *d = self.u.d;
  jlist *l = jv_new_list(&c->heap, d->n);
  if (!l) return ci_fail("template exceeded its memory limit");
  for (size_t i = 0; i < d->n; i++) {
    jlist *pair = jv_new_list(&c->heap, 2);
    if (!pair) return ci_fail("template exceeded its memory limit");
    pair->is_tuple = 1;
    pair->items[0] = jv_dup(d->keys[i]);
    pair->items[1] = jv_dup(d->vals[i]);
    pair->n = 2;
    l->items[l->n++] = jv_list(pair);
  }
  *out = jv_list(l);
  return CI_OK;
}

static int dict_column(ci_jctx *c, jv self, int values, jv *out) {
  const jdict *d = self.u.d;
  jlist *l = jv_new_list(&c->heap, d->n);
  if (!l) return ci_fail("template exceeded its memory limit");
  for (size_t i = 0; i < d->n; i++) l->items[l->n++] = jv_dup(values ? d->vals[i] : d->keys[i]);
  *out = jv_list(l);
  return CI_OK;
}
static int m_keys(ci_jctx *c, jv self, const jargs *args, jv *out) {
  return dict_column(c, self, 0, out);
}
static int m_values(ci_jctx *c, jv self, const jargs *args, jv *out) {
  return dict_column(c, self, 1, out);
}

static int m_get(ci_jctx *c, jv self, const jargs *args, jv *out) {
  static const char *const names[] = {"key", "default"};
  BIND(names, "get()");
  jv *v = jdict_get_v(self.u.d, a[0]);
  *out = jv_dup(v ? *v : a[1].kind == JV_UNDEF ? jv_none() : a[1]);
  return CI_OK;
}

static int m_append(ci_jctx *c, jv self, const jargs *args, jv *out) {
  static const char *const names[] = {"object"};
  BIND(names, "append()");
  if (args->n_pos + args->n_kw != 1) return ci_fail("append() takes exactly one argument");
  if (jlist_push(&c->heap, self.u.l, jv_dup(a[0])))
    return ci_fail("template exceeded its memory limit");
  *out = jv_none();
  return CI_OK;
}

static int m_list_count(ci_jctx *c, jv self, const jargs *args, jv *out) {
  static const char *const names[] = {"value"};
  BIND(names, "count()");
  int64_t n = 0;
  for (size_t i = 0; i < self.u.l->n; i++) n += jv_equal(self.u.l->items[i], a[0]);
  *out = jv_int(n);
  return CI_OK;
}

static int m_list_index(ci_jctx *c, jv self, const jargs *args, jv *out) {
  static const char *const names[] = {"value"};
  BIND(names, "index()");
  for (size_t i = 0; i < self.u.l->n; i++)
    if (jv_equal(self.u.l->items[i], a[0])) {
      *out = jv_int((int64_t)i);
      return CI_OK;
    }
  return ci_fail("value is not in list");
}

typedef struct {
  jv_kind kind;
  const char *name;
  jbuiltin_fn fn;
  int mutating; /* lists only, refused on tuples */
} method_entry;

static const method_entry methods[] = {
    {JV_STR, "strip", m_strip, 0},
    {JV_STR, "lstrip", m_lstrip, 0},
    {JV_STR, "rstrip", m_rstrip, 0},
    {JV_STR, "split", m_split, 0},
    {JV_STR, "rsplit", m_rsplit, 0},
    {JV_STR, "splitlines", m_splitlines, 0},
    {JV_STR, "startswith", m_startswith, 0},
    {JV_STR, "endswith", m_endswith, 0},
    {JV_STR, "replace", m_replace, 0},
    {JV_STR, "upper", m_upper, 0},
    {JV_STR, "lower", m_lower, 0},
    {JV_STR, "title", m_title, 0},
    {JV_STR, "capitalize", m_capitalize, 0},
    {JV_STR, "swapcase", m_swapcase, 0},
    {JV_STR, "find", m_find, 0},
    {JV_STR, "rfind", m_rfind, 0},
    {JV_STR, "index", m_str_index, 0},
    {JV_STR, "count", m_str_count, 0},
    {JV_STR, "join", m_join, 0},
    {JV_STR, "format", m_format, 0},
    {JV_STR, "isdigit", m_isdigit, 0},
    {JV_STR, "isalpha", m_isalpha, 0},
    {JV_STR, "isalnum", m_isalnum, 0},
    {JV_STR, "isspace", m_isspace, 0},
    {JV_STR, "isupper", m_isupper, 0},
    {JV_STR, "islower", m_islower, 0},
    {JV_STR, "removeprefix", m_removeprefix, 0},
    {JV_STR, "removesuffix", m_removesuffix, 0},
    {JV_DICT, "items", m_items, 0},
    {JV_DICT, "keys", m_keys, 0},
    {JV_DICT, "values", m_values, 0},
    {JV_DICT, "get", m_get, 0},
    {JV_LIST, "append", m_append, 1},
    {JV_LIST, "count", m_list_count, 0},
    {JV_LIST, "index", m_list_index, 0},
};

jbuiltin_fn jinja_method_find(jv self, const char *name) {
  if (self.kind == JV_DICT && self.u.d->is_namespace) return NULL;
  for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
    const method_entry *m = &methods[i];
    if (m->kind == self.kind && !strcmp(m->name, name) &&
        !(m->mutating && self.kind == JV_LIST && self.u.l->is_tuple))
      return m->fn;
  }
  return NULL;
}

/* ==== printf-style `str % args` ==== */

int jinja_str_format(ci_jctx *c, jv fmt, jv args, jv *out) {
  const jv *pos = &args;
  size_t n_pos = 1, next = 0;
  const jdict *mapping = NULL;
  if (args.kind == JV_LIST && args.u.l->is_tuple) {
    pos = args.u.l->items;
    n_pos = args.u.l->n;
  } else if (args.kind == JV_DICT && !args.u.d->is_namespace) {
    mapping = args.u.d;
  }
  jbuf b = {0};
  const char *d = fmt.u.s->data;
  size_t len = fmt.u.s->len;
  int used_mapping = 0;
  for (size_t i = 0; i < len; i++) {
    if (d[i] != '%') {
      jbuf_putc(&b, d[i]);
      continue;
    }
    if (++i >= len) goto incomplete;
    if (d[i] == '%') {
      jbuf_putc(&b, '%');
      continue;
    }
    const jv *value = NULL;
    if (d[i] == '(') {
      const char *close = memchr(d + i, ')', len - i);
      if (!close || !mapping) {
        jbuf_free(&b);
        return ci_fail("format requires a mapping");
      }
      jv *v = jdict_get(mapping, d + i + 1, (size_t)(close - d) - i - 1);
      if (!v) {
        jbuf_free(&b);
        return ci_fail("KeyError: '%.*s'", (int)((size_t)(close - d) - i - 1), d + i + 1);
      }
      value = v;
      used_mapping = 1;
      i = (size_t)(close - d) + 1;
    }
    char spec[32] = "%";
    size_t sn = 1;
    while (i < len && strchr("-+ #0", d[i]) && sn < 8) spec[sn++] = d[i++];
    while (i < len && d[i] >= '0' && d[i] <= '9' && sn < 16) spec[sn++] = d[i++];
    if (i < len && d[i] == '.') {
      spec[sn++] = d[i++];
      while (i < len && d[i] >= '0' && d[i] <= '9' && sn < 24) spec[sn++] = d[i++];
    }
    if (i >= len) goto incomplete;
    char conv = d[i];
    if (!value) {
      if (mapping)
        value = &args;
      else if (next < n_pos)
        value = &pos[next++];
      else {
        jbuf_free(&b);
        return ci_fail("not enough arguments for format string");
      }
    }
    char tmp[512];
    jv v = *value;
    if (conv == 's' || conv == 'r' || conv == 'a') {
      jbuf str = {0};
      if (conv == 's')
        jv_write_str(&str, v);
      else
        jv_write_repr(&str, v);
      spec[sn++] = 's';
      spec[sn] = '\0';
      if (sn == 2)
        jbuf_put(&b, str.data ? str.data : "", str.len);
      else {
        int width = atoi(spec + 1 + (spec[1] == '-'));
        size_t chars = str.data ? ju8_count(str.data, str.len) : 0;
        if (spec[1] != '-')
          for (size_t k = chars; (int)k < width; k++) jbuf_putc(&b, ' ');
        jbuf_put(&b, str.data ? str.data : "", str.len);
        if (spec[1] == '-')
          for (size_t k = chars; (int)k < width; k++) jbuf_putc(&b, ' ');
      }
      jbuf_free(&str);
    } else if (strchr("diouxXeEfFgGc", conv)) {
      if (v.kind != JV_INT && v.kind != JV_BOOL && v.kind != JV_FLOAT) {
        jbuf_free(&b);
        return ci_fail("%%%c format: a real number is required, not %s", conv, jv_type_name(v));
      }
      double f = v.kind == JV_FLOAT ? v.u.f : (double)(v.kind == JV_BOOL ? v.u.b : v.u.i);
      long long i64 = v.kind == JV_FLOAT ? (long long)v.u.f : (v.kind == JV_BOOL ? v.u.b : v.u.i);
      if (strchr("diouxXc", conv)) {
        spec[sn++] = 'l';
        spec[sn++] = 'l';
        spec[sn++] = conv == 'i' || conv == 'u' ? 'd' : conv == 'c' ? 'c' : conv;
        spec[sn] = '\0';
        if (conv == 'c') {
          if (i64 < 0 || i64 > 0x10ffff) {
            jbuf_free(&b);
            return ci_fail("%%c arg not in range(0x110000)");
          }
          ju8_encode(&b, (int32_t)i64);
          continue;
        }
        snprintf(tmp, sizeof tmp, spec, i64);
      } else {
        spec[sn++] = conv;
        spec[sn] = '\0';
        snprintf(tmp, sizeof tmp, spec, f);
      }
      jbuf_puts(&b, tmp);
    } else {
      jbuf_free(&b);
      return ci_fail("unsupported format character '%c'", conv);
    }
  }
  if (!mapping && next < n_pos && !used_mapping) {
    jbuf_free(&b);
    return ci_fail("not all arguments converted during string formatting");
  }
  *out = jbuf_take(&b);
  return jinja_check_str(*out);
incomplete:
  jbuf_free(&b);
  return ci_fail("incomplete format");
}

/* ==== Globals ==== */

enum { MAX_RANGE = 100000 }; /* Jinja2's sandbox limit, which transformers' environment has */

static int g_range(ci_jctx *c, jv self, const jargs *args, jv *out) {
  if (args->n_kw) return ci_fail("range() takes no keyword arguments");
  if (args->n_pos < 1 || args->n_pos > 3)
    return ci_fail("range expected 1 to 3 arguments, got %zu", args->n_pos);
  int64_t v[3] = {0, 0, 1};
  for (size_t i = 0; i < args->n_pos; i++) {
    jv a = args->pos[i];
    if (a.kind != JV_INT && a.kind != JV_BOOL)
      return ci_fail("'%s' object cannot be interpreted as an integer", jv_type_name(a));
    v[args->n_pos == 1 ? 1 : i] = a.kind == JV_BOOL ? a.u.b : a.u.i;
  }
  if (v[2] == 0) return ci_fail("range() arg 3 must not be zero");
  int64_t count = 0;
  if (v[2] > 0 && v[1] > v[0]) count = (v[1] - v[0] - 1) / v[2] + 1;
  if (v[2] < 0 && v[1] < v[0]) count = (v[0] - v[1] - 1) / -v[2] + 1;
  if (count > MAX_RANGE)
    return ci_fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).",
                   MAX_RANGE);
  jlist *l = jv_new_list(&c->heap, (size_t)count);
  if (!l) return ci_fail("template exceeded its memory limit");
  for (int64_t i = 0; i < count; i++) l->items[l->n++] = jv_int(v[0] + i * v[2]);
  *out = jv_list(l);
  return CI_OK;
}

static int kwargs_dict(ci_jctx *c, const jargs *args, int is_namespace, jv *out) {
  if (args->n_pos > 1) return ci_fail("expected at most 1 positional argument");
  jdict *d = jv_new_dict(&c->heap, args->n_kw);
  if (!d) return ci_fail("template exceeded its memory limit");
  d->is_namespace = is_namespace;
  if (args->n_pos == 1) {
    jv init = args->pos[0];
    if (init.kind != JV_DICT) return ci_fail("cannot initialize from %s", jv_type_name(init));
    for (size_t i = 0; i < init.u.d->n; i++)
      if (jdict_set(&c->heap, d, jv_dup(init.u.d->keys[i]), jv_dup(init.u.d->vals[i])))
        return ci_fail("template exceeded its memory limit");
  }
  for (size_t i = 0; i < args->n_kw; i++) {
    jv key = jv_cstr(args->kw_names[i]);
    if (jinja_check_str(key)) return CI_ERR;
    if (jdict_set(&c->heap, d, key, jv_dup(args->kw[i])))
      return ci_fail("template exceeded its memory limit");
  }
  *out = jv_dict(d);
  return CI_OK;
}

static int g_namespace(ci_jctx *c, jv self, const jargs *args, jv *out) {
  return kwargs_dict(c, args, 1, out);
}
static int g_dict(ci_jctx *c, jv self, const jargs *args, jv *out) {
  return kwargs_dict(c, args, 0, out);
}

static int g_raise_exception(ci_jctx *c, jv self, const jargs *args, jv *out) {
  jv msg = args->n_pos ? args->pos[0] : args->n_kw ? args->kw[0] : jv_undef();
  jbuf b = {0};
  jv_write_str(&b, msg);
  int rc = jinja_raise(c, b.data ? b.data : "");
  jbuf_free(&b);
  return rc;
}

static int g_strftime_now(ci_jctx *c, jv self, const jargs *args, jv *out) {
  static const char *const names[] = {"format"};
  BIND(names, "strftime_now()");
  if (want_str(a[0], "format")) return CI_ERR;
  time_t now = time(NULL);
  struct tm tm;
  localtime_r(&now, &tm);
  for (size_t cap = 256; cap <= 65536; cap *= 4) {
    char *buf = malloc(cap);
    if (!buf) return ci_fail("out of memory");
    size_t n = strftime(buf, cap, a[0].u.s->data, &tm);
    if (n > 0 || a[0].u.s->len == 0) {
      *out = jv_str(buf, n);
      free(buf);
      return jinja_check_str(*out);
    }
    free(buf);
  }
  *out = jv_cstr("");
  return jinja_check_str(*out);
}

static const struct {
  const char *name;
  jbuiltin_fn fn;
} globals[] = {
    {"range", g_range},
    {"namespace", g_namespace},
    {"dict", g_dict},
    {"raise_exception", g_raise_exception},
    {"strftime_now", g_strftime_now},
};

jbuiltin_fn jinja_global_find(const char *name) {
  for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++)
    if (!strcmp(globals[i].name, name)) return globals[i].fn;
  return NULL;
}
