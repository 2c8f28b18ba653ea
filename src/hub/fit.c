/* `cinfer fit`: the memory a model needs at a context length and KV codec — weights (tensor
 * bytes of its safetensors headers), KV cache (the paged cache's blocks, cache layer by layer, in
 * the codec's row format, with a hybrid model's recurrent state: what engine admission reserves
 * for a request) and the step workspace — against the device's memory, and the largest
 * context that fits. Reads config.json and the safetensors headers only (the weights are mapped,
 * never read). The public cinfer_fit of include/cinfer.h. */
#include "cinfer.h"

#include "backend/cpu/cpu_backend.h"
#include "base/error.h"
#include "engine/model_open.h"
#include "hub/memory.h"
#include "io/model_path.h"
#include "io/safetensors.h"
#include "kv/pool.h"
#include "kv/reservation.h"
#include "model/spec.h"
#include "model/workspace.h"
#include "tensor/kv_format.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tokens per KV block and rows per prefill step, as the engine and sessions use them. */
enum { BLOCK_TOKENS = 16, PREFILL_CHUNK = 2048, MAX_BATCH = 4096, MAX_DRAFT = 32 };

void cinfer_fit_options_init(cinfer_fit_options *o) {
  memset(o, 0, sizeof *o);
  o->batch = 1;
}

/* Workspace of steps over `batch` sequences of up to n tokens: one prefill step's activations
 * (model/workspace.h) and a logit row per sequence. */
static int64_t workspace_bytes_for(const ci_model_spec *spec, int batch, int64_t n) {
  int64_t rows = n * batch;
  if (rows > PREFILL_CHUNK) rows = PREFILL_CHUNK;
  if (rows < 1) rows = 1;
  return ci_workspace_bytes(spec, (int)rows, batch) + (int64_t)batch * spec->vocab * 4;
}

typedef struct {
  const ci_model_spec *spec;
  const ci_kv_cache *cache; /* the model's cache geometry (no arena) */
  ci_kv_format format;
  int batch;
  int draft_max; /* drafts per speculative round; 0 without speculation */
  int64_t weights;
} fit_model;

/* What engine admission reserves for one request of n tokens (prompt n) in the codec: a
 * quantized codec is a plan from bf16 converting after the first prefill chunk, as the engine
 * runs a request with that kv_codec; plus a hybrid model's recurrent state and, with speculation,
 * its checkpoints, in whole arena slabs (kv/reservation.h). */
static int64_t request_bytes(const fit_model *m, int64_t n) {
  const int quantized = ci_kv_format_is_quantized(&m->format);
  const ci_kv_request_shape shape = {.base = quantized ? ci_kv_format_plain(CI_KV_BF16) : m->format,
                                     .targets = quantized ? &m->format : NULL,
                                     .uniform = quantized,
                                     .n_prompt = n,
                                     .n = n,
                                     .chunk_cap = PREFILL_CHUNK,
                                     .rollback_reserve = m->draft_max,
                                     .spec_max = m->draft_max};
  return ci_kv_request_reservation(m->cache, &shape);
}

static int64_t total_for(const fit_model *m, int64_t n, int64_t *kv, int64_t *ws) {
  *kv = (int64_t)m->batch * request_bytes(m, n);
  *ws = workspace_bytes_for(m->spec, m->batch, n);
  return m->weights + *kv + *ws;
}

/* The KV format the options ask for (defaults: bf16; 4 bits; affine groups of 64). */
static cinfer_status format_of(const cinfer_fit_options *o, ci_kv_format *f) {
  const char *codec = o->kv_codec ? o->kv_codec : "bf16";
  int bits = o->kv_bits;
  if (bits == 0) bits = 4;
  if (ci_kv_format_parse(codec, bits, o->kv_value_bits, o->kv_group_size, f))
    return CINFER_INVALID_ARGUMENT;
  return CINFER_OK;
}

cinfer_status cinfer_fit(const char *model, const cinfer_fit_options *options,
                         cinfer_fit_result *result) {
  memset(result, 0, sizeof *result);
  cinfer_fit_options defaults;
  cinfer_fit_options_init(&defaults);
  const cinfer_fit_options *o = options ? options : &defaults;
  if (o->batch < 1 || o->batch > MAX_BATCH)
    return ci_fail("batch must be in 1..%d (got %d)", MAX_BATCH, o->batch), CINFER_INVALID_ARGUMENT;
  if (o->context < 0)
    return ci_fail("context must be >= 1 (got %lld)", (long long)o->context),
           CINFER_INVALID_ARGUMENT;
  if (o->draft_max < 0 || o->draft_max > MAX_DRAFT)
    return ci_fail("draft_max must be in 0..%d (got %d)", MAX_DRAFT, o->draft_max),
           CINFER_INVALID_ARGUMENT;
  fit_model m = {.batch = o->batch, .draft_max = o->draft_max};
  cinfer_status st = format_of(o, &m.format);
  if (st != CINFER_OK) return st;

  int64_t available = o->memory_bytes, total_memory = o->memory_bytes;
  if (o->memory_bytes <= 0 && ci_device_memory(o->device, &available, &total_memory))
    return o->device && !strcmp(o->device, "cuda") ? CINFER_UNSUPPORTED : CINFER_INVALID_ARGUMENT;

  char *dir = ci_model_path_resolve(model);
  if (!dir) return CINFER_ERROR;
  ci_model_spec spec;
  if (ci_model_spec_load(dir, &spec)) {
    ci_fail_context("%s", dir);
    free(dir);
    return CINFER_ERROR;
  }
  m.spec = &spec;
  ci_backend *be = NULL;
  ci_kv_cache *cache = NULL;
  st = CINFER_INVALID_ARGUMENT;
  for (int l = 0; l < spec.n_cache_layers; l++)
    if (ci_kv_format_check(&m.format, ci_spec_cache_layer(&spec, l)->head_dim)) goto done;
  st = CINFER_ERROR;
  ci_weights *weights = ci_weights_open(dir);
  if (!weights) goto done;
  m.weights = (int64_t)ci_weights_total_bytes(weights);
  ci_weights_free(weights);
  /* the cache's geometry (layer groups, slab size, state size) as the engine builds it; a
   * one-thread CPU backend holds its small per-layer tables, no arena is allocated */
  if (!(be = ci_cpu_backend_create(1))) goto done;
  const ci_model geometry = {.spec = spec, .be = be};
  const ci_kv_codec base = ci_kv_format_is_quantized(&m.format) ? CI_KV_BF16 : m.format.codec;
  if (!(cache = ci_model_kv_cache_create(&geometry, base, BLOCK_TOKENS, 0))) goto done;
  m.cache = cache;

  result->context_limit = spec.max_position;
  result->context = o->context ? o->context : spec.max_position;
  if (result->context > spec.max_position) {
    ci_fail("context %lld is longer than the model's context length %d", (long long)o->context,
            spec.max_position);
    st = CINFER_INVALID_ARGUMENT;
    goto done;
  }
  ci_kv_format_name(&m.format, result->kv_codec, sizeof result->kv_codec);
  result->batch = o->batch;
  result->weights_bytes = m.weights;
  /* per token over every cache layer, as a sequence of full-attention layers stores it */
  result->kv_bytes_per_token = ci_model_kv_bytes_per_token(&geometry, &m.format);
  result->draft_max = m.draft_max;
  result->state_bytes = ci_kv_cache_state_cost(cache, m.draft_max > 0 ? m.draft_max + 1 : 0);
  result->total_bytes = total_for(&m, result->context, &result->kv_bytes, &result->workspace_bytes);
  result->memory_available = available;
  result->memory_total = total_memory;
  result->fits = result->total_bytes <= available;
  /* the largest context that fits: the total grows with n, so bisect [1, context_limit] */
  int64_t kv, ws, lo = 0, hi = spec.max_position;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (total_for(&m, mid, &kv, &ws) <= available)
      lo = mid;
    else
      hi = mid - 1;
  }
  result->max_context = lo;
  st = CINFER_OK;
done:
  ci_kv_cache_free(cache);
  if (be) be->ops->destroy(be);
  ci_model_spec_free(&spec);
  free(dir);
  return st;
}
