/* A request's peak KV-arena bytes (see reservation.h): the one formula of admission and fit,
 * and the up-front KV memory of a cache on a device backend built from it. */
#include "kv/reservation.h"

#include "base/error.h"

int64_t ci_kv_peak_blocks(const ci_kv_cache *cache, const ci_kv_group *group, int64_t n,
                          int64_t chunk_cap, int rollback_reserve) {
  const int64_t T = cache->block_tokens;
  int64_t blocks = (n + T - 1) / T;
  if (group->window > 0) {
    /* a speculative round appends up to reserve + 1 rows and keeps `reserve` positions more
     * (the rollback reserve, docs/kv-cache.md §4) */
    const int64_t reserve = rollback_reserve;
    const int64_t chunk = chunk_cap > reserve + 1 ? chunk_cap : reserve + 1;
    const int64_t held = (group->window - 1 + chunk + reserve + T - 1) / T + 1;
    if (blocks > held) blocks = held;
  }
  return blocks;
}

int64_t ci_kv_request_reservation(const ci_kv_cache *cache, const ci_kv_request_shape *r) {
  const ci_kv_format *base = &r->base;
  /* the conversion happens at the start, or after the first chunk when the start is 0 */
  const int64_t first_chunk = r->n_prompt < r->chunk_cap ? r->n_prompt : r->chunk_cap;
  const int64_t at = r->start > first_chunk ? r->start : first_chunk;
  const int converts = r->targets && r->start <= r->n;
  const int64_t held_at_conversion = at < r->n ? at : r->n;
  int64_t before = 0, after = 0, transient = 0;
  for (int g = 0; g < cache->n_groups; g++) {
    const ci_kv_group *group = &cache->groups[g];
    const int layer = group->layers[0];
    const int kept = r->uniform && ci_kv_layer_protected(layer, cache->n_layers, r->protect);
    const ci_kv_format *target = !r->targets || kept ? base : &r->targets[r->uniform ? 0 : layer];
    const int group_converts = converts && !ci_kv_format_equal(target, base);
    const int64_t base_block = ci_kv_cache_block_cost(cache, g, base);
    const int64_t peak_n = ci_kv_peak_blocks(cache, group, r->n, r->chunk_cap, r->rollback_reserve);
    const int64_t peak_held =
        ci_kv_peak_blocks(cache, group, held_at_conversion, r->chunk_cap, r->rollback_reserve);
    if (!group_converts) {
      before += base_block * (converts ? peak_held : peak_n);
      after += base_block * peak_n;
      continue;
    }
    const int64_t target_block = ci_kv_cache_block_cost(cache, g, target);
    before += base_block * peak_held;
    after += target_block * peak_n;
    const int64_t copy = target_block * peak_held;
    if (copy > transient) transient = copy;
  }
  /* a hybrid model's recurrent state is held for the whole request, and so are its checkpoints
   * when it speculates (rounds of up to spec_max + 1 rows), in whole slabs of the arena */
  return (before > after ? before : after) + transient +
         ci_kv_cache_state_cost(cache, r->spec_max > 0 ? r->spec_max + 1 : 0);
}

int ci_kv_cache_reserve_device(ci_kv_cache *cache, int max_seqs, int64_t positions,
                               ci_kv_format base, int spec_max, int formats) {
  if (cache->be->host_visible) return CI_OK;
  if (positions < 1) positions = 1;
  const ci_kv_request_shape shape = {.base = base,
                                     .n_prompt = positions,
                                     .n = positions,
                                     .chunk_cap = positions,
                                     .rollback_reserve = spec_max,
                                     .spec_max = spec_max};
  const int64_t slack = (int64_t)cache->n_groups * formats * ci_kv_cache_slab_bytes(cache);
  if (ci_kv_cache_set_limits(cache, max_seqs, positions)) return CI_ERR;
  return ci_kv_cache_set_arena(cache, max_seqs * ci_kv_request_reservation(cache, &shape) + slack);
}
