/* Tool-call extraction from generated text (see tool_call_parse.h). */
#include "text/tool_call_parse.h"

#include <stdlib.h>
#include <string.h>

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
};

ci_tool_parser *ci_tool_parser_create(const json_t *tools) {
  ci_tool_parser *p = calloc(1, sizeof *p);
  if (p) p->tools = tools;
  return p;
}

void ci_tool_parser_free(ci_tool_parser *p) {
  if (!p) return;
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

/* Whether every schema type of a parameter is string or null (then raw text is kept). */
static int param_is_string(const json_t *fn, const char *key) {
  const json_t *props = json_object_get(json_object_get(fn, "parameters"), "properties");
  const json_t *type = json_object_get(json_object_get(props, key), "type");
  if (json_is_string(type)) return !strcmp(json_string_value(type), "string");
  if (json_is_array(type)) {
    size_t i;
    json_t *t;
    json_array_foreach(type, i, t) {
      const char *s = json_string_value(t);
      if (!s || (strcmp(s, "string") && strcmp(s, "null"))) return 0;
    }
    return json_array_size(type) > 0;
  }
  return 0;
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

/* Qwen XML body: <function=NAME><parameter=KEY>VALUE</parameter>...</function>. */
static json_t *parse_xml_call(const json_t *tools, const char *body, size_t len) {
  const char *fn_at = find(body, len, "<function=");
  if (!fn_at) return NULL;
  const char *end = body + len;
  const char *name_start = fn_at + strlen("<function=");
  const char *name_end = memchr(name_start, '>', (size_t)(end - name_start));
  if (!name_end || name_end == name_start) return NULL;
  char *name = strndup(name_start, (size_t)(name_end - name_start));
  const json_t *fn = find_tool(tools, name);
  json_t *args = json_object();
  const char *p = name_end + 1;
  while ((p = find(p, (size_t)(end - p), "<parameter="))) {
    const char *key_start = p + strlen("<parameter=");
    const char *key_end = memchr(key_start, '>', (size_t)(end - key_start));
    if (!key_end) break;
    const char *value_start = key_end + 1;
    const char *value_end = find(value_start, (size_t)(end - value_start), "</parameter>");
    if (!value_end) value_end = end; /* best effort when truncated */
    if (value_start < value_end && *value_start == '\n') value_start++;
    if (value_end > value_start && value_end[-1] == '\n') value_end--;
    char *key = strndup(key_start, (size_t)(key_end - key_start));
    char *value = strndup(value_start, (size_t)(value_end - value_start));
    json_t *typed = NULL;
    if (!fn || !param_is_string(fn, key)) typed = json_loads(value, JSON_DECODE_ANY, NULL);
    json_object_set_new(args, key, typed ? typed : json_string(value));
    free(key);
    free(value);
    p = value_end;
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
      if (first > p->buf + start) sink(ctx, p->buf + start, (size_t)(first - p->buf - start));
      start = (size_t)(first - p->buf);
      p->in_block = which + 1;
    }
    const int m = p->in_block - 1;
    const char *close = find(p->buf + start, p->len - start, markers[m].close);
    if (!close) break;
    size_t block_end = (size_t)(close - p->buf) + strlen(markers[m].close);
    /* a Qwen block inside <tool_call> closes with </function> then </tool_call> */
    json_t *call = ci_tool_call_parse_block(p->tools, p->buf + start, block_end - start);
    if (call)
      json_array_append_new(calls, call);
    else
      sink(ctx, p->buf + start, block_end - start);
    start = block_end;
    p->in_block = 0;
  }
  size_t keep = p->in_block ? p->len - start : marker_prefix(p->buf + start, p->len - start);
  if (!p->in_block && p->len - start > keep) sink(ctx, p->buf + start, p->len - start - keep);
  memmove(p->buf, p->buf + p->len - keep, keep);
  p->len = keep;
}

void ci_tool_parser_finish(ci_tool_parser *p, json_t *calls, ci_tool_content_sink sink, void *ctx) {
  if (p->len) {
    json_t *call = p->in_block ? ci_tool_call_parse_block(p->tools, p->buf, p->len) : NULL;
    if (call)
      json_array_append_new(calls, call);
    else
      sink(ctx, p->buf, p->len);
  }
  p->len = 0;
  p->in_block = 0;
}
