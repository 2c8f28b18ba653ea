/* generation_config.json reader and the EOS set (see generation_config.h). */
#include "io/generation_config.h"

#include "base/error.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* ==== Sampling keys, as a table ==== */

typedef enum { FIELD_FLOAT, FIELD_INT } field_kind;

typedef struct {
  const char *key;
  field_kind kind;
  double min, max;
  int min_exclusive; /* value must be > min rather than >= min */
  size_t has_offset, value_offset;
  const char *range_text; /* for messages */
} field_desc;

#define GC_FIELD(key, kind, min, max, excl, member, text)                                          \
  {                                                                                                \
    key, kind, min, max, excl, offsetof(ci_generation_config, has_##member),                       \
        offsetof(ci_generation_config, member), text                                               \
  }

static const field_desc fields[] = {
    GC_FIELD("temperature", FIELD_FLOAT, 0, INFINITY, 0, temperature, "a number >= 0"),
    GC_FIELD("top_p", FIELD_FLOAT, 0, 1, 0, top_p, "a number in [0, 1]"),
    GC_FIELD("top_k", FIELD_INT, 0, 2147483647.0, 0, top_k, "an integer >= 0"),
    GC_FIELD("min_p", FIELD_FLOAT, 0, 1, 0, min_p, "a number in [0, 1]"),
    GC_FIELD("repetition_penalty", FIELD_FLOAT, 0, INFINITY, 1, repetition_penalty, "a number > 0"),
    GC_FIELD("max_new_tokens", FIELD_INT, 1, 2147483647.0, 0, max_new_tokens, "an integer >= 1"),
};

static int read_field(json_t *root, const char *what, const field_desc *f,
                      ci_generation_config *out) {
  json_t *v = json_object_get(root, f->key);
  if (!v || json_is_null(v)) return CI_OK;
  double x = json_is_number(v) ? json_number_value(v) : NAN;
  int ok = json_is_number(v) && isfinite(x) && (f->min_exclusive ? x > f->min : x >= f->min) &&
           x <= f->max && (f->kind == FIELD_FLOAT || x == floor(x));
  if (!ok) return ci_fail("%s: \"%s\" must be %s", what, f->key, f->range_text);
  char *base = (char *)out;
  *(int *)(base + f->has_offset) = 1;
  if (f->kind == FIELD_FLOAT)
    *(float *)(base + f->value_offset) = (float)x;
  else
    *(int *)(base + f->value_offset) = (int)x;
  return CI_OK;
}

static int read_eos(json_t *root, const char *what, ci_generation_config *out) {
  json_t *eos = json_object_get(root, "eos_token_id");
  if (!eos || json_is_null(eos)) return CI_OK;
  json_t *single[1] = {eos};
  size_t n = json_is_array(eos) ? json_array_size(eos) : 1;
  if (!json_is_array(eos) && !json_is_integer(eos))
    return ci_fail("%s: \"eos_token_id\" must be an integer or a list of integers", what);
  if (n > CI_GEN_MAX_EOS)
    return ci_fail("%s: \"eos_token_id\" lists %zu ids (at most %d supported)", what, n,
                   CI_GEN_MAX_EOS);
  for (size_t i = 0; i < n; i++) {
    json_t *v = json_is_array(eos) ? json_array_get(eos, i) : single[0];
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
      return ci_fail("%s: \"eos_token_id\" entries must be integers >= 0", what);
    out->eos_ids[out->n_eos++] = (int32_t)json_integer_value(v);
  }
  return CI_OK;
}

int ci_generation_config_from_json(json_t *root, const char *what, ci_generation_config *out) {
  memset(out, 0, sizeof *out);
  if (!json_is_object(root)) return ci_fail("%s: top level must be a JSON object", what);
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
    if (read_field(root, what, &fields[i], out)) goto fail;
  json_t *do_sample = json_object_get(root, "do_sample");
  if (do_sample && !json_is_null(do_sample)) {
    if (!json_is_boolean(do_sample)) {
      ci_fail("%s: \"do_sample\" must be true or false", what);
      goto fail;
    }
    if (json_is_false(do_sample)) { /* docs/generation.md §4.1: do_sample false means greedy */
      out->has_temperature = 1;
      out->temperature = 0.0f;
    }
  }
  if (read_eos(root, what, out)) goto fail;
  return CI_OK;
fail:
  memset(out, 0, sizeof *out);
  return CI_ERR;
}

int ci_generation_config_load(const char *model_dir, ci_generation_config *out) {
  memset(out, 0, sizeof *out);
  char path[4096];
  snprintf(path, sizeof path, "%s/generation_config.json", model_dir);
  FILE *f = fopen(path, "rb");
  if (!f) {
    if (errno == ENOENT) return CI_OK;
    return ci_fail("%s: cannot open: %s", path, strerror(errno));
  }
  json_error_t jerr;
  json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, &jerr);
  fclose(f);
  if (!root)
    return ci_fail("%s: not valid JSON (line %d, column %d: %s)", path, jerr.line, jerr.column,
                   jerr.text);
  int status = ci_generation_config_from_json(root, path, out);
  json_decref(root);
  return status;
}

/* ==== EOS set ==== */

int ci_eos_set_contains(const ci_eos_set *set, int32_t id) {
  for (int i = 0; i < set->n; i++)
    if (set->ids[i] == id) return 1;
  return 0;
}

int ci_eos_set_add(ci_eos_set *set, int32_t id) {
  if (id < 0 || ci_eos_set_contains(set, id)) return CI_OK;
  if (set->n == CI_EOS_SET_MAX) return ci_fail("too many EOS ids (at most %d)", CI_EOS_SET_MAX);
  set->ids[set->n++] = id;
  return CI_OK;
}

int ci_eos_set_build(ci_eos_set *set, const int *config_ids, int n_config,
                     const ci_generation_config *gen) {
  set->n = 0;
  for (int i = 0; i < n_config; i++)
    if (ci_eos_set_add(set, config_ids[i])) return CI_ERR;
  if (gen)
    for (int i = 0; i < gen->n_eos; i++)
      if (ci_eos_set_add(set, gen->eos_ids[i])) return CI_ERR;
  return CI_OK;
}
