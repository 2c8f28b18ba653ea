/* HTTP plumbing over libmicrohttpd (docs/server.md "HTTP basics", "Errors"): a thread per
 * connection in poll() mode with a connection limit and an idle timeout, body collection with a
 * size limit, bearer / x-api-key auth, CORS (--cors: Access-Control-Allow-* headers and OPTIONS
 * preflight), the route table (HEAD wherever GET; the chat page's URLs go to webui.c unless
 * --no-webui), JSON and SSE responses, errors in each API's shape, an access log line per request
 * (text or JSON), and --host names / IPv6 with the bound port read back (--port 0). A client that
 * disconnects mid-stream makes libmicrohttpd free the stream, which releases (cancels) its engine
 * request; the generating routes also watch the socket (generation.c). */
#include "server/server.h"

#include "base/error.h"
#include "base/timing.h"
#include "server/webui.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <stdarg.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==== Errors ==== */

static const struct {
  int status;
  const char *openai_type, *anthropic_type;
} error_types[] = {
    {400, "invalid_request_error", "invalid_request_error"},
    {401, "authentication_error", "authentication_error"},
    {404, "not_found_error", "not_found_error"},
    {405, "invalid_request_error", "invalid_request_error"},
    {413, "invalid_request_error", "request_too_large"},
    {429, "server_error", "overloaded_error"},
    {500, "server_error", "api_error"},
    {503, "server_error", "overloaded_error"},
};

json_t *ci_server_error_body(int anthropic, int status, const char *code, const char *message) {
  const char *ot = "invalid_request_error", *at = "invalid_request_error";
  for (size_t i = 0; i < sizeof error_types / sizeof error_types[0]; i++)
    if (error_types[i].status == status)
      ot = error_types[i].openai_type, at = error_types[i].anthropic_type;
  json_t *msg = json_string(message);
  if (!msg) msg = json_string("invalid request");
  if (anthropic)
    return json_pack("{s:s, s:{s:s, s:o}}", "type", "error", "error", "type", at, "message", msg);
  return json_pack("{s:{s:o, s:s, s:n, s:s}}", "error", "message", msg, "type", ot, "param", "code",
                   code);
}

/* ==== Metrics helpers ==== */

static const double hist_bounds[CI_HIST_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                    0.5,   1,    2.5,   5,    10,  30};

void ci_histogram_observe(ci_histogram *h, double seconds) {
  int b = 0;
  while (b < CI_HIST_BUCKETS && seconds > hist_bounds[b]) b++;
  h->counts[b]++;
  h->sum += seconds;
  h->n++;
}

void ci_server_count_request(ci_server *s, const char *route, int status) {
  pthread_mutex_lock(&s->metrics_mu);
  int i = 0;
  while (i < s->n_routes && (s->routes[i].status != status || strcmp(s->routes[i].route, route)))
    i++;
  if (i == s->n_routes && s->n_routes < (int)(sizeof s->routes / sizeof s->routes[0])) {
    snprintf(s->routes[i].route, sizeof s->routes[i].route, "%s", route);
    s->routes[i].status = status;
    s->n_routes++;
  }
  if (i < s->n_routes) s->routes[i].count++;
  pthread_mutex_unlock(&s->metrics_mu);
}

/* ==== Connections ==== */

typedef struct {
  ci_strbuf body;
  int too_large;
  int status;     /* the response's status (0 until one is queued) */
  double t_start; /* when the request arrived */
  char method[16];
  char path[128];
} connection;

/* ==== CORS (docs/server.md "Routes": off unless --cors ORIGIN|*) ==== */

/* The Access-Control-Allow-Origin value for this request: "*", the request's Origin when it is
 * one of the --cors list, else NULL (no CORS headers). */
static const char *cors_origin(const ci_server *s, struct MHD_Connection *c) {
  if (!s->o.cors || !*s->o.cors) return NULL;
  if (!strcmp(s->o.cors, "*")) return "*";
  const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
  if (!origin) return NULL;
  const size_t n = strlen(origin);
  for (const char *p = s->o.cors; *p;) {
    const char *end = strchr(p, ',');
    const size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len == n && !memcmp(p, origin, n)) return origin;
    p += len + (end ? 1 : 0);
  }
  return NULL;
}

static void add_cors(const ci_server *s, struct MHD_Connection *c, struct MHD_Response *r) {
  const char *origin = cors_origin(s, c);
  if (!origin) return;
  MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
  if (strcmp(origin, "*")) MHD_add_response_header(r, "Vary", "Origin");
}

/* An OPTIONS preflight: 204 with the allowed methods and headers (no auth: browsers send none). */
static enum MHD_Result send_preflight(const ci_server *s, struct MHD_Connection *c,
                                      connection *conn) {
  conn->status = 204;
  struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
  add_cors(s, c, r);
  const char *asked =
      MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
  MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
  MHD_add_response_header(r, "Access-Control-Allow-Headers",
                          asked ? asked
                                : "Authorization, Content-Type, x-api-key, anthropic-version, "
                                  "anthropic-beta");
  MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
  const enum MHD_Result ok = MHD_queue_response(c, 204, r);
  MHD_destroy_response(r);
  return ok;
}

/* ==== Responses ==== */

/* Queues text (taken, freed by libmicrohttpd) with a content type, CORS headers and, for 429,
 * Retry-After. */
static enum MHD_Result send_text(const ci_server *s, struct MHD_Connection *c, connection *conn,
                                 int status, const char *type, char *text) {
  static const char out_of_memory[] =
      "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}";
  struct MHD_Response *r =
      text ? MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE)
           : MHD_create_response_from_buffer(sizeof out_of_memory - 1, (void *)out_of_memory,
                                             MHD_RESPMEM_PERSISTENT);
  if (!r) {
    free(text);
    return MHD_NO;
  }
  if (!text) status = 500, type = "application/json";
  conn->status = status;
  MHD_add_response_header(r, "Content-Type", type);
  if (status == 429) MHD_add_response_header(r, "Retry-After", "1");
  add_cors(s, c, r);
  const enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
  MHD_destroy_response(r);
  return ok;
}

static enum MHD_Result send_json(const ci_server *s, struct MHD_Connection *c, connection *conn,
                                 int status, json_t *obj /* stolen */) {
  char *text = obj ? json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(obj);
  if (!text)
    text = strdup("{\"error\":{\"message\":\"internal error\",\"type\":\"server_error\"}}");
  return send_text(s, c, conn, status, "application/json", text);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  ci_srv_stream *st = cls;
  while (st->out_pos == st->out.len) {
    if (st->finished) return MHD_CONTENT_READER_END_OF_STREAM;
    st->out.len = st->out_pos = 0;
    st->produce(st);
  }
  size_t n = st->out.len - st->out_pos;
  if (n > max) n = max;
  memcpy(buf, st->out.data + st->out_pos, n);
  st->out_pos += n;
  return (ssize_t)n;
}

static void stream_free(void *cls) {
  ci_srv_stream_free(cls);
}

static enum MHD_Result send_stream(const ci_server *s, struct MHD_Connection *c, connection *conn,
                                   ci_srv_stream *st) {
  conn->status = 200;
  struct MHD_Response *r =
      MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, st, stream_free);
  MHD_add_response_header(r, "Content-Type", "text/event-stream");
  MHD_add_response_header(r, "Cache-Control", "no-cache");
  add_cors(s, c, r);
  const enum MHD_Result ok = MHD_queue_response(c, 200, r);
  MHD_destroy_response(r);
  return ok;
}

static int authorized(ci_server *s, struct MHD_Connection *c) {
  if (s->n_keys == 0) return 1;
  const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
  const char *xkey = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
  for (int i = 0; i < s->n_keys; i++) {
    if (xkey && !strcmp(xkey, s->keys[i])) return 1;
    if (auth && !strncmp(auth, "Bearer ", 7) && !strcmp(auth + 7, s->keys[i])) return 1;
  }
  return 0;
}

/* The route table. */
typedef enum {
  R_CHAT,
  R_COMPLETIONS,
  R_MESSAGES,
  R_COUNT_TOKENS,
  R_RESPONSES,
  R_EMBEDDINGS,
  R_MODELS,
  R_MODEL,
  R_TOKENIZE,
  R_DETOKENIZE,
  R_HEALTH,
  R_METRICS,
  R_STATS,
  R_CACHE_SAVE,
  R_CACHE_LOAD,
  R_ADAPTERS
} route_id;
static const struct {
  const char *path;
  const char *method;
  route_id id;
} routes[] = {
    {"/v1/chat/completions", "POST", R_CHAT},
    {"/chat/completions", "POST", R_CHAT},
    {"/v1/completions", "POST", R_COMPLETIONS},
    {"/v1/messages", "POST", R_MESSAGES},
    {"/v1/messages/count_tokens", "POST", R_COUNT_TOKENS},
    {"/v1/responses", "POST", R_RESPONSES},
    {"/v1/embeddings", "POST", R_EMBEDDINGS},
    {"/embeddings", "POST", R_EMBEDDINGS},
    {"/v1/models", "GET", R_MODELS},
    {"/v1/models/*", "GET", R_MODEL}, /* a trailing * matches any non-empty rest */
    {"/tokenize", "POST", R_TOKENIZE},
    {"/detokenize", "POST", R_DETOKENIZE},
    {"/health", "GET", R_HEALTH},
    {"/metrics", "GET", R_METRICS},
    {"/stats", "GET", R_STATS},
    {"/v1/cache/save", "POST", R_CACHE_SAVE},
    {"/v1/cache/load", "POST", R_CACHE_LOAD},
    {"/v1/adapters", "GET", R_ADAPTERS},
    {"/v1/adapters", "POST", R_ADAPTERS},
    {"/v1/adapters/*", "DELETE", R_ADAPTERS},
};

/* Whether url is the route's path (a path ending in * matches any non-empty rest). */
static int route_matches(const char *path, const char *url) {
  const size_t n = strlen(path);
  if (n && path[n - 1] == '*') return !strncmp(url, path, n - 1) && url[n - 1];
  return !strcmp(url, path);
}

static enum MHD_Result dispatch(ci_server *s, struct MHD_Connection *c, const char *url,
                                const char *method, connection *conn) {
  int queued = MHD_NO, page_status = 0;
  if (!s->o.no_webui && ci_webui_handle(c, url, method, &queued, &page_status)) {
    ci_server_count_request(s, "webui", page_status);
    conn->status = page_status;
    return (enum MHD_Result)queued;
  }
  int found = -1, path_known = 0;
  /* HEAD is answered wherever GET is (libmicrohttpd sends the headers without the body) */
  const int head = !strcmp(method, "HEAD");
  for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
    if (route_matches(routes[i].path, url)) {
      path_known = 1;
      if (!strcmp(method, routes[i].method) || (head && !strcmp(routes[i].method, "GET")))
        found = (int)i;
    }
  const int anthropic = !strncmp(url, "/v1/messages", 12);
  if (path_known && !strcmp(method, "OPTIONS") && cors_origin(s, c))
    return send_preflight(s, c, conn);
  if (found < 0) {
    const int status = path_known ? 405 : 404;
    ci_server_count_request(s, "other", status);
    return send_json(s, c, conn, status,
                     ci_server_error_body(anthropic, status,
                                          path_known ? "method_not_allowed" : "not_found",
                                          path_known ? "method not allowed" : "route not found"));
  }
  const route_id id = routes[found].id;
  if (id == R_HEALTH)
    return send_text(s, c, conn, 200, "application/json", strdup("{\"status\": \"ok\"}"));
  if (!authorized(s, c)) {
    ci_server_count_request(s, url, 401);
    return send_json(
        s, c, conn, 401,
        ci_server_error_body(anthropic, 401, "invalid_api_key", "invalid or missing API key"));
  }
  /* admin routes: never open to everyone (a server beyond loopback without an API key) */
  if ((id == R_CACHE_SAVE || id == R_CACHE_LOAD) && s->n_keys == 0 && !s->loopback) {
    ci_server_count_request(s, url, 403);
    return send_json(s, c, conn, 403,
                     ci_server_error_body(0, 403, "forbidden",
                                          "admin routes are off: the server listens beyond "
                                          "loopback without an API key (--api-key)"));
  }
  if (conn->body.oom) {
    ci_server_count_request(s, url, 500);
    return send_json(s, c, conn, 500,
                     ci_server_error_body(anthropic, 500, "internal_error", "out of memory"));
  }
  if (conn->too_large) {
    ci_server_count_request(s, url, 413);
    return send_json(
        s, c, conn, 413,
        ci_server_error_body(anthropic, 413, "request_too_large", "request body is too large"));
  }
  json_t *out = NULL;
  ci_srv_stream *stream = NULL;
  int status = 200;
  if (id == R_METRICS) {
    char *text = ci_server_metrics_text(s);
    return send_text(s, c, conn, 200, "text/plain; version=0.0.4", text ? text : strdup(""));
  }
  if (id == R_STATS) return send_json(s, c, conn, 200, ci_server_stats_json(s));
  if (id == R_MODELS) {
    ci_openai_models(s, &out);
    return send_json(s, c, conn, 200, out);
  }
  if (id == R_ADAPTERS) {
    status = ci_server_adapters(s, method, url, conn->body.data, conn->body.len, &out);
    ci_server_count_request(s, !strcmp(url, "/v1/adapters") ? url : "/v1/adapters/{id}", status);
    return send_json(s, c, conn, status, out);
  }
  if (id == R_MODEL) {
    status = ci_openai_model(s, url + strlen("/v1/models/"), &out);
    ci_server_count_request(s, "/v1/models/{id}", status);
    return send_json(s, c, conn, status, out);
  }
  const union MHD_ConnectionInfo *fd_info =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  const int client_fd = fd_info ? (int)fd_info->connect_fd : -1;
  json_error_t jerr;
  json_t *body = conn->body.len ? json_loadb(conn->body.data, conn->body.len, 0, &jerr) : NULL;
  if (!body && !conn->body.len && id == R_CACHE_SAVE) body = json_object(); /* no body needed */
  if (!json_is_object(body)) {
    char msg[300];
    if (body)
      snprintf(msg, sizeof msg, "the request body must be a JSON object");
    else if (!conn->body.len)
      snprintf(msg, sizeof msg, "the request body is empty (a JSON object is expected)");
    else
      snprintf(msg, sizeof msg, "invalid JSON body: %s (line %d, column %d)", jerr.text, jerr.line,
               jerr.column);
    json_decref(body);
    ci_server_count_request(s, url, 400);
    return send_json(s, c, conn, 400, ci_server_error_body(anthropic, 400, "invalid_json", msg));
  }
  switch (id) {
  case R_CHAT:
    status = ci_openai_chat(s, body, &out, &stream, client_fd);
    break;
  case R_COMPLETIONS:
    status = ci_openai_completions(s, body, &out, &stream, client_fd);
    break;
  case R_MESSAGES:
    status = ci_anthropic_messages(s, body, &out, &stream, client_fd);
    break;
  case R_RESPONSES:
    status = ci_openai_responses(s, body, &out, &stream, client_fd);
    break;
  case R_EMBEDDINGS:
    status = ci_openai_embeddings(s, body, &out);
    break;
  case R_COUNT_TOKENS:
    status = ci_anthropic_count_tokens(s, body, &out);
    break;
  case R_TOKENIZE:
    status = ci_server_tokenize(s, body, &out);
    break;
  case R_DETOKENIZE:
    status = ci_server_detokenize(s, body, &out);
    break;
  case R_CACHE_SAVE:
    status = ci_server_cache_save(s, body, &out);
    break;
  case R_CACHE_LOAD:
    status = ci_server_cache_load(s, body, &out);
    break;
  default:
    status = 404;
    break;
  }
  json_decref(body);
  ci_server_count_request(s, url, status);
  if (stream) return send_stream(s, c, conn, stream);
  return send_json(s, c, conn, status, out);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
  (void)version;
  ci_server *s = cls;
  connection *conn = *con_cls;
  if (!conn) {
    conn = calloc(1, sizeof *conn);
    if (!conn) return MHD_NO;
    conn->t_start = ci_now_seconds();
    snprintf(conn->method, sizeof conn->method, "%s", method);
    snprintf(conn->path, sizeof conn->path, "%s", url);
    *con_cls = conn;
    return MHD_YES;
  }
  if (*upload_size) {
    if (conn->body.len + *upload_size > s->o.max_body)
      conn->too_large = 1;
    else
      ci_strbuf_append(&conn->body, upload, *upload_size);
    *upload_size = 0;
    return MHD_YES;
  }
  return dispatch(s, c, url, method, conn);
}

/* The client's address as text ("-" when unknown). */
static void client_address(struct MHD_Connection *c, char *buf, size_t size) {
  const union MHD_ConnectionInfo *info =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  snprintf(buf, size, "-");
  if (!info || !info->client_addr) return;
  const struct sockaddr *a = info->client_addr;
  if (a->sa_family == AF_INET)
    inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)a)->sin_addr, buf,
              (socklen_t)size);
  else if (a->sa_family == AF_INET6)
    inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)a)->sin6_addr, buf,
              (socklen_t)size);
}

/* One access log line on stderr per request (--log-format text|json; none with --quiet). */
static void access_log(const ci_server *s, struct MHD_Connection *c, const connection *conn,
                       enum MHD_RequestTerminationCode code) {
  if (s->o.quiet) return;
  char addr[INET6_ADDRSTRLEN + 1], when[32];
  client_address(c, addr, sizeof addr);
  const time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  const double seconds = ci_now_seconds() - conn->t_start;
  const int completed = code == MHD_REQUEST_TERMINATED_COMPLETED_OK;
  if (s->o.log_format == CI_LOG_JSON) {
    json_t *line = json_pack("{s:s, s:s, s:s, s:s, s:i, s:f, s:b}", "time", when, "client", addr,
                             "method", conn->method, "path", conn->path, "status", conn->status,
                             "duration_s", seconds, "completed", completed);
    char *text = line ? json_dumps(line, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    if (text) fprintf(stderr, "%s\n", text);
    free(text);
    json_decref(line);
    return;
  }
  fprintf(stderr, "%s %s \"%s %s\" %d %.3fs%s\n", when, addr, conn->method, conn->path,
          conn->status, seconds, completed ? "" : " (client gone)");
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode code) {
  ci_server *s = cls;
  connection *conn = *con_cls;
  if (!conn) return;
  access_log(s, c, conn, code);
  ci_strbuf_free(&conn->body);
  free(conn);
  *con_cls = NULL;
}

/* libmicrohttpd's own messages: those about a client that went away (a closed or reset socket, a
 * timed-out idle connection) are routine and dropped; others are printed as warnings. */
static void mhd_logger(void *cls, const char *fmt, va_list ap) {
  const ci_server *s = cls;
  char msg[512];
  vsnprintf(msg, sizeof msg, fmt, ap);
  static const char *const routine[] = {
      "send data", "reset by peer", "Broken pipe",       "closed",
      "timed out", "timeout",       "Failed to receive", "shutdown"};
  for (size_t i = 0; i < sizeof routine / sizeof routine[0]; i++)
    if (strstr(msg, routine[i])) return;
  if (s->o.quiet) return;
  const size_t n = strlen(msg);
  fprintf(stderr, "cinfer serve: libmicrohttpd: %s%s", msg, n && msg[n - 1] == '\n' ? "" : "\n");
}

/* ==== Start / stop ==== */

ci_server *ci_server_start(const ci_server_options *o) {
  ci_server *s = calloc(1, sizeof *s);
  if (!s) return ci_fail("server: out of memory"), NULL;
  s->o = *o;
  s->started_at = (double)time(NULL);
  pthread_mutex_init(&s->metrics_mu, NULL);
  ci_server_detect_formats(s);
  s->weights_bytes = cinfer_model_weight_bytes(o->model);
  if (!(s->responses = ci_response_store_create()) ||
      !(s->adapters = ci_adapter_registry_create())) {
    ci_server_stop(s);
    return ci_fail("server: out of memory"), NULL;
  }
  if (o->api_keys && *o->api_keys) {
    char *copy = strdup(o->api_keys), *save = NULL;
    int lost = !copy;
    for (char *k = copy ? strtok_r(copy, ",", &save) : NULL; k && !lost;
         k = strtok_r(NULL, ",", &save)) {
      char **bigger = realloc(s->keys, (size_t)(s->n_keys + 1) * sizeof *bigger);
      char *key = bigger ? strdup(k) : NULL;
      if (bigger) s->keys = bigger;
      if (!key)
        lost = 1;
      else
        s->keys[s->n_keys++] = key;
    }
    free(copy);
    if (lost) { /* a server missing some of its keys would refuse their clients */
      ci_server_stop(s);
      return ci_fail("server: out of memory"), NULL;
    }
  }
  for (int i = 0; i < o->n_adapters; i++) { /* mounted at start: the server's own handles */
    cinfer_adapter *shared = cinfer_adapter_share(o->adapters[i]);
    const int r = shared ? ci_adapter_registry_add(s->adapters, o->adapter_ids[i], shared, 0) : 500;
    if (r) {
      cinfer_adapter_free(shared);
      ci_fail(r == 409 ? "--adapter: two adapters named '%s'" : "--adapter %s: cannot mount it",
              o->adapter_ids[i]);
      ci_server_stop(s);
      return NULL;
    }
  }
  if (o->adapter_dir) {
    struct stat st;
    s->adapter_root = realpath(o->adapter_dir, NULL);
    if (!s->adapter_root || stat(s->adapter_root, &st) != 0 || !S_ISDIR(st.st_mode)) {
      ci_fail("--adapter-dir %s is not a folder", o->adapter_dir);
      ci_server_stop(s);
      return NULL;
    }
  }
  /* --host: an IPv4 or IPv6 address or a name (the first address it resolves to) */
  char port_text[16];
  snprintf(port_text, sizeof port_text, "%d", o->port);
  struct addrinfo hints, *found = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  const int gai = getaddrinfo(o->host, port_text, &hints, &found);
  if (gai || !found) {
    ci_fail("--host %s: %s", o->host, gai ? gai_strerror(gai) : "no address");
    ci_server_stop(s);
    return NULL;
  }
  struct sockaddr_storage addr;
  memset(&addr, 0, sizeof addr);
  memcpy(&addr, found->ai_addr, found->ai_addrlen < sizeof addr ? found->ai_addrlen : sizeof addr);
  const int ipv6 = found->ai_family == AF_INET6;
  freeaddrinfo(found);
  if (ipv6) {
    const struct in6_addr *a6 = &((const struct sockaddr_in6 *)&addr)->sin6_addr;
    s->loopback = IN6_IS_ADDR_LOOPBACK(a6) || (IN6_IS_ADDR_V4MAPPED(a6) && a6->s6_addr[12] == 127);
  } else {
    s->loopback = (ntohl(((const struct sockaddr_in *)&addr)->sin_addr.s_addr) >> 24) == 127;
  }
  /* thread per connection (generations block their connection's thread), poll() rather than
     select() so descriptors past FD_SETSIZE work, a connection limit and an idle timeout so idle
     clients cannot use every slot for long */
  const unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                         MHD_USE_POLL | MHD_USE_ERROR_LOG | (ipv6 ? MHD_USE_IPv6 : 0u);
  s->daemon = MHD_start_daemon(
      flags, (uint16_t)o->port, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_logger,
      s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed,
      s, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)(o->idle_timeout > 0 ? o->idle_timeout : 30),
      MHD_OPTION_CONNECTION_LIMIT, (unsigned)(o->max_connections > 0 ? o->max_connections : 4096),
      MHD_OPTION_END);
  if (!s->daemon) {
    ci_fail("cannot listen on %s:%d (port taken?)", o->host, o->port);
    ci_server_stop(s);
    return NULL;
  }
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
  s->port = info && info->port ? (int)info->port : o->port;
  return s;
}

int ci_server_port(const ci_server *s) {
  return s->port;
}

void ci_server_stop(ci_server *s) {
  if (!s) return;
  if (s->daemon) MHD_stop_daemon(s->daemon);
  ci_response_store_free(s->responses);
  for (int i = 0; i < s->n_keys; i++) free(s->keys[i]);
  free(s->keys);
  ci_adapter_registry_free(s->adapters);
  free(s->adapter_root);
  pthread_mutex_destroy(&s->metrics_mu);
  free(s);
}
