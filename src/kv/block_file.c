/* The persisted block format (see block_file.h): header encoding, sealing and checking, and
 * reading a block file safely. */
#include "kv/block_file.h"

#include "base/error.h"
#include "base/hash64.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char MAGIC[8] = {'c', 'i', 'n', 'f', 'e', 'r', 'K', 'V'};
enum { OFF_HEADER_BYTES = 12, OFF_PAYLOAD_CHECKSUM = 72, OFF_HEADER_CHECKSUM = 88 };

/* ==== Little-endian fields ==== */

static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

static uint64_t get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* ==== Writing ==== */

size_t ci_block_file_header_bytes(size_t key_bytes, int block_tokens, int n_groups) {
  const size_t n = CI_BLOCK_FILE_FIXED_BYTES + key_bytes + 4 * (size_t)block_tokens +
                   CI_BLOCK_FILE_GROUP_BYTES * (size_t)n_groups;
  return (n + 7) / 8 * 8;
}

void ci_block_file_write_header(uint8_t *buf, const uint64_t hash[2], const uint64_t parent[2],
                                int64_t index, const int32_t *tokens, int block_tokens,
                                const char *key, size_t key_bytes,
                                const ci_block_file_group *groups, int n_groups) {
  const size_t header = ci_block_file_header_bytes(key_bytes, block_tokens, n_groups);
  memset(buf, 0, header);
  uint64_t payload = 0;
  for (int g = 0; g < n_groups; g++) payload += groups[g].present ? groups[g].bytes : 0;
  memcpy(buf, MAGIC, sizeof MAGIC);
  put32(buf + 8, CI_BLOCK_FILE_VERSION);
  put32(buf + OFF_HEADER_BYTES, (uint32_t)header);
  put64(buf + 16, hash[0]);
  put64(buf + 24, hash[1]);
  put64(buf + 32, parent[0]);
  put64(buf + 40, parent[1]);
  put64(buf + 48, (uint64_t)index);
  put32(buf + 56, (uint32_t)block_tokens);
  put32(buf + 60, (uint32_t)n_groups);
  put64(buf + 64, payload);
  put32(buf + 80, (uint32_t)key_bytes);
  uint8_t *p = buf + CI_BLOCK_FILE_FIXED_BYTES;
  memcpy(p, key, key_bytes);
  p += key_bytes;
  for (int t = 0; t < block_tokens; t++, p += 4) put32(p, (uint32_t)tokens[t]);
  for (int g = 0; g < n_groups; g++, p += CI_BLOCK_FILE_GROUP_BYTES) {
    const ci_block_file_group *x = &groups[g];
    put32(p, (uint32_t)(x->present != 0));
    p[4] = (uint8_t)x->format.codec;
    p[5] = (uint8_t)x->format.k_bits;
    p[6] = (uint8_t)x->format.v_bits;
    put32(p + 8, (uint32_t)x->format.group_size);
    put64(p + 16, x->present ? x->bytes : 0);
  }
}

void ci_block_file_seal(uint8_t *buf, size_t len) {
  const size_t header = get32(buf + OFF_HEADER_BYTES);
  put64(buf + OFF_PAYLOAD_CHECKSUM, ci_hash64(buf + header, len - header, 0));
  put64(buf + OFF_HEADER_CHECKSUM, 0);
  put64(buf + OFF_HEADER_CHECKSUM, ci_hash64(buf, header, 0));
}

/* ==== Reading ==== */

int ci_block_file_parse(const uint8_t *buf, size_t len, int header_only, ci_block_file_view *v) {
  memset(v, 0, sizeof *v);
  if (len < CI_BLOCK_FILE_FIXED_BYTES)
    return ci_fail(len >= sizeof MAGIC && memcmp(buf, MAGIC, sizeof MAGIC)
                       ? "not a cinfer KV block file (bad magic)"
                       : "truncated: %zu bytes, shorter than the %d-byte header",
                   len, CI_BLOCK_FILE_FIXED_BYTES);
  if (memcmp(buf, MAGIC, sizeof MAGIC)) return ci_fail("not a cinfer KV block file (bad magic)");
  const uint32_t version = get32(buf + 8);
  if (version != CI_BLOCK_FILE_VERSION)
    return ci_fail("format version %u (this cinfer reads version %d)", version,
                   CI_BLOCK_FILE_VERSION);
  const size_t header = get32(buf + OFF_HEADER_BYTES);
  const uint32_t T = get32(buf + 56), n_groups = get32(buf + 60), key_bytes = get32(buf + 80);
  if (T < 1 || T > 64 || n_groups < 1 || n_groups > CI_BLOCK_FILE_MAX_GROUPS ||
      key_bytes > CI_BLOCK_FILE_MAX_KEY ||
      header != ci_block_file_header_bytes(key_bytes, (int)T, (int)n_groups))
    return ci_fail("corrupt header (inconsistent sizes)");
  if (len < header)
    return ci_fail("truncated: %zu bytes, shorter than its %zu-byte header", len, header);
  uint8_t *copy = malloc(header);
  if (!copy) return ci_fail("out of memory");
  memcpy(copy, buf, header);
  put64(copy + OFF_HEADER_CHECKSUM, 0);
  const int header_ok = ci_hash64(copy, header, 0) == get64(buf + OFF_HEADER_CHECKSUM);
  free(copy);
  if (!header_ok) return ci_fail("corrupt header (checksum mismatch)");
  v->hash[0] = get64(buf + 16);
  v->hash[1] = get64(buf + 24);
  v->parent[0] = get64(buf + 32);
  v->parent[1] = get64(buf + 40);
  v->index = (int64_t)get64(buf + 48);
  v->block_tokens = (int)T;
  v->n_groups = (int)n_groups;
  v->payload_bytes = get64(buf + 64);
  v->header_bytes = header;
  v->key = (const char *)buf + CI_BLOCK_FILE_FIXED_BYTES;
  v->key_bytes = key_bytes;
  v->tokens = buf + CI_BLOCK_FILE_FIXED_BYTES + key_bytes;
  if (v->index < 0) return ci_fail("corrupt header (negative block index)");
  v->groups = calloc(n_groups, sizeof *v->groups);
  if (!v->groups) return ci_fail("out of memory");
  const uint8_t *p = v->tokens + 4 * (size_t)T;
  uint64_t sum = 0;
  for (uint32_t g = 0; g < n_groups; g++, p += CI_BLOCK_FILE_GROUP_BYTES) {
    ci_block_file_group *x = &v->groups[g];
    x->present = get32(p) != 0;
    x->bytes = get64(p + 16);
    if (p[4] >= CI_KV_CODEC_COUNT || (!x->present && x->bytes) || x->bytes > v->payload_bytes) {
      ci_block_file_view_free(v);
      return ci_fail("corrupt header (layer group %u)", g);
    }
    x->format.codec = (ci_kv_codec)p[4];
    x->format.k_bits = p[5];
    x->format.v_bits = p[6];
    x->format.group_size = (int)get32(p + 8);
    sum += x->bytes;
  }
  if (sum != v->payload_bytes) {
    ci_block_file_view_free(v);
    return ci_fail("corrupt header (group sizes do not add up to the payload)");
  }
  if (header_only) return CI_OK;
  if (len - header != v->payload_bytes) {
    const int short_file = len - header < v->payload_bytes;
    ci_block_file_view_free(v);
    return short_file ? ci_fail("truncated: %zu bytes of payload, %llu expected", len - header,
                                (unsigned long long)sum)
                      : ci_fail("corrupt: %zu bytes of payload, %llu expected", len - header,
                                (unsigned long long)sum);
  }
  if (ci_hash64(buf + header, len - header, 0) != get64(buf + OFF_PAYLOAD_CHECKSUM)) {
    ci_block_file_view_free(v);
    return ci_fail("corrupt payload (checksum mismatch)");
  }
  v->payload = buf + header;
  return CI_OK;
}

void ci_block_file_view_free(ci_block_file_view *v) {
  free(v->groups);
  v->groups = NULL;
}

int32_t ci_block_file_token(const ci_block_file_view *v, int t) {
  return (int32_t)get32(v->tokens + 4 * (size_t)t);
}

/* ==== Files ==== */

int ci_block_file_read_at(int dirfd, const char *name, int64_t max, int touch, uint8_t **out,
                          size_t *len, int *missing) {
  *out = NULL;
  *len = 0;
  *missing = 0;
  const int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) {
      *missing = 1;
      return CI_ERR;
    }
    return ci_fail(errno == ELOOP ? "a symbolic link (never followed)" : "cannot open: %s",
                   strerror(errno));
  }
  struct stat st;
  if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
    close(fd);
    return ci_fail("not a regular file");
  }
  if (st.st_size > max) {
    close(fd);
    return ci_fail("%lld bytes, over the %lld-byte limit", (long long)st.st_size, (long long)max);
  }
  uint8_t *buf = malloc(st.st_size > 0 ? (size_t)st.st_size : 1);
  if (!buf) {
    close(fd);
    return ci_fail("out of memory");
  }
  size_t got = 0;
  while (got < (size_t)st.st_size) {
    const ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += (size_t)n;
  }
  if (touch) futimens(fd, NULL); /* used now: pruning removes the least recently used first */
  close(fd);
  *out = buf;
  *len = got;
  return CI_OK;
}

/* ==== Names ==== */

void ci_block_file_name(const uint64_t hash[2], char *buf, size_t size) {
  snprintf(buf, size, "%016llx%016llx.kvb", (unsigned long long)hash[0],
           (unsigned long long)hash[1]);
}

int ci_block_file_name_valid(const char *name) {
  for (int i = 0; i < 32; i++)
    if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f'))) return 0;
  return !strcmp(name + 32, ".kvb");
}
