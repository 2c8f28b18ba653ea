/* Model path resolution: folder, Hugging Face cache repo id, or a unique substring of one,
 * resolved offline against the hub cache layout (see model_path.h). */
#include "io/model_path.h"

#include "base/error.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

/* Longest ref file we read: a 40-hex commit hash plus a newline, with room to spare. */
enum { REF_CAP = 256 };

/* ==== Small helpers ==== */

/* Returns a malloc'd printf-style string, or NULL with the error set. */
static char *format_path(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *format_path(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *out = NULL;
  int n = vasprintf(&out, fmt, ap);
  va_end(ap);
  if (n < 0) {
    ci_fail("out of memory");
    return NULL;
  }
  return out;
}

static char *copy_string(const char *s) {
  char *out = strdup(s);
  if (!out) ci_fail("out of memory");
  return out;
}

static int is_directory(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* 1 if rev is a relative path without empty or ".." components (a ref name like "main" or
 * "refs/pr/1"), so that joining it under refs/ or snapshots/ stays inside the repo folder. */
static int is_safe_name(const char *rev) {
  if (rev[0] == '\0' || rev[0] == '/') return 0;
  for (const char *p = rev; *p;) {
    const char *slash = strchr(p, '/');
    size_t part = slash ? (size_t)(slash - p) : strlen(p);
    if (part == 0 || (part == 1 && p[0] == '.') || (part == 2 && p[0] == '.' && p[1] == '.')) {
      return 0;
    }
    p += part + (slash ? 1 : 0);
  }
  return 1;
}

char *ci_hf_repo_dir(const char *hub_dir, const char *repo_id) {
  size_t slashes = 0;
  for (const char *p = repo_id; *p; p++) slashes += *p == '/';
  size_t len = strlen(repo_id) + slashes + 1;
  char *flat = malloc(len);
  if (!flat) {
    ci_fail("out of memory");
    return NULL;
  }
  char *q = flat;
  for (const char *p = repo_id; *p; p++) {
    if (*p == '/') {
      *q++ = '-';
      *q++ = '-';
    } else {
      *q++ = *p;
    }
  }
  *q = '\0';
  char *folder = format_path("%s/models--%s", hub_dir, flat);
  free(flat);
  return folder;
}

/* Reads the commit hash in the ref file at path into out (trimmed). Returns 0, or -1 if the
 * file cannot be read. */
static int read_ref(const char *path, char *out, size_t cap) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t n = fread(out, 1, cap - 1, f);
  fclose(f);
  out[n] = '\0';
  while (n > 0 && isspace((unsigned char)out[n - 1])) out[--n] = '\0';
  size_t start = 0;
  while (out[start] && isspace((unsigned char)out[start])) start++;
  memmove(out, out + start, n - start + 1);
  return 0;
}

/* Finds the snapshot folder with the newest mtime under snapshots. Returns a malloc'd path, or
 * NULL (error set) when there is none. */
static char *newest_snapshot(const char *snapshots, const char *repo_id) {
  DIR *dir = opendir(snapshots);
  if (!dir) {
    ci_fail("%s has no snapshots in the Hugging Face cache (%s: %s)", repo_id, snapshots,
            strerror(errno));
    return NULL;
  }
  char *best = NULL;
  struct timespec best_time = {0, 0};
  struct dirent *entry;
  while ((entry = readdir(dir)) != NULL) {
    if (entry->d_name[0] == '.') continue;
    char *path = format_path("%s/%s", snapshots, entry->d_name);
    if (!path) break;
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
      free(path);
      continue;
    }
    int newer = !best || st.st_mtim.tv_sec > best_time.tv_sec ||
                (st.st_mtim.tv_sec == best_time.tv_sec &&
                 (st.st_mtim.tv_nsec > best_time.tv_nsec ||
                  (st.st_mtim.tv_nsec == best_time.tv_nsec && strcmp(path, best) > 0)));
    if (newer) {
      free(best);
      best = path;
      best_time = st.st_mtim;
    } else {
      free(path);
    }
  }
  closedir(dir);
  if (!best) ci_fail("%s has no snapshots in the Hugging Face cache (%s)", repo_id, snapshots);
  return best;
}

/* ==== Cache lookups ==== */

/* Value of environment variable name with a leading "~/" expanded; malloc'd, or NULL when the
 * variable is unset or empty (or on allocation failure, with the error set). */
static char *env_path(const char *name, const char *suffix) {
  const char *value = getenv(name);
  if (!value || !value[0]) return NULL;
  const char *home = getenv("HOME");
  if (value[0] == '~' && (value[1] == '/' || value[1] == '\0') && home && home[0]) {
    return format_path("%s%s%s", home, value + 1, suffix);
  }
  return format_path("%s%s", value, suffix);
}

char *ci_hf_hub_dir(void) {
  static const struct {
    const char *variable, *suffix;
  } sources[] = {
      {"HF_HUB_CACHE", ""},
      {"HUGGINGFACE_HUB_CACHE", ""},
      {"HF_HOME", "/hub"},
      {"XDG_CACHE_HOME", "/huggingface/hub"},
      {"HOME", "/.cache/huggingface/hub"},
  };
  for (size_t i = 0; i < sizeof sources / sizeof sources[0]; i++) {
    char *path = env_path(sources[i].variable, sources[i].suffix);
    if (path) return path;
  }
  ci_fail("cannot locate the Hugging Face cache: HF_HUB_CACHE, HF_HOME and HOME are unset");
  return NULL;
}

char *ci_hf_snapshot_path(const char *hub_dir, const char *repo_id, const char *revision) {
  const char *rev = revision ? revision : "main";
  if (!is_safe_name(rev)) {
    ci_fail("%s: invalid revision '%s'", repo_id, rev);
    return NULL;
  }
  char *repo = ci_hf_repo_dir(hub_dir, repo_id);
  if (!repo) return NULL;
  char *result = NULL;
  char *ref_path = NULL;
  char *snapshots = format_path("%s/snapshots", repo);
  if (!snapshots) goto done;
  if (!is_directory(repo)) {
    ci_fail("%s is not in the Hugging Face cache (%s)", repo_id, hub_dir);
    goto done;
  }
  ref_path = format_path("%s/refs/%s", repo, rev);
  if (!ref_path) goto done;
  char commit[REF_CAP];
  if (read_ref(ref_path, commit, sizeof commit) == 0) {
    if (!is_safe_name(commit) || strchr(commit, '/')) {
      ci_fail("%s: ref '%s' holds '%.64s', not a commit hash", repo_id, rev, commit);
      goto done;
    }
    char *path = format_path("%s/%s", snapshots, commit);
    if (path && !is_directory(path)) {
      ci_fail("%s: ref '%s' points to snapshot %s, which is not in the cache", repo_id, rev,
              commit);
      free(path);
      path = NULL;
    }
    result = path;
    goto done;
  }
  if (revision) {
    /* No ref of that name: the revision may be a commit hash naming a snapshot directly. */
    char *path = strchr(revision, '/') ? NULL : format_path("%s/%s", snapshots, revision);
    if (path && is_directory(path)) {
      result = path;
    } else {
      free(path);
      ci_fail("%s: revision '%s' is not in the Hugging Face cache (%s)", repo_id, revision, repo);
    }
    goto done;
  }
  result = newest_snapshot(snapshots, repo_id);
done:
  free(ref_path);
  free(snapshots);
  free(repo);
  return result;
}

void ci_hf_repo_list_free(char **ids, int count) {
  if (!ids) return;
  for (int i = 0; i < count; i++) free(ids[i]);
  free(ids);
}

static int compare_strings(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* "models--org--name" -> malloc'd "org/name" ("--" separates parts; repo names cannot hold
 * "--"), or NULL (error set). */
static char *repo_id_of_folder(const char *folder) {
  const char *flat = folder + strlen("models--");
  char *id = malloc(strlen(flat) + 1);
  if (!id) {
    ci_fail("out of memory");
    return NULL;
  }
  char *q = id;
  for (const char *p = flat; *p;) {
    if (p[0] == '-' && p[1] == '-') {
      *q++ = '/';
      p += 2;
    } else {
      *q++ = *p++;
    }
  }
  *q = '\0';
  return id;
}

int ci_hf_cached_repos(const char *hub_dir, char ***out_ids, int *out_count) {
  *out_ids = NULL;
  *out_count = 0;
  DIR *dir = opendir(hub_dir);
  if (!dir) {
    if (errno == ENOENT || errno == ENOTDIR) return CI_OK;
    return ci_fail("cannot read the Hugging Face cache %s: %s", hub_dir, strerror(errno));
  }
  char **ids = NULL;
  int count = 0, cap = 0;
  struct dirent *entry;
  while ((entry = readdir(dir)) != NULL) {
    const char *name = entry->d_name;
    if (strncmp(name, "models--", 8) != 0 || name[8] == '\0') continue;
    char *path = format_path("%s/%s", hub_dir, name);
    int is_dir = path && is_directory(path);
    free(path);
    if (!is_dir) continue;
    if (count == cap) {
      int new_cap = cap ? cap * 2 : 16;
      char **grown = realloc(ids, (size_t)new_cap * sizeof *ids);
      if (!grown) break;
      ids = grown;
      cap = new_cap;
    }
    char *id = repo_id_of_folder(name);
    if (!id) break;
    ids[count++] = id;
  }
  closedir(dir);
  if (count > 0) qsort(ids, (size_t)count, sizeof *ids, compare_strings);
  *out_ids = ids;
  *out_count = count;
  return CI_OK;
}

/* ==== Resolution ==== */

/* 1 if model is written as a filesystem path rather than a repo id. */
static int looks_like_path(const char *model) {
  return model[0] == '/' || model[0] == '~' || strncmp(model, "./", 2) == 0 ||
         strncmp(model, "../", 3) == 0 || strcmp(model, ".") == 0 || strcmp(model, "..") == 0;
}

/* Resolves query (with optional revision) by substring over the cached repo ids. */
static char *resolve_by_substring(const char *model, const char *hub_dir, const char *query,
                                  const char *revision) {
  char **ids;
  int count;
  if (ci_hf_cached_repos(hub_dir, &ids, &count) != CI_OK) return NULL;
  int matches = 0, first = -1, exact = -1;
  for (int i = 0; i < count; i++) {
    if (!strcasestr(ids[i], query)) continue;
    if (strcasecmp(ids[i], query) == 0) exact = i;
    if (first < 0) first = i;
    matches++;
  }
  char *result = NULL;
  if (exact >= 0 || matches == 1) {
    result = ci_hf_snapshot_path(hub_dir, ids[exact >= 0 ? exact : first], revision);
  } else if (matches == 0) {
    ci_fail("%s: not a folder, and no model in the Hugging Face cache (%s) matches it", model,
            hub_dir);
  } else {
    char list[768];
    size_t used = 0;
    list[0] = '\0';
    for (int i = 0; i < count && used < sizeof list; i++) {
      if (!strcasestr(ids[i], query)) continue;
      used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", used ? ", " : "", ids[i]);
    }
    ci_fail("%s matches %d cached models: %s (give the full repo id)", model, matches, list);
  }
  ci_hf_repo_list_free(ids, count);
  return result;
}

char *ci_model_path_resolve(const char *model) {
  if (!model || !model[0]) {
    ci_fail("no model given");
    return NULL;
  }
  struct stat st;
  if (stat(model, &st) == 0) {
    if (S_ISDIR(st.st_mode)) return copy_string(model);
    ci_fail("%s is a file, not a model folder", model);
    return NULL;
  }
  if (looks_like_path(model)) {
    ci_fail("%s: no such model folder", model);
    return NULL;
  }
  char *query = copy_string(model);
  if (!query) return NULL;
  char *revision = strrchr(query, '@');
  if (revision) {
    *revision++ = '\0';
    if (!revision[0] || !query[0]) {
      ci_fail("%s: expected org/name@revision", model);
      free(query);
      return NULL;
    }
  }
  char *result = NULL;
  char *hub_dir = ci_hf_hub_dir();
  if (hub_dir) {
    char *folder = ci_hf_repo_dir(hub_dir, query);
    if (folder && is_directory(folder)) {
      result = ci_hf_snapshot_path(hub_dir, query, revision);
    } else if (folder) {
      result = resolve_by_substring(model, hub_dir, query, revision);
    }
    free(folder);
  }
  free(hub_dir);
  free(query);
  return result;
}
