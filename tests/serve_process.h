/* Tests that run `cinfer serve` as a child process: start it on a random loopback port with the
 * starter model (or another) and the test's flags, wait until GET /health answers 200, stop it
 * with SIGINT and return its exit status. Header-only, shared by the server tests. */
#ifndef CI_TESTS_SERVE_PROCESS_H
#define CI_TESTS_SERVE_PROCESS_H

#include <arpa/inet.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
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
