/* Typed config.json reads and the keys every family shares (see config_read.h). */
#include "model/config_read.h"

#include "base/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int ci_cfg_int(json_t *cfg, const char *key, long long fallback, long long min, long long max,
               long long *out) {
  json_t *v = json_object_get(cfg, key);
  if (!v || json_is_null(v)) {
    *out = fallback;
    return CI_OK;
  }
  long long value;
  if (json_is_integer(v)) {
    value = json_integer_value(v);
  } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
             fabs(json_real_value(v)) < 9e15) {
    value = (long long)json_real_value(v);
  } else {
    return ci_fail("config.json: \"%s\" must be an integer", key);
  }
  if (value < min || value > max)
    return ci_fail("config.json: \"%s\" = %lld is out of range [%lld, %lld]", key, value, min, max);
  *out = value;
  return CI_OK;
}

int ci_cfg_num(json_t *cfg, const char *key, double fallback, double *out) {
  json_t *v = json_object_get(cfg, key);
  if (!v || json_is_null(v)) {
    *out = fallback;
    return CI_OK;
  }
  if (!json_is_number(v)) return ci_fail("config.json: \"%s\" must be a number", key);
  *out = json_number_value(v);
  if (!isfinite(*out)) return ci_fail("config.json: \"%s\" must be finite", key);
  return CI_OK;
}

int ci_cfg_bool(json_t *cfg, const char *key, int fallback, int *out) {
  json_t *v = json_object_get(cfg, key);
  if (!v || json_is_null(v)) {
    *out = fallback;
    return CI_OK;
  }
  if (!json_is_boolean(v)) return ci_fail("config.json: \"%s\" must be true or false", key);
  *out = json_is_true(v);
  return CI_OK;
}

/* ==== Quantization map ==== */

static int valid_group(long long g) {
  return g == 32 || g == 64 || g == 128;
}

/* Reads one {bits?, group_size?, mode?} entry, inheriting missing fields from `base`. */
static int read_quant_entry(json_t *entry, const char *what, ci_quant base, ci_quant *out) {
  long long bits, group;
  if (ci_cfg_int(entry, "bits", base.bits, 1, 16, &bits) ||
      ci_cfg_int(entry, "group_size", base.group_size, 1, 1 << 20, &group))
    return ci_fail_context("quantization entry %s", what);
  json_t *mode = json_object_get(entry, "mode");
  if (mode && !json_is_null(mode) &&
      (!json_is_string(mode) || strcmp(json_string_value(mode), "affine") != 0))
    return ci_fail("config.json: quantization mode %s%s%s for %s is not supported (only affine)",
                   json_is_string(mode) ? "\"" : "",
                   json_is_string(mode) ? json_string_value(mode) : "?",
                   json_is_string(mode) ? "\"" : "", what);
  if (bits != 4 && bits != 8)
    return ci_fail("config.json: unsupported bits %lld for %s (supported: 4, 8)", bits, what);
  if (!valid_group(group))
    return ci_fail("config.json: unsupported group_size %lld for %s (supported: 32, 64, 128)",
                   group, what);
  out->bits = (int)bits;
  out->group_size = (int)group;
  return CI_OK;
}

int ci_cfg_quant_map(json_t *cfg, ci_quant_map *map) {
  json_t *q = json_object_get(cfg, "quantization");
  json_t *qc = json_object_get(cfg, "quantization_config");
  if (!q && qc && json_is_object(qc)) {
    if (json_object_get(qc, "quant_method") && !json_object_get(qc, "bits")) {
      json_t *method = json_object_get(qc, "quant_method");
      return ci_fail("config.json: quantization_config with quant_method \"%s\" is not supported "
                     "(only MLX affine quantization)",
                     json_is_string(method) ? json_string_value(method) : "?");
    }
    q = qc;
  }
  if (!q || json_is_null(q)) return CI_OK;
  if (!json_is_object(q)) return ci_fail("config.json: \"quantization\" must be an object");
  if (json_object_get(q, "quant_method") && !json_object_get(q, "bits"))
    return ci_fail("config.json: quantization with quant_method is not supported (only MLX "
                   "affine quantization)");
  map->present = 1;
  if (read_quant_entry(q, "(default)", (ci_quant){0, 64}, &map->fallback)) return CI_ERR;
  size_t n = json_object_size(q);
  map->overrides = calloc(n ? n : 1, sizeof *map->overrides);
  if (!map->overrides) return ci_fail("out of memory");
  const char *key;
  json_t *value;
  json_object_foreach(q, key, value) {
    if (!strcmp(key, "bits") || !strcmp(key, "group_size") || !strcmp(key, "mode") ||
        !strcmp(key, "quant_method"))
      continue;
    ci_quant_override *o = &map->overrides[map->n_overrides];
    if (json_is_false(value)) {
      o->quant = (ci_quant){0, 0};
    } else if (json_is_object(value)) {
      if (read_quant_entry(value, key, map->fallback, &o->quant)) return CI_ERR;
    } else {
      continue; /* other scalar keys (e.g. "true" markers) carry no module override */
    }
    o->path = strdup(key);
    if (!o->path) return ci_fail("out of memory");
    map->n_overrides++;
  }
  return CI_OK;
}

ci_quant ci_quant_lookup(const ci_quant_map *map, const char *path) {
  if (!map->present) return (ci_quant){0, 0};
  for (int i = 0; i < map->n_overrides; i++)
    if (strcmp(map->overrides[i].path, path) == 0) return map->overrides[i].quant;
  return map->fallback;
}

/* ==== Shared keys ==== */

static int read_eos(json_t *cfg, ci_model_spec *spec) {
  json_t *eos = json_object_get(cfg, "eos_token_id");
  if (!eos || json_is_null(eos)) return CI_OK;
  if (json_is_integer(eos)) {
    spec->eos_ids[spec->n_eos++] = (int)json_integer_value(eos);
    return CI_OK;
  }
  if (!json_is_array(eos)) return ci_fail("config.json: \"eos_token_id\" must be an int or list");
  size_t i;
  json_t *v;
  json_array_foreach(eos, i, v) {
    if (!json_is_integer(v)) return ci_fail("config.json: \"eos_token_id\" entries must be ints");
    if (spec->n_eos < CI_MAX_EOS) spec->eos_ids[spec->n_eos++] = (int)json_integer_value(v);
  }
  return CI_OK;
}

int ci_cfg_read_common(json_t *cfg, ci_model_spec *spec, int default_kv_heads) {
  const long long big = 1 << 30;
  long long hidden, layers, heads, kv_heads, head_dim, inter, vocab, max_pos;
  double eps;
  if (ci_cfg_int(cfg, "hidden_size", -1, 1, big, &hidden)) return CI_ERR;
  if (hidden < 0) return ci_fail("config.json: \"hidden_size\" is missing");
  if (ci_cfg_int(cfg, "num_hidden_layers", -1, 1, 100000, &layers)) return CI_ERR;
  if (layers < 0) return ci_fail("config.json: \"num_hidden_layers\" is missing");
  if (ci_cfg_int(cfg, "num_attention_heads", -1, 1, 100000, &heads)) return CI_ERR;
  if (heads < 0) return ci_fail("config.json: \"num_attention_heads\" is missing");
  if (ci_cfg_int(cfg, "num_key_value_heads", default_kv_heads ? default_kv_heads : heads, 1, 100000,
                 &kv_heads))
    return CI_ERR;
  if (heads % kv_heads != 0)
    return ci_fail("config.json: num_attention_heads %lld is not a multiple of "
                   "num_key_value_heads %lld",
                   heads, kv_heads);
  if (ci_cfg_int(cfg, "head_dim", hidden / heads, 1, CI_MAX_HEAD_DIM, &head_dim)) return CI_ERR;
  if (head_dim < 1 || head_dim > CI_MAX_HEAD_DIM)
    return ci_fail("config.json: head_dim resolves to %lld (hidden_size / num_attention_heads)",
                   head_dim);
  if (head_dim % 2 != 0) return ci_fail("config.json: head_dim %lld must be even", head_dim);
  if (ci_cfg_int(cfg, "intermediate_size", -1, 1, big, &inter)) return CI_ERR;
  if (inter < 0) return ci_fail("config.json: \"intermediate_size\" is missing");
  if (ci_cfg_int(cfg, "vocab_size", -1, 1, big, &vocab)) return CI_ERR;
  if (vocab < 0) return ci_fail("config.json: \"vocab_size\" is missing");
  if (ci_cfg_int(cfg, "max_position_embeddings", 4096, 1, 1LL << 40, &max_pos)) return CI_ERR;
  if (ci_cfg_num(cfg, "rms_norm_eps", 1e-6, &eps)) return CI_ERR;
  if (eps < 0) return ci_fail("config.json: \"rms_norm_eps\" must be >= 0");
  if (ci_cfg_bool(cfg, "tie_word_embeddings", 0, &spec->tied)) return CI_ERR;
  spec->hidden = (int)hidden;
  spec->n_layers = (int)layers;
  spec->n_heads = (int)heads;
  spec->intermediate = (int)inter;
  spec->vocab = (int)vocab;
  spec->max_position = max_pos > (1LL << 31) - 1 ? (1 << 30) : (int)max_pos;
  spec->norm_eps = (float)eps;
  if (read_eos(cfg, spec) || ci_cfg_quant_map(cfg, &spec->quant)) return CI_ERR;
  spec->layers = calloc((size_t)layers, sizeof *spec->layers);
  if (!spec->layers) return ci_fail("out of memory");
  for (int i = 0; i < spec->n_layers; i++)
    spec->layers[i] = (ci_layer_spec){.kind = CI_ATTN_FULL,
                                      .head_dim = (int)head_dim,
                                      .n_kv_heads = (int)kv_heads,
                                      .cache_layer = i};
  return CI_OK;
}
