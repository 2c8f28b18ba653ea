/* libFuzzer target: config.json parsing into a model spec (JSON, keys, RoPE, quantization map)
 * must reject anything malformed with an error and never crash. */
#include "model/spec.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  json_error_t err;
  json_t *config = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &err);
  if (!config) return 0;
  ci_model_spec spec;
  if (ci_model_spec_from_json(config, &spec) == 0) ci_model_spec_free(&spec);
  json_decref(config);
  return 0;
}
