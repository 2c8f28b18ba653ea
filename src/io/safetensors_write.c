/* safetensors writer: the header is built as tensors are declared (offsets in insertion order);
 * writing streams each tensor from memory or through its fill callback via one staging buffer. */
#include "io/safetensors_write.h"

#include "base/error.h"

#include <jansson.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  char *name;
  uint64_t nbytes;
  uint64_t row_bytes; /* bytes of one index of the first dimension (nbytes when ndim == 0) */
  const void *data;
  ci_st_fill_fn fill;
  void *user;
} st_entry;

struct ci_st_writer {
  json_t *header;   /* tensors in insertion order */
  json_t *metadata; /* __metadata__ object */
  st_entry *entries;
  size_t count, cap;
  uint64_t data_bytes;
  size_t buffer_size;
};

ci_st_writer *ci_st_writer_new(void) {
  ci_st_writer *w = calloc(1, sizeof(*w));
  if (!w) {
    ci_fail("safetensors writer: out of memory");
    return NULL;
  }
  w->header = json_object();
  w->metadata = json_object();
  w->buffer_size = 8u << 20;
  if (!w->header || !w->metadata ||
      json_object_set_new(w->metadata, "format", json_string("pt")) != 0) {
    ci_st_writer_free(w);
    ci_fail("safetensors writer: out of memory");
    return NULL;
  }
  return w;
}

void ci_st_writer_free(ci_st_writer *w) {
  if (!w) return;
  for (size_t i = 0; i < w->count; i++) free(w->entries[i].name);
  free(w->entries);
  json_decref(w->header);
  json_decref(w->metadata);
  free(w);
}

static int add_entry(ci_st_writer *w, const char *name, ci_dtype dtype, int ndim,
                     const int64_t *shape, const void *data, ci_st_fill_fn fill, void *user) {
  if (!name || !*name || strcmp(name, "__metadata__") == 0) {
    return ci_fail("safetensors writer: invalid tensor name '%s'", name ? name : "(null)");
  }
  if ((int)dtype < 0 || dtype >= CI_DTYPE_COUNT || !ci_dtype_get(dtype)->in_safetensors) {
    return ci_fail("safetensors writer: tensor %s: dtype cannot be stored in safetensors", name);
  }
  if (ndim < 0 || ndim > CI_ST_MAX_DIMS || (ndim > 0 && !shape)) {
    return ci_fail("safetensors writer: tensor %s: bad rank %d", name, ndim);
  }
  if (json_object_get(w->header, name)) {
    return ci_fail("safetensors writer: duplicate tensor name %s", name);
  }
  uint64_t numel = 1, inner = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0 || __builtin_mul_overflow(numel, (uint64_t)shape[i], &numel)) {
      return ci_fail("safetensors writer: tensor %s: bad shape", name);
    }
    if (i > 0) inner *= (uint64_t)shape[i];
  }
  const uint64_t esize = (uint64_t)ci_dtype_get(dtype)->bits / 8;
  uint64_t nbytes;
  if (__builtin_mul_overflow(numel, esize, &nbytes) || nbytes > (UINT64_MAX >> 2) - w->data_bytes) {
    return ci_fail("safetensors writer: tensor %s is too large", name);
  }
  if (w->count == w->cap) {
    size_t cap = w->cap ? 2 * w->cap : 64;
    st_entry *e = realloc(w->entries, cap * sizeof(*e));
    if (!e) return ci_fail("safetensors writer: out of memory");
    w->entries = e;
    w->cap = cap;
  }
  json_t *jshape = json_array();
  json_t *joff = json_array();
  json_t *entry = json_object();
  int bad = !jshape || !joff || !entry;
  for (int i = 0; !bad && i < ndim; i++) {
    bad = json_array_append_new(jshape, json_integer(shape[i]));
  }
  bad = bad || json_array_append_new(joff, json_integer((json_int_t)w->data_bytes)) ||
        json_array_append_new(joff, json_integer((json_int_t)(w->data_bytes + nbytes)));
  bad = bad || json_object_set_new(entry, "dtype", json_string(ci_dtype_get(dtype)->name));
  bad = bad || json_object_set(entry, "shape", jshape) ||
        json_object_set(entry, "data_offsets", joff);
  json_decref(jshape);
  json_decref(joff);
  char *copy = bad ? NULL : strdup(name);
  if (!copy || json_object_set_new(w->header, name, entry) != 0) {
    if (copy) entry = NULL; /* set_new consumed it */
    free(copy);
    json_decref(entry);
    return ci_fail("safetensors writer: tensor %s: out of memory or invalid UTF-8 name", name);
  }
  st_entry *e = &w->entries[w->count++];
  e->name = copy;
  e->nbytes = nbytes;
  e->row_bytes = ndim > 0 ? inner * esize : nbytes;
  e->data = data;
  e->fill = fill;
  e->user = user;
  w->data_bytes += nbytes;
  return CI_OK;
}

int ci_st_writer_add(ci_st_writer *w, const char *name, ci_dtype dtype, int ndim,
                     const int64_t *shape, const void *data) {
  return add_entry(w, name, dtype, ndim, shape, data, NULL, NULL);
}

int ci_st_writer_add_fill(ci_st_writer *w, const char *name, ci_dtype dtype, int ndim,
                          const int64_t *shape, ci_st_fill_fn fill, void *user) {
  if (!fill) return ci_fail("safetensors writer: tensor %s: no fill callback", name);
  return add_entry(w, name, dtype, ndim, shape, NULL, fill, user);
}

int ci_st_writer_set_metadata(ci_st_writer *w, const char *key, const char *value) {
  if (!key || !value || json_object_set_new(w->metadata, key, json_string(value)) != 0) {
    return ci_fail("safetensors writer: bad metadata entry (NULL or invalid UTF-8)");
  }
  return CI_OK;
}

size_t ci_st_writer_count(const ci_st_writer *w) {
  return w->count;
}

uint64_t ci_st_writer_data_bytes(const ci_st_writer *w) {
  return w->data_bytes;
}

void ci_st_writer_set_buffer_size(ci_st_writer *w, size_t bytes) {
  w->buffer_size = bytes < 4096 ? 4096 : bytes;
}

/* Renders the padded header: returns a malloc'd buffer of *len bytes (a multiple of 8). */
static char *render_header(const ci_st_writer *w, size_t *len) {
  json_t *root = json_object();
  if (!root || json_object_set(root, "__metadata__", w->metadata) != 0 ||
      json_object_update(root, w->header) != 0) {
    json_decref(root);
    ci_fail("safetensors writer: out of memory");
    return NULL;
  }
  char *text = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  if (!text) {
    ci_fail("safetensors writer: cannot render header");
    return NULL;
  }
  const size_t n = strlen(text);
  const size_t padded = (n + 7) & ~(size_t)7;
  char *out = realloc(text, padded);
  if (!out) {
    free(text);
    ci_fail("safetensors writer: out of memory");
    return NULL;
  }
  memset(out + n, ' ', padded - n);
  *len = padded;
  return out;
}

static int write_all(FILE *f, const void *buf, size_t len, const char *path) {
  if (len && fwrite(buf, 1, len, f) != len) {
    return ci_fail("safetensors writer: writing %s: %s", path, strerror(errno));
  }
  return CI_OK;
}

static int write_entry(FILE *f, const st_entry *e, uint8_t *buf, size_t buf_size,
                       const char *path) {
  const uint8_t *src = e->data;
  size_t chunk = buf_size;
  if (e->fill && e->row_bytes > 0 && e->row_bytes <= buf_size) {
    chunk = (size_t)(buf_size / e->row_bytes * e->row_bytes);
  }
  for (uint64_t off = 0; off < e->nbytes;) {
    const size_t len = (size_t)(e->nbytes - off < chunk ? e->nbytes - off : chunk);
    if (e->fill) {
      if (e->fill(e->user, buf, (size_t)off, len) != 0) {
        return ci_fail_context("safetensors writer: tensor %s", e->name);
      }
      if (write_all(f, buf, len, path) != CI_OK) return CI_ERR;
    } else {
      if (write_all(f, src + off, len, path) != CI_OK) return CI_ERR;
    }
    off += len;
  }
  return CI_OK;
}

int ci_st_writer_write(ci_st_writer *w, const char *path) {
  size_t hlen = 0;
  char *header = render_header(w, &hlen);
  if (!header) return CI_ERR;
  const size_t plen = strlen(path);
  char *tmp = malloc(plen + 5);
  uint8_t *buf = malloc(w->buffer_size);
  FILE *f = NULL;
  int rc = CI_ERR;
  if (!tmp || !buf) {
    ci_fail("safetensors writer: out of memory");
    goto done;
  }
  memcpy(tmp, path, plen);
  memcpy(tmp + plen, ".tmp", 5);
  f = fopen(tmp, "wb");
  if (!f) {
    ci_fail("safetensors writer: cannot create %s: %s", tmp, strerror(errno));
    goto done;
  }
  uint8_t len_le[8];
  for (int i = 0; i < 8; i++) len_le[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
  if (write_all(f, len_le, 8, tmp) != CI_OK || write_all(f, header, hlen, tmp) != CI_OK) {
    goto done;
  }
  for (size_t i = 0; i < w->count; i++) {
    if (write_entry(f, &w->entries[i], buf, w->buffer_size, tmp) != CI_OK) goto done;
  }
  FILE *closing = f;
  f = NULL;
  if (fclose(closing) != 0) {
    ci_fail("safetensors writer: closing %s: %s", tmp, strerror(errno));
    goto done;
  }
  if (rename(tmp, path) != 0) {
    ci_fail("safetensors writer: renaming %s to %s: %s", tmp, path, strerror(errno));
    goto done;
  }
  rc = CI_OK;
done:
  if (f) fclose(f);
  if (rc != CI_OK && tmp) remove(tmp);
  free(tmp);
  free(buf);
  free(header);
  return rc;
}
