/* Model path resolution: turns the MODEL argument (a folder, an `org/name[@revision]` repo id,
 * or a substring of one) into a model folder, looking only at the local Hugging Face hub cache.
 * Nothing here touches the network.
 *
 * Cache layout (huggingface_hub): HUB/models--ORG--NAME/{refs/REVISION, snapshots/COMMIT/...},
 * where refs/REVISION is a small text file holding the commit hash of that branch or tag. */
#ifndef CI_IO_MODEL_PATH_H
#define CI_IO_MODEL_PATH_H

/* Resolves a model argument to a folder. In order:
 *   1. an existing directory is returned as given (a path that exists but is not a directory,
 *      or one that starts with '/', './', '../' or '~' and does not exist, is an error);
 *   2. `org/name[@revision]` (or a bare `name`) whose cache folder models--org--name exists:
 *      see ci_hf_snapshot_path();
 *   3. otherwise a case-insensitive substring of the repo ids in the cache (an `@revision`
 *      suffix still applies): one match is resolved as in 2; a case-insensitive exact match
 *      wins over longer ones; several matches are an error that lists them.
 * The cache is the one ci_hf_hub_dir() names. Returns a malloc'd path (caller frees), or NULL
 * with ci_last_error() set to one line naming the argument and the cache folder searched. */
char *ci_model_path_resolve(const char *model);

/* The Hugging Face hub cache folder, as huggingface_hub chooses it: $HF_HUB_CACHE, else
 * $HUGGINGFACE_HUB_CACHE (legacy), else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub,
 * else ~/.cache/huggingface/hub (a leading "~/" in a variable is expanded with $HOME). Empty
 * variables count as unset. Returns a malloc'd path (it need not exist), or NULL with
 * ci_last_error() set when none can be formed (no $HOME). */
char *ci_hf_hub_dir(void);

/* Resolves repo_id ("org/name") at revision in the cache folder hub_dir to a snapshot folder.
 * revision NULL means "main". The commit is read from refs/REVISION; a revision without a ref
 * may name a snapshot (commit hash) directly; with revision NULL and no refs/main, the snapshot
 * with the newest modification time is used (ties: greatest name). Returns a malloc'd path
 * HUB/models--org--name/snapshots/COMMIT, or NULL with ci_last_error() set (repo not cached,
 * revision unknown, ref pointing at a missing snapshot, no snapshots). */
char *ci_hf_snapshot_path(const char *hub_dir, const char *repo_id, const char *revision);

/* The cache folder of repo_id ("org/name" -> "HUB/models--org--name"; it need not exist).
 * Returns a malloc'd path, or NULL with ci_last_error() set. */
char *ci_hf_repo_dir(const char *hub_dir, const char *repo_id);

/* Lists the model repo ids cached in hub_dir (folders models--ORG--NAME, reported as
 * "ORG/NAME"), sorted by strcmp. Returns CI_OK with *out_ids a malloc'd array of *out_count
 * malloc'd strings (release with ci_hf_repo_list_free()); a missing hub_dir gives an empty
 * list. Returns CI_ERR with ci_last_error() set if hub_dir exists but cannot be read. */
int ci_hf_cached_repos(const char *hub_dir, char ***out_ids, int *out_count);

/* Frees a list returned by ci_hf_cached_repos(). NULL is a no-op. */
void ci_hf_repo_list_free(char **ids, int count);

#endif
