/* Anthropic route (docs/server.md "Anthropic messages"): POST /v1/messages — system, content
 * blocks, tool_use and tool_result mapped onto chat messages; the message response and its SSE
 * event grammar. */
#include "server/server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int fail(char **err, const char *msg) {
  *err = strdup(msg);
  return -1;
}

/* Text of a string or an array of text blocks (others: error unless skippable). */
static int blocks_text(const json_t *content, ci_strbuf *out, char **err) {
  if (json_is_string(content)) {
    ci_strbuf_append(out, json_string_value(content), json_string_length(content));
    return 0;
  }
  if (!json_is_array(content)) return fail(err, "content must be a string or an array of blocks");
  size_t i;
  json_t *b;
  json_array_foreach(content, i, b) {
    const char *type = json_string_value(json_object_get(b, "type"));
    if (!type) return fail(err, "each content block needs a type");
    if (!strcmp(type, "text")) {
      const json_t *t = json_object_get(b, "text");
      if (!json_is_string(t)) return fail(err, "a text block needs a string text");
      if (out->len) ci_strbuf_append(out, "\n", 1);
      ci_strbuf_append(out, json_string_value(t), json_string_length(t));
    } else if (strcmp(type, "thinking") && strcmp(type, "redacted_thinking") &&
               strcmp(type, "tool_use") && strcmp(type, "tool_result")) {
      char buf[128];
      snprintf(buf, sizeof buf, "content blocks of type '%.48s' are not supported", type);
      return fail(err, buf);
    }
  }
  return 0;
}

/* Anthropic request -> OpenAI-style template messages. */
static json_t *map_messages(const json_t *body, char **err) {
  json_t *out = json_array();
  const json_t *system = json_object_get(body, "system");
  if (system && !json_is_null(system)) {
    ci_strbuf text = {0};
    if (blocks_text(system, &text, err)) goto bad_text;
    json_array_append_new(out, json_pack("{s:s, s:s%}", "role", "system", "content",
                                         text.data ? text.data : "", text.len));
    ci_strbuf_free(&text);
    if (0) {
    bad_text:
      ci_strbuf_free(&text);
      json_decref(out);
      return NULL;
    }
  }
  const json_t *messages = json_object_get(body, "messages");
  if (!json_is_array(messages) || json_array_size(messages) == 0) {
    json_decref(out);
    return fail(err, "messages must be a non-empty array"), NULL;
  }
  size_t i;
  json_t *m;
  json_array_foreach(messages, i, m) {
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!role || (strcmp(role, "user") && strcmp(role, "assistant"))) {
      json_decref(out);
      return fail(err, "messages[].role must be user or assistant"), NULL;
    }
    const json_t *content = json_object_get(m, "content");
    ci_strbuf text = {0};
    if (blocks_text(content, &text, err)) {
      ci_strbuf_free(&text);
      json_decref(out);
      return NULL;
    }
    json_t *calls = json_array();
    ci_strbuf reasoning = {0}; /* an assistant's thinking blocks: its reasoning_content */
    size_t k;
    json_t *b;
    if (json_is_array(content)) json_array_foreach(content, k, b) {
        const char *type = json_string_value(json_object_get(b, "type"));
        const json_t *thought = json_object_get(b, "thinking");
        if (!strcmp(type, "thinking") && !strcmp(role, "assistant") && json_is_string(thought)) {
          if (reasoning.len) ci_strbuf_append(&reasoning, "\n", 1);
          ci_strbuf_append(&reasoning, json_string_value(thought), json_string_length(thought));
        } else if (!strcmp(type, "tool_use")) {
          json_t *input = json_object_get(b, "input");
          json_array_append_new(calls, json_pack("{s:O?, s:s, s:{s:O?, s:O}}", "id",
                                                 json_object_get(b, "id"), "type", "function",
                                                 "function", "name", json_object_get(b, "name"),
                                                 "arguments", input ? input : json_object()));
        } else if (!strcmp(type, "tool_result")) {
          ci_strbuf result = {0};
          const json_t *rc = json_object_get(b, "content");
          if (rc && blocks_text(rc, &result, err)) {
            ci_strbuf_free(&result);
            ci_strbuf_free(&text);
            ci_strbuf_free(&reasoning);
            json_decref(calls);
            json_decref(out);
            return NULL;
          }
          json_array_append_new(out, json_pack("{s:s, s:s%, s:O?}", "role", "tool", "content",
                                               result.data ? result.data : "", result.len,
                                               "tool_call_id", json_object_get(b, "tool_use_id")));
          ci_strbuf_free(&result);
        }
      }
    if (text.len || json_array_size(calls) || !json_is_array(content)) {
      json_t *msg =
          json_pack("{s:s, s:s%}", "role", role, "content", text.data ? text.data : "", text.len);
      if (json_array_size(calls)) json_object_set(msg, "tool_calls", calls);
      if (reasoning.len)
        json_object_set_new(msg, "reasoning_content",
                            json_stringn(reasoning.data ? reasoning.data : "", reasoning.len));
      json_array_append_new(out, msg);
    }
    json_decref(calls);
    ci_strbuf_free(&text);
    ci_strbuf_free(&reasoning);
  }
  return out;
}

/* Anthropic tools -> OpenAI function tools. */
/* Whether the mapped messages end in an assistant message with text and no tool calls: Anthropic
 * continues it (a prefill) instead of starting a new turn. */
static int ends_with_assistant_text(const json_t *messages) {
  const json_t *last = json_array_get(messages, json_array_size(messages) - 1);
  const char *role = json_string_value(json_object_get(last, "role"));
  const char *content = json_string_value(json_object_get(last, "content"));
  return role && !strcmp(role, "assistant") && content && *content &&
         !json_object_get(last, "tool_calls");
}

static json_t *map_tools(const json_t *tools, char **err) {
  if (!tools || json_is_null(tools)) return json_array();
  if (!json_is_array(tools)) return fail(err, "tools must be an array"), NULL;
  json_t *out = json_array();
  size_t i;
  json_t *t;
  json_array_foreach(tools, i, t) {
    const json_t *name = json_object_get(t, "name");
    const json_t *schema = json_object_get(t, "input_schema");
    if (!json_is_string(name)) {
      json_decref(out);
      return fail(err, "each tool needs a name"), NULL;
    }
    if (!schema) continue;
    json_array_append_new(out, json_pack("{s:s, s:{s:O, s:O?, s:O}}", "type", "function",
                                         "function", "name", name, "description",
                                         json_object_get(t, "description"), "parameters", schema));
  }
  return out;
}

static const char *stop_reason(const ci_srv_gen *g) {
  if (json_array_size(g->calls)) return "tool_use";
  if (!strcmp(g->finish, "length")) return "max_tokens";
  if (g->stopped_by_string) return "stop_sequence";
  return "end_turn";
}

static json_t *usage(const ci_srv_gen *g) {
  return json_pack("{s:i, s:i, s:i, s:i}", "input_tokens", g->prompt_tokens - g->cached_tokens,
                   "output_tokens", g->completion_tokens, "cache_read_input_tokens",
                   g->cached_tokens, "cache_creation_input_tokens", 0);
}

static json_t *tool_use_block(const json_t *call) {
  char id[48];
  ci_server_new_id("toolu_", id, sizeof id);
  json_t *input = json_loads(json_string_value(json_object_get(call, "arguments")), 0, NULL);
  if (!input) input = json_pack("{s:O}", "_raw", json_object_get(call, "arguments"));
  return json_pack("{s:s, s:s, s:O, s:o}", "type", "tool_use", "id", id, "name",
                   json_object_get(call, "name"), "input", input);
}

/* ==== SSE ==== */

static void event(ci_srv_stream *st, const char *name, json_t *data /* stolen */) {
  char *text = json_dumps(data, JSON_COMPACT);
  json_decref(data);
  if (text) ci_strbuf_appendf(&st->out, "event: %s\ndata: %s\n\n", name, text);
  free(text);
}

static void close_block(ci_srv_stream *st) {
  if (!st->block_open) return;
  if (st->block_open == 1)
    event(st, "content_block_delta",
          json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index",
                    st->block_index, "delta", "type", "signature_delta", "signature", ""));
  event(st, "content_block_stop",
        json_pack("{s:s, s:i}", "type", "content_block_stop", "index", st->block_index));
  st->block_open = 0;
  st->block_index++;
}

static void text_delta(ci_srv_stream *st, int kind, const ci_strbuf *d) {
  if (!d->len) return;
  if (st->block_open != kind) {
    close_block(st);
    st->block_open = kind;
    event(st, "content_block_start",
          kind == 1 ? json_pack("{s:s, s:i, s:{s:s, s:s, s:s}}", "type", "content_block_start",
                                "index", st->block_index, "content_block", "type", "thinking",
                                "thinking", "", "signature", "")
                    : json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_start", "index",
                                st->block_index, "content_block", "type", "text", "text", ""));
  }
  event(st, "content_block_delta",
        json_pack("{s:s, s:i, s:{s:s, s:s%}}", "type", "content_block_delta", "index",
                  st->block_index, "delta", "type", kind == 1 ? "thinking_delta" : "text_delta",
                  kind == 1 ? "thinking" : "text", d->data, d->len));
}

static void produce_messages(ci_srv_stream *st) {
  ci_srv_gen *g = &st->gen;
  if (st->phase == 0) {
    st->phase = 1;
    event(st, "message_start",
          json_pack("{s:s, s:{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:{s:i, s:i, s:i}}}", "type",
                    "message_start", "message", "id", st->id, "type", "message", "role",
                    "assistant", "model", g->srv->o.model_id, "content", "stop_reason",
                    "stop_sequence", "usage", "input_tokens", g->prompt_tokens, "output_tokens", 0,
                    "cache_read_input_tokens", 0));
    return;
  }
  if (!g->done && !ci_srv_gen_pump(g, 15.0)) {
    event(st, "ping", json_pack("{s:s}", "type", "ping"));
    return;
  }
  if (g->failed) {
    event(st, "error", ci_server_error_body(1, 500, "internal_error", g->error));
    st->finished = 1;
    return;
  }
  text_delta(st, 1, &g->d_reasoning);
  text_delta(st, 2, &g->d_content);
  size_t i;
  json_t *call;
  json_array_foreach(g->d_calls, i, call) {
    close_block(st);
    json_t *block = tool_use_block(call);
    json_t *input = json_object_get(block, "input");
    char *partial = json_dumps(input, JSON_COMPACT);
    json_object_set_new(block, "input", json_object());
    event(st, "content_block_start",
          json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index", st->block_index,
                    "content_block", block));
    event(st, "content_block_delta",
          json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index",
                    st->block_index, "delta", "type", "input_json_delta", "partial_json",
                    partial ? partial : "{}"));
    free(partial);
    event(st, "content_block_stop",
          json_pack("{s:s, s:i}", "type", "content_block_stop", "index", st->block_index));
    st->block_index++;
  }
  ci_srv_gen_clear_deltas(g);
  if (!g->done) return;
  if (st->block_index == 0 && !st->block_open) { /* an empty generation: one empty text block */
    ci_strbuf empty = {0};
    event(st, "content_block_start",
          json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_start", "index", 0,
                    "content_block", "type", "text", "text", ""));
    st->block_open = 2;
    ci_strbuf_free(&empty);
  }
  close_block(st);
  event(st, "message_delta",
        json_pack("{s:s, s:{s:s, s:s?}, s:o}", "type", "message_delta", "delta", "stop_reason",
                  stop_reason(g), "stop_sequence", g->stop_sequence, "usage", usage(g)));
  event(st, "message_stop", json_pack("{s:s}", "type", "message_stop"));
  st->finished = 1;
}

/* ==== Route ==== */

/* Anthropic tool_choice {type: auto | any | tool (name) | none} as OpenAI's (auto, required, a
 * named function, none) for ci_srv_parse_tool_choice. Returns 0 or fills *err. */
static int tool_choice(ci_server *s, const json_t *choice, const json_t *tools, ci_srv_job *job,
                       char **err) {
  if (!choice || json_is_null(choice)) return 0;
  const char *type = json_string_value(json_object_get(choice, "type"));
  if (!json_is_object(choice) || !type)
    return fail(err, "tool_choice must be an object {\"type\": \"auto\" | \"any\" | \"tool\" | "
                     "\"none\"}");
  json_t *mapped = NULL;
  if (!strcmp(type, "any"))
    mapped = json_string("required");
  else if (!strcmp(type, "tool"))
    mapped = json_pack("{s:s, s:{s:O?}}", "type", "function", "function", "name",
                       json_object_get(choice, "name"));
  else if (strcmp(type, "auto") && strcmp(type, "none"))
    return fail(err, "tool_choice.type must be one of auto, any, tool, none");
  if (!mapped) return 0;
  const int rc = ci_srv_parse_tool_choice(s, tools, mapped, job, err);
  json_decref(mapped);
  return rc;
}

/* Anthropic's `thinking` request field as the chat template's enable_thinking (docs/server.md
 * "Anthropic messages"): {"type": "enabled", ...} turns it on, {"type": "disabled"} off; absent
 * or null leaves the template's default. *kwargs gets a new object or stays NULL. Returns 0, or
 * -1 with *err. */
static int thinking_kwargs(const json_t *body, json_t **kwargs, char **err) {
  *kwargs = NULL;
  const json_t *thinking = json_object_get(body, "thinking");
  if (!thinking || json_is_null(thinking)) return 0;
  const char *type = json_string_value(json_object_get(thinking, "type"));
  if (!type || (strcmp(type, "enabled") && strcmp(type, "disabled")))
    return fail(err, "thinking.type must be \"enabled\" or \"disabled\"");
  *kwargs = json_pack("{s:b}", "enable_thinking", !strcmp(type, "enabled"));
  return *kwargs ? 0 : fail(err, "out of memory");
}

int ci_anthropic_messages(ci_server *s, json_t *body, json_t **out, ci_srv_stream **stream,
                          int client_fd) {
  char *err = NULL;
  ci_srv_job job;
  memset(&job, 0, sizeof job);
  job.client_fd = client_fd;
  json_t *messages = NULL, *tools = NULL;
  const json_t *stream_flag = json_object_get(body, "stream");
  if (stream_flag && !json_is_null(stream_flag) && !json_is_boolean(stream_flag))
    err = strdup("stream must be a boolean");
  const json_t *choice = json_object_get(body, "tool_choice");
  const char *choice_type = json_string_value(json_object_get(choice, "type"));
  const int tools_off = choice_type && !strcmp(choice_type, "none");
  json_t *kwargs = NULL;
  if (err || thinking_kwargs(body, &kwargs, &err) || !(messages = map_messages(body, &err)) ||
      !(tools = map_tools(json_object_get(body, "tools"), &err)) ||
      ci_srv_parse_sampling(s, body, 1, &job, 0, &err) ||
      tool_choice(s, choice, tools, &job, &err) ||
      (job.tools_off = tools_off, job.continue_final |= ends_with_assistant_text(messages),
       ci_srv_tokenize_chat(s, messages, tools_off ? NULL : tools, kwargs, &job, &err))) {
    const char *code = job.err_code ? job.err_code : "invalid_value";
    json_decref(kwargs);
    json_decref(messages);
    json_decref(tools);
    ci_srv_job_free(&job);
    /* every parse error comes with a message: none means it could not be copied */
    const int status = err ? 400 : 500;
    *out =
        ci_server_error_body(1, status, err ? code : "internal_error", err ? err : "out of memory");
    free(err);
    return status;
  }
  json_decref(kwargs);
  json_decref(messages);
  if (!tools_off && json_array_size(tools)) job.tools = json_incref(tools);
  json_decref(tools);
  ci_srv_stream *st = calloc(1, sizeof *st);
  if (!st) {
    ci_srv_job_free(&job);
    *out = ci_server_error_body(1, 500, "internal_error", "out of memory");
    return 500;
  }
  const int status = ci_srv_gen_start(s, &job, &st->gen, 1, out);
  ci_srv_job_free(&job);
  if (status) {
    free(st);
    return status;
  }
  st->kind = 2;
  ci_server_new_id("msg_", st->id, sizeof st->id);
  st->created = (long long)time(NULL);
  if (json_is_true(stream_flag)) {
    st->produce = produce_messages;
    *stream = st;
    return 200;
  }
  ci_srv_gen *g = &st->gen;
  if (ci_srv_gen_run_to_end(g, 1, out) != 200) {
    ci_srv_stream_free(st);
    return 500;
  }
  json_t *content = json_array();
  if (g->reasoning.len)
    json_array_append_new(content, json_pack("{s:s, s:s%, s:s}", "type", "thinking", "thinking",
                                             g->reasoning.data, g->reasoning.len, "signature", ""));
  if (g->content.len || !json_array_size(g->calls))
    json_array_append_new(content,
                          json_pack("{s:s, s:s%}", "type", "text", "text",
                                    g->content.data ? g->content.data : "", g->content.len));
  size_t i;
  json_t *call;
  json_array_foreach(g->calls, i, call) json_array_append_new(content, tool_use_block(call));
  *out = json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:s?, s:o}", "id", st->id, "type", "message",
                   "role", "assistant", "model", s->o.model_id, "content", content, "stop_reason",
                   stop_reason(g), "stop_sequence", g->stop_sequence, "usage", usage(g));
  ci_srv_stream_free(st);
  return 200;
}

/* POST /v1/messages/count_tokens: the prompt tokens a /v1/messages request with this body
 * would have (system, messages, tools, rendered by the chat template); nothing is generated. */
int ci_anthropic_count_tokens(ci_server *s, json_t *body, json_t **out) {
  char *err = NULL;
  ci_srv_job job;
  memset(&job, 0, sizeof job);
  json_t *messages = NULL, *tools = NULL;
  const json_t *choice = json_object_get(body, "tool_choice");
  const char *choice_type = json_string_value(json_object_get(choice, "type"));
  const int tools_off = choice_type && !strcmp(choice_type, "none");
  json_t *kwargs = NULL;
  if (thinking_kwargs(body, &kwargs, &err) || !(messages = map_messages(body, &err)) ||
      !(tools = map_tools(json_object_get(body, "tools"), &err)) ||
      ci_srv_tokenize_chat(s, messages, tools_off ? NULL : tools, kwargs, &job, &err)) {
    json_decref(kwargs);
    json_decref(messages);
    json_decref(tools);
    ci_srv_job_free(&job);
    const int status = err ? 400 : 500;
    *out = ci_server_error_body(1, status, err ? "invalid_value" : "internal_error",
                                err ? err : "out of memory");
    free(err);
    return status;
  }
  *out = json_pack("{s:i}", "input_tokens", job.n_prompt);
  json_decref(kwargs);
  json_decref(messages);
  json_decref(tools);
  ci_srv_job_free(&job);
  return 200;
}
