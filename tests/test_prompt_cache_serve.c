/* The prompt cache through `cinfer serve --prompt-cache-dir` (docs/server.md "Prompt cache"), as
 * two processes: server A answers a completion twice (a fresh prefill, then a prefix-cache hit),
 * POST /v1/cache/save writes its blocks; after A stops, server B over the same directory loads
 * them (POST /v1/cache/load) and answers the same completion from them: the same text as the
 * fresh prefill, and log-probabilities bit-identical to A's cache hit (the same KV bytes, the same
 * computation). The admin routes: 401 without the key when one is set, 403 for a server beyond
 * loopback without one, 400 for a body naming a path or file, 501 without --prompt-cache-dir.
 * Then `cinfer cache ls` and `cinfer cache prune --max-bytes 0`. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "serve_process.h"

#define STARTER CI_FIXTURE_DIR "/../../models/starter"
#define KEY "pc-key"

typedef serve_process server;

/* Starts cinfer serve with the starter model and the given extra flags (NULL-terminated). */
static int start_server(server *s, const char *const *extra) {
  const char *flags[32] = {"--threads", "1", "--quiet"};
  int n = 3;
  for (int i = 0; extra[i] && n < 24; i++) flags[n++] = extra[i];
  flags[n] = NULL;
  return serve_start(s, STARTER, flags);
}

static int stop_server(server *s) {
  return serve_stop(s);
}

static const char PROMPT[] =
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog "
    "again and again, many times, until the dog wakes up and chases it away across the field.";

typedef struct {
  char *text;
  char *logprobs; /* the logprobs object as JSON text */
  int cached;
} completion;

static void complete(int port, completion *c) {
  char req[1024];
  snprintf(req, sizeof req,
           "{\"prompt\": \"%s\", \"max_tokens\": 8, \"temperature\": 0, \"logprobs\": 5}", PROMPT);
  char *body;
  assert_int_equal(serve_http(port, "POST", "/v1/completions", KEY, req, &body), 200);
  json_t *j = json_loads(body, 0, NULL);
  assert_non_null(j);
  const json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
  c->text = strdup(json_string_value(json_object_get(choice, "text")));
  c->logprobs = json_dumps(json_object_get(choice, "logprobs"), JSON_COMPACT | JSON_SORT_KEYS);
  c->cached = (int)json_integer_value(json_object_get(
      json_object_get(json_object_get(j, "usage"), "prompt_tokens_details"), "cached_tokens"));
  json_decref(j);
  free(body);
}

static void completion_free(completion *c) {
  free(c->text);
  free(c->logprobs);
}

/* The status of a POST, and its body's "error.message" or a field's integer. */
static int post(int port, const char *path, const char *key, const char *json, const char *field,
                long long *value) {
  char *body;
  const int status = serve_http(port, "POST", path, key, json, &body);
  json_t *j = json_loads(body, 0, NULL);
  if (field && value) *value = json_integer_value(json_object_get(j, field));
  if (status != 200) fprintf(stderr, "%s -> %d %s\n", path, status, body);
  json_decref(j);
  free(body);
  return status;
}

static int count_blocks(const char *dir) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strlen(e->d_name) == 36 && strstr(e->d_name, ".kvb")) n++;
  closedir(d);
  return n;
}

/* Runs `cinfer cache ...` with stdout into out (size bytes). Returns the exit code. */
static int run_cache_cli(const char *a, const char *b, const char *c, const char *d, char *out,
                         size_t size) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s cache %s %s %s %s", CI_CINFER_BIN, a, b, c ? c : "", d ? d : "");
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  const size_t n = fread(out, 1, size - 1, p);
  out[n] = '\0';
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static void test_restart_through_the_server(void **state) {
  (void)state;
  char dir[] = "/tmp/cinfer-pcache-serve-XXXXXX";
  assert_non_null(mkdtemp(dir));
  const char *const with_dir[] = {"--prompt-cache-dir", dir, "--api-key", KEY, NULL};
  server a;
  assert_int_equal(start_server(&a, with_dir), 0);
  completion fresh, hit, restored;
  complete(a.port, &fresh);
  complete(a.port, &hit);
  assert_int_equal(fresh.cached, 0);
  assert_true(hit.cached > 0);
  assert_string_equal(fresh.text, hit.text);
  /* the admin routes: the key, no paths */
  assert_int_equal(post(a.port, "/v1/cache/save", NULL, "{}", NULL, NULL), 401);
  assert_int_equal(post(a.port, "/v1/cache/save", "wrong", "{}", NULL, NULL), 401);
  assert_int_equal(post(a.port, "/v1/cache/load", NULL, "{\"prompt\": \"x\"}", NULL, NULL), 401);
  assert_int_equal(
      post(a.port, "/v1/cache/save", KEY, "{\"path\": \"../../tmp/evil\"}", NULL, NULL), 400);
  assert_int_equal(post(a.port, "/v1/cache/load", KEY,
                        "{\"prompt\": \"x\", \"filename\": \"/etc/passwd\"}", NULL, NULL),
                   400);
  assert_int_equal(post(a.port, "/v1/cache/load", KEY, "{}", NULL, NULL), 400);
  long long saved = -1;
  assert_int_equal(post(a.port, "/v1/cache/save", KEY, NULL, "saved_blocks", &saved), 200);
  assert_true(saved >= 0);
  assert_int_equal(stop_server(&a), 0);
  const int blocks = count_blocks(dir);
  assert_true(blocks >= hit.cached / 16);
  assert_int_equal(access("/tmp/evil", F_OK), -1);

  server b;
  assert_int_equal(start_server(&b, with_dir), 0);
  char req[1024];
  snprintf(req, sizeof req, "{\"prompt\": \"%s\"}", PROMPT);
  long long cached = 0;
  assert_int_equal(post(b.port, "/v1/cache/load", KEY, req, "cached_tokens", &cached), 200);
  assert_true(cached >= hit.cached);
  complete(b.port, &restored);
  assert_int_equal(restored.cached, hit.cached);
  assert_string_equal(restored.text, fresh.text);
  assert_string_equal(restored.logprobs, hit.logprobs); /* bit-identical, as printed */
  char *stats;
  assert_int_equal(serve_http(b.port, "GET", "/stats", KEY, NULL, &stats), 200);
  assert_non_null(strstr(stats, "\"prompt_cache\""));
  free(stats);
  assert_int_equal(stop_server(&b), 0);

  /* beyond loopback without a key: the admin routes are off */
  const char *const open_host[] = {"--prompt-cache-dir", dir, "--host", "0.0.0.0", NULL};
  server c;
  assert_int_equal(start_server(&c, open_host), 0);
  assert_int_equal(post(c.port, "/v1/cache/save", NULL, "{}", NULL, NULL), 403);
  assert_int_equal(post(c.port, "/v1/cache/load", NULL, req, NULL, NULL), 403);
  assert_int_equal(stop_server(&c), 0);
  /* no directory: 501 */
  const char *const no_dir[] = {NULL};
  server d;
  assert_int_equal(start_server(&d, no_dir), 0);
  assert_int_equal(post(d.port, "/v1/cache/save", NULL, "{}", NULL, NULL), 501);
  assert_int_equal(stop_server(&d), 0);

  char out[8192];
  assert_int_equal(run_cache_cli("ls", dir, NULL, NULL, out, sizeof out), 0);
  assert_non_null(strstr(out, "backend=cpu"));
  assert_non_null(strstr(out, "0 files skipped"));
  assert_int_equal(run_cache_cli("prune", dir, "--max-bytes", "0", out, sizeof out), 0);
  assert_int_equal(count_blocks(dir), 0);
  assert_int_equal(run_cache_cli("prune", dir, "--max-bytes", "lots", out, sizeof out), 2);
  assert_int_equal(run_cache_cli("frobnicate", dir, NULL, NULL, out, sizeof out), 2);
  completion_free(&fresh);
  completion_free(&hit);
  completion_free(&restored);
  rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_restart_through_the_server),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
