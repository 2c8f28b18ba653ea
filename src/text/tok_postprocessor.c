/* Post-processors of tokenizer.json for single sequences: TemplateProcessing, RobertaProcessing and
 * BertProcessing (all become a template of special-token runs around the sequence), ByteLevel
 * (offsets only, so ids pass through) and Sequence. */
#include "base/error.h"
#include "text/tok_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  int is_sequence;
  int32_t *ids; /* special token ids (empty for the sequence) */
  size_t n_ids;
} template_item;

struct tok_postproc {
  template_item *items; /* NULL with n_items 0 for a pass-through */
  size_t n_items;
  tok_postproc **children; /* Sequence */
  size_t n_children;
  int is_sequence_kind;
};

void tok_postproc_free(tok_postproc *p) {
  if (!p) return;
  for (size_t i = 0; i < p->n_items; i++) free(p->items[i].ids);
  free(p->items);
  for (size_t i = 0; i < p->n_children; i++) tok_postproc_free(p->children[i]);
  free(p->children);
  free(p);
}

static int add_item(tok_postproc *p, int is_sequence, const int32_t *ids, size_t n) {
  template_item *items = realloc(p->items, (p->n_items + 1) * sizeof *items);
  if (!items) return ci_fail("tokenizer: out of memory");
  p->items = items;
  template_item *it = &items[p->n_items++];
  *it = (template_item){is_sequence, NULL, n};
  if (n) {
    it->ids = malloc(n * sizeof *it->ids);
    if (!it->ids) return ci_fail("tokenizer: out of memory");
    memcpy(it->ids, ids, n * sizeof *ids);
  }
  return CI_OK;
}

/* ["token", id] of RobertaProcessing/BertProcessing. */
static int read_pair_id(json_t *j, const char *key, const char *what, int32_t *id) {
  json_t *pair = json_object_get(j, key);
  json_t *v = json_array_get(pair, 1);
  if (!json_is_array(pair) || !json_is_string(json_array_get(pair, 0)) || !json_is_integer(v) ||
      json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
    return ci_fail("post_processor %s: \"%s\" must be [token, id]", what, key);
  *id = (int32_t)json_integer_value(v);
  return CI_OK;
}

static int parse_cls_sep(tok_postproc *p, json_t *j, const char *what) {
  int32_t cls, sep;
  if (read_pair_id(j, "cls", what, &cls) || read_pair_id(j, "sep", what, &sep)) return CI_ERR;
  return add_item(p, 0, &cls, 1) || add_item(p, 1, NULL, 0) || add_item(p, 0, &sep, 1);
}

static int parse_template(tok_postproc *p, json_t *j) {
  json_t *single = json_object_get(j, "single");
  json_t *specials = json_object_get(j, "special_tokens");
  if (!json_is_array(single))
    return ci_fail("post_processor TemplateProcessing: \"single\" must be a list");
  for (size_t i = 0; i < json_array_size(single); i++) {
    json_t *item = json_array_get(single, i);
    json_t *seq = json_object_get(item, "Sequence");
    json_t *special = json_object_get(item, "SpecialToken");
    if (json_is_object(seq)) {
      if (add_item(p, 1, NULL, 0)) return CI_ERR;
      continue;
    }
    const char *name = tok_json_str(special, "id");
    if (!name)
      return ci_fail("post_processor TemplateProcessing: single item %zu is neither "
                     "{\"Sequence\": ...} nor {\"SpecialToken\": {\"id\": ...}}",
                     i);
    json_t *def = json_object_get(specials, name);
    json_t *ids = json_object_get(def, "ids");
    if (!json_is_array(ids))
      return ci_fail("post_processor TemplateProcessing: special token \"%s\" is not defined "
                     "in \"special_tokens\" (with \"ids\")",
                     name);
    size_t n = json_array_size(ids);
    int32_t *buf = malloc((n + 1) * sizeof *buf);
    if (!buf) return ci_fail("tokenizer: out of memory");
    for (size_t k = 0; k < n; k++) {
      json_t *v = json_array_get(ids, k);
      if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
        free(buf);
        return ci_fail("post_processor TemplateProcessing: \"%s\" has a bad id", name);
      }
      buf[k] = (int32_t)json_integer_value(v);
    }
    int rc = add_item(p, 0, buf, n);
    free(buf);
    if (rc) return CI_ERR;
  }
  return CI_OK;
}

tok_postproc *tok_postproc_parse(json_t *j) {
  const char *type = tok_json_str(j, "type");
  if (!json_is_object(j) || !type) {
    ci_fail("post_processor must be an object with a \"type\"");
    return NULL;
  }
  tok_postproc *p = calloc(1, sizeof *p);
  if (!p) {
    ci_fail("tokenizer: out of memory");
    return NULL;
  }
  int rc = CI_OK;
  if (!strcmp(type, "TemplateProcessing")) {
    rc = parse_template(p, j);
  } else if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
    rc = parse_cls_sep(p, j, type);
  } else if (!strcmp(type, "ByteLevel")) {
    rc = add_item(p, 1, NULL, 0);
  } else if (!strcmp(type, "Sequence")) {
    json_t *list = json_object_get(j, "processors");
    p->is_sequence_kind = 1;
    if (!json_is_array(list)) {
      rc = ci_fail("post_processor Sequence: \"processors\" must be a list");
    } else if (!(p->children = calloc(json_array_size(list) + 1, sizeof *p->children))) {
      rc = ci_fail("tokenizer: out of memory");
    } else {
      for (size_t i = 0; i < json_array_size(list) && rc == CI_OK; i++) {
        p->children[i] = tok_postproc_parse(json_array_get(list, i));
        if (!p->children[i])
          rc = ci_fail_context("post_processor Sequence item %zu", i);
        else
          p->n_children = i + 1;
      }
    }
  } else {
    rc = ci_fail("unsupported post_processor type \"%s\"", type);
  }
  if (rc) {
    tok_postproc_free(p);
    return NULL;
  }
  return p;
}

int tok_postproc_apply(const tok_postproc *p, int add_special, const int32_t *ids, size_t n,
                       tok_ids *out) {
  out->n = 0;
  if (p->is_sequence_kind) {
    tok_ids cur = {0};
    int rc = tok_ids_append(&cur, ids, n);
    for (size_t i = 0; i < p->n_children && rc == CI_OK; i++) {
      rc = tok_postproc_apply(p->children[i], add_special, cur.v, cur.n, out);
      tok_ids tmp = cur;
      cur = *out;
      *out = tmp;
    }
    out->n = 0;
    if (rc == CI_OK) rc = tok_ids_append(out, cur.v, cur.n);
    tok_ids_free(&cur);
    return rc;
  }
  for (size_t i = 0; i < p->n_items; i++) {
    const template_item *it = &p->items[i];
    if (it->is_sequence) {
      if (tok_ids_append(out, ids, n)) return CI_ERR;
    } else if (add_special && tok_ids_append(out, it->ids, it->n_ids)) {
      return CI_ERR;
    }
  }
  return CI_OK;
}
