/* The peak KV-arena bytes one request holds (docs/kv-cache.md §10): its blocks at their peak under
 * its codec plan, plus a hybrid model's recurrent state and speculative checkpoints in whole
 * slabs. Engine admission reserves this figure and `cinfer fit` reports it, from one formula. */
#ifndef CI_KV_RESERVATION_H
#define CI_KV_RESERVATION_H

#include "kv/cache.h"

#include <stdint.h>

/* What a request's reservation depends on. */
typedef struct {
  ci_kv_format base;           /* the format sequences start in (bf16 or f32) */
  const ci_kv_format *targets; /* conversion plan: NULL none; else targets[layer], or targets[0]
                                  for every layer when uniform */
  int uniform;
  int protect;          /* uniform: the first and last `protect` layers keep the base format */
  int64_t start;        /* tokens stored before the layers convert */
  int64_t n_prompt;     /* prompt tokens */
  int64_t n;            /* tokens in all (prompt and answer) */
  int64_t chunk_cap;    /* the most rows one prefill chunk appends */
  int rollback_reserve; /* positions a sliding layer keeps for rollback (the engine's draft_max
                           when it speculates, else 0) */
  int spec_max;         /* drafts per speculative round of this request; 0: it never speculates */
} ci_kv_request_shape;

/* Blocks `group` holds at its peak for a sequence of n tokens: every block of a full group; a
 * sliding group at most the window plus one prefill chunk (and the rollback reserve), plus one
 * block of alignment. */
int64_t ci_kv_peak_blocks(const ci_kv_cache *cache, const ci_kv_group *group, int64_t n,
                          int64_t chunk_cap, int rollback_reserve);

/* The peak bytes of the request: layers convert to their targets once `start` tokens are stored
 * (or after the first chunk when start is 0), so the peak is the larger of the base-format part
 * before conversion and the target part after it, plus the transient copy of the one group being
 * converted, plus ci_kv_cache_state_cost (the state and, when spec_max > 0, its checkpoints for
 * rounds of spec_max + 1 rows). Reads immutable cache geometry only. */
int64_t ci_kv_request_reservation(const ci_kv_cache *cache, const ci_kv_request_shape *r);

/* Gives a cache on a backend with memory of its own (a GPU), which cannot grow them later, block
 * tables for max_seqs sequences of up to `positions` positions and an arena holding them all at
 * that length in `base` format with spec_max drafts per round (ci_kv_request_reservation each:
 * conversions only shrink blocks), plus a partly filled slab per layer group for each of
 * `formats` formats a sequence's blocks may be in. A cache on a host-visible backend grows both
 * on demand: it is left as it is. Returns CI_OK or CI_ERR. (The engine sizes its arena from its
 * own budget instead.) */
int ci_kv_cache_reserve_device(ci_kv_cache *cache, int max_seqs, int64_t positions,
                               ci_kv_format base, int spec_max, int formats);

#endif
