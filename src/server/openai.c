/* OpenAI routes (docs/server.md "Routes"): /v1/chat/completions, /v1/completions and /v1/models —
 * request validation into a job, the non-streaming JSON and the SSE chunk grammar. */
#include "server/server.h"

#include "base/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char fingerprint[] = "cinfer-0.1";

static int bad(json_t **out, const char *code, char *msg /* freed */) {
  if (!msg) { /* every parse error comes with a message: none means it could not be copied */
    *out = ci_server_error_body(0, 500, "internal_error", "out of memory");
    return 500;
  }
  *out = ci_server_error_body(0, 400, code, msg);
  free(msg);
  return 400;
}

/* ==== Messages ==== */

/* A message's content as one string: string, null (""), or text parts joined with \n. */
static int content_text(const json_t *content, int anthropic, ci_strbuf *out, char **err) {
  if (!content || json_is_null(content)) return 0;
  if (json_is_string(content)) {
    ci_strbuf_append(out, json_string_value(content), json_string_length(content));
    return 0;
  }
  if (!json_is_array(content))
    return *err = strdup("message content must be a string or an array of parts"), -1;
  size_t i;
  json_t *part;
  int first = 1;
  json_array_foreach(content, i, part) {
    const char *type = json_string_value(json_object_get(part, "type"));
    const json_t *text = json_object_get(part, "text");
    if (!type) return *err = strdup("each content part must be an object with a type"), -1;
    if (!strcmp(type, "text") || !strcmp(type, "input_text")) {
      if (!json_is_string(text)) return *err = strdup("a text part needs a string text"), -1;
      if (!first) ci_strbuf_append(out, "\n", 1);
      ci_strbuf_append(out, json_string_value(text), json_string_length(text));
      first = 0;
    } else if (anthropic && (!strcmp(type, "thinking") || !strcmp(type, "redacted_thinking"))) {
      continue;
    } else {
      char buf[160];
      snprintf(buf, sizeof buf, "content parts of type '%.64s' are not supported", type);
      return *err = strdup(buf), -1;
    }
  }
  return 0;
}

/* OpenAI messages -> template messages (docs/server.md "Chat requests"). */
static json_t *normalize_messages(const json_t *messages, char **err) {
  if (!json_is_array(messages) || json_array_size(messages) == 0)
    return *err = strdup("messages must be a non-empty array"), NULL;
  static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
  json_t *out = json_array();
  size_t i;
  json_t *m;
  json_array_foreach(messages, i, m) {
    const char *role = json_string_value(json_object_get(m, "role"));
    int known = 0;
    for (size_t r = 0; role && r < sizeof roles / sizeof roles[0]; r++)
      known |= !strcmp(role, roles[r]);
    if (!json_is_object(m) || !known) {
      json_decref(out);
      char buf[200];
      snprintf(buf, sizeof buf,
               "messages[%zu].role must be one of system, developer, user, assistant, tool", i);
      return *err = strdup(buf), NULL;
    }
    ci_strbuf text = {0};
    if (content_text(json_object_get(m, "content"), 0, &text, err)) {
      ci_strbuf_free(&text);
      json_decref(out);
      return NULL;
    }
    json_t *copy = json_pack("{s:s, s:s%}", "role", !strcmp(role, "developer") ? "system" : role,
                             "content", text.data ? text.data : "", text.len);
    ci_strbuf_free(&text);
    const json_t *calls = json_object_get(m, "tool_calls");
    if (json_is_array(calls)) {
      json_t *calls_copy = json_deep_copy(calls);
      size_t c;
      json_t *call;
      json_array_foreach(calls_copy, c, call) {
        json_t *fn = json_object_get(call, "function");
        const char *args = json_string_value(json_object_get(fn, "arguments"));
        json_t *parsed = args ? json_loads(args, 0, NULL) : NULL;
        if (parsed) json_object_set_new(fn, "arguments", parsed);
      }
      json_object_set_new(copy, "tool_calls", calls_copy);
    }
    const char *keep[] = {"tool_call_id", "name", "reasoning_content"};
    for (size_t k = 0; k < 3; k++) {
      json_t *v = json_object_get(m, keep[k]);
      if (json_is_string(v)) json_object_set(copy, keep[k], v);
    }
    json_array_append_new(out, copy);
  }
  return out;
}

/* Validates tools: an array of {type:"function", function:{name, ...}}. */
static int check_tools(const json_t *tools, char **err) {
  if (!tools || json_is_null(tools)) return 0;
  if (!json_is_array(tools)) return *err = strdup("tools must be an array"), -1;
  size_t i;
  json_t *t;
  json_array_foreach(tools, i, t) {
    const json_t *fn = json_object_get(t, "function");
    if (!json_is_object(fn) || !json_is_string(json_object_get(fn, "name")))
      return *err = strdup("each tool must be {type: \"function\", function: {name, ...}}"), -1;
  }
  return 0;
}

/* ==== Responses ==== */

/* Choice i of a stream (0: st->gen) and how many there are. */
static ci_srv_gen *choice_gen(ci_srv_stream *st, int i) {
  return i == 0 ? &st->gen : &st->more[i - 1];
}

static int n_choices(const ci_srv_stream *st) {
  return 1 + st->n_more;
}

/* Usage over every choice: the prompt once (the choices share its prefill), the completions
 * summed. */
static json_t *usage_json(ci_srv_stream *st) {
  const ci_srv_gen *g = &st->gen;
  int completion = 0, reasoning = 0;
  for (int i = 0; i < n_choices(st); i++) {
    completion += choice_gen(st, i)->completion_tokens;
    reasoning += choice_gen(st, i)->reasoning_tokens;
  }
  return json_pack("{s:i, s:i, s:i, s:{s:i}, s:{s:i}}", "prompt_tokens", g->prompt_tokens,
                   "completion_tokens", completion, "total_tokens", g->prompt_tokens + completion,
                   "prompt_tokens_details", "cached_tokens", g->cached_tokens,
                   "completion_tokens_details", "reasoning_tokens", reasoning);
}

/* Number of UTF-8 code points in s[0..n) (text_offset counts characters, as Python does). */
static long utf8_chars(const char *s, size_t n) {
  long chars = 0;
  for (size_t i = 0; i < n; i++) chars += ((unsigned char)s[i] & 0xC0) != 0x80;
  return chars;
}

/* The legacy /v1/completions logprobs object (docs/server.md "Completions") of the given token
 * entries (the chat entries ci_srv_gen keeps); *offset is the text offset of the first one and
 * advances. */
static json_t *legacy_logprobs(const json_t *entries, long *offset) {
  json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offsets = json_array();
  size_t i;
  json_t *e;
  json_array_foreach(entries, i, e) {
    const json_t *token = json_object_get(e, "token");
    json_array_append(tokens, (json_t *)token);
    json_array_append(lps, json_object_get(e, "logprob"));
    json_t *top = json_object();
    size_t k;
    json_t *alt;
    json_array_foreach(json_object_get(e, "top_logprobs"), k, alt) {
      const char *text = json_string_value(json_object_get(alt, "token"));
      if (text && !json_object_get(top, text))
        json_object_set(top, text, json_object_get(alt, "logprob"));
    }
    json_array_append_new(tops, top);
    json_array_append_new(offsets, json_integer(*offset));
    *offset += utf8_chars(json_string_value(token), json_string_length(token));
  }
  return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs",
                   tops, "text_offset", offsets);
}

static json_t *tool_calls_json(const json_t *calls, int with_index, int base) {
  json_t *out = json_array();
  size_t i;
  json_t *c;
  json_array_foreach(calls, i, c) {
    char id[48];
    ci_server_new_id("call_", id, sizeof id);
    json_t *entry =
        json_pack("{s:s, s:s, s:{s:O, s:O}}", "id", id, "type", "function", "function", "name",
                  json_object_get(c, "name"), "arguments", json_object_get(c, "arguments"));
    if (with_index) json_object_set_new(entry, "index", json_integer(base + (int)i));
    json_array_append_new(out, entry);
  }
  return out;
}

/* One choice of a chat.completion. */
static json_t *chat_choice(const ci_srv_gen *g, int index) {
  json_t *message = json_pack("{s:s}", "role", "assistant");
  const int has_calls = json_array_size(g->calls) > 0;
  json_object_set_new(message, "content",
                      has_calls && g->content.len == 0
                          ? json_null()
                          : json_stringn(g->content.data ? g->content.data : "", g->content.len));
  if (g->reasoning.len)
    json_object_set_new(message, "reasoning_content",
                        json_stringn(g->reasoning.data, g->reasoning.len));
  if (has_calls) json_object_set_new(message, "tool_calls", tool_calls_json(g->calls, 0, 0));
  json_t *logprobs = g->want_logprobs ? json_pack("{s:O}", "content", g->logprobs) : json_null();
  return json_pack("{s:i, s:o, s:o, s:s}", "index", index, "message", message, "logprobs", logprobs,
                   "finish_reason", g->finish);
}

/* One choice of a text_completion. */
static json_t *completion_choice(const ci_srv_gen *g, int index) {
  long offset = 0;
  return json_pack("{s:i, s:s%, s:o, s:s}", "index", index, "text",
                   g->content.data ? g->content.data : "", g->content.len, "logprobs",
                   g->want_logprobs ? legacy_logprobs(g->logprobs, &offset) : json_null(),
                   "finish_reason", g->finish);
}

/* The non-streaming answer of a finished chat (kind 0) or completion (1): every choice, usage,
 * and the first choice's timings. */
static json_t *full_response(ci_srv_stream *st, int chat, const char *model) {
  json_t *choices = json_array();
  for (int i = 0; i < n_choices(st) && choices; i++)
    if (json_array_append_new(choices, chat ? chat_choice(choice_gen(st, i), i)
                                            : completion_choice(choice_gen(st, i), i))) {
      json_decref(choices);
      choices = NULL;
    }
  if (!choices) return NULL;
  return json_pack("{s:s, s:s, s:I, s:s, s:s, s:o, s:o, s:o}", "id", st->id, "object",
                   chat ? "chat.completion" : "text_completion", "created", (json_int_t)st->created,
                   "model", model, "system_fingerprint", fingerprint, "choices", choices, "usage",
                   usage_json(st), "timings", ci_srv_gen_timings(&st->gen));
}

/* ==== SSE ==== */

static void sse_json(ci_srv_stream *st, json_t *obj /* stolen */) {
  char *text = json_dumps(obj, JSON_COMPACT);
  json_decref(obj);
  if (!text) return;
  ci_strbuf_appendf(&st->out, "data: %s\n\n", text);
  free(text);
}

static json_t *chunk(ci_srv_stream *st, const char *object, json_t *choice /* stolen, or NULL */) {
  json_t *c = json_pack("{s:s, s:s, s:I, s:s, s:s, s:[]}", "id", st->id, "object", object,
                        "created", (json_int_t)st->created, "model", st->gen.srv->o.model_id,
                        "system_fingerprint", fingerprint, "choices");
  if (choice) json_array_append_new(json_object_get(c, "choices"), choice);
  return c;
}

static void stream_error(ci_srv_stream *st, const ci_srv_gen *g) {
  json_t *e = json_pack("{s:{s:s, s:s, s:s}}", "error", "message", g->error, "type", "server_error",
                        "code", "internal_error");
  sse_json(st, e);
  st->finished = 1;
}

/* The first choice that failed, or NULL. */
static const ci_srv_gen *failed_choice(ci_srv_stream *st) {
  for (int i = 0; i < n_choices(st); i++)
    if (choice_gen(st, i)->failed) return choice_gen(st, i);
  return NULL;
}

/* Waits up to timeout_s for the next event of the first unfinished choice, then takes the events
 * the other choices already have (the engine advances every choice in the same steps). Returns 1
 * when something happened. */
static int pump_choices(ci_srv_stream *st, double timeout_s) {
  int got = 0, waited = 0;
  for (int i = 0; i < n_choices(st); i++) {
    ci_srv_gen *g = choice_gen(st, i);
    if (g->done) continue;
    if (!waited) {
      waited = 1;
      got |= ci_srv_gen_pump(g, timeout_s);
    }
    for (int k = 0; k < 256 && !g->done && ci_srv_gen_pump(g, 0); k++) got = 1;
  }
  return got || !waited;
}

/* A choice's finish chunk; the last choice to finish carries the usage too (unless a usage
 * chunk follows: stream_options.include_usage). Then, once every choice is done, the usage chunk
 * and [DONE]. */
static void stream_finish(ci_srv_stream *st, int chat, int index) {
  const char *object = chat ? "chat.completion.chunk" : "text_completion";
  ci_srv_gen *g = choice_gen(st, index);
  st->closed[index] = 1;
  int open = 0;
  for (int i = 0; i < n_choices(st); i++) open += !st->closed[i];
  json_t *choice = chat ? json_pack("{s:i, s:{}, s:n, s:s}", "index", index, "delta", "logprobs",
                                    "finish_reason", g->finish)
                        : json_pack("{s:i, s:s, s:n, s:s}", "index", index, "text", "", "logprobs",
                                    "finish_reason", g->finish);
  json_t *c = chunk(st, object, choice);
  if (!st->include_usage && open == 0) json_object_set_new(c, "usage", usage_json(st));
  json_object_set_new(c, "timings", ci_srv_gen_timings(g));
  sse_json(st, c);
  if (open > 0) return;
  if (st->include_usage) {
    c = chunk(st, object, NULL);
    json_object_set_new(c, "usage", usage_json(st));
    sse_json(st, c);
  }
  ci_strbuf_append(&st->out, "data: [DONE]\n\n", 14);
  st->finished = 1;
}

/* The chunks of choice `index`'s new deltas (chat). */
static void chat_deltas(ci_srv_stream *st, int index) {
  ci_srv_gen *g = choice_gen(st, index);
  json_t *logprobs = g->want_logprobs && json_array_size(g->d_logprobs)
                         ? json_pack("{s:O}", "content", g->d_logprobs)
                         : json_null();
  if (g->d_reasoning.len)
    sse_json(st, chunk(st, "chat.completion.chunk",
                       json_pack("{s:i, s:{s:s%}, s:n, s:n}", "index", index, "delta",
                                 "reasoning_content", g->d_reasoning.data, g->d_reasoning.len,
                                 "logprobs", "finish_reason")));
  if (g->d_content.len || !json_is_null(logprobs))
    sse_json(st, chunk(st, "chat.completion.chunk",
                       json_pack("{s:i, s:{s:s%}, s:O, s:n}", "index", index, "delta", "content",
                                 g->d_content.data ? g->d_content.data : "", g->d_content.len,
                                 "logprobs", logprobs, "finish_reason")));
  json_decref(logprobs);
  if (json_array_size(g->d_calls)) {
    const int base = (int)(json_array_size(g->calls) - json_array_size(g->d_calls));
    sse_json(st,
             chunk(st, "chat.completion.chunk",
                   json_pack("{s:i, s:{s:o}, s:n, s:n}", "index", index, "delta", "tool_calls",
                             tool_calls_json(g->d_calls, 1, base), "logprobs", "finish_reason")));
  }
  ci_srv_gen_clear_deltas(g);
}

/* The chunk of choice `index`'s new text (completions). */
static void completion_deltas(ci_srv_stream *st, int index) {
  ci_srv_gen *g = choice_gen(st, index);
  long *offset = index == 0 ? &st->text_offset : &st->more_offsets[index - 1];
  if (g->d_content.len || json_array_size(g->d_logprobs))
    sse_json(st, chunk(st, "text_completion",
                       json_pack(
                           "{s:i, s:s%, s:o, s:n}", "index", index, "text",
                           g->d_content.data ? g->d_content.data : "", g->d_content.len, "logprobs",
                           g->want_logprobs ? legacy_logprobs(g->d_logprobs, offset) : json_null(),
                           "finish_reason")));
  ci_srv_gen_clear_deltas(g);
}

/* One round of a chat (chat = 1) or completion stream: the next events of every choice as
 * chunks, each choice's finish chunk when it ends, keep-alive comments while nothing comes. */
static void produce_choices(ci_srv_stream *st, int chat) {
  if (chat && st->phase == 0) {
    st->phase = 1;
    for (int i = 0; i < n_choices(st); i++)
      sse_json(st, chunk(st, "chat.completion.chunk",
                         json_pack("{s:i, s:{s:s, s:s}, s:n, s:n}", "index", i, "delta", "role",
                                   "assistant", "content", "", "logprobs", "finish_reason")));
    return;
  }
  if (!pump_choices(st, 15.0)) {
    ci_strbuf_append(&st->out, ": keep-alive\n\n", 14);
    return;
  }
  const ci_srv_gen *failed = failed_choice(st);
  if (failed) { /* the client left, or a choice failed: the stream ends (the others with it) */
    stream_error(st, failed);
    return;
  }
  for (int i = 0; i < n_choices(st) && !st->finished; i++) {
    if (chat)
      chat_deltas(st, i);
    else
      completion_deltas(st, i);
    if (choice_gen(st, i)->done && !st->closed[i]) stream_finish(st, chat, i);
  }
}

static void produce_chat(ci_srv_stream *st) {
  produce_choices(st, 1);
}

static void produce_completion(ci_srv_stream *st) {
  produce_choices(st, 0);
}

/* ==== Routes ==== */

static int get_stream_flag(const json_t *body, int *stream, int *include_usage, char **err) {
  const json_t *s = json_object_get(body, "stream");
  if (s && !json_is_null(s) && !json_is_boolean(s))
    return *err = strdup("stream must be a boolean"), -1;
  *stream = json_is_true(s);
  const json_t *opts = json_object_get(body, "stream_options");
  *include_usage = json_is_true(json_object_get(opts, "include_usage"));
  return 0;
}

static int start_and_answer(ci_server *s, ci_srv_job *job, int kind, int stream, int include_usage,
                            json_t **out, ci_srv_stream **out_stream) {
  const int n = job->n_choices > 1 ? job->n_choices : 1;
  ci_srv_stream *st = calloc(1, sizeof *st);
  ci_srv_gen *gens = calloc((size_t)n, sizeof *gens);
  if (st) {
    st->closed = calloc((size_t)n, 1);
    st->more_offsets = calloc((size_t)n, sizeof *st->more_offsets);
  }
  if (!st || !gens || !st->closed || !st->more_offsets) {
    ci_srv_job_free(job);
    free(gens);
    ci_srv_stream_free(st);
    *out = ci_server_error_body(kind == 2, 500, "internal_error", "out of memory");
    return 500;
  }
  const int status = ci_srv_gen_start_n(s, job, gens, n, kind == 2, out);
  if (!status) {
    /* choice 0 lives in the stream itself, the others beside it */
    st->gen = gens[0];
    if (n > 1) {
      memmove(gens, gens + 1, (size_t)(n - 1) * sizeof *gens);
      st->more = gens;
      st->n_more = n - 1;
    } else {
      free(gens);
    }
    gens = NULL;
    for (int i = 0; i < n && job->echo; i++) { /* echo: the prompt leads the text (1st delta) */
      ci_strbuf_append(&choice_gen(st, i)->content, job->echo, strlen(job->echo));
      ci_strbuf_append(&choice_gen(st, i)->d_content, job->echo, strlen(job->echo));
    }
  }
  free(gens);
  ci_srv_job_free(job);
  if (status) {
    ci_srv_stream_free(st);
    return status;
  }
  st->kind = kind;
  st->include_usage = include_usage;
  st->created = (long long)time(NULL);
  ci_server_new_id(kind == 0 ? "chatcmpl-" : kind == 1 ? "cmpl-" : "msg_", st->id, sizeof st->id);
  if (stream) {
    st->produce = kind == 0 ? produce_chat : produce_completion;
    *out_stream = st;
    return 200;
  }
  int code = 200;
  for (int i = 0; i < n && code == 200; i++)
    code = ci_srv_gen_run_to_end(choice_gen(st, i), 0, out);
  if (code == 200 && !(*out = full_response(st, kind == 0, s->o.model_id))) {
    *out = ci_server_error_body(0, 500, "internal_error", "out of memory");
    code = 500;
  }
  ci_srv_stream_free(st);
  return code;
}

/* Common OpenAI checks: n, logprobs (response_format: ci_srv_parse_structured). */
static int check_common(ci_server *s, const json_t *body, ci_srv_job *job, int chat, char **err) {
  const json_t *n = json_object_get(body, "n");
  int max_n = cinfer_engine_max_batch(s->o.engine);
  if (max_n > CI_SRV_MAX_CHOICES) max_n = CI_SRV_MAX_CHOICES;
  if (n && !json_is_null(n) &&
      (!json_is_integer(n) || json_integer_value(n) < 1 || json_integer_value(n) > max_n)) {
    char buf[160];
    snprintf(buf, sizeof buf, "n must be an integer between 1 and %d (the server's --batch)",
             max_n);
    return *err = strdup(buf), -1;
  }
  job->n_choices = n && json_is_integer(n) ? (int)json_integer_value(n) : 1;
  const json_t *lp = json_object_get(body, "logprobs");
  if (chat) {
    if (lp && !json_is_null(lp) && !json_is_boolean(lp))
      return *err = strdup("logprobs must be a boolean"), -1;
    job->logprobs = json_is_true(lp);
    const json_t *top = json_object_get(body, "top_logprobs");
    if (top && !json_is_null(top)) {
      if (!json_is_integer(top) || json_integer_value(top) < 0 || json_integer_value(top) > 20)
        return *err = strdup("top_logprobs must be an integer between 0 and 20"), -1;
      if (!job->logprobs) return *err = strdup("top_logprobs needs logprobs: true"), -1;
      job->top_logprobs = (int)json_integer_value(top);
    }
  } else if (lp && !json_is_null(lp)) {
    if (!json_is_integer(lp) || json_integer_value(lp) < 0 || json_integer_value(lp) > 20)
      return *err = strdup("logprobs must be an integer between 0 and 20"), -1;
    job->logprobs = 1; /* the legacy shape, with k alternatives per token */
    job->top_logprobs = (int)json_integer_value(lp);
  }
  return 0;
}

int ci_openai_chat(ci_server *s, json_t *body, json_t **out, ci_srv_stream **stream,
                   int client_fd) {
  char *err = NULL;
  ci_srv_job job;
  memset(&job, 0, sizeof job);
  job.client_fd = client_fd;
  int do_stream, include_usage;
  json_t *messages = NULL;
  const json_t *tools = json_object_get(body, "tools");
  const json_t *choice = json_object_get(body, "tool_choice");
  const int tools_off = json_is_string(choice) && !strcmp(json_string_value(choice), "none");
  if (choice && !json_is_null(choice) && !json_is_string(choice) && !json_is_object(choice))
    err = strdup("tool_choice must be a string or an object");
  const json_t *kwargs = json_object_get(body, "chat_template_kwargs");
  if (!err && kwargs && !json_is_null(kwargs) && !json_is_object(kwargs))
    err = strdup("chat_template_kwargs must be an object");
  if (err || get_stream_flag(body, &do_stream, &include_usage, &err) ||
      check_common(s, body, &job, 1, &err) || check_tools(tools, &err) ||
      !(messages = normalize_messages(json_object_get(body, "messages"), &err)) ||
      ci_srv_parse_sampling(s, body, 0, &job, 65536, &err) ||
      ci_srv_parse_tool_choice(s, tools, choice, &job, &err) ||
      (job.tools_off = tools_off,
       ci_srv_tokenize_chat(s, messages, tools_off ? NULL : (json_t *)tools, kwargs, &job, &err))) {
    const char *code = job.err_code ? job.err_code : "invalid_value";
    json_decref(messages);
    ci_srv_job_free(&job);
    return bad(out, code, err);
  }
  json_decref(messages);
  if (!tools_off && json_array_size(tools) > 0) job.tools = json_incref((json_t *)tools);
  return start_and_answer(s, &job, 0, do_stream, include_usage, out, stream);
}

int ci_openai_completions(ci_server *s, json_t *body, json_t **out, ci_srv_stream **stream,
                          int client_fd) {
  char *err = NULL;
  ci_srv_job job;
  memset(&job, 0, sizeof job);
  job.client_fd = client_fd;
  int do_stream, include_usage;
  if (get_stream_flag(body, &do_stream, &include_usage, &err) ||
      check_common(s, body, &job, 0, &err) || ci_srv_parse_sampling(s, body, 0, &job, 512, &err)) {
    const char *code = job.err_code ? job.err_code : "invalid_value";
    ci_srv_job_free(&job);
    return bad(out, code, err);
  }
  job.raw_text = 1; /* no template, no tool or reasoning parsing (docs/server.md "Completions") */
  const json_t *echo = json_object_get(body, "echo");
  if (echo && !json_is_null(echo) && !json_is_boolean(echo)) {
    ci_srv_job_free(&job);
    return bad(out, "invalid_value", strdup("echo must be a boolean"));
  }
  if (json_is_true(echo) && job.logprobs) {
    ci_srv_job_free(&job);
    return bad(out, "unsupported",
               strdup("echo with logprobs is not supported (no prompt "
                      "logprobs)"));
  }
  const json_t *suffix = json_object_get(body, "suffix");
  if (suffix && !json_is_null(suffix) && !json_is_string(suffix)) {
    ci_srv_job_free(&job);
    return bad(out, "invalid_value", strdup("suffix must be a string"));
  }
  const json_t *best_of = json_object_get(body, "best_of");
  if (best_of && !json_is_null(best_of) &&
      (!json_is_integer(best_of) || json_integer_value(best_of) != 1)) {
    ci_srv_job_free(&job);
    return bad(out, "unsupported",
               strdup("best_of other than 1 is not supported (n > 1 returns every choice)"));
  }
  json_t *prompt = json_object_get(body, "prompt");
  if (json_is_array(prompt) && json_array_size(prompt) == 1 &&
      (json_is_string(json_array_get(prompt, 0)) || json_is_array(json_array_get(prompt, 0))))
    prompt = json_array_get(prompt, 0);
  if (json_is_string(prompt)) {
    size_t n = 0;
    if (cinfer_tokenizer_encode(s->o.tokenizer, json_string_value(prompt),
                                json_string_length(prompt), 1, &job.prompt, &n) != CINFER_OK ||
        n == 0) {
      ci_srv_job_free(&job);
      return bad(out, "invalid_value", strdup("prompt encodes to no tokens"));
    }
    job.n_prompt = (int)n;
  } else if (json_is_array(prompt) && json_array_size(prompt) > 0) {
    job.prompt = malloc(json_array_size(prompt) * sizeof *job.prompt);
    if (!job.prompt) {
      ci_srv_job_free(&job);
      return bad(out, "internal_error", NULL);
    }
    size_t i;
    json_t *v;
    json_array_foreach(prompt, i, v) {
      if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= s->o.vocab) {
        ci_srv_job_free(&job);
        return bad(out, "invalid_value",
                   strdup("prompt token ids must be integers below the "
                          "vocabulary size"));
      }
      job.prompt[job.n_prompt++] = (int32_t)json_integer_value(v);
    }
  } else {
    ci_srv_job_free(&job);
    return bad(out, "invalid_value",
               strdup("prompt must be a string, a token-id array, or a one-element array of "
                      "either"));
  }
  if (json_is_true(echo)) { /* the prompt's text, as given or decoded from its ids */
    char *text = NULL;
    size_t len = 0;
    if (json_is_string(prompt))
      job.echo = strdup(json_string_value(prompt));
    else if (cinfer_tokenizer_decode(s->o.tokenizer, job.prompt, (size_t)job.n_prompt, 0, &text,
                                     &len) == CINFER_OK)
      job.echo = strndup(text ? text : "", len);
    cinfer_free(text);
    if (!job.echo) {
      ci_srv_job_free(&job);
      return bad(out, "internal_error", NULL);
    }
  }
  if (json_string_length(suffix) > 0) { /* fill-in-the-middle: the prompt is the prefix */
    if (ci_srv_fim_prompt(s, json_string_value(prompt),
                          json_is_string(prompt) ? json_string_length(prompt) : 0,
                          json_string_value(suffix), json_string_length(suffix), &job, &err)) {
      ci_srv_job_free(&job);
      return bad(out, "unsupported", err);
    }
  }
  return start_and_answer(s, &job, 1, do_stream, include_usage, out, stream);
}

int ci_openai_models(ci_server *s, json_t **out) {
  *out =
      json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:i, s:i, s:b}]}", "object", "list", "data", "id",
                s->o.model_id, "object", "model", "created", (json_int_t)(long long)s->started_at,
                "owned_by", "cinfer", "context_window", cinfer_engine_context_size(s->o.engine),
                "max_position_embeddings", cinfer_model_context_length(s->o.model), "reasoning",
                cinfer_chat_format_has_reasoning(s->o.chat_format));
  return 200;
}

void ci_srv_stream_free(ci_srv_stream *st) {
  if (!st) return;
  ci_srv_gen_free(&st->gen);
  for (int i = 0; i < st->n_more; i++) ci_srv_gen_free(&st->more[i]);
  free(st->more);
  free(st->more_offsets);
  free(st->closed);
  ci_strbuf_free(&st->out);
  if (st->ext_free) st->ext_free(st->ext);
  free(st);
}
