/* Public API chat output: a model family's output conventions (think tags, Gemma channels,
 * Gemma 4 call tokens, text tool calls) and the per-answer pipeline that turns generated tokens
 * into content, reasoning and tool calls: streaming detokenizer with stop strings -> reasoning
 * split -> tool-call parser, or the Gemma router in front of them. */
#include "api/api_internal.h"

#include "base/error.h"
#include "text/detok_stream.h"
#include "text/reasoning_split.h"
#include "text/tool_call_parse.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

void ci_api_chat_format_detect(cinfer_chat_format *f, const ci_tokenizer *tok,
                               const ci_chat_template *chat_template, const char *architecture) {
  memset(f, 0, sizeof *f);
  f->tok = tok;
  f->think_open = ci_tokenizer_token_to_id(tok, "<think>");
  f->think_close = ci_tokenizer_token_to_id(tok, "</think>");
  f->think_format = f->think_open >= 0 && f->think_close >= 0;
  ci_gemma_markers_find(tok, &f->gemma);
  /* docs/server.md "Output formats": a template mentioning <|channel> means gemma-channel
     reasoning; model_type gemma4* means the token parser for calls, always on */
  f->gemma_channels = chat_template && ci_chat_template_mentions(chat_template, "<|channel>") &&
                      ci_gemma_markers_have_channels(&f->gemma);
  f->gemma_calls =
      architecture && !strncmp(architecture, "gemma4", 6) && ci_gemma_markers_have_calls(&f->gemma);
  /* a template that teaches <function=NAME> with <parameter=KEY> (Qwen3.5, Qwen3-Coder) */
  f->xml_calls = chat_template && ci_chat_template_mentions(chat_template, "<function=") &&
                 ci_chat_template_mentions(chat_template, "<parameter=");
}

cinfer_status cinfer_chat_format_create(const cinfer_tokenizer *tokenizer,
                                        const cinfer_chat_template *chat_template,
                                        const char *architecture, cinfer_chat_format **out) {
  if (!out) return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_chat_format_create: out is NULL");
  *out = NULL;
  if (!tokenizer)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_chat_format_create: no tokenizer");
  cinfer_chat_format *f = calloc(1, sizeof *f);
  if (!f) return ci_api_fail(CINFER_ERROR, "out of memory for a chat format");
  ci_api_chat_format_detect(f, tokenizer->impl, chat_template ? chat_template->impl : NULL,
                            architecture);
  *out = f;
  return CINFER_OK;
}

void cinfer_chat_format_free(cinfer_chat_format *format) {
  free(format);
}

const cinfer_chat_format *cinfer_model_chat_format(const cinfer_model *model) {
  return model && model->tokenizer ? &model->chat_format : NULL;
}

int cinfer_chat_format_xml_tool_calls(const cinfer_chat_format *format) {
  return format && format->xml_calls;
}

int cinfer_chat_format_reasoning_open(const cinfer_chat_format *format, const char *prompt,
                                      size_t len) {
  return format && format->think_format && prompt && ci_reasoning_prompt_open(prompt, len);
}

int cinfer_chat_format_has_reasoning(const cinfer_chat_format *format) {
  return format && (format->think_format || format->gemma_channels);
}

size_t cinfer_chat_format_stop_tokens(const cinfer_chat_format *format, int32_t *ids, size_t cap) {
  if (!format || !format->gemma_calls || format->gemma.response_open < 0) return 0;
  if (ids && cap >= 1) ids[0] = format->gemma.response_open;
  return 1;
}

struct cinfer_chat_output {
  const cinfer_chat_format *format;
  ci_detok_stream *detok;    /* owned */
  ci_reasoning_split *split; /* owned; NULL: no think-tag split */
  ci_tool_parser *tools;     /* owned; NULL: no text tool calls */
  ci_gemma_output *gemma;    /* owned; NULL: no Gemma routing */
  json_t *tool_defs;         /* owned; NULL: none declared */
  int in_think;              /* inside <think> (counts reasoning tokens) */
  int reasoning_tokens;
  int oom; /* a call could not be handed on */
  /* the caller's sinks during push/finish */
  const cinfer_chat_output_sinks *sinks;
  void *user;
};

static void on_content(void *ctx, const char *text, size_t len) {
  cinfer_chat_output *o = ctx;
  if (len && o->sinks && o->sinks->content) o->sinks->content(o->user, text, len);
}

static void on_reasoning(void *ctx, const char *text, size_t len) {
  cinfer_chat_output *o = ctx;
  if (len && o->sinks && o->sinks->reasoning) o->sinks->reasoning(o->user, text, len);
}

static void on_call(void *ctx, json_t *call) {
  cinfer_chat_output *o = ctx;
  char *text = json_dumps(call, JSON_COMPACT | JSON_PRESERVE_ORDER);
  if (!text) {
    o->oom = 1;
    return;
  }
  if (o->sinks && o->sinks->tool_call) o->sinks->tool_call(o->user, text);
  free(text);
}

/* Hands on the calls a parser stage found. */
static void on_calls(cinfer_chat_output *o, json_t *calls) {
  size_t i;
  json_t *call;
  json_array_foreach(calls, i, call) on_call(o, call);
}

static void on_split(void *ctx, int is_reasoning, const char *text, size_t len) {
  cinfer_chat_output *o = ctx;
  if (is_reasoning) {
    on_reasoning(o, text, len);
  } else if (o->tools) {
    json_t *fresh = json_array();
    if (!fresh) {
      o->oom = 1;
      return;
    }
    ci_tool_parser_push(o->tools, text, len, fresh, on_content, o);
    on_calls(o, fresh);
    json_decref(fresh);
  } else {
    on_content(o, text, len);
  }
}

/* Gemma routing: reasoning and calls as above; a segment that failed to parse is content. */
static const ci_gemma_sinks gemma_sinks = {on_reasoning, on_content, on_call};

static void visible_text(cinfer_chat_output *o, const char *text, size_t len) {
  if (!len) return;
  if (o->split)
    ci_reasoning_split_push(o->split, text, len, on_split, o);
  else
    on_split(o, 0, text, len);
}

cinfer_status cinfer_chat_output_create(const cinfer_chat_format *format,
                                        const cinfer_chat_output_options *options,
                                        cinfer_chat_output **out) {
  if (!out) return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_chat_output_create: out is NULL");
  *out = NULL;
  if (!format) return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_chat_output_create: no format");
  const cinfer_chat_output_options none = {0};
  if (!options) options = &none;
  if ((!options->stop && options->n_stop) || (!options->prompt && options->prompt_len))
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_chat_output_create: NULL stop or prompt");
  for (size_t i = 0; i < options->n_stop; i++)
    if (!options->stop[i])
      return ci_api_fail(CINFER_INVALID_ARGUMENT, "stop string %zu is NULL", i);
  cinfer_chat_output *o = calloc(1, sizeof *o);
  if (!o) return ci_api_fail(CINFER_ERROR, "out of memory for a chat output");
  o->format = format;
  if (options->tools_json) {
    json_error_t error;
    o->tool_defs = json_loads(options->tools_json, 0, &error);
    if (!json_is_array(o->tool_defs)) {
      const int parsed = o->tool_defs != NULL;
      cinfer_chat_output_free(o);
      return ci_api_fail(CINFER_INVALID_ARGUMENT, "tools: %s",
                         parsed ? "not a JSON array" : error.text);
    }
  }
  const int raw = options->raw_text;
  const int reasoning_open = format->think_format && options->prompt &&
                             ci_reasoning_prompt_open(options->prompt, options->prompt_len);
  int name_done = 0;
  const int channel_open = format->gemma_channels && options->prompt &&
                           ci_gemma_prompt_open(options->prompt, options->prompt_len, &name_done);
  o->detok = ci_detok_stream_create(format->tok, options->stop, options->n_stop, 1);
  int failed = !o->detok;
  if (!failed && format->think_format && !raw)
    failed = !(o->split = ci_reasoning_split_create(reasoning_open));
  o->in_think = reasoning_open;
  const int hermes = options->hermes_tool_calls;
  if (!failed && o->tool_defs && !options->tools_off && !raw && (!format->gemma_calls || hermes))
    failed = !(o->tools = ci_tool_parser_create(o->tool_defs));
  const int gemma_calls = format->gemma_calls && !options->tools_off && !raw && !hermes;
  const int gemma_channels = format->gemma_channels && !raw;
  if (!failed && (gemma_channels || gemma_calls)) {
    const ci_gemma_output_options go = {.channels = gemma_channels,
                                        .tool_calls = gemma_calls,
                                        .in_channel = channel_open,
                                        .name_done = name_done,
                                        .tools = o->tool_defs};
    failed = !(o->gemma = ci_gemma_output_create(format->tok, &format->gemma, &go));
  }
  if (failed) {
    cinfer_chat_output_free(o);
    return CINFER_ERROR;
  }
  *out = o;
  return CINFER_OK;
}

void cinfer_chat_output_free(cinfer_chat_output *output) {
  if (!output) return;
  ci_detok_stream_free(output->detok);
  ci_reasoning_split_free(output->split);
  ci_tool_parser_free(output->tools);
  ci_gemma_output_free(output->gemma);
  json_decref(output->tool_defs);
  free(output);
}

/* Think-tag reasoning tokens: those strictly between <think> and </think> (by id). */
static void count_think(cinfer_chat_output *o, int32_t id) {
  if (!o->split) return;
  if (id == o->format->think_open)
    o->in_think = 1;
  else if (id == o->format->think_close)
    o->in_think = 0;
  else if (o->in_think)
    o->reasoning_tokens++;
}

cinfer_status cinfer_chat_output_push(cinfer_chat_output *output, int32_t token,
                                      const cinfer_chat_output_sinks *sinks, void *user) {
  if (!output) return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_chat_output_push: NULL output");
  cinfer_chat_output *o = output;
  o->sinks = sinks;
  o->user = user;
  count_think(o, token);
  const char *piece = NULL;
  size_t len = 0;
  int r = o->gemma ? ci_gemma_output_push(o->gemma, token, &gemma_sinks, o) : 0;
  if (r == 1) /* routed (Gemma reasoning or a call): not content */
    r = 0;
  else if (r == 0)
    r = ci_detok_stream_push(o->detok, token, &piece, &len);
  if (r < 0) return CINFER_INVALID_ARGUMENT;
  visible_text(o, piece, len);
  if (o->oom) return ci_api_fail(CINFER_ERROR, "out of memory");
  return r == 1 ? CINFER_DONE : CINFER_OK;
}

cinfer_status cinfer_chat_output_finish(cinfer_chat_output *output,
                                        const cinfer_chat_output_sinks *sinks, void *user) {
  if (!output)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_chat_output_finish: NULL output");
  cinfer_chat_output *o = output;
  o->sinks = sinks;
  o->user = user;
  const char *piece = NULL;
  size_t len = 0;
  const int r = ci_detok_stream_finish(o->detok, &piece, &len);
  if (r >= 0) visible_text(o, piece, len);
  if (o->gemma) {
    ci_gemma_output_finish(o->gemma, &gemma_sinks, o);
    o->reasoning_tokens += ci_gemma_output_reasoning_tokens(o->gemma);
    ci_gemma_output_free(o->gemma); /* finished: a second finish adds nothing */
    o->gemma = NULL;
  }
  if (o->split) ci_reasoning_split_finish(o->split, on_split, o);
  if (o->tools) {
    json_t *fresh = json_array();
    if (!fresh) {
      o->oom = 1;
    } else {
      ci_tool_parser_finish(o->tools, fresh, on_content, o);
      on_calls(o, fresh);
      json_decref(fresh);
    }
  }
  if (o->oom) return ci_api_fail(CINFER_ERROR, "out of memory");
  return r == 1 ? CINFER_DONE : CINFER_OK;
}

const char *cinfer_chat_output_stop_string(const cinfer_chat_output *output) {
  return output ? ci_detok_stream_stop_string(output->detok) : NULL;
}

int cinfer_chat_output_reasoning_tokens(const cinfer_chat_output *output) {
  return output ? output->reasoning_tokens : 0;
}
