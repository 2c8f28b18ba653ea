/* Regex and literal patterns of tokenizer.json: PCRE2 compiled once (UTF + UCP, JIT), matched with
 * PCRE2_NO_UTF_CHECK because the pipeline validates its input once, and iterated with the
 * empty-match rule of Rust's regex/onig find_iter that HF relies on. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "base/error.h"
#include "text/tok_internal.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tok_regex {
  pcre2_code *code;
};

/* HF compiles Split/Replace regexes with Oniguruma, whose \w is Alphabetic|M|Nd|Pc plus the
 * Latin-1 numbers ² ³ ¹ ¼ ½ ¾ (measured against the reference) and whose \s is White_Space, with
 * U+0085; PCRE2 10.42's UCP \w is L|N|_ and its \s lacks U+0085. Rewrites those escapes
 * into explicit classes (inside a [...] class only the positive forms can be rewritten). */
static int translate_onig(const char *p, size_t n, tok_buf *out) {
  static const char word[] =
      "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}",
                    space[] = "\\s\\x{85}";
  int in_class = 0;
  for (size_t i = 0; i < n; i++) {
    char c = p[i];
    if (c == '\\' && i + 1 < n) {
      char e = p[++i];
      const char *rep = NULL;
      char buf[128];
      if (e == 'w' || e == 's') {
        snprintf(buf, sizeof buf, in_class ? "%s" : "[%s]", e == 'w' ? word : space);
        rep = buf;
      } else if (!in_class && (e == 'W' || e == 'S')) {
        snprintf(buf, sizeof buf, "[^%s]", e == 'W' ? word : space);
        rep = buf;
      }
      if (rep ? tok_buf_append(out, rep, strlen(rep))
              : (tok_buf_append(out, &c, 1) || tok_buf_append(out, &e, 1)))
        return CI_ERR;
      continue;
    }
    if (tok_buf_append(out, &c, 1)) return CI_ERR;
    if (!in_class && c == '[') {
      in_class = 1;
      if (i + 1 < n && p[i + 1] == '^' && tok_buf_append(out, &p[++i], 1)) return CI_ERR;
      if (i + 1 < n && p[i + 1] == ']' && tok_buf_append(out, &p[++i], 1)) return CI_ERR;
    } else if (in_class && c == '[' && i + 1 < n && p[i + 1] == ':') {
      const char *end = memmem(p + i, n - i, ":]", 2); /* POSIX class [:name:] */
      if (end) {
        size_t k = (size_t)(end - p) + 2;
        if (tok_buf_append(out, p + i + 1, k - i - 1)) return CI_ERR;
        i = k - 1;
      }
    } else if (in_class && c == ']') {
      in_class = 0;
    }
  }
  return CI_OK;
}

tok_regex *tok_regex_compile(const char *pattern, size_t len) {
  int err;
  PCRE2_SIZE err_off;
  tok_buf translated = {0};
  if (translate_onig(pattern, len, &translated) || tok_buf_reserve(&translated, 0)) {
    tok_buf_free(&translated);
    return NULL;
  }
  pcre2_code *code = pcre2_compile((PCRE2_SPTR)translated.data, translated.len,
                                   PCRE2_UTF | PCRE2_UCP, &err, &err_off, NULL);
  tok_buf_free(&translated);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    ci_fail("regex '%.*s' does not compile at offset %zu: %s", (int)(len > 200 ? 200 : len),
            pattern, (size_t)err_off, (const char *)msg);
    return NULL;
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE); /* falls back to the interpreter on failure */
  tok_regex *re = malloc(sizeof *re);
  if (!re) {
    pcre2_code_free(code);
    ci_fail("tokenizer: out of memory");
    return NULL;
  }
  re->code = code;
  return re;
}

void tok_regex_free(tok_regex *re) {
  if (!re) return;
  pcre2_code_free(re->code);
  free(re);
}

static size_t char_len_at(const char *s, size_t n, size_t i) {
  uint32_t cp;
  return i < n ? tok_utf8_next(s, n, i, &cp) : 1;
}

static int regex_find_all(const tok_regex *re, const char *s, size_t n, tok_spans *out) {
  pcre2_match_data *md = pcre2_match_data_create_from_pattern(re->code, NULL);
  if (!md) return ci_fail("tokenizer: out of memory");
  size_t pos = 0, last_match_end = (size_t)-1;
  int rc = CI_OK;
  while (pos <= n) {
    int m = pcre2_match(re->code, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
    if (m == PCRE2_ERROR_NOMATCH) break;
    if (m < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(m, msg, sizeof msg);
      rc = ci_fail("regex match failed: %s", (const char *)msg);
      break;
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    size_t start = ov[0], end = ov[1];
    if (start == end && last_match_end == end) {
      pos += char_len_at(s, n, pos);
      continue;
    }
    if (tok_spans_push(out, start, end - start, 0)) {
      rc = CI_ERR;
      break;
    }
    last_match_end = end;
    pos = end;
  }
  pcre2_match_data_free(md);
  return rc;
}

/* Literal search: leftmost non-overlapping occurrences; the empty literal matches at every
 * character boundary, as the escaped empty regex would. */
static int literal_find_all(const tok_pattern *p, const char *s, size_t n, tok_spans *out) {
  if (p->literal_len == 0) {
    for (size_t i = 0; i <= n; i += char_len_at(s, n, i))
      if (tok_spans_push(out, i, 0, 0)) return CI_ERR;
    return CI_OK;
  }
  size_t pos = 0;
  while (pos + p->literal_len <= n) {
    const char *hit = memmem(s + pos, n - pos, p->literal, p->literal_len);
    if (!hit) break;
    size_t at = (size_t)(hit - s);
    if (tok_spans_push(out, at, p->literal_len, 0)) return CI_ERR;
    pos = at + p->literal_len;
  }
  return CI_OK;
}

int tok_pattern_find_all(const tok_pattern *p, const char *s, size_t n, tok_spans *matches) {
  return p->re ? regex_find_all(p->re, s, n, matches) : literal_find_all(p, s, n, matches);
}

int tok_pattern_parse(json_t *j, tok_pattern *out, const char *what) {
  memset(out, 0, sizeof *out);
  if (!json_is_object(j))
    return ci_fail("%s: \"pattern\" must be an object {\"String\": ...} or {\"Regex\": ...}", what);
  json_t *lit = json_object_get(j, "String");
  json_t *rx = json_object_get(j, "Regex");
  if (json_is_string(lit)) {
    size_t len = json_string_length(lit);
    out->literal = malloc(len + 1);
    if (!out->literal) return ci_fail("tokenizer: out of memory");
    memcpy(out->literal, json_string_value(lit), len + 1);
    out->literal_len = len;
    return CI_OK;
  }
  if (json_is_string(rx)) {
    out->re = tok_regex_compile(json_string_value(rx), json_string_length(rx));
    if (!out->re) return ci_fail_context("%s", what);
    return CI_OK;
  }
  return ci_fail("%s: \"pattern\" needs a string \"String\" or \"Regex\" member", what);
}

void tok_pattern_free(tok_pattern *p) {
  free(p->literal);
  tok_regex_free(p->re);
  memset(p, 0, sizeof *p);
}
