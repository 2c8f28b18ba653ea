/* Writing to and removing from the Hugging Face hub cache (see hf_cache.h). */
#include "hub/hf_cache.h"

#include "base/error.h"
#include "io/model_path.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ==== Names ==== */

static int repo_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_' || c == '.';
}

/* Checks one part of a repo id: [start, start + len). */
static int repo_part_ok(const char *start, size_t len) {
  if (len < 1 || len > 96) return 0;
  for (size_t i = 0; i < len; i++)
    if (!repo_char(start[i])) return 0;
  const char first = start[0], last = start[len - 1];
  return first != '-' && first != '.' && last != '-' && last != '.';
}

int ci_hf_repo_id_check(const char *repo_id) {
  if (!repo_id || !repo_id[0]) return ci_fail("no repo id given (expected org/name)");
  const char *slash = strchr(repo_id, '/');
  int ok = !strstr(repo_id, "--") && !strstr(repo_id, "..");
  if (slash) {
    ok = ok && !strchr(slash + 1, '/') && repo_part_ok(repo_id, (size_t)(slash - repo_id)) &&
         repo_part_ok(slash + 1, strlen(slash + 1));
  } else {
    ok = ok && repo_part_ok(repo_id, strlen(repo_id));
  }
  if (!ok)
    return ci_fail("'%.200s' is not a Hugging Face repo id (expected org/name: letters, digits, "
                   "'-', '_' and '.', without '..' or '--')",
                   repo_id);
  return CI_OK;
}

/* 1 if s is a relative path of printable characters without empty, "." or ".." parts. */
static int safe_relative_path(const char *s) {
  if (!s || !s[0] || s[0] == '/') return 0;
  for (const char *p = s; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f || *p == '\\') return 0;
  for (const char *p = s;;) {
    const char *slash = strchr(p, '/');
    const size_t part = slash ? (size_t)(slash - p) : strlen(p);
    if (part == 0 || (part == 1 && p[0] == '.') || (part == 2 && p[0] == '.' && p[1] == '.'))
      return 0;
    if (!slash) return 1;
    p = slash + 1;
  }
}

int ci_hf_revision_check(const char *revision) {
  if (!safe_relative_path(revision) || strlen(revision) > 255)
    return ci_fail("'%.200s' is not a valid revision (a branch, tag or commit hash)",
                   revision ? revision : "");
  return CI_OK;
}

int ci_hf_repo_file_check(const char *file) {
  if (!safe_relative_path(file) || strlen(file) > 1024)
    return ci_fail("'%.200s' is not a safe file name inside a repo", file ? file : "");
  return CI_OK;
}

int ci_hf_repo_ref_parse(const char *ref, char **repo_id, char **revision) {
  *repo_id = NULL;
  *revision = NULL;
  if (!ref || !ref[0]) return ci_fail("no repo given (expected org/name[@revision])");
  char *id = strdup(ref);
  if (!id) return ci_fail("out of memory");
  char *at = strchr(id, '@');
  char *rev = NULL;
  if (at) {
    *at = '\0';
    if (ci_hf_revision_check(at + 1)) {
      free(id);
      return CI_ERR;
    }
    rev = strdup(at + 1);
    if (!rev) {
      free(id);
      return ci_fail("out of memory");
    }
  }
  if (ci_hf_repo_id_check(id)) {
    free(id);
    free(rev);
    return CI_ERR;
  }
  *repo_id = id;
  *revision = rev;
  return CI_OK;
}

/* ==== Writing ==== */

int ci_hf_mkdirs(const char *path) {
  char *copy = strdup(path);
  if (!copy) return ci_fail("out of memory");
  int rc = CI_OK;
  for (char *p = copy + 1;; p++) {
    const char c = *p;
    if (c != '/' && c != '\0') continue;
    *p = '\0';
    if (mkdir(copy, 0755) != 0 && errno != EEXIST) {
      rc = ci_fail("cannot create folder %s: %s", copy, strerror(errno));
      break;
    }
    *p = c;
    if (c == '\0') break;
  }
  free(copy);
  return rc;
}

/* Makes the parent folder of path. */
static int mkdirs_parent(const char *path) {
  char *copy = strdup(path);
  if (!copy) return ci_fail("out of memory");
  char *slash = strrchr(copy, '/');
  int rc = CI_OK;
  if (slash && slash != copy) {
    *slash = '\0';
    rc = ci_hf_mkdirs(copy);
  }
  free(copy);
  return rc;
}

int ci_hf_write_ref(const char *repo_dir, const char *revision, const char *commit) {
  if (ci_hf_revision_check(revision)) return CI_ERR;
  char *path = NULL, *tmp = NULL;
  int rc = CI_ERR;
  if (asprintf(&path, "%s/refs/%s", repo_dir, revision) < 0) {
    path = NULL;
    ci_fail("out of memory");
    goto done;
  }
  if (asprintf(&tmp, "%s.tmp%ld", path, (long)getpid()) < 0) {
    tmp = NULL;
    ci_fail("out of memory");
    goto done;
  }
  if (mkdirs_parent(path)) goto done;
  FILE *f = fopen(tmp, "w");
  if (!f) {
    ci_fail("cannot write %s: %s", tmp, strerror(errno));
    goto done;
  }
  const int wrote = fputs(commit, f) >= 0;
  if (fclose(f) != 0 || !wrote) {
    ci_fail("cannot write %s: %s", tmp, strerror(errno));
    unlink(tmp);
    goto done;
  }
  if (rename(tmp, path) != 0) {
    ci_fail("cannot write %s: %s", path, strerror(errno));
    unlink(tmp);
    goto done;
  }
  rc = CI_OK;
done:
  free(tmp);
  free(path);
  return rc;
}

int ci_hf_link_snapshot(const char *repo_dir, const char *commit, const char *file,
                        const char *etag) {
  if (ci_hf_repo_file_check(file) || ci_hf_revision_check(commit) || strchr(commit, '/') ||
      ci_hf_repo_file_check(etag) || strchr(etag, '/'))
    return CI_ERR;
  /* snapshots/COMMIT/a/b/FILE -> ../../../../blobs/ETAG: one ".." per folder below repo_dir */
  int depth = 2;
  for (const char *p = file; *p; p++) depth += *p == '/';
  size_t target_len = (size_t)depth * 3 + strlen("blobs/") + strlen(etag) + 1;
  char *target = malloc(target_len);
  char *path = NULL;
  if (!target) return ci_fail("out of memory");
  target[0] = '\0';
  for (int i = 0; i < depth; i++) strcat(target, "../");
  strcat(target, "blobs/");
  strcat(target, etag);
  int rc = CI_ERR;
  if (asprintf(&path, "%s/snapshots/%s/%s", repo_dir, commit, file) < 0) {
    path = NULL;
    ci_fail("out of memory");
    goto done;
  }
  if (mkdirs_parent(path)) goto done;
  if (unlink(path) != 0 && errno != ENOENT) {
    ci_fail("cannot replace %s: %s", path, strerror(errno));
    goto done;
  }
  if (symlink(target, path) != 0) {
    ci_fail("cannot link %s: %s", path, strerror(errno));
    goto done;
  }
  rc = CI_OK;
done:
  free(path);
  free(target);
  return rc;
}

/* ==== Sizes and removal ==== */

/* Walks the folder open at dir_fd (closed here): adds the sizes of its regular files to *bytes
 * and, when remove is set, deletes everything in it. Symlinks are never followed. Returns 0 or
 * CI_ERR (name is the folder's path, for messages). */
static int walk(int dir_fd, const char *name, int remove, int64_t *bytes) {
  DIR *dir = fdopendir(dir_fd);
  if (!dir) {
    close(dir_fd);
    return ci_fail("cannot read %s: %s", name, strerror(errno));
  }
  int rc = CI_OK;
  struct dirent *entry;
  while (rc == CI_OK && (entry = readdir(dir)) != NULL) {
    const char *e = entry->d_name;
    if (!strcmp(e, ".") || !strcmp(e, "..")) continue;
    struct stat st;
    if (fstatat(dirfd(dir), e, &st, AT_SYMLINK_NOFOLLOW) != 0) {
      rc = ci_fail("cannot stat %s/%s: %s", name, e, strerror(errno));
      break;
    }
    if (S_ISDIR(st.st_mode)) {
      const int sub = openat(dirfd(dir), e, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
      char *sub_name = NULL;
      if (sub < 0) {
        rc = ci_fail("cannot open %s/%s: %s", name, e, strerror(errno));
      } else if (asprintf(&sub_name, "%s/%s", name, e) < 0) {
        close(sub);
        rc = ci_fail("out of memory");
      } else {
        rc = walk(sub, sub_name, remove, bytes);
        free(sub_name);
      }
      if (rc == CI_OK && remove && unlinkat(dirfd(dir), e, AT_REMOVEDIR) != 0)
        rc = ci_fail("cannot remove %s/%s: %s", name, e, strerror(errno));
      continue;
    }
    if (S_ISREG(st.st_mode)) *bytes += (int64_t)st.st_size;
    if (remove && unlinkat(dirfd(dir), e, 0) != 0)
      rc = ci_fail("cannot remove %s/%s: %s", name, e, strerror(errno));
  }
  closedir(dir);
  return rc;
}

int64_t ci_hf_tree_bytes(const char *path) {
  const int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
  if (fd < 0) return 0;
  int64_t bytes = 0;
  walk(fd, path, 0, &bytes);
  return bytes;
}

/* Removes the folder at path (not a symlink) and everything in it. */
static int remove_tree(const char *path, int64_t *bytes) {
  const int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
  if (fd < 0) return ci_fail("cannot open %s: %s", path, strerror(errno));
  if (walk(fd, path, 1, bytes)) return CI_ERR;
  if (rmdir(path) != 0) return ci_fail("cannot remove %s: %s", path, strerror(errno));
  return CI_OK;
}

int ci_hf_repo_remove(const char *hub_dir, const char *repo_id, int64_t *freed) {
  if (freed) *freed = 0;
  if (ci_hf_repo_id_check(repo_id)) return CI_ERR;
  char *repo = ci_hf_repo_dir(hub_dir, repo_id);
  if (!repo) return CI_ERR;
  int rc = CI_ERR;
  struct stat st;
  if (lstat(repo, &st) != 0) {
    ci_fail("%s is not in the Hugging Face cache (%s)", repo_id, hub_dir);
    goto done;
  }
  if (!S_ISDIR(st.st_mode)) {
    ci_fail("%s is not a folder (a symlink or file); not removing it", repo);
    goto done;
  }
  int64_t bytes = 0;
  rc = remove_tree(repo, &bytes);
  if (freed) *freed = bytes;
  if (rc == CI_OK) {
    /* huggingface_hub's lock files: HUB/.locks/models--ORG--NAME */
    const char *base = strrchr(repo, '/');
    char *locks = NULL;
    if (base && asprintf(&locks, "%s/.locks%s", hub_dir, base) >= 0) {
      if (lstat(locks, &st) == 0 && S_ISDIR(st.st_mode)) {
        int64_t ignored = 0;
        rc = remove_tree(locks, &ignored);
      }
      free(locks);
    }
  }
done:
  free(repo);
  return rc;
}
