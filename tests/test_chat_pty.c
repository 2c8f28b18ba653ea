/* `cinfer chat` on a terminal, as a user meets it: the REPL runs on a pseudo-terminal (forkpty)
 * and the test types into it. A typed message gets a reply; libedit's line editing (backspace)
 * and history (up arrow) change what is sent; ctrl-C stops a long reply and the chat goes on;
 * ctrl-C twice at the prompt quits; a long prompt shows prefill progress. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* A chat process on a pseudo-terminal and everything it wrote. */
typedef struct {
  pid_t pid;
  int fd;
  char *out;
  size_t len, cap;
  size_t mark; /* expect() searches from here */
} chat;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Starts `cinfer chat -m starter --temp 0 -t 2 EXTRA...` (NULL-terminated) on a new terminal. */
static void chat_start(chat *c, const char *const *extra) {
  memset(c, 0, sizeof *c);
  c->cap = 1 << 16;
  c->out = malloc(c->cap);
  assert_non_null(c->out);
  struct winsize ws = {.ws_row = 40, .ws_col = 200};
  c->pid = forkpty(&c->fd, NULL, NULL, &ws);
  assert_true(c->pid >= 0);
  if (c->pid == 0) {
    const char *argv[32] = {CI_CINFER_BIN, "chat", "-m", CI_STARTER_DIR, "--temp", "0", "-t", "2"};
    int n = 8;
    for (int i = 0; extra && extra[i] && n < 31; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    setenv("TERM", "xterm", 1);
    setenv("HOME", "/nonexistent", 1); /* no ~/.editrc of the person running the tests */
    execv(CI_CINFER_BIN, (char *const *)argv);
    _exit(127);
  }
}

/* Reads what the chat writes next, waiting up to `seconds` for it. */
static void pump(chat *c, double seconds) {
  struct pollfd p = {c->fd, POLLIN, 0};
  if (poll(&p, 1, (int)(seconds * 1000) + 1) <= 0) return;
  {
    if (c->len + 4096 + 1 > c->cap) {
      c->cap *= 2;
      c->out = realloc(c->out, c->cap);
      assert_non_null(c->out);
    }
    const ssize_t got = read(c->fd, c->out + c->len, 4096);
    if (got <= 0) return; /* EIO: the process closed the terminal */
    c->len += (size_t)got;
    c->out[c->len] = '\0';
  }
}

/* Waits (up to `seconds`) until `text` appears after the mark; moves the mark past it. Fails the
 * test, showing the output, when it does not. */
static void expect(chat *c, const char *text, double seconds) {
  const double end = now() + seconds;
  for (;;) {
    if (c->len) {
      const char *hit = strstr(c->out + c->mark, text);
      if (hit) {
        c->mark = (size_t)(hit - c->out) + strlen(text);
        return;
      }
    }
    if (now() > end) {
      print_error("expected '%s' in the chat's terminal output:\n%s\n", text,
                  c->len ? c->out + c->mark : "");
      fail();
    }
    pump(c, 0.2);
  }
}

/* Waits for the prompt, and a moment more: libedit sets the terminal up after printing it. */
static void expect_prompt(chat *c, double seconds) {
  expect(c, "> ", seconds);
  pump(c, 0.3);
}

/* Waits until the chat wrote at least n more bytes after the mark (a reply under way). */
static void expect_bytes(chat *c, size_t n, double seconds) {
  const double end = now() + seconds;
  while (c->len < c->mark + n && now() < end) pump(c, 0.2);
  assert_true(c->len >= c->mark + n);
  c->mark = c->len;
}

static void type(chat *c, const char *keys) {
  const size_t n = strlen(keys);
  assert_int_equal(write(c->fd, keys, n), (ssize_t)n);
}

/* Waits for the process to end; returns its exit status (-1 when it did not end in time). */
static int chat_wait(chat *c, double seconds) {
  const double end = now() + seconds;
  int status = 0;
  while (now() < end) {
    pump(c, 0.1);
    const pid_t r = waitpid(c->pid, &status, WNOHANG);
    if (r == c->pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  kill(c->pid, SIGKILL);
  waitpid(c->pid, &status, 0);
  print_error("the chat did not end; its terminal output:\n%s\n", c->out + c->mark);
  return -1;
}

static void chat_free(chat *c) {
  close(c->fd);
  free(c->out);
}

/* The reply of a fresh conversation to one message, from a piped run (first line, trimmed). */
static char *piped_reply(const char *message) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "printf '%%s\\n' '%s' | %s chat -m %s --temp 0 -t 2 2>/dev/null",
           message, CI_CINFER_BIN, CI_STARTER_DIR);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  char line[512] = {0};
  /* the first line of the reply that says something particular (not a code fence) */
  while (fgets(line, sizeof line, p) && (strlen(line) < 10 || !strncmp(line, "```", 3))) {
  }
  pclose(p);
  line[strcspn(line, "\r\n")] = '\0';
  assert_true(strlen(line) >= 4);
  return strdup(line);
}

static int count(const char *haystack, const char *needle) {
  int n = 0;
  for (const char *p = haystack; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

/* Type a message with a typo corrected by backspace: the reply is the reply to the corrected
 * message. /clear, then the up arrow recalls the message (commands are not in the history): the
 * same reply again. /help lists the commands; /exit quits with status 0. */
static void test_edit_and_history(void **state) {
  (void)state;
  char *expected = piped_reply("Hello world");
  chat c;
  chat_start(&c, NULL);
  expect(&c, "/help", 120);
  expect_prompt(&c, 30);
  type(&c, "Hello wpx\x7f\x7forld\r");
  expect(&c, expected, 60);
  expect_prompt(&c, 60);
  type(&c, "/clear\r");
  expect(&c, "(conversation cleared)", 30);
  expect_prompt(&c, 30);
  type(&c, "\x1b[A\r"); /* up arrow: the last message */
  expect(&c, expected, 60);
  expect_prompt(&c, 60);
  assert_true(count(c.out, expected) >= 2);
  type(&c, "/help\r");
  expect(&c, "/clear, /reset", 30);
  type(&c, "/exit\r");
  assert_int_equal(chat_wait(&c, 30), 0);
  chat_free(&c);
  free(expected);
}

/* ctrl-C during a long reply stops it ("[stopped after N tokens]"), the prompt comes back and
 * the next message gets a reply; then ctrl-C twice at the prompt quits. */
static void test_ctrl_c(void **state) {
  (void)state;
  const char *const extra[] = {"--ignore-eos", "-n", "6000", NULL};
  chat c;
  chat_start(&c, extra);
  expect_prompt(&c, 120);
  type(&c, "Tell me a long story.\r");
  expect(&c, "Tell me a long story.", 30);
  expect_bytes(&c, 40, 60); /* some of the reply */
  const double sent = now();
  type(&c, "\x03");
  expect(&c, "[stopped after ", 30);
  assert_true(now() - sent < 30);
  expect_prompt(&c, 30);
  type(&c, "Hi\r");
  expect(&c, "Hi", 30);
  expect_bytes(&c, 40, 60);
  type(&c, "\x03");
  expect(&c, "[stopped", 30);
  expect_prompt(&c, 30);
  type(&c, "\x03");
  pump(&c, 0.5);
  type(&c, "\x03");
  assert_int_equal(chat_wait(&c, 30), 0);
  chat_free(&c);
}

/* A long message (a """ block of many lines) on a terminal: a prefill progress line on the
 * terminal, then the reply; a reply cut by -n is marked as truncated. */
static void test_prefill_progress_and_truncation(void **state) {
  (void)state;
  const char *const extra[] = {"-n", "3", "--ignore-eos", NULL};
  chat c;
  chat_start(&c, extra);
  expect_prompt(&c, 120);
  type(&c, "\"\"\"\r");
  for (int i = 0; i < 150; i++) {
    expect(&c, "... ", 30);
    type(&c, "one two three four five six seven eight nine ten\r");
  }
  expect(&c, "... ", 30);
  type(&c, "\"\"\"\r");
  expect(&c, "prefill ", 60);
  expect(&c, " tokens (", 30);
  /* the prompt's ~2,560 tokens: over 120 s under AddressSanitizer on a 2-vCPU AVX2-only EPYC */
  expect(&c, "[truncated", 600);
  expect_prompt(&c, 30);
  type(&c, "\x04"); /* ctrl-D quits */
  assert_int_equal(chat_wait(&c, 30), 0);
  chat_free(&c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_edit_and_history),
      cmocka_unit_test(test_ctrl_c),
      cmocka_unit_test(test_prefill_progress_and_truncation),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
