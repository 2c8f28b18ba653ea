/* Public API model facts and KV codec checks: weight traffic per token, the canonical name of a
 * params' KV codec plan, and the KV bytes a token takes in it. */
#include "api/api_internal.h"

#include "base/error.h"
#include "model/tensor_parallel.h"

int cinfer_model_n_layers(const cinfer_model *model) {
  return model ? model->model->spec.n_layers : 0;
}

const char *cinfer_model_device_note(const cinfer_model *model) {
  return model ? model->device_note : "";
}

const char *cinfer_model_device(const cinfer_model *model) {
  return model && model->model->be ? model->model->be->ops->name : "";
}

int cinfer_model_tensor_parallel(const cinfer_model *model) {
  return model ? ci_model_tensor_parallel(model->model) : 1;
}

int cinfer_model_max_new_tokens(const cinfer_model *model) {
  return model && model->generation.has_max_new_tokens ? model->generation.max_new_tokens : 0;
}

int64_t cinfer_model_weight_bytes(const cinfer_model *model) {
  return model ? ci_model_weight_bytes_per_token(model->model) : 0;
}

/* The format a token ends up stored in under the resolved plan. */
static ci_kv_format final_format(const ci_api_resolved *r) {
  return r->kv_plan == CI_KV_PLAN_TARGET ? r->kv_target : ci_kv_format_plain(r->kv_base);
}

cinfer_status cinfer_params_kv_codec(const cinfer_params *params, char *name, size_t name_size,
                                     int *quantized) {
  if (!params) return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_params_kv_codec: NULL params");
  if (quantized) *quantized = 0;
  if (name && name_size) name[0] = '\0';
  ci_api_resolved r;
  const cinfer_status status = ci_api_resolve_kv(params, &r);
  if (status != CINFER_OK) return status;
  if (quantized) *quantized = r.kv_plan == CI_KV_PLAN_TARGET;
  if (name && name_size) {
    const ci_kv_format format = final_format(&r);
    ci_kv_format_name(&format, name, name_size);
  }
  return CINFER_OK;
}

cinfer_status cinfer_model_kv_bytes_per_token(const cinfer_model *model,
                                              const cinfer_params *params, int64_t *bytes) {
  if (!model || !params || !bytes)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_model_kv_bytes_per_token: NULL argument");
  *bytes = 0;
  ci_api_resolved r;
  const cinfer_status status = ci_api_resolve_kv(params, &r);
  if (status != CINFER_OK) return status;
  const ci_kv_format format = final_format(&r);
  *bytes = ci_model_kv_bytes_per_token(model->model, &format);
  return CINFER_OK;
}

int cinfer_model_threads(const cinfer_model *model) {
  return model ? model->threads : 0;
}
