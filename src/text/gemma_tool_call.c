/* Gemma 4 tool-call segments to JSON calls (see gemma_tool_call.h). The value converter rewrites
 * the Gemma text into JSON text in one pass — <|"|> strings re-emitted JSON-escaped, bare keys
 * quoted, everything else copied — and lets jansson parse the result. */
#include "text/gemma_tool_call.h"

#include <stdlib.h>
#include <string.h>

static const char quote[] = CI_GEMMA_STRING_QUOTE;
enum { QUOTE_LEN = sizeof quote - 1, MAX_DEPTH = 64 };
#define OPEN ((size_t)-1) /* a string or brace that never closes */

/* ==== A growable output buffer ==== */

typedef struct {
  char *data;
  size_t len, cap;
  int oom;
} out_buf;

static void put(out_buf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *bigger = realloc(b->data, cap);
    if (!bigger) {
      b->oom = 1;
      return;
    }
    b->data = bigger;
    b->cap = cap;
  }
  memcpy(b->data + b->len, s, n);
  b->len += n;
  b->data[b->len] = '\0';
}

static void put_char(out_buf *b, char c) {
  put(b, &c, 1);
}

/* Appends text as a JSON string literal (quotes included). */
static void put_json_string(out_buf *b, const char *s, size_t n) {
  json_t *str = json_stringn(s, n);
  char *enc = str ? json_dumps(str, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
  json_decref(str);
  if (!enc) {
    b->oom = 1; /* invalid UTF-8 or out of memory: the value does not parse */
    return;
  }
  put(b, enc, strlen(enc));
  free(enc);
}

/* ==== Scanning helpers ==== */

static int is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static int at_quote(const char *text, size_t len, size_t i) {
  return i + QUOTE_LEN <= len && !memcmp(text + i, quote, QUOTE_LEN);
}

/* Position of the next <|"|> at or after i, or len. */
static size_t find_quote(const char *text, size_t len, size_t i) {
  for (; i + QUOTE_LEN <= len; i++)
    if (!memcmp(text + i, quote, QUOTE_LEN)) return i;
  return len;
}

/* End of a JSON "..." string starting at i (the index after its closing quote), or OPEN. */
static size_t json_string_end(const char *text, size_t len, size_t i) {
  for (i++; i < len; i++) {
    if (text[i] == '\\')
      i++;
    else if (text[i] == '"')
      return i + 1;
  }
  return OPEN;
}

/* Whether word is a JSON number or literal. */
static int is_json_scalar(const char *word, size_t n) {
  json_t *v = json_loadb(word, n, JSON_DECODE_ANY, NULL);
  const int ok = v && (json_is_number(v) || json_is_boolean(v) || json_is_null(v));
  json_decref(v);
  return ok;
}

/* Drops trailing whitespace and one trailing comma from the output (truncated text). */
static void trim_dangling(out_buf *b) {
  while (b->len && is_space(b->data[b->len - 1])) b->len--;
  if (b->len && b->data[b->len - 1] == ',') b->len--;
  while (b->len && is_space(b->data[b->len - 1])) b->len--;
  if (b->data) b->data[b->len] = '\0';
}

/* ==== Values ==== */

json_t *ci_gemma_value_to_json(const char *text, size_t len, int truncated) {
  out_buf b = {0};
  char stack[MAX_DEPTH];
  int depth = 0, expect_key = 0, ok = 1;
  size_t i = 0;
  while (ok && i < len && !b.oom) {
    const char c = text[i];
    if (at_quote(text, len, i)) {
      const size_t start = i + QUOTE_LEN, end = find_quote(text, len, start);
      if (end == len && !truncated) {
        ok = 0;
        break;
      }
      put_json_string(&b, text + start, end - start);
      i = end == len ? len : end + QUOTE_LEN;
      expect_key = 0;
    } else if (c == '"') {
      const size_t end = json_string_end(text, len, i);
      if (end == OPEN) {
        if (!truncated) {
          ok = 0;
          break;
        }
        size_t n = len - i;
        if (text[len - 1] == '\\') n--; /* a cut escape */
        put(&b, text + i, n);
        put_char(&b, '"');
        i = len;
      } else {
        put(&b, text + i, end - i);
        i = end;
      }
      expect_key = 0;
    } else if (c == '{' || c == '[') {
      if (depth == MAX_DEPTH) {
        ok = 0;
        break;
      }
      stack[depth++] = c;
      put_char(&b, c);
      expect_key = c == '{';
      i++;
    } else if (c == '}' || c == ']') {
      if (!depth || stack[depth - 1] != (c == '}' ? '{' : '[')) {
        ok = 0;
        break;
      }
      depth--;
      trim_dangling(&b); /* a trailing comma before the close */
      put_char(&b, c);
      expect_key = 0;
      i++;
    } else if (c == ',') {
      put_char(&b, c);
      expect_key = depth && stack[depth - 1] == '{';
      i++;
    } else if (c == ':' || is_space(c)) {
      put_char(&b, c);
      i++;
    } else if (expect_key) { /* a bare key, up to its ':' */
      size_t end = i;
      while (end < len && text[end] != ':' && text[end] != '}' && !at_quote(text, len, end)) end++;
      if (end == len && truncated) { /* a key cut before its ':' */
        i = len;
        break;
      }
      if (end == len || text[end] != ':') {
        ok = 0;
        break;
      }
      size_t key_end = end;
      while (key_end > i && is_space(text[key_end - 1])) key_end--;
      put_json_string(&b, text + i, key_end - i);
      expect_key = 0;
      i = end;
    } else { /* a number, literal or bare word */
      size_t end = i;
      while (end < len && !strchr(",}]:", text[end]) && !is_space(text[end]) &&
             !at_quote(text, len, end))
        end++;
      if (is_json_scalar(text + i, end - i))
        put(&b, text + i, end - i);
      else
        put_json_string(&b, text + i, end - i);
      i = end;
    }
  }
  if (ok && depth && truncated) {
    trim_dangling(&b);
    if (b.len && b.data[b.len - 1] == ':') put(&b, "null", 4);
    while (depth) put_char(&b, stack[--depth] == '{' ? '}' : ']');
  }
  json_t *value = ok && !b.oom && b.len ? json_loadb(b.data, b.len, JSON_DECODE_ANY, NULL) : NULL;
  free(b.data);
  return value;
}

/* ==== Segments ==== */

/* Index just after the '}' closing the '{' at i, skipping strings; OPEN when it never closes. */
static size_t matching_brace(const char *text, size_t len, size_t i) {
  int depth = 0;
  while (i < len) {
    if (at_quote(text, len, i)) {
      const size_t end = find_quote(text, len, i + QUOTE_LEN);
      i = end == len ? len : end + QUOTE_LEN;
    } else if (text[i] == '"') {
      i = json_string_end(text, len, i);
      if (i == OPEN) return OPEN;
    } else {
      if (text[i] == '{') depth++;
      if (text[i] == '}' && --depth == 0) return i + 1;
      i++;
    }
  }
  return OPEN;
}

static int tool_declared(const json_t *tools, const char *name) {
  if (json_array_size(tools) == 0) return 1;
  size_t i;
  const json_t *tool;
  json_array_foreach(tools, i, tool) {
    const json_t *fn = json_object_get(tool, "function");
    const char *tool_name = json_string_value(json_object_get(fn ? fn : tool, "name"));
    if (tool_name && !strcmp(tool_name, name)) return 1;
  }
  return 0;
}

/* Parses one `call:NAME{...}` at *pos; appends it to calls. Returns 0 or -1. */
static int parse_call(const json_t *tools, const char *text, size_t len, int truncated, size_t *pos,
                      json_t *calls) {
  static const char prefix[] = "call:";
  size_t i = *pos;
  if (len - i < sizeof prefix - 1 || memcmp(text + i, prefix, sizeof prefix - 1)) return -1;
  i += sizeof prefix - 1;
  const char *brace = memchr(text + i, '{', len - i);
  size_t name_end = brace ? (size_t)(brace - text) : len;
  if (!brace && !truncated) return -1;
  size_t name_start = i;
  while (name_start < name_end && is_space(text[name_start])) name_start++;
  while (name_end > name_start && is_space(text[name_end - 1])) name_end--;
  if (name_end == name_start) return -1;
  for (size_t k = name_start; k < name_end; k++)
    if (is_space(text[k]) || strchr("{}:,<>\"", text[k])) return -1;
  char *name = strndup(text + name_start, name_end - name_start);
  json_t *args = NULL;
  if (brace) {
    const size_t open = (size_t)(brace - text), close = matching_brace(text, len, open);
    if (close == OPEN) { /* never closed: only a cut segment is closed best effort */
      args = truncated ? ci_gemma_value_to_json(text + open, len - open, 1) : NULL;
      *pos = len;
    } else {
      args = ci_gemma_value_to_json(text + open, close - open, 0);
      *pos = close;
    }
  } else {
    args = json_object(); /* cut right after the name */
    *pos = len;
  }
  char *compact =
      json_is_object(args) && tool_declared(tools, name) ? json_dumps(args, JSON_COMPACT) : NULL;
  json_decref(args);
  int status = -1;
  if (compact) {
    json_array_append_new(calls, json_pack("{s:s, s:s}", "name", name, "arguments", compact));
    status = 0;
  }
  free(compact);
  free(name);
  return status;
}

int ci_gemma_tool_calls_parse(const json_t *tools, const char *text, size_t len, int truncated,
                              json_t *calls) {
  json_t *found = json_array();
  size_t pos = 0;
  for (;;) {
    while (pos < len && is_space(text[pos])) pos++;
    if (pos == len) break;
    if (parse_call(tools, text, len, truncated, &pos, found)) {
      json_decref(found);
      return -1;
    }
  }
  const int n = (int)json_array_size(found);
  if (n == 0) {
    json_decref(found);
    return -1;
  }
  json_array_extend(calls, found);
  json_decref(found);
  return n;
}
