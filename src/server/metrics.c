/* /metrics (Prometheus text 0.0.4) and /stats (JSON) (docs/server.md "Metrics and stats"): request
 * counters per route and status, token counters, queue and batch gauges, KV blocks and bytes per
 * codec and in all, prefix-cache figures, weights bytes, latency histograms. */
#include "server/server.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const hist_le[CI_HIST_BUCKETS] = {
    "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "30"};

static void histogram(ci_strbuf *b, const char *name, const ci_histogram *h) {
  ci_strbuf_appendf(b, "# TYPE %s histogram\n", name);
  int64_t cum = 0;
  for (int i = 0; i < CI_HIST_BUCKETS; i++) {
    cum += h->counts[i];
    ci_strbuf_appendf(b, "%s_bucket{le=\"%s\"} %lld\n", name, hist_le[i], (long long)cum);
  }
  cum += h->counts[CI_HIST_BUCKETS];
  ci_strbuf_appendf(b, "%s_bucket{le=\"+Inf\"} %lld\n%s_sum %.6f\n%s_count %lld\n", name,
                    (long long)cum, name, h->sum, name, (long long)h->n);
}

char *ci_server_metrics_text(ci_server *s) {
  cinfer_engine_stats st;
  cinfer_engine_get_stats(s->o.engine, &st);
  ci_strbuf b = {0};
  ci_strbuf_append(&b, "# TYPE cinfer_requests_total counter\n", 37);
  pthread_mutex_lock(&s->metrics_mu);
  for (int i = 0; i < s->n_routes; i++)
    ci_strbuf_appendf(&b, "cinfer_requests_total{route=\"%s\",status=\"%d\"} %lld\n",
                      s->routes[i].route, s->routes[i].status, (long long)s->routes[i].count);
  const struct {
    const char *name, *type;
    long long value;
  } simple[] = {
      {"cinfer_prompt_tokens_total", "counter", st.prompt_tokens},
      {"cinfer_prompt_tokens_cached_total", "counter", st.cached_tokens},
      {"cinfer_prompt_tokens_prefilled_total", "counter", st.prefill_tokens},
      {"cinfer_generation_tokens_total", "counter", st.generated_tokens},
      {"cinfer_prefix_cache_hits_total", "counter", st.prefix_hits},
      {"cinfer_prefix_cache_misses_total", "counter", st.prefix_misses},
      {"cinfer_spec_draft_tokens_total", "counter", st.spec_draft_tokens},
      {"cinfer_spec_accepted_tokens_total", "counter", st.spec_accepted_tokens},
      {"cinfer_spec_steps_total", "counter", st.spec_steps},
      {"cinfer_spec_declined_steps_total", "counter", st.spec_declined_steps},
      {"cinfer_spec_draft_steps_total", "counter", st.spec_draft_steps},
      {"cinfer_requests_cancelled_total", "counter", st.requests_cancelled},
      {"cinfer_requests_failed_total", "counter", st.requests_failed},
      {"cinfer_engine_steps_total", "counter", st.steps},
      {"cinfer_requests_running", "gauge", st.running},
      {"cinfer_requests_waiting", "gauge", st.waiting},
      {"cinfer_kv_bytes_budget", "gauge", st.kv_budget_bytes},
      {"cinfer_kv_bytes_reserved", "gauge", st.reserved_bytes},
      {"cinfer_prefix_cache_bytes", "gauge", st.prefix_cache_bytes},
      {"cinfer_prompt_cache_blocks_written_total", "counter", st.prompt_cache_blocks_written},
      {"cinfer_prompt_cache_blocks_dropped_total", "counter", st.prompt_cache_blocks_dropped},
      {"cinfer_prompt_cache_blocks_loaded_total", "counter", st.prompt_cache_blocks_loaded},
      {"cinfer_prompt_cache_files_rejected_total", "counter", st.prompt_cache_files_rejected},
      {"cinfer_weights_bytes", "gauge", s->weights_bytes},
  };
  for (size_t i = 0; i < sizeof simple / sizeof simple[0]; i++)
    ci_strbuf_appendf(&b, "# TYPE %s %s\n%s %lld\n", simple[i].name, simple[i].type, simple[i].name,
                      simple[i].value);
  /* KV storage per codec (format name as in --kv-codec settings, e.g. affine:4:64), and "all" */
  const struct {
    const char *name;
    size_t offset;
    long long all;
  } per_codec[] = {
      {"cinfer_kv_blocks_used", offsetof(cinfer_kv_usage, blocks_used), st.blocks_used},
      {"cinfer_kv_blocks_free", offsetof(cinfer_kv_usage, blocks_free), -1},
      {"cinfer_kv_bytes_used", offsetof(cinfer_kv_usage, bytes_used), st.bytes_used},
  };
  for (size_t m = 0; m < sizeof per_codec / sizeof per_codec[0]; m++) {
    ci_strbuf_appendf(&b, "# TYPE %s gauge\n", per_codec[m].name);
    for (int i = 0; i < st.n_kv_formats; i++) {
      const char *codec = st.kv_formats[i].codec;
      const int64_t value =
          *(const int64_t *)((const char *)&st.kv_formats[i] + per_codec[m].offset);
      ci_strbuf_appendf(&b, "%s{codec=\"%s\"} %lld\n", per_codec[m].name, codec, (long long)value);
    }
    if (per_codec[m].all >= 0)
      ci_strbuf_appendf(&b, "%s{codec=\"all\"} %lld\n", per_codec[m].name, per_codec[m].all);
  }
  ci_strbuf_appendf(&b, "# TYPE cinfer_kv_conversions_total counter\n");
  for (int i = 0; i < st.n_kv_conversions; i++) {
    ci_strbuf_appendf(&b, "cinfer_kv_conversions_total{codec=\"%s\"} %lld\n",
                      st.kv_conversion_codecs[i], (long long)st.kv_conversions[i]);
  }
  histogram(&b, "cinfer_time_to_first_token_seconds", &s->ttft);
  histogram(&b, "cinfer_inter_token_latency_seconds", &s->itl);
  histogram(&b, "cinfer_queue_time_seconds", &s->queue);
  histogram(&b, "cinfer_request_duration_seconds", &s->duration);
  pthread_mutex_unlock(&s->metrics_mu);
  return b.data;
}

json_t *ci_server_stats_json(ci_server *s) {
  cinfer_engine_stats st;
  cinfer_engine_get_stats(s->o.engine, &st);
  json_t *stats = json_pack(
      "{s:{s:s, s:s, s:s, s:i, s:I, s:I}, s:{s:s, s:i, s:I, s:i, s:i}, s:{s:I, s:I, s:I, s:I}, "
      "s:{s:i, s:i, s:i, s:I, s:I}, s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I}, "
      "s:{s:I, s:I, s:I, s:I, s:I, s:I}}",
      "server", "version", cinfer_version(), "model", s->o.model_id, "device",
      cinfer_model_device(s->o.model), "threads",
      s->o.threads > 0 ? s->o.threads : cinfer_model_threads(s->o.model), "started_at",
      (json_int_t)s->started_at, "uptime_s", (json_int_t)(time(NULL) - (time_t)s->started_at),
      "model", "model_type", cinfer_model_architecture(s->o.model), "layers",
      cinfer_model_n_layers(s->o.model), "weights_bytes", (json_int_t)s->weights_bytes, "ctx_size",
      cinfer_engine_context_size(s->o.engine), "max_position_embeddings",
      cinfer_model_context_length(s->o.model), "kv", "bytes_used", (json_int_t)st.bytes_used,
      "bytes_budget", (json_int_t)st.kv_budget_bytes, "blocks_used", (json_int_t)st.blocks_used,
      "bytes_reserved", (json_int_t)st.reserved_bytes, "batch", "running", st.running, "waiting",
      st.waiting, "max", cinfer_engine_max_batch(s->o.engine), "steps", (json_int_t)st.steps,
      "step_rows", (json_int_t)st.step_rows, "totals", "requests_finished",
      (json_int_t)st.requests_finished, "requests_cancelled", (json_int_t)st.requests_cancelled,
      "requests_failed", (json_int_t)st.requests_failed, "prompt_tokens",
      (json_int_t)st.prompt_tokens, "generation_tokens", (json_int_t)st.generated_tokens,
      "prefix_cache_hits", (json_int_t)st.prefix_hits, "prefix_cache_misses",
      (json_int_t)st.prefix_misses, "prefix_cache", "entries", (json_int_t)st.prefix_cache_entries,
      "blocks", (json_int_t)st.prefix_cache_blocks, "bytes", (json_int_t)st.prefix_cache_bytes,
      "max_bytes", (json_int_t)st.prefix_cache_max_bytes, "hits", (json_int_t)st.prefix_hits,
      "misses", (json_int_t)st.prefix_misses);
  if (stats) /* ranks the model is split over (--tensor-parallel) */
    json_object_set_new(json_object_get(stats, "server"), "tensor_parallel",
                        json_integer(cinfer_model_tensor_parallel(s->o.model)));
  if (stats && st.prompt_cache_on) /* the prompt cache on disk */
    json_object_set_new(stats, "prompt_cache",
                        json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "blocks_written",
                                  (json_int_t)st.prompt_cache_blocks_written, "bytes_written",
                                  (json_int_t)st.prompt_cache_bytes_written, "blocks_dropped",
                                  (json_int_t)st.prompt_cache_blocks_dropped, "write_errors",
                                  (json_int_t)st.prompt_cache_write_errors, "blocks_loaded",
                                  (json_int_t)st.prompt_cache_blocks_loaded, "bytes_loaded",
                                  (json_int_t)st.prompt_cache_bytes_loaded, "files_rejected",
                                  (json_int_t)st.prompt_cache_files_rejected, "queued_bytes",
                                  (json_int_t)st.prompt_cache_queued_bytes));
  /* speculative decoding: drafted and accepted tokens, acceptance rate (0 before any draft) */
  const double acceptance =
      st.spec_draft_tokens > 0 ? (double)st.spec_accepted_tokens / (double)st.spec_draft_tokens : 0;
  /* prompt tokens actually forwarded (a prompt of n choices once; cached ones not at all) */
  if (stats)
    json_object_set_new(json_object_get(stats, "totals"), "prompt_tokens_prefilled",
                        json_integer((json_int_t)st.prefill_tokens));
  if (stats)
    json_object_set_new(stats, "speculative",
                        json_pack("{s:I, s:I, s:f, s:I, s:I, s:I}", "draft_tokens",
                                  (json_int_t)st.spec_draft_tokens, "accepted_tokens",
                                  (json_int_t)st.spec_accepted_tokens, "acceptance_rate",
                                  acceptance, "steps", (json_int_t)st.spec_steps, "declined_steps",
                                  (json_int_t)st.spec_declined_steps, "draft_steps",
                                  (json_int_t)st.spec_draft_steps));
  return stats;
}
