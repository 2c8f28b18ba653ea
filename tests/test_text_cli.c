/* The text path of the generating verbs on the bundled starter model: `generate --prompt` and
 * `--chat` stream exactly the detokenization of the ids they report, a stop string ends the
 * text before it, and `chat` keeps a multi-turn history on piped input with /reset. And the
 * command line as a llama.cpp user types it: short flags, --prompt-file - (standard input), the
 * --threads cap, usage errors, file errors in plain words, the verb list of --help, multi-line
 * chat messages, the truncated-reply mark and `bench --json`. (The chat REPL on a terminal:
 * test_chat_pty.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define STARTER CI_FIXTURE_DIR "/../../models/starter"
#define STARTER_DRAFT CI_FIXTURE_DIR "/../../models/starter-draft"

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

/* The "ids" of a `generate --json` run with these flags (greedy, 48 tokens), as a JSON string
 * (malloc'd); *drafted gets its stats' draft_tokens. */
static char *generate_ids(const char *extra, long long *drafted) {
  char cmd[2048];
  int status;
  snprintf(cmd, sizeof cmd,
           "%s generate --model %s --prompt 'def fib(n):\n    if n < 2:\n        return n\n' "
           "--temp 0 -n 48 --ignore-eos --json --threads 2 %s 2>/dev/null",
           CI_CINFER_BIN, STARTER, extra);
  char *out = run(cmd, &status);
  assert_int_equal(status, 0);
  json_error_t err;
  json_t *root = json_loads(out, 0, &err);
  assert_non_null(root);
  assert_int_equal(json_array_size(json_object_get(root, "ids")), 48);
  char *ids = json_dumps(json_object_get(root, "ids"), JSON_COMPACT);
  *drafted = json_integer_value(json_object_get(json_object_get(root, "stats"), "draft_tokens"));
  json_decref(root);
  free(out);
  return ids;
}

/* --draft-model (generate and chat): the same greedy tokens as without it, with drafts made. */
static void test_draft_model(void **state) {
  (void)state;
  long long drafted = -1;
  char *plain = generate_ids("", &drafted);
  assert_int_equal(drafted, 0);
  char *spec =
      generate_ids("--draft-model " STARTER_DRAFT " --draft-max 4 --draft-min 2", &drafted);
  assert_true(drafted > 0);
  assert_string_equal(spec, plain);
  free(spec);
  free(plain);
  char cmd[2048];
  int status;
  const char *chat = "printf 'Write a function that adds two numbers.\n' | %s chat --model %s "
                     "--temp 0 -n 40 --threads 2 %s 2>/dev/null";
  snprintf(cmd, sizeof cmd, chat, CI_CINFER_BIN, STARTER, "");
  char *chat_plain = run(cmd, &status);
  assert_int_equal(status, 0);
  snprintf(cmd, sizeof cmd, chat, CI_CINFER_BIN, STARTER, "--draft-model " STARTER_DRAFT);
  char *chat_spec = run(cmd, &status);
  assert_int_equal(status, 0);
  assert_true(strlen(chat_plain) > 0);
  assert_string_equal(chat_spec, chat_plain);
  free(chat_plain);
  free(chat_spec);
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

/* Runs a command with stderr captured into *err (malloc'd); returns stdout. */
static char *run_err(const char *cmd, int *status, char **err) {
  char path[] = "/tmp/cinfer_cli_err_XXXXXX";
  const int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  char full[4096];
  snprintf(full, sizeof full, "%s 2>%s", cmd, path);
  char *out = run(full, status);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  *err = calloc(1, 1 << 16);
  assert_non_null(*err);
  size_t got = fread(*err, 1, (1 << 16) - 1, f);
  (*err)[got] = '\0';
  fclose(f);
  unlink(path);
  return out;
}

/* -m -p -n -t give what --model --prompt --max-tokens --threads give; -f FILE and -f - (standard
 * input) give the same prompt as -p. */
static void test_short_flags(void **state) {
  (void)state;
  char cmd[2048];
  int status;
  snprintf(cmd, sizeof cmd,
           "%s generate --model %s --prompt 'def add(a, b):' --temp 0 --max-tokens 12 "
           "--threads 2 --json 2>/dev/null",
           CI_CINFER_BIN, STARTER);
  char *longer = run(cmd, &status);
  assert_int_equal(status, 0);
  json_t *a = json_loads(longer, 0, NULL);
  assert_non_null(a);
  const char *text = json_string_value(json_object_get(a, "text"));
  assert_non_null(text);
  assert_true(strlen(text) > 0);
  char file[] = "/tmp/cinfer_prompt_XXXXXX";
  const int fd = mkstemp(file);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, "def add(a, b):", 14), 14);
  close(fd);
  const char *variants[] = {"-p 'def add(a, b):'", "-f %s", "-f - < %s"};
  for (int v = 0; v < 3; v++) {
    char prompt[256];
    snprintf(prompt, sizeof prompt, variants[v], file);
    snprintf(cmd, sizeof cmd, "%s generate -m %s %s --temp 0 -n 12 -t 2 --json 2>/dev/null",
             CI_CINFER_BIN, STARTER, prompt);
    char *out = run(cmd, &status);
    assert_int_equal(status, 0);
    json_t *b = json_loads(out, 0, NULL);
    assert_non_null(b);
    assert_true(json_equal(json_object_get(a, "ids"), json_object_get(b, "ids")));
    assert_string_equal(text, json_string_value(json_object_get(b, "text")));
    json_decref(b);
    free(out);
  }
  unlink(file);
  json_decref(a);
  free(longer);
}

/* `bench --json`: prefill and decode timed in their own sessions (as llama-bench's pp and tg
 * tests), each figure positive, the counts as asked, KV storage reported at the depth. */
static void test_bench_json(void **state) {
  (void)state;
  char cmd[2048];
  int status;
  snprintf(cmd, sizeof cmd,
           "%s bench -m %s -p 8 -n 4 --depth 3 --runs 1 --warmup 0 --threads 2 --json 2>/dev/null",
           CI_CINFER_BIN, STARTER);
  char *out = run(cmd, &status);
  assert_int_equal(status, 0);
  json_error_t err;
  json_t *root = json_loads(out, 0, &err);
  assert_non_null(root);
  assert_true(json_real_value(json_object_get(root, "prefill_tok_s")) > 0.0);
  assert_true(json_real_value(json_object_get(root, "decode_tok_s")) > 0.0);
  assert_true(json_real_value(json_object_get(root, "ttft_ms")) > 0.0);
  assert_int_equal(json_integer_value(json_object_get(root, "prompt_tokens")), 8);
  assert_int_equal(json_integer_value(json_object_get(root, "gen_tokens")), 4);
  assert_int_equal(json_integer_value(json_object_get(root, "depth")), 3);
  assert_true(json_integer_value(json_object_get(root, "kv_bytes")) > 0);
  json_decref(root);
  free(out);
}

/* --threads above the online CPUs runs on them, with one warning line. */
static void test_threads_cap(void **state) {
  (void)state;
  char cmd[2048];
  int status;
  char *err = NULL;
  snprintf(cmd, sizeof cmd, "%s generate -m %s -p 'def' --temp 0 -n 2 -t 4096", CI_CINFER_BIN,
           STARTER);
  char *out = run_err(cmd, &status, &err);
  assert_int_equal(status, 0);
  char expected[128];
  snprintf(expected, sizeof expected, "--threads 4096 is more than the %ld online CPUs; using %ld",
           sysconf(_SC_NPROCESSORS_ONLN), sysconf(_SC_NPROCESSORS_ONLN));
  if (sysconf(_SC_NPROCESSORS_ONLN) < 4096) {
    assert_non_null(strstr(err, expected));
    assert_null(strstr(strstr(err, expected) + strlen(expected), "online CPUs")); /* once */
  }
  free(out);
  free(err);
}

/* Usage and file errors: exit status and the one line a user reads, never the JSON library's
 * wording. */
static void test_errors_in_plain_words(void **state) {
  (void)state;
  struct {
    const char *args;
    int status;
    const char *message;
  } cases[] = {
      {"generate -m " STARTER " -p hi --system 'be brief'", 2, "--system needs --chat"},
      {"generate -m " STARTER " -f /nonexistent/prompt.txt", 2,
       "cannot open /nonexistent/prompt.txt: No such file or directory"},
      {"generate -m " STARTER " -p hi -f /dev/null", 2, "not both"},
      {"render -m " STARTER " -r /nonexistent/request.json", 1,
       "cannot open /nonexistent/request.json: No such file or directory"},
      {"perplexity -m " STARTER " --ids-file /nonexistent/ids.json", 1,
       "cannot open /nonexistent/ids.json: No such file or directory"},
      {"generate -p hi", 2, "--model is required"},
      {"generate -m " STARTER " -p hi --precision half", 2,
       "--precision must be fast or exact, got 'half'"},
      {"serve -m " STARTER " --precision bf16", 2, "--precision must be fast or exact, got 'bf16'"},
      {"generate -m " STARTER " -p hi --draft-min 4 --draft-max 2", 2,
       "--draft-min 4 is over --draft-max 2"},
      {"generate -m " STARTER " -p hi --draft-model " CI_FIXTURE_DIR "/llama", 1,
       "a draft model must share the model's tokenizer"},
      {"chat -m " STARTER " --draft-model /nonexistent/draft", 1, "/nonexistent/draft"},
      {"serve -m " STARTER " --spec-max-batch -1", 2,
       "--spec-max-batch must be an integer in [0, 512], got '-1'"},
      {"serve -m " STARTER " --spec-policy sometimes", 2,
       "--spec-policy must be auto, always or never (got 'sometimes')"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char cmd[2048];
    int status;
    char *err = NULL;
    snprintf(cmd, sizeof cmd, "%s %s </dev/null", CI_CINFER_BIN, cases[i].args);
    char *out = run_err(cmd, &status, &err);
    if (!strstr(err, cases[i].message))
      print_error("cinfer %s: expected '%s' in:\n%s\n", cases[i].args, cases[i].message, err);
    assert_non_null(strstr(err, cases[i].message));
    assert_null(strstr(err, "line -1"));
    assert_null(strstr(err, "unable to open"));
    assert_int_equal(WEXITSTATUS(status), cases[i].status);
    free(out);
    free(err);
  }
}

/* cinfer --help: generate, chat, serve, pull, ls first, in that order. */
static void test_help_order(void **state) {
  (void)state;
  char cmd[512];
  int status;
  snprintf(cmd, sizeof cmd, "%s --help", CI_CINFER_BIN);
  char *out = run(cmd, &status);
  assert_int_equal(status, 0);
  const char *verbs = strstr(out, "verbs:\n");
  assert_non_null(verbs);
  const char *order[] = {"generate", "chat", "serve", "pull", "ls"};
  const char *line = verbs + strlen("verbs:\n");
  for (int i = 0; i < 5; i++) {
    while (*line == ' ') line++;
    assert_memory_equal(line, order[i], strlen(order[i]));
    line = strchr(line, '\n');
    assert_non_null(line);
    line++;
  }
  free(out);
}

/* Piped chat: a message continued by a backslash and the same message as a """ block are one
 * message (same reply), unlike the two lines sent apart; a reply cut by -n is marked truncated;
 * /help lists the commands; an unknown command is named. */
static void test_chat_multiline_and_truncation(void **state) {
  (void)state;
  const char *inputs[] = {"Write a function\\\\\\nthat adds.\\n",
                          "\\\"\\\"\\\"\\nWrite a function\\nthat adds.\\n\\\"\\\"\\\"\\n",
                          "Write a function\\nthat adds.\\n"};
  char *outs[3];
  char *errs[3];
  for (int i = 0; i < 3; i++) {
    char cmd[2048];
    int status;
    snprintf(cmd, sizeof cmd,
             "printf \"%s/help\\n/bogus\\n\" | %s chat -m %s --temp 0 -n 5 --ignore-eos -t 2",
             inputs[i], CI_CINFER_BIN, STARTER);
    outs[i] = run_err(cmd, &status, &errs[i]);
    assert_int_equal(status, 0);
    assert_non_null(strstr(errs[i], "[truncated"));
    assert_non_null(strstr(errs[i], "/clear, /reset"));
    assert_non_null(strstr(errs[i], "unknown command /bogus"));
  }
  assert_string_equal(outs[0], outs[1]);
  assert_string_not_equal(outs[0], outs[2]);
  /* one truncated reply for the joined message, two for the lines sent apart */
  assert_null(strstr(strstr(errs[0], "[truncated") + 1, "[truncated"));
  assert_non_null(strstr(strstr(errs[2], "[truncated") + 1, "[truncated"));
  for (int i = 0; i < 3; i++) {
    free(outs[i]);
    free(errs[i]);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_generate_text),
      cmocka_unit_test(test_draft_model),
      cmocka_unit_test(test_chat_template_file),
      cmocka_unit_test(test_stop_string),
      cmocka_unit_test(test_chat_repl),
      cmocka_unit_test(test_short_flags),
      cmocka_unit_test(test_threads_cap),
      cmocka_unit_test(test_errors_in_plain_words),
      cmocka_unit_test(test_help_order),
      cmocka_unit_test(test_bench_json),
      cmocka_unit_test(test_chat_multiline_and_truncation),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
