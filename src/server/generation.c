/* One generation seen from an HTTP thread: request parameters (docs/generation.md §4.1,
 * docs/server.md "Chat requests") as cinfer_params, chat rendering and tokenization, submission
 * to the engine (cinfer_engine_submit), and the chat output parser on its token events
 * (detokenizer with stop strings -> reasoning split -> tool-call parser), kept as deltas for
 * streaming and totals for the final response. */
#include "server/server.h"

#include "base/error.h"
#include "base/timing.h"

#include <math.h>
#include <stdarg.h>
#include <errno.h>
#include <stdio.h>
#include <sys/socket.h>
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

int ci_srv_fail(char **err, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  *err = strdup(buf);
  return -1;
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
  cinfer_free(j->prompt);
  cinfer_free(j->rendered);
  free(j->bias);
  for (int i = 0; i < j->n_stop; i++) free(j->stop[i]);
  free(j->stop);
  json_decref(j->tools);
  free(j->grammar);
  free(j->echo);
  cinfer_adapter_free(j->adapter);
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
  /* request > CLI flag > generation_config.json > built-in: the defaults hold the last three */
  cinfer_params *p = &job->params;
  *p = *s->o.defaults;
  p->max_tokens_explicit = s->o.defaults->max_tokens_explicit;
  if (!s->o.max_tokens_configured && default_max_tokens > 0) p->max_tokens = default_max_tokens;
  double x;
  long long k;
  int has;
  if (get_number(body, "temperature", 0, 5, &has, &x, err)) return -1;
  if (has) p->temperature = (float)x;
  if (get_number(body, "top_p", 0, 1, &has, &x, err)) return -1;
  if (has) p->top_p = (float)x;
  if (get_int(body, "top_k", 0, 1LL << 31, &has, &k, err)) return -1;
  if (has) p->top_k = (int)k;
  if (get_number(body, "min_p", 0, 1, &has, &x, err)) return -1;
  if (has) p->min_p = (float)x;
  if (get_number(body, "repetition_penalty", 1e-6, 100, &has, &x, err)) return -1;
  if (has) p->repetition_penalty = (float)x;
  if (get_number(body, "presence_penalty", -2, 2, &has, &x, err)) return -1;
  if (has) p->presence_penalty = (float)x;
  if (get_number(body, "frequency_penalty", -2, 2, &has, &x, err)) return -1;
  if (has) p->frequency_penalty = (float)x;
  const json_t *seed = json_object_get(body, "seed");
  if (seed && !json_is_null(seed)) {
    if (!json_is_integer(seed)) return *err = strdup("seed must be an integer"), -1;
    p->has_seed = 1;
    p->seed = (uint64_t)json_integer_value(seed);
  }
  /* max_completion_tokens > max_tokens (Anthropic: max_tokens, required) */
  const char *max_keys[] = {"max_completion_tokens", "max_tokens"};
  int has_max = 0;
  for (int i = anthropic ? 1 : 0; i < 2 && !has_max; i++) {
    if (get_int(body, max_keys[i], 1, INT32_MAX, &has_max, &k, err)) return -1;
    if (has_max) p->max_tokens = (int)k, p->max_tokens_explicit = 1;
  }
  if (anthropic && !has_max) return *err = strdup("max_tokens is required"), -1;
  /* processors' context sizes */
  const struct {
    const char *key;
    int *field;
  } windows[] = {{"repetition_context_size", &p->repetition_context},
                 {"presence_context_size", &p->presence_context},
                 {"frequency_context_size", &p->frequency_context}};
  for (size_t i = 0; i < sizeof windows / sizeof windows[0]; i++) {
    if (get_int(body, windows[i].key, 0, INT32_MAX, &has, &k, err)) return -1;
    if (has) *windows[i].field = (int)k;
  }
  if (get_number(body, "xtc_probability", 0, 1, &has, &x, err)) return -1;
  if (has) p->xtc_probability = (float)x;
  if (get_number(body, "xtc_threshold", 0, 0.5, &has, &x, err)) return -1;
  if (has) p->xtc_threshold = (float)x;
  /* logit_bias {"id": bias} */
  const json_t *bias = json_object_get(body, "logit_bias");
  if (bias && !json_is_null(bias) && !anthropic) {
    const char *msg = "logit_bias must map token ids (< vocab size) to numbers in [-100, 100]";
    if (!json_is_object(bias)) return *err = strdup(msg), -1;
    job->bias = calloc(json_object_size(bias) + 1, sizeof *job->bias);
    if (!job->bias) return *err = strdup("out of memory"), -1;
    size_t n_bias = 0;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)bias, key, v) {
      char *end;
      const long id = strtol(key, &end, 10);
      if (!*key || *end || id < 0 || id >= s->o.vocab || !json_is_number(v) ||
          fabs(json_number_value(v)) > 100)
        return *err = strdup(msg), -1;
      job->bias[n_bias++] = (cinfer_logit_bias){(int32_t)id, (float)json_number_value(v)};
    }
    p->logit_bias = job->bias;
    p->n_logit_bias = n_bias;
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
static int template_ignores_tools(ci_server *s, json_t *request, const char *rendered, size_t len) {
  json_t *tools = json_incref(json_object_get(request, "tools"));
  json_object_del(request, "tools");
  char *text = json_dumps(request, JSON_COMPACT), *plain = NULL;
  size_t plain_len = 0;
  const int same =
      text &&
      cinfer_chat_template_render(s->o.chat_template, text, &plain, &plain_len) == CINFER_OK &&
      plain_len == len && memcmp(plain, rendered, len) == 0;
  free(text);
  cinfer_free(plain);
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
  char *request_text = json_dumps(request, JSON_COMPACT);
  if (!request_text) {
    json_decref(request);
    return *err = strdup("out of memory"), -1;
  }
  char *rendered = NULL;
  size_t len = 0;
  const cinfer_status rendered_status =
      cinfer_chat_template_render(s->o.chat_template, request_text, &rendered, &len);
  if (rendered_status != CINFER_OK) {
    free(request_text);
    json_decref(request);
    return *err = dup_printf("chat template: %s", cinfer_last_error()), -1;
  }
  free(request_text);
  if (json_object_get(request, "tools") && template_ignores_tools(s, request, rendered, len)) {
    /* the template drops the tools: tell the model about them in a system prompt instead */
    json_t *injected = ci_srv_inject_tool_prompt(messages, tools);
    cinfer_free(rendered);
    rendered = NULL;
    int failed = !injected || json_object_set_new(request, "messages", injected) ||
                 json_object_del(request, "tools");
    char *injected_text = failed ? NULL : json_dumps(request, JSON_COMPACT);
    failed = failed || !injected_text ||
             cinfer_chat_template_render(s->o.chat_template, injected_text, &rendered, &len) !=
                 CINFER_OK;
    free(injected_text);
    if (failed) {
      json_decref(request);
      return *err =
                 dup_printf("chat template: %s", injected ? cinfer_last_error() : "out of memory"),
             -1;
    }
  }
  json_decref(request);
  if (job->continue_final && cut_after_final_message(rendered, &len, last_content)) {
    cinfer_free(rendered);
    return *err = strdup("continue_final_message: the template's rendering does not contain the "
                         "final assistant message's content"),
           -1;
  }
  int32_t *ids = NULL;
  size_t n = 0;
  const cinfer_status status = cinfer_tokenizer_encode(s->o.tokenizer, rendered, len, 0, &ids, &n);
  job->rendered = rendered; /* the chat output parser reads how the prompt ends */
  job->rendered_len = len;
  if (status != CINFER_OK || n == 0) {
    cinfer_free(ids);
    return *err = strdup(status != CINFER_OK ? cinfer_last_error()
                                             : "the prompt encodes to no tokens"),
           -1;
  }
  /* drop a duplicated leading BOS */
  const int32_t bos = cinfer_tokenizer_config_token(s->o.tokenizer, "bos_token");
  if (n >= 2 && bos >= 0 && ids[0] == bos && ids[1] == bos) {
    memmove(ids, ids + 1, (n - 1) * sizeof *ids);
    n--;
  }
  job->prompt = ids;
  job->n_prompt = (int)n;
  return ci_srv_forced_call_after_thinking(s, job, err);
}

/* ==== Submission ==== */

/* The HTTP status and error code of a failed submission. */
static const char *submit_error(cinfer_status status, int *http) {
  switch (status) {
  case CINFER_CONTEXT_EXCEEDED:
    return *http = 400, "context_length_exceeded";
  case CINFER_OVER_BUDGET:
    return *http = 400, "context_over_budget";
  case CINFER_QUEUE_FULL:
    return *http = 429, "overloaded";
  case CINFER_STOPPED:
  case CINFER_ERROR:
    return *http = 503, "overloaded";
  default:
    break;
  }
  return *http = 400, "invalid_value";
}

int ci_srv_gen_start(ci_server *s, ci_srv_job *job, ci_srv_gen *g, int anthropic, json_t **body) {
  return ci_srv_gen_start_n(s, job, g, 1, anthropic, body);
}

int ci_srv_gen_start_n(ci_server *s, ci_srv_job *job, ci_srv_gen *gens, int n, int anthropic,
                       json_t **body) {
  cinfer_request *reqs[CI_SRV_MAX_CHOICES];
  if (n < 1 || n > CI_SRV_MAX_CHOICES) {
    *body = ci_server_error_body(anthropic, 400, "invalid_value", "n is out of range");
    return 400;
  }
  const double t_start = ci_now_seconds();
  for (int i = 0; i < n; i++) {
    memset(&gens[i], 0, sizeof gens[i]);
    gens[i].srv = s;
    gens[i].t_start = t_start;
  }
  /* stop_token_ids finish like EOS ("stop"); so do the chat format's stop tokens, unless EOS is
     ignored */
  cinfer_params params = job->params;
  if (!params.ignore_eos && !job->raw_text)
    for (int i = 0; i < s->n_chat_stop_ids && job->n_stop_ids < CI_SRV_MAX_STOP_IDS; i++)
      job->stop_ids[job->n_stop_ids++] = s->chat_stop_ids[i];
  params.stop_token_ids = job->stop_ids;
  params.n_stop_token_ids = (size_t)job->n_stop_ids;
  params.top_logprobs = job->top_logprobs;
  params.grammar = job->grammar; /* structured output and forced tool calls */
  /* a max_tokens past the context's room is cut to it (the answer then ends with "length"), as
     clients send large defaults; a prompt that does not fit is still an error */
  const int ctx = cinfer_engine_context_size(s->o.engine);
  if (job->n_prompt < ctx && params.max_tokens > ctx - job->n_prompt)
    params.max_tokens = ctx - job->n_prompt;
  params.grammar_root = job->grammar_root;
  const cinfer_status status =
      cinfer_engine_submit_n(s->o.engine, job->prompt, (size_t)job->n_prompt, &params, n, reqs);
  if (status != CINFER_OK) {
    int http;
    const char *code = submit_error(status, &http);
    *body = ci_server_error_body(anthropic, http, code, cinfer_last_error());
    return http;
  }
  for (int i = 0; i < n; i++) {
    gens[i].req = reqs[i];
    ci_srv_gen_init_text(s, job, &gens[i]);
    gens[i].client_fd = job->client_fd;
  }
  return 0;
}

/* Ends the generation with an error (the response reports `message`); the engine stops the
 * request at its next boundary. */
static void fail_generation(ci_srv_gen *g, const char *message) {
  snprintf(g->error, sizeof g->error, "%s", message);
  g->failed = 1;
  g->done = 1;
  g->finish = "error";
  if (g->req) cinfer_request_cancel(g->req);
}

void ci_srv_gen_init_text(ci_server *s, ci_srv_job *job, ci_srv_gen *g) {
  g->srv = s;
  if (g->t_start == 0) g->t_start = ci_now_seconds();
  char *tools_json = job->tools ? json_dumps(job->tools, JSON_COMPACT) : NULL;
  const cinfer_chat_output_options options = {.stop = (const char *const *)job->stop,
                                              .n_stop = (size_t)job->n_stop,
                                              .tools_json = tools_json,
                                              .tools_off = job->tools_off,
                                              .raw_text = job->raw_text,
                                              .hermes_tool_calls = job->forced_tool_call,
                                              .prompt = job->rendered,
                                              .prompt_len = job->rendered_len};
  const int failed = (job->tools && !tools_json) ||
                     cinfer_chat_output_create(s->o.chat_format, &options, &g->text) != CINFER_OK;
  free(tools_json);
  g->want_logprobs = job->logprobs;
  g->top_logprobs = job->top_logprobs;
  g->d_calls = json_array();
  g->calls = json_array();
  g->d_logprobs = json_array();
  g->logprobs = json_array();
  g->prompt_tokens = job->n_prompt;
  /* a stage that could not be created fails the generation before any event is applied */
  if (failed || !g->d_calls || !g->calls || !g->d_logprobs || !g->logprobs)
    fail_generation(g, "out of memory");
}

/* ==== The text pipeline ==== */

void ci_server_detect_formats(ci_server *s) {
  s->n_chat_stop_ids = (int)cinfer_chat_format_stop_tokens(
      s->o.chat_format, s->chat_stop_ids, sizeof s->chat_stop_ids / sizeof s->chat_stop_ids[0]);
  if (s->n_chat_stop_ids > (int)(sizeof s->chat_stop_ids / sizeof s->chat_stop_ids[0]))
    s->n_chat_stop_ids = (int)(sizeof s->chat_stop_ids / sizeof s->chat_stop_ids[0]);
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

static void on_call(void *ctx, const char *call_json) {
  ci_srv_gen *g = ctx;
  json_t *call = json_loads(call_json, 0, NULL);
  if (!call || json_array_append(g->d_calls, call) || json_array_append(g->calls, call))
    g->d_content.oom = 1; /* reported as out of memory below */
  json_decref(call);
}

static const cinfer_chat_output_sinks sinks = {on_content, on_reasoning, on_call};

/* Which stop string fired, as the parser matched it. */
static void find_stop_sequence(ci_srv_gen *g) {
  const char *fired = cinfer_chat_output_stop_string(g->text);
  if (fired && !(g->stop_sequence = strdup(fired))) fail_generation(g, "out of memory");
}

static json_t *token_logprob(const ci_srv_gen *g, int32_t id, float logprob) {
  char *text = NULL;
  size_t len = 0;
  if (cinfer_tokenizer_decode(g->srv->o.tokenizer, &id, 1, 0, &text, &len) != CINFER_OK)
    text = NULL, len = 0;
  json_t *bytes = json_array();
  int lost = !bytes;
  for (size_t i = 0; i < len && !lost; i++)
    lost = json_array_append_new(bytes, json_integer((unsigned char)text[i]));
  json_t *token = json_stringn(text ? text : "", len);
  if (!token) token = json_string(""); /* a lone byte of a multi-byte character */
  cinfer_free(text);
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

/* End of the answer: flushes the parser (its held text may still complete a stop string). */
static void finish(ci_srv_gen *g, const char *reason) {
  const cinfer_status status = g->text ? cinfer_chat_output_finish(g->text, &sinks, g) : CINFER_OK;
  if (status == CINFER_DONE && !g->stopped_by_string) {
    g->stopped_by_string = 1;
    find_stop_sequence(g);
    reason = "stop";
  }
  if (g->text) g->reasoning_tokens = cinfer_chat_output_reasoning_tokens(g->text);
  g->done = 1;
  g->finish = json_array_size(g->calls) > 0 ? "tool_calls" : reason;
  if (!g->engine_timings) { /* measured here: queue and prefill together */
    g->prefill_s = g->t_first > 0 ? g->t_first - g->t_start : 0;
    g->decode_s = g->t_first > 0 ? g->t_prev - g->t_first : 0;
  }
  if (text_lost(g)) fail_generation(g, "out of memory");
}

/* Whether the client closed its connection (an orderly close or a reset socket). */
static int client_gone(int fd) {
  char byte;
  const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return 1;
  return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

int ci_srv_gen_run_to_end(ci_srv_gen *g, int anthropic, json_t **out) {
  while (!g->done) ci_srv_gen_pump(g, -1);
  if (!g->failed) return 200;
  *out = ci_server_error_body(anthropic, 500, "internal_error", g->error);
  return 500;
}

int ci_srv_gen_pump(ci_srv_gen *g, double timeout_s) {
  if (g->done) return 0;
  cinfer_event ev;
  /* with a watched client, wait in slices and look at its socket at least every slice (tokens
     may keep arriving): a client that went away cancels the request (the engine drops it at its
     next step) */
  const double slice = 0.1, end = ci_now_seconds() + timeout_s;
  for (;;) {
    double wait = timeout_s;
    if (g->client_fd > 0) {
      const double now = ci_now_seconds(), left = end - now;
      if (now - g->client_checked >= slice) {
        g->client_checked = now;
        if (client_gone(g->client_fd)) {
          fail_generation(g, "the client disconnected");
          return 1;
        }
      }
      wait = timeout_s < 0 || left > slice ? slice : left > 0 ? left : 0;
    }
    const cinfer_status st = cinfer_request_next(g->req, &ev, wait);
    if (st == CINFER_OK) break;
    if (st != CINFER_TIMEOUT || g->client_fd <= 0) return 0;
    if (timeout_s >= 0 && ci_now_seconds() >= end) return 0;
  }
  ci_srv_gen_apply(g, &ev, ci_now_seconds());
  return 1;
}

void ci_srv_gen_apply(ci_srv_gen *g, const cinfer_event *ev, double now) {
  if (g->done) return;
  if (ev->kind == CINFER_EVENT_ERROR) {
    fail_generation(g, ev->message);
    return;
  }
  if (ev->kind == CINFER_EVENT_DONE) {
    g->completion_tokens = ev->generated_tokens;
    g->cached_tokens = ev->cached_tokens;
    g->draft_tokens = ev->draft_tokens;
    g->accepted_tokens = ev->accepted_tokens;
    g->engine_timings = 1;
    g->queue_s = ev->queue_seconds;
    g->prefill_s = ev->prefill_seconds;
    g->decode_s = ev->decode_seconds;
    g->eos_stop = ev->finish == CINFER_FINISH_STOP;
    finish(g, ev->finish == CINFER_FINISH_LENGTH ? "length" : "stop");
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
  const cinfer_status status = cinfer_chat_output_push(g->text, ev->token, &sinks, g);
  if (status != CINFER_OK && status != CINFER_DONE) {
    fail_generation(g, cinfer_last_error());
    return;
  }
  if (text_lost(g)) {
    fail_generation(g, "out of memory");
    return;
  }
  const int stopped = status == CINFER_DONE;
  if (g->want_logprobs) {
    json_t *entry = token_logprob(g, ev->token, ev->logprob);
    json_t *top = json_array();
    int lost = !entry || !top;
    for (int i = 0; i < ev->n_top && !lost; i++)
      lost = json_array_append_new(top, token_logprob(g, ev->top_ids[i], ev->top_logprobs[i]));
    if (!lost)
      lost = json_object_set_new(entry, "top_logprobs", top);
    else
      json_decref(top);
    if (!lost && !stopped)
      lost = json_array_append(g->d_logprobs, entry) || json_array_append(g->logprobs, entry);
    json_decref(entry);
    if (lost) {
      fail_generation(g, "out of memory");
      return;
    }
  }
  if (stopped) { /* a stop string completed: the engine stops at its next boundary */
    if (g->req) cinfer_request_cancel(g->req);
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
  /* speculative decoding: tokens drafted, accepted, and the acceptance rate (0 when none) */
  const double acceptance = g->draft_tokens > 0 ? (double)g->accepted_tokens / g->draft_tokens : 0;
  return json_pack("{s:i, s:f, s:f, s:i, s:f, s:f, s:i, s:i, s:i, s:f}", "prompt_n", prompt_n,
                   "prompt_ms", g->prefill_s * 1e3, "prompt_per_second", prompt_rate, "predicted_n",
                   predicted_n, "predicted_ms", g->decode_s * 1e3, "predicted_per_second",
                   decode_rate, "cache_n", g->cached_tokens, "draft_n", g->draft_tokens,
                   "draft_accepted_n", g->accepted_tokens, "draft_acceptance_rate", acceptance);
}

void ci_srv_gen_clear_deltas(ci_srv_gen *g) {
  g->d_content.len = 0;
  g->d_reasoning.len = 0;
  json_array_clear(g->d_calls);
  json_array_clear(g->d_logprobs);
}

void ci_srv_gen_free(ci_srv_gen *g) {
  cinfer_request_free(g->req);
  cinfer_chat_output_free(g->text);
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
