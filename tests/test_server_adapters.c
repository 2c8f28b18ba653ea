/* LoRA adapters end to end: `cinfer generate --adapter` gives the tokens a session with the
 * adapter gives (and a bad folder is an error naming it); `cinfer serve --adapter start=DIR
 * --adapter-dir ROOT` on the starter model is driven by tests/server/adapters.mjs: requests pick
 * adapters by "adapter" and by "model": "BASE:ID", batched requests with different adapters give
 * the texts they give one by one, run-time mounting (GET/POST /v1/adapters, DELETE
 * /v1/adapters/{id}) takes names only and refuses path traversal, absolute paths, symlinks out
 * of ROOT (of the folder and of a file in it), truncated and oversized weight files; a second
 * server with --api-key refuses unauthenticated admin calls, and a third listening beyond
 * loopback without a key has adapter administration off. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "backend/cpu/cpu_backend.h"
#include "cinfer.h"
#include "lora_files.h"

#include <arpa/inet.h>
#include <dirent.h>
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
#define SCRIPTS CI_FIXTURE_DIR "/../server"

/* Starts `cinfer serve` with the starter model, a random port and the extra arguments (NULL
 * terminated, at most 10); returns the pid and sets *port, or -1. */
static pid_t start_server(int *port, const char *const *extra) {
  const char *flags[32] = {"--quiet", "--threads", "1", "--batch", "8"};
  int n = 5;
  for (int i = 0; extra[i] && n < 24; i++) flags[n++] = extra[i];
  flags[n] = NULL;
  serve_process s;
  if (serve_start(&s, STARTER, flags)) return -1;
  *port = s.port;
  return s.pid;
}

static int stop_server(pid_t pid) {
  serve_process s = {.pid = pid};
  return serve_stop(&s);
}

/* Runs `node SCRIPTS/adapters.mjs port mode root`; returns its exit code. */
static int run_node(int port, const char *mode, const char *root) {
  char script[1024], port_arg[16];
  snprintf(script, sizeof script, "%s/adapters.mjs", SCRIPTS);
  snprintf(port_arg, sizeof port_arg, "%d", port);
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("CI_NPM_DIR", CI_NPM_DIR, 1);
    execlp("node", "node", script, port_arg, mode, root, (char *)NULL);
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static void remove_tree(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char p[2048];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    struct stat st;
    if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
      remove_tree(p);
    else
      unlink(p);
  }
  closedir(d);
  rmdir(dir);
}

typedef struct {
  char tmp[64];
  char root[128];    /* --adapter-dir */
  char outside[128]; /* an adapter outside it */
  char start[128];   /* mounted at start */
} layout;

static void make_dir(char *out, size_t size, const char *parent, const char *name) {
  snprintf(out, size, "%s/%s", parent, name);
  assert_int_equal(mkdir(out, 0755), 0);
}

/* The adapters: root/alpha (PEFT), root/beta (mlx-lm), root/escape -> outside (a symlink out),
 * root/linkfile (its adapter_config.json a symlink out), root/broken (truncated weights),
 * root/oversized (trailing bytes), outside/, start/. */
static void make_layout(layout *l) {
  strcpy(l->tmp, "/tmp/cinfer-srv-lora-XXXXXX");
  assert_non_null(mkdtemp(l->tmp));
  make_dir(l->root, sizeof l->root, l->tmp, "root");
  make_dir(l->outside, sizeof l->outside, l->tmp, "outside");
  make_dir(l->start, sizeof l->start, l->tmp, "start");
  ci_backend *be = ci_cpu_backend_create(1);
  ci_model *m = ci_model_load(STARTER, be);
  assert_non_null(m);
  const test_lora_spec alpha = {.rank = 4, .alpha = 8, .peft = 1, .targets = 0x7f, .seed = 21};
  const test_lora_spec beta = {.rank = 8, .alpha = 8, .peft = 0, .targets = 0x7f, .seed = 22};
  char d[256];
  make_dir(d, sizeof d, l->root, "alpha");
  assert_int_equal(test_lora_write(d, m, &alpha), 0);
  make_dir(d, sizeof d, l->root, "beta");
  assert_int_equal(test_lora_write(d, m, &beta), 0);
  assert_int_equal(test_lora_write(l->outside, m, &alpha), 0);
  assert_int_equal(test_lora_write(l->start, m, &beta), 0);
  snprintf(d, sizeof d, "%s/escape", l->root);
  assert_int_equal(symlink(l->outside, d), 0);
  make_dir(d, sizeof d, l->root, "linkfile");
  assert_int_equal(test_lora_write(d, m, &alpha), 0);
  char f[300], target[300];
  snprintf(f, sizeof f, "%s/adapter_config.json", d);
  snprintf(target, sizeof target, "%s/adapter_config.json", l->outside);
  assert_int_equal(unlink(f), 0);
  assert_int_equal(symlink(target, f), 0);
  const char *const damaged[2] = {"broken", "oversized"};
  for (int i = 0; i < 2; i++) {
    make_dir(d, sizeof d, l->root, damaged[i]);
    assert_int_equal(test_lora_write(d, m, &alpha), 0);
    snprintf(f, sizeof f, "%s/adapter_model.safetensors", d);
    struct stat st;
    assert_int_equal(stat(f, &st), 0);
    assert_int_equal(truncate(f, i == 0 ? st.st_size / 2 : st.st_size + 1000), 0);
  }
  ci_model_free(m);
  be->ops->destroy(be);
}

/* Runs `cinfer generate` with args; returns its exit code, stdout in out (NUL-terminated). */
static int run_cli(const char *const *args, char *out, size_t size) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    const char *argv[32] = {CI_CINFER_BIN, "generate"};
    int n = 2;
    for (int i = 0; args[i] && n < 30; i++) argv[n++] = args[i];
    argv[n] = NULL;
    execv(CI_CINFER_BIN, (char *const *)argv);
    _exit(127);
  }
  close(fds[1]);
  size_t len = 0;
  ssize_t r;
  while (len + 1 < size && (r = read(fds[0], out + len, size - 1 - len)) > 0) len += (size_t)r;
  out[len] = '\0';
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static void test_generate_flag(void **state) {
  layout *l = *state;
  char alpha[256];
  snprintf(alpha, sizeof alpha, "%s/alpha", l->root);
  /* the session's greedy tokens with the adapter, through the C API */
  cinfer_model *model;
  assert_int_equal(cinfer_model_load(STARTER, NULL, &model), CINFER_OK);
  cinfer_adapter *a;
  assert_int_equal(cinfer_adapter_load(model, alpha, &a), CINFER_OK);
  cinfer_params p;
  cinfer_params_init(&p, model);
  p.temperature = 0;
  p.max_tokens = 8;
  p.ignore_eos = 1;
  p.adapter = a;
  const int32_t prompt[] = {2, 100, 200, 300, 400, 500};
  char want[256] = "";
  for (int with = 0; with < 2; with++) {
    p.adapter = with ? a : NULL;
    cinfer_session *s;
    assert_int_equal(cinfer_session_create(model, &p, &s), CINFER_OK);
    assert_int_equal(cinfer_session_feed(s, prompt, 6, NULL, 0), CINFER_OK);
    char line[256] = "";
    for (int i = 0; i < 8; i++) {
      int32_t t;
      assert_int_equal(cinfer_session_step(s, &t), CINFER_OK);
      snprintf(line + strlen(line), sizeof line - strlen(line), "%s%d", i ? "," : "", t);
    }
    cinfer_session_free(s);
    if (with)
      strcpy(want, line);
    else
      assert_int_not_equal(strlen(line), 0);
  }
  cinfer_adapter_free(a);
  cinfer_model_free(model);
  char out[4096];
  const char *const args[] = {"--model",      STARTER,     "--ids", "2,100,200,300,400,500",
                              "--temp",       "0",         "-n",    "8",
                              "--ignore-eos", "--threads", "1",     "--adapter",
                              alpha,          NULL};
  assert_int_equal(run_cli(args, out, sizeof out), 0);
  if (!strstr(out, want))
    fail_msg("generate --adapter printed '%s', the session gave %s", out, want);
  char missing[300];
  snprintf(missing, sizeof missing, "%s/missing", l->root);
  const char *const bad[] = {"--model",   STARTER, "--ids",     "2,100", "-n", "2",
                             "--threads", "1",     "--adapter", missing, NULL};
  assert_int_equal(run_cli(bad, out, sizeof out), 1);
}

static void test_server_routes(void **state) {
  layout *l = *state;
  if (system("node --version >/dev/null 2>&1") != 0) skip();
  char start_arg[200];
  snprintf(start_arg, sizeof start_arg, "start=%s", l->start);
  int port, rc;
  const char *const open_args[] = {"--adapter", start_arg, "--adapter-dir", l->root, NULL};
  pid_t pid = start_server(&port, open_args);
  assert_true(pid > 0);
  rc = run_node(port, "open", l->root);
  assert_int_equal(stop_server(pid), 0);
  assert_int_equal(rc, 0);
  const char *const key_args[] = {"--adapter-dir", l->root, "--api-key", "k1", NULL};
  pid = start_server(&port, key_args);
  assert_true(pid > 0);
  rc = run_node(port, "key", l->root);
  assert_int_equal(stop_server(pid), 0);
  assert_int_equal(rc, 0);
  const char *const wide_args[] = {"--adapter-dir", l->root, "--host", "0.0.0.0", NULL};
  pid = start_server(&port, wide_args);
  assert_true(pid > 0);
  rc = run_node(port, "wide", l->root);
  assert_int_equal(stop_server(pid), 0);
  assert_int_equal(rc, 0);
}

static int setup(void **state) {
  static layout l;
  make_layout(&l);
  *state = &l;
  return 0;
}

static int teardown(void **state) {
  layout *l = *state;
  remove_tree(l->tmp);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_generate_flag),
                                     cmocka_unit_test(test_server_routes)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
