/* safetensors writer: declare named tensors (from memory or produced on demand by a fill
 * callback), then stream them to one file with a single pass and a bounded buffer. */
#ifndef CI_IO_SAFETENSORS_WRITE_H
#define CI_IO_SAFETENSORS_WRITE_H

#include "io/safetensors.h"
#include "tensor/dtype.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ci_st_writer ci_st_writer;

/* Produces bytes [offset, offset + len) of one tensor's data into buf. The writer calls it in
 * order, with offsets increasing from 0 until the whole tensor is covered, and (when at least one
 * row fits in its buffer) with offset and len multiples of the row size, a row being the bytes
 * of all dimensions but the first. Returns 0, or nonzero to abort the write (set ci_fail). */
typedef int (*ci_st_fill_fn)(void *user, void *buf, size_t offset, size_t len);

/* Creates an empty writer. Returns NULL (with ci_last_error) when out of memory. */
ci_st_writer *ci_st_writer_new(void);

/* Frees the writer (not the caller's data or callback contexts). NULL is a no-op. */
void ci_st_writer_free(ci_st_writer *w);

/* Declares a tensor whose bytes are read from data (prod(shape) elements of dtype, little-endian)
 * when ci_st_writer_write reaches it: data must stay valid until then, and may be filled after
 * this call. dtype must be a safetensors dtype (not CI_Q8/CI_Q4: store their codes as CI_U32).
 * 0 <= ndim <= CI_ST_MAX_DIMS; the name must be unique, non-empty, valid UTF-8, not
 * "__metadata__".
 * Tensors are laid out in the file in the order they are added. Returns CI_OK or CI_ERR. */
int ci_st_writer_add(ci_st_writer *w, const char *name, ci_dtype dtype, int ndim,
                     const int64_t *shape, const void *data);

/* Like ci_st_writer_add, but the bytes come from fill(user, ...) at write time (see
 * ci_st_fill_fn), so multi-GB tensors never need to exist in memory at once. */
int ci_st_writer_add_fill(ci_st_writer *w, const char *name, ci_dtype dtype, int ndim,
                          const int64_t *shape, ci_st_fill_fn fill, void *user);

/* Adds a string entry to __metadata__ (which always holds "format": "pt"; setting "format"
 * replaces it). Returns CI_OK or CI_ERR. */
int ci_st_writer_set_metadata(ci_st_writer *w, const char *key, const char *value);

/* Number of tensors declared so far, and the total size of their data in bytes. */
size_t ci_st_writer_count(const ci_st_writer *w);
uint64_t ci_st_writer_data_bytes(const ci_st_writer *w);

/* Sets the size of the staging buffer used for fill callbacks and for copying (default 8 MiB,
 * at least 4 KiB). Call before ci_st_writer_write. */
void ci_st_writer_set_buffer_size(ci_st_writer *w, size_t bytes);

/* Writes the file: u64 LE header length N, N bytes of JSON header
 * {"__metadata__": {...}, "name": {"dtype", "shape", "data_offsets": [b, e]}, ...} padded with
 * spaces to a multiple of 8, then every tensor's bytes in insertion order. The file is written
 * to "<path>.tmp" and renamed to path on success (removed on failure), so a reader never sees a
 * partial file. May be called more than once. Returns CI_OK or CI_ERR. */
int ci_st_writer_write(ci_st_writer *w, const char *path);

#endif
