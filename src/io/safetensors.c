/* safetensors: header validation of one file image, and the mmap'd, name-sorted tensor table of
 * a model folder (single file or index + shards). See safetensors.h for the format. */
#include "io/safetensors.h"

#include "base/error.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Longest tensor name quoted in an error message (messages stay one readable line). */
enum { NAME_IN_MESSAGE = 200 };

/* Records "label: <message>" as the last error. Returns CI_ERR. */
static int st_fail(const char *label, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int st_fail(const char *label, const char *fmt, ...) {
  char message[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(message, sizeof message, fmt, ap);
  va_end(ap);
  return ci_fail("%s: %s", label, message);
}

/* ==== Parsing one file image ==== */

static uint64_t read_u64_le(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* Writes "[2, 3]" (or "[]") for an entry's shape into out. */
static void format_shape(const ci_st_tensor *t, char *out, size_t cap) {
  size_t used = (size_t)snprintf(out, cap, "[");
  for (int i = 0; i < t->ndim && used < cap; i++) {
    used +=
        (size_t)snprintf(out + used, cap - used, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
  }
  if (used < cap) snprintf(out + used, cap - used, "]");
}

/* Reads a JSON integer that must be >= 0. Returns 0 and sets *out, or -1. */
static int json_nonnegative(const json_t *v, uint64_t *out) {
  if (!json_is_integer(v)) return -1;
  json_int_t x = json_integer_value(v);
  if (x < 0) return -1;
  *out = (uint64_t)x;
  return 0;
}

/* Validates one header entry {dtype, shape, data_offsets} and fills *t (name excepted).
 * data_len is the size of the data section and data_start its offset in the file. */
static int parse_entry(const char *label, const char *name, const json_t *entry,
                       const uint8_t *data, uint64_t data_len, size_t data_start, ci_st_tensor *t) {
  const int n = NAME_IN_MESSAGE;
  if (!json_is_object(entry)) {
    return st_fail(label, "tensor '%.*s': entry is not an object", n, name);
  }

  const json_t *dtype = json_object_get(entry, "dtype");
  if (!json_is_string(dtype)) {
    return st_fail(label, "tensor '%.*s': missing or non-string \"dtype\"", n, name);
  }
  if (ci_dtype_parse(json_string_value(dtype), &t->dtype) != 0) {
    return st_fail(label, "tensor '%.*s': unknown dtype '%.40s'", n, name,
                   json_string_value(dtype));
  }

  const json_t *shape = json_object_get(entry, "shape");
  if (!json_is_array(shape)) {
    return st_fail(label, "tensor '%.*s': missing or non-array \"shape\"", n, name);
  }
  if (json_array_size(shape) > CI_ST_MAX_DIMS) {
    return st_fail(label, "tensor '%.*s': shape has %zu dimensions (at most %d supported)", n, name,
                   json_array_size(shape), CI_ST_MAX_DIMS);
  }
  t->ndim = (int)json_array_size(shape);
  uint64_t numel = 1;
  int overflow = 0;
  for (int i = 0; i < t->ndim; i++) {
    uint64_t dim;
    if (json_nonnegative(json_array_get(shape, (size_t)i), &dim) != 0) {
      return st_fail(label, "tensor '%.*s': shape must be an array of non-negative integers", n,
                     name);
    }
    t->shape[i] = (int64_t)dim;
    overflow |= __builtin_mul_overflow(numel, dim, &numel);
  }
  uint64_t element_bytes = (uint64_t)ci_dtype_get(t->dtype)->bits / 8;
  uint64_t nbytes = 0;
  overflow |= __builtin_mul_overflow(numel, element_bytes, &nbytes);
  if (overflow || numel > INT64_MAX || nbytes > SIZE_MAX) {
    return st_fail(label, "tensor '%.*s': shape element count overflows", n, name);
  }

  const json_t *offsets = json_object_get(entry, "data_offsets");
  uint64_t begin, end;
  if (!json_is_array(offsets) || json_array_size(offsets) != 2 ||
      json_nonnegative(json_array_get(offsets, 0), &begin) != 0 ||
      json_nonnegative(json_array_get(offsets, 1), &end) != 0 || begin > end) {
    return st_fail(label,
                   "tensor '%.*s': \"data_offsets\" must be [begin, end] with "
                   "0 <= begin <= end",
                   n, name);
  }
  if (end > data_len) {
    return st_fail(label,
                   "tensor '%.*s': data_offsets end %llu is past the end of the data "
                   "section (%llu bytes; file truncated?)",
                   n, name, (unsigned long long)end, (unsigned long long)data_len);
  }
  if (end - begin != nbytes) {
    char dims[160];
    format_shape(t, dims, sizeof dims);
    return st_fail(label,
                   "tensor '%.*s': shape disagrees with byte size: %s of %s is %llu "
                   "bytes, data_offsets span %llu",
                   n, name, dims, ci_dtype_get(t->dtype)->name, (unsigned long long)nbytes,
                   (unsigned long long)(end - begin));
  }
  t->data = data + begin;
  t->nbytes = (size_t)nbytes;
  t->offset = data_start + (size_t)begin;
  return CI_OK;
}

static int compare_by_offset(const void *a, const void *b) {
  const ci_st_tensor *x = a, *y = b;
  if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
  if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
  return strcmp(x->name, y->name);
}

static int compare_by_name(const void *a, const void *b) {
  return strcmp(((const ci_st_tensor *)a)->name, ((const ci_st_tensor *)b)->name);
}

/* Fails if two non-empty byte ranges intersect. Sorts t by offset. */
static int check_overlaps(const char *label, ci_st_tensor *t, int count) {
  qsort(t, (size_t)count, sizeof *t, compare_by_offset);
  const ci_st_tensor *furthest = NULL; /* the range reaching furthest so far */
  for (int i = 0; i < count; i++) {
    if (t[i].nbytes == 0) continue;
    if (furthest && t[i].offset < furthest->offset + furthest->nbytes) {
      return st_fail(label, "tensors '%.*s' and '%.*s' overlap in the data section",
                     NAME_IN_MESSAGE, furthest->name, NAME_IN_MESSAGE, t[i].name);
    }
    if (!furthest || t[i].offset + t[i].nbytes > furthest->offset + furthest->nbytes) {
      furthest = &t[i];
    }
  }
  return CI_OK;
}

/* Parses the JSON header text. Returns the root object, or NULL with the error set. */
static json_t *load_header(const char *label, const uint8_t *text, size_t len) {
  json_error_t error;
  json_t *root = json_loadb((const char *)text, len, JSON_REJECT_DUPLICATES, &error);
  if (!root) {
    if (strstr(error.text, "duplicate")) {
      st_fail(label, "header has a duplicate tensor name (%s)", error.text);
    } else {
      st_fail(label, "header is not valid JSON: %s (line %d, column %d)", error.text, error.line,
              error.column);
    }
    return NULL;
  }
  if (!json_is_object(root)) {
    json_decref(root);
    st_fail(label, "header is not a JSON object");
    return NULL;
  }
  return root;
}

int ci_st_parse(const uint8_t *buf, size_t len, const char *file_label, int shard,
                ci_st_tensor **out_tensors, int *out_count) {
  const char *label = file_label ? file_label : "safetensors";
  *out_tensors = NULL;
  *out_count = 0;
  if (len < 8) {
    return st_fail(label, "truncated: %zu bytes, a safetensors file has at least 8", len);
  }
  uint64_t header_len = read_u64_le(buf);
  if (header_len > CI_ST_MAX_HEADER_BYTES) {
    return st_fail(label, "header length %llu is absurd (limit %d bytes; not a safetensors file?)",
                   (unsigned long long)header_len, CI_ST_MAX_HEADER_BYTES);
  }
  if (header_len > len - 8) {
    return st_fail(label,
                   "truncated: header length %llu exceeds the %zu bytes after the length "
                   "prefix",
                   (unsigned long long)header_len, len - 8);
  }
  json_t *root = load_header(label, buf + 8, (size_t)header_len);
  if (!root) return CI_ERR;

  /* Pass 1: size one block for the entries and their names. */
  size_t count = 0, name_bytes = 0;
  const char *key;
  json_t *value;
  json_object_foreach(root, key, value) {
    if (strcmp(key, "__metadata__") == 0) {
      if (!json_is_object(value)) {
        json_decref(root);
        return st_fail(label, "\"__metadata__\" is not an object");
      }
      continue;
    }
    if (key[0] == '\0') {
      json_decref(root);
      return st_fail(label, "header has a tensor with an empty name");
    }
    count++;
    name_bytes += strlen(key) + 1;
  }
  ci_st_tensor *tensors = malloc(count * sizeof *tensors + name_bytes + 1);
  if (!tensors) {
    json_decref(root);
    return st_fail(label, "out of memory for %zu tensor entries", count);
  }

  /* Pass 2: validate and fill. */
  const size_t data_start = 8 + (size_t)header_len;
  const uint64_t data_len = len - data_start;
  char *names = (char *)(tensors + count);
  size_t i = 0;
  json_object_foreach(root, key, value) {
    if (strcmp(key, "__metadata__") == 0) continue;
    ci_st_tensor *t = &tensors[i++];
    memset(t, 0, sizeof *t);
    size_t key_len = strlen(key);
    memcpy(names, key, key_len + 1);
    t->name = names;
    names += key_len + 1;
    t->shard = shard;
    if (parse_entry(label, key, value, buf + data_start, data_len, data_start, t) != CI_OK) {
      free(tensors);
      json_decref(root);
      return CI_ERR;
    }
  }
  json_decref(root);

  if (check_overlaps(label, tensors, (int)count) != CI_OK) {
    free(tensors);
    return CI_ERR;
  }
  qsort(tensors, count, sizeof *tensors, compare_by_name);
  *out_tensors = tensors;
  *out_count = (int)count;
  return CI_OK;
}

int64_t ci_st_tensor_numel(const ci_st_tensor *st) {
  int64_t n = 1;
  for (int i = 0; i < st->ndim; i++) n *= st->shape[i];
  return n;
}

int ci_st_tensor_view(const ci_st_tensor *st, ci_tensor *out) {
  memset(out, 0, sizeof *out);
  if (st->ndim > CI_MAX_DIMS) {
    return ci_fail("tensor '%.*s' has %d dimensions, at most %d are supported", NAME_IN_MESSAGE,
                   st->name, st->ndim, CI_MAX_DIMS);
  }
  out->dtype = st->dtype;
  out->ndim = st->ndim;
  for (int i = 0; i < st->ndim; i++) out->shape[i] = st->shape[i];
  out->data = st->data;
  return CI_OK;
}

/* ==== The weights of a model folder ==== */

typedef struct {
  char *path; /* DIR/FILE, for messages */
  void *map;  /* NULL for an empty file */
  size_t size;
  void *region; /* what to munmap: the file mapping, or the anonymous copy's whole range */
  size_t region_size;
  ci_st_tensor *entries; /* ci_st_parse block: owns the names */
  int count;
} st_shard;

struct ci_weights {
  ci_weights_memory memory;
  st_shard *shards;
  int shard_count;
  ci_st_tensor *tensors; /* [count] copies of the shards' entries, sorted by name */
  int count;
  size_t total_bytes;
};

/* Returns malloc'd "dir/file", or NULL with the error set. */
static char *join_path(const char *dir, const char *file) {
  size_t dir_len = strlen(dir), file_len = strlen(file);
  char *path = malloc(dir_len + file_len + 2);
  if (!path) {
    ci_fail("out of memory");
    return NULL;
  }
  memcpy(path, dir, dir_len);
  size_t used = dir_len;
  if (dir_len > 0 && dir[dir_len - 1] != '/') path[used++] = '/';
  memcpy(path + used, file, file_len + 1);
  return path;
}

enum { HUGE_PAGE = 2 << 20, CACHE_LINE = 64 };

/* Bytes to shift a file image by so that its data section (after the 8-byte header length and
 * the header) starts on a cache line: tensors sit at offsets of the data section that writers
 * make multiples of 64 for any sizeable tensor, so their rows then start on cache lines too.
 * Without the shift the 64-byte loads of the row kernels each span two cache lines wherever
 * 8 + header length is not a multiple of 64 (on Zen 4 that cost a third of the read rate of a
 * plain stream). 0 when the file is too short to say (the parser rejects it). */
static size_t data_alignment_shift(int fd, size_t size) {
  uint8_t head[8];
  if (size < sizeof head || pread(fd, head, sizeof head, 0) != (ssize_t)sizeof head) return 0;
  return (CACHE_LINE - (size_t)((8 + read_u64_le(head)) % CACHE_LINE)) % CACHE_LINE;
}

/* Reads the whole file into anonymous memory aligned to 2 MiB and advised for transparent huge
 * pages, so the weights are read through few TLB entries (a page-cache mapping uses 4 KiB
 * pages), placed so that the data section starts on a cache line. The reading thread faults the
 * pages in. */
static int read_into_huge_pages(st_shard *shard, int fd) {
  const size_t shift = data_alignment_shift(fd, shard->size);
  const size_t rounded = (shard->size + shift + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
  const size_t total = rounded + HUGE_PAGE;
  uint8_t *region = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (region == MAP_FAILED)
    return ci_fail("%s: cannot allocate %zu bytes for the weights: %s", shard->path, total,
                   strerror(errno));
  uint8_t *aligned = (uint8_t *)(((uintptr_t)region + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
  madvise(aligned, rounded, MADV_HUGEPAGE); /* advice only: 4 KiB pages still work */
  uint8_t *image = aligned + shift;
  for (size_t done = 0; done < shard->size;) {
    const ssize_t got = pread(fd, image + done, shard->size - done, (off_t)done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const int err = got < 0 ? errno : EIO;
      munmap(region, total);
      return ci_fail("%s: cannot read: %s", shard->path, got < 0 ? strerror(err) : "file shrank");
    }
    done += (size_t)got;
  }
  mprotect(aligned, rounded, PROT_READ);
  shard->map = image;
  shard->region = region;
  shard->region_size = total;
  return CI_OK;
}

/* Maps (or reads, per memory) shard->path and parses it as shard number index. */
static int open_shard(st_shard *shard, int index, ci_weights_memory memory) {
  int fd = open(shard->path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ci_fail("%s: cannot open: %s", shard->path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return ci_fail("%s: cannot stat: %s", shard->path, strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return ci_fail("%s: not a regular file", shard->path);
  }
  shard->size = (size_t)st.st_size;
  if (shard->size > 0 && memory == CI_WEIGHTS_HUGE_PAGES) {
    if (read_into_huge_pages(shard, fd)) {
      close(fd);
      return CI_ERR;
    }
  } else if (shard->size > 0) {
    void *map = mmap(NULL, shard->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      int err = errno;
      close(fd);
      return ci_fail("%s: cannot mmap %zu bytes: %s", shard->path, shard->size, strerror(err));
    }
    shard->map = map;
    shard->region = map;
    shard->region_size = shard->size;
  }
  close(fd);
  static const uint8_t empty[1] = {0};
  const uint8_t *bytes = shard->map ? shard->map : empty;
  return ci_st_parse(bytes, shard->size, shard->path, index, &shard->entries, &shard->count);
}

void ci_weights_free(ci_weights *w) {
  if (!w) return;
  for (int i = 0; i < w->shard_count; i++) {
    st_shard *s = &w->shards[i];
    if (s->region) munmap(s->region, s->region_size);
    free(s->entries);
    free(s->path);
  }
  free(w->shards);
  free(w->tensors);
  free(w);
}

/* Allocates shard slots for count files. */
static int add_shards(ci_weights *w, int count) {
  w->shards = calloc((size_t)count, sizeof *w->shards);
  if (!w->shards) return ci_fail("out of memory");
  w->shard_count = count;
  return CI_OK;
}

/* Builds the name-sorted table over all shards; fails if a name appears in two shards. */
static int merge_shards(ci_weights *w) {
  size_t total = 0;
  for (int i = 0; i < w->shard_count; i++) total += (size_t)w->shards[i].count;
  if (total > INT32_MAX) return ci_fail("too many tensors (%zu)", total);
  w->tensors = malloc((total ? total : 1) * sizeof *w->tensors);
  if (!w->tensors) return ci_fail("out of memory for %zu tensors", total);
  size_t used = 0;
  for (int i = 0; i < w->shard_count; i++) {
    size_t count = (size_t)w->shards[i].count;
    memcpy(w->tensors + used, w->shards[i].entries, count * sizeof *w->tensors);
    used += count;
  }
  w->count = (int)total;
  qsort(w->tensors, total, sizeof *w->tensors, compare_by_name);
  for (int i = 0; i < w->count; i++) {
    if (i > 0 && strcmp(w->tensors[i - 1].name, w->tensors[i].name) == 0) {
      int a = w->tensors[i - 1].shard, b = w->tensors[i].shard;
      return ci_fail("tensor '%.*s' is in two shards: %s and %s", NAME_IN_MESSAGE,
                     w->tensors[i].name, w->shards[a < b ? a : b].path,
                     w->shards[a < b ? b : a].path);
    }
    w->total_bytes += w->tensors[i].nbytes;
  }
  return CI_OK;
}

/* 1 if file is a relative path without ".." components (stays inside the model folder). */
static int is_safe_relative_path(const char *file) {
  if (file[0] == '\0' || file[0] == '/') return 0;
  for (const char *p = file; *p;) {
    const char *slash = strchr(p, '/');
    size_t part = slash ? (size_t)(slash - p) : strlen(p);
    if (part == 0 || (part == 2 && p[0] == '.' && p[1] == '.')) return 0;
    p += part + (slash ? 1 : 0);
  }
  return 1;
}

static int compare_strings(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Collects the distinct file names of weight_map, sorted, into *out (borrowed from the JSON). */
static int index_files(const char *index_path, const json_t *weight_map, const char ***out,
                       int *out_count) {
  size_t cap = json_object_size(weight_map);
  const char **files = malloc((cap ? cap : 1) * sizeof *files);
  if (!files) return ci_fail("out of memory");
  size_t count = 0;
  const char *name;
  const json_t *file;
  json_object_foreach((json_t *)weight_map, name, file) {
    if (!json_is_string(file)) {
      free(files);
      return ci_fail("%s: weight_map entry '%.*s' is not a file name string", index_path,
                     NAME_IN_MESSAGE, name);
    }
    files[count++] = json_string_value(file);
  }
  qsort(files, count, sizeof *files, compare_strings);
  size_t distinct = 0;
  for (size_t i = 0; i < count; i++) {
    if (distinct > 0 && strcmp(files[distinct - 1], files[i]) == 0) continue;
    if (!is_safe_relative_path(files[i])) {
      const char *bad = files[i];
      free(files);
      return ci_fail("%s: weight_map names file '%.*s', which is not a relative path inside the "
                     "model folder",
                     index_path, NAME_IN_MESSAGE, bad);
    }
    files[distinct++] = files[i];
  }
  *out = files;
  *out_count = (int)distinct;
  return CI_OK;
}

/* Checks that the index and the shards agree tensor for tensor. */
static int check_against_index(const ci_weights *w, const char *index_path,
                               const json_t *weight_map, const char **files) {
  const char *name;
  const json_t *file;
  json_object_foreach((json_t *)weight_map, name, file) {
    const ci_st_tensor *t = ci_weights_find(w, name);
    if (!t) {
      return ci_fail("%s: tensor '%.*s' is listed in %s, which does not contain it", index_path,
                     NAME_IN_MESSAGE, name, json_string_value(file));
    }
    if (strcmp(files[t->shard], json_string_value(file)) != 0) {
      return ci_fail("%s: tensor '%.*s' is listed in %s but lives in %s", index_path,
                     NAME_IN_MESSAGE, name, json_string_value(file), files[t->shard]);
    }
  }
  for (int i = 0; i < w->count; i++) {
    if (!json_object_get(weight_map, w->tensors[i].name)) {
      return ci_fail("%s: tensor '%.*s' of %s is not listed in the index", index_path,
                     NAME_IN_MESSAGE, w->tensors[i].name, w->shards[w->tensors[i].shard].path);
    }
  }
  return CI_OK;
}

/* Opens the shards named by DIR/model.safetensors.index.json into w. */
static int open_indexed(ci_weights *w, const char *dir, const char *index_path) {
  json_error_t error;
  json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &error);
  if (!root) {
    if (ci_fail_if_unopenable(index_path)) return CI_ERR;
    return ci_fail("%s: not valid JSON: %s (line %d, column %d)", index_path, error.text,
                   error.line, error.column);
  }
  int rc = CI_ERR;
  const char **files = NULL;
  int file_count = 0;
  const json_t *weight_map = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
  if (!json_is_object(weight_map)) {
    ci_fail("%s: missing \"weight_map\" object", index_path);
    goto done;
  }
  if (json_object_size(weight_map) == 0) {
    ci_fail("%s: \"weight_map\" lists no tensors", index_path);
    goto done;
  }
  if (index_files(index_path, weight_map, &files, &file_count) != CI_OK) goto done;
  if (add_shards(w, file_count) != CI_OK) goto done;
  for (int i = 0; i < file_count; i++) {
    st_shard *s = &w->shards[i];
    s->path = join_path(dir, files[i]);
    if (!s->path) goto done;
    struct stat st;
    if (stat(s->path, &st) != 0) {
      ci_fail("%s: lists %s, which does not exist (%s)", index_path, files[i], strerror(errno));
      goto done;
    }
    if (open_shard(s, i, w->memory) != CI_OK) goto done;
  }
  if (merge_shards(w) != CI_OK) goto done;
  rc = check_against_index(w, index_path, weight_map, files);
done:
  free(files);
  json_decref(root);
  return rc;
}

ci_weights *ci_weights_open(const char *model_dir) {
  return ci_weights_open_in(model_dir, CI_WEIGHTS_MMAP);
}

ci_weights *ci_weights_open_in(const char *model_dir, ci_weights_memory memory) {
  if (!model_dir || !model_dir[0]) {
    ci_fail("ci_weights_open: no model folder given");
    return NULL;
  }
  struct stat st;
  if (stat(model_dir, &st) != 0) {
    ci_fail("model folder %s: %s", model_dir, strerror(errno));
    return NULL;
  }
  if (!S_ISDIR(st.st_mode)) {
    ci_fail("model folder %s: not a directory", model_dir);
    return NULL;
  }
  ci_weights *w = calloc(1, sizeof *w);
  if (w) w->memory = memory;
  char *single = join_path(model_dir, "model.safetensors");
  char *index = join_path(model_dir, "model.safetensors.index.json");
  if (!w || !single || !index) {
    ci_fail("out of memory");
    goto fail;
  }
  if (stat(single, &st) == 0) {
    /* A complete single file wins over an index, as in transformers. */
    if (add_shards(w, 1) != CI_OK) goto fail;
    w->shards[0].path = single;
    single = NULL;
    if (open_shard(&w->shards[0], 0, w->memory) != CI_OK || merge_shards(w) != CI_OK) goto fail;
  } else if (stat(index, &st) == 0) {
    if (open_indexed(w, model_dir, index) != CI_OK) goto fail;
  } else {
    ci_fail("no model.safetensors or model.safetensors.index.json in %s", model_dir);
    goto fail;
  }
  free(single);
  free(index);
  return w;
fail:
  free(single);
  free(index);
  ci_weights_free(w);
  return NULL;
}

const ci_st_tensor *ci_weights_find(const ci_weights *w, const char *name) {
  int lo = 0, hi = w->count - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2;
    int c = strcmp(w->tensors[mid].name, name);
    if (c == 0) return &w->tensors[mid];
    if (c < 0) {
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return NULL;
}

ci_st_tensor *ci_weights_take(ci_weights *w, const char *name) {
  ci_st_tensor *t = (ci_st_tensor *)ci_weights_find(w, name);
  if (t) t->used = 1;
  return t;
}

int ci_weights_count(const ci_weights *w) {
  return w->count;
}

const ci_st_tensor *ci_weights_at(const ci_weights *w, int i) {
  return i >= 0 && i < w->count ? &w->tensors[i] : NULL;
}

void ci_weights_reset_used(ci_weights *w) {
  for (int i = 0; i < w->count; i++) w->tensors[i].used = 0;
}

int ci_weights_shard_count(const ci_weights *w) {
  return w->shard_count;
}

const char *ci_weights_shard_path(const ci_weights *w, int i) {
  return i >= 0 && i < w->shard_count ? w->shards[i].path : NULL;
}

size_t ci_weights_total_bytes(const ci_weights *w) {
  return w->total_bytes;
}
