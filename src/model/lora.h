/* LoRA adapters (docs/models.md "LoRA adapters"): low-rank updates y += scale · (x Aᵀ) Bᵀ of a
 * model's linear layers, loaded from a PEFT folder (adapter_config.json +
 * adapter_model.safetensors) or an mlx-lm folder (adapter_config.json + adapters.safetensors),
 * validated against one model, and applied per sequence beside the shared base matmul (never
 * merged into the weights), so that sequences with different adapters share a step.
 *
 * Ownership: an adapter is reference counted (ci_lora_retain / ci_lora_release, thread-safe); the
 * loader's caller holds the first reference. A request or session that runs with an adapter
 * holds one of its own, so an adapter unmounted while requests still use it lives until they end.
 * The model must outlive every adapter loaded for it. */
#ifndef CI_MODEL_LORA_H
#define CI_MODEL_LORA_H

#include "base/rank_collective.h"
#include "tensor/backend.h"

#include <stdatomic.h>
#include <stdint.h>

struct ci_model;

/* The linear layers an adapter may target, in a layer's order of use. */
typedef enum {
  CI_LORA_Q,
  CI_LORA_K,
  CI_LORA_V,
  CI_LORA_O,
  CI_LORA_GATE,
  CI_LORA_UP,
  CI_LORA_DOWN,
  CI_LORA_N_TARGETS
} ci_lora_target;

/* One adapted linear layer [out, in]: A [rank, in] and B [out, rank], f32 in backend memory
 * (matmul weights: t = x Aᵀ, u = t Bᵀ), and its scale. */
typedef struct {
  ci_tensor a;
  ci_tensor b;
  int rank; /* 0: this layer is not adapted */
  float scale;
} ci_lora_module;

typedef struct ci_lora {
  atomic_int refs;
  const struct ci_model *model; /* the model it was loaded for (not owned) */
  const char *format;           /* "peft" or "mlx-lm" (static) */
  int n_layers;
  ci_lora_module *modules; /* [n_layers * CI_LORA_N_TARGETS] */
  float *data;             /* owned host copy of every A and B (f32) */
  int n_modules;           /* adapted layers */
  int max_rank;
  int64_t max_width; /* widest input or output of an adapted layer */
  int64_t n_params;
  float scale;  /* the config's scale (alpha / r or alpha / sqrt(r), or mlx-lm's scale) */
  uint64_t key; /* hash of the content: equal adapters share prefix-cache entries */
  /* A model split over ranks (model/tensor_parallel.h): modules above are rank 0's share of each
   * layer (B's rows of q, k, v, gate, up; A's columns of o, down), rank_modules[r] rank r's, and
   * owned holds the host copies of A's column shares. */
  ci_lora_module *rank_modules[CI_MAX_RANKS]; /* [1 .. ranks) [n_layers * CI_LORA_N_TARGETS] */
  float **owned;
  int n_owned;
} ci_lora;

/* Upper bound on an adapter weight file: a larger one is rejected before it is read. */
enum { CI_LORA_MAX_RANK = 4096 };
#define CI_LORA_MAX_FILE_BYTES ((int64_t)4 << 30)

/* Loads the adapter folder `dir` for `model`: reads adapter_config.json, decides the format
 * (mlx-lm: lora_parameters; PEFT: peft_type / r / lora_alpha), reads the weight file and checks
 * every tensor against the model (a module the model lacks or cinfer does not adapt, a shape or
 * rank that disagrees, a missing A or B, a non-finite value, a file that is truncated, oversized
 * or not a regular file, an unsupported option such as DoRA) with a message naming the problem.
 * Returns the adapter with one reference, or NULL with ci_last_error. */
ci_lora *ci_lora_load(const char *dir, const struct ci_model *model);

/* Takes one more reference; returns lora (NULL is passed through). */
ci_lora *ci_lora_retain(ci_lora *lora);

/* Drops one reference; the last one frees the adapter. NULL is a no-op. */
void ci_lora_release(ci_lora *lora);

/* The adapted module of `target` in layer `layer` as rank `rank` of a split model holds it (0 for
 * a whole model), or NULL when the adapter leaves it alone. */
static inline const ci_lora_module *ci_lora_module_at(const ci_lora *lora, int layer,
                                                      ci_lora_target target, int rank) {
  const ci_lora_module *modules = rank == 0 ? lora->modules : lora->rank_modules[rank];
  const ci_lora_module *m = &modules[(int64_t)layer * CI_LORA_N_TARGETS + target];
  return m->rank > 0 ? m : NULL;
}

/* The module path of a target inside a layer ("self_attn.q_proj", "mlp.down_proj", ...). */
const char *ci_lora_target_path(ci_lora_target target);

#endif
