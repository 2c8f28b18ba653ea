/* JSON Schema -> GBNF (grammar/json_schema.h). Each subschema becomes one rule named after its
 * path (root, root-name, def-Point, ...); the JSON primitives are shared rules emitted once. */
#include "grammar/json_schema.h"

#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_SCHEMA_DEPTH = 64, NAME_MAX_LEN = 120, MAX_LENGTH_BOUND = 10000 };

static const char PRIMITIVES[] =
    "space ::= \" \"?\n"
    "value ::= object | array | string | number | boolean | null\n"
    "object ::= \"{\" space ( string \":\" space value ( \",\" space string \":\" space value )* "
    ")? \"}\" space\n"
    "array ::= \"[\" space ( value ( \",\" space value )* )? \"]\" space\n"
    "string ::= \"\\\"\" char* \"\\\"\" space\n"
    "char ::= [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )\n"
    "integer ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) space\n"
    "number ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} )? ( [eE] [-+]? "
    "[0-9]{1,3} )? space\n"
    "boolean ::= ( \"true\" | \"false\" ) space\n"
    "null ::= \"null\" space\n"
    "date ::= [0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | "
    "\"3\" [01] )\n"
    "time ::= ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" "
    "[0-9]{1,6} )? ( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )\n"
    "uuid ::= [0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
    "[0-9a-fA-F]{12}\n";

const char *ci_json_object_gbnf(void) {
  static const char text[] = "root ::= object\n"
                             "space ::= \" \"?\n"
                             "value ::= object | array | string | number | boolean | null\n"
                             "object ::= \"{\" space ( string \":\" space value ( \",\" space "
                             "string \":\" space value )* )? \"}\" space\n"
                             "array ::= \"[\" space ( value ( \",\" space value )* )? \"]\" "
                             "space\n"
                             "string ::= \"\\\"\" char* \"\\\"\" space\n"
                             "char ::= [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | "
                             "\"u\" [0-9a-fA-F]{4} )\n"
                             "number ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} "
                             ")? ( [eE] [-+]? [0-9]{1,3} )? space\n"
                             "boolean ::= ( \"true\" | \"false\" ) space\n"
                             "null ::= \"null\" space\n";
  return text;
}

/* ==== Output buffer ==== */

typedef struct {
  char *s;
  size_t n, cap;
  int failed;
} sbuf;

static void sb_append(sbuf *b, const char *s, size_t n) {
  if (b->failed) return;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->n + n + 1) cap *= 2;
    char *bigger = realloc(b->s, cap);
    if (!bigger) {
      b->failed = 1;
      return;
    }
    b->s = bigger;
    b->cap = cap;
  }
  memcpy(b->s + b->n, s, n);
  b->n += n;
  b->s[b->n] = 0;
}

static void sb_puts(sbuf *b, const char *s) {
  sb_append(b, s, strlen(s));
}

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
  char tmp[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof tmp) {
    b->failed = 1;
    return;
  }
  sb_append(b, tmp, (size_t)n);
}

/* A GBNF string literal matching exactly s[0..n). */
static void sb_literal(sbuf *b, const char *s, size_t n) {
  sb_puts(b, "\"");
  for (size_t i = 0; i < n; i++) {
    const unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') {
      char e[3] = {'\\', (char)c, 0};
      sb_puts(b, e);
    } else if (c < 0x20 || c == 0x7F) {
      sb_printf(b, "\\x%02X", c);
    } else {
      sb_append(b, (const char *)&c, 1);
    }
  }
  sb_puts(b, "\"");
}

/* ==== The compiler ==== */

typedef struct {
  sbuf out;
  json_t *root;
  int strict;
  json_t *refs;  /* "$ref" string -> rule name */
  json_t *names; /* rule names in use */
  char path[512];
  int depth;
} compiler;

static int fail_here(compiler *c, const char *fmt, const char *what) {
  return ci_fail(fmt, what, c->path[0] ? c->path : "/");
}

/* A fresh rule name from a hint: letters, digits and '-' only, unique. */
static int rule_name(compiler *c, const char *hint, char *out) {
  char base[NAME_MAX_LEN];
  size_t n = 0;
  for (const char *p = hint; *p && n + 1 < sizeof base - 12; p++) {
    const char ch = *p;
    const int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
    base[n++] = ok ? ch : '-';
  }
  base[n] = 0;
  snprintf(out, NAME_MAX_LEN, "%s", base);
  for (int k = 2; json_object_get(c->names, out); k++)
    snprintf(out, NAME_MAX_LEN, "%s-%d", base, k);
  return json_object_set_new(c->names, out, json_true()) ? ci_fail("json_schema: out of memory")
                                                         : CI_OK;
}

static int gen(compiler *c, json_t *schema, const char *hint, char *name_out);

/* Path bookkeeping for error messages. */
static size_t path_push(compiler *c, const char *seg) {
  const size_t len = strlen(c->path);
  snprintf(c->path + len, sizeof c->path - len, "/%s", seg);
  return len;
}

static void path_pop(compiler *c, size_t len) {
  c->path[len] = 0;
}

static int sub(compiler *c, json_t *schema, const char *seg, const char *hint, char *name_out) {
  const size_t mark = path_push(c, seg);
  const int rc = gen(c, schema, hint, name_out);
  path_pop(c, mark);
  return rc;
}

static const char *const KNOWN[] = {
    "type",       "properties",  "required",    "additionalProperties",
    "items",      "minItems",    "maxItems",    "enum",
    "const",      "anyOf",       "oneOf",       "$ref",
    "$defs",      "definitions", "format",      "minLength",
    "maxLength",  "title",       "description", "default",
    "examples",   "$schema",     "$id",         "$comment",
    "deprecated", "readOnly",    "writeOnly",   NULL};

static int check_keywords(compiler *c, json_t *schema) {
  const char *key;
  json_t *v;
  json_object_foreach(schema, key, v) {
    int known = 0;
    for (int i = 0; KNOWN[i]; i++)
      if (!strcmp(KNOWN[i], key)) known = 1;
    if (!known) return fail_here(c, "json_schema: unsupported keyword \"%s\" at %s", key);
  }
  return CI_OK;
}

static int get_count(compiler *c, json_t *schema, const char *key, long *out) {
  json_t *v = json_object_get(schema, key);
  *out = -1;
  if (!v) return CI_OK;
  if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > MAX_LENGTH_BOUND)
    return fail_here(c, "json_schema: \"%s\" must be an integer in [0, 10000] (at %s)", key);
  *out = (long)json_integer_value(v);
  return CI_OK;
}

/* Appends "{min,max}" style repetition of item to b (max < 0: unbounded). */
static void repetition(sbuf *b, const char *item, long min, long max) {
  if (min <= 0 && max < 0)
    sb_printf(b, "%s*", item);
  else if (max < 0)
    sb_printf(b, "%s{%ld,}", item, min);
  else
    sb_printf(b, "%s{%ld,%ld}", item, min < 0 ? 0 : min, max);
}

static int gen_literals(compiler *c, json_t *values, sbuf *body) {
  size_t i;
  json_t *v;
  sb_puts(body, "( ");
  json_array_foreach(values, i, v) {
    char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text) return ci_fail("json_schema: out of memory");
    if (i > 0) sb_puts(body, " | ");
    sb_literal(body, text, strlen(text));
    free(text);
  }
  sb_puts(body, " ) space");
  (void)c;
  return CI_OK;
}

static int gen_string(compiler *c, json_t *schema, sbuf *body) {
  json_t *format = json_object_get(schema, "format");
  if (format) {
    const char *f = json_string_value(format);
    if (!f) return fail_here(c, "json_schema: \"%s\" must be a string (at %s)", "format");
    const char *rule = !strcmp(f, "date")        ? "date"
                       : !strcmp(f, "time")      ? "time"
                       : !strcmp(f, "date-time") ? "date \"T\" time"
                       : !strcmp(f, "uuid")      ? "uuid"
                                                 : NULL;
    if (!rule) return fail_here(c, "json_schema: unsupported string format \"%s\" at %s", f);
    sb_printf(body, "\"\\\"\" %s \"\\\"\" space", rule);
    return CI_OK;
  }
  long min, max;
  if (get_count(c, schema, "minLength", &min) || get_count(c, schema, "maxLength", &max))
    return CI_ERR;
  if (max >= 0 && min > max) return fail_here(c, "json_schema: %sminLength > maxLength at %s", "");
  sb_puts(body, "\"\\\"\" ");
  repetition(body, "char", min, max);
  sb_puts(body, " \"\\\"\" space");
  return CI_OK;
}

static int gen_array(compiler *c, json_t *schema, const char *hint, sbuf *body) {
  char item[NAME_MAX_LEN] = "value";
  json_t *items = json_object_get(schema, "items");
  char h[NAME_MAX_LEN];
  snprintf(h, sizeof h, "%s-item", hint);
  if (items && sub(c, items, "items", h, item)) return CI_ERR;
  long min, max;
  if (get_count(c, schema, "minItems", &min) || get_count(c, schema, "maxItems", &max))
    return CI_ERR;
  if (max >= 0 && min > max) return fail_here(c, "json_schema: %sminItems > maxItems at %s", "");
  char more[NAME_MAX_LEN + 16];
  snprintf(more, sizeof more, "( \",\" space %s )", item);
  if (max == 0) {
    sb_puts(body, "\"[\" space \"]\" space");
  } else if (min <= 0) {
    sb_printf(body, "\"[\" space ( %s ", item);
    repetition(body, more, 0, max < 0 ? -1 : max - 1);
    sb_puts(body, " )? \"]\" space");
  } else {
    sb_printf(body, "\"[\" space %s ", item);
    repetition(body, more, min - 1, max < 0 ? -1 : max - 1);
    sb_puts(body, " \"]\" space");
  }
  return CI_OK;
}

/* One "key": value pair as a rule; returns its name in kv. */
static int gen_property(compiler *c, const char *key, json_t *schema, const char *hint, char *kv) {
  char h[NAME_MAX_LEN], value[NAME_MAX_LEN];
  snprintf(h, sizeof h, "%s-%s", hint, key);
  const size_t mark = path_push(c, "properties");
  const int rc = sub(c, schema, key, h, value);
  path_pop(c, mark);
  if (rc) return CI_ERR;
  char kvh[NAME_MAX_LEN + 8];
  snprintf(kvh, sizeof kvh, "%s-kv", h);
  if (rule_name(c, kvh, kv)) return CI_ERR;
  json_t *k = json_string(key);
  char *text = k ? json_dumps(k, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
  json_decref(k);
  if (!text) return ci_fail("json_schema: out of memory");
  sb_printf(&c->out, "%s ::= ", kv);
  sb_literal(&c->out, text, strlen(text));
  sb_printf(&c->out, " space \":\" space %s\n", value);
  free(text);
  return CI_OK;
}

static int gen_object(compiler *c, json_t *schema, const char *hint, sbuf *body) {
  json_t *props = json_object_get(schema, "properties");
  json_t *required = json_object_get(schema, "required");
  json_t *additional = json_object_get(schema, "additionalProperties");
  if (props && !json_is_object(props))
    return fail_here(c, "json_schema: %s\"properties\" must be an object (at %s)", "");
  if (required && !json_is_array(required))
    return fail_here(c, "json_schema: %s\"required\" must be an array (at %s)", "");
  /* the extra pairs allowed: none, any value, or a schema's */
  char extra_value[NAME_MAX_LEN] = "";
  if (additional ? !json_is_false(additional) : !c->strict) {
    if (!additional || json_is_true(additional)) {
      snprintf(extra_value, sizeof extra_value, "value");
    } else {
      char h[NAME_MAX_LEN];
      snprintf(h, sizeof h, "%s-additional", hint);
      if (sub(c, additional, "additionalProperties", h, extra_value)) return CI_ERR;
    }
  }
  size_t idx;
  json_t *r;
  json_array_foreach(required, idx, r) {
    if (!json_is_string(r))
      return fail_here(c, "json_schema: %s\"required\" must list strings (at %s)", "");
    if (!json_object_get(props, json_string_value(r)))
      return fail_here(c, "json_schema: required property \"%s\" is not in properties (at %s)",
                       json_string_value(r));
  }
  /* pairs: required first in declared order, then the optional ones */
  const size_t n_props = props ? json_object_size(props) : 0;
  char(*kv)[NAME_MAX_LEN] = calloc(n_props + 1, sizeof *kv);
  int *is_req = calloc(n_props + 1, sizeof *is_req);
  if (!kv || !is_req) {
    free(kv);
    free(is_req);
    return ci_fail("json_schema: out of memory");
  }
  size_t n = 0, n_req = 0;
  int rc = CI_OK;
  for (int pass = 0; pass < 2 && !rc; pass++) {
    const char *key;
    json_t *ps;
    json_object_foreach(props, key, ps) {
      int req = 0;
      json_array_foreach(required, idx, r) if (!strcmp(json_string_value(r), key)) req = 1;
      if (req != (pass == 0)) continue;
      if ((rc = gen_property(c, key, ps, hint, kv[n]))) break;
      is_req[n++] = req;
      n_req += (size_t)req;
    }
  }
  char extra[2 * NAME_MAX_LEN + 64] = "";
  if (!rc && extra_value[0])
    snprintf(extra, sizeof extra, " ( \",\" space string \":\" space %s )*", extra_value);
  if (!rc) {
    sb_puts(body, "\"{\" space ");
    if (n_req > 0) {
      for (size_t i = 0; i < n; i++) {
        if (i > 0) sb_puts(body, is_req[i] ? "\",\" space " : "( \",\" space ");
        sb_printf(body, "%s ", kv[i]);
        if (!is_req[i]) sb_puts(body, ")? ");
      }
      sb_printf(body, "%s", extra);
    } else if (n > 0) {
      /* no required pair: the first present one takes no comma. first-i ::= kv_i tail_(i+1) |
       * first-(i+1), tail-i ::= ( "," kv_i )? tail-(i+1) */
      char first_base[NAME_MAX_LEN], tail_base[NAME_MAX_LEN];
      snprintf(first_base, sizeof first_base, "%s-first", hint);
      snprintf(tail_base, sizeof tail_base, "%s-tail", hint);
      char(*first)[NAME_MAX_LEN] = calloc(n + 1, sizeof *first);
      char(*tail)[NAME_MAX_LEN] = calloc(n + 1, sizeof *tail);
      if (!first || !tail) rc = ci_fail("json_schema: out of memory");
      for (size_t i = n; i-- > 0 && !rc;) {
        if ((rc = rule_name(c, tail_base, tail[i])) || (rc = rule_name(c, first_base, first[i])))
          break;
        sb_printf(&c->out, "%s ::= ( \",\" space %s )?%s%s\n", tail[i], kv[i], i + 1 < n ? " " : "",
                  i + 1 < n ? tail[i + 1] : "");
        sb_printf(&c->out, "%s ::= %s%s%s", first[i], kv[i], i + 1 < n ? " " : "",
                  i + 1 < n ? tail[i + 1] : "");
        if (i + 1 < n) sb_printf(&c->out, " | %s", first[i + 1]);
        sb_puts(&c->out, "\n");
      }
      if (!rc) {
        if (extra[0])
          sb_printf(body, "( %s%s | string \":\" space %s%s )? ", first[0], extra, extra_value,
                    extra);
        else
          sb_printf(body, "%s? ", first[0]);
      }
      free(first);
      free(tail);
    } else if (extra[0]) {
      sb_printf(body, "( string \":\" space %s%s )? ", extra_value, extra);
    }
    sb_puts(body, "\"}\" space");
  }
  free(kv);
  free(is_req);
  return rc;
}

/* The body of one type (a string of the "type" keyword). */
static int gen_type(compiler *c, json_t *schema, const char *type, const char *hint, sbuf *body) {
  if (!strcmp(type, "string")) return gen_string(c, schema, body);
  if (!strcmp(type, "object")) return gen_object(c, schema, hint, body);
  if (!strcmp(type, "array")) return gen_array(c, schema, hint, body);
  if (!strcmp(type, "integer") || !strcmp(type, "number") || !strcmp(type, "boolean") ||
      !strcmp(type, "null")) {
    sb_puts(body, type);
    return CI_OK;
  }
  return fail_here(c, "json_schema: unknown type \"%s\" at %s", type);
}

/* The rule of a $ref (generated once; recursion refers back to the name). */
static int gen_ref(compiler *c, const char *ref, char *name_out) {
  json_t *known = json_object_get(c->refs, ref);
  if (known) {
    snprintf(name_out, NAME_MAX_LEN, "%s", json_string_value(known));
    return CI_OK;
  }
  const char *defs = !strncmp(ref, "#/$defs/", 8)          ? "$defs"
                     : !strncmp(ref, "#/definitions/", 14) ? "definitions"
                                                           : NULL;
  if (!defs)
    return fail_here(c,
                     "json_schema: unsupported $ref \"%s\" at %s (only #/$defs/NAME and "
                     "#/definitions/NAME)",
                     ref);
  const char *name = ref + (defs[0] == '$' ? 8 : 14);
  json_t *target = json_object_get(json_object_get(c->root, defs), name);
  if (!target) return fail_here(c, "json_schema: $ref \"%s\" names no definition (at %s)", ref);
  char hint[NAME_MAX_LEN];
  snprintf(hint, sizeof hint, "def-%s", name);
  if (rule_name(c, hint, name_out)) return CI_ERR;
  if (json_object_set_new(c->refs, ref, json_string(name_out)))
    return ci_fail("json_schema: out of memory");
  /* generate the target into a rule of that name: gen names its own rule, so alias it */
  char inner[NAME_MAX_LEN];
  const size_t mark = path_push(c, defs);
  const int rc = sub(c, target, name, hint, inner);
  path_pop(c, mark);
  if (rc) return CI_ERR;
  sb_printf(&c->out, "%s ::= %s\n", name_out, inner);
  return CI_OK;
}

static int gen(compiler *c, json_t *schema, const char *hint, char *name_out) {
  if (json_is_true(schema)) {
    snprintf(name_out, NAME_MAX_LEN, "value");
    return CI_OK;
  }
  if (!json_is_object(schema))
    return fail_here(c, "json_schema: %sa schema must be an object or true (at %s)", "");
  if (++c->depth > MAX_SCHEMA_DEPTH) {
    c->depth--;
    return fail_here(c, "json_schema: %sschemas nested too deeply (at %s)", "");
  }
  int rc = check_keywords(c, schema);
  sbuf body = {0};
  json_t *v;
  if (rc) {
  } else if ((v = json_object_get(schema, "$ref"))) {
    if (!json_is_string(v))
      rc = fail_here(c, "json_schema: %s$ref must be a string (at %s)", "");
    else
      rc = gen_ref(c, json_string_value(v), name_out);
    c->depth--;
    return rc;
  } else if ((v = json_object_get(schema, "const"))) {
    json_t *one = json_array();
    rc = !one || json_array_append(one, v) ? ci_fail("json_schema: out of memory")
                                           : gen_literals(c, one, &body);
    json_decref(one);
  } else if ((v = json_object_get(schema, "enum"))) {
    if (!json_is_array(v) || json_array_size(v) == 0)
      rc = fail_here(c, "json_schema: %s\"enum\" must be a non-empty array (at %s)", "");
    else
      rc = gen_literals(c, v, &body);
  } else if ((v = json_object_get(schema, "anyOf")) || (v = json_object_get(schema, "oneOf"))) {
    const char *kw = json_object_get(schema, "anyOf") ? "anyOf" : "oneOf";
    if (!json_is_array(v) || json_array_size(v) == 0)
      rc = fail_here(c, "json_schema: \"%s\" must be a non-empty array (at %s)", kw);
    size_t i;
    json_t *alt;
    json_array_foreach(v, i, alt) {
      if (rc) break;
      char seg[NAME_MAX_LEN], h[NAME_MAX_LEN], alt_name[NAME_MAX_LEN];
      snprintf(seg, sizeof seg, "%s/%zu", kw, i);
      snprintf(h, sizeof h, "%s-%zu", hint, i);
      rc = sub(c, alt, seg, h, alt_name);
      if (!rc) sb_printf(&body, "%s%s", i ? " | " : "", alt_name);
    }
  } else if ((v = json_object_get(schema, "type"))) {
    if (json_is_string(v)) {
      rc = gen_type(c, schema, json_string_value(v), hint, &body);
    } else if (json_is_array(v) && json_array_size(v) > 0) {
      size_t i;
      json_t *t;
      json_array_foreach(v, i, t) {
        if (rc) break;
        if (!json_is_string(t)) {
          rc = fail_here(c, "json_schema: %s\"type\" must list strings (at %s)", "");
          break;
        }
        sb_puts(&body, i ? " | ( " : "( ");
        char h[NAME_MAX_LEN];
        snprintf(h, sizeof h, "%s-%s", hint, json_string_value(t));
        rc = gen_type(c, schema, json_string_value(t), h, &body);
        sb_puts(&body, " )");
      }
    } else {
      rc = fail_here(c, "json_schema: %s\"type\" must be a string or a list of them (at %s)", "");
    }
  } else if (json_object_get(schema, "properties") ||
             json_object_get(schema, "additionalProperties")) {
    rc = gen_object(c, schema, hint, &body);
  } else if (json_object_get(schema, "items")) {
    rc = gen_array(c, schema, hint, &body);
  } else {
    sb_puts(&body, "value");
  }
  if (!rc && body.failed) rc = ci_fail("json_schema: out of memory");
  if (!rc) rc = rule_name(c, hint, name_out);
  if (!rc) sb_printf(&c->out, "%s ::= %s\n", name_out, body.s ? body.s : "");
  free(body.s);
  c->depth--;
  return rc;
}

char *ci_json_schema_to_gbnf(json_t *schema, int strict) {
  compiler c = {0};
  c.root = schema;
  c.strict = strict;
  c.refs = json_object();
  c.names = json_object();
  char root[NAME_MAX_LEN];
  int rc = !c.refs || !c.names ? ci_fail("json_schema: out of memory") : CI_OK;
  static const char *const reserved[] = {"space", "value",   "object", "array",   "string",
                                         "char",  "integer", "number", "boolean", "null",
                                         "date",  "time",    "uuid",   NULL};
  for (int i = 0; !rc && reserved[i]; i++)
    if (json_object_set_new(c.names, reserved[i], json_true())) rc = ci_fail("out of memory");
  if (!rc) rc = gen(&c, schema, "root", root);
  if (!rc && strcmp(root, "root")) sb_printf(&c.out, "root ::= %s\n", root);
  if (!rc) sb_puts(&c.out, PRIMITIVES);
  if (!rc && c.out.failed) rc = ci_fail("json_schema: out of memory");
  json_decref(c.refs);
  json_decref(c.names);
  if (rc) {
    free(c.out.s);
    return NULL;
  }
  return c.out.s;
}

char *ci_json_schema_text_to_gbnf(const char *text, size_t len, int strict) {
  json_error_t err;
  json_t *schema = json_loadb(text, len, JSON_DECODE_ANY, &err);
  if (!schema) {
    ci_fail("json_schema: not valid JSON (%s at line %d, column %d)", err.text, err.line,
            err.column);
    return NULL;
  }
  char *gbnf = ci_json_schema_to_gbnf(schema, strict);
  json_decref(schema);
  return gbnf;
}

ci_grammar *ci_grammar_from_json_schema(const char *text, size_t len, int strict) {
  char *gbnf = ci_json_schema_text_to_gbnf(text, len, strict);
  if (!gbnf) return NULL;
  ci_grammar *g = ci_grammar_parse(gbnf, strlen(gbnf), "root");
  if (!g) ci_fail_context("json_schema: the generated grammar");
  free(gbnf);
  return g;
}
