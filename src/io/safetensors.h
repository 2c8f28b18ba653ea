/* safetensors: parse and validate the header of a safetensors file image, and open the weights
 * of a model folder (one model.safetensors, or the shards of model.safetensors.index.json) as
 * read-only memory maps with O(log n) lookup by tensor name.
 *
 * File format: [u64 little-endian header_len][header_len bytes of JSON][data section]. The JSON
 * is an object mapping tensor names to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
 * relative to the data section) plus an optional "__metadata__" object, which is skipped. */
#ifndef CI_IO_SAFETENSORS_H
#define CI_IO_SAFETENSORS_H

#include "tensor/dtype.h"
#include "tensor/tensor.h"

#include <stddef.h>
#include <stdint.h>

enum {
  CI_ST_MAX_DIMS = 8,                        /* most dimensions a tensor entry may have */
  CI_ST_MAX_HEADER_BYTES = 100 * 1000 * 1000 /* larger JSON headers are rejected as absurd */
};

/* One tensor entry of a safetensors archive. */
typedef struct {
  const char *name;              /* NUL-terminated; owned by the parse result or the ci_weights */
  ci_dtype dtype;                /* one of the safetensors dtypes (never CI_Q8/CI_Q4) */
  int ndim;                      /* 0..CI_ST_MAX_DIMS; 0 is a scalar */
  int64_t shape[CI_ST_MAX_DIMS]; /* [ndim] sizes, each >= 0; unused entries are 0 */
  const void *data; /* first byte inside the file image / mmap; NOT aligned in general */
  size_t nbytes;    /* prod(shape) * element size */
  size_t offset;    /* byte offset of data from the start of the file */
  int shard;        /* index of the file it lives in (0 for a single file) */
  int used;         /* set by ci_weights_take(); lets a loader find unconsumed tensors */
} ci_st_tensor;

/* ==== Parsing one file image ==== */

/* Parses and validates one safetensors file image buf[0..len) (the whole file: length prefix,
 * JSON header and data section). file_label names the file in error messages and shard is stored
 * in every entry. Pure: reads nothing but buf, safe on arbitrary bytes (a fuzz target).
 *
 * On success returns CI_OK and sets *out_tensors to ONE malloc'd block holding *out_count entries
 * sorted by name (strcmp order) together with their names; the caller releases everything with a
 * single free(*out_tensors). Entry data pointers point into buf, so buf must outlive their use.
 * A header without tensors gives *out_count = 0 and a non-NULL block.
 *
 * On failure returns CI_ERR, sets *out_tensors = NULL and *out_count = 0, and leaves a one-line
 * message naming the file (and the tensor, where one is at fault) in ci_last_error(). Rejected:
 * a file under 8 bytes, a header longer than the file or than CI_ST_MAX_HEADER_BYTES, invalid
 * JSON, a non-object header or entry, duplicate or empty names, a missing or ill-typed
 * dtype/shape/data_offsets, an unknown dtype, more than CI_ST_MAX_DIMS dims, negative dims, a
 * size overflow, offsets that are not [b, e] with b <= e or end past the data section, a byte
 * range that disagrees with the shape, and overlapping byte ranges. Gaps are allowed. */
int ci_st_parse(const uint8_t *buf, size_t len, const char *file_label, int shard,
                ci_st_tensor **out_tensors, int *out_count);

/* Describes entry st as a ci_tensor view (dtype, shape, data; no affine scales). Returns CI_OK,
 * or CI_ERR if st has more than CI_MAX_DIMS dimensions (out is then left zeroed). */
int ci_st_tensor_view(const ci_st_tensor *st, ci_tensor *out);

/* Number of elements of an entry: the product of its shape (1 for a scalar). */
int64_t ci_st_tensor_numel(const ci_st_tensor *st);

/* ==== The weights of a model folder ==== */

/* All tensors of a model folder, memory-mapped read-only. */
typedef struct ci_weights ci_weights;

/* Opens the weights of model_dir: DIR/model.safetensors if present, otherwise every file listed
 * in DIR/model.safetensors.index.json ("weight_map": tensor name -> file name relative to DIR).
 * With an index, every listed file must exist, every listed tensor must be in the file the
 * index names, every tensor of a listed file must be listed, and no tensor may live in two
 * shards. Files are mapped with PROT_READ/MAP_PRIVATE and stay mapped until ci_weights_free().
 *
 * Returns a new handle (free with ci_weights_free()), or NULL with ci_last_error() set; the
 * message names the file and tensor at fault, e.g.
 * "no model.safetensors or model.safetensors.index.json in DIR". Nothing is left open on
 * failure. */
ci_weights *ci_weights_open(const char *model_dir);

/* Where the weights live. */
typedef enum {
  CI_WEIGHTS_MMAP,      /* the files mapped read-only (page cache, 4 KiB pages) */
  CI_WEIGHTS_HUGE_PAGES /* read into anonymous memory advised for 2 MiB transparent huge pages:
                           fewer TLB misses when the CPU streams the weights every token */
} ci_weights_memory;

/* As ci_weights_open, with the weights in `memory`. */
ci_weights *ci_weights_open_in(const char *model_dir, ci_weights_memory memory);

/* Releases the maps and all memory of w; entries and names obtained from it become invalid.
 * NULL is a no-op. */
void ci_weights_free(ci_weights *w);

/* Returns the entry named name, or NULL if there is none. O(log n). Does not touch used. */
const ci_st_tensor *ci_weights_find(const ci_weights *w, const char *name);

/* Like ci_weights_find(), and also marks the entry used (so a loader can list the tensors it
 * never consumed). Returns the entry or NULL. Not thread-safe: it writes to the entry. */
ci_st_tensor *ci_weights_take(ci_weights *w, const char *name);

/* Number of tensors across all shards. */
int ci_weights_count(const ci_weights *w);

/* The i-th tensor in name order (0 <= i < ci_weights_count()), or NULL when i is out of range. */
const ci_st_tensor *ci_weights_at(const ci_weights *w, int i);

/* Clears the used flag of every entry. */
void ci_weights_reset_used(ci_weights *w);

/* Number of files mapped (1 without an index). */
int ci_weights_shard_count(const ci_weights *w);

/* Path of shard i as opened (DIR/FILE), or NULL when i is out of range; for error messages. */
const char *ci_weights_shard_path(const ci_weights *w, int i);

/* Sum of nbytes over all tensors (the weight bytes a backend would hold). */
size_t ci_weights_total_bytes(const ci_weights *w);

#endif
