/* The text path of the generating verbs on the bundled starter model: `generate --prompt` and
 * `--chat` stream exactly the detokenization of the ids they report, a stop string ends the
 * text before it, and `chat` keeps a multi-turn history on piped input with /reset. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STARTER CI_FIXTURE_DIR "/../../models/starter"

/* Runs a shell command; returns its stdout (malloc'd) and exit status. */
static char *run(const char *cmd, int *status) {
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t cap = 1 << 16, len = 0, got;
  char *buf = malloc(cap);
  while ((got = fread(buf + len, 1, cap - len - 1, p)) > 0) {
    len += got;
    if (len + 1 == cap) buf = realloc(buf, cap *= 2);
  }
  buf[len] = '\0';
  *status = pclose(p);
  return buf;
}

/* --json text equals `cinfer detokenize` of the reported ids. */
static void check_json_text(const char *extra) {
  char cmd[2048];
  int status;
  snprintf(cmd, sizeof cmd,
           "%s generate --model %s %s --temp 0 -n 40 --json --threads 2 2>/dev/null", CI_CINFER_BIN,
           STARTER, extra);
  char *out = run(cmd, &status);
  assert_int_equal(status, 0);
  json_error_t err;
  json_t *root = json_loads(out, 0, &err);
  assert_non_null(root);
  json_t *ids = json_object_get(root, "ids");
  const char *text = json_string_value(json_object_get(root, "text"));
  assert_non_null(text);
  assert_true(json_array_size(ids) > 0);
  char csv[4096] = {0};
  size_t i;
  json_t *v;
  int n = 0;
  json_array_foreach(ids, i, v) {
    /* EOS ends the list and is not part of the text. */
    if (i + 1 == json_array_size(ids) &&
        !strcmp(json_string_value(json_object_get(root, "finish_reason")), "stop"))
      break;
    n += snprintf(csv + n, sizeof csv - (size_t)n, "%s%lld", i ? "," : "",
                  (long long)json_integer_value(v));
  }
  if (n == 0) {
    assert_string_equal(text, "");
  } else {
    snprintf(cmd, sizeof cmd, "%s detokenize --model %s --ids %s --skip-special", CI_CINFER_BIN,
             STARTER, csv);
    char *decoded = run(cmd, &status);
    assert_int_equal(status, 0);
    size_t dl = strlen(decoded);
    if (dl > 0 && decoded[dl - 1] == '\n' && strlen(text) + 1 == dl) decoded[dl - 1] = '\0';
    assert_string_equal(decoded, text);
    free(decoded);
  }
  json_decref(root);
  free(out);
}

static void test_generate_text(void **state) {
  (void)state;
  check_json_text("--prompt 'def add(a, b):'");
  check_json_text("--chat --prompt 'Write a Python function that returns the maximum of a list.'");
  check_json_text("--chat --system 'You write Python.' --prompt 'Sort a list of numbers.'");
}

/* A stop string cuts the streamed text before it. */
static void test_stop_string(void **state) {
  (void)state;
  char cmd[2048];
  int status;
  snprintf(cmd, sizeof cmd,
           "%s generate --model %s --prompt 'def add(a, b):' --temp 0 -n 40 --threads 2 "
           "2>/dev/null",
           CI_CINFER_BIN, STARTER);
  char *full = run(cmd, &status);
  assert_int_equal(status, 0);
  assert_true(strlen(full) > 8);
  /* Stop at the text's third-to-fifth characters: everything from there on disappears. */
  char stop[4] = {full[3], full[4], full[5], 0};
  const char *cut = strstr(full, stop);
  assert_non_null(cut);
  snprintf(cmd, sizeof cmd,
           "%s generate --model %s --prompt 'def add(a, b):' --temp 0 -n 40 --threads 2 "
           "--stop '%s' 2>/dev/null",
           CI_CINFER_BIN, STARTER, stop);
  char *stopped = run(cmd, &status);
  assert_int_equal(status, 0);
  assert_int_equal(strlen(stopped), (size_t)(cut - full) + 1); /* + the final newline */
  assert_memory_equal(stopped, full, (size_t)(cut - full));
  free(full);
  free(stopped);
}

/* --chat-template FILE (generate and chat): the prompt is the file's rendering, here the user
 * content after a marker, so its token count is the marker's plus the content's; a missing file
 * is an error naming it. */
static void test_chat_template_file(void **state) {
  (void)state;
  char path[] = "/tmp/cinfer-template-XXXXXX";
  const int fd = mkstemp(path);
  assert_true(fd >= 0);
  FILE *f = fdopen(fd, "w");
  assert_non_null(f);
  fputs("{% for m in messages %}{{ m.content }}{% endfor %}", f);
  fclose(f);
  char cmd[2048];
  int status;
  snprintf(cmd, sizeof cmd,
           "%s generate --model %s --chat --chat-template %s --prompt 'def add(a, b):' --temp 0 "
           "-n 2 --json --threads 2 2>/dev/null",
           CI_CINFER_BIN, STARTER, path);
  char *out = run(cmd, &status);
  assert_int_equal(status, 0);
  json_error_t err;
  json_t *root = json_loads(out, 0, &err);
  assert_non_null(root);
  const json_int_t templated =
      json_integer_value(json_object_get(json_object_get(root, "stats"), "prompt_tokens"));
  json_decref(root);
  free(out);
  /* the rendering is the content alone: its tokens without special ones */
  snprintf(cmd, sizeof cmd, "printf 'def add(a, b):' | %s tokenize --model %s --file - 2>/dev/null",
           CI_CINFER_BIN, STARTER);
  char *ids = run(cmd, &status);
  int n_ids = 0;
  json_t *arr = json_loads(ids, 0, &err);
  if (arr) n_ids = (int)json_array_size(arr);
  json_decref(arr);
  free(ids);
  assert_int_equal(status, 0);
  assert_true(n_ids > 0);
  assert_int_equal(templated, n_ids);
  snprintf(cmd, sizeof cmd,
           "printf 'Add two numbers.\\n' | %s chat --model %s --chat-template %s --temp 0 -n 4 "
           "--threads 2 2>/dev/null",
           CI_CINFER_BIN, STARTER, path);
  free(run(cmd, &status));
  assert_int_equal(status, 0);
  snprintf(cmd, sizeof cmd,
           "%s generate --model %s --chat --chat-template %s.missing --prompt x 2>&1",
           CI_CINFER_BIN, STARTER, path);
  char *msg = run(cmd, &status);
  assert_int_not_equal(status, 0);
  assert_non_null(strstr(msg, ".missing"));
  free(msg);
  unlink(path);
}

/* Piped chat: two answers, /reset in between, clean exit at end of input. */
static void test_chat_repl(void **state) {
  (void)state;
  char cmd[2048];
  int status;
  snprintf(cmd, sizeof cmd,
           "printf 'Reverse a string.\\n/reset\\nAdd two numbers.\\n/exit\\nignored\\n' | %s chat "
           "--model %s --temp 0 -n 24 --threads 2 2>/dev/null",
           CI_CINFER_BIN, STARTER);
  char *out = run(cmd, &status);
  assert_int_equal(status, 0);
  int lines = 0;
  for (const char *c = out; *c; c++) lines += *c == '\n';
  assert_true(lines >= 2);
  free(out);
  /* A bad flag is a usage error. */
  snprintf(cmd, sizeof cmd, "%s chat --model %s --temp abc </dev/null 2>/dev/null", CI_CINFER_BIN,
           STARTER);
  free(run(cmd, &status));
  assert_int_equal(WEXITSTATUS(status), 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_generate_text),
      cmocka_unit_test(test_chat_template_file),
      cmocka_unit_test(test_stop_string),
      cmocka_unit_test(test_chat_repl),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
