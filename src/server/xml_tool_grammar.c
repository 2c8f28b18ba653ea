/* The grammar of one tool call in the Qwen XML format (Qwen3.5, Qwen3-Coder), for tool_choice
 * "required" or a named function on a model whose chat template asks for that format:
 *   <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...</function>\n</tool_call>
 * Each value is written so that the server's tool-call parser (text/tool_call_parse.c) reads it
 * back as the type the tool's parameters schema declares: integers and numbers as decimal
 * numbers, booleans as true/false, null as null, objects and arrays as JSON constrained by their
 * schema (the JSON Schema compiler's grammar, its rules renamed apart), enums and consts as their
 * values, strings and untyped values as text without '<' (so that no value can end its own
 * parameter early) within minLength/maxLength. The required parameters come first in their
 * declared order, then the optional ones in theirs, each optional one at most once. */
#include "server/server.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Appends s as a GBNF string literal. */
static void literal(ci_strbuf *b, const char *s) {
  ci_strbuf_append(b, "\"", 1);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\')
      ci_strbuf_appendf(b, "\\%c", *p);
    else if (*p == '\n')
      ci_strbuf_append(b, "\\n", 2);
    else if (*p < 0x20 || *p == 0x7F)
      ci_strbuf_appendf(b, "\\x%02X", *p);
    else
      ci_strbuf_append(b, (const char *)p, 1);
  }
  ci_strbuf_append(b, "\"", 1);
}

static int is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

/* Copies the GBNF text with every rule name prefixed by `prefix` (literals, character classes,
 * repetition counts and comments unchanged). */
static void append_renamed(ci_strbuf *b, const char *gbnf, const char *prefix) {
  const char *p = gbnf;
  while (*p) {
    const char *start = p;
    if (*p == '"' || *p == '[') {
      const char close = *p == '"' ? '"' : ']';
      for (p++; *p && *p != close; p++)
        if (*p == '\\' && p[1]) p++;
      if (*p) p++;
    } else if (*p == '{') {
      while (*p && *p != '}') p++;
      if (*p) p++;
    } else if (*p == '#') {
      while (*p && *p != '\n') p++;
    } else if (is_name_char(*p)) {
      while (is_name_char(*p)) p++;
      ci_strbuf_appendf(b, "%s", prefix);
    } else {
      p++;
    }
    ci_strbuf_append(b, start, (size_t)(p - start));
  }
  if (p > gbnf && p[-1] != '\n') ci_strbuf_append(b, "\n", 1);
}

/* Whether every element of the array is a string that can be a value (no '<'). */
static int string_values(const json_t *values) {
  size_t i;
  const json_t *v;
  if (!json_is_array(values) || json_array_size(values) == 0) return 0;
  json_array_foreach(values, i,
                     v) if (!json_is_string(v) || strchr(json_string_value(v), '<')) return 0;
  return 1;
}

/* Appends alternatives for the values of enum (or const) as the parser reads them back. Returns
 * 1 when it wrote them, 0 when the schema has neither (or values it cannot write). */
static int enum_alternatives(ci_strbuf *body, const json_t *schema) {
  const json_t *values = json_object_get(schema, "enum");
  json_t *single = NULL;
  if (!values && json_object_get(schema, "const")) {
    single = json_pack("[O]", json_object_get(schema, "const"));
    values = single;
  }
  int wrote = 0;
  if (values && json_is_array(values) && json_array_size(values) > 0) {
    size_t i;
    const json_t *v;
    wrote = 1;
    json_array_foreach(values, i, v) {
      /* strings as their text, other values as JSON (numbers, true/false, null) */
      char *text = json_is_string(v) ? strdup(json_string_value(v))
                                     : json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
      if (!text || strchr(text, '<')) {
        free(text);
        wrote = 0;
        break;
      }
      if (i) ci_strbuf_append(body, " | ", 3);
      literal(body, text);
      free(text);
    }
  }
  json_decref(single);
  return wrote;
}

/* Appends the grammar of one value type for the parameter's schema to body (an alternative of
 * rule `name`); JSON values add their renamed rules to rules. Returns 0 or -1 with *err. */
static int type_alternative(ci_strbuf *body, ci_strbuf *rules, const char *name, int n_json,
                            const char *type, const json_t *schema, char **err) {
  if (!strcmp(type, "string")) {
    long min = 0, max = -1;
    const json_t *lo = json_object_get(schema, "minLength"),
                 *hi = json_object_get(schema, "maxLength");
    if (json_is_integer(lo) && json_integer_value(lo) > 0) min = (long)json_integer_value(lo);
    if (json_is_integer(hi) && json_integer_value(hi) >= 0) max = (long)json_integer_value(hi);
    if (max >= 0 && max < min)
      return ci_srv_fail(err, "tools: a string's maxLength is below its minLength");
    if (min == 0 && max < 0)
      ci_strbuf_appendf(body, "xml-text");
    else if (max < 0)
      ci_strbuf_appendf(body, "[^<]{%ld,}", min);
    else
      ci_strbuf_appendf(body, "[^<]{%ld,%ld}", min, max);
  } else if (!strcmp(type, "integer")) {
    ci_strbuf_appendf(body, "( \"-\"? [0-9]{1,18} )");
  } else if (!strcmp(type, "number")) {
    ci_strbuf_appendf(body,
                      "( \"-\"? [0-9]{1,16} ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )? )");
  } else if (!strcmp(type, "boolean")) {
    ci_strbuf_appendf(body, "( \"true\" | \"false\" )");
  } else if (!strcmp(type, "null")) {
    ci_strbuf_appendf(body, "\"null\"");
  } else if (!strcmp(type, "object") || !strcmp(type, "array")) {
    /* the value as JSON: the schema with this one type, compiled and renamed apart */
    json_t *one = json_deep_copy(schema);
    if (!one || json_object_set_new(one, "type", json_string(type))) {
      json_decref(one);
      return ci_srv_fail(err, "out of memory");
    }
    char *text = json_dumps(one, JSON_COMPACT), *gbnf = NULL;
    json_decref(one);
    if (!text) return ci_srv_fail(err, "out of memory");
    const cinfer_status st = cinfer_json_schema_to_gbnf(text, strlen(text), 1, &gbnf);
    free(text);
    if (st != CINFER_OK)
      return ci_srv_fail(err, "tools: a parameters schema: %s", cinfer_last_error());
    char prefix[96];
    snprintf(prefix, sizeof prefix, "%s-j%d-", name, n_json);
    append_renamed(rules, gbnf, prefix);
    cinfer_free(gbnf);
    ci_strbuf_appendf(body, "%sroot", prefix);
  } else {
    return ci_srv_fail(err,
                       "tools: parameter type \"%.64s\" is not one of string, integer, number, "
                       "boolean, null, object, array",
                       type);
  }
  return 0;
}

/* Appends rule `name` for the value of a parameter with this schema (NULL: undeclared). */
static int value_rule(ci_strbuf *rules, const char *name, const json_t *schema, char **err) {
  ci_strbuf body = {0};
  const json_t *type = json_object_get(schema, "type");
  int rc = 0;
  if (json_is_string(type) && !strcmp(json_string_value(type), "string") &&
      enum_alternatives(&body, schema)) {
    /* an enum of strings */
  } else if (!type && string_values(json_object_get(schema, "enum")) &&
             enum_alternatives(&body, schema)) {
    /* untyped: the parser keeps the text a string, so only string values can be written */
  } else if (json_is_string(type)) {
    rc = type_alternative(&body, rules, name, 0, json_string_value(type), schema, err);
  } else if (json_is_array(type) && json_array_size(type) > 0) {
    size_t i;
    const json_t *t;
    json_array_foreach(type, i, t) {
      if (rc) break;
      if (!json_is_string(t)) {
        rc = ci_srv_fail(err, "tools: a parameter's type list holds a non-string");
        break;
      }
      if (i) ci_strbuf_append(&body, " | ", 3);
      rc = type_alternative(&body, rules, name, (int)i, json_string_value(t), schema, err);
    }
  } else {
    ci_strbuf_appendf(&body, "xml-text"); /* no type: the parser keeps the text a string */
  }
  if (!rc) ci_strbuf_appendf(rules, "%s ::= %s\n", name, body.data ? body.data : "\"\"");
  ci_strbuf_free(&body);
  return rc;
}

/* Whether the array of names holds key. */
static int listed(const json_t *names, const char *key) {
  size_t i;
  const json_t *n;
  json_array_foreach(names, i,
                     n) if (json_is_string(n) && !strcmp(json_string_value(n), key)) return 1;
  return 0;
}

/* Appends rule t<index> (one call of tool t) and its parameter rules. */
static int tool_rules(ci_strbuf *rules, const json_t *t, int index, char **err) {
  const json_t *fn = json_object_get(t, "function");
  const char *fname = json_string_value(json_object_get(fn, "name"));
  if (!fname || !*fname || strpbrk(fname, "<>\n"))
    return ci_srv_fail(err,
                       "tools: a function name must be a non-empty string without '<', '>' or a "
                       "newline for the XML tool-call format");
  const json_t *params = json_object_get(fn, "parameters");
  const json_t *props = json_object_get(params, "properties");
  const json_t *required = json_object_get(params, "required");
  if (props && !json_is_object(props))
    return ci_srv_fail(err, "tools: %.64s: parameters.properties must be an object", fname);
  ci_strbuf call = {0};
  ci_strbuf_appendf(&call, "t%d ::= ", index);
  char head[600];
  snprintf(head, sizeof head, "<function=%s>\n", fname);
  literal(&call, head);
  int rc = 0, k = 0;
  /* required parameters first, then the optional ones */
  for (int pass = 0; pass < 2 && !rc; pass++) {
    const char *key;
    const json_t *schema;
    json_object_foreach((json_t *)props, key, schema) {
      const int req = listed(required, key);
      if (req != (pass == 0)) continue;
      if (!*key || strpbrk(key, "<>\n")) {
        rc = ci_srv_fail(err,
                         "tools: %.64s: parameter name \"%.64s\" cannot be written in the XML "
                         "tool-call format",
                         fname, key);
        break;
      }
      char name[64], open[600];
      snprintf(name, sizeof name, "t%d-v%d", index, k);
      if ((rc = value_rule(rules, name, schema, err))) break;
      snprintf(open, sizeof open, "<parameter=%s>\n", key);
      ci_strbuf_append(&call, " ", 1);
      if (!req) ci_strbuf_append(&call, "( ", 2);
      literal(&call, open);
      ci_strbuf_appendf(&call, " %s \"\\n</parameter>\\n\"", name);
      if (!req) ci_strbuf_append(&call, " )?", 3);
      k++;
    }
  }
  ci_strbuf_appendf(&call, " \"</function>\"\n");
  if (!rc) ci_strbuf_append(rules, call.data, call.len);
  ci_strbuf_free(&call);
  return rc;
}

char *ci_srv_xml_tool_grammar(const json_t *tools, const json_t *named, char **err) {
  ci_strbuf rules = {0}, root = {0};
  ci_strbuf_appendf(&root, "tool-call ::= \"<tool_call>\\n\" (");
  int rc = 0, n_calls = 0;
  size_t i;
  const json_t *t;
  json_array_foreach(tools, i, t) {
    if (named && t != named) continue;
    if ((rc = tool_rules(&rules, t, (int)i, err))) break;
    ci_strbuf_appendf(&root, "%s t%d", n_calls++ ? " |" : "", (int)i);
  }
  ci_strbuf_appendf(&root, " ) \"\\n</tool_call>\"\nxml-text ::= [^<]*\n");
  char *out = NULL;
  if (!rc && (rules.oom || root.oom)) rc = ci_srv_fail(err, "out of memory");
  if (!rc) {
    ci_strbuf_append(&root, rules.data ? rules.data : "", rules.len);
    if (root.oom)
      rc = ci_srv_fail(err, "out of memory");
    else
      out = strdup(root.data);
    if (!out && !rc) rc = ci_srv_fail(err, "out of memory");
  }
  ci_strbuf_free(&rules);
  ci_strbuf_free(&root);
  return out;
}
