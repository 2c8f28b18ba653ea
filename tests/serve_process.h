/* Tests that run `cinfer serve` as a child process: start it on a random loopback port with the
 * starter model (or another) and the test's flags, wait until GET /health answers 200, send it
 * plain HTTP/1.1 requests, stop it with SIGINT and return its exit status. Header-only, shared by
 * the server tests. */
#ifndef CI_TESTS_SERVE_PROCESS_H
#define CI_TESTS_SERVE_PROCESS_H

#include <arpa/inet.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  pid_t pid;
  int port;
} serve_process;

static inline void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* 1 when GET /health on 127.0.0.1:port answers 200. */
static inline int serve_healthy(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  int ok = 0;
  if (connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0) {
    const char req[] = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    char buf[256] = {0};
    if (write(fd, req, sizeof req - 1) == (ssize_t)sizeof req - 1 &&
        read(fd, buf, sizeof buf - 1) > 0)
      ok = strstr(buf, " 200 ") != NULL;
  }
  close(fd);
  return ok;
}

/* One HTTP/1.1 request to 127.0.0.1:port (Authorization: Bearer key when key is not NULL, a JSON
 * body when json is not NULL); returns the status (-1 when nothing answered) and *body gets the
 * response body (malloc'd; NULL when nothing answered or out of memory). */
static inline int serve_http(int port, const char *method, const char *path, const char *key,
                             const char *json, char **body) {
  *body = NULL;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, (struct sockaddr *)&addr, sizeof addr)) {
    close(fd);
    return -1;
  }
  char head[512];
  const size_t n = json ? strlen(json) : 0;
  snprintf(head, sizeof head,
           "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
           "Content-Length: %zu\r\n%s%s%s\r\n",
           method, path, n, key ? "Authorization: Bearer " : "", key ? key : "", key ? "\r\n" : "");
  if (write(fd, head, strlen(head)) < 0 || (n && write(fd, json, n) < 0)) {
    close(fd);
    return -1;
  }
  size_t len = 0, cap = 1 << 16;
  char *buf = malloc(cap);
  ssize_t got = 0;
  while (buf && (got = read(fd, buf + len, cap - len - 1)) > 0) {
    len += (size_t)got;
    if (len + 1 == cap) {
      char *bigger = realloc(buf, cap *= 2);
      if (!bigger) free(buf);
      buf = bigger;
    }
  }
  close(fd);
  if (!buf) return -1;
  buf[len] = '\0';
  int status = -1;
  sscanf(buf, "HTTP/1.%*d %d", &status);
  const char *start = strstr(buf, "\r\n\r\n");
  *body = strdup(start ? start + 4 : "");
  free(buf);
  return status;
}

/* Starts `cinfer serve --model MODEL --port P FLAGS...` (flags NULL-terminated, at most 24) on a
 * random port, retrying another port when the server exits during start-up (port taken); waits
 * up to 60 s per attempt (ASan start-up). Returns 0 with s filled, or -1. */
static inline int serve_start(serve_process *s, const char *model, const char *const *flags) {
  for (int attempt = 0; attempt < 5; attempt++) {
    uint16_t r = 0;
    if (getrandom(&r, sizeof r, 0) != sizeof r) r = (uint16_t)time(NULL);
    s->port = 20000 + r % 30000;
    char port[16];
    snprintf(port, sizeof port, "%d", s->port);
    s->pid = fork();
    if (s->pid == 0) {
      const char *argv[32] = {CI_CINFER_BIN, "serve", "--model", model, "--port", port};
      int n = 6;
      for (int i = 0; flags[i] && n < 30; i++) argv[n++] = flags[i];
      argv[n] = NULL;
      execv(CI_CINFER_BIN, (char *const *)argv);
      _exit(127);
    }
    for (int i = 0; i < 600; i++) {
      int status;
      if (waitpid(s->pid, &status, WNOHANG) == s->pid) break; /* exited: port taken? retry */
      if (serve_healthy(s->port)) return 0;
      sleep_ms(100);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
  }
  return -1;
}

/* Stops the server with SIGINT (SIGKILL after 30 s); returns its exit code (128 + signal when
 * killed, -1 when it had to be killed). */
static inline int serve_stop(serve_process *s) {
  kill(s->pid, SIGINT);
  int status = 0;
  for (int i = 0; i < 300; i++) {
    if (waitpid(s->pid, &status, WNOHANG) == s->pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    sleep_ms(100);
  }
  kill(s->pid, SIGKILL);
  waitpid(s->pid, &status, 0);
  return -1;
}

#endif
