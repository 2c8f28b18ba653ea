/* Embeddings over the public API (include/cinfer.h "Embeddings"): the final-normed hidden states
 * of a text's tokens (ci_model_step_hidden) pooled as the model folder's sentence-transformers
 * config says (modules.json + its Pooling module's config.json: mean, last token or CLS; mean when
 * absent) and L2-normalized. Runs on the engine thread between two generation steps
 * (ci_engine_run_exclusive), in a KV sequence of its own that is freed before the engine goes on.
 */
#include "api/api_internal.h"

#include "base/error.h"
#include "engine/engine.h"
#include "kv/cache.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cinfer_model_hidden_size(const cinfer_model *model) {
  return model ? model->model->spec.hidden : 0;
}

cinfer_pooling cinfer_model_pooling(const cinfer_model *model) {
  if (!model || !model->dir) return CINFER_POOL_MEAN;
  char path[4096];
  snprintf(path, sizeof path, "%s/modules.json", model->dir);
  json_error_t err;
  json_t *modules = json_load_file(path, 0, &err);
  cinfer_pooling pooling = CINFER_POOL_MEAN;
  size_t i;
  json_t *m;
  json_array_foreach(modules, i, m) {
    const char *type = json_string_value(json_object_get(m, "type"));
    const char *dir = json_string_value(json_object_get(m, "path"));
    if (!type || !dir || !strstr(type, "Pooling") || strstr(dir, "..")) continue;
    snprintf(path, sizeof path, "%s/%s/config.json", model->dir, dir);
    json_t *config = json_load_file(path, 0, &err);
    if (json_is_true(json_object_get(config, "pooling_mode_lasttoken")))
      pooling = CINFER_POOL_LAST;
    else if (json_is_true(json_object_get(config, "pooling_mode_cls_token")))
      pooling = CINFER_POOL_CLS;
    json_decref(config);
    break;
  }
  json_decref(modules);
  return pooling;
}

typedef struct {
  const int32_t *ids;
  size_t n;
  cinfer_pooling pooling;
  float *out;      /* [hidden] */
  char error[256]; /* why it failed (errors are per thread: this one is the engine's) */
} embed_job;

enum { EMBED_CHUNK = 256 }; /* rows per step */

/* On the engine thread: the text through the model chunk by chunk, pooling as it goes. */
static int embed_pooled(embed_job *job, ci_model *model, ci_workspace *ws, ci_kv_cache *cache);

static int embed_run(void *arg, ci_model *model, ci_workspace *ws, ci_kv_cache *cache) {
  embed_job *job = arg;
  const int status = embed_pooled(job, model, ws, cache);
  if (status != CI_OK) snprintf(job->error, sizeof job->error, "%s", ci_last_error());
  return status;
}

static int embed_pooled(embed_job *job, ci_model *model, ci_workspace *ws, ci_kv_cache *cache) {
  const int hidden = model->spec.hidden;
  for (size_t i = 0; i < job->n; i++)
    if (job->ids[i] < 0 || job->ids[i] >= model->spec.vocab)
      return ci_fail("token id %d at index %zu is out of range [0, %d)", job->ids[i], i,
                     model->spec.vocab);
  float *rows = malloc((size_t)EMBED_CHUNK * (size_t)hidden * sizeof *rows);
  double *sum = calloc((size_t)hidden, sizeof *sum);
  ci_kv_seq *seq = rows && sum ? ci_kv_seq_create(cache) : NULL;
  int status =
      seq ? ci_model_kv_seq_apply_config(model, seq) : ci_fail("embeddings: out of memory");
  for (size_t at = 0; status == CI_OK && at < job->n;) {
    int64_t n = (int64_t)(job->n - at) < EMBED_CHUNK ? (int64_t)(job->n - at) : EMBED_CHUNK;
    const int64_t limit = ci_kv_seq_chunk_limit(seq);
    if (limit > 0 && n > limit) n = limit;
    /* every row for mean pooling; the first chunk's first row for CLS, the last one for last */
    const int last_chunk = at + (size_t)n == job->n;
    int n_out = (int)n;
    if (job->pooling == CINFER_POOL_LAST) n_out = last_chunk ? 1 : 0;
    const ci_step_seq step = {
        .seq = seq, .ids = job->ids + at, .n_rows = (int)n, .n_logit_rows = n_out};
    status = ci_model_step_hidden(model, ws, &step, 1, rows);
    if (status == CI_OK && job->pooling == CINFER_POOL_MEAN)
      for (int64_t r = 0; r < n; r++)
        for (int k = 0; k < hidden; k++) sum[k] += rows[(size_t)r * (size_t)hidden + (size_t)k];
    if (status == CI_OK && job->pooling == CINFER_POOL_CLS && at == 0)
      for (int k = 0; k < hidden; k++) sum[k] = rows[k];
    if (status == CI_OK && job->pooling == CINFER_POOL_LAST && last_chunk)
      for (int k = 0; k < hidden; k++) sum[k] = rows[k];
    at += (size_t)n;
  }
  ci_kv_seq_free(seq);
  if (status == CI_OK) {
    if (job->pooling == CINFER_POOL_MEAN)
      for (int k = 0; k < hidden; k++) sum[k] /= (double)job->n;
    double norm = 0;
    for (int k = 0; k < hidden; k++) norm += sum[k] * sum[k];
    norm = sqrt(norm);
    for (int k = 0; k < hidden; k++) job->out[k] = (float)(norm > 0 ? sum[k] / norm : 0.0);
  }
  free(rows);
  free(sum);
  return status;
}

cinfer_status cinfer_engine_embed(cinfer_engine *engine, const int32_t *ids, size_t n_ids,
                                  cinfer_pooling pooling, float *out) {
  if (!engine || !ids || !out) return ci_api_fail(CINFER_INVALID_ARGUMENT, "embed: NULL argument");
  if (n_ids == 0) return ci_api_fail(CINFER_INVALID_ARGUMENT, "embed: no tokens");
  const int ctx = cinfer_engine_context_size(engine);
  if (n_ids > (size_t)ctx)
    return ci_api_fail(CINFER_CONTEXT_EXCEEDED,
                       "the input has %zu tokens; this model's maximum context length is %d", n_ids,
                       ctx);
  if (pooling != CINFER_POOL_MEAN && pooling != CINFER_POOL_LAST && pooling != CINFER_POOL_CLS)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "embed: unknown pooling %d", (int)pooling);
  embed_job job = {ids, n_ids, pooling, out, {0}};
  if (ci_engine_run_exclusive(ci_api_engine_impl(engine), embed_run, &job) != CI_OK) {
    if (!job.error[0]) /* it did not run (the engine stopped): the reason is this thread's */
      snprintf(job.error, sizeof job.error, "%s", ci_last_error());
    return ci_api_fail(CINFER_ERROR, "embed: %s", job.error);
  }
  return CINFER_OK;
}
