/* Prompt cache on disk (docs/kv-cache.md "Prompt cache on disk"): the prefix cache's blocks
 * persisted as one file per block in a directory (kv/block_file.h), named by the block's two
 * chained hashes, so that a restarted engine finds the blocks of a prompt it saw before and
 * prefills only the rest.
 *
 * Writing never blocks a step: the engine thread copies a new block's bytes into a buffer and
 * queues it; a writer thread of this module writes the queue out (a temporary file renamed into
 * place). The queue is bounded in bytes: a block that does not fit is dropped (counted), and an
 * explicit save (ci_engine_prompt_cache_save) picks it up later. Reading happens on the engine
 * thread at admission: the chain of the prompt's blocks is followed from the first block the
 * memory cache lacks, one file per block, until a file is missing or fails a check.
 *
 * Safety: files are opened relative to the directory, never following a symbolic link, and only
 * regular files named as ci_block_file_name names them are read or written; a file that is
 * truncated, corrupt (checksum), of another version, or written under another key (model,
 * backend, block size, layer groups, codec state, adapter) is skipped with a warning and never
 * loaded.
 *
 * Ownership: the engine owns the prompt cache; the key text of a block is the engine's (see
 * prefix_key_text in engine.c). Thread use: enqueue and fill on the engine thread only; flush and
 * get_stats from any thread. */
#ifndef CI_ENGINE_PROMPT_CACHE_H
#define CI_ENGINE_PROMPT_CACHE_H

#include "engine/prefix_cache.h"
#include "kv/block_file.h"

#include <stdint.h>
#include <time.h>

typedef struct ci_prompt_cache ci_prompt_cache;

/* Receives a warning (a skipped file, a failed write); called on the engine or writer thread. */
typedef void (*ci_prompt_cache_warn_fn)(void *arg, const char *message);

typedef struct {
  int64_t blocks_written, bytes_written;
  int64_t blocks_dropped; /* the queue was full */
  int64_t write_errors;
  int64_t blocks_loaded, bytes_loaded;
  int64_t files_rejected; /* skipped with a warning: truncated, corrupt, foreign, not a file */
  int64_t queued_bytes;   /* waiting for the writer now */
} ci_prompt_cache_stats;

/* Opens (creating it if needed, mode 0700) the directory and starts the writer; queue_bytes caps
 * the bytes waiting to be written (<= 0: 256 MiB). NULL with ci_last_error. */
ci_prompt_cache *ci_prompt_cache_open(const char *dir, ci_kv_cache *kv, int64_t queue_bytes,
                                      ci_prompt_cache_warn_fn warn, void *warn_arg);

/* Writes out what is queued, stops the writer and frees the cache. NULL is a no-op. */
void ci_prompt_cache_close(ci_prompt_cache *pc);

/* Engine thread: copies the block's bytes and queues it under key_text. Returns 1 when queued,
 * 0 when the queue has no room (an idle writer's empty queue always takes one block). */
int ci_prompt_cache_enqueue(ci_prompt_cache *pc, const char *key_text,
                            const ci_prefix_block *block);

/* Engine thread: extends the prefix cache's chain of tokens[0 .. max_blocks*T) under key (whose
 * text is key_text; formats[g] is the format every group's blocks must have) from disk, block by
 * block from the first one it lacks, while files are found and pass every check and the loaded
 * blocks stay within max_bytes. Returns the number of blocks loaded. */
int64_t ci_prompt_cache_fill(ci_prompt_cache *pc, ci_prefix_cache *prefix, uint64_t key,
                             const char *key_text, const ci_kv_format *formats,
                             const int32_t *tokens, int64_t max_blocks, int64_t max_bytes);

/* Counts a block that was not queued for want of room (the stats' blocks_dropped). */
void ci_prompt_cache_count_drop(ci_prompt_cache *pc);

/* Waits until the writer has written (or failed) everything queued so far. */
void ci_prompt_cache_flush(ci_prompt_cache *pc);

void ci_prompt_cache_get_stats(ci_prompt_cache *pc, ci_prompt_cache_stats *stats);

/* ==== The directory, without an engine (cinfer cache ls | prune; prompt_cache_dir.c) ==== */

/* Temporary files of the writer start with this. */
#define CI_PROMPT_CACHE_TMP_PREFIX ".tmp-"

/* One file of a prompt-cache directory. */
typedef struct {
  const char *name;
  int64_t bytes;
  time_t mtime;
  int valid;           /* the header parsed (then the fields below are set) */
  const char *problem; /* why not (valid = 0) */
  const char *key;     /* key text, key_bytes long */
  size_t key_bytes;
  int64_t index; /* block index: positions [index*T, (index+1)*T) */
  int block_tokens;
  uint64_t hash[2], parent[2];
} ci_prompt_cache_file;

/* Calls fn for every block file and stale temporary file of dir (header checked; payload
 * checksums too when verify). Returns CI_OK or CI_ERR (dir cannot be read, or fn failed). */
int ci_prompt_cache_scan(const char *dir, int verify,
                         int (*fn)(void *arg, const ci_prompt_cache_file *file), void *arg);

/* Deletes what cannot be loaded (files that fail their checks, temporary files left by a crash,
 * blocks whose predecessor is gone), then, while the directory's block files exceed max_bytes
 * (< 0: no cap), the least recently used chains' blocks, leaves first. *removed and *freed (may
 * be NULL) get counts. */
int ci_prompt_cache_prune(const char *dir, int64_t max_bytes, int64_t *removed, int64_t *freed);

#endif
