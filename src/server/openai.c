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

static json_t *usage_json(const ci_srv_gen *g) {
  return json_pack("{s:i, s:i, s:i, s:{s:i}, s:{s:i}}", "prompt_tokens", g->prompt_tokens,
                   "completion_tokens", g->completion_tokens, "total_tokens",
                   g->prompt_tokens + g->completion_tokens, "prompt_tokens_details",
                   "cached_tokens", g->cached_tokens, "completion_tokens_details",
                   "reasoning_tokens", g->reasoning_tokens);
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

static json_t *chat_response(const ci_srv_gen *g, const char *id, long long created,
                             const char *model) {
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
  return json_pack("{s:s, s:s, s:I, s:s, s:s, s:[{s:i, s:o, s:o, s:s}], s:o, s:o}", "id", id,
                   "object", "chat.completion", "created", (json_int_t)created, "model", model,
                   "system_fingerprint", fingerprint, "choices", "index", 0, "message", message,
                   "logprobs", logprobs, "finish_reason", g->finish, "usage", usage_json(g),
                   "timings", ci_srv_gen_timings(g));
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

static void stream_error(ci_srv_stream *st) {
  json_t *e = json_pack("{s:{s:s, s:s, s:s}}", "error", "message", st->gen.error, "type",
                        "server_error", "code", "internal_error");
  sse_json(st, e);
  st->finished = 1;
}

/* Final frames: finish chunk (+ usage), optional usage chunk, [DONE]. */
static void stream_finish(ci_srv_stream *st, int chat) {
  const char *object = chat ? "chat.completion.chunk" : "text_completion";
  json_t *choice = chat ? json_pack("{s:i, s:{}, s:n, s:s}", "index", 0, "delta", "logprobs",
                                    "finish_reason", st->gen.finish)
                        : json_pack("{s:i, s:s, s:n, s:s}", "index", 0, "text", "", "logprobs",
                                    "finish_reason", st->gen.finish);
  json_t *c = chunk(st, object, choice);
  if (!st->include_usage) json_object_set_new(c, "usage", usage_json(&st->gen));
  json_object_set_new(c, "timings", ci_srv_gen_timings(&st->gen));
  sse_json(st, c);
  if (st->include_usage) {
    c = chunk(st, object, NULL);
    json_object_set_new(c, "usage", usage_json(&st->gen));
    sse_json(st, c);
  }
  ci_strbuf_append(&st->out, "data: [DONE]\n\n", 14);
  st->finished = 1;
}

static void produce_chat(ci_srv_stream *st) {
  ci_srv_gen *g = &st->gen;
  if (st->phase == 0) {
    st->phase = 1;
    sse_json(st, chunk(st, "chat.completion.chunk",
                       json_pack("{s:i, s:{s:s, s:s}, s:n, s:n}", "index", 0, "delta", "role",
                                 "assistant", "content", "", "logprobs", "finish_reason")));
    return;
  }
  if (!g->done && !ci_srv_gen_pump(g, 15.0)) {
    ci_strbuf_append(&st->out, ": keep-alive\n\n", 14);
    return;
  }
  if (g->failed) {
    stream_error(st);
    return;
  }
  json_t *logprobs = g->want_logprobs && json_array_size(g->d_logprobs)
                         ? json_pack("{s:O}", "content", g->d_logprobs)
                         : json_null();
  if (g->d_reasoning.len)
    sse_json(
        st, chunk(st, "chat.completion.chunk",
                  json_pack("{s:i, s:{s:s%}, s:n, s:n}", "index", 0, "delta", "reasoning_content",
                            g->d_reasoning.data, g->d_reasoning.len, "logprobs", "finish_reason")));
  if (g->d_content.len || !json_is_null(logprobs))
    sse_json(st, chunk(st, "chat.completion.chunk",
                       json_pack("{s:i, s:{s:s%}, s:O, s:n}", "index", 0, "delta", "content",
                                 g->d_content.data ? g->d_content.data : "", g->d_content.len,
                                 "logprobs", logprobs, "finish_reason")));
  json_decref(logprobs);
  if (json_array_size(g->d_calls)) {
    const int base = (int)(json_array_size(g->calls) - json_array_size(g->d_calls));
    sse_json(st,
             chunk(st, "chat.completion.chunk",
                   json_pack("{s:i, s:{s:o}, s:n, s:n}", "index", 0, "delta", "tool_calls",
                             tool_calls_json(g->d_calls, 1, base), "logprobs", "finish_reason")));
  }
  ci_srv_gen_clear_deltas(g);
  if (g->done) stream_finish(st, 1);
}

static void produce_completion(ci_srv_stream *st) {
  ci_srv_gen *g = &st->gen;
  if (!g->done && !ci_srv_gen_pump(g, 15.0)) {
    ci_strbuf_append(&st->out, ": keep-alive\n\n", 14);
    return;
  }
  if (g->failed) {
    stream_error(st);
    return;
  }
  if (g->d_content.len || json_array_size(g->d_logprobs))
    sse_json(st, chunk(st, "text_completion",
                       json_pack("{s:i, s:s%, s:o, s:n}", "index", 0, "text",
                                 g->d_content.data ? g->d_content.data : "", g->d_content.len,
                                 "logprobs",
                                 g->want_logprobs ? legacy_logprobs(g->d_logprobs, &st->text_offset)
                                                  : json_null(),
                                 "finish_reason")));
  ci_srv_gen_clear_deltas(g);
  if (g->done) stream_finish(st, 0);
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
  ci_srv_stream *st = calloc(1, sizeof *st);
  if (!st) {
    ci_srv_job_free(job);
    *out = ci_server_error_body(kind == 2, 500, "internal_error", "out of memory");
    return 500;
  }
  const int status = ci_srv_gen_start(s, job, &st->gen, kind == 2, out);
  if (!status && job->echo) { /* completions echo: the prompt leads the text (and the 1st delta) */
    ci_strbuf_append(&st->gen.content, job->echo, strlen(job->echo));
    ci_strbuf_append(&st->gen.d_content, job->echo, strlen(job->echo));
  }
  ci_srv_job_free(job);
  if (status) {
    free(st);
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
  int code = ci_srv_gen_run_to_end(&st->gen, 0, out);
  if (code == 200) {
    if (kind == 0) {
      *out = chat_response(&st->gen, st->id, st->created, s->o.model_id);
    } else {
      long offset = 0;
      *out = json_pack(
          "{s:s, s:s, s:I, s:s, s:s, s:[{s:i, s:s%, s:o, s:s}], s:o, s:o}", "id", st->id, "object",
          "text_completion", "created", (json_int_t)st->created, "model", s->o.model_id,
          "system_fingerprint", fingerprint, "choices", "index", 0, "text",
          st->gen.content.data ? st->gen.content.data : "", st->gen.content.len, "logprobs",
          st->gen.want_logprobs ? legacy_logprobs(st->gen.logprobs, &offset) : json_null(),
          "finish_reason", st->gen.finish, "usage", usage_json(&st->gen), "timings",
          ci_srv_gen_timings(&st->gen));
    }
  }
  ci_srv_stream_free(st);
  return code;
}

/* Common OpenAI checks: n, logprobs (response_format: ci_srv_parse_structured). */
static int check_common(const json_t *body, ci_srv_job *job, int chat, char **err) {
  const json_t *n = json_object_get(body, "n");
  if (n && !json_is_null(n) && (!json_is_integer(n) || json_integer_value(n) != 1))
    return *err = strdup("n > 1 is not supported"), -1;
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
      check_common(body, &job, 1, &err) || check_tools(tools, &err) ||
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
      check_common(body, &job, 0, &err) || ci_srv_parse_sampling(s, body, 0, &job, 512, &err)) {
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
  if (json_string_length(json_object_get(body, "suffix")) > 0 ||
      (json_is_integer(json_object_get(body, "best_of")) &&
       json_integer_value(json_object_get(body, "best_of")) > 1)) {
    ci_srv_job_free(&job);
    return bad(out, "unsupported", strdup("suffix and best_of > 1 are not supported"));
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
  ci_strbuf_free(&st->out);
  if (st->ext_free) st->ext_free(st->ext);
  free(st);
}
