/* HTTP transfers over libcurl: small GETs and resumable, verified downloads (see download.h). */
#include "hub/download.h"

#include "base/error.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { MAX_BODY = 64 << 20, ERROR_BODY = 1024 };

struct ci_http {
  CURL *curl;
  char *auth; /* "Authorization: Bearer TOKEN", or NULL */
};

ci_http *ci_http_create(const char *token) {
  /* curl_global_init is done once, thread-safely, by libcurl >= 7.84 on first use */
  ci_http *h = calloc(1, sizeof *h);
  if (!h) return ci_fail("out of memory"), NULL;
  h->curl = curl_easy_init();
  if (!h->curl) {
    free(h);
    return ci_fail("cannot start libcurl"), NULL;
  }
  if (token && token[0]) {
    if (asprintf(&h->auth, "Authorization: Bearer %s", token) < 0) {
      curl_easy_cleanup(h->curl);
      free(h);
      return ci_fail("out of memory"), NULL;
    }
  }
  return h;
}

void ci_http_free(ci_http *h) {
  if (!h) return;
  curl_easy_cleanup(h->curl);
  free(h->auth);
  free(h);
}

/* ==== Response headers ==== */

/* Copies the value of header line `line` into out when its name is `name`. */
static void header_value(const char *line, size_t len, const char *name, char *out, size_t cap) {
  const size_t n = strlen(name);
  if (len <= n + 1 || strncasecmp(line, name, n) != 0 || line[n] != ':') return;
  const char *v = line + n + 1;
  const char *end = line + len;
  while (v < end && (*v == ' ' || *v == '\t')) v++;
  while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ')) end--;
  size_t m = (size_t)(end - v);
  if (m >= cap) m = cap - 1;
  memcpy(out, v, m);
  out[m] = '\0';
}

static size_t on_header(char *line, size_t size, size_t count, void *user) {
  ci_http_result *res = user;
  const size_t len = size * count;
  if (len >= 5 && strncmp(line, "HTTP/", 5) == 0) {
    /* a new response (after a redirect): forget the previous one's headers */
    res->error_code[0] = '\0';
    res->error_message[0] = '\0';
  }
  header_value(line, len, "X-Error-Code", res->error_code, sizeof res->error_code);
  header_value(line, len, "X-Error-Message", res->error_message, sizeof res->error_message);
  return len;
}

/* Sets what every request shares: redirects, timeouts, auth, headers callback. */
static struct curl_slist *setup(ci_http *h, const char *url, ci_http_result *res) {
  CURL *c = h->curl;
  curl_easy_reset(c);
  memset(res, 0, sizeof *res);
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
  /* a stalled transfer (under 1 byte/s for 60 s) fails and is resumed */
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "cinfer/0.1.0");
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, res);
  struct curl_slist *headers = NULL;
  /* libcurl sends a custom Authorization header to the original host only, never to the host a
   * redirect leads to (the Hub redirects LFS files to a CDN) */
  if (h->auth) headers = curl_slist_append(headers, h->auth);
  if (headers) curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  return headers;
}

/* ==== Small GETs ==== */

typedef struct {
  char *data;
  size_t len, cap;
  int too_big;
} buffer;

static size_t on_body(char *data, size_t size, size_t count, void *user) {
  buffer *b = user;
  const size_t n = size * count;
  if (b->len + n + 1 > MAX_BODY) {
    b->too_big = 1;
    return 0;
  }
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n + 1) cap *= 2;
    char *grown = realloc(b->data, cap);
    if (!grown) return 0;
    b->data = grown;
    b->cap = cap;
  }
  memcpy(b->data + b->len, data, n);
  b->len += n;
  b->data[b->len] = '\0';
  return n;
}

int ci_http_get(ci_http *h, const char *url, char **body, size_t *len, ci_http_result *res) {
  *body = NULL;
  *len = 0;
  buffer b = {0};
  struct curl_slist *headers = setup(h, url, res);
  curl_easy_setopt(h->curl, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h->curl, CURLOPT_WRITEDATA, &b);
  const CURLcode code = curl_easy_perform(h->curl);
  curl_slist_free_all(headers);
  curl_easy_getinfo(h->curl, CURLINFO_RESPONSE_CODE, &res->status);
  if (code != CURLE_OK) {
    free(b.data);
    snprintf(res->transport_error, sizeof res->transport_error, "%s",
             b.too_big ? "answer larger than 64 MiB" : curl_easy_strerror(code));
    return ci_fail("GET %s: %s", url, res->transport_error);
  }
  if (res->status < 200 || res->status >= 300) {
    free(b.data);
    return ci_fail("GET %s: HTTP %ld", url, res->status);
  }
  if (!b.data) {
    b.data = strdup("");
    if (!b.data) return ci_fail("out of memory");
  }
  *body = b.data;
  *len = b.len;
  return CI_OK;
}

/* ==== Digests ==== */

int ci_file_digest(const char *path, const char *algorithm, char hex[65]) {
  const int git = strcmp(algorithm, "git-sha1") == 0;
  FILE *f = fopen(path, "rb");
  if (!f) return ci_fail("cannot open %s: %s", path, strerror(errno));
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  unsigned char *chunk = malloc(1 << 20);
  int rc = CI_ERR;
  if (!ctx || !chunk) {
    ci_fail("out of memory");
    goto done;
  }
  if (EVP_DigestInit_ex(ctx, git ? EVP_sha1() : EVP_sha256(), NULL) != 1) {
    ci_fail("cannot start a %s digest", algorithm);
    goto done;
  }
  if (git) {
    /* a git blob id is sha1("blob SIZE\0" + content) */
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
      ci_fail("cannot stat %s: %s", path, strerror(errno));
      goto done;
    }
    char prefix[48];
    const int n = snprintf(prefix, sizeof prefix, "blob %lld", (long long)st.st_size);
    EVP_DigestUpdate(ctx, prefix, (size_t)n + 1);
  }
  size_t got;
  while ((got = fread(chunk, 1, 1 << 20, f)) > 0) EVP_DigestUpdate(ctx, chunk, got);
  if (ferror(f)) {
    ci_fail("cannot read %s: %s", path, strerror(errno));
    goto done;
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int digest_len = 0;
  EVP_DigestFinal_ex(ctx, digest, &digest_len);
  for (unsigned int i = 0; i < digest_len; i++) sprintf(hex + 2 * i, "%02x", digest[i]);
  hex[2 * digest_len] = '\0';
  rc = CI_OK;
done:
  free(chunk);
  EVP_MD_CTX_free(ctx);
  fclose(f);
  return rc;
}

/* ==== Downloads ==== */

typedef struct {
  CURL *curl;
  FILE *file;
  int64_t offset; /* bytes of the partial file when the request was sent */
  int checked;    /* the response code was looked at */
  int writing;    /* the response is the file's content (200 or 206) */
  char error_body[ERROR_BODY];
  size_t error_len;
  const ci_download *d;
  int aborted; /* the progress callback asked to stop */
  int write_failed;
} transfer;

static size_t on_file_data(char *data, size_t size, size_t count, void *user) {
  transfer *t = user;
  const size_t n = size * count;
  if (!t->checked) {
    long status = 0;
    curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &status);
    t->checked = 1;
    t->writing = status == 200 || status == 206;
    if (status == 200 && t->offset > 0) {
      /* the server ignored the Range header: the body is the whole file */
      if (ftruncate(fileno(t->file), 0) != 0) {
        t->write_failed = 1;
        return 0;
      }
      t->offset = 0;
    }
  }
  if (!t->writing) {
    const size_t room = sizeof t->error_body - 1 - t->error_len;
    const size_t m = n < room ? n : room;
    memcpy(t->error_body + t->error_len, data, m);
    t->error_len += m;
    t->error_body[t->error_len] = '\0';
    return n;
  }
  if (fwrite(data, 1, n, t->file) != n) {
    t->write_failed = 1;
    return 0;
  }
  return n;
}

static int on_transfer_progress(void *user, curl_off_t dltotal, curl_off_t dlnow,
                                curl_off_t ultotal, curl_off_t ulnow) {
  (void)dltotal;
  (void)ultotal;
  (void)ulnow;
  transfer *t = user;
  if (!t->d->progress || !t->writing) return 0;
  if (t->d->progress(t->d->user, t->offset + (int64_t)dlnow, t->d->size)) {
    t->aborted = 1;
    return 1;
  }
  return 0;
}

static int64_t file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? (int64_t)st.st_size : -1;
}

static void pause_before_retry(int attempt) {
  const long ms = attempt < 8 ? 250L * attempt : 2000L;
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* One request for the rest of the file. Returns 0 when the body arrived whole, 1 when the
 * transfer broke and may be resumed (why in *res), CI_ERR on a final failure. */
static int attempt_transfer(ci_http *h, const ci_download *d, const char *partial,
                            ci_http_result *res) {
  int64_t have = file_size(partial);
  if (have > d->size) {
    if (truncate(partial, 0) != 0)
      return ci_fail("cannot truncate %s: %s", partial, strerror(errno));
    have = 0;
  }
  if (have < 0) have = 0;
  if (have == d->size && d->size > 0) return 0;
  transfer t = {.curl = h->curl, .offset = have, .d = d};
  t.file = fopen(partial, "ab");
  if (!t.file) return ci_fail("cannot write %s: %s", partial, strerror(errno));
  struct curl_slist *headers = setup(h, d->url, res);
  char range[64];
  if (have > 0) {
    snprintf(range, sizeof range, "%lld-", (long long)have);
    curl_easy_setopt(h->curl, CURLOPT_RANGE, range);
  }
  curl_easy_setopt(h->curl, CURLOPT_WRITEFUNCTION, on_file_data);
  curl_easy_setopt(h->curl, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(h->curl, CURLOPT_XFERINFOFUNCTION, on_transfer_progress);
  curl_easy_setopt(h->curl, CURLOPT_XFERINFODATA, &t);
  curl_easy_setopt(h->curl, CURLOPT_NOPROGRESS, 0L);
  const CURLcode code = curl_easy_perform(h->curl);
  curl_slist_free_all(headers);
  curl_easy_getinfo(h->curl, CURLINFO_RESPONSE_CODE, &res->status);
  const int closed = fclose(t.file) == 0;
  if (t.aborted) return ci_fail("%s: download cancelled", d->label);
  if (t.write_failed || !closed) return ci_fail("cannot write %s: %s", partial, strerror(errno));
  if (code == CURLE_OK && (res->status == 200 || res->status == 206)) return 0;
  if (code == CURLE_OK && res->status == 416 && have == d->size) return 0;
  if (code == CURLE_OK && res->status == 416) {
    /* the partial file is not a prefix the server recognises: start over */
    if (truncate(partial, 0) != 0)
      return ci_fail("cannot truncate %s: %s", partial, strerror(errno));
    snprintf(res->transport_error, sizeof res->transport_error, "range not satisfiable");
    return 1;
  }
  if (code != CURLE_OK) {
    snprintf(res->transport_error, sizeof res->transport_error, "%s", curl_easy_strerror(code));
    return 1;
  }
  if (res->status >= 500 || res->status == 408 || res->status == 429) {
    snprintf(res->transport_error, sizeof res->transport_error, "HTTP %ld", res->status);
    return 1;
  }
  if (!res->error_message[0] && t.error_len > 0) {
    /* the Hub puts its reason in the body too ({"error": "..."}); keep one line of it */
    char *nl = strchr(t.error_body, '\n');
    if (nl) *nl = '\0';
    snprintf(res->error_message, sizeof res->error_message, "%s", t.error_body);
  }
  return ci_fail("%s: HTTP %ld from %s", d->label, res->status, d->url);
}

int ci_http_download(ci_http *h, const ci_download *d, ci_http_result *res) {
  memset(res, 0, sizeof *res);
  char *partial = NULL;
  if (asprintf(&partial, "%s.incomplete", d->path) < 0) return ci_fail("out of memory");
  int rc = CI_ERR;
  /* one writer per partial file: a second pull of the same file waits for none and fails */
  const int lock_fd = open(partial, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0) {
    ci_fail("cannot write %s: %s", partial, strerror(errno));
    goto done;
  }
  if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    ci_fail("%s is being downloaded by another process (%s is locked)", d->label, partial);
    goto done;
  }
  for (int attempt = 0;; attempt++) {
    const int r = attempt_transfer(h, d, partial, res);
    if (r == 0) break;
    if (r < 0) {
      if (file_size(partial) == 0) unlink(partial); /* a refused request leaves no empty file */
      goto done;
    }
    if (attempt >= d->retries) {
      ci_fail("%s: %s (after %d resumptions; run the pull again to resume)", d->label,
              res->transport_error, d->retries);
      goto done;
    }
    const int64_t have = file_size(partial);
    if (d->on_retry) d->on_retry(d->user, attempt + 1, have > 0 ? have : 0, res->transport_error);
    pause_before_retry(attempt + 1);
  }
  const int64_t got = file_size(partial);
  if (got != d->size) {
    unlink(partial);
    ci_fail("%s: received %lld bytes, expected %lld; the download was discarded", d->label,
            (long long)got, (long long)d->size);
    goto done;
  }
  const char *algorithm = d->sha256 ? "sha256" : d->git_sha1 ? "git-sha1" : NULL;
  const char *want = d->sha256 ? d->sha256 : d->git_sha1;
  if (algorithm) {
    char hex[65];
    if (ci_file_digest(partial, algorithm, hex)) goto done;
    if (strcasecmp(hex, want) != 0) {
      unlink(partial);
      ci_fail("%s: %s mismatch (expected %s, got %s); the download was discarded", d->label,
              algorithm, want, hex);
      goto done;
    }
  }
  if (rename(partial, d->path) != 0) {
    ci_fail("cannot rename %s: %s", partial, strerror(errno));
    goto done;
  }
  rc = CI_OK;
done:
  if (lock_fd >= 0) close(lock_fd);
  free(partial);
  return rc;
}
