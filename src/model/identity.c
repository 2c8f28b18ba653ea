/* Model identity (see identity.h): two independent 64-bit hashes over config.json's bytes, then
 * every tensor's name, dtype, shape, size, shard and offset, and up to 64 bytes at the start, the
 * middle and the end of its data. Reading those few bytes touches three pages per tensor. */
#include "model/identity.h"

#include "base/error.h"
#include "base/hash64.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void update2(ci_hash64_state s[2], const void *data, size_t n) {
  ci_hash64_update(&s[0], data, n);
  ci_hash64_update(&s[1], data, n);
}

/* Hashes the file's bytes; CI_ERR when it cannot be read. */
static int hash_file(ci_hash64_state s[2], const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return ci_fail("cannot read %s", path);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) update2(s, buf, n);
  const int bad = ferror(f);
  fclose(f);
  return bad ? ci_fail("cannot read %s", path) : CI_OK;
}

int ci_model_identity(const char *model_dir, const ci_weights *w, uint64_t out[2]) {
  ci_hash64_state s[2];
  ci_hash64_init(&s[0], 0x636966696e666572ULL);
  ci_hash64_init(&s[1], 0x6d6f64656c2d6964ULL);
  const size_t len = strlen(model_dir) + sizeof "/config.json";
  char *path = malloc(len);
  if (!path) return ci_fail("out of memory");
  snprintf(path, len, "%s/config.json", model_dir);
  const int status = hash_file(s, path);
  free(path);
  if (status) return status;
  for (int i = 0; i < ci_weights_count(w); i++) {
    const ci_st_tensor *t = ci_weights_at(w, i);
    update2(s, t->name, strlen(t->name) + 1);
    const int64_t facts[4] = {(int64_t)t->dtype, (int64_t)t->nbytes, (int64_t)t->offset, t->shard};
    update2(s, facts, sizeof facts);
    update2(s, t->shape, (size_t)t->ndim * sizeof t->shape[0]);
    const size_t sample = t->nbytes < 64 ? t->nbytes : 64;
    const size_t at[3] = {0, (t->nbytes - sample) / 2, t->nbytes - sample};
    for (int k = 0; k < 3 && sample > 0; k++) update2(s, (const uint8_t *)t->data + at[k], sample);
  }
  out[0] = ci_hash64_digest(&s[0]);
  out[1] = ci_hash64_digest(&s[1]);
  return CI_OK;
}
