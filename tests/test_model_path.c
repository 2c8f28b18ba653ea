/* Tests of model path resolution against a fake Hugging Face hub cache built in a temp folder:
 * refs, explicit revisions, newest snapshot, substring and ambiguous matches, env precedence. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "base/error.h"
#include "io/model_path.h"

#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ==== Fake cache ==== */

static void make_dirs(const char *root, const char *relative) {
  char path[512];
  int n = snprintf(path, sizeof path, "%s/%s", root, relative);
  assert_true(n > 0 && (size_t)n < sizeof path);
  for (char *p = path + strlen(root) + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    mkdir(path, 0700);
    *p = '/';
  }
  mkdir(path, 0700);
}

static void write_text(const char *root, const char *relative, const char *text) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", root, relative);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  assert_int_equal(fclose(f), 0);
}

static void set_mtime(const char *root, const char *relative, time_t seconds) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", root, relative);
  struct timespec times[2] = {{seconds, 0}, {seconds, 0}};
  assert_int_equal(utimensat(AT_FDCWD, path, times, 0), 0);
}

/* Group setup: *state becomes the malloc'd temp folder ROOT holding the fake cache ROOT/hub. */
static int build_cache(void **state) {
  char *root = strdup("/tmp/cinfer_mp_XXXXXX");
  if (!root || !mkdtemp(root)) return -1;
  *state = root;
  make_dirs(root, "hub/models--org--Model-A/refs");
  make_dirs(root, "hub/models--org--Model-A/snapshots/abc123");
  make_dirs(root, "hub/models--org--Model-A/snapshots/def456");
  write_text(root, "hub/models--org--Model-A/refs/main", "abc123\n");
  write_text(root, "hub/models--org--Model-A/refs/v1", "  def456  ");
  write_text(root, "hub/models--org--Model-A/snapshots/abc123/config.json", "{}");
  make_dirs(root, "hub/models--org--Model-A-Instruct/refs");
  make_dirs(root, "hub/models--org--Model-A-Instruct/snapshots/111");
  write_text(root, "hub/models--org--Model-A-Instruct/refs/main", "111");
  /* No refs: the newest snapshot by mtime wins even though its name sorts first. */
  make_dirs(root, "hub/models--org--Model-B/snapshots/old");
  make_dirs(root, "hub/models--org--Model-B/snapshots/new");
  set_mtime(root, "hub/models--org--Model-B/snapshots/old", 1000000);
  set_mtime(root, "hub/models--org--Model-B/snapshots/new", 2000000);
  make_dirs(root, "hub/models--other--thing/snapshots/t1");
  make_dirs(root, "hub/models--other--broken/refs");
  make_dirs(root, "hub/models--other--broken/snapshots");
  write_text(root, "hub/models--other--broken/refs/main", "gone");
  make_dirs(root, "hub/models--gpt2/snapshots/g1");
  make_dirs(root, "hub/datasets--org--data/snapshots/d1");
  write_text(root, "hub/models--afile", "not a folder");
  make_dirs(root, "hub/models--empty");
  make_dirs(root, "home/.cache/huggingface/hub/models--home--only/snapshots/h1");
  return 0;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

static int remove_cache(void **state) {
  nftw(*state, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  free(*state);
  return 0;
}

/* Each test starts with HF_HUB_CACHE = ROOT/hub and the other variables unset. */
static int use_hub_cache(void **state) {
  const char *root = *state;
  char hub[128];
  snprintf(hub, sizeof hub, "%s/hub", root);
  setenv("HF_HUB_CACHE", hub, 1);
  unsetenv("HUGGINGFACE_HUB_CACHE");
  unsetenv("HF_HOME");
  unsetenv("XDG_CACHE_HOME");
  return 0;
}

static void assert_contains(const char *haystack, const char *needle) {
  if (!strstr(haystack, needle)) fail_msg("expected \"%s\" in \"%s\"", needle, haystack);
}

/* Resolves model and checks the result is ROOT/hub/<expected>. */
static void expect_resolves(const char *root, const char *model, const char *expected) {
  char want[512];
  snprintf(want, sizeof want, "%s/hub/%s", root, expected);
  char *got = ci_model_path_resolve(model);
  if (!got) fail_msg("%s: %s", model, ci_last_error());
  assert_string_equal(got, want);
  free(got);
}

static void expect_error(const char *model, const char *message_part) {
  ci_clear_error();
  char *got = ci_model_path_resolve(model);
  if (got) fail_msg("%s resolved to %s", model ? model : "(null)", got);
  assert_contains(ci_last_error(), message_part);
}

/* ==== Tests ==== */

static void test_refs_main(void **state) {
  const char *root = *state;
  expect_resolves(root, "org/Model-A", "models--org--Model-A/snapshots/abc123");
  expect_resolves(root, "gpt2", "models--gpt2/snapshots/g1");
}

static void test_explicit_revision(void **state) {
  const char *root = *state;
  expect_resolves(root, "org/Model-A@v1", "models--org--Model-A/snapshots/def456");
  expect_resolves(root, "org/Model-A@def456", "models--org--Model-A/snapshots/def456");
  expect_resolves(root, "org/Model-A@main", "models--org--Model-A/snapshots/abc123");
  expect_error("org/Model-A@nope", "revision 'nope'");
  expect_error("org/Model-A@../../x", "invalid revision");
  expect_error("org/Model-A@", "org/name@revision");
}

static void test_newest_snapshot(void **state) {
  const char *root = *state;
  expect_resolves(root, "org/Model-B", "models--org--Model-B/snapshots/new");
  expect_error("empty", "has no snapshots");
}

static void test_substring(void **state) {
  const char *root = *state;
  expect_resolves(root, "thing", "models--other--thing/snapshots/t1");
  expect_resolves(root, "MODEL-b", "models--org--Model-B/snapshots/new");
  expect_resolves(root, "model-a-inst", "models--org--Model-A-Instruct/snapshots/111");
  /* A case-insensitive exact id wins over longer ids containing it. */
  expect_resolves(root, "org/model-a", "models--org--Model-A/snapshots/abc123");
  expect_resolves(root, "ORG/MODEL-A@v1", "models--org--Model-A/snapshots/def456");
  expect_resolves(root, "g/model-a-i@main", "models--org--Model-A-Instruct/snapshots/111");
}

static void test_ambiguous(void **state) {
  (void)state;
  expect_error("org/model", "matches 3 cached models");
  assert_contains(ci_last_error(), "org/Model-A, org/Model-A-Instruct, org/Model-B");
  expect_error("model-a", "matches 2 cached models");
  assert_null(strchr(ci_last_error(), '\n'));
}

static void test_missing(void **state) {
  const char *root = *state;
  expect_error("nothing/like-this", "no model in the Hugging Face cache");
  assert_contains(ci_last_error(), root);
  expect_error("other/broken", "points to snapshot gone, which is not in the cache");
  expect_error("data", "no model in the Hugging Face cache"); /* datasets are not models */
  expect_error("afile", "no model in the Hugging Face cache");
  expect_error("/nonexistent/cinfer/model", "no such model folder");
  expect_error("./nope", "no such model folder");
  expect_error("", "no model given");
  expect_error(NULL, "no model given");

  setenv("HF_HUB_CACHE", "/nonexistent/cinfer/hub", 1);
  expect_error("org/Model-A", "no model in the Hugging Face cache (/nonexistent/cinfer/hub)");
}

static void test_folder_as_is(void **state) {
  const char *root = *state;
  char path[256];
  snprintf(path, sizeof path, "%s/hub/models--org--Model-A/snapshots/abc123", root);
  char *got = ci_model_path_resolve(path);
  assert_non_null(got);
  assert_string_equal(got, path);
  free(got);
  snprintf(path, sizeof path, "%s/hub/models--org--Model-A/snapshots/abc123/config.json", root);
  expect_error(path, "is a file, not a model folder");
}

static void test_hub_dir_precedence(void **state) {
  const char *root = *state;
  char want[256];
  char *hub = ci_hf_hub_dir();
  snprintf(want, sizeof want, "%s/hub", root);
  assert_string_equal(hub, want);
  free(hub);

  unsetenv("HF_HUB_CACHE");
  setenv("HF_HOME", root, 1);
  hub = ci_hf_hub_dir();
  assert_string_equal(hub, want);
  free(hub);
  expect_resolves(root, "org/Model-A", "models--org--Model-A/snapshots/abc123");

  setenv("HF_HUB_CACHE", "", 1); /* empty counts as unset */
  hub = ci_hf_hub_dir();
  assert_string_equal(hub, want);
  free(hub);

  unsetenv("HF_HUB_CACHE");
  unsetenv("HF_HOME");
  char *saved_home = getenv("HOME") ? strdup(getenv("HOME")) : NULL;
  snprintf(want, sizeof want, "%s/home", root);
  setenv("HOME", want, 1);
  hub = ci_hf_hub_dir();
  snprintf(want, sizeof want, "%s/home/.cache/huggingface/hub", root);
  assert_string_equal(hub, want);
  free(hub);
  char *got = ci_model_path_resolve("home/only");
  assert_non_null(got);
  assert_contains(got, "/home/.cache/huggingface/hub/models--home--only/snapshots/h1");
  free(got);

  setenv("HF_HOME", "~/hf", 1);
  hub = ci_hf_hub_dir();
  snprintf(want, sizeof want, "%s/home/hf/hub", root);
  assert_string_equal(hub, want);
  free(hub);

  if (saved_home) {
    setenv("HOME", saved_home, 1);
    free(saved_home);
  } else {
    unsetenv("HOME");
  }
}

static void test_cached_repo_list(void **state) {
  const char *root = *state;
  char hub[128];
  snprintf(hub, sizeof hub, "%s/hub", root);
  char **ids;
  int count;
  assert_int_equal(ci_hf_cached_repos(hub, &ids, &count), CI_OK);
  const char *want[] = {"empty",       "gpt2",         "org/Model-A", "org/Model-A-Instruct",
                        "org/Model-B", "other/broken", "other/thing"};
  assert_int_equal(count, (int)(sizeof want / sizeof want[0]));
  for (int i = 0; i < count; i++) assert_string_equal(ids[i], want[i]);
  ci_hf_repo_list_free(ids, count);

  assert_int_equal(ci_hf_cached_repos("/nonexistent/cinfer/hub", &ids, &count), CI_OK);
  assert_int_equal(count, 0);
  ci_hf_repo_list_free(ids, count);

  char *snapshot = ci_hf_snapshot_path(hub, "org/Model-A", NULL);
  assert_non_null(snapshot);
  assert_contains(snapshot, "models--org--Model-A/snapshots/abc123");
  free(snapshot);
  assert_null(ci_hf_snapshot_path(hub, "org/Nope", NULL));
  assert_contains(ci_last_error(), "org/Nope is not in the Hugging Face cache");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_refs_main, use_hub_cache),
      cmocka_unit_test_setup(test_explicit_revision, use_hub_cache),
      cmocka_unit_test_setup(test_newest_snapshot, use_hub_cache),
      cmocka_unit_test_setup(test_substring, use_hub_cache),
      cmocka_unit_test_setup(test_ambiguous, use_hub_cache),
      cmocka_unit_test_setup(test_missing, use_hub_cache),
      cmocka_unit_test_setup(test_folder_as_is, use_hub_cache),
      cmocka_unit_test_setup(test_hub_dir_precedence, use_hub_cache),
      cmocka_unit_test_setup(test_cached_repo_list, use_hub_cache),
  };
  return cmocka_run_group_tests(tests, build_cache, remove_cache);
}
