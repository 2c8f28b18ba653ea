/* `cinfer pull`, `ls`, `rm`, `fit` and `--pull` against a local stand-in for the Hugging Face Hub
 * (tests/hub/server.mjs on 127.0.0.1, serving the bundled models): the cache layout
 * huggingface_hub shares (blobs named by hash, relative snapshot symlinks, refs), resumption of a
 * partial file with a Range request and of a transfer broken mid-body, rejection of a file whose
 * sha256 does not match, the gated (401/403), missing-repo, missing-revision and unreachable-hub
 * errors, the cache listing and removal, and fit's byte counts checked against sums computed
 * here from the files and config.json. No internet is used. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define SOURCE_DIR CI_FIXTURE_DIR "/../.."
#define STARTER SOURCE_DIR "/models/starter"
#define LLAMA CI_FIXTURE_DIR "/llama"

typedef struct {
  char tmp[256]; /* scratch folder of this run */
  char hub[300]; /* HF_HUB_CACHE */
  char log[300]; /* the server's request log */
  char endpoint[64];
  pid_t pid;
  int server_stdin; /* the server exits when this closes, also when the test dies */
} hub_env;

/* ==== Helpers ==== */

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  const long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  assert_non_null(buf);
  assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
  buf[n] = '\0';
  fclose(f);
  if (len) *len = (size_t)n;
  return buf;
}

/* Runs `env_prefix cinfer args`, returns the exit code; *out and *err (malloc'd) its output. */
static int cli(const hub_env *e, const char *env_prefix, const char *args, char **out, char **err) {
  char cmd[4096], out_path[400], err_path[400];
  snprintf(out_path, sizeof out_path, "%s/out.txt", e->tmp);
  snprintf(err_path, sizeof err_path, "%s/err.txt", e->tmp);
  snprintf(cmd, sizeof cmd, "%s %s %s >%s 2>%s", env_prefix ? env_prefix : "", CI_CINFER_BIN, args,
           out_path, err_path);
  const int status = system(cmd);
  *out = read_file(out_path, NULL);
  *err = read_file(err_path, NULL);
  assert_non_null(*out);
  assert_non_null(*err);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

/* The number of request-log lines containing all of a and b (b may be NULL). */
static int log_count(const hub_env *e, const char *a, const char *b) {
  char *log = read_file(e->log, NULL);
  assert_non_null(log);
  int n = 0;
  for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n"))
    n += strstr(line, a) && (!b || strstr(line, b));
  free(log);
  return n;
}

static void clear_log(const hub_env *e) {
  FILE *f = fopen(e->log, "w");
  assert_non_null(f);
  fclose(f);
}

/* 1 when the two files hold the same bytes. */
static int same_bytes(const char *a, const char *b) {
  size_t na, nb;
  char *x = read_file(a, &na), *y = read_file(b, &nb);
  const int same = x && y && na == nb && memcmp(x, y, na) == 0;
  free(x);
  free(y);
  return same;
}

/* sha256 of a file by the sha256sum tool (independent of the library's digest code). */
static void sha256_of(const char *path, char hex[65]) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "sha256sum '%s'", path);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  assert_int_equal(fscanf(p, "%64s", hex), 1);
  pclose(p);
}

static int64_t file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? (int64_t)st.st_size : -1;
}

static int exists(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0;
}

/* ==== Server ==== */

static int setup(void **state) {
  static hub_env e;
  if (system("node --version >/dev/null 2>&1") != 0) {
    fprintf(stderr, "node is not installed\n");
    return -1;
  }
  snprintf(e.tmp, sizeof e.tmp, "/tmp/cinfer-hub-XXXXXX");
  if (!mkdtemp(e.tmp)) return -1;
  snprintf(e.hub, sizeof e.hub, "%s/hub", e.tmp);
  snprintf(e.log, sizeof e.log, "%s/requests.log", e.tmp);
  int fds[2], in[2];
  if (pipe(fds) || pipe(in)) return -1;
  e.pid = fork();
  if (e.pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    dup2(in[0], STDIN_FILENO);
    close(fds[0]);
    close(fds[1]);
    close(in[0]);
    close(in[1]);
    execlp("node", "node", SOURCE_DIR "/tests/hub/server.mjs", SOURCE_DIR, e.log, (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  close(in[0]);
  e.server_stdin = in[1];
  FILE *f = fdopen(fds[0], "r");
  int port = 0;
  const int got = f && fscanf(f, "PORT %d", &port) == 1;
  if (f) fclose(f);
  if (!got || port <= 0) {
    fprintf(stderr, "the hub server did not start\n");
    return -1;
  }
  snprintf(e.endpoint, sizeof e.endpoint, "http://127.0.0.1:%d", port);
  setenv("HF_ENDPOINT", e.endpoint, 1);
  setenv("HF_HUB_CACHE", e.hub, 1);
  unsetenv("HF_TOKEN");
  unsetenv("HF_HOME");
  *state = &e;
  return 0;
}

static int teardown(void **state) {
  hub_env *e = *state;
  close(e->server_stdin);
  kill(e->pid, SIGTERM);
  waitpid(e->pid, NULL, 0);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", e->tmp);
  return system(cmd) == 0 ? 0 : -1;
}

/* ==== pull ==== */

/* The commit refs/main of repo names (into commit, 41 bytes). */
static void main_commit(const hub_env *e, const char *flat, char commit[64]) {
  char path[512];
  snprintf(path, sizeof path, "%s/models--%s/refs/main", e->hub, flat);
  char *text = read_file(path, NULL);
  assert_non_null(text);
  assert_int_equal(strlen(text), 40); /* huggingface_hub writes the bare hash */
  snprintf(commit, 64, "%s", text);
  free(text);
}

static void test_pull_starter(void **state) {
  hub_env *e = *state;
  clear_log(e);
  char *out, *err;
  assert_int_equal(cli(e, NULL, "pull cinfer/starter", &out, &err), 0);
  assert_non_null(strstr(err, "pull: cinfer/starter at "));
  assert_non_null(strstr(err, "tokenizer.json 1.11 MB: verified"));
  char commit[64];
  main_commit(e, "cinfer--starter", commit);
  char snapshot[512];
  snprintf(snapshot, sizeof snapshot, "%s/models--cinfer--starter/snapshots/%s", e->hub, commit);
  assert_true(strncmp(out, snapshot, strlen(snapshot)) == 0); /* stdout: the snapshot folder */
  /* every file cinfer reads, as a relative link to its blob, with the source's bytes */
  const char *files[] = {"config.json",
                         "generation_config.json",
                         "model-00001-of-00003.safetensors",
                         "model-00002-of-00003.safetensors",
                         "model-00003-of-00003.safetensors",
                         "model.safetensors.index.json",
                         "tokenizer.json",
                         "tokenizer_config.json"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char link[700], source[700], target[700];
    snprintf(link, sizeof link, "%s/%s", snapshot, files[i]);
    snprintf(source, sizeof source, "%s/%s", STARTER, files[i]);
    const ssize_t n = readlink(link, target, sizeof target - 1);
    assert_true(n > 0);
    target[n] = '\0';
    assert_true(strncmp(target, "../../blobs/", 12) == 0);
    assert_true(same_bytes(link, source));
    if (strstr(files[i], ".safetensors") && !strstr(files[i], ".json")) {
      char hex[65];
      sha256_of(source, hex);
      assert_string_equal(target + 12, hex); /* LFS blobs are named by their sha256 */
    }
  }
  /* files cinfer does not read stay on the Hub */
  char skipped[700];
  snprintf(skipped, sizeof skipped, "%s/eval_ids.json", snapshot);
  assert_false(exists(skipped));
  assert_int_equal(log_count(e, "eval_ids.json", NULL), 0);
  free(out);
  free(err);

  /* a second pull finds everything in the cache and downloads nothing */
  clear_log(e);
  assert_int_equal(cli(e, NULL, "pull cinfer/starter@v1", &out, &err), 0);
  assert_non_null(strstr(err, "already in the cache"));
  assert_int_equal(log_count(e, "/resolve/", NULL), 0);
  assert_int_equal(log_count(e, "/cdn/", NULL), 0);
  char ref[600];
  snprintf(ref, sizeof ref, "%s/models--cinfer--starter/refs/v1", e->hub);
  char *v1 = read_file(ref, NULL);
  assert_non_null(v1);
  assert_string_equal(v1, commit);
  free(v1);
  free(out);
  free(err);

  /* the pulled model runs by its repo id */
  assert_int_equal(cli(e, NULL,
                       "generate --model cinfer/starter --prompt 'def add(a, b):' -n 4 --temp 0 "
                       "--threads 2",
                       &out, &err),
                   0);
  free(out);
  free(err);
}

static void test_pull_resumes_partial_file(void **state) {
  hub_env *e = *state;
  char hex[65], partial[600];
  sha256_of(LLAMA "/model.safetensors", hex);
  snprintf(partial, sizeof partial, "%s/models--cinfer--llama/blobs", e->hub);
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "mkdir -p '%s' && head -c 1000 '%s' > '%s/%s.incomplete'", partial,
           LLAMA "/model.safetensors", partial, hex);
  assert_int_equal(system(cmd), 0);
  clear_log(e);
  char *out, *err;
  assert_int_equal(cli(e, NULL, "pull cinfer/llama", &out, &err), 0);
  assert_non_null(strstr(err, "resuming at 1.00 kB"));
  /* one request for the rest, none for the whole file */
  assert_int_equal(log_count(e, "/cdn/cinfer/llama/model.safetensors", "range=bytes=1000-"), 1);
  assert_int_equal(log_count(e, "/cdn/cinfer/llama/model.safetensors", "range=-"), 0);
  char blob[800];
  snprintf(blob, sizeof blob, "%s/%s", partial, hex);
  assert_true(same_bytes(blob, LLAMA "/model.safetensors"));
  snprintf(blob, sizeof blob, "%s/%s.incomplete", partial, hex);
  assert_false(exists(blob));
  free(out);
  free(err);
}

static void test_pull_survives_disconnect(void **state) {
  hub_env *e = *state;
  clear_log(e);
  char *out, *err;
  assert_int_equal(cli(e, NULL, "pull cinfer/flaky", &out, &err), 0);
  assert_non_null(strstr(err, "transfer broke"));
  /* the broken transfer, then one resumed from where it stopped */
  assert_int_equal(log_count(e, "/cdn/cinfer/flaky/model.safetensors", "range=-"), 1);
  const int64_t half = file_size(LLAMA "/model.safetensors") / 2;
  char range[64];
  snprintf(range, sizeof range, "range=bytes=%lld-", (long long)half);
  assert_int_equal(log_count(e, "/cdn/cinfer/flaky/model.safetensors", range), 1);
  char commit[64], link[700];
  main_commit(e, "cinfer--flaky", commit);
  snprintf(link, sizeof link, "%s/models--cinfer--flaky/snapshots/%s/model.safetensors", e->hub,
           commit);
  assert_true(same_bytes(link, LLAMA "/model.safetensors"));
  free(out);
  free(err);

  /* a server that ignores Range: the file is fetched whole again, and still verified */
  char hex[65], cmd[1200];
  sha256_of(LLAMA "/model.safetensors", hex);
  snprintf(cmd, sizeof cmd,
           "mkdir -p '%s/models--cinfer--norange/blobs' && head -c 777 /dev/urandom > "
           "'%s/models--cinfer--norange/blobs/%s.incomplete'",
           e->hub, e->hub, hex);
  assert_int_equal(system(cmd), 0);
  assert_int_equal(cli(e, NULL, "pull cinfer/norange", &out, &err), 0);
  main_commit(e, "cinfer--norange", commit);
  snprintf(link, sizeof link, "%s/models--cinfer--norange/snapshots/%s/model.safetensors", e->hub,
           commit);
  assert_true(same_bytes(link, LLAMA "/model.safetensors"));
  free(out);
  free(err);
}

static void test_pull_rejects_wrong_checksum(void **state) {
  hub_env *e = *state;
  char *out, *err;
  assert_int_equal(cli(e, NULL, "pull cinfer/corrupt", &out, &err), 1);
  assert_non_null(strstr(err, "model.safetensors: sha256 mismatch"));
  assert_non_null(strstr(err, "the download was discarded"));
  /* nothing that looks verified: no blob, no partial file to resume, no snapshot, no ref */
  char cmd[800];
  snprintf(cmd, sizeof cmd,
           "test -z \"$(find '%s/models--cinfer--corrupt' -name '*.incomplete' -o -path "
           "'*snapshots/*' -o -path '*refs/*')\"",
           e->hub);
  assert_int_equal(system(cmd), 0);
  char hex[65], blob[800];
  sha256_of(LLAMA "/model.safetensors", hex);
  snprintf(blob, sizeof blob, "%s/models--cinfer--corrupt/blobs/%s", e->hub, hex);
  assert_false(exists(blob));
  free(out);
  free(err);
}

static void test_pull_errors(void **state) {
  hub_env *e = *state;
  char *out, *err;
  assert_int_equal(cli(e, NULL, "pull cinfer/gated", &out, &err), 1);
  assert_non_null(
      strstr(err, "repo cinfer/gated is gated: accept its terms on the Hub and set HF_TOKEN"));
  free(out);
  free(err);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "test -z \"$(find '%s/models--cinfer--gated' -name '*.incomplete')\"",
           e->hub);
  assert_int_equal(system(cmd), 0); /* a refused file leaves nothing behind */
  assert_int_equal(cli(e, "HF_TOKEN=wrong-token", "pull cinfer/gated", &out, &err), 1);
  assert_non_null(strstr(err, "repo cinfer/gated is gated"));
  assert_non_null(strstr(err, "HTTP 403"));
  free(out);
  free(err);
  clear_log(e);
  assert_int_equal(cli(e, "HF_TOKEN=good-token", "pull cinfer/gated", &out, &err), 0);
  assert_true(log_count(e, "/resolve/", " auth") >= 2); /* the token went to the Hub */
  free(out);
  free(err);

  assert_int_equal(cli(e, NULL, "pull cinfer/missing", &out, &err), 1);
  assert_non_null(strstr(err, "repo cinfer/missing not found on http://127.0.0.1:"));
  free(out);
  free(err);
  assert_int_equal(cli(e, NULL, "pull cinfer/llama@no-such-branch", &out, &err), 1);
  assert_non_null(strstr(err, "revision 'no-such-branch' not found in repo cinfer/llama"));
  free(out);
  free(err);
  assert_int_equal(cli(e, "HF_ENDPOINT=http://127.0.0.1:1", "pull cinfer/llama", &out, &err), 1);
  assert_non_null(strstr(err, "cannot reach the Hub at http://127.0.0.1:1"));
  free(out);
  free(err);
  assert_int_equal(cli(e, NULL, "pull ../../etc", &out, &err), 2);
  assert_non_null(strstr(err, "is not a Hugging Face repo id"));
  free(out);
  free(err);
  assert_int_equal(cli(e, NULL, "pull", &out, &err), 2);
  free(out);
  free(err);
}

/* --model with a repo id that is not cached: an error naming `cinfer pull`, or with --pull a
 * pull first. */
static void test_model_pull_flag(void **state) {
  hub_env *e = *state;
  char *out, *err;
  assert_int_equal(cli(e, "HF_TOKEN=good-token", "rm cinfer/gated", &out, &err), 0);
  free(out);
  free(err);
  const char *run = "generate --model cinfer/gated --ids 1,2,3 -n 2 --temp 0 --threads 2";
  assert_int_equal(cli(e, NULL, run, &out, &err), 1);
  assert_non_null(strstr(err, "cinfer/gated is not in the Hugging Face cache"));
  assert_non_null(strstr(err, "run `cinfer pull cinfer/gated` first, or add --pull"));
  free(out);
  free(err);
  char with_pull[256];
  snprintf(with_pull, sizeof with_pull, "%s --pull", run);
  assert_int_equal(cli(e, "HF_TOKEN=good-token", with_pull, &out, &err), 0);
  assert_non_null(strstr(err, "model.safetensors 216 kB: verified"));
  free(out);
  free(err);
  assert_int_equal(cli(e, NULL, "generate --pull --ids 1 -n 1", &out, &err), 2);
  assert_non_null(strstr(err, "--pull needs --model"));
  free(out);
  free(err);
}

/* ==== ls, rm ==== */

/* Sum of the sizes of the files of dir that a pull fetches. */
static int64_t pulled_bytes(const char *dir, const char **files, size_t n) {
  int64_t sum = 0;
  for (size_t i = 0; i < n; i++) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, files[i]);
    sum += file_size(path);
  }
  return sum;
}

static void test_ls(void **state) {
  hub_env *e = *state;
  char *out, *err;
  assert_int_equal(cli(e, NULL, "ls --json", &out, &err), 0);
  json_error_t jerr;
  json_t *list = json_loads(out, 0, &jerr);
  assert_non_null(list);
  const char *starter_files[] = {"config.json",
                                 "generation_config.json",
                                 "model-00001-of-00003.safetensors",
                                 "model-00002-of-00003.safetensors",
                                 "model-00003-of-00003.safetensors",
                                 "model.safetensors.index.json",
                                 "tokenizer.json",
                                 "tokenizer_config.json"};
  const char *llama_files[] = {"config.json", "model.safetensors"};
  int seen_starter = 0, seen_llama = 0, seen_corrupt = 0;
  size_t i;
  json_t *m;
  json_array_foreach(list, i, m) {
    const char *id = json_string_value(json_object_get(m, "model"));
    const json_int_t size = json_integer_value(json_object_get(m, "size_bytes"));
    if (!strcmp(id, "cinfer/starter")) {
      seen_starter = 1;
      char commit[64];
      main_commit(e, "cinfer--starter", commit);
      assert_string_equal(json_string_value(json_object_get(m, "commit")), commit);
      assert_string_equal(json_string_value(json_object_get(m, "revision")), "main");
      assert_int_equal(size, pulled_bytes(STARTER, starter_files, 8));
      assert_string_equal(json_string_value(json_object_get(m, "architecture")), "gemma4_text");
      assert_string_equal(json_string_value(json_object_get(m, "dtype")), "q8 g64");
      assert_true(json_is_true(json_object_get(m, "supported")));
    } else if (!strcmp(id, "cinfer/llama")) {
      seen_llama = 1;
      assert_int_equal(size, pulled_bytes(LLAMA, llama_files, 2));
      assert_string_equal(json_string_value(json_object_get(m, "architecture")), "llama");
      assert_true(json_is_true(json_object_get(m, "supported")));
    } else if (!strcmp(id, "cinfer/corrupt")) {
      /* the failed pull: its config.json blob is there, no snapshot */
      seen_corrupt = 1;
      assert_false(json_is_true(json_object_get(m, "supported")));
      assert_non_null(strstr(json_string_value(json_object_get(m, "why")), "no complete snapshot"));
    }
  }
  assert_true(seen_starter && seen_llama && seen_corrupt);
  json_decref(list);
  free(out);
  free(err);

  assert_int_equal(cli(e, NULL, "ls", &out, &err), 0);
  assert_non_null(strstr(out, "MODEL"));
  assert_non_null(strstr(out, "SUPPORTED"));
  const char *row = strstr(out, "cinfer/starter");
  assert_non_null(row);
  assert_non_null(strstr(row, "main"));
  assert_non_null(strstr(row, "31.8 MB"));
  assert_non_null(strstr(row, "gemma4_text"));
  free(out);
  free(err);

  /* an unsupported architecture is listed as such, with the reason */
  char cmd[2000];
  snprintf(cmd, sizeof cmd,
           "d='%s/models--cinfer--odd/snapshots/0123456789abcdef0123456789abcdef01234567' && "
           "mkdir -p \"$d\" && echo '{\"model_type\": \"mamba\", \"torch_dtype\": \"float16\"}' > "
           "\"$d/config.json\"",
           e->hub);
  assert_int_equal(system(cmd), 0);
  assert_int_equal(cli(e, NULL, "ls", &out, &err), 0);
  row = strstr(out, "cinfer/odd");
  assert_non_null(row);
  assert_non_null(strstr(row, "float16"));
  assert_non_null(strstr(row, "mamba"));
  assert_non_null(strstr(row, "no: "));
  free(out);
  free(err);
}

static void test_rm(void **state) {
  hub_env *e = *state;
  /* something outside the cache that a snapshot links to must survive the removal */
  char outside[400], cmd[2000];
  snprintf(outside, sizeof outside, "%s/outside", e->tmp);
  snprintf(cmd, sizeof cmd,
           "mkdir -p '%s' && echo keep > '%s/file' && ln -s '%s' "
           "'%s/models--cinfer--odd/snapshots/0123456789abcdef0123456789abcdef01234567/linked' && "
           "ln -s '%s/file' "
           "'%s/models--cinfer--odd/snapshots/0123456789abcdef0123456789abcdef01234567/f'",
           outside, outside, outside, e->hub, outside, e->hub);
  assert_int_equal(system(cmd), 0);
  char *out, *err;
  assert_int_equal(cli(e, NULL, "rm cinfer/odd", &out, &err), 0);
  assert_non_null(strstr(out, "removed cinfer/odd"));
  free(out);
  free(err);
  char path[600];
  snprintf(path, sizeof path, "%s/file", outside);
  assert_true(exists(path));
  snprintf(path, sizeof path, "%s/models--cinfer--odd", e->hub);
  assert_false(exists(path));

  assert_int_equal(cli(e, NULL, "rm cinfer/llama", &out, &err), 0);
  snprintf(path, sizeof path, "%s/models--cinfer--llama", e->hub);
  assert_false(exists(path));
  snprintf(path, sizeof path, "%s/models--cinfer--starter", e->hub);
  assert_true(exists(path)); /* the others stay */
  free(out);
  free(err);

  assert_int_equal(cli(e, NULL, "rm cinfer/llama", &out, &err), 1);
  assert_non_null(strstr(err, "cinfer/llama is not in the Hugging Face cache"));
  free(out);
  free(err);
  assert_int_equal(cli(e, NULL, "rm ../hub", &out, &err), 2);
  assert_non_null(strstr(err, "is not a Hugging Face repo id"));
  free(out);
  free(err);
  assert_int_equal(cli(e, NULL, "rm cinfer/..", &out, &err), 2);
  free(out);
  free(err);
  snprintf(path, sizeof path, "%s/models--cinfer--starter", e->hub);
  assert_true(exists(path));
}

/* On a terminal (a pseudo-terminal made by script(1)) pull draws a redrawn progress bar. */
static void test_pull_progress_bar(void **state) {
  hub_env *e = *state;
  char cmd[1200], path[400]; /* cinfer/llama is not cached: test_rm removed it */
  snprintf(path, sizeof path, "%s/tty.txt", e->tmp);
  snprintf(cmd, sizeof cmd, "script -qec '%s pull cinfer/llama' /dev/null > '%s' 2>&1",
           CI_CINFER_BIN, path);
  assert_int_equal(system(cmd), 0);
  char *tty = read_file(path, NULL);
  assert_non_null(tty);
  assert_non_null(strstr(tty, "\r[2/2] model.safetensors"));
  assert_non_null(strstr(tty, "100% [====================]"));
  assert_non_null(strstr(tty, "/s ETA "));
  assert_null(strstr(tty, ": downloading")); /* the plain lines are for pipes */
  free(tty);

  /* a file another process is downloading (its partial file locked) is not written twice */
  char *out, *err, hex[65], blobs[600], args[1400];
  assert_int_equal(cli(e, NULL, "rm cinfer/llama", &out, &err), 0);
  free(out);
  free(err);
  sha256_of(LLAMA "/model.safetensors", hex);
  snprintf(blobs, sizeof blobs, "%s/models--cinfer--llama/blobs", e->hub);
  snprintf(cmd, sizeof cmd, "mkdir -p '%s'", blobs);
  assert_int_equal(system(cmd), 0);
  snprintf(args, sizeof args, "pull cinfer/llama");
  snprintf(cmd, sizeof cmd, "flock '%s/%s.incomplete'", blobs, hex);
  assert_int_equal(cli(e, cmd, args, &out, &err), 1);
  assert_non_null(strstr(err, "model.safetensors is being downloaded by another process"));
  free(out);
  free(err);
}

/* ==== fit ==== */

/* Tensor bytes of a safetensors file: its size minus the 8-byte length and the JSON header. */
static int64_t tensor_bytes(const char *path) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  uint8_t b[8];
  assert_int_equal(fread(b, 1, 8, f), 8);
  fclose(f);
  uint64_t header = 0;
  for (int i = 7; i >= 0; i--) header = header << 8 | b[i];
  return file_size(path) - 8 - (int64_t)header;
}

static json_t *fit_json(const hub_env *e, const char *args, const char *codec) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "fit %s --json", args);
  char *out, *err;
  assert_int_equal(cli(e, NULL, cmd, &out, &err), 0);
  json_t *found = NULL;
  for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
    json_t *o = json_loads(line, 0, NULL);
    assert_non_null(o);
    if (!found && !strcmp(json_string_value(json_object_get(o, "kv_codec")), codec))
      found = json_incref(o);
    json_decref(o);
  }
  free(out);
  free(err);
  assert_non_null(found);
  return found;
}

static json_int_t get_int(json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  assert_true(json_is_integer(v));
  return json_integer_value(v);
}

static void test_fit(void **state) {
  hub_env *e = *state;
  /* the llama fixture: full attention everywhere; read its geometry from config.json */
  json_t *cfg = json_load_file(LLAMA "/config.json", 0, NULL);
  assert_non_null(cfg);
  const int64_t layers = json_integer_value(json_object_get(cfg, "num_hidden_layers"));
  const int64_t kv_heads = json_integer_value(json_object_get(cfg, "num_key_value_heads"));
  const int64_t head_dim = json_integer_value(json_object_get(cfg, "head_dim"));
  const int64_t limit = json_integer_value(json_object_get(cfg, "max_position_embeddings"));
  json_decref(cfg);
  const int64_t ctx = 1024;
  /* bf16: K and V rows of head_dim 2-byte values; turbo 4: 4-bit codes and a 2-byte norm */
  const int64_t bf16_token = layers * kv_heads * 2 * head_dim * 2;
  const int64_t turbo4_token = layers * kv_heads * 2 * (head_dim * 4 / 8 + 2);

  json_t *r = fit_json(e, LLAMA " --ctx 1024 --kv-codec bf16,turbo:4,f32 --memory 1G", "bf16");
  assert_int_equal(get_int(r, "weights_bytes"), tensor_bytes(LLAMA "/model.safetensors"));
  assert_int_equal(get_int(r, "kv_bytes_per_token"), bf16_token);
  assert_int_equal(get_int(r, "kv_bytes"), ctx * bf16_token);
  assert_int_equal(get_int(r, "context"), ctx);
  assert_int_equal(get_int(r, "context_limit"), limit);
  assert_int_equal(get_int(r, "memory_available"), 1LL << 30);
  assert_int_equal(get_int(r, "total_bytes"), get_int(r, "weights_bytes") + get_int(r, "kv_bytes") +
                                                  get_int(r, "workspace_bytes"));
  assert_true(get_int(r, "workspace_bytes") > 0);
  assert_true(json_is_true(json_object_get(r, "fits")));
  assert_int_equal(get_int(r, "max_context"), limit);
  json_decref(r);
  /* turbo 4 as the engine runs it: the first prefill chunk (here all 1024 tokens) is held in bf16
   * until the layers convert, beside the converted copy; a block costs its share of a slab of
   * four f32 blocks */
  r = fit_json(e, LLAMA " --ctx 1024 --kv-codec bf16,turbo:4,f32 --memory 1G", "turbo:4,4");
  const int64_t slab = 4 * 16 * 2 * bf16_token;
  const int64_t turbo4_block = slab / (slab / (16 * turbo4_token));
  assert_int_equal(get_int(r, "kv_bytes"), ctx * bf16_token + ctx / 16 * turbo4_block);
  assert_int_equal(get_int(r, "state_bytes"), 0); /* no recurrent state */
  json_decref(r);
  r = fit_json(e, LLAMA " --ctx 1024 --kv-codec f32 --batch 3 --memory 1G", "f32");
  assert_int_equal(get_int(r, "kv_bytes"), 3 * ctx * 2 * bf16_token);
  json_decref(r);

  /* a memory that holds the weights and part of the context: the largest context fits and one
   * more token does not */
  r = fit_json(e, LLAMA " --ctx 16 --kv-codec bf16", "bf16");
  const int64_t small = get_int(r, "total_bytes") + 600 * bf16_token;
  json_decref(r);
  char args[512];
  snprintf(args, sizeof args, LLAMA " --kv-codec bf16 --memory %lld", (long long)small);
  r = fit_json(e, args, "bf16");
  const int64_t max_context = get_int(r, "max_context");
  assert_false(json_is_true(json_object_get(r, "fits"))); /* not the whole 2048 */
  assert_true(max_context > 16 && max_context < limit);
  json_decref(r);
  snprintf(args, sizeof args, LLAMA " --kv-codec bf16 --memory %lld --ctx %lld", (long long)small,
           (long long)max_context);
  r = fit_json(e, args, "bf16");
  assert_true(json_is_true(json_object_get(r, "fits")));
  assert_true(get_int(r, "total_bytes") <= small);
  json_decref(r);
  snprintf(args, sizeof args, LLAMA " --kv-codec bf16 --memory %lld --ctx %lld", (long long)small,
           (long long)max_context + 16);
  r = fit_json(e, args, "bf16");
  assert_false(json_is_true(json_object_get(r, "fits")));
  json_decref(r);

  /* this machine's memory: MemTotal of /proc/meminfo (unless a cgroup limit is lower) */
  r = fit_json(e, LLAMA " --kv-codec bf16", "bf16");
  FILE *meminfo = fopen("/proc/meminfo", "r"); /* its size reads as 0: line by line */
  assert_non_null(meminfo);
  long long total_kb = 0;
  char line[256];
  while (fgets(line, sizeof line, meminfo))
    if (!strncmp(line, "MemTotal:", 9)) total_kb = strtoll(line + 9, NULL, 10);
  fclose(meminfo);
  assert_true(total_kb > 0);
  assert_true(get_int(r, "memory_total") <= total_kb * 1024);
  assert_true(get_int(r, "memory_available") > 0);
  assert_true(get_int(r, "memory_available") <= get_int(r, "memory_total"));
  json_decref(r);

  /* sharded weights: the sum over the shards; a repo id from the cache */
  r = fit_json(e, "cinfer/starter --kv-codec bf16", "bf16");
  assert_int_equal(get_int(r, "weights_bytes"),
                   tensor_bytes(STARTER "/model-00001-of-00003.safetensors") +
                       tensor_bytes(STARTER "/model-00002-of-00003.safetensors") +
                       tensor_bytes(STARTER "/model-00003-of-00003.safetensors"));
  json_decref(r);

  /* the table: every default codec */
  char *out, *err;
  assert_int_equal(
      cli(e, NULL, "fit " LLAMA " --kv-codec bf16,turbo:4,turbo:3,turbo:2", &out, &err), 0);
  assert_non_null(strstr(out, "KV CODEC"));
  assert_non_null(strstr(out, "MAX CONTEXT"));
  assert_non_null(strstr(out, "turbo:3,3"));
  free(out);
  free(err);
  /* errors */
  assert_int_equal(cli(e, NULL, "fit " LLAMA " --kv-codec affine:8", &out, &err), 2);
  assert_non_null(strstr(err, "head_dim 16 is not a multiple of its group size 64"));
  free(out);
  free(err);
  assert_int_equal(cli(e, NULL, "fit " LLAMA " --ctx 999999", &out, &err), 2);
  assert_non_null(strstr(err, "longer than the model's context length 2048"));
  free(out);
  free(err);
  assert_int_equal(cli(e, NULL, "fit " LLAMA " --draft-max 33", &out, &err), 2);
  assert_non_null(strstr(err, "--draft-max"));
  free(out);
  free(err);
  assert_int_equal(cli(e, NULL, "fit " LLAMA " --device cuda", &out, &err), 1);
  assert_non_null(strstr(err, "cannot read GPU memory"));
  free(out);
  free(err);
  assert_int_equal(cli(e, NULL, "fit cinfer/not-pulled", &out, &err), 1);
  assert_non_null(strstr(err, "run `cinfer pull cinfer/not-pulled` first"));
  free(out);
  free(err);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pull_starter),
      cmocka_unit_test(test_pull_resumes_partial_file),
      cmocka_unit_test(test_pull_survives_disconnect),
      cmocka_unit_test(test_pull_rejects_wrong_checksum),
      cmocka_unit_test(test_pull_errors),
      cmocka_unit_test(test_model_pull_flag),
      cmocka_unit_test(test_ls),
      cmocka_unit_test(test_rm),
      cmocka_unit_test(test_pull_progress_bar),
      cmocka_unit_test(test_fit),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
