/* OpenAI Responses route (docs/server.md "Responses"): POST /v1/responses — input (a string or
 * message / function_call / function_call_output items) and instructions mapped onto chat
 * messages, flat function tools, tool_choice, the response object and its SSE event grammar
 * (response.created ... response.completed), and previous_response_id over a bounded in-memory
 * store of past conversations (the oldest is forgotten first). */
#include "server/server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ==== The store ==== */

enum { STORE_CAP = 256 }; /* conversations kept */

struct ci_response_store {
  pthread_mutex_t mu;
  char ids[STORE_CAP][48];
  json_t *messages[STORE_CAP]; /* the conversation up to and including that response */
  int next;                    /* the slot written next (round robin: the oldest goes) */
};

ci_response_store *ci_response_store_create(void) {
  ci_response_store *st = calloc(1, sizeof *st);
  if (st) pthread_mutex_init(&st->mu, NULL);
  return st;
}

void ci_response_store_free(ci_response_store *st) {
  if (!st) return;
  for (int i = 0; i < STORE_CAP; i++) json_decref(st->messages[i]);
  pthread_mutex_destroy(&st->mu);
  free(st);
}

static void store_put(ci_response_store *st, const char *id, json_t *messages /* stolen */) {
  if (!st || !messages) {
    json_decref(messages);
    return;
  }
  pthread_mutex_lock(&st->mu);
  json_decref(st->messages[st->next]);
  snprintf(st->ids[st->next], sizeof st->ids[0], "%s", id);
  st->messages[st->next] = messages;
  st->next = (st->next + 1) % STORE_CAP;
  pthread_mutex_unlock(&st->mu);
}

/* A deep copy of the stored conversation, or NULL. */
static json_t *store_get(ci_response_store *st, const char *id) {
  json_t *out = NULL;
  if (!st) return NULL;
  pthread_mutex_lock(&st->mu);
  for (int i = 0; i < STORE_CAP && !out; i++)
    if (st->messages[i] && !strcmp(st->ids[i], id)) out = json_deep_copy(st->messages[i]);
  pthread_mutex_unlock(&st->mu);
  return out;
}

/* ==== Request mapping ==== */

static int fail(char **err, const char *fmt, const char *arg) {
  char buf[256];
  snprintf(buf, sizeof buf, fmt, arg);
  *err = strdup(buf);
  return -1;
}

/* A content value (string, or an array of input_text / output_text parts) as one string. */
static int content_text(const json_t *content, ci_strbuf *out, char **err) {
  if (json_is_string(content)) {
    ci_strbuf_append(out, json_string_value(content), json_string_length(content));
    return 0;
  }
  if (!json_is_array(content)) return fail(err, "%s", "content must be a string or an array");
  size_t i;
  json_t *part;
  json_array_foreach(content, i, part) {
    const char *type = json_string_value(json_object_get(part, "type"));
    const json_t *text = json_object_get(part, "text");
    if (!type ||
        (strcmp(type, "input_text") && strcmp(type, "output_text") && strcmp(type, "text")))
      return fail(err, "content parts of type '%.48s' are not supported", type ? type : "(none)");
    if (!json_is_string(text)) return fail(err, "%s", "a text part needs a string text");
    if (out->len) ci_strbuf_append(out, "\n", 1);
    ci_strbuf_append(out, json_string_value(text), json_string_length(text));
  }
  return 0;
}

/* Appends the input (string or items) to messages as chat messages. */
static int map_input(const json_t *input, json_t *messages, char **err) {
  if (json_is_string(input)) {
    json_array_append_new(messages, json_pack("{s:s, s:O}", "role", "user", "content", input));
    return 0;
  }
  if (!json_is_array(input)) return fail(err, "%s", "input must be a string or an array of items");
  size_t i;
  json_t *item;
  json_array_foreach(input, i, item) {
    const char *type = json_string_value(json_object_get(item, "type"));
    const char *role = json_string_value(json_object_get(item, "role"));
    if (!type || !strcmp(type, "message")) {
      if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system") &&
                    strcmp(role, "developer")))
        return fail(err, "%s",
                    "a message item's role must be user, assistant, system or developer");
      ci_strbuf text = {0};
      if (content_text(json_object_get(item, "content"), &text, err)) {
        ci_strbuf_free(&text);
        return -1;
      }
      json_array_append_new(messages, json_pack("{s:s, s:s%}", "role",
                                                !strcmp(role, "developer") ? "system" : role,
                                                "content", text.data ? text.data : "", text.len));
      ci_strbuf_free(&text);
    } else if (!strcmp(type, "function_call")) {
      const json_t *name = json_object_get(item, "name"),
                   *args = json_object_get(item, "arguments");
      if (!json_is_string(name) || !json_is_string(args))
        return fail(err, "%s", "a function_call item needs a string name and arguments");
      json_error_t jerr;
      json_t *parsed = json_loads(json_string_value(args), JSON_DECODE_ANY, &jerr);
      json_t *call = json_pack("{s:O?, s:s, s:{s:O, s:o}}", "id", json_object_get(item, "call_id"),
                               "type", "function", "function", "name", name, "arguments",
                               parsed ? parsed : json_incref((json_t *)args));
      /* consecutive calls belong to one assistant turn */
      json_t *last = json_array_get(messages, json_array_size(messages) - 1);
      json_t *calls = json_object_get(last, "tool_calls");
      if (calls && json_is_null(json_object_get(last, "content")))
        json_array_append_new(calls, call);
      else
        json_array_append_new(messages, json_pack("{s:s, s:s, s:[o]}", "role", "assistant",
                                                  "content", "", "tool_calls", call));
    } else if (!strcmp(type, "function_call_output")) {
      const json_t *output = json_object_get(item, "output");
      if (!json_is_string(output))
        return fail(err, "%s", "a function_call_output item needs a string output");
      json_array_append_new(messages,
                            json_pack("{s:s, s:O, s:O?}", "role", "tool", "content", output,
                                      "tool_call_id", json_object_get(item, "call_id")));
    } else {
      return fail(err, "input items of type '%.48s' are not supported", type);
    }
  }
  return 0;
}

/* Responses tools ({type: function, name, description, parameters}) as chat tools. */
static json_t *map_tools(const json_t *tools, char **err) {
  json_t *out = json_array();
  if (!tools || json_is_null(tools)) return out;
  if (!json_is_array(tools)) {
    json_decref(out);
    return fail(err, "%s", "tools must be an array"), NULL;
  }
  size_t i;
  json_t *t;
  json_array_foreach(tools, i, t) {
    const char *type = json_string_value(json_object_get(t, "type"));
    const json_t *name = json_object_get(t, "name");
    if (!type || strcmp(type, "function") || !json_is_string(name)) {
      json_decref(out);
      return fail(err, "%s", "only function tools with a name are supported"), NULL;
    }
    const json_t *params = json_object_get(t, "parameters");
    json_array_append_new(out,
                          json_pack("{s:s, s:{s:O, s:O?, s:O}}", "type", "function", "function",
                                    "name", name, "description", json_object_get(t, "description"),
                                    "parameters", params ? (json_t *)params : json_object()));
  }
  return out;
}

/* ==== The response object ==== */

typedef struct {
  json_t *echo;     /* request fields the response repeats (instructions, tools, ...) */
  json_t *messages; /* the conversation sent (stored with the answer appended) */
  int store;
  int seq;          /* SSE sequence_number */
  char msg_id[48];  /* the message output item */
  int message_open; /* its item was announced */
  int n_output;     /* output items announced */
} responses_state;

static void state_free(void *p) {
  responses_state *rs = p;
  if (!rs) return;
  json_decref(rs->echo);
  json_decref(rs->messages);
  free(rs);
}

static json_t *message_item(const char *id, const char *status, const char *text, size_t len) {
  return json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:s%, s:[]}]}", "type", "message", "id", id,
                   "status", status, "role", "assistant", "content", "type", "output_text", "text",
                   text ? text : "", len, "annotations");
}

static json_t *call_item(const json_t *call, const char *status) {
  char id[48], call_id[48];
  ci_server_new_id("fc_", id, sizeof id);
  ci_server_new_id("call_", call_id, sizeof call_id);
  return json_pack("{s:s, s:s, s:s, s:O, s:O, s:s}", "type", "function_call", "id", id, "call_id",
                   call_id, "name", json_object_get(call, "name"), "arguments",
                   json_object_get(call, "arguments"), "status", status);
}

/* The response object; output NULL gives []. */
static json_t *response_object(const ci_srv_stream *st, const char *status, json_t *output,
                               const ci_srv_gen *g) {
  const responses_state *rs = st->ext;
  json_t *r = json_pack("{s:s, s:s, s:I, s:s, s:n, s:n, s:s, s:o, s:n}", "id", st->id, "object",
                        "response", "created_at", (json_int_t)st->created, "status", status,
                        "error", "incomplete_details", "model", st->gen.srv->o.model_id, "output",
                        output ? output : json_array(), "usage");
  json_object_update(r, rs->echo);
  if (!strcmp(status, "incomplete"))
    json_object_set_new(r, "incomplete_details", json_pack("{s:s}", "reason", "max_output_tokens"));
  if (g)
    json_object_set_new(r, "usage",
                        json_pack("{s:i, s:{s:i}, s:i, s:{s:i}, s:i}", "input_tokens",
                                  g->prompt_tokens, "input_tokens_details", "cached_tokens",
                                  g->cached_tokens, "output_tokens", g->completion_tokens,
                                  "output_tokens_details", "reasoning_tokens", g->reasoning_tokens,
                                  "total_tokens", g->prompt_tokens + g->completion_tokens));
  return r;
}

/* The finished answer: its output items, and the conversation stored for follow-ups. */
static json_t *final_output(ci_srv_stream *st) {
  responses_state *rs = st->ext;
  const ci_srv_gen *g = &st->gen;
  json_t *output = json_array();
  if (g->reasoning.len) {
    char id[48];
    ci_server_new_id("rs_", id, sizeof id);
    json_array_append_new(output,
                          json_pack("{s:s, s:s, s:[], s:[{s:s, s:s%}]}", "type", "reasoning", "id",
                                    id, "summary", "content", "type", "reasoning_text", "text",
                                    g->reasoning.data, g->reasoning.len));
  }
  if (g->content.len || !json_array_size(g->calls))
    json_array_append_new(output,
                          message_item(rs->msg_id, "completed", g->content.data, g->content.len));
  size_t i;
  json_t *call;
  json_array_foreach(g->calls, i, call) json_array_append_new(output, call_item(call, "completed"));
  /* the conversation with this answer, for previous_response_id */
  if (rs->store && rs->messages) {
    json_t *answer = json_pack("{s:s, s:s%}", "role", "assistant", "content",
                               g->content.data ? g->content.data : "", g->content.len);
    json_t *calls = json_array();
    json_t *item;
    json_array_foreach(output, i, item) {
      if (strcmp(json_string_value(json_object_get(item, "type")), "function_call")) continue;
      json_error_t jerr;
      json_t *args =
          json_loads(json_string_value(json_object_get(item, "arguments")), JSON_DECODE_ANY, &jerr);
      json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:o}}", "id",
                                             json_object_get(item, "call_id"), "type", "function",
                                             "function", "name", json_object_get(item, "name"),
                                             "arguments", args ? args : json_object()));
    }
    if (json_array_size(calls)) json_object_set(answer, "tool_calls", calls);
    json_decref(calls);
    json_array_append_new(rs->messages, answer);
    store_put(st->gen.srv->responses, st->id, json_incref(rs->messages));
  }
  return output;
}

static const char *final_status(const ci_srv_gen *g) {
  return !strcmp(g->finish, "length") ? "incomplete" : "completed";
}

/* ==== SSE ==== */

static void event(ci_srv_stream *st, const char *type, json_t *data /* stolen */) {
  responses_state *rs = st->ext;
  json_object_set_new(data, "type", json_string(type));
  json_object_set_new(data, "sequence_number", json_integer(rs->seq++));
  char *text = json_dumps(data, JSON_COMPACT);
  json_decref(data);
  if (!text) return;
  ci_strbuf_appendf(&st->out, "event: %s\ndata: %s\n\n", type, text);
  free(text);
}

static void open_message(ci_srv_stream *st) {
  responses_state *rs = st->ext;
  if (rs->message_open) return;
  rs->message_open = 1;
  json_t *item = message_item(rs->msg_id, "in_progress", "", 0);
  json_array_clear(json_object_get(item, "content"));
  event(st, "response.output_item.added",
        json_pack("{s:i, s:o}", "output_index", rs->n_output, "item", item));
  event(st, "response.content_part.added",
        json_pack("{s:s, s:i, s:i, s:{s:s, s:s, s:[]}}", "item_id", rs->msg_id, "output_index",
                  rs->n_output, "content_index", 0, "part", "type", "output_text", "text", "",
                  "annotations"));
}

static void produce_response(ci_srv_stream *st) {
  responses_state *rs = st->ext;
  ci_srv_gen *g = &st->gen;
  if (st->phase == 0) {
    st->phase = 1;
    event(st, "response.created",
          json_pack("{s:o}", "response", response_object(st, "in_progress", NULL, NULL)));
    event(st, "response.in_progress",
          json_pack("{s:o}", "response", response_object(st, "in_progress", NULL, NULL)));
    return;
  }
  if (!g->done && !ci_srv_gen_pump(g, 15.0)) {
    ci_strbuf_append(&st->out, ": keep-alive\n\n", 14);
    return;
  }
  if (g->failed) {
    json_t *r = response_object(st, "failed", NULL, g);
    json_object_set_new(r, "error",
                        json_pack("{s:s, s:s}", "code", "server_error", "message", g->error));
    event(st, "response.failed", json_pack("{s:o}", "response", r));
    st->finished = 1;
    return;
  }
  if (g->d_content.len) {
    open_message(st);
    event(st, "response.output_text.delta",
          json_pack("{s:s, s:i, s:i, s:s%, s:[]}", "item_id", rs->msg_id, "output_index",
                    rs->n_output, "content_index", 0, "delta", g->d_content.data, g->d_content.len,
                    "logprobs"));
  }
  ci_srv_gen_clear_deltas(g);
  if (!g->done) return;
  /* the end: close the message, announce the calls, then the whole response */
  if (g->content.len || !json_array_size(g->calls)) {
    open_message(st);
    const char *text = g->content.data ? g->content.data : "";
    event(st, "response.output_text.done",
          json_pack("{s:s, s:i, s:i, s:s%, s:[]}", "item_id", rs->msg_id, "output_index",
                    rs->n_output, "content_index", 0, "text", text, g->content.len, "logprobs"));
    event(st, "response.content_part.done",
          json_pack("{s:s, s:i, s:i, s:{s:s, s:s%, s:[]}}", "item_id", rs->msg_id, "output_index",
                    rs->n_output, "content_index", 0, "part", "type", "output_text", "text", text,
                    g->content.len, "annotations"));
    event(st, "response.output_item.done",
          json_pack("{s:i, s:o}", "output_index", rs->n_output, "item",
                    message_item(rs->msg_id, "completed", text, g->content.len)));
    rs->n_output++;
  }
  json_t *output = final_output(st);
  size_t i;
  json_t *item;
  json_array_foreach(output, i, item) {
    if (strcmp(json_string_value(json_object_get(item, "type")), "function_call")) continue;
    json_t *added = json_deep_copy(item);
    json_object_set_new(added, "status", json_string("in_progress"));
    json_object_set_new(added, "arguments", json_string(""));
    event(st, "response.output_item.added",
          json_pack("{s:i, s:o}", "output_index", rs->n_output, "item", added));
    event(st, "response.function_call_arguments.delta",
          json_pack("{s:O, s:i, s:O}", "item_id", json_object_get(item, "id"), "output_index",
                    rs->n_output, "delta", json_object_get(item, "arguments")));
    event(st, "response.function_call_arguments.done",
          json_pack("{s:O, s:i, s:O}", "item_id", json_object_get(item, "id"), "output_index",
                    rs->n_output, "arguments", json_object_get(item, "arguments")));
    event(st, "response.output_item.done",
          json_pack("{s:i, s:O}", "output_index", rs->n_output, "item", item));
    rs->n_output++;
  }
  const char *status = final_status(g);
  event(st, !strcmp(status, "completed") ? "response.completed" : "response.incomplete",
        json_pack("{s:o}", "response", response_object(st, status, output, g)));
  st->finished = 1;
}

/* ==== The route ==== */

static int bad(json_t **out, int status, const char *code, char *msg /* freed */) {
  if (!msg) status = 500, code = "internal_error";
  *out = ci_server_error_body(0, status, code, msg ? msg : "out of memory");
  free(msg);
  return status;
}

int ci_openai_responses(ci_server *s, json_t *body, json_t **out, ci_srv_stream **stream,
                        int client_fd) {
  char *err = NULL;
  ci_srv_job job;
  memset(&job, 0, sizeof job);
  job.client_fd = client_fd;
  const json_t *stream_flag = json_object_get(body, "stream");
  const json_t *instructions = json_object_get(body, "instructions");
  const json_t *prev = json_object_get(body, "previous_response_id");
  const json_t *store = json_object_get(body, "store");
  const json_t *input = json_object_get(body, "input");
  if (stream_flag && !json_is_null(stream_flag) && !json_is_boolean(stream_flag))
    return bad(out, 400, "invalid_value", strdup("stream must be a boolean"));
  if (instructions && !json_is_null(instructions) && !json_is_string(instructions))
    return bad(out, 400, "invalid_value", strdup("instructions must be a string"));
  if (prev && !json_is_null(prev) && !json_is_string(prev))
    return bad(out, 400, "invalid_value", strdup("previous_response_id must be a string"));
  if (store && !json_is_null(store) && !json_is_boolean(store))
    return bad(out, 400, "invalid_value", strdup("store must be a boolean"));
  if (!input) return bad(out, 400, "invalid_value", strdup("input is required"));
  if (json_object_get(body, "n") || json_object_get(body, "best_of"))
    return bad(out, 400, "invalid_value", strdup("n and best_of are not Responses parameters"));
  /* the conversation: instructions, the previous response's conversation, the new input */
  json_t *messages = json_array();
  if (json_is_string(instructions))
    json_array_append_new(messages,
                          json_pack("{s:s, s:O}", "role", "system", "content", instructions));
  if (json_is_string(prev)) {
    json_t *before = store_get(s->responses, json_string_value(prev));
    if (!before) {
      json_decref(messages);
      char msg[200];
      snprintf(msg, sizeof msg, "previous response '%.100s' is not stored (unknown or expired)",
               json_string_value(prev));
      return bad(out, 404, "previous_response_not_found", strdup(msg));
    }
    /* a previous turn's instructions are not carried over */
    size_t i;
    json_t *m;
    json_array_foreach(before, i, m) {
      if (i == 0 && !strcmp(json_string_value(json_object_get(m, "role")), "system") &&
          json_is_true(json_object_get(m, "_instructions")))
        continue;
      json_array_append(messages, m);
    }
    json_decref(before);
  }
  json_t *tools = NULL;
  /* a chat-completions view of the sampling fields */
  json_t *chat_body = json_deep_copy(body);
  const char *drop[] = {"input",
                        "instructions",
                        "previous_response_id",
                        "store",
                        "tools",
                        "tool_choice",
                        "metadata",
                        "text",
                        "parallel_tool_calls",
                        "reasoning",
                        "truncation",
                        "user",
                        "include",
                        "max_output_tokens",
                        "stream"};
  for (size_t i = 0; chat_body && i < sizeof drop / sizeof drop[0]; i++)
    json_object_del(chat_body, drop[i]);
  const json_t *max_out = json_object_get(body, "max_output_tokens");
  if (chat_body && max_out && !json_is_null(max_out))
    json_object_set(chat_body, "max_tokens", (json_t *)max_out);
  const json_t *choice = json_object_get(body, "tool_choice");
  json_t *chat_choice = NULL;
  if (json_is_object(choice) && json_is_string(json_object_get(choice, "name")))
    chat_choice = json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name",
                            json_object_get(choice, "name"));
  else if (choice)
    chat_choice = json_incref((json_t *)choice);
  const int tools_off = json_is_string(choice) && !strcmp(json_string_value(choice), "none");
  if (!chat_body || map_input(input, messages, &err) ||
      !(tools = map_tools(json_object_get(body, "tools"), &err)) ||
      ci_srv_parse_sampling(s, chat_body, 0, &job, 65536, &err) ||
      ci_srv_parse_tool_choice(s, tools, chat_choice, &job, &err) ||
      (job.tools_off = tools_off,
       ci_srv_tokenize_chat(s, messages, tools_off ? NULL : tools, NULL, &job, &err))) {
    const char *code = job.err_code ? job.err_code : "invalid_value";
    json_decref(chat_body);
    json_decref(chat_choice);
    json_decref(messages);
    json_decref(tools);
    ci_srv_job_free(&job);
    return bad(out, 400, code, err);
  }
  json_decref(chat_choice);
  if (!tools_off && json_array_size(tools)) job.tools = json_incref(tools);
  const int max_tokens = job.params.max_tokens;
  ci_srv_stream *st = calloc(1, sizeof *st);
  responses_state *rs = calloc(1, sizeof *rs);
  if (!st || !rs) {
    free(st);
    free(rs);
    json_decref(chat_body);
    json_decref(messages);
    json_decref(tools);
    ci_srv_job_free(&job);
    return bad(out, 500, "internal_error", NULL);
  }
  st->ext = rs;
  st->ext_free = state_free;
  rs->messages = messages;
  rs->store = !json_is_false(store);
  if (json_is_string(instructions)) /* marked so a follow-up drops them */
    json_object_set_new(json_array_get(messages, 0), "_instructions", json_true());
  rs->echo = json_pack(
      "{s:O?, s:O?, s:o, s:o, s:O?, s:O?, s:i, s:b, s:b, s:{s:{s:s}}, s:o, s:s}", "instructions",
      instructions, "previous_response_id", prev, "tools",
      json_object_get(body, "tools") ? json_incref(json_object_get(body, "tools")) : json_array(),
      "tool_choice", choice ? json_incref((json_t *)choice) : json_string("auto"), "temperature",
      json_object_get(body, "temperature"), "top_p", json_object_get(body, "top_p"),
      "max_output_tokens", max_tokens, "parallel_tool_calls", 1, "store", rs->store, "text",
      "format", "type", "text", "metadata",
      json_object_get(body, "metadata") ? json_incref(json_object_get(body, "metadata"))
                                        : json_object(),
      "object", "response");
  json_decref(chat_body);
  json_decref(tools);
  ci_server_new_id("resp_", st->id, sizeof st->id);
  ci_server_new_id("msg_", rs->msg_id, sizeof rs->msg_id);
  st->created = (long long)time(NULL);
  st->kind = 3;
  const int status = ci_srv_gen_start(s, &job, &st->gen, 0, out);
  ci_srv_job_free(&job);
  if (status) {
    ci_srv_stream_free(st);
    return status;
  }
  if (json_is_true(stream_flag)) {
    st->produce = produce_response;
    *stream = st;
    return 200;
  }
  ci_srv_gen *g = &st->gen;
  if (ci_srv_gen_run_to_end(g, 0, out) != 200) {
    ci_srv_stream_free(st);
    return 500;
  }
  json_t *output = final_output(st);
  *out = response_object(st, final_status(g), output, g);
  ci_srv_stream_free(st);
  return 200;
}
