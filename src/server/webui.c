/* Serving the chat page (docs/server.md "Chat page"): looks a URL up in the assets that
 * cmake/embed_webui.cmake compiled in and answers GET/HEAD with the bytes, content type, ETag
 * and a no-cache policy (browsers revalidate, so a new binary's page is picked up at once);
 * If-None-Match with the current ETag gets 304. The page talks to the API routes with fetch, so
 * it needs no API key itself; it asks the user for one when the API answers 401. */
#include "server/webui.h"

#include <microhttpd.h>
#include <string.h>

const ci_webui_asset *ci_webui_find(const char *url) {
  if (!strcmp(url, "/")) url = "/index.html";
  for (int i = 0; i < ci_webui_n_assets; i++)
    if (!strcmp(url, ci_webui_assets[i].path)) return &ci_webui_assets[i];
  return NULL;
}

/* 1 when an If-None-Match header lists etag (or is *). */
static int etag_matches(const char *header, const char *etag) {
  if (!header) return 0;
  if (!strcmp(header, "*")) return 1;
  const size_t n = strlen(etag);
  for (const char *p = strstr(header, etag); p; p = strstr(p + 1, etag)) {
    const char after = p[n];
    if (after == '\0' || after == ',' || after == ' ') return 1;
  }
  return 0;
}

static void add_common_headers(struct MHD_Response *r, const ci_webui_asset *a) {
  MHD_add_response_header(r, "ETag", a->etag);
  MHD_add_response_header(r, "Cache-Control", "no-cache");
  MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
  MHD_add_response_header(r, "Content-Security-Policy",
                          "default-src 'self'; img-src 'self' data:; style-src 'self'; "
                          "script-src 'self'; connect-src 'self'; frame-ancestors 'none'");
}

int ci_webui_handle(struct MHD_Connection *c, const char *url, const char *method, int *queued,
                    int *status) {
  const ci_webui_asset *a = ci_webui_find(url);
  if (!a) return 0;
  struct MHD_Response *r;
  if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
    static const char msg[] = "{\"error\":{\"message\":\"method not allowed (the chat page answers "
                              "GET and HEAD)\",\"type\":\"invalid_request_error\",\"param\":null,"
                              "\"code\":\"method_not_allowed\"}}";
    r = MHD_create_response_from_buffer(sizeof msg - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
    *status = 405;
    if (r) {
      MHD_add_response_header(r, "Content-Type", "application/json");
      MHD_add_response_header(r, "Allow", "GET, HEAD");
    }
  } else if (etag_matches(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "If-None-Match"),
                          a->etag)) {
    r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    *status = 304;
    if (r) add_common_headers(r, a);
  } else {
    r = MHD_create_response_from_buffer(a->size, (void *)a->data, MHD_RESPMEM_PERSISTENT);
    *status = 200;
    if (r) {
      MHD_add_response_header(r, "Content-Type", a->content_type);
      add_common_headers(r, a);
    }
  }
  if (!r) {
    *queued = MHD_NO;
    return 1;
  }
  *queued = MHD_queue_response(c, (unsigned)*status, r);
  MHD_destroy_response(r);
  return 1;
}
