/* The on-disk form of one persisted prefix-cache block (docs/kv-cache.md "Prompt cache on disk"):
 * a header naming the block (its two chained hashes, its predecessor's, its position in the
 * chain, its T token ids), the key it was cached under (model identity, backend, block size,
 * layer groups, codec state, adapter), each layer group's format and byte count, a checksum of
 * the payload and one of the header; then the payload, every present group's block bytes in
 * group order (K and V of every layer, as the pool stores them).
 *
 * Layout, little-endian: magic "cinferKV", u32 version, u32 header_bytes, u64 hash[2],
 * u64 parent[2], i64 index, u32 T, u32 n_groups, u64 payload_bytes, u64 payload_checksum,
 * u32 key_bytes, u32 flags (0), u64 header_checksum (computed with this field zero); key text;
 * i32 tokens[T]; per group {u32 present, u8 codec, u8 k_bits, u8 v_bits, u8 0, u32 group_size,
 * u32 0, u64 bytes}; zero padding to a multiple of 8; payload. The checksums are xxHash64
 * (base/hash64.h). Files are written whole under a temporary name and renamed into place. */
#ifndef CI_KV_BLOCK_FILE_H
#define CI_KV_BLOCK_FILE_H

#include "tensor/kv_format.h"

#include <stddef.h>
#include <stdint.h>

enum {
  CI_BLOCK_FILE_VERSION = 1,
  CI_BLOCK_FILE_FIXED_BYTES = 96,
  CI_BLOCK_FILE_GROUP_BYTES = 24,
  CI_BLOCK_FILE_MAX_KEY = 1 << 16,
  CI_BLOCK_FILE_MAX_GROUPS = 4096,
  CI_BLOCK_FILE_NAME_MAX = 40 /* 32 hex digits + ".kvb" + NUL, rounded up */
};

/* One layer group's part of a block. */
typedef struct {
  int present; /* 0: the block was not held (a released sliding-window block): no bytes */
  ci_kv_format format;
  uint64_t bytes; /* payload bytes of this group (0 when absent) */
} ci_block_file_group;

/* A parsed header (pointers into the parsed buffer). */
typedef struct {
  uint64_t hash[2], parent[2];
  int64_t index;
  int block_tokens;
  int n_groups;
  const char *key; /* key_bytes bytes, not NUL-terminated */
  size_t key_bytes;
  const uint8_t *tokens;       /* [block_tokens] little-endian int32 */
  ci_block_file_group *groups; /* owned by the view (ci_block_file_view_free) */
  size_t header_bytes;
  uint64_t payload_bytes;
  const uint8_t *payload;
} ci_block_file_view;

/* Bytes of the header of a block with this key, T and group count. */
size_t ci_block_file_header_bytes(size_t key_bytes, int block_tokens, int n_groups);

/* Writes the header into buf (ci_block_file_header_bytes bytes) with both checksums zero; the
 * payload (sum of the groups' bytes) follows it in the same buffer and ci_block_file_seal fills
 * the checksums once it is there. */
void ci_block_file_write_header(uint8_t *buf, const uint64_t hash[2], const uint64_t parent[2],
                                int64_t index, const int32_t *tokens, int block_tokens,
                                const char *key, size_t key_bytes,
                                const ci_block_file_group *groups, int n_groups);

/* Computes the payload checksum, then the header checksum, of a whole file image in place. */
void ci_block_file_seal(uint8_t *buf, size_t len);

/* Checks and parses a whole file image of len bytes: magic, version, header checksum, sizes
 * (a short image is "truncated"), group formats, payload checksum. Returns CI_OK with *view
 * filled (free with ci_block_file_view_free), or CI_ERR with a message naming the problem. With
 * header_only, the payload need not be there and is not checked (listing). */
int ci_block_file_parse(const uint8_t *buf, size_t len, int header_only, ci_block_file_view *view);

void ci_block_file_view_free(ci_block_file_view *view);

/* Token t of a parsed header. */
int32_t ci_block_file_token(const ci_block_file_view *view, int t);

/* Largest block file read (a block of the largest model in f32 is far below it). */
#define CI_BLOCK_FILE_MAX_BYTES ((int64_t)4 << 30)

/* Reads the regular file `name` of directory dirfd, never following a symbolic link, into a new
 * buffer (*out, malloc'd; at most max bytes, a larger file is an error), and with `touch` marks it
 * used (its modification time: pruning removes the least recently used first). Returns CI_OK;
 * CI_ERR with *missing = 1 when there is no such file, else with a message (a link, not a
 * regular file, too large, unreadable). */
int ci_block_file_read_at(int dirfd, const char *name, int64_t max, int touch, uint8_t **out,
                          size_t *len, int *missing);

/* "HHHH...HHHH.kvb": the file name of a block with these hashes (buf >= CI_BLOCK_FILE_NAME_MAX). */
void ci_block_file_name(const uint64_t hash[2], char *buf, size_t size);

/* 1 when name has the form ci_block_file_name gives. */
int ci_block_file_name_valid(const char *name);

#endif
