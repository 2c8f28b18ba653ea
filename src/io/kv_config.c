/* kv_config.json reader (see kv_config.h). */
#include "io/kv_config.h"

#include "base/error.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An integer member, or `fallback` when absent. */
static int int_member(json_t *entry, const char *key, long long fallback, long long *out) {
  json_t *v = json_object_get(entry, key);
  if (!v) {
    *out = fallback;
    return CI_OK;
  }
  if (!json_is_integer(v)) return ci_fail("\"%s\" must be an integer", key);
  *out = json_integer_value(v);
  return CI_OK;
}

static int read_entry(json_t *entry, int n_cache_layers, const int *cache_layers,
                      ci_kv_format *targets) {
  if (!json_is_object(entry)) return ci_fail("entries must be objects");
  long long layer = -1, bits = -1, group = 0, k_bits = 4, v_bits = 4;
  if (int_member(entry, "layer_idx", -1, &layer)) return CI_ERR;
  int slot = -1; /* the cache layer of model layer `layer` */
  for (int c = 0; c < n_cache_layers; c++)
    if ((cache_layers ? cache_layers[c] : c) == layer) slot = c;
  if (slot < 0 && !cache_layers)
    return ci_fail("layer_idx %lld is not a cache layer (0..%d)", layer, n_cache_layers - 1);
  if (slot < 0)
    return ci_fail("layer_idx %lld is not a layer with a KV cache (a full-attention layer)", layer);
  json_t *codec = json_object_get(entry, "codec");
  ci_kv_format format;
  if (codec) {
    if (!json_is_string(codec)) return ci_fail("\"codec\" must be a string");
    if (int_member(entry, "k_bits", 4, &k_bits) || int_member(entry, "v_bits", k_bits, &v_bits) ||
        int_member(entry, "group_size", 0, &group))
      return CI_ERR;
    if (ci_kv_format_parse(json_string_value(codec), (int)k_bits, (int)v_bits, (int)group, &format))
      return ci_fail_context("layer_idx %lld", layer);
  } else {
    if (int_member(entry, "bits", -1, &bits) || int_member(entry, "group_size", 64, &group))
      return CI_ERR;
    if (bits < 0) return ci_fail("layer_idx %lld: \"bits\" is missing", layer);
    if (ci_kv_format_parse("affine", (int)bits, 0, (int)group, &format))
      return ci_fail_context("layer_idx %lld", layer);
  }
  targets[slot] = format;
  return CI_OK;
}

int ci_kv_config_load(const char *model_dir, int n_cache_layers, const int *cache_layers,
                      ci_kv_format **targets) {
  *targets = NULL;
  char path[4096];
  snprintf(path, sizeof path, "%s/kv_config.json", model_dir);
  FILE *f = fopen(path, "rb");
  if (!f) return CI_OK;
  fclose(f);
  json_error_t err;
  json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
  if (!root) return ci_fail("%s: not valid JSON (line %d: %s)", path, err.line, err.text);
  int status = CI_OK;
  ci_kv_format *out = malloc((size_t)(n_cache_layers ? n_cache_layers : 1) * sizeof *out);
  if (!out) status = ci_fail("out of memory");
  for (int l = 0; out && l < n_cache_layers; l++) out[l] = ci_kv_format_plain(CI_KV_BF16);
  if (status == CI_OK && !json_is_array(root))
    status = ci_fail("%s: must be a JSON array of {layer_idx, ...} entries", path);
  size_t i;
  json_t *entry;
  if (status == CI_OK) json_array_foreach(root, i, entry) {
      if (read_entry(entry, n_cache_layers, cache_layers, out)) {
        status = ci_fail_context("%s: entry %zu", path, i);
        break;
      }
    }
  json_decref(root);
  if (status != CI_OK) {
    free(out);
    return status;
  }
  *targets = out;
  return CI_OK;
}
