/* One generation seen from an HTTP thread: request parameters (docs/generation.md §4.1,
 * docs/server.md "Chat requests"), chat rendering
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
    if (!bigger) {
      b->oom = 1;
      return;
    }
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
  if (!big) {
    b->oom = 1;
    return;
  }
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
  ci_grammar_free(j->grammar);
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

/* Appends a copy of a stop string to job->stop (room already allocated). Returns 0 or sets *err. */
static int add_stop(ci_srv_job *job, const char *text, char **err) {
  char *copy = strdup(text);
  if (!copy) return *err = strdup("out of memory"), -1;
  job->stop[job->n_stop++] = copy;
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
    if (!job->bias) return *err = strdup("out of memory"), -1;
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
      if (!job->stop) return *err = strdup("out of memory"), -1;
      if (json_string_length(stop) > 0 && add_stop(job, json_string_value(stop), err)) return -1;
    } else if (json_is_array(stop) && json_array_size(stop) <= 16) {
      job->stop = calloc(json_array_size(stop) + 1, sizeof *job->stop);
      if (!job->stop) return *err = strdup("out of memory"), -1;
      size_t i;
      json_t *v;
      json_array_foreach(stop, i, v) {
        if (!json_is_string(v) || json_string_length(v) > 256) return *err = strdup(msg), -1;
        if (json_string_length(v) > 0 && add_stop(job, json_string_value(v), err)) return -1;
      }
    } else {
      return *err = strdup(msg), -1;
    }
  }
  if (ci_sampler_params_validate(&job->sampling, s->o.model->spec.vocab))
    return *err = strdup(ci_last_error()), -1;
  return ci_srv_parse_extensions(s, body, job, err);
}

/* continue_final_message: cuts the rendering right after the final message's content (its last
 * occurrence; templates often trim it, so the trimmed text is tried too). Returns 0, or -1 when
 * the content cannot be found. */
static int cut_after_final_message(const char *rendered, size_t *len, const char *content) {
  const char *start = content, *end = content + strlen(content);
  for (int trimmed = 0; trimmed < 2; trimmed++) {
    if (trimmed) {
      while (start < end && strchr(" \t\r\n", *start)) start++;
      while (end > start && strchr(" \t\r\n", end[-1])) end--;
    }
    const size_t n = (size_t)(end - start);
    if (n == 0) continue;
    for (size_t i = *len >= n ? *len - n + 1 : 0; i-- > 0;)
      if (!memcmp(rendered + i, start, n)) {
        *len = i + n;
        return 0;
      }
  }
  return -1;
}

/* Whether request (which has tools) renders as it does without them: rendered[0..len) is its
 * rendering with the tools. */
static int template_ignores_tools(ci_server *s, json_t *request, const char *rendered,
                                  size_t len) {
  json_t *tools = json_incref(json_object_get(request, "tools"));
  json_object_del(request, "tools");
  char *plain = NULL;
  size_t plain_len = 0;
  const int same = !ci_chat_template_render(s->o.chat_template, request, &plain, &plain_len) &&
                   plain_len == len && memcmp(plain, rendered, len) == 0;
  free(plain);
  json_object_set_new(request, "tools", tools);
  return same;
}

int ci_srv_tokenize_chat(ci_server *s, json_t *messages, json_t *tools, const json_t *kwargs,
                         ci_srv_job *job, char **err) {
  if (!s->o.chat_template) return *err = strdup("model has no chat template"), -1;
  const json_t *last = json_array_get(messages, json_array_size(messages) - 1);
  const char *last_role = json_string_value(json_object_get(last, "role"));
  const char *last_content = json_string_value(json_object_get(last, "content"));
  if (job->continue_final && (!last_role || strcmp(last_role, "assistant") || !last_content))
    return *err = strdup("continue_final_message needs a final assistant message"), -1;
  json_t *request =
      json_pack("{s:O, s:b}", "messages", messages, "add_generation_prompt", !job->continue_final);
  int set_failed = !request;
  if (request && tools && json_array_size(tools) > 0)
    set_failed |= json_object_set(request, "tools", tools) != 0;
  if (request && json_is_object(kwargs)) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)kwargs, key, v) set_failed |=
        json_object_set(request, key, v) != 0;
  }
  if (set_failed) {
    json_decref(request);
    return *err = strdup("out of memory"), -1;
  }
  char *rendered = NULL;
  size_t len = 0;
  if (ci_chat_template_render(s->o.chat_template, request, &rendered, &len)) {
    json_decref(request);
    return *err = dup_printf("chat template: %s", ci_last_error()), -1;
  }
  if (json_object_get(request, "tools") && template_ignores_tools(s, request, rendered, len)) {
    /* the template drops the tools: tell the model about them in a system prompt instead */
    json_t *injected = ci_srv_inject_tool_prompt(messages, tools);
    free(rendered);
    rendered = NULL;
    const int failed = !injected || json_object_set_new(request, "messages", injected) ||
                       json_object_del(request, "tools") ||
                       ci_chat_template_render(s->o.chat_template, request, &rendered, &len);
    if (failed) {
      json_decref(request);
      return *err = dup_printf("chat template: %s", injected ? ci_last_error() : "out of memory"),
             -1;
    }
  }
  json_decref(request);
  if (job->continue_final && cut_after_final_message(rendered, &len, last_content)) {
    free(rendered);
    return *err = strdup("continue_final_message: the template's rendering does not contain the "
                         "final assistant message's content"),
           -1;
  }
  int32_t *ids = NULL;
  size_t n = 0;
  const int status = ci_tokenizer_encode(s->o.tokenizer, rendered, len, 0, &ids, &n);
  job->reasoning_open = s->think_format && ci_reasoning_prompt_open(rendered, len);
  job->channel_open =
      s->gemma_channels && ci_gemma_prompt_open(rendered, len, &job->channel_name_done);
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

/* The HTTP status and error code of a submission verdict other than CI_ENGINE_SUBMITTED. */
static const char *submit_error(ci_engine_verdict v, int *status) {
  switch (v) {
  case CI_ENGINE_OVER_CONTEXT:
    return *status = 400, "context_length_exceeded";
  case CI_ENGINE_OVER_BUDGET:
    return *status = 400, "context_over_budget";
  case CI_ENGINE_QUEUE_FULL:
    return *status = 429, "overloaded";
  case CI_ENGINE_STOPPED:
  case CI_ENGINE_OUT_OF_MEMORY:
    return *status = 503, "overloaded";
  case CI_ENGINE_REJECTED:
  case CI_ENGINE_SUBMITTED:
    break;
  }
  return *status = 400, "invalid_value";
}

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
  for (int i = 0; i < job->n_stop_ids; i++) /* stop_token_ids finish like EOS: "stop" */
    if (ci_eos_set_add(&ej.eos, job->stop_ids[i])) {
      *body = ci_server_error_body(anthropic, 400, "invalid_value",
                                   "stop_token_ids: too many stop ids (EOS ids included)");
      return 400;
    }
  ej.kv_plan = job->has_kv ? job->kv_plan : s->o.kv_plan;
  ej.kv_target = job->has_kv ? job->kv_target : s->o.kv_target;
  ej.kv_start = job->has_kv ? job->kv_start : s->o.kv_start;
  ej.kv_protect = job->has_kv ? job->kv_protect : s->o.kv_protect;
  ej.top_logprobs = job->top_logprobs;
  if (job->grammar) { /* the engine request takes its own reference */
    ej.grammar = job->grammar;
    ej.grammar_vocab = ci_srv_grammar_vocab(s);
  }
  const ci_engine_verdict v = ci_engine_submit(s->o.engine, &ej, &g->req);
  if (v != CI_ENGINE_SUBMITTED) {
    int status;
    const char *code = submit_error(v, &status);
    *body = ci_server_error_body(anthropic, status, code, ci_last_error());
    return status;
  }
  ci_srv_gen_init_text(s, job, g);
  return 0;
}

/* Ends the generation with an error (the response reports `message`); the engine stops the
 * request at its next boundary. */
static void fail_generation(ci_srv_gen *g, const char *message) {
  snprintf(g->error, sizeof g->error, "%s", message);
  g->failed = 1;
  g->done = 1;
  g->finish = "error";
  if (g->req) ci_engine_request_cancel(g->req);
}

void ci_srv_gen_init_text(ci_server *s, ci_srv_job *job, ci_srv_gen *g) {
  g->srv = s;
  if (g->t_start == 0) g->t_start = ci_now_seconds();
  g->detok = ci_detok_stream_create(s->o.tokenizer, (const char *const *)job->stop,
                                    (size_t)job->n_stop, 1);
  if (s->think_format && !job->raw_text) g->split = ci_reasoning_split_create(job->reasoning_open);
  g->in_think = job->reasoning_open;
  if (job->tools) {
    g->tool_defs = job->tools;
    job->tools = NULL;
  }
  /* a forced tool call is a hermes one, read by the text parser */
  const int gemma_calls =
      s->gemma_calls && !job->tools_off && !job->raw_text && !job->forced_tool_call;
  const int gemma_channels = s->gemma_channels && !job->raw_text;
  if (g->tool_defs && (!s->gemma_calls || job->forced_tool_call))
    g->tools = ci_tool_parser_create(g->tool_defs);
  if (gemma_channels || gemma_calls) {
    const ci_gemma_output_options go = {.channels = gemma_channels,
                                        .tool_calls = gemma_calls,
                                        .in_channel = job->channel_open,
                                        .name_done = job->channel_name_done,
                                        .tools = g->tool_defs};
    g->gemma = ci_gemma_output_create(s->o.tokenizer, &s->gemma, &go);
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
  /* a stage that could not be created fails the generation before any event is applied */
  if (!g->detok || (s->think_format && !job->raw_text && !g->split) ||
      (g->tool_defs && !s->gemma_calls && !g->tools) ||
      ((gemma_channels || gemma_calls) && !g->gemma) || !g->d_calls || !g->calls ||
      !g->d_logprobs || !g->logprobs)
    fail_generation(g, "out of memory");
}

/* ==== The text pipeline ==== */

void ci_server_detect_formats(ci_server *s) {
  const ci_tokenizer *tok = s->o.tokenizer;
  s->think_open = ci_tokenizer_token_to_id(tok, "<think>");
  s->think_close = ci_tokenizer_token_to_id(tok, "</think>");
  s->think_format = s->think_open >= 0 && s->think_close >= 0;
  ci_gemma_markers_find(tok, &s->gemma);
  /* docs/server.md "Output formats": a template mentioning <|channel> means gemma-channel reasoning
   */
  s->gemma_channels = s->o.chat_template &&
                      ci_chat_template_mentions(s->o.chat_template, "<|channel>") &&
                      ci_gemma_markers_have_channels(&s->gemma);
  /* docs/server.md "Output formats": model_type gemma4* means the token parser, always on;
     <|tool_response> after a call ends generation */
  const char *type = s->o.model ? s->o.model->spec.model_type : NULL;
  s->gemma_calls = type && !strncmp(type, "gemma4", 6) && ci_gemma_markers_have_calls(&s->gemma);
  if (s->gemma_calls && s->gemma.response_open >= 0)
    ci_eos_set_add(&s->o.eos, s->gemma.response_open);
}

static void on_content(void *ctx, const char *text, size_t len) {
  ci_srv_gen *g = ctx;
  ci_strbuf_append(&g->d_content, text, len);
  ci_strbuf_append(&g->content, text, len);
}

static void on_reasoning(void *ctx, const char *text, size_t len) {
  ci_srv_gen *g = ctx;
  ci_strbuf_append(&g->d_reasoning, text, len);
  ci_strbuf_append(&g->reasoning, text, len);
}

static void on_calls(ci_srv_gen *g, json_t *fresh) {
  json_array_extend(g->d_calls, fresh);
  json_array_extend(g->calls, fresh);
}

static void on_split(void *ctx, int is_reasoning, const char *text, size_t len) {
  ci_srv_gen *g = ctx;
  if (is_reasoning) {
    on_reasoning(g, text, len);
  } else if (g->tools) {
    json_t *fresh = json_array();
    ci_tool_parser_push(g->tools, text, len, fresh, on_content, g);
    on_calls(g, fresh);
    json_decref(fresh);
  } else {
    on_content(g, text, len);
  }
}

static void on_gemma_call(void *ctx, json_t *call) {
  ci_srv_gen *g = ctx;
  json_array_append(g->d_calls, call);
  json_array_append(g->calls, call);
}

/* Gemma routing: reasoning and calls as above; a segment that failed to parse is content. */
static const ci_gemma_sinks gemma_sinks = {on_reasoning, on_content, on_gemma_call};

static void visible_text(ci_srv_gen *g, const char *text, size_t len) {
  if (!len) return;
  if (g->split)
    ci_reasoning_split_push(g->split, text, len, on_split, g);
  else
    on_split(g, 0, text, len);
}

/* End of text: flush every stage. */
static void flush_text(ci_srv_gen *g) {
  if (g->gemma) {
    ci_gemma_output_finish(g->gemma, &gemma_sinks, g);
    g->reasoning_tokens += ci_gemma_output_reasoning_tokens(g->gemma);
  }
  if (g->split) ci_reasoning_split_finish(g->split, on_split, g);
  if (g->tools) {
    json_t *fresh = json_array();
    ci_tool_parser_finish(g->tools, fresh, on_content, g);
    on_calls(g, fresh);
    json_decref(fresh);
  }
}

/* Which stop string fired, as the detokenizer matched it. */
static void find_stop_sequence(ci_srv_gen *g) {
  const char *fired = ci_detok_stream_stop_string(g->detok);
  if (fired && !(g->stop_sequence = strdup(fired))) fail_generation(g, "out of memory");
}

static json_t *token_logprob(const ci_srv_gen *g, int32_t id, float logprob) {
  char *text = NULL;
  size_t len = 0;
  if (ci_tokenizer_decode(g->srv->o.tokenizer, &id, 1, 0, &text, &len)) text = NULL, len = 0;
  json_t *bytes = json_array();
  int lost = !bytes;
  for (size_t i = 0; i < len && !lost; i++)
    lost = json_array_append_new(bytes, json_integer((unsigned char)text[i]));
  json_t *token = json_stringn(text ? text : "", len);
  if (!token) token = json_string(""); /* a lone byte of a multi-byte character */
  free(text);
  if (lost || !token) {
    json_decref(bytes);
    json_decref(token);
    return NULL;
  }
  /* "o" steals token and bytes even when packing fails */
  return json_pack("{s:o, s:f, s:o, s:i}", "token", token, "logprob",
                   isfinite(logprob) ? (double)logprob : -9999.0, "bytes", bytes, "id", (int)id);
}

/* Whether appending text failed somewhere (the response would be incomplete). */
static int text_lost(const ci_srv_gen *g) {
  return g->d_content.oom || g->content.oom || g->d_reasoning.oom || g->reasoning.oom;
}

static void finish(ci_srv_gen *g, const char *reason) {
  flush_text(g);
  g->done = 1;
  g->finish = json_array_size(g->calls) > 0 ? "tool_calls" : reason;
  if (!g->engine_timings) { /* measured here: queue and prefill together */
    g->prefill_s = g->t_first > 0 ? g->t_first - g->t_start : 0;
    g->decode_s = g->t_first > 0 ? g->t_prev - g->t_first : 0;
  }
  if (text_lost(g)) fail_generation(g, "out of memory");
}

/* Think-tag reasoning tokens: those strictly between <think> and </think> (by id). */
static void count_think(ci_srv_gen *g, int32_t id) {
  if (!g->split) return;
  if (id == g->srv->think_open)
    g->in_think = 1;
  else if (id == g->srv->think_close)
    g->in_think = 0;
  else if (g->in_think)
    g->reasoning_tokens++;
}

int ci_srv_gen_pump(ci_srv_gen *g, double timeout_s) {
  if (g->done) return 0;
  ci_engine_event ev;
  if (!ci_engine_request_next(g->req, &ev, timeout_s)) return 0;
  ci_srv_gen_apply(g, &ev, ci_now_seconds());
  return 1;
}

void ci_srv_gen_apply(ci_srv_gen *g, const ci_engine_event *ev, double now) {
  if (g->done) return;
  if (ev->kind == CI_ENGINE_EVENT_ERROR) {
    fail_generation(g, ev->message);
    return;
  }
  if (ev->kind == CI_ENGINE_EVENT_DONE) {
    g->completion_tokens = ev->generated_tokens;
    g->cached_tokens = ev->cached_tokens;
    g->engine_timings = 1;
    g->queue_s = ev->queue_seconds;
    g->prefill_s = ev->prefill_seconds;
    g->decode_s = ev->decode_seconds;
    const char *detok_piece;
    size_t detok_len;
    const int r = ci_detok_stream_finish(g->detok, &detok_piece, &detok_len);
    if (r >= 0) visible_text(g, detok_piece, detok_len);
    if (r == 1) {
      g->stopped_by_string = 1;
      find_stop_sequence(g);
    }
    g->eos_stop = ev->finish == CI_FINISH_STOP;
    finish(g, ev->finish == CI_FINISH_LENGTH && r != 1 ? "length" : "stop");
    pthread_mutex_lock(&g->srv->metrics_mu);
    ci_histogram_observe(&g->srv->queue, ev->queue_seconds);
    ci_histogram_observe(&g->srv->duration, now - g->t_start);
    pthread_mutex_unlock(&g->srv->metrics_mu);
    return;
  }
  /* a token */
  pthread_mutex_lock(&g->srv->metrics_mu);
  if (g->completion_tokens == 0)
    ci_histogram_observe(&g->srv->ttft, now - g->t_start);
  else
    ci_histogram_observe(&g->srv->itl, now - g->t_prev);
  pthread_mutex_unlock(&g->srv->metrics_mu);
  if (g->completion_tokens == 0) g->t_first = now;
  g->t_prev = now;
  g->completion_tokens++;
  count_think(g, ev->token);
  const char *piece = NULL;
  size_t len = 0;
  int r = g->gemma ? ci_gemma_output_push(g->gemma, ev->token, &gemma_sinks, g) : 0;
  if (r == 1) /* routed (Gemma reasoning or tool call): not content */
    r = 0;
  else if (r == 0)
    r = ci_detok_stream_push(g->detok, ev->token, &piece, &len);
  if (r < 0) {
    fail_generation(g, ci_last_error());
    return;
  }
  visible_text(g, piece, len);
  if (text_lost(g)) {
    fail_generation(g, "out of memory");
    return;
  }
  if (g->want_logprobs) {
    json_t *entry = token_logprob(g, ev->token, ev->logprob);
    json_t *top = json_array();
    int lost = !entry || !top;
    for (int i = 0; i < ev->n_top && !lost; i++)
      lost = json_array_append_new(top, token_logprob(g, ev->top_ids[i], ev->top_logprobs[i]));
    if (!lost) lost = json_object_set_new(entry, "top_logprobs", top);
    else json_decref(top);
    if (!lost && r != 1)
      lost = json_array_append(g->d_logprobs, entry) || json_array_append(g->logprobs, entry);
    json_decref(entry);
    if (lost) {
      fail_generation(g, "out of memory");
      return;
    }
  }
  if (r == 1) { /* a stop string completed: the engine stops at its next boundary */
    if (g->req) ci_engine_request_cancel(g->req);
    g->stopped_by_string = 1;
    find_stop_sequence(g);
    finish(g, "stop");
  }
}

json_t *ci_srv_gen_timings(const ci_srv_gen *g) {
  const int prompt_n = g->prompt_tokens - g->cached_tokens, predicted_n = g->completion_tokens;
  /* docs/generation.md §10: prefill tok/s = (P - p) / prefill time; decode tok/s = (g - 1) / (last
     token time - first token time) */
  const double prompt_rate = g->prefill_s > 0 ? prompt_n / g->prefill_s : 0;
  const double decode_rate =
      g->decode_s > 0 && predicted_n > 1 ? (predicted_n - 1) / g->decode_s : 0;
  return json_pack("{s:i, s:f, s:f, s:i, s:f, s:f, s:i, s:i, s:i}", "prompt_n", prompt_n,
                   "prompt_ms", g->prefill_s * 1e3, "prompt_per_second", prompt_rate, "predicted_n",
                   predicted_n, "predicted_ms", g->decode_s * 1e3, "predicted_per_second",
                   decode_rate, "cache_n", g->cached_tokens, "draft_n", 0, "draft_accepted_n", 0);
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
  ci_gemma_output_free(g->gemma);
  json_decref(g->tool_defs);
  for (int i = 0; i < g->n_stop; i++) free(g->stop[i]);
  free(g->stop);
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
