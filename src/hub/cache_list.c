/* The cache as `cinfer ls` and `cinfer rm` see it, and what config.json alone says about a model
 * (architecture, weight dtype or quantization, whether cinfer supports it): the public
 * cinfer_hub_cache_dir, cinfer_is_repo_id, cinfer_model_resolve, cinfer_model_info_read,
 * cinfer_cache_list and cinfer_cache_remove of include/cinfer.h. */
#include "cinfer.h"

#include "base/error.h"
#include "hub/hf_cache.h"
#include "io/model_path.h"
#include "model/spec.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

cinfer_status cinfer_hub_cache_dir(char **dir) {
  *dir = ci_hf_hub_dir();
  return *dir ? CINFER_OK : CINFER_ERROR;
}

int cinfer_is_repo_id(const char *model) {
  if (!model || !strchr(model, '/')) return 0;
  struct stat st;
  if (stat(model, &st) == 0) return 0;
  char *id = NULL, *rev = NULL;
  const int ok = ci_hf_repo_ref_parse(model, &id, &rev) == CI_OK;
  free(id);
  free(rev);
  if (!ok) ci_clear_error();
  return ok;
}

cinfer_status cinfer_model_resolve(const char *model, char **dir) {
  *dir = ci_model_path_resolve(model);
  return *dir ? CINFER_OK : CINFER_ERROR;
}

/* ==== Model info from config.json ==== */

static char *dup_or_empty(const char *s) {
  return strdup(s ? s : "");
}

/* The config's dtype: "dtype" (transformers 5) or "torch_dtype", at the top or in text_config. */
static const char *config_dtype(json_t *cfg) {
  json_t *text = json_object_get(cfg, "text_config");
  json_t *sources[] = {cfg, json_is_object(text) ? text : NULL};
  for (size_t i = 0; i < 2; i++) {
    if (!sources[i]) continue;
    const char *d = json_string_value(json_object_get(sources[i], "dtype"));
    if (!d) d = json_string_value(json_object_get(sources[i], "torch_dtype"));
    if (d) return d;
  }
  return NULL;
}

/* "q4 g64" for an MLX quantization map ("quantization" or "quantization_config"); NULL if none. */
static char *config_quantization(json_t *cfg) {
  json_t *q = json_object_get(cfg, "quantization");
  if (!json_is_object(q)) q = json_object_get(cfg, "quantization_config");
  if (!json_is_object(q)) return NULL;
  json_t *bits = json_object_get(q, "bits");
  json_t *group = json_object_get(q, "group_size");
  char *out = NULL;
  if (json_is_integer(bits) && json_is_integer(group)) {
    if (asprintf(&out, "q%lld g%lld", (long long)json_integer_value(bits),
                 (long long)json_integer_value(group)) < 0)
      out = NULL;
  } else if (json_is_integer(bits)) {
    if (asprintf(&out, "q%lld", (long long)json_integer_value(bits)) < 0) out = NULL;
  } else {
    const char *method = json_string_value(json_object_get(q, "quant_method"));
    out = strdup(method ? method : "quantized");
  }
  return out;
}

/* Fills info from the folder dir. */
static cinfer_status info_of_dir(const char *dir, cinfer_model_info *info) {
  memset(info, 0, sizeof *info);
  char *path = NULL;
  if (asprintf(&path, "%s/config.json", dir) < 0) return ci_fail("out of memory"), CINFER_ERROR;
  json_error_t jerr;
  json_t *cfg = json_load_file(path, 0, &jerr);
  char *why = NULL;
  if (!cfg) {
    if (ci_fail_if_unopenable(path)) {
      why = strdup(ci_last_error());
    } else if (asprintf(&why, "config.json: %s", jerr.text) < 0) {
      why = NULL;
    }
  }
  free(path);
  if (cfg) {
    info->architecture = dup_or_empty(json_string_value(json_object_get(cfg, "model_type")));
    info->dtype = config_quantization(cfg);
    if (!info->dtype) info->dtype = dup_or_empty(config_dtype(cfg));
    json_decref(cfg);
    ci_model_spec spec;
    if (ci_model_spec_load(dir, &spec) == CI_OK) {
      ci_model_spec_free(&spec);
      info->supported = 1;
    } else {
      why = strdup(ci_last_error());
      ci_clear_error();
    }
  }
  if (!info->architecture) info->architecture = strdup("");
  if (!info->dtype) info->dtype = strdup("");
  info->why = why ? why : strdup("");
  if (!info->architecture || !info->dtype || !info->why) {
    cinfer_model_info_clear(info);
    return ci_fail("out of memory"), CINFER_ERROR;
  }
  return CINFER_OK;
}

cinfer_status cinfer_model_info_read(const char *model, cinfer_model_info *info) {
  memset(info, 0, sizeof *info);
  char *dir = ci_model_path_resolve(model);
  if (!dir) return CINFER_ERROR;
  const cinfer_status st = info_of_dir(dir, info);
  free(dir);
  return st;
}

void cinfer_model_info_clear(cinfer_model_info *info) {
  free(info->architecture);
  free(info->dtype);
  free(info->why);
  memset(info, 0, sizeof *info);
}

/* ==== Listing ==== */

/* The name of a ref of repo_dir (top-level refs only) holding commit, preferring "main"; a
 * malloc'd "" when none does. */
static char *ref_of_commit(const char *repo_dir, const char *commit) {
  char *refs = NULL;
  if (asprintf(&refs, "%s/refs", repo_dir) < 0) return NULL;
  DIR *dir = opendir(refs);
  char *found = NULL;
  struct dirent *e;
  while (dir && (e = readdir(dir)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char *path = NULL;
    if (asprintf(&path, "%s/%s", refs, e->d_name) < 0) break;
    char buf[128] = {0};
    FILE *f = fopen(path, "r");
    free(path);
    if (!f) continue;
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    buf[strcspn(buf, " \r\n\t")] = '\0';
    if (strcmp(buf, commit) != 0) continue;
    if (!found || !strcmp(e->d_name, "main")) {
      free(found);
      found = strdup(e->d_name);
    }
  }
  if (dir) closedir(dir);
  free(refs);
  return found ? found : strdup("");
}

/* Fills one entry for repo id (hub is the cache folder). */
static cinfer_status list_entry(const char *hub, const char *id, cinfer_cached_model *m) {
  memset(m, 0, sizeof *m);
  m->repo_id = strdup(id);
  char *repo_dir = ci_hf_repo_dir(hub, id);
  char *blobs = NULL;
  if (!m->repo_id || !repo_dir || asprintf(&blobs, "%s/blobs", repo_dir) < 0) {
    free(repo_dir);
    return ci_fail("out of memory"), CINFER_ERROR;
  }
  m->size_bytes = ci_hf_tree_bytes(blobs);
  free(blobs);
  char *snapshot = ci_hf_snapshot_path(hub, id, NULL);
  cinfer_status st = CINFER_OK;
  if (snapshot) {
    const char *slash = strrchr(snapshot, '/');
    m->commit = strdup(slash ? slash + 1 : snapshot);
    m->revision = m->commit ? ref_of_commit(repo_dir, m->commit) : NULL;
    m->path = snapshot;
    st = info_of_dir(snapshot, &m->info);
  } else {
    /* a repo folder without a usable snapshot (an interrupted first pull) */
    m->commit = strdup("");
    m->revision = strdup("");
    m->path = strdup("");
    m->info.architecture = strdup("");
    m->info.dtype = strdup("");
    m->info.why = strdup("no complete snapshot (an interrupted pull? run `cinfer pull` again)");
    ci_clear_error();
  }
  free(repo_dir);
  if (st == CINFER_OK && (!m->commit || !m->revision || !m->path || !m->info.architecture ||
                          !m->info.dtype || !m->info.why))
    st = (ci_fail("out of memory"), CINFER_ERROR);
  return st;
}

cinfer_status cinfer_cache_list(const char *cache_dir, cinfer_cached_model **models, size_t *n) {
  *models = NULL;
  *n = 0;
  char *hub = cache_dir ? strdup(cache_dir) : ci_hf_hub_dir();
  if (!hub) return cache_dir ? (ci_fail("out of memory"), CINFER_ERROR) : CINFER_ERROR;
  char **ids = NULL;
  int count = 0;
  if (ci_hf_cached_repos(hub, &ids, &count) != CI_OK) {
    free(hub);
    return CINFER_ERROR;
  }
  cinfer_status st = CINFER_OK;
  cinfer_cached_model *list = calloc((size_t)count + 1, sizeof *list);
  if (!list) st = (ci_fail("out of memory"), CINFER_ERROR);
  size_t filled = 0;
  for (int i = 0; st == CINFER_OK && i < count; i++) {
    st = list_entry(hub, ids[i], &list[i]);
    filled = (size_t)i + 1;
  }
  ci_hf_repo_list_free(ids, count);
  free(hub);
  if (st != CINFER_OK) {
    cinfer_cache_list_free(list, filled);
    return st;
  }
  *models = list;
  *n = (size_t)count;
  return CINFER_OK;
}

void cinfer_cache_list_free(cinfer_cached_model *models, size_t n) {
  if (!models) return;
  for (size_t i = 0; i < n; i++) {
    free(models[i].repo_id);
    free(models[i].revision);
    free(models[i].commit);
    free(models[i].path);
    cinfer_model_info_clear(&models[i].info);
  }
  free(models);
}

cinfer_status cinfer_cache_remove(const char *cache_dir, const char *repo_id,
                                  int64_t *freed_bytes) {
  if (freed_bytes) *freed_bytes = 0;
  if (ci_hf_repo_id_check(repo_id)) return CINFER_INVALID_ARGUMENT;
  char *hub = cache_dir ? strdup(cache_dir) : ci_hf_hub_dir();
  if (!hub) return cache_dir ? (ci_fail("out of memory"), CINFER_ERROR) : CINFER_ERROR;
  const int rc = ci_hf_repo_remove(hub, repo_id, freed_bytes);
  free(hub);
  return rc == CI_OK ? CINFER_OK : CINFER_ERROR;
}
