/* Tool-call extraction from generated text (see tool_call_parse.h). */
#include "text/tool_call_parse.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Markers that open a block and the text that closes it. */
static const struct {
  const char *open, *close;
} markers[] = {{"<tool_call>", "</tool_call>"}, {"<function=", "</function>"}};
enum { N_MARKERS = sizeof markers / sizeof markers[0] };

struct ci_tool_parser {
  const json_t *tools;
  int in_block; /* index of the open marker + 1, 0 in content */
  char *buf;
  size_t len, cap;
  int called; /* a block became a call: whitespace after it is held back ... */
  char *ws;   /* ... here, released before the next other content, dropped at the end */
  size_t ws_len, ws_cap;
};

ci_tool_parser *ci_tool_parser_create(const json_t *tools) {
  ci_tool_parser *p = calloc(1, sizeof *p);
  if (p) p->tools = tools;
  return p;
}

void ci_tool_parser_free(ci_tool_parser *p) {
  if (!p) return;
  free(p->ws);
  free(p->buf);
  free(p);
}

static const char *find(const char *hay, size_t len, const char *needle) {
  const size_t n = strlen(needle);
  for (size_t i = 0; i + n <= len; i++)
    if (!memcmp(hay + i, needle, n)) return hay + i;
  return NULL;
}

/* The tool object named `name`, or NULL. */
static const json_t *find_tool(const json_t *tools, const char *name) {
  size_t i;
  const json_t *tool;
  json_array_foreach(tools, i, tool) {
    const json_t *fn = json_object_get(tool, "function");
    const char *tool_name = json_string_value(json_object_get(fn ? fn : tool, "name"));
    if (tool_name && !strcmp(tool_name, name)) return fn ? fn : tool;
  }
  return NULL;
}

/* The schema of parameter `key` of tool function fn, or NULL when fn declares no such property. */
static const json_t *param_schema(const json_t *fn, const char *key) {
  return json_object_get(json_object_get(json_object_get(fn, "parameters"), "properties"), key);
}

static int starts(const char *s, const char *prefix) {
  return !strncmp(s, prefix, strlen(prefix));
}

/* One Qwen XML parameter value converted as the schema type `type` says (vLLM's qwen3_coder
 * rules): a new reference, or NULL when the text is not of that type. */
static json_t *typed_value(const char *type, const char *value) {
  if (!strcmp(type, "string") || !strcmp(type, "str") || !strcmp(type, "text") ||
      !strcmp(type, "varchar") || !strcmp(type, "char") || !strcmp(type, "enum"))
    return json_string(value);
  if (starts(type, "int") || starts(type, "uint") || starts(type, "long") ||
      starts(type, "short") || starts(type, "unsigned")) {
    const char *d = value + (*value == '-' || *value == '+');
    if (!*d || strspn(d, "0123456789") != strlen(d) || strlen(d) > 18) return NULL;
    return json_integer(strtoll(value, NULL, 10));
  }
  if (starts(type, "num") || starts(type, "float")) {
    char *endp = NULL;
    const double x = *value ? strtod(value, &endp) : 0.0;
    /* a finite decimal number only (strtod would also take hex and inf/nan) */
    if (!*value || *endp || strpbrk(value, "xX") || x != x || x - x != 0.0) return NULL;
    if (x == (double)(long long)x && x > -9.0e15 && x < 9.0e15) return json_integer((long long)x);
    return json_real(x);
  }
  if (!strcmp(type, "boolean") || !strcmp(type, "bool") || !strcmp(type, "binary")) {
    if (!strcasecmp(value, "true")) return json_true();
    if (!strcasecmp(value, "false")) return json_false();
    return NULL;
  }
  json_t *parsed = json_loads(value, JSON_DECODE_ANY, NULL); /* object, array and other types */
  if (parsed && (!strcmp(type, "object") || starts(type, "dict")) && !json_is_object(parsed)) {
    json_decref(parsed);
    return NULL;
  }
  if (parsed && (!strcmp(type, "array") || !strcmp(type, "arr") || starts(type, "list")) &&
      !json_is_array(parsed)) {
    json_decref(parsed);
    return NULL;
  }
  return parsed;
}

/* The JSON value of parameter `key` whose text is `value` (docs/server.md "Output formats"):
 * "null" (any case) is null; a parameter the tool's schema does not declare, or declares without
 * a type, stays a string; otherwise the value is converted as its type (the first of a type list
 * that fits) and text that does not fit stays a string. A new reference (NULL: out of memory). */
static json_t *param_value(const json_t *fn, const char *key, const char *value) {
  if (!strcasecmp(value, "null")) return json_null();
  const json_t *type = json_object_get(param_schema(fn, key), "type");
  json_t *typed = NULL;
  if (json_is_string(type)) {
    typed = typed_value(json_string_value(type), value);
  } else if (json_is_array(type)) {
    size_t i;
    const json_t *t;
    json_array_foreach(type, i, t) {
      if (!json_is_string(t) || !strcmp(json_string_value(t), "null")) continue;
      if ((typed = typed_value(json_string_value(t), value))) break;
    }
  }
  return typed ? typed : json_string(value);
}

static json_t *make_call(const json_t *tools, const char *name, json_t *args /* stolen */) {
  if (!name || !find_tool(tools, name) || !json_is_object(args)) {
    json_decref(args);
    return NULL;
  }
  char *compact = json_dumps(args, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(args);
  if (!compact) return NULL;
  json_t *call = json_pack("{s:s, s:s}", "name", name, "arguments", compact);
  free(compact);
  return call;
}

/* hermes JSON body. */
static json_t *parse_json_call(const json_t *tools, const char *body, size_t len) {
  json_t *obj = json_loadb(body, len, 0, NULL);
  if (!json_is_object(obj)) {
    json_decref(obj);
    return NULL;
  }
  json_t *fn = json_object_get(obj, "function");
  const char *name = json_string_value(json_object_get(obj, "name"));
  if (!name && json_is_object(fn)) name = json_string_value(json_object_get(fn, "name"));
  json_t *args = json_object_get(obj, "arguments");
  if (!args) args = json_object_get(obj, "parameters");
  if (!args && json_is_object(fn)) args = json_object_get(fn, "arguments");
  json_t *parsed = NULL;
  if (json_is_string(args))
    parsed = json_loads(json_string_value(args), 0, NULL);
  else if (json_is_object(args))
    parsed = json_incref(args);
  else if (!args)
    parsed = json_object();
  json_t *call = make_call(tools, name, parsed);
  json_decref(obj);
  return call;
}

/* The earliest of the texts that end a parameter value: its </parameter>, or when that is missing
 * the next <parameter= or the </function> (vLLM's qwen3_coder does the same); else end. */
static const char *value_end(const char *p, const char *end) {
  static const char *const closers[] = {"</parameter>", "<parameter=", "</function>"};
  const char *best = end;
  for (size_t i = 0; i < sizeof closers / sizeof closers[0]; i++) {
    const char *hit = find(p, (size_t)(best - p), closers[i]);
    if (hit) best = hit;
  }
  return best;
}

/* Qwen XML body: <function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>...</function>. One newline
 * either side of a value belongs to the format; everything else in it is kept. */
static json_t *parse_xml_call(const json_t *tools, const char *body, size_t len) {
  const char *fn_at = find(body, len, "<function=");
  if (!fn_at) return NULL;
  const char *end = body + len;
  const char *fn_close = find(fn_at, (size_t)(end - fn_at), "</function>");
  if (fn_close) end = fn_close;
  const char *name_start = fn_at + strlen("<function=");
  const char *name_end = memchr(name_start, '>', (size_t)(end - name_start));
  if (!name_end || name_end == name_start) return NULL;
  char *name = strndup(name_start, (size_t)(name_end - name_start));
  json_t *args = json_object();
  if (!name || !args) {
    free(name);
    json_decref(args);
    return NULL;
  }
  const json_t *fn = find_tool(tools, name);
  const char *p = name_end + 1;
  while ((p = find(p, (size_t)(end - p), "<parameter="))) {
    const char *key_start = p + strlen("<parameter=");
    const char *key_end = memchr(key_start, '>', (size_t)(end - key_start));
    if (!key_end || key_end == key_start) break;
    const char *value_start = key_end + 1;
    const char *stop = value_end(value_start, end);
    const char *v_end = stop;
    if (value_start < v_end && *value_start == '\n') value_start++;
    if (v_end > value_start && v_end[-1] == '\n') v_end--;
    char *key = strndup(key_start, (size_t)(key_end - key_start));
    char *value = strndup(value_start, (size_t)(v_end - value_start));
    json_t *v = key && value ? param_value(fn, key, value) : NULL;
    const int failed = !v || json_object_set_new(args, key, v);
    free(key);
    free(value);
    if (failed) {
      json_decref(args);
      free(name);
      return NULL;
    }
    p = stop;
  }
  json_t *call = make_call(tools, name, args);
  free(name);
  return call;
}

json_t *ci_tool_call_parse_block(const json_t *tools, const char *block, size_t len) {
  const char *body = block, *end = block + len;
  if (len >= strlen("<tool_call>") && !memcmp(block, "<tool_call>", strlen("<tool_call>")))
    body += strlen("<tool_call>");
  const char *close = find(body, (size_t)(end - body), "</tool_call>");
  if (close) end = close;
  while (body < end && strchr(" \t\r\n", *body)) body++;
  while (end > body && strchr(" \t\r\n", end[-1])) end--;
  if (body < end && *body == '{') return parse_json_call(tools, body, (size_t)(end - body));
  return parse_xml_call(tools, body, (size_t)(end - body));
}

/* Longest suffix of text that is a proper prefix of an open marker. */
static size_t marker_prefix(const char *text, size_t len) {
  size_t best = 0;
  for (int m = 0; m < N_MARKERS; m++) {
    const size_t n = strlen(markers[m].open);
    for (size_t k = n - 1; k > best; k--)
      if (k <= len && !memcmp(text + len - k, markers[m].open, k)) {
        best = k;
        break;
      }
  }
  return best;
}

/* Content text to the sink; after a call, whitespace-only text is held (the newlines between and
 * after calls are part of the call format, not an answer). */
static void emit(ci_tool_parser *p, const char *text, size_t len, ci_tool_content_sink sink,
                 void *ctx) {
  if (!len) return;
  size_t ws = 0;
  while (ws < len && strchr(" \t\r\n", text[ws])) ws++;
  if (p->called && ws == len) {
    if (p->ws_len + len > p->ws_cap) {
      size_t cap = p->ws_cap ? p->ws_cap : 16;
      while (cap < p->ws_len + len) cap *= 2;
      char *bigger = realloc(p->ws, cap);
      if (!bigger) { /* out of memory: pass it on rather than lose order */
        sink(ctx, text, len);
        return;
      }
      p->ws = bigger;
      p->ws_cap = cap;
    }
    memcpy(p->ws + p->ws_len, text, len);
    p->ws_len += len;
    return;
  }
  if (p->ws_len) sink(ctx, p->ws, p->ws_len);
  p->ws_len = 0;
  sink(ctx, text, len);
}

void ci_tool_parser_push(ci_tool_parser *p, const char *text, size_t len, json_t *calls,
                         ci_tool_content_sink sink, void *ctx) {
  if (p->len + len + 1 > p->cap) {
    size_t cap = p->cap ? p->cap : 128;
    while (cap < p->len + len + 1) cap *= 2;
    char *bigger = realloc(p->buf, cap);
    if (!bigger) return;
    p->buf = bigger;
    p->cap = cap;
  }
  memcpy(p->buf + p->len, text, len);
  p->len += len;
  size_t start = 0;
  for (;;) {
    if (!p->in_block) {
      const char *first = NULL;
      int which = -1;
      for (int m = 0; m < N_MARKERS; m++) {
        const char *hit = find(p->buf + start, p->len - start, markers[m].open);
        if (hit && (!first || hit < first)) first = hit, which = m;
      }
      if (!first) break;
      if (first > p->buf + start)
        emit(p, p->buf + start, (size_t)(first - p->buf - start), sink, ctx);
      start = (size_t)(first - p->buf);
      p->in_block = which + 1;
    }
    const int m = p->in_block - 1;
    const char *close = find(p->buf + start, p->len - start, markers[m].close);
    if (!close) break;
    size_t block_end = (size_t)(close - p->buf) + strlen(markers[m].close);
    /* a Qwen block inside <tool_call> closes with </function> then </tool_call> */
    json_t *call = ci_tool_call_parse_block(p->tools, p->buf + start, block_end - start);
    if (call) {
      json_array_append_new(calls, call);
      p->called = 1;
    } else {
      emit(p, p->buf + start, block_end - start, sink, ctx);
    }
    start = block_end;
    p->in_block = 0;
  }
  size_t keep = p->in_block ? p->len - start : marker_prefix(p->buf + start, p->len - start);
  if (!p->in_block && p->len - start > keep)
    emit(p, p->buf + start, p->len - start - keep, sink, ctx);
  memmove(p->buf, p->buf + p->len - keep, keep);
  p->len = keep;
}

void ci_tool_parser_finish(ci_tool_parser *p, json_t *calls, ci_tool_content_sink sink, void *ctx) {
  if (p->len) {
    json_t *call = p->in_block ? ci_tool_call_parse_block(p->tools, p->buf, p->len) : NULL;
    if (call) {
      json_array_append_new(calls, call);
      p->called = 1;
    } else {
      emit(p, p->buf, p->len, sink, ctx);
    }
  }
  p->len = 0;
  p->in_block = 0;
  p->ws_len = 0; /* whitespace after the last call: dropped */
}
