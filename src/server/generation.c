/* One generation seen from an HTTP thread: request parameters (api.md §2, §3.1), chat rendering
 * and tokenization, submission to the engine, and the text pipeline on its token events
 * (detokenizer with stop strings -> reasoning split -> tool-call parser), kept as deltas for
 * streaming and totals for the final response. */
#include "server/server.h"

#include "base/error.h"
#include "base/timing.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* ==== Small helpers ==== */

void ci_strbuf_append(ci_strbuf *b, const char *s, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 128;
    while (cap < b->len + n + 1) cap *= 2;
    char *bigger = realloc(b->data, cap);
    if (!bigger) return;
    b->data = bigger;
    b->cap = cap;
  }
  if (n) memcpy(b->data + b->len, s, n);
  b->len += n;
  b->data[b->len] = '\0';
}

void ci_strbuf_appendf(ci_strbuf *b, const char *fmt, ...) {
  char small[512];
  va_list ap;
  va_start(ap, fmt);
  const int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n < sizeof small) {
    ci_strbuf_append(b, small, (size_t)n);
    return;
  }
  char *big = malloc((size_t)n + 1);
  if (!big) return;
  va_start(ap, fmt);
  vsnprintf(big, (size_t)n + 1, fmt, ap);
  va_end(ap);
  ci_strbuf_append(b, big, (size_t)n);
  free(big);
}

void ci_strbuf_free(ci_strbuf *b) {
  free(b->data);
  memset(b, 0, sizeof *b);
}

void ci_server_new_id(const char *prefix, char *buf, size_t size) {
  unsigned char bytes[12] = {0};
  if (getrandom(bytes, sizeof bytes, 0) != (ssize_t)sizeof bytes) memset(bytes, 0x5a, sizeof bytes);
  int n = snprintf(buf, size, "%s", prefix);
  for (int i = 0; i < 12 && n + 2 < (int)size; i++)
    n += snprintf(buf + n, size - (size_t)n, "%02x", bytes[i]);
}

static char *dup_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *dup_printf(const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return strdup(buf);
}

void ci_srv_job_free(ci_srv_job *j) {
  free(j->prompt);
  free(j->bias);
  for (int i = 0; i < j->n_stop; i++) free(j->stop[i]);
  free(j->stop);
  json_decref(j->tools);
  memset(j, 0, sizeof *j);
}

/* ==== Request parameters ==== */

/* A number field in [lo, hi] (absent: *has = 0). Returns 0 or sets *err. */
static int get_number(const json_t *body, const char *key, double lo, double hi, int *has,
                      double *out, char **err) {
  const json_t *v = json_object_get(body, key);
  *has = 0;
  if (!v || json_is_null(v)) return 0;
  if (!json_is_number(v)) return *err = dup_printf("%s must be a number", key), -1;
  const double x = json_number_value(v);
  if (!(x >= lo && x <= hi)) return *err = dup_printf("%s must be in [%g, %g]", key, lo, hi), -1;
  *has = 1;
  *out = x;
  return 0;
}

static int get_int(const json_t *body, const char *key, long long lo, long long hi, int *has,
                   long long *out, char **err) {
  const json_t *v = json_object_get(body, key);
  *has = 0;
  if (!v || json_is_null(v)) return 0;
  if (!json_is_integer(v))
    return *err = dup_printf("%s must be an integer between %lld and %lld", key, lo, hi), -1;
  const long long x = json_integer_value(v);
  if (x < lo || x > hi)
    return *err = dup_printf("%s must be an integer between %lld and %lld", key, lo, hi), -1;
  *has = 1;
  *out = x;
  return 0;
}

int ci_srv_parse_sampling(ci_server *s, const json_t *body, int anthropic, ci_srv_job *job,
                          int default_max_tokens, char **err) {
  ci_sampling_overrides req = {0};
  double x;
  long long k;
  int has;
  if (get_number(body, "temperature", 0, 5, &has, &x, err)) return -1;
  if (has) req.has_temperature = 1, req.temperature = (float)x;
  if (get_number(body, "top_p", 0, 1, &has, &x, err)) return -1;
  if (has) req.has_top_p = 1, req.top_p = (float)x;
  if (get_int(body, "top_k", 0, 1LL << 31, &has, &k, err)) return -1;
  if (has) req.has_top_k = 1, req.top_k = (int)k;
  if (get_number(body, "min_p", 0, 1, &has, &x, err)) return -1;
  if (has) req.has_min_p = 1, req.min_p = (float)x;
  if (get_number(body, "repetition_penalty", 1e-6, 100, &has, &x, err)) return -1;
  if (has) req.has_repetition_penalty = 1, req.repetition_penalty = (float)x;
  if (get_number(body, "presence_penalty", -2, 2, &has, &x, err)) return -1;
  if (has) req.has_presence_penalty = 1, req.presence_penalty = (float)x;
  if (get_number(body, "frequency_penalty", -2, 2, &has, &x, err)) return -1;
  if (has) req.has_frequency_penalty = 1, req.frequency_penalty = (float)x;
  const json_t *seed = json_object_get(body, "seed");
  if (seed && !json_is_null(seed)) {
    if (!json_is_integer(seed)) return *err = strdup("seed must be an integer"), -1;
    req.has_seed = 1;
    req.seed = (uint64_t)json_integer_value(seed);
  }
  /* max_completion_tokens > max_tokens (Anthropic: max_tokens, required) */
  const char *max_keys[] = {"max_completion_tokens", "max_tokens"};
  for (int i = anthropic ? 1 : 0; i < 2 && !req.has_max_tokens; i++) {
    if (get_int(body, max_keys[i], 1, INT32_MAX, &has, &k, err)) return -1;
    if (has) req.has_max_tokens = 1, req.max_tokens = (int)k;
  }
  if (anthropic && !req.has_max_tokens) return *err = strdup("max_tokens is required"), -1;
  const ci_sampling_overrides *layers[] = {s->o.cli, &req};
  int defaulted;
  ci_sampling_resolve(s->o.gen, layers, 2, default_max_tokens, &job->sampling, &job->max_tokens,
                      &defaulted);
  job->max_tokens_explicit = !defaulted;
  /* processors' context sizes */
  const struct {
    const char *key;
    int *field;
  } windows[] = {{"repetition_context_size", &job->sampling.penalties.repetition_context},
                 {"presence_context_size", &job->sampling.penalties.presence_context},
                 {"frequency_context_size", &job->sampling.penalties.frequency_context}};
  for (size_t i = 0; i < sizeof windows / sizeof windows[0]; i++) {
    if (get_int(body, windows[i].key, 0, INT32_MAX, &has, &k, err)) return -1;
    if (has) *windows[i].field = (int)k;
  }
  if (get_number(body, "xtc_probability", 0, 1, &has, &x, err)) return -1;
  if (has) job->sampling.xtc_probability = (float)x;
  if (get_number(body, "xtc_threshold", 0, 0.5, &has, &x, err)) return -1;
  if (has) job->sampling.xtc_threshold = (float)x;
  /* logit_bias {"id": bias} */
  const json_t *bias = json_object_get(body, "logit_bias");
  if (bias && !json_is_null(bias) && !anthropic) {
    const char *msg = "logit_bias must map token ids (< vocab size) to numbers in [-100, 100]";
    if (!json_is_object(bias)) return *err = strdup(msg), -1;
    job->bias = calloc(json_object_size(bias) + 1, sizeof *job->bias);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)bias, key, v) {
      char *end;
      const long id = strtol(key, &end, 10);
      if (!*key || *end || id < 0 || id >= s->o.model->spec.vocab || !json_is_number(v) ||
          fabs(json_number_value(v)) > 100)
        return *err = strdup(msg), -1;
      job->bias[job->n_bias++] = (ci_logit_bias){(int32_t)id, (float)json_number_value(v)};
    }
    job->sampling.logit_bias = job->bias;
    job->sampling.n_logit_bias = job->n_bias;
  }
  /* stop: string or array (Anthropic: stop_sequences) */
  const json_t *stop = json_object_get(body, anthropic ? "stop_sequences" : "stop");
  if (stop && !json_is_null(stop)) {
    const char *msg = anthropic ? "stop_sequences must be an array of strings"
                                : "stop must be a string or an array of at most 16 strings";
    if (json_is_string(stop)) {
      if (anthropic) return *err = strdup(msg), -1;
      job->stop = calloc(1, sizeof *job->stop);
      if (json_string_length(stop) > 0) job->stop[job->n_stop++] = strdup(json_string_value(stop));
    } else if (json_is_array(stop) && json_array_size(stop) <= 16) {
      job->stop = calloc(json_array_size(stop) + 1, sizeof *job->stop);
      size_t i;
      json_t *v;
      json_array_foreach(stop, i, v) {
        if (!json_is_string(v) || json_string_length(v) > 256) return *err = strdup(msg), -1;
        if (json_string_length(v) > 0) job->stop[job->n_stop++] = strdup(json_string_value(v));
      }
    } else {
      return *err = strdup(msg), -1;
    }
  }
  const json_t *ignore_eos = json_object_get(body, "ignore_eos");
  if (ignore_eos && !json_is_boolean(ignore_eos))
    return *err = strdup("ignore_eos must be a boolean"), -1;
  job->ignore_eos = json_is_true(ignore_eos);
  if (ci_sampler_params_validate(&job->sampling, s->o.model->spec.vocab))
    return *err = strdup(ci_last_error()), -1;
  return 0;
}

int ci_srv_tokenize_chat(ci_server *s, json_t *messages, json_t *tools, const json_t *kwargs,
                         ci_srv_job *job, char **err) {
  if (!s->o.chat_template) return *err = strdup("model has no chat template"), -1;
  json_t *request = json_pack("{s:O, s:b}", "messages", messages, "add_generation_prompt", 1);
  if (tools && json_array_size(tools) > 0) json_object_set(request, "tools", tools);
  if (json_is_object(kwargs)) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)kwargs, key, v) json_object_set(request, key, v);
  }
  char *rendered = NULL;
  size_t len = 0;
  if (ci_chat_template_render(s->o.chat_template, request, &rendered, &len)) {
    json_decref(request);
    return *err = dup_printf("chat template: %s", ci_last_error()), -1;
  }
  json_decref(request);
  int32_t *ids = NULL;
  size_t n = 0;
  const int status = ci_tokenizer_encode(s->o.tokenizer, rendered, len, 0, &ids, &n);
  job->reasoning_open = s->think_format && ci_reasoning_prompt_open(rendered, len);
  free(rendered);
  if (status || n == 0) {
    free(ids);
    return *err = strdup(status ? ci_last_error() : "the prompt encodes to no tokens"), -1;
  }
  /* drop a duplicated leading BOS */
  const int32_t bos = ci_tokenizer_config_token_id(s->o.tokenizer, "bos_token");
  if (n >= 2 && bos >= 0 && ids[0] == bos && ids[1] == bos) {
    memmove(ids, ids + 1, (n - 1) * sizeof *ids);
    n--;
  }
  job->prompt = ids;
  job->n_prompt = (int)n;
  return 0;
}

/* ==== Submission ==== */

int ci_srv_gen_start(ci_server *s, ci_srv_job *job, ci_srv_gen *g, int anthropic, json_t **body) {
  memset(g, 0, sizeof *g);
  g->srv = s;
  g->t_start = ci_now_seconds();
  const int ctx = ci_engine_ctx_size(s->o.engine);
  if (!job->max_tokens_explicit && (long long)job->n_prompt + job->max_tokens > ctx)
    job->max_tokens = ctx - job->n_prompt;
  if (job->n_prompt >= ctx || (long long)job->n_prompt + job->max_tokens > ctx) {
    char msg[256];
    snprintf(msg, sizeof msg,
             "this model's maximum context length is %d tokens; the request needs %lld (prompt "
             "%d + max_tokens %d)",
             ctx, (long long)job->n_prompt + job->max_tokens, job->n_prompt, job->max_tokens);
    *body = ci_server_error_body(anthropic, 400, "context_length_exceeded", msg);
    return 400;
  }
  ci_engine_job ej;
  memset(&ej, 0, sizeof ej);
  ej.prompt = job->prompt;
  ej.n_prompt = job->n_prompt;
  ej.max_tokens = job->max_tokens;
  ej.sampling = job->sampling;
  if (!job->ignore_eos) ej.eos = s->o.eos;
  ej.kv_plan = s->o.kv_plan;
  ej.kv_target = s->o.kv_target;
  ej.kv_start = s->o.kv_start;
  ej.top_logprobs = job->top_logprobs;
  const ci_engine_verdict v = ci_engine_submit(s->o.engine, &ej, &g->req);
  if (v != CI_ENGINE_SUBMITTED) {
    const char *msg = ci_last_error();
    if (v == CI_ENGINE_REJECTED) {
      const int over = strstr(msg, "memory budget") != NULL;
      *body =
          ci_server_error_body(anthropic, 400, over ? "context_over_budget" : "invalid_value", msg);
      return 400;
    }
    *body =
        ci_server_error_body(anthropic, v == CI_ENGINE_QUEUE_FULL ? 429 : 503, "overloaded", msg);
    return v == CI_ENGINE_QUEUE_FULL ? 429 : 503;
  }
  g->detok = ci_detok_stream_create(s->o.tokenizer, (const char *const *)job->stop,
                                    (size_t)job->n_stop, 1);
  if (s->think_format) g->split = ci_reasoning_split_create(job->reasoning_open);
  if (job->tools) {
    g->tool_defs = job->tools;
    job->tools = NULL;
    g->tools = ci_tool_parser_create(g->tool_defs);
  }
  g->stop = job->stop;
  g->n_stop = job->n_stop;
  job->stop = NULL;
  job->n_stop = 0;
  g->want_logprobs = job->logprobs;
  g->top_logprobs = job->top_logprobs;
  g->d_calls = json_array();
  g->calls = json_array();
  g->d_logprobs = json_array();
  g->logprobs = json_array();
  g->prompt_tokens = job->n_prompt;
  return 0;
}

/* ==== The text pipeline ==== */

static void on_content(void *ctx, const char *text, size_t len) {
  ci_srv_gen *g = ctx;
  ci_strbuf_append(&g->d_content, text, len);
  ci_strbuf_append(&g->content, text, len);
}

static void on_split(void *ctx, int is_reasoning, const char *text, size_t len) {
  ci_srv_gen *g = ctx;
  if (is_reasoning) {
    ci_strbuf_append(&g->d_reasoning, text, len);
    ci_strbuf_append(&g->reasoning, text, len);
  } else if (g->tools) {
    const size_t before = json_array_size(g->calls);
    json_t *fresh = json_array();
    ci_tool_parser_push(g->tools, text, len, fresh, on_content, g);
    json_array_extend(g->d_calls, fresh);
    json_array_extend(g->calls, fresh);
    json_decref(fresh);
    (void)before;
  } else {
    on_content(g, text, len);
  }
}

static void visible_text(ci_srv_gen *g, const char *text, size_t len) {
  if (!len) return;
  if (g->split)
    ci_reasoning_split_push(g->split, text, len, on_split, g);
  else
    on_split(g, 0, text, len);
}

/* End of text: flush every stage. */
static void flush_text(ci_srv_gen *g) {
  if (g->split) ci_reasoning_split_finish(g->split, on_split, g);
  if (g->tools) {
    json_t *fresh = json_array();
    ci_tool_parser_finish(g->tools, fresh, on_content, g);
    json_array_extend(g->d_calls, fresh);
    json_array_extend(g->calls, fresh);
    json_decref(fresh);
  }
}

/* Which stop string fired: the earliest one in the decoded text. */
static void find_stop_sequence(ci_srv_gen *g) {
  char *text = NULL;
  size_t len = 0;
  if (ci_tokenizer_decode(g->srv->o.tokenizer, g->ids, (size_t)g->n_ids, 1, &text, &len)) return;
  const char *best = NULL;
  int which = -1;
  for (int i = 0; i < g->n_stop; i++) {
    const char *hit = strstr(text, g->stop[i]);
    if (hit && (!best || hit < best)) best = hit, which = i;
  }
  if (which >= 0) g->stop_sequence = strdup(g->stop[which]);
  free(text);
}

static json_t *token_logprob(const ci_srv_gen *g, int32_t id, float logprob) {
  char *text = NULL;
  size_t len = 0;
  if (ci_tokenizer_decode(g->srv->o.tokenizer, &id, 1, 0, &text, &len)) text = strdup("");
  json_t *bytes = json_array();
  for (size_t i = 0; i < len; i++)
    json_array_append_new(bytes, json_integer((unsigned char)text[i]));
  json_t *token = json_stringn(text, len);
  if (!token) token = json_string(""); /* a lone byte of a multi-byte character */
  json_t *entry =
      json_pack("{s:o, s:f, s:o, s:i}", "token", token, "logprob",
                isfinite(logprob) ? (double)logprob : -9999.0, "bytes", bytes, "id", (int)id);
  free(text);
  return entry;
}

static void finish(ci_srv_gen *g, const char *reason) {
  flush_text(g);
  g->done = 1;
  g->finish = json_array_size(g->calls) > 0 ? "tool_calls" : reason;
}

int ci_srv_gen_pump(ci_srv_gen *g, double timeout_s) {
  if (g->done) return 0;
  ci_engine_event ev;
  if (!ci_engine_request_next(g->req, &ev, timeout_s)) return 0;
  const double now = ci_now_seconds();
  if (ev.kind == CI_ENGINE_EVENT_ERROR) {
    snprintf(g->error, sizeof g->error, "%s", ev.message);
    g->failed = 1;
    g->done = 1;
    g->finish = "error";
    return 1;
  }
  if (ev.kind == CI_ENGINE_EVENT_DONE) {
    g->completion_tokens = ev.generated_tokens;
    g->cached_tokens = ev.cached_tokens;
    const char *detok_piece;
    size_t detok_len;
    const int r = ci_detok_stream_finish(g->detok, &detok_piece, &detok_len);
    if (r >= 0) visible_text(g, detok_piece, detok_len);
    if (r == 1) {
      g->stopped_by_string = 1;
      find_stop_sequence(g);
    }
    g->eos_stop = ev.finish == CI_FINISH_STOP;
    finish(g, ev.finish == CI_FINISH_LENGTH && r != 1 ? "length" : "stop");
    pthread_mutex_lock(&g->srv->metrics_mu);
    ci_histogram_observe(&g->srv->queue, ev.queue_seconds);
    ci_histogram_observe(&g->srv->duration, now - g->t_start);
    pthread_mutex_unlock(&g->srv->metrics_mu);
    return 1;
  }
  /* a token */
  pthread_mutex_lock(&g->srv->metrics_mu);
  if (g->completion_tokens == 0)
    ci_histogram_observe(&g->srv->ttft, now - g->t_start);
  else
    ci_histogram_observe(&g->srv->itl, now - g->t_prev);
  pthread_mutex_unlock(&g->srv->metrics_mu);
  g->t_prev = now;
  g->completion_tokens++;
  if (g->n_ids == g->cap_ids) {
    int cap = g->cap_ids ? g->cap_ids * 2 : 64;
    int32_t *bigger = realloc(g->ids, (size_t)cap * sizeof *bigger);
    if (bigger) g->ids = bigger, g->cap_ids = cap;
  }
  if (g->n_ids < g->cap_ids) g->ids[g->n_ids++] = ev.token;
  const char *piece;
  size_t len;
  const int r = ci_detok_stream_push(g->detok, ev.token, &piece, &len);
  if (r < 0) {
    snprintf(g->error, sizeof g->error, "%s", ci_last_error());
    g->failed = 1;
    g->done = 1;
    ci_engine_request_cancel(g->req);
    return 1;
  }
  visible_text(g, piece, len);
  if (g->want_logprobs) {
    json_t *entry = token_logprob(g, ev.token, ev.logprob);
    json_t *top = json_array();
    for (int i = 0; i < ev.n_top; i++)
      json_array_append_new(top, token_logprob(g, ev.top_ids[i], ev.top_logprobs[i]));
    json_object_set_new(entry, "top_logprobs", top);
    if (r != 1) {
      json_array_append(g->d_logprobs, entry);
      json_array_append(g->logprobs, entry);
    }
    json_decref(entry);
  }
  if (r == 1) { /* a stop string completed: the engine stops at its next boundary */
    ci_engine_request_cancel(g->req);
    g->stopped_by_string = 1;
    find_stop_sequence(g);
    finish(g, "stop");
  }
  return 1;
}

void ci_srv_gen_clear_deltas(ci_srv_gen *g) {
  g->d_content.len = 0;
  g->d_reasoning.len = 0;
  json_array_clear(g->d_calls);
  json_array_clear(g->d_logprobs);
}

void ci_srv_gen_free(ci_srv_gen *g) {
  ci_engine_request_release(g->req);
  ci_detok_stream_free(g->detok);
  ci_reasoning_split_free(g->split);
  ci_tool_parser_free(g->tools);
  json_decref(g->tool_defs);
  for (int i = 0; i < g->n_stop; i++) free(g->stop[i]);
  free(g->stop);
  free(g->ids);
  ci_strbuf_free(&g->d_content);
  ci_strbuf_free(&g->d_reasoning);
  ci_strbuf_free(&g->content);
  ci_strbuf_free(&g->reasoning);
  json_decref(g->d_calls);
  json_decref(g->calls);
  json_decref(g->d_logprobs);
  json_decref(g->logprobs);
  free(g->stop_sequence);
  memset(g, 0, sizeof *g);
}
