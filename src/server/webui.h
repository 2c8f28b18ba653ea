/* The chat page served at / (docs/server.md "Chat page"): the static files of webui/, compiled
 * into the binary by cmake/embed_webui.cmake, served with their content type and an ETag. */
#ifndef CI_SERVER_WEBUI_H
#define CI_SERVER_WEBUI_H

#include <stddef.h>

struct MHD_Connection;

typedef struct {
  const char *path; /* URL path: /index.html, /assets/NAME */
  const char *content_type;
  const char *etag; /* quoted, as sent in the ETag header */
  const unsigned char *data;
  size_t size;
} ci_webui_asset;

/* The generated table (build/webui_assets.c). */
extern const ci_webui_asset ci_webui_assets[];
extern const int ci_webui_n_assets;

/* The asset a URL names (/ is /index.html), or NULL. */
const ci_webui_asset *ci_webui_find(const char *url);

/* Answers a request for a page URL: GET and HEAD get the asset (304 when If-None-Match carries
 * its ETag), other methods 405. Returns 0 when url names no asset (the caller routes it), else
 * 1 with *queued set to libmicrohttpd's result of queueing the response and *status to the HTTP
 * status sent. */
int ci_webui_handle(struct MHD_Connection *c, const char *url, const char *method, int *queued,
                    int *status);

#endif
