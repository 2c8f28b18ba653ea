/* Writing to and removing from the Hugging Face hub cache, in the layout huggingface_hub shares:
 *   HUB/models--ORG--NAME/blobs/ETAG              file contents, named by their etag (the sha256
 *                                                 of an LFS file, the git blob sha1 of another)
 *   HUB/models--ORG--NAME/blobs/ETAG.incomplete   a download in progress (resumed from its size)
 *   HUB/models--ORG--NAME/snapshots/COMMIT/FILE   relative symlink to ../../blobs/ETAG
 *   HUB/models--ORG--NAME/refs/REVISION           the commit hash of a branch or tag
 * Reading (finding a snapshot, listing repo ids) is io/model_path.h; nothing here touches the
 * network. */
#ifndef CI_HUB_HF_CACHE_H
#define CI_HUB_HF_CACHE_H

#include <stdint.h>

/* Checks a Hub repo id as the Hub does: "name" or "org/name", each part 1..96 of [A-Za-z0-9._-],
 * not starting or ending with '-' or '.', without "--" or "..". Such an id can never leave the
 * cache folder when joined into a path. Returns 0, or CI_ERR with a message naming the id. */
int ci_hf_repo_id_check(const char *repo_id);

/* Checks a revision (branch, tag, "refs/pr/N" or a commit hash): a relative path of printable
 * characters without empty, "." or ".." components. Returns 0, or CI_ERR naming it. */
int ci_hf_revision_check(const char *revision);

/* Checks a file path inside a repo as ci_hf_revision_check does (no "..", no leading '/').
 * Returns 0, or CI_ERR naming it. */
int ci_hf_repo_file_check(const char *file);

/* Splits "org/name[@revision]" into a malloc'd repo id and revision (NULL when absent), both
 * checked. Returns 0, or CI_ERR with the reason (nothing allocated). */
int ci_hf_repo_ref_parse(const char *ref, char **repo_id, char **revision);

/* Creates `path` and its missing parents (mode 0755). Returns 0 or CI_ERR naming the folder. */
int ci_hf_mkdirs(const char *path);

/* Writes repo_dir/refs/REVISION holding commit (no newline, as huggingface_hub writes it),
 * through a temporary file renamed over the old one. Returns 0 or CI_ERR. */
int ci_hf_write_ref(const char *repo_dir, const char *revision, const char *commit);

/* Makes repo_dir/snapshots/COMMIT/FILE a relative symlink to blobs/ETAG (replacing what is
 * there). Returns 0 or CI_ERR. */
int ci_hf_link_snapshot(const char *repo_dir, const char *commit, const char *file,
                        const char *etag);

/* Bytes of the regular files under path, symlinks not followed (a repo's blobs: its size on
 * disk). A missing path is 0 bytes. */
int64_t ci_hf_tree_bytes(const char *path);

/* Deletes the cache folder of repo_id under hub_dir (and its lock folder HUB/.locks/models--...),
 * never following a symlink out of it. *freed (may be NULL) receives the bytes of files removed.
 * Returns 0, or CI_ERR: a bad id, a repo not in the cache, a repo folder that is a symlink, or a
 * file that could not be removed. */
int ci_hf_repo_remove(const char *hub_dir, const char *repo_id, int64_t *freed);

#endif
