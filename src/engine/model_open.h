/* Opening a model for a program: resolve the path, start the CPU backend with a thread count,
 * load the weights on it; closing frees both. Also the facts about a model that programs ask
 * for (vocabulary, context length, architecture, KV bytes per token) without reading its spec.
 *
 * Ownership: a model returned by ci_model_open owns the backend it was loaded on, so it must be
 * released with ci_model_close (not ci_model_free). */
#ifndef CI_ENGINE_MODEL_OPEN_H
#define CI_ENGINE_MODEL_OPEN_H

#include "model/model.h"
#include "tensor/kv_format.h"

#include <stdint.h>

/* Where a model runs: the device kind and, for a GPU, which one. */
typedef struct {
  const char *device;     /* "cpu", "cuda", or NULL/"auto" = cuda when a GPU is visible, else cpu */
  int gpu;                /* GPU ordinal for "cuda" (0) */
  int n_threads;          /* CPU threads (0 = every online CPU); the CPU backend's pool, and the
                             host-side work of a GPU backend */
  int weights_mmap;       /* 1: map the weight files even on the CPU (see ci_model_load_in) */
  ci_precision precision; /* matmul numerics (CI_PRECISION_EXACT = 0: f32 activations); on a
                             GPU, FAST rounds matmul inputs to bf16 (one input plane) */
  int ranks;              /* tensor-parallel ranks (model/tensor_parallel.h); 0 or 1: whole */
} ci_device_options;

/* Resolves `model_arg` (a folder, or a Hugging Face cache id, io/model_path.h), starts a CPU
 * backend on n_threads threads (0 = every online CPU) and loads the model on it. Returns the
 * model, or NULL with ci_last_error: the path message as is, a backend failure as is, a load
 * failure as "cannot load model DIR: why". */
ci_model *ci_model_open(const char *model_arg, int n_threads);

/* As ci_model_open on the backend `device` selects (NULL = auto). "cuda" on a build without
 * the CUDA backend, or on a machine without a GPU, is an error naming the cause; auto falls
 * back to the CPU only when no GPU is visible. */
ci_model *ci_model_open_on(const char *model_arg, const ci_device_options *device);

/* 1 when this build has the CUDA backend and a GPU is visible (what device auto picks). */
int ci_model_gpu_visible(void);

/* Frees a model from ci_model_open and the backend it runs on. NULL is a no-op. */
void ci_model_close(ci_model *model);

/* Number of token ids the model embeds (logit rows are this wide). */
int ci_model_vocab_size(const ci_model *model);

/* The model's context length (config.json max_position_embeddings). */
int ci_model_context_length(const ci_model *model);

/* The model's architecture as config.json names it (model_type: "llama", "gemma3", ...). */
const char *ci_model_architecture(const ci_model *model);

/* Bytes one token of KV takes over every cache-owning layer (K and V) when stored in `format`. */
int64_t ci_model_kv_bytes_per_token(const ci_model *model, const ci_kv_format *format);

#endif
