/* HTTP transfers of the hub client over libcurl: a GET of a small document (the Hub API's JSON)
 * and a resumable, verified file download into the cache's blobs folder.
 *
 * A download writes PATH.incomplete; when that file exists it is resumed with a Range request
 * (a server that answers 200 instead of 206 restarts it). A transfer that breaks (connection
 * reset, truncated body, timeout, 5xx) is resumed the same way up to `retries` times. The
 * finished file is checked against its expected size and hash — sha256 for LFS files, the git
 * blob sha1 for the small files git stores itself — and only then renamed to PATH; a file that
 * does not match is deleted, never left to be resumed or used. */
#ifndef CI_HUB_DOWNLOAD_H
#define CI_HUB_DOWNLOAD_H

#include <stddef.h>
#include <stdint.h>

typedef struct ci_http ci_http;

/* The outcome of the last HTTP exchange, for the caller's error messages. */
typedef struct {
  long status;               /* HTTP status of the final response; 0 when none arrived */
  char error_code[64];       /* the Hub's X-Error-Code header ("GatedRepo", ...), or "" */
  char error_message[256];   /* its X-Error-Message header, or "" */
  char transport_error[256]; /* libcurl's message when the transfer failed below HTTP, or "" */
} ci_http_result;

/* A client sending `Authorization: Bearer token` when token is non-NULL and non-empty (copied).
 * NULL with ci_last_error on failure. */
ci_http *ci_http_create(const char *token);

/* Frees the client. NULL is a no-op. */
void ci_http_free(ci_http *http);

/* GETs url (following redirects) into *body (malloc'd, NUL-terminated, *len bytes without the
 * NUL; at most 64 MiB). Returns CI_OK on a 2xx answer; otherwise CI_ERR with *res filled and a
 * generic message (the caller words the error with the status). */
int ci_http_get(ci_http *http, const char *url, char **body, size_t *len, ci_http_result *res);

/* Called while a download runs: bytes of the file present so far (resumed bytes included) and its
 * size. Return non-zero to abort the download (it keeps PATH.incomplete for a later resume). */
typedef int (*ci_download_progress)(void *user, int64_t done, int64_t total);

/* Called when a broken transfer is about to be resumed (attempt 1, 2, ...). */
typedef void (*ci_download_retry)(void *user, int attempt, int64_t done, const char *why);

typedef struct {
  const char *url;
  const char *label;             /* names the file in messages */
  const char *path;              /* the blob to produce; PATH.incomplete is the partial file */
  int64_t size;                  /* expected bytes (required) */
  const char *sha256;            /* expected lowercase hex sha256 (LFS files), or NULL */
  const char *git_sha1;          /* expected git blob sha1 (other files), or NULL */
  int retries;                   /* resumptions of a broken transfer */
  ci_download_progress progress; /* may be NULL */
  ci_download_retry on_retry;    /* may be NULL */
  void *user;
} ci_download;

/* Downloads d->url to d->path as described above. Returns CI_OK, or CI_ERR with a message (and
 * *res describing the last exchange: an HTTP status >= 400 means the server refused). */
int ci_http_download(ci_http *http, const ci_download *d, ci_http_result *res);

/* The lowercase hex sha256 (algorithm "sha256") or git blob sha1 ("git-sha1") of the file at
 * path, into hex (65 bytes). Returns CI_OK or CI_ERR. */
int ci_file_digest(const char *path, const char *algorithm, char hex[65]);

#endif
