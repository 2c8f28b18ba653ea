/* Live-server tests: starts `cinfer serve --model models/starter` on a random loopback port,
 * speculating by prompt lookup (--lookup-ngram 3), waits for /health, runs the node SDK scripts in
 * tests/server (openai, @anthropic-ai/sdk, the Vercel AI SDK and LangChain, malformed requests, the
 * cinfer extensions and CORS, structured output, Responses, embeddings, the utility routes and
 * issue 17's fixes, n > 1 choices, fill-in-the-middle, a bounded load test) and stops the server
 * with SIGINT (exit code 0); a second server checks the serve flags (--port 0, --host NAME,
 * --chat-template, limits, access log) and a third one --host ::1 (IPv6). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "serve_process.h"

#define STARTER CI_FIXTURE_DIR "/../../models/starter"
#define SCRIPTS CI_FIXTURE_DIR "/../server"

#if defined(__SANITIZE_ADDRESS__)
#define LOAD_CLIENTS "8"
#define LOAD_SECONDS "6"
#else
#define LOAD_CLIENTS "24"
#define LOAD_SECONDS "12"
#endif

typedef serve_process server;

static int start_server(server *s) {
  static const char *const flags[] = {
      "--api-key", "test-key",       "--batch", "8",      "--max-queue",
      "256",       "--threads",      "1",       "--cors", "http://allowed.example",
      "--quiet",   "--lookup-ngram", "3",       NULL};
  return serve_start(s, STARTER, flags);
}

static int stop_server(server *s) {
  return serve_stop(s);
}

/* Runs `node SCRIPTS/name port extra...`; returns its exit code. */
static int run_node(int port, const char *name, const char *a1, const char *a2) {
  char script[1024], port_arg[16];
  snprintf(script, sizeof script, "%s/%s", SCRIPTS, name);
  snprintf(port_arg, sizeof port_arg, "%d", port);
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("CI_NPM_DIR", CI_NPM_DIR, 1);
    execlp("node", "node", script, port_arg, a1, a2, (char *)NULL);
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static int setup(void **state) {
  static server s;
  if (system("node --version >/dev/null 2>&1") != 0) {
    fprintf(stderr, "node is not installed\n");
    return -1;
  }
  if (start_server(&s)) {
    fprintf(stderr, "cinfer serve did not become healthy\n");
    return -1;
  }
  *state = &s;
  return 0;
}

static int teardown(void **state) {
  server *s = *state;
  const int code = stop_server(s);
  if (code != 0) fprintf(stderr, "cinfer serve exited with %d after SIGINT\n", code);
  return code == 0 ? 0 : -1;
}

static void test_openai_sdk(void **state) {
  server *s = *state;
  assert_int_equal(run_node(s->port, "openai.mjs", NULL, NULL), 0);
}

static void test_anthropic_sdk(void **state) {
  server *s = *state;
  assert_int_equal(run_node(s->port, "anthropic.mjs", NULL, NULL), 0);
}

static void test_malformed_requests(void **state) {
  server *s = *state;
  assert_int_equal(run_node(s->port, "errors.mjs", NULL, NULL), 0);
}

static void test_extensions(void **state) {
  server *s = *state;
  assert_int_equal(run_node(s->port, "extensions.mjs", NULL, NULL), 0);
}

static void test_structured_output(void **state) {
  server *s = *state;
  assert_int_equal(run_node(s->port, "structured.mjs", NULL, NULL), 0);
}

static void test_responses(void **state) {
  server *s = *state;
  assert_int_equal(run_node(s->port, "responses.mjs", NULL, NULL), 0);
}

static void test_embeddings(void **state) {
  server *s = *state;
  assert_int_equal(run_node(s->port, "embeddings.mjs", NULL, NULL), 0);
}

static void test_choices(void **state) {
  server *s = *state;
  assert_int_equal(run_node(s->port, "choices.mjs", NULL, NULL), 0);
}

/* suffix / fill-in-the-middle: a 400 on the starter model (no FIM tokens), then a random-weight
 * Qwen3 model with Qwen3's tokenizer served by the script itself. */
static void test_fim(void **state) {
  server *s = *state;
  assert_int_equal(run_node(s->port, "fim.mjs", CI_CINFER_BIN, NULL), 0);
}

/* The Vercel AI SDK and LangChain clients: structured output, tool choice required, embeddings. */
static void test_ai_sdk_and_langchain(void **state) {
  server *s = *state;
  assert_int_equal(run_node(s->port, "clients.mjs", NULL, NULL), 0);
}

static void test_utility_routes(void **state) {
  server *s = *state;
  assert_int_equal(run_node(s->port, "utility.mjs", NULL, NULL), 0);
}

/* A second server on the serve flags of issue 17: --port 0 (the port is read from its ready
 * line), --host localhost, --ctx-size 128, --chat-template FILE, --max-connections,
 * --idle-timeout and a JSON access log, checked by tests/server/flags.mjs and below. */
static void test_serve_flags(void **state) {
  (void)state;
  char dir[] = "/tmp/cinfer-serve-flags-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char template_path[128], log_path[128];
  snprintf(template_path, sizeof template_path, "%s/template.jinja", dir);
  snprintf(log_path, sizeof log_path, "%s/stderr.log", dir);
  FILE *t = fopen(template_path, "w");
  assert_non_null(t);
  fputs("{% for m in messages %}{{ m.content }}{% endfor %}", t);
  fclose(t);
  const pid_t pid = fork();
  if (pid == 0) {
    if (!freopen(log_path, "w", stderr)) _exit(126);
    execl(CI_CINFER_BIN, CI_CINFER_BIN, "serve", "--model", STARTER, "--port", "0", "--host",
          "localhost", "--ctx-size", "128", "--chat-template", template_path, "--max-connections",
          "3", "--idle-timeout", "2", "--log-format", "json", "--batch", "2", (char *)NULL);
    _exit(127);
  }
  int port = 0;
  for (int i = 0; i < 600 && !port; i++) { /* the ready line names the port the system chose */
    sleep_ms(100);
    FILE *f = fopen(log_path, "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
      const char *at = strstr(line, "cinfer ready http://localhost:");
      if (at) port = atoi(at + strlen("cinfer ready http://localhost:"));
    }
    if (f) fclose(f);
  }
  assert_true(port > 0);
  const int rc = run_node(port, "flags.mjs", NULL, NULL);
  server srv = {pid, port};
  assert_int_equal(stop_server(&srv), 0);
  FILE *f = fopen(log_path, "r");
  assert_non_null(f);
  char line[1024];
  int json_lines = 0, errors = 0;
  while (fgets(line, sizeof line, f)) {
    if (!strncmp(line, "{\"time\":", 8) && strstr(line, "\"path\":\"/v1/chat/completions\"") &&
        strstr(line, "\"status\":200"))
      json_lines++;
    if (strstr(line, "libmicrohttpd") && !strstr(line, "connection limit"))
      errors++, fprintf(stderr, "unexpected: %s", line);
  }
  fclose(f);
  unlink(template_path);
  unlink(log_path);
  rmdir(dir);
  assert_int_equal(rc, 0);
  assert_int_equal(json_lines, 1); /* one access log line for the chat request, in JSON */
  assert_int_equal(errors, 0);     /* client disconnects are not reported */
}

/* 1 when this machine has an IPv6 loopback (a socket binds to [::1]). */
static int have_ipv6_loopback(void) {
  const int fd = socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  struct sockaddr_in6 addr = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
  const int ok = bind(fd, (struct sockaddr *)&addr, sizeof addr) == 0;
  close(fd);
  return ok;
}

/* Sends `request` to [::1]:port and reads the whole answer into buf. Returns the bytes read. */
static size_t ask_ipv6(int port, const char *request, char *buf, size_t size) {
  const int fd = socket(AF_INET6, SOCK_STREAM, 0);
  struct sockaddr_in6 addr = {.sin6_family = AF_INET6,
                              .sin6_port = htons((uint16_t)port),
                              .sin6_addr = IN6ADDR_LOOPBACK_INIT};
  size_t got = 0;
  if (fd >= 0 && connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0 &&
      write(fd, request, strlen(request)) == (ssize_t)strlen(request)) {
    ssize_t n;
    while (got + 1 < size && (n = read(fd, buf + got, size - 1 - got)) > 0) got += (size_t)n;
  }
  buf[got] = '\0';
  if (fd >= 0) close(fd);
  return got;
}

/* --host ::1: the server binds the IPv6 loopback, its ready line names [::1]:PORT, and a chat
 * request over IPv6 is answered (skipped where the machine has no IPv6 loopback). */
static void test_ipv6_host(void **state) {
  (void)state;
  if (!have_ipv6_loopback()) {
    fprintf(stderr, "no IPv6 loopback on this machine: skipped\n");
    skip();
  }
  char dir[] = "/tmp/cinfer-serve-v6-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char log_path[128];
  snprintf(log_path, sizeof log_path, "%s/stderr.log", dir);
  const pid_t pid = fork();
  if (pid == 0) {
    if (!freopen(log_path, "w", stderr)) _exit(126);
    execl(CI_CINFER_BIN, CI_CINFER_BIN, "serve", "--model", STARTER, "--port", "0", "--host", "::1",
          "--threads", "1", "--batch", "2", (char *)NULL);
    _exit(127);
  }
  int port = 0;
  const char *ready = "cinfer ready http://[::1]:";
  for (int i = 0; i < 600 && !port; i++) {
    sleep_ms(100);
    FILE *f = fopen(log_path, "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
      const char *at = strstr(line, ready);
      if (at) port = atoi(at + strlen(ready));
    }
    if (f) fclose(f);
  }
  char answer[8192];
  const char body[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":3}";
  char request[512];
  snprintf(request, sizeof request,
           "POST /v1/chat/completions HTTP/1.1\r\nHost: [::1]\r\nContent-Type: application/json\r\n"
           "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
           sizeof body - 1, body);
  if (port > 0) ask_ipv6(port, request, answer, sizeof answer);
  server srv = {pid, port};
  const int code = stop_server(&srv);
  unlink(log_path);
  rmdir(dir);
  assert_true(port > 0);
  assert_non_null(strstr(answer, " 200 "));
  assert_non_null(strstr(answer, "\"chat.completion\""));
  assert_int_equal(code, 0);
}

static void test_load(void **state) {
  server *s = *state;
  assert_int_equal(run_node(s->port, "load.mjs", LOAD_CLIENTS, LOAD_SECONDS), 0);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_openai_sdk),
      cmocka_unit_test(test_anthropic_sdk),
      cmocka_unit_test(test_ai_sdk_and_langchain),
      cmocka_unit_test(test_malformed_requests),
      cmocka_unit_test(test_extensions),
      cmocka_unit_test(test_structured_output),
      cmocka_unit_test(test_utility_routes),
      cmocka_unit_test(test_responses),
      cmocka_unit_test(test_embeddings),
      cmocka_unit_test(test_serve_flags),
      cmocka_unit_test(test_choices),
      cmocka_unit_test(test_fim),
      cmocka_unit_test(test_ipv6_host),
      cmocka_unit_test(test_load),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
