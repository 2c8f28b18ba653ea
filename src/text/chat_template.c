/* Chat templates on top of the Jinja interpreter: where a model keeps its template, which of a
 * named list applies, and the variables transformers' apply_chat_template passes. */
#include "text/chat_template.h"

#include "base/error.h"
#include "text/jinja.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ci_chat_template {
  ci_jinja_template *default_tpl;  /* "default" or the only template; may be NULL in a list */
  ci_jinja_template *tool_use_tpl; /* "tool_use" of a named list, or NULL */
  json_t *special_tokens;          /* bos_token, eos_token, ... as strings (transformers'
                                      special_tokens_map) */
  char *sources;                   /* every template's source, concatenated (format detection) */
  size_t sources_len;
};

/* The special-token attributes transformers exposes to templates. */
static const char *const special_token_keys[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                                 "pad_token", "cls_token", "mask_token"};

static char *read_file(const char *path, size_t *len, int *missing) {
  FILE *f = fopen(path, "rb");
  *missing = !f;
  if (!f) return NULL;
  char *data = NULL;
  size_t cap = 0, n = 0;
  for (;;) {
    if (n + 4096 + 1 > cap) {
      cap = cap ? cap * 2 : 65536;
      char *grown = realloc(data, cap);
      if (!grown) {
        free(data);
        fclose(f);
        ci_fail("out of memory reading %s", path);
        return NULL;
      }
      data = grown;
    }
    size_t got = fread(data + n, 1, cap - n - 1, f);
    n += got;
    if (got == 0) break;
  }
  int bad = ferror(f);
  fclose(f);
  if (bad) {
    free(data);
    ci_fail("cannot read %s", path);
    return NULL;
  }
  data[n] = '\0';
  *len = n;
  return data;
}

/* A special token in tokenizer_config.json: a string or an AddedToken {"content": ...}. */
static const char *token_text(const json_t *v) {
  if (json_is_string(v)) return json_string_value(v);
  if (json_is_object(v) && json_is_string(json_object_get(v, "content")))
    return json_string_value(json_object_get(v, "content"));
  return NULL;
}

/* Parses one template and keeps its source in ct->sources. */
static ci_jinja_template *parse_named(ci_chat_template *ct, const char *source, size_t len,
                                      const char *name) {
  char *grown = realloc(ct->sources, ct->sources_len + len + 1);
  if (!grown) {
    ci_fail("out of memory");
    return NULL;
  }
  memcpy(grown + ct->sources_len, source, len);
  ct->sources = grown;
  ct->sources_len += len;
  grown[ct->sources_len] = '\0';
  ci_jinja_template *t = ci_jinja_parse(source, len);
  if (!t) ci_fail_context("chat template%s%s", name ? " " : "", name ? name : "");
  return t;
}

void ci_chat_template_free(ci_chat_template *t) {
  if (!t) return;
  ci_jinja_free(t->default_tpl);
  ci_jinja_free(t->tool_use_tpl);
  json_decref(t->special_tokens);
  free(t->sources);
  free(t);
}

ci_chat_template *ci_chat_template_from_source(const char *source, const char *bos_token,
                                               const char *eos_token) {
  ci_chat_template *t = calloc(1, sizeof *t);
  if (!t || !(t->special_tokens = json_object())) {
    free(t);
    ci_fail("out of memory");
    return NULL;
  }
  if ((bos_token && json_object_set_new(t->special_tokens, "bos_token", json_string(bos_token))) ||
      (eos_token && json_object_set_new(t->special_tokens, "eos_token", json_string(eos_token)))) {
    ci_chat_template_free(t);
    ci_fail("special tokens are not valid UTF-8");
    return NULL;
  }
  if (!(t->default_tpl = parse_named(t, source, strlen(source), NULL))) {
    ci_chat_template_free(t);
    return NULL;
  }
  return t;
}

/* Reads the special tokens of tokenizer_config.json (if present) into t. */
static int load_special_tokens(ci_chat_template *t, const json_t *config) {
  for (size_t i = 0; i < sizeof special_token_keys / sizeof special_token_keys[0]; i++) {
    const char *text = token_text(json_object_get(config, special_token_keys[i]));
    if (text && json_object_set_new(t->special_tokens, special_token_keys[i], json_string(text)))
      return ci_fail("out of memory");
  }
  const json_t *extra = json_object_get(config, "additional_special_tokens");
  if (json_is_array(extra)) {
    json_t *list = json_array();
    size_t i;
    const json_t *item;
    json_array_foreach(extra, i, item) {
      const char *text = token_text(item);
      if (text) json_array_append_new(list, json_string(text));
    }
    json_object_set_new(t->special_tokens, "additional_special_tokens", list);
  }
  return CI_OK;
}

static int load_from_config(ci_chat_template *t, const json_t *tpl, const char *path) {
  if (json_is_string(tpl)) {
    t->default_tpl = parse_named(t, json_string_value(tpl), json_string_length(tpl), NULL);
    return t->default_tpl ? CI_OK : CI_ERR;
  }
  if (!json_is_array(tpl))
    return ci_fail("%s: \"chat_template\" must be a string or a list of {name, template}", path);
  size_t i;
  const json_t *entry;
  json_array_foreach(tpl, i, entry) {
    const char *name = json_string_value(json_object_get(entry, "name"));
    const json_t *src = json_object_get(entry, "template");
    if (!name || !json_is_string(src))
      return ci_fail("%s: chat_template entry %zu needs a \"name\" and a \"template\" string", path,
                     i);
    ci_jinja_template **slot = !strcmp(name, "default")    ? &t->default_tpl
                               : !strcmp(name, "tool_use") ? &t->tool_use_tpl
                                                           : NULL;
    if (!slot || *slot) continue;
    if (!(*slot = parse_named(t, json_string_value(src), json_string_length(src), name)))
      return CI_ERR;
  }
  if (!t->default_tpl && !t->tool_use_tpl)
    return ci_fail("%s: the chat template list has neither a \"default\" nor a \"tool_use\" "
                   "template",
                   path);
  return CI_OK;
}

ci_chat_template *ci_chat_template_load_dir(const char *model_dir) {
  ci_chat_template *t = calloc(1, sizeof *t);
  if (!t || !(t->special_tokens = json_object())) {
    free(t);
    ci_fail("out of memory");
    return NULL;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/tokenizer_config.json", model_dir);
  json_t *config = NULL;
  FILE *probe = fopen(path, "rb");
  if (probe) {
    fclose(probe);
    json_error_t err;
    config = json_load_file(path, JSON_DECODE_INT_AS_REAL,
                            &err); /* model_max_length may exceed 64 bits */
    if (!config || !json_is_object(config)) {
      ci_fail("%s: line %d: %s", path, err.line, config ? "not a JSON object" : err.text);
      json_decref(config);
      ci_chat_template_free(t);
      return NULL;
    }
    if (load_special_tokens(t, config)) goto fail;
  }
  /* chat_template.jinja beside tokenizer_config.json takes precedence, as in transformers */
  char jinja_path[4096];
  snprintf(jinja_path, sizeof jinja_path, "%s/chat_template.jinja", model_dir);
  size_t len;
  int missing;
  char *source = read_file(jinja_path, &len, &missing);
  if (source) {
    t->default_tpl = parse_named(t, source, len, NULL);
    free(source);
    if (!t->default_tpl) {
      ci_fail_context("%s", jinja_path);
      goto fail;
    }
  } else if (!missing) {
    goto fail;
  } else {
    const json_t *tpl = config ? json_object_get(config, "chat_template") : NULL;
    if (!tpl || json_is_null(tpl)) {
      ci_fail("model has no chat template (no %s and no \"chat_template\" in %s)", jinja_path,
              path);
      goto fail;
    }
    if (load_from_config(t, tpl, path)) goto fail;
  }
  json_decref(config);
  return t;
fail:
  json_decref(config);
  ci_chat_template_free(t);
  return NULL;
}

int ci_chat_template_mentions(const ci_chat_template *t, const char *needle) {
  const size_t n = strlen(needle);
  for (size_t i = 0; t->sources && n && i + n <= t->sources_len; i++)
    if (!memcmp(t->sources + i, needle, n)) return 1;
  return 0;
}

const char *ci_chat_template_bos_token(const ci_chat_template *t) {
  return json_string_value(json_object_get(t->special_tokens, "bos_token"));
}

const char *ci_chat_template_eos_token(const ci_chat_template *t) {
  return json_string_value(json_object_get(t->special_tokens, "eos_token"));
}

int ci_chat_template_render(const ci_chat_template *t, const json_t *request, char **out,
                            size_t *out_len) {
  *out = NULL;
  if (out_len) *out_len = 0;
  if (!json_is_object(request)) return ci_fail("chat request must be a JSON object");
  const json_t *messages = json_object_get(request, "messages");
  if (!json_is_array(messages)) return ci_fail("chat request needs a \"messages\" list");
  const json_t *tools = json_object_get(request, "tools");
  int has_tools = tools && !json_is_null(tools);
  const ci_jinja_template *tpl = has_tools && t->tool_use_tpl ? t->tool_use_tpl : t->default_tpl;
  if (!tpl)
    return ci_fail("this model's chat templates have no \"default\" template (only \"tool_use\", "
                   "which needs tools in the request)");
  /* transformers: render(messages=, tools=, documents=, add_generation_prompt=,
   * **special_tokens_map, **kwargs) — tools and documents are None when not given. */
  json_t *vars = json_deep_copy(t->special_tokens);
  if (!vars) return ci_fail("out of memory");
  const char *key;
  json_t *val;
  json_object_foreach((json_t *)request, key, val) json_object_set(vars, key, val);
  if (!json_object_get(vars, "tools")) json_object_set_new(vars, "tools", json_null());
  if (!json_object_get(vars, "documents")) json_object_set_new(vars, "documents", json_null());
  if (!json_object_get(vars, "add_generation_prompt"))
    json_object_set_new(vars, "add_generation_prompt", json_false());
  int rc = ci_jinja_render(tpl, vars, out, out_len);
  json_decref(vars);
  return rc;
}
