/* Opening and closing a model together with its backend (created in the options' precision), and
 * the model facts programs ask for (see model_open.h). */
#include "engine/model_open.h"

#include "backend/cpu/cpu_backend.h"
#ifdef CINFER_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "base/error.h"
#include "base/threadpool.h"
#include "io/model_path.h"
#include "model/tensor_parallel.h"

#include <stdlib.h>
#include <string.h>

/* Starts the backend `options` names (see ci_model_open_on). */
static ci_backend *backend_start(const ci_device_options *options) {
  const char *device = options->device;
  int want_cuda = device && strcmp(device, "cuda") == 0;
  int is_auto = !device || strcmp(device, "auto") == 0;
  if (!want_cuda && !is_auto && strcmp(device, "cpu") != 0) {
    ci_fail("unknown device '%s' (expected cpu, cuda or auto)", device);
    return NULL;
  }
#ifdef CINFER_CUDA
  if (want_cuda || (is_auto && ci_cuda_device_count() > 0)) {
    ci_backend *be = ci_cuda_backend_create(options->gpu, options->n_threads);
    if (be) ci_cuda_set_input_planes(be, options->precision == CI_PRECISION_FAST ? 1 : 2);
    return be;
  }
#else
  if (want_cuda) {
    ci_fail("--device cuda: this build has no CUDA backend (nvcc was not found when it was built)");
    return NULL;
  }
#endif
  return ci_cpu_backend_create_with(options->n_threads, options->precision);
}

int ci_model_gpu_visible(void) {
#ifdef CINFER_CUDA
  return ci_cuda_device_count() > 0;
#else
  return 0;
#endif
}

ci_model *ci_model_open(const char *model_arg, int n_threads) {
  ci_device_options options = {.device = "cpu", .gpu = 0, .n_threads = n_threads};
  return ci_model_open_on(model_arg, &options);
}

/* Backend of rank r of a split model: CPU backends share out n_threads (each at least one);
 * CUDA ranks take consecutive GPUs from device->gpu (all on that one with CINFER_TP_SHARE_GPU=1,
 * for tests on a single GPU), their steps without graph capture (the ranks' streams meet at
 * events). */
static ci_backend *rank_backend(const ci_device_options *device, int cuda, int r) {
  const int ranks = device->ranks;
#ifdef CINFER_CUDA
  if (cuda) {
    const char *share = getenv("CINFER_TP_SHARE_GPU");
    const int gpu = share && strcmp(share, "1") == 0 ? device->gpu : device->gpu + r;
    if (gpu >= ci_cuda_device_count())
      return ci_fail("--tensor-parallel %d needs %d GPUs from --gpu %d, and %d are visible", ranks,
                     ranks, device->gpu, ci_cuda_device_count()),
             NULL;
    ci_backend *be = ci_cuda_backend_create(gpu, device->n_threads);
    if (be) {
      ci_cuda_set_input_planes(be, device->precision == CI_PRECISION_FAST ? 1 : 2);
      ci_cuda_set_graphs(be, 0);
    }
    return be;
  }
#else
  (void)cuda;
#endif
  const int threads = device->n_threads > 0 ? device->n_threads : ci_cpu_count();
  const int share = threads * (r + 1) / ranks - threads * r / ranks;
  return ci_cpu_backend_create_with(share > 0 ? share : 1, device->precision);
}

/* The model split over device->ranks backends of the device it names (auto: the GPUs when one is
 * visible). */
static ci_model *open_split(const char *dir, const ci_device_options *device) {
  const int ranks = device->ranks;
  const char *name = device->device;
  if (name && strcmp(name, "cpu") != 0 && strcmp(name, "cuda") != 0 && strcmp(name, "auto") != 0)
    return ci_fail("unknown device '%s' (expected cpu, cuda or auto)", name), NULL;
  const int cuda =
      name ? strcmp(name, "cuda") == 0 || (strcmp(name, "auto") == 0 && ci_model_gpu_visible())
           : ci_model_gpu_visible();
#ifndef CINFER_CUDA
  if (cuda)
    return ci_fail("--device cuda: this build has no CUDA backend (nvcc was not found when it "
                   "was built)"),
           NULL;
#endif
  if (ranks > CI_MAX_RANKS)
    return ci_fail("--tensor-parallel %d: at most %d ranks", ranks, CI_MAX_RANKS), NULL;
  ci_backend *backends[CI_MAX_RANKS];
  for (int r = 0; r < ranks; r++) {
    backends[r] = rank_backend(device, cuda, r);
    if (!backends[r]) {
      while (r-- > 0) backends[r]->ops->destroy(backends[r]);
      return NULL;
    }
  }
  ci_model *model = ci_model_load_tp(dir, backends, ranks, CI_WEIGHTS_MMAP);
  if (!model) backends[0]->ops->destroy(backends[0]); /* the others went with the failure */
  return model;
}

ci_model *ci_model_open_on(const char *model_arg, const ci_device_options *device) {
  char *dir = ci_model_path_resolve(model_arg);
  if (!dir) return NULL;
  if (device->ranks > 1) {
    ci_model *model = open_split(dir, device);
    if (!model) ci_fail_context("cannot load model %s", dir);
    free(dir);
    return model;
  }
  ci_backend *be = backend_start(device);
  if (!be) {
    free(dir);
    return NULL;
  }
  ci_model *model = ci_model_load_in(
      dir, be, device->weights_mmap || !be->host_visible ? CI_WEIGHTS_MMAP : CI_WEIGHTS_HUGE_PAGES);
  if (!model) {
    ci_fail_context("cannot load model %s", dir);
    be->ops->destroy(be);
  }
  free(dir);
  return model;
}

void ci_model_close(ci_model *model) {
  if (!model) return;
  ci_backend *be = model->be;
  ci_model_free(model);
  if (be) be->ops->destroy(be);
}

int ci_model_vocab_size(const ci_model *model) {
  return model->spec.vocab;
}

int ci_model_context_length(const ci_model *model) {
  return model->spec.max_position;
}

const char *ci_model_architecture(const ci_model *model) {
  return model->spec.model_type;
}

int64_t ci_model_kv_bytes_per_token(const ci_model *model, const ci_kv_format *format) {
  int64_t bytes = 0;
  for (int l = 0; l < model->spec.n_cache_layers; l++) {
    const ci_layer_spec *layer = ci_spec_cache_layer(&model->spec, l);
    bytes += (int64_t)ci_model_kv_heads_stored(model, layer) *
             (int64_t)ci_kv_bytes_per_token(format, layer->head_dim);
  }
  return bytes;
}
