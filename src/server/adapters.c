/* LoRA adapters in the server (docs/server.md "LoRA adapters"): the registry of mounted adapters
 * (id -> handle, thread-safe), the admin routes GET/POST /v1/adapters and DELETE
 * /v1/adapters/{id}, the confinement of run-time mounts to --adapter-dir, and a request's choice
 * of adapter ("adapter": ID, or "model": "BASE:ID").
 *
 * Nobody gets in through these doors: a client names an adapter, never a path. A name is one
 * folder name of [A-Za-z0-9._-] (no "/", no "..", not hidden) that must resolve, symlinks
 * followed, to a folder inside --adapter-dir, and so must the adapter files in it. The admin
 * routes need the API key when one is set (as every route does) and are off when the server
 * listens beyond loopback without one. */
#include "server/server.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { MAX_ADAPTERS = 256, MAX_NAME = 64 };

typedef struct {
  char id[MAX_NAME + 1];
  cinfer_adapter *adapter; /* owned handle */
  int runtime;             /* mounted through POST /v1/adapters */
} entry;

struct ci_adapter_registry {
  pthread_mutex_t mu;
  entry *entries;
  int n;
};

ci_adapter_registry *ci_adapter_registry_create(void) {
  ci_adapter_registry *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->entries = calloc(MAX_ADAPTERS, sizeof *r->entries);
  if (!r->entries) {
    free(r);
    return NULL;
  }
  pthread_mutex_init(&r->mu, NULL);
  return r;
}

void ci_adapter_registry_free(ci_adapter_registry *r) {
  if (!r) return;
  for (int i = 0; i < r->n; i++) cinfer_adapter_free(r->entries[i].adapter);
  pthread_mutex_destroy(&r->mu);
  free(r->entries);
  free(r);
}

int ci_adapter_name_ok(const char *name) {
  const size_t n = name ? strlen(name) : 0;
  if (n == 0 || n > MAX_NAME || name[0] == '.') return 0;
  for (size_t i = 0; i < n; i++) {
    const char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '_' || c == '-'))
      return 0;
  }
  return 1;
}

int ci_adapter_registry_add(ci_adapter_registry *r, const char *id, cinfer_adapter *adapter,
                            int runtime) {
  int status = 0;
  pthread_mutex_lock(&r->mu);
  for (int i = 0; i < r->n && !status; i++)
    if (!strcmp(r->entries[i].id, id)) status = 409;
  if (!status && r->n == MAX_ADAPTERS) status = 507;
  if (!status) {
    entry *e = &r->entries[r->n++];
    snprintf(e->id, sizeof e->id, "%s", id);
    e->adapter = adapter;
    e->runtime = runtime;
  }
  pthread_mutex_unlock(&r->mu);
  return status;
}

cinfer_adapter *ci_adapter_registry_get(ci_adapter_registry *r, const char *id, int *found) {
  cinfer_adapter *shared = NULL;
  *found = 0;
  pthread_mutex_lock(&r->mu);
  for (int i = 0; i < r->n; i++)
    if (!strcmp(r->entries[i].id, id)) {
      *found = 1;
      shared = cinfer_adapter_share(r->entries[i].adapter);
      break;
    }
  pthread_mutex_unlock(&r->mu);
  return shared;
}

/* Removes id; its handle is freed (requests using it keep their references). 1 if it was there. */
static int registry_remove(ci_adapter_registry *r, const char *id) {
  cinfer_adapter *gone = NULL;
  pthread_mutex_lock(&r->mu);
  for (int i = 0; i < r->n; i++)
    if (!strcmp(r->entries[i].id, id)) {
      gone = r->entries[i].adapter;
      r->entries[i] = r->entries[--r->n];
      break;
    }
  pthread_mutex_unlock(&r->mu);
  cinfer_adapter_free(gone);
  return gone != NULL;
}

static json_t *describe(const char *id, const cinfer_adapter *a, int runtime) {
  cinfer_adapter_info info;
  cinfer_adapter_get_info(a, &info);
  return json_pack("{s:s, s:s, s:s, s:i, s:i, s:f, s:I, s:s}", "id", id, "object", "adapter",
                   "format", info.format, "rank", info.max_rank, "modules", info.n_modules, "scale",
                   (double)info.scale, "parameters", (json_int_t)info.n_params, "mounted",
                   runtime ? "runtime" : "startup");
}

static json_t *list(ci_adapter_registry *r) {
  json_t *data = json_array();
  pthread_mutex_lock(&r->mu);
  for (int i = 0; i < r->n && data; i++)
    json_array_append_new(data,
                          describe(r->entries[i].id, r->entries[i].adapter, r->entries[i].runtime));
  pthread_mutex_unlock(&r->mu);
  return data ? json_pack("{s:s, s:o}", "object", "list", "data", data) : NULL;
}

/* Whether real (a resolved path) is root itself or inside it. */
static int inside(const char *root, const char *real) {
  const size_t n = strlen(root);
  return !strncmp(real, root, n) && (real[n] == '/' || real[n] == '\0' || !strcmp(root, "/"));
}

int ci_adapter_resolve(const char *root, const char *name, char *out, size_t out_size, char *err,
                       size_t err_size) {
  if (!root) {
    snprintf(err, err_size, "run-time mounting is off (start the server with --adapter-dir DIR)");
    return 403;
  }
  if (!ci_adapter_name_ok(name)) {
    snprintf(err, err_size,
             "an adapter name is one folder name under --adapter-dir: 1 to %d letters, digits, "
             "'.', '_' or '-', not starting with '.' (no paths)",
             MAX_NAME);
    return 400;
  }
  char path[PATH_MAX], real[PATH_MAX];
  snprintf(path, sizeof path, "%s/%s", root, name);
  if (!realpath(path, real)) {
    snprintf(err, err_size, "no adapter folder '%s' under --adapter-dir", name);
    return 404;
  }
  struct stat st;
  if (!inside(root, real) || !strcmp(real, root)) {
    snprintf(err, err_size, "adapter '%s' leads outside --adapter-dir (a symlink out)", name);
    return 403;
  }
  if (stat(real, &st) != 0 || !S_ISDIR(st.st_mode)) {
    snprintf(err, err_size, "adapter '%s' is not a folder", name);
    return 400;
  }
  /* the files the loader opens must stay inside too */
  static const char *const files[] = {"adapter_config.json", "adapter_model.safetensors",
                                      "adapters.safetensors"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char file[PATH_MAX], file_real[PATH_MAX];
    snprintf(file, sizeof file, "%s/%s", real, files[i]);
    if (!realpath(file, file_real)) continue; /* absent: the loader says what is missing */
    if (!inside(root, file_real)) {
      snprintf(err, err_size, "adapter '%s': %s leads outside --adapter-dir (a symlink out)", name,
               files[i]);
      return 403;
    }
  }
  if (strlen(real) >= out_size) {
    snprintf(err, err_size, "adapter path too long");
    return 400;
  }
  memcpy(out, real, strlen(real) + 1);
  return 0;
}

static int answer(json_t **out, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int answer(json_t **out, int status, const char *code, const char *fmt, ...) {
  char msg[700];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  *out = ci_server_error_body(0, status, code, msg);
  return status;
}

/* POST /v1/adapters {"name": FOLDER, "id": ID (default FOLDER)}. */
static int mount(ci_server *s, const char *body, size_t len, json_t **out) {
  json_error_t jerr;
  json_t *j = len ? json_loadb(body, len, 0, &jerr) : NULL;
  if (!json_is_object(j)) {
    json_decref(j);
    return answer(out, 400, "invalid_json",
                  "the body must be a JSON object {\"name\": FOLDER, \"id\": ID}");
  }
  const json_t *name = json_object_get(j, "name"), *id = json_object_get(j, "id");
  const json_t *path = json_object_get(j, "path");
  int status = 0;
  char err[600], real[PATH_MAX];
  if (path)
    status = answer(out, 400, "invalid_value",
                    "adapters are mounted by name under --adapter-dir, never by path");
  else if (!json_is_string(name))
    status = answer(out, 400, "invalid_value",
                    "name must be a string: an adapter folder under "
                    "--adapter-dir");
  else if (id && !json_is_null(id) &&
           (!json_is_string(id) || !ci_adapter_name_ok(json_string_value(id))))
    status = answer(out, 400, "invalid_value",
                    "id must be 1 to %d letters, digits, '.', '_' or '-', not starting with '.'",
                    MAX_NAME);
  if (!status) {
    const int r = ci_adapter_resolve(s->adapter_root, json_string_value(name), real, sizeof real,
                                     err, sizeof err);
    if (r)
      status = answer(out, r,
                      r == 404   ? "not_found"
                      : r == 403 ? "forbidden"
                                 : "invalid_value",
                      "%s", err);
  }
  cinfer_adapter *a = NULL;
  if (!status && cinfer_adapter_load(s->o.model, real, &a) != CINFER_OK)
    status = answer(out, 400, "invalid_adapter", "adapter '%s': %s", json_string_value(name),
                    cinfer_last_error());
  const char *key = id && json_is_string(id) ? json_string_value(id) : json_string_value(name);
  json_t *description = NULL;
  if (!status && !(description = describe(key, a, 1))) {
    cinfer_adapter_free(a);
    status = answer(out, 500, "internal_error", "out of memory");
  }
  if (!status) { /* once added, a concurrent DELETE may free the handle: describe it first */
    const int r = ci_adapter_registry_add(s->adapters, key, a, 1);
    if (r == 409)
      status =
          answer(out, 409, "conflict", "an adapter '%s' is already mounted (DELETE it first)", key);
    else if (r)
      status =
          answer(out, 507, "insufficient_storage",
                 "too many adapters mounted (at most %d); '%s' was not mounted", MAX_ADAPTERS, key);
    if (r) cinfer_adapter_free(a);
  }
  if (!status) {
    *out = description;
    status = 200;
  } else {
    json_decref(description);
  }
  json_decref(j);
  return status;
}

int ci_server_adapters(ci_server *s, const char *method, const char *url, const char *body,
                       size_t len, json_t **out) {
  if (s->n_keys == 0 && !s->loopback)
    return answer(out, 403, "forbidden",
                  "adapter administration is off: the server listens beyond loopback without "
                  "--api-key");
  if (!strcmp(url, "/v1/adapters")) {
    if (!strcmp(method, "POST")) return mount(s, body, len, out);
    *out = list(s->adapters);
    return *out ? 200 : answer(out, 500, "internal_error", "out of memory");
  }
  const char *id = url + strlen("/v1/adapters/");
  if (!registry_remove(s->adapters, id))
    return answer(out, 404, "not_found", "no adapter '%.100s' is mounted", id);
  *out = json_pack("{s:s, s:s, s:b}", "id", id, "object", "adapter", "deleted", 1);
  return 200;
}

int ci_srv_parse_adapter(ci_server *s, const json_t *body, ci_srv_job *job, char **err) {
  char msg[400];
  const json_t *field = json_object_get(body, "adapter");
  const char *name = NULL;
  if (field && !json_is_null(field)) {
    if (!json_is_string(field)) {
      *err = strdup("adapter must be a string: the id of a mounted adapter (GET /v1/adapters)");
      return -1;
    }
    name = *json_string_value(field) ? json_string_value(field) : NULL;
  }
  /* "model": "BASE:ID" picks adapter ID (BASE is this server's model, or any name when ID is
   * mounted) */
  const json_t *model = json_object_get(body, "model");
  const char *colon = json_is_string(model) ? strrchr(json_string_value(model), ':') : NULL;
  if (colon && colon[1] && s->adapters) {
    const char *m = json_string_value(model);
    const int own_base = s->o.model_id && strlen(s->o.model_id) == (size_t)(colon - m) &&
                         !strncmp(m, s->o.model_id, (size_t)(colon - m));
    int found;
    cinfer_adapter *probe = ci_adapter_registry_get(s->adapters, colon + 1, &found);
    cinfer_adapter_free(probe);
    if (found || own_base) {
      if (name && strcmp(name, colon + 1)) {
        snprintf(msg, sizeof msg, "adapter '%.100s' and model '%.100s' name different adapters",
                 name, m);
        *err = strdup(msg);
        return -1;
      }
      name = colon + 1;
    }
  }
  if (!name) return 0;
  int found = 0;
  job->adapter = s->adapters ? ci_adapter_registry_get(s->adapters, name, &found) : NULL;
  if (!job->adapter) {
    snprintf(msg, sizeof msg,
             found ? "out of memory"
                   : "adapter '%.100s' is not mounted (GET /v1/adapters lists them)",
             name);
    *err = strdup(msg);
    job->err_code = found ? NULL : "adapter_not_found";
    return -1;
  }
  job->params.adapter = job->adapter;
  return 0;
}
