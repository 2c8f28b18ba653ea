/* Jinja lexer: splits a template into text and tag tokens the way Jinja2's lexer does with
 * trim_blocks=True and lstrip_blocks=True (what transformers configures), see jinja_lexer.h. */
#include "text/jinja_lexer.h"

#include "base/error.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const char *src; /* normalized source (newlines as \n, one trailing newline dropped) */
  size_t len;
  size_t pos;
  /* incremental offset → line/column */
  size_t lc_off;
  int lc_line, lc_col;
  jtok_list *out;
} lexer;

static void line_col(lexer *lx, size_t off, int *line, int *col) {
  if (off < lx->lc_off) {
    lx->lc_off = 0;
    lx->lc_line = 1;
    lx->lc_col = 1;
  }
  for (; lx->lc_off < off; lx->lc_off++) {
    if (lx->src[lx->lc_off] == '\n') {
      lx->lc_line++;
      lx->lc_col = 1;
    } else {
      lx->lc_col++;
    }
  }
  *line = lx->lc_line;
  *col = lx->lc_col;
}

static int lex_fail(lexer *lx, size_t off, const char *msg) {
  int line, col;
  line_col(lx, off, &line, &col);
  return ci_fail("line %d, column %d: %s", line, col, msg);
}

static int push(lexer *lx, jtok_kind kind, size_t off, const char *text, size_t len) {
  jtok_list *l = lx->out;
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 64;
    jtok *toks = realloc(l->toks, cap * sizeof *toks);
    if (!toks) return ci_fail("out of memory tokenizing the template");
    l->toks = toks;
    l->cap = cap;
  }
  jtok *t = &l->toks[l->n];
  memset(t, 0, sizeof *t);
  t->kind = kind;
  line_col(lx, off, &t->line, &t->col);
  if (text) {
    t->text = malloc(len + 1);
    if (!t->text) return ci_fail("out of memory tokenizing the template");
    memcpy(t->text, text, len);
    t->text[len] = '\0';
    t->len = len;
  }
  l->n++;
  return CI_OK;
}

static int is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Emits the text before a tag, applying {%- / {{- stripping or lstrip_blocks. */
static int emit_text(lexer *lx, size_t start, size_t end, char modifier, int is_var,
                     int line_starting) {
  const char *t = lx->src + start;
  size_t n = end - start;
  if (modifier == '-') {
    while (n && is_ws(t[n - 1])) n--;
  } else if (modifier != '+' && !is_var) {
    size_t l_pos = n;
    while (l_pos && t[l_pos - 1] != '\n') l_pos--;
    if ((l_pos > 0 || line_starting) && l_pos < n) {
      size_t i = l_pos;
      while (i < n && is_ws(t[i])) i++;
      if (i == n) n = l_pos;
    }
  }
  return n ? push(lx, JT_TEXT, start, t, n) : CI_OK;
}

/* After a closing delimiter ending at lx->pos: '-' strips all following whitespace, plain block
 * ends drop one newline (trim_blocks). Returns whether the consumed end finished a line. */
static int after_end(lexer *lx, char modifier, int is_block) {
  int ended_line = 0;
  if (modifier == '-') {
    while (lx->pos < lx->len && is_ws(lx->src[lx->pos])) ended_line = lx->src[lx->pos++] == '\n';
  } else if (modifier != '+' && is_block && lx->pos < lx->len && lx->src[lx->pos] == '\n') {
    lx->pos++;
    ended_line = 1;
  }
  return ended_line;
}

static int hexval(char c) {
  return isdigit((unsigned char)c) ? c - '0'
         : c >= 'a' && c <= 'f'    ? c - 'a' + 10
         : c >= 'A' && c <= 'F'    ? c - 'A' + 10
                                   : -1;
}

static void put_utf8(char *out, size_t *n, uint32_t cp) {
  if (cp > 0x10ffff) cp = 0xfffd;
  if (cp < 0x80) {
    out[(*n)++] = (char)cp;
  } else if (cp < 0x800) {
    out[(*n)++] = (char)(0xc0 | (cp >> 6));
    out[(*n)++] = (char)(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out[(*n)++] = (char)(0xe0 | (cp >> 12));
    out[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[(*n)++] = (char)(0x80 | (cp & 0x3f));
  } else {
    out[(*n)++] = (char)(0xf0 | (cp >> 18));
    out[(*n)++] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[(*n)++] = (char)(0x80 | (cp & 0x3f));
  }
}

/* A quoted string literal at lx->pos, decoded like Python's unicode-escape. */
static int lex_string(lexer *lx) {
  size_t start = lx->pos;
  char quote = lx->src[lx->pos++];
  size_t end = lx->pos;
  while (end < lx->len && lx->src[end] != quote) end += lx->src[end] == '\\' ? 2 : 1;
  if (end >= lx->len) return lex_fail(lx, start, "unterminated string literal");
  char *buf = malloc(end - lx->pos + 1);
  if (!buf) return ci_fail("out of memory tokenizing the template");
  size_t n = 0;
  for (size_t i = lx->pos; i < end; i++) {
    char c = lx->src[i];
    if (c != '\\') {
      buf[n++] = c;
      continue;
    }
    char e = lx->src[++i];
    static const char simple_from[] = "nrt\\'\"abfv\n";
    static const char simple_to[] = "\n\r\t\\'\"\a\b\f\v";
    const char *hit = strchr(simple_from, e);
    if (hit && e) {
      if (e != '\n') buf[n++] = simple_to[hit - simple_from]; /* backslash-newline: nothing */
      continue;
    }
    int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
    if (digits) {
      uint32_t cp = 0;
      int k = 0;
      for (; k < digits && i + 1 + k < end && hexval(lx->src[i + 1 + k]) >= 0; k++)
        cp = cp * 16 + (uint32_t)hexval(lx->src[i + 1 + k]);
      if (k != digits) {
        free(buf);
        return lex_fail(lx, i - 1, "truncated \\x, \\u or \\U escape in string literal");
      }
      i += (size_t)digits;
      put_utf8(buf, &n, cp);
      continue;
    }
    if (e >= '0' && e <= '7') {
      uint32_t cp = 0;
      int k = 0;
      for (; k < 3 && i + k < end && lx->src[i + k] >= '0' && lx->src[i + k] <= '7'; k++)
        cp = cp * 8 + (uint32_t)(lx->src[i + k] - '0');
      i += (size_t)k - 1;
      put_utf8(buf, &n, cp);
      continue;
    }
    buf[n++] = '\\'; /* unknown escapes are kept as written */
    buf[n++] = e;
  }
  int rc = push(lx, JT_STRING, start, buf, n);
  free(buf);
  lx->pos = end + 1;
  return rc;
}

static int lex_number(lexer *lx) {
  size_t start = lx->pos, i = lx->pos;
  char digits[128];
  size_t n = 0;
  int is_float = 0;
#define TAKE_DIGITS()                                                                              \
  while (i < lx->len &&                                                                            \
         (isdigit((unsigned char)lx->src[i]) ||                                                    \
          (lx->src[i] == '_' && i + 1 < lx->len && isdigit((unsigned char)lx->src[i + 1])))) {     \
    if (lx->src[i] != '_' && n < sizeof digits - 8) digits[n++] = lx->src[i];                      \
    i++;                                                                                           \
  }
  TAKE_DIGITS();
  if (i + 1 < lx->len && lx->src[i] == '.' && isdigit((unsigned char)lx->src[i + 1])) {
    is_float = 1;
    digits[n++] = lx->src[i++];
    TAKE_DIGITS();
  }
  if (i < lx->len && (lx->src[i] == 'e' || lx->src[i] == 'E')) {
    size_t j = i + 1;
    if (j < lx->len && (lx->src[j] == '+' || lx->src[j] == '-')) j++;
    if (j < lx->len && isdigit((unsigned char)lx->src[j])) {
      is_float = 1;
      digits[n++] = 'e';
      if (lx->src[i + 1] == '-') digits[n++] = '-';
      i = j;
      TAKE_DIGITS();
    }
  }
#undef TAKE_DIGITS
  digits[n] = '\0';
  if (push(lx, is_float ? JT_FLOAT : JT_INT, start, NULL, 0)) return CI_ERR;
  jtok *t = &lx->out->toks[lx->out->n - 1];
  if (is_float) {
    t->f = strtod(digits, NULL);
  } else {
    char *endp;
    unsigned long long v = strtoull(digits, &endp, 10);
    if (n > 19 || v > (unsigned long long)INT64_MAX)
      return lex_fail(lx, start, "integer literal too large");
    t->i = (int64_t)v;
  }
  lx->pos = i;
  return CI_OK;
}

static const char *const operators[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "*",
                                        "/",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                        "<",  ">",  "=",  ".",  ":",  "|",  ",", ";"};

/* Lexes the inside of a {{ }} or {% %} tag up to its end delimiter. Returns the end modifier
 * ('-', '+' or 0) in *modifier. */
static int lex_tag(lexer *lx, int is_block, size_t tag_start, char *modifier) {
  const char *close = is_block ? "%}" : "}}";
  int depth = 0;
  for (;;) {
    while (lx->pos < lx->len && is_ws(lx->src[lx->pos])) lx->pos++;
    if (lx->pos >= lx->len)
      return lex_fail(lx, tag_start,
                      is_block ? "unclosed tag: expected '%}' before the end"
                               : "unclosed tag: expected '}}' before the end");
    const char *p = lx->src + lx->pos;
    size_t left = lx->len - lx->pos;
    if (depth == 0) {
      if (left >= 3 && (p[0] == '-' || (p[0] == '+' && is_block)) && !memcmp(p + 1, close, 2)) {
        *modifier = p[0];
        size_t at = lx->pos;
        lx->pos += 3;
        return push(lx, is_block ? JT_BLOCK_END : JT_VAR_END, at, NULL, 0);
      }
      if (left >= 2 && !memcmp(p, close, 2)) {
        *modifier = 0;
        size_t at = lx->pos;
        lx->pos += 2;
        return push(lx, is_block ? JT_BLOCK_END : JT_VAR_END, at, NULL, 0);
      }
    }
    char c = p[0];
    if (isalpha((unsigned char)c) || c == '_') {
      size_t n = 1;
      while (n < left && (isalnum((unsigned char)p[n]) || p[n] == '_')) n++;
      if (push(lx, JT_NAME, lx->pos, p, n)) return CI_ERR;
      lx->pos += n;
    } else if (isdigit((unsigned char)c)) {
      if (lex_number(lx)) return CI_ERR;
    } else if (c == '\'' || c == '"') {
      if (lex_string(lx)) return CI_ERR;
    } else {
      size_t k = 0;
      for (; k < sizeof operators / sizeof operators[0]; k++) {
        size_t n = strlen(operators[k]);
        if (left >= n && !memcmp(p, operators[k], n)) break;
      }
      if (k == sizeof operators / sizeof operators[0]) {
        char msg[64];
        if ((unsigned char)c >= 0x20 && (unsigned char)c < 0x7f)
          snprintf(msg, sizeof msg, "unexpected character '%c'", c);
        else
          snprintf(msg, sizeof msg, "unexpected byte 0x%02x", (unsigned char)c);
        return lex_fail(lx, lx->pos, msg);
      }
      const char *op = operators[k];
      if (strchr("([{", op[0])) depth++;
      if (strchr(")]}", op[0]) && depth > 0) depth--;
      if (push(lx, JT_OP, lx->pos, op, strlen(op))) return CI_ERR;
      lx->pos += strlen(op);
    }
  }
}

/* {% raw %} ... {% endraw %}: if the tag at `tag_start` (already past '{%' and its modifier) is a
 * raw tag, emits its body as text and returns 1; 0 if it is not a raw tag; -1 on error. */
static int lex_raw(lexer *lx, size_t body_start, int *line_starting) {
  size_t i = body_start;
  while (i < lx->len && is_ws(lx->src[i])) i++;
  if (lx->len - i < 3 || memcmp(lx->src + i, "raw", 3)) return 0;
  i += 3;
  while (i < lx->len && is_ws(lx->src[i])) i++;
  char open_mod = 0;
  if (i < lx->len && lx->src[i] == '-') open_mod = lx->src[i++];
  if (lx->len - i < 2 || memcmp(lx->src + i, "%}", 2)) return 0;
  lx->pos = i + 2;
  int ended = after_end(lx, open_mod, 1);
  /* find {% endraw %} */
  for (size_t s = lx->pos; s + 1 < lx->len; s++) {
    if (lx->src[s] != '{' || lx->src[s + 1] != '%') continue;
    size_t j = s + 2;
    char mod = 0;
    if (j < lx->len && (lx->src[j] == '-' || lx->src[j] == '+')) mod = lx->src[j++];
    while (j < lx->len && is_ws(lx->src[j])) j++;
    if (lx->len - j < 6 || memcmp(lx->src + j, "endraw", 6)) continue;
    j += 6;
    while (j < lx->len && is_ws(lx->src[j])) j++;
    char end_mod = 0;
    if (j < lx->len && (lx->src[j] == '-' || lx->src[j] == '+')) end_mod = lx->src[j++];
    if (lx->len - j < 2 || memcmp(lx->src + j, "%}", 2)) continue;
    if (emit_text(lx, lx->pos, s, mod, 0, ended)) return -1;
    lx->pos = j + 2;
    *line_starting = after_end(lx, end_mod, 1);
    return 1;
  }
  lex_fail(lx, body_start, "unclosed {% raw %} block");
  return -1;
}

static int tokenize(lexer *lx) {
  int line_starting = 1;
  while (lx->pos < lx->len) {
    /* the next tag opener */
    size_t start = lx->pos;
    const char *hit = NULL;
    for (size_t i = lx->pos; i + 1 < lx->len; i++) {
      if (lx->src[i] == '{' &&
          (lx->src[i + 1] == '{' || lx->src[i + 1] == '%' || lx->src[i + 1] == '#')) {
        hit = lx->src + i;
        break;
      }
    }
    if (!hit) {
      if (push(lx, JT_TEXT, start, lx->src + start, lx->len - start)) return CI_ERR;
      lx->pos = lx->len;
      break;
    }
    size_t tag = (size_t)(hit - lx->src);
    char kind = hit[1];
    char modifier = 0;
    if (tag + 2 < lx->len && (hit[2] == '-' || hit[2] == '+')) modifier = hit[2];
    size_t body = tag + 2 + (modifier ? 1 : 0);
    if (kind == '%') {
      size_t save = lx->pos;
      lx->pos = body;
      /* raw blocks are text up to {% endraw %}; the text before the tag is emitted first */
      size_t i = body;
      while (i < lx->len && is_ws(lx->src[i])) i++;
      if (lx->len - i >= 3 && !memcmp(lx->src + i, "raw", 3) &&
          (lx->len - i == 3 ||
           !(isalnum((unsigned char)lx->src[i + 3]) || lx->src[i + 3] == '_'))) {
        if (emit_text(lx, start, tag, modifier, 0, line_starting)) return CI_ERR;
        int r = lex_raw(lx, body, &line_starting);
        if (r < 0) return CI_ERR;
        if (r == 1) continue;
      }
      lx->pos = save;
    }
    if (emit_text(lx, start, tag, modifier, kind == '{', line_starting)) return CI_ERR;
    if (kind == '#') {
      size_t i = body;
      while (i + 1 < lx->len && !(lx->src[i] == '#' && lx->src[i + 1] == '}')) i++;
      if (i + 1 >= lx->len) return lex_fail(lx, tag, "unclosed comment: expected '#}'");
      char end_mod =
          i > body && (lx->src[i - 1] == '-' || lx->src[i - 1] == '+') ? lx->src[i - 1] : 0;
      lx->pos = i + 2;
      line_starting = after_end(lx, end_mod, 1);
      continue;
    }
    int is_block = kind == '%';
    if (push(lx, is_block ? JT_BLOCK_BEGIN : JT_VAR_BEGIN, tag, NULL, 0)) return CI_ERR;
    lx->pos = body;
    char end_mod = 0;
    if (lex_tag(lx, is_block, tag, &end_mod)) return CI_ERR;
    line_starting = after_end(lx, end_mod, is_block);
  }
  return push(lx, JT_EOF, lx->len, NULL, 0);
}

int ci_jinja_tokenize(const char *source, size_t len, jtok_list *out) {
  memset(out, 0, sizeof *out);
  char *src = malloc(len + 1);
  if (!src) return ci_fail("out of memory tokenizing the template");
  /* Jinja2 normalizes \r\n and \r to \n and drops one trailing newline. */
  size_t n = 0;
  for (size_t i = 0; i < len; i++) {
    if (source[i] == '\r') {
      src[n++] = '\n';
      if (i + 1 < len && source[i + 1] == '\n') i++;
    } else {
      src[n++] = source[i];
    }
  }
  if (n && src[n - 1] == '\n') n--;
  src[n] = '\0';
  lexer lx = {.src = src, .len = n, .lc_line = 1, .lc_col = 1, .out = out};
  int rc = tokenize(&lx);
  free(src);
  return rc;
}

void ci_jinja_tokens_free(jtok_list *list) {
  for (size_t i = 0; i < list->n; i++) free(list->toks[i].text);
  free(list->toks);
  memset(list, 0, sizeof *list);
}
