/* Public API: a prompt-cache directory without an engine (cinfer_prompt_cache_scan, _prune), the
 * operations behind `cinfer cache ls` and `cinfer cache prune`. */
#include "api/api_internal.h"

#include "base/error.h"
#include "engine/prompt_cache.h"

#include <string.h>

typedef struct {
  int (*fn)(void *user, const cinfer_prompt_cache_file *file);
  void *user;
} scan_call;

static int forward(void *arg, const ci_prompt_cache_file *f) {
  const scan_call *call = arg;
  cinfer_prompt_cache_file out;
  memset(&out, 0, sizeof out);
  out.name = f->name;
  out.bytes = f->bytes;
  out.mtime = (long long)f->mtime;
  out.valid = f->valid;
  out.problem = f->problem;
  out.key = f->key;
  out.key_bytes = f->key_bytes;
  out.index = f->index;
  out.block_tokens = f->block_tokens;
  return call->fn(call->user, &out) ? ci_fail("stopped by the caller") : CI_OK;
}

cinfer_status cinfer_prompt_cache_scan(const char *dir, int verify,
                                       int (*fn)(void *user, const cinfer_prompt_cache_file *file),
                                       void *user) {
  if (!dir || !fn)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_prompt_cache_scan: NULL argument");
  scan_call call = {fn, user};
  return ci_prompt_cache_scan(dir, verify, forward, &call) ? CINFER_ERROR : CINFER_OK;
}

cinfer_status cinfer_prompt_cache_prune(const char *dir, int64_t max_bytes, int64_t *removed,
                                        int64_t *freed_bytes) {
  if (!dir) return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_prompt_cache_prune: no directory");
  return ci_prompt_cache_prune(dir, max_bytes, removed, freed_bytes) ? CINFER_ERROR : CINFER_OK;
}
