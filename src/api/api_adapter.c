/* The public C API's LoRA adapters (include/cinfer.h): a handle holding one reference to an
 * adapter loaded for a model (model/lora.h). */
#include "api_internal.h"

#include "base/error.h"

#include <stdlib.h>

cinfer_status cinfer_adapter_load(const cinfer_model *model, const char *path,
                                  cinfer_adapter **out) {
  if (out) *out = NULL;
  if (!model || !path || !out)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_adapter_load: NULL argument");
  cinfer_adapter *a = calloc(1, sizeof *a);
  if (!a) return ci_api_fail(CINFER_ERROR, "out of memory for an adapter");
  a->lora = ci_lora_load(path, model->model);
  if (!a->lora) {
    free(a);
    return CINFER_INVALID_ARGUMENT; /* ci_lora_load named the problem */
  }
  a->model = model;
  *out = a;
  return CINFER_OK;
}

void cinfer_adapter_free(cinfer_adapter *adapter) {
  if (!adapter) return;
  ci_lora_release(adapter->lora);
  free(adapter);
}

cinfer_status cinfer_adapter_get_info(const cinfer_adapter *adapter, cinfer_adapter_info *info) {
  if (!adapter || !info)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_adapter_get_info: NULL argument");
  const ci_lora *l = adapter->lora;
  *info = (cinfer_adapter_info){.format = l->format,
                                .max_rank = l->max_rank,
                                .n_modules = l->n_modules,
                                .scale = l->scale,
                                .n_params = l->n_params};
  return CINFER_OK;
}

cinfer_adapter *cinfer_adapter_share(const cinfer_adapter *adapter) {
  if (!adapter) return NULL;
  cinfer_adapter *a = malloc(sizeof *a);
  if (!a) return NULL;
  a->lora = ci_lora_retain(adapter->lora);
  a->model = adapter->model;
  return a;
}
