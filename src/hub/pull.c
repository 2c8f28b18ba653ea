/* `cinfer pull`: lists a revision of a Hub model repo through the Hub API
 * (GET ENDPOINT/api/models/REPO/revision/REV?blobs=true: the commit and every file with its size
 * and hash), keeps the files cinfer reads, downloads each from ENDPOINT/REPO/resolve/COMMIT/FILE
 * into the cache's blobs (resumed, verified: download.h) and links it into the snapshot
 * (hf_cache.h). The public cinfer_pull of include/cinfer.h. */
#include "cinfer.h"

#include "base/error.h"
#include "hub/download.h"
#include "hub/hf_cache.h"
#include "io/model_path.h"

#include <curl/curl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { DEFAULT_RETRIES = 5 };

void cinfer_pull_options_init(cinfer_pull_options *o) {
  memset(o, 0, sizeof *o);
  o->retries = DEFAULT_RETRIES;
}

/* ==== Which files ==== */

static int ends_with(const char *s, const char *suffix) {
  const size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* 1 for a file cinfer reads: configs, tokenizer, chat templates, the KV plan, safetensors and
 * their index, adapter files. Only the repo's top folder (subfolders hold other formats). */
static int wanted_file(const char *f) {
  static const char *names[] = {
      "config.json",           "generation_config.json",  "tokenizer.json",
      "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
      "chat_template.json",    "kv_config.json",          "adapter_config.json"};
  if (strchr(f, '/')) return 0;
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(f, names[i])) return 1;
  return ends_with(f, ".safetensors") || ends_with(f, ".safetensors.index.json");
}

/* One file to fetch. */
typedef struct {
  const char *name;     /* borrowed from the listing */
  const char *etag;     /* sha256 (LFS) or git blob id */
  const char *sha256;   /* LFS: expected sha256, else NULL */
  const char *git_sha1; /* other: expected blob id */
  int64_t size;
} repo_file;

/* ==== The pull ==== */

typedef struct {
  const cinfer_pull_options *o;
  cinfer_pull_progress p;
  struct timespec start, last_report;
  int64_t done_before; /* bytes of the files finished before the current one */
  int64_t file_start;  /* bytes of the current file present when its transfer began */
  int64_t downloaded_before;
  const char *token; /* NULL when none is sent */
  int cancelled;
} pull_state;

static double seconds_since(const struct timespec *t) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)(now.tv_sec - t->tv_sec) + 1e-9 * (double)(now.tv_nsec - t->tv_nsec);
}

/* Sends the current progress to the callback. Returns non-zero when it asks to stop. */
static int report(pull_state *s, cinfer_pull_event event) {
  if (!s->o->progress) return 0;
  s->p.event = event;
  s->p.seconds = seconds_since(&s->start);
  clock_gettime(CLOCK_MONOTONIC, &s->last_report);
  if (s->o->progress(s->o->user, &s->p)) {
    s->cancelled = 1;
    return 1;
  }
  return 0;
}

static int on_download_progress(void *user, int64_t done, int64_t total) {
  pull_state *s = user;
  (void)total;
  if (done < s->file_start) s->file_start = done; /* the server restarted the file */
  s->p.file_done = done;
  s->p.done = s->done_before + done;
  s->p.downloaded = s->downloaded_before + (done - s->file_start);
  if (seconds_since(&s->last_report) < 0.1) return 0;
  return report(s, CINFER_PULL_FILE_PROGRESS);
}

static void on_download_retry(void *user, int attempt, int64_t done, const char *why) {
  pull_state *s = user;
  (void)attempt;
  s->downloaded_before = s->p.downloaded;
  s->file_start = done;
  s->p.file_done = done;
  s->p.done = s->done_before + done;
  s->p.message = why;
  report(s, CINFER_PULL_FILE_RETRY);
  s->p.message = NULL;
}

/* Words the error of a refused Hub request. */
static cinfer_status hub_error(const char *what, const char *repo_id, const char *revision,
                               const char *endpoint, const char *token, const ci_http_result *r) {
  const char *code = r->error_code;
  if (r->status == 0)
    return ci_fail("cannot reach the Hub at %s: %s (check the network, or set HF_ENDPOINT)",
                   endpoint, r->transport_error[0] ? r->transport_error : ci_last_error()),
           CINFER_ERROR;
  if (!strcmp(code, "GatedRepo") || r->status == 403)
    return ci_fail("repo %s is gated: accept its terms on the Hub and set HF_TOKEN%s (%s: HTTP "
                   "%ld%s%s)",
                   repo_id, token ? " to a token of that account" : "", what, r->status,
                   r->error_message[0] ? ": " : "", r->error_message),
           CINFER_ERROR;
  if (!strcmp(code, "RevisionNotFound"))
    return ci_fail("revision '%s' not found in repo %s on %s", revision, repo_id, endpoint),
           CINFER_ERROR;
  if (!strcmp(code, "EntryNotFound"))
    return ci_fail("%s: file not found in repo %s at revision %s", what, repo_id, revision),
           CINFER_ERROR;
  if (r->status == 404 || !strcmp(code, "RepoNotFound") || !strcmp(code, "RepositoryNotFound"))
    return ci_fail("repo %s not found on %s%s", repo_id, endpoint,
                   token ? "" : " (if it is private or gated, set HF_TOKEN)"),
           CINFER_ERROR;
  if (r->status == 401)
    return ci_fail(token ? "the Hub refused HF_TOKEN for repo %s (HTTP 401): check the token"
                         : "repo %s needs a token: it is gated or private: accept its terms on "
                           "the Hub and set HF_TOKEN",
                   repo_id),
           CINFER_ERROR;
  return ci_fail("%s of repo %s failed: HTTP %ld%s%s", what, repo_id, r->status,
                 r->error_message[0] ? ": " : "", r->error_message),
         CINFER_ERROR;
}

/* Reads the listing into files[] (borrowing strings from root). */
static cinfer_status read_listing(json_t *root, const char *repo_id, const char **commit,
                                  repo_file **out, int *n_out) {
  *out = NULL;
  *n_out = 0;
  *commit = json_string_value(json_object_get(root, "sha"));
  json_t *siblings = json_object_get(root, "siblings");
  if (!*commit || !json_is_array(siblings))
    return ci_fail("the Hub's listing of %s has no \"sha\" or \"siblings\"", repo_id), CINFER_ERROR;
  if (ci_hf_revision_check(*commit) || strchr(*commit, '/'))
    return ci_fail("the Hub's listing of %s has a bad commit '%.64s'", repo_id, *commit),
           CINFER_ERROR;
  repo_file *files = calloc(json_array_size(siblings) + 1, sizeof *files);
  if (!files) return ci_fail("out of memory"), CINFER_ERROR;
  int n = 0;
  size_t i;
  json_t *entry;
  json_array_foreach(siblings, i, entry) {
    const char *name = json_string_value(json_object_get(entry, "rfilename"));
    if (!name || !wanted_file(name)) continue;
    if (ci_hf_repo_file_check(name)) {
      free(files);
      return CINFER_ERROR;
    }
    repo_file *f = &files[n];
    f->name = name;
    json_t *lfs = json_object_get(entry, "lfs");
    json_t *size = json_object_get(entry, "size");
    if (json_is_object(lfs)) {
      f->sha256 = json_string_value(json_object_get(lfs, "sha256"));
      f->etag = f->sha256;
      json_t *lfs_size = json_object_get(lfs, "size");
      if (json_is_integer(lfs_size)) size = lfs_size;
    } else {
      f->git_sha1 = json_string_value(json_object_get(entry, "blobId"));
      f->etag = f->git_sha1;
    }
    if (!f->etag || !json_is_integer(size) || json_integer_value(size) < 0) {
      free(files);
      return ci_fail("the Hub's listing of %s lacks the size or hash of %s", repo_id, name),
             CINFER_ERROR;
    }
    for (const char *c = f->etag; *c; c++)
      if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f'))) {
        free(files);
        return ci_fail("the Hub's listing of %s has a bad hash for %s", repo_id, name),
               CINFER_ERROR;
      }
    f->size = (int64_t)json_integer_value(size);
    n++;
  }
  int has_config = 0;
  for (int k = 0; k < n; k++) has_config |= !strcmp(files[k].name, "config.json");
  if (!has_config) {
    free(files);
    return ci_fail("repo %s has no config.json: not a model cinfer can run", repo_id), CINFER_ERROR;
  }
  *out = files;
  *n_out = n;
  return CINFER_OK;
}

/* Escapes each part of a path for a URL, keeping the slashes. */
static char *escape_path(CURL *curl, const char *path) {
  size_t cap = strlen(path) * 3 + 1, used = 0;
  char *out = malloc(cap);
  if (!out) return NULL;
  out[0] = '\0';
  for (const char *p = path;;) {
    const char *slash = strchr(p, '/');
    const size_t len = slash ? (size_t)(slash - p) : strlen(p);
    char *part = curl_easy_escape(curl, p, (int)len);
    if (!part) {
      free(out);
      return NULL;
    }
    used += (size_t)snprintf(out + used, cap - used, "%s%s", part, slash ? "/" : "");
    curl_free(part);
    if (!slash) break;
    p = slash + 1;
  }
  return out;
}

/* Fetches one file into the cache's blobs (the snapshot links it once every file is there). */
static cinfer_status pull_file(pull_state *s, ci_http *http, CURL *escaper, const char *endpoint,
                               const char *repo_id, const char *repo_dir, const char *revision,
                               const repo_file *f) {
  char *blob = NULL, *url = NULL, *file_url = escape_path(escaper, f->name);
  cinfer_status st = CINFER_ERROR;
  if (!file_url || asprintf(&blob, "%s/blobs/%s", repo_dir, f->etag) < 0 ||
      asprintf(&url, "%s/%s/resolve/%s/%s", endpoint, repo_id, s->p.commit, file_url) < 0) {
    blob = url = NULL;
    ci_fail("out of memory");
    goto done;
  }
  s->p.file = f->name;
  s->p.file_total = f->size;
  struct stat sb;
  if (stat(blob, &sb) == 0 && S_ISREG(sb.st_mode) && (int64_t)sb.st_size == f->size) {
    /* a blob is only ever renamed into place after its hash matched */
    s->p.file_done = f->size;
    s->p.done = s->done_before + f->size;
    if (report(s, CINFER_PULL_FILE_CACHED)) goto cancelled;
  } else {
    char *partial = NULL;
    if (asprintf(&partial, "%s.incomplete", blob) < 0) {
      ci_fail("out of memory");
      goto done;
    }
    const int have = stat(partial, &sb) == 0 && (int64_t)sb.st_size <= f->size;
    free(partial);
    s->file_start = have ? (int64_t)sb.st_size : 0;
    s->p.file_done = s->file_start;
    s->p.done = s->done_before + s->file_start;
    if (report(s, CINFER_PULL_FILE_START)) goto cancelled;
    const ci_download d = {.url = url,
                           .label = f->name,
                           .path = blob,
                           .size = f->size,
                           .sha256 = f->sha256,
                           .git_sha1 = f->git_sha1,
                           .retries = s->o->retries,
                           .progress = on_download_progress,
                           .on_retry = on_download_retry,
                           .user = s};
    ci_http_result r;
    if (ci_http_download(http, &d, &r)) {
      if (s->cancelled) goto cancelled;
      if (r.status >= 400) {
        char what[1100];
        snprintf(what, sizeof what, "%s", f->name);
        st = hub_error(what, repo_id, revision, endpoint, s->token, &r);
      }
      goto done;
    }
    s->downloaded_before = s->p.downloaded = s->downloaded_before + (f->size - s->file_start);
    s->p.file_done = f->size;
    s->p.done = s->done_before + f->size;
    if (report(s, CINFER_PULL_FILE_DONE)) goto cancelled;
  }
  s->done_before += f->size;
  st = CINFER_OK;
  goto done;
cancelled:
  ci_fail("pull of %s cancelled (a partial file is kept and resumed by the next pull)", repo_id);
  st = CINFER_CANCELLED;
done:
  free(file_url);
  free(url);
  free(blob);
  return st;
}

cinfer_status cinfer_pull(const char *repo, const cinfer_pull_options *options,
                          char **snapshot_dir) {
  if (snapshot_dir) *snapshot_dir = NULL;
  cinfer_pull_options defaults;
  cinfer_pull_options_init(&defaults);
  const cinfer_pull_options *o = options ? options : &defaults;
  if (o->retries < 0) return ci_fail("pull: retries must be >= 0"), CINFER_INVALID_ARGUMENT;
  char *repo_id = NULL, *rev_given = NULL;
  if (ci_hf_repo_ref_parse(repo, &repo_id, &rev_given)) return CINFER_INVALID_ARGUMENT;
  const char *revision = rev_given ? rev_given : "main";

  const char *endpoint_given = o->endpoint ? o->endpoint : getenv("HF_ENDPOINT");
  if (!endpoint_given || !endpoint_given[0]) endpoint_given = "https://huggingface.co";
  const char *token = o->token ? o->token : getenv("HF_TOKEN");
  if (token && !token[0]) token = NULL;

  cinfer_status st = CINFER_ERROR;
  char *endpoint = strdup(endpoint_given), *hub = NULL, *repo_dir = NULL, *url = NULL;
  char *body = NULL, *rev_escaped = NULL, *snapshot = NULL;
  ci_http *http = NULL;
  json_t *root = NULL;
  repo_file *files = NULL;
  int n_files = 0;
  if (!endpoint) {
    ci_fail("out of memory");
    goto done;
  }
  for (size_t n = strlen(endpoint); n > 0 && endpoint[n - 1] == '/'; n--) endpoint[n - 1] = '\0';
  hub = o->cache_dir ? strdup(o->cache_dir) : ci_hf_hub_dir();
  if (!hub || !(repo_dir = ci_hf_repo_dir(hub, repo_id))) {
    if (!hub) ci_fail("out of memory");
    goto done;
  }
  http = ci_http_create(token);
  if (!http) goto done;
  CURL *escaper = curl_easy_init();
  if (!escaper) {
    ci_fail("cannot start libcurl");
    goto done;
  }
  rev_escaped = curl_easy_escape(escaper, revision, 0);
  if (!rev_escaped || asprintf(&url, "%s/api/models/%s/revision/%s?blobs=true", endpoint, repo_id,
                               rev_escaped) < 0) {
    url = NULL;
    curl_easy_cleanup(escaper);
    ci_fail("out of memory");
    goto done;
  }
  pull_state s = {.o = o, .token = token};
  clock_gettime(CLOCK_MONOTONIC, &s.start);
  s.last_report = s.start;
  s.p.repo_id = repo_id;

  size_t len;
  ci_http_result r;
  if (ci_http_get(http, url, &body, &len, &r)) {
    st = hub_error("listing", repo_id, revision, endpoint, token, &r);
    curl_easy_cleanup(escaper);
    goto done;
  }
  json_error_t jerr;
  root = json_loadb(body, len, 0, &jerr);
  const char *commit = NULL;
  if (!root) {
    ci_fail("the Hub's listing of %s is not JSON (%s)", repo_id, jerr.text);
    curl_easy_cleanup(escaper);
    goto done;
  }
  if ((st = read_listing(root, repo_id, &commit, &files, &n_files)) != CINFER_OK) {
    curl_easy_cleanup(escaper);
    goto done;
  }
  st = CINFER_ERROR;
  s.p.commit = commit;
  s.p.n_files = n_files;
  for (int i = 0; i < n_files; i++) s.p.total += files[i].size;
  char *blobs = NULL;
  if (asprintf(&blobs, "%s/blobs", repo_dir) < 0) {
    curl_easy_cleanup(escaper);
    ci_fail("out of memory");
    goto done;
  }
  const int made = ci_hf_mkdirs(blobs);
  free(blobs);
  if (made || asprintf(&snapshot, "%s/snapshots/%s", repo_dir, commit) < 0 ||
      ci_hf_mkdirs(snapshot)) {
    curl_easy_cleanup(escaper);
    goto done;
  }
  if (report(&s, CINFER_PULL_LISTED)) {
    curl_easy_cleanup(escaper);
    ci_fail("pull of %s cancelled", repo_id);
    st = CINFER_CANCELLED;
    goto done;
  }
  for (int i = 0; i < n_files; i++) {
    s.p.file_index = i;
    st = pull_file(&s, http, escaper, endpoint, repo_id, repo_dir, revision, &files[i]);
    if (st != CINFER_OK) break;
  }
  curl_easy_cleanup(escaper);
  if (st != CINFER_OK) {
    /* an interrupted first pull leaves no snapshot that looks complete (blobs stay: resumable) */
    rmdir(snapshot);
    goto done;
  }
  st = CINFER_ERROR;
  for (int i = 0; i < n_files; i++)
    if (ci_hf_link_snapshot(repo_dir, commit, files[i].name, files[i].etag)) goto done;
  /* a branch or tag records its commit; a pull by commit hash needs no ref */
  if (strcmp(revision, commit) != 0 && ci_hf_write_ref(repo_dir, revision, commit)) goto done;
  st = CINFER_OK;
  if (snapshot_dir) {
    *snapshot_dir = snapshot;
    snapshot = NULL;
  }
done:
  free(files);
  json_decref(root);
  free(body);
  curl_free(rev_escaped);
  free(url);
  ci_http_free(http);
  free(snapshot);
  free(repo_dir);
  free(hub);
  free(endpoint);
  free(repo_id);
  free(rev_given);
  return st;
}
