/* Greedy continuations against transformers: for every fixture with a greedy.txt (16 argmax
 * tokens after the prompt, computed by transformers in f32 without a KV cache), `cinfer generate
 * --ids PROMPT --temp 0 --ignore-eos --kv-codec f32 -n 16` prints exactly those ids. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Reads a one-line file; returns a malloc'd string without the trailing newline, or NULL. */
static char *read_line(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *line = NULL;
  size_t cap = 0;
  ssize_t n = getline(&line, &cap, f);
  fclose(f);
  if (n <= 0) {
    free(line);
    return NULL;
  }
  while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
  return line;
}

/* Runs the CLI on one fixture; returns 1 when its output equals greedy.txt. */
static int check_fixture(const char *name) {
  char dir[1024], path[1200], cmd[8192];
  snprintf(dir, sizeof dir, "%s/%s", CI_FIXTURE_DIR, name);
  snprintf(path, sizeof path, "%s/greedy.txt", dir);
  char *want = read_line(path);
  if (!want) return -1; /* no greedy reference */
  snprintf(path, sizeof path, "%s/ids.txt", dir);
  char *ids = read_line(path);
  assert_non_null(ids);
  snprintf(cmd, sizeof cmd,
           "%s generate --model %s --ids %s --temp 0 --ignore-eos --kv-codec f32 -n 16 "
           "--threads 2 --precision exact 2>/dev/null",
           CI_CINFER_BIN, dir, ids);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  char out[4096] = {0};
  size_t got = fread(out, 1, sizeof out - 1, p);
  out[got] = '\0';
  const int rc = pclose(p);
  while (got > 0 && (out[got - 1] == '\n' || out[got - 1] == '\r')) out[--got] = '\0';
  const int same = rc == 0 && strcmp(out, want) == 0;
  printf("%-22s %s\n", name, same ? "matches transformers' greedy continuation" : "MISMATCH");
  if (!same) printf("  want %s\n  got  %s (exit %d)\n", want, out, rc);
  free(want);
  free(ids);
  return same;
}

static void test_every_fixture(void **state) {
  (void)state;
  DIR *d = opendir(CI_FIXTURE_DIR);
  assert_non_null(d);
  struct dirent *e;
  int checked = 0, failed = 0;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    const int r = check_fixture(e->d_name);
    if (r < 0) continue;
    checked++;
    failed += r == 0;
  }
  closedir(d);
  assert_true(checked >= 24);
  assert_int_equal(failed, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_every_fixture)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
