/* Gemma 4 token-level output router (see gemma_output.h). */
#include "text/gemma_output.h"

#include "base/error.h"
#include "text/detok_stream.h"
#include "text/gemma_tool_call.h"

#include <stdlib.h>
#include <string.h>

typedef enum { IN_CONTENT, IN_CHANNEL, IN_CALL } segment;

struct ci_gemma_output {
  const ci_tokenizer *tok;
  ci_gemma_markers m;
  ci_gemma_output_options o;
  segment where;
  ci_detok_stream *reasoning; /* the open channel's decoder */
  int name_done;              /* the open channel's name line has ended */
  int32_t *call_ids;          /* the open tool-call segment's tokens */
  size_t n_call, cap_call;
  int reasoning_tokens;
};

static const char open_channel[] = "<|channel>", close_channel[] = "<channel|>";

void ci_gemma_markers_find(const ci_tokenizer *tok, ci_gemma_markers *m) {
  m->channel_open = ci_tokenizer_token_to_id(tok, open_channel);
  m->channel_close = ci_tokenizer_token_to_id(tok, close_channel);
  m->call_open = ci_tokenizer_token_to_id(tok, "<|tool_call>");
  m->call_close = ci_tokenizer_token_to_id(tok, "<tool_call|>");
  m->response_open = ci_tokenizer_token_to_id(tok, "<|tool_response>");
}

int ci_gemma_markers_have_channels(const ci_gemma_markers *m) {
  return m->channel_open >= 0 && m->channel_close >= 0;
}

int ci_gemma_markers_have_calls(const ci_gemma_markers *m) {
  return m->call_open >= 0 && m->call_close >= 0;
}

/* ==== Channels ==== */

/* Opens a channel's decoder; name_done says whether its name line is already behind. */
static int channel_open(ci_gemma_output *g, int name_done) {
  g->reasoning = ci_detok_stream_create(g->tok, NULL, 0, 1);
  g->name_done = name_done;
  g->where = IN_CHANNEL;
  return g->reasoning ? CI_OK : CI_ERR;
}

/* Reasoning text: everything after the channel's first line. */
static void channel_text(ci_gemma_output *g, const char *text, size_t len,
                         const ci_gemma_sinks *sinks, void *ctx) {
  if (!g->name_done) {
    const char *nl = memchr(text, '\n', len);
    if (!nl) return;
    g->name_done = 1;
    len -= (size_t)(nl + 1 - text);
    text = nl + 1;
  }
  if (len) sinks->reasoning(ctx, text, len);
}

static void channel_close(ci_gemma_output *g, const ci_gemma_sinks *sinks, void *ctx) {
  const char *piece;
  size_t len;
  if (g->reasoning && ci_detok_stream_finish(g->reasoning, &piece, &len) >= 0)
    channel_text(g, piece, len, sinks, ctx);
  ci_detok_stream_free(g->reasoning);
  g->reasoning = NULL;
  g->where = IN_CONTENT;
}

/* ==== Tool calls ==== */

/* Parses the open segment (truncated: cut by max_tokens); releases its text as content when it
 * does not parse. */
static void call_close(ci_gemma_output *g, int truncated, const ci_gemma_sinks *sinks, void *ctx) {
  char *text = NULL;
  size_t len = 0;
  if (ci_tokenizer_decode(g->tok, g->call_ids, g->n_call, 0, &text, &len)) {
    text = NULL;
    len = 0;
  }
  json_t *calls = json_array();
  if (text && ci_gemma_tool_calls_parse(g->o.tools, text, len, truncated, calls) > 0) {
    size_t i;
    json_t *call;
    json_array_foreach(calls, i, call) sinks->call(ctx, call);
  } else if (text) { /* fail soft: the withheld text, markers included, becomes content */
    const char *open = ci_tokenizer_id_to_token(g->tok, g->m.call_open);
    const char *close = ci_tokenizer_id_to_token(g->tok, g->m.call_close);
    if (open) sinks->content(ctx, open, strlen(open));
    if (len) sinks->content(ctx, text, len);
    if (!truncated && close) sinks->content(ctx, close, strlen(close));
  }
  json_decref(calls);
  free(text);
  g->n_call = 0;
  g->where = IN_CONTENT;
}

static int call_append(ci_gemma_output *g, int32_t id) {
  if (g->n_call == g->cap_call) {
    const size_t cap = g->cap_call ? g->cap_call * 2 : 64;
    int32_t *bigger = realloc(g->call_ids, cap * sizeof *bigger);
    if (!bigger) return ci_fail("out of memory");
    g->call_ids = bigger;
    g->cap_call = cap;
  }
  g->call_ids[g->n_call++] = id;
  return CI_OK;
}

/* ==== Router ==== */

ci_gemma_output *ci_gemma_output_create(const ci_tokenizer *tok, const ci_gemma_markers *markers,
                                        const ci_gemma_output_options *options) {
  ci_gemma_output *g = calloc(1, sizeof *g);
  if (!g) return ci_fail("out of memory"), NULL;
  g->tok = tok;
  g->m = *markers;
  g->o = *options;
  g->o.channels = options->channels && ci_gemma_markers_have_channels(markers);
  g->o.tool_calls = options->tool_calls && ci_gemma_markers_have_calls(markers);
  if (g->o.channels && options->in_channel && channel_open(g, options->name_done)) {
    ci_gemma_output_free(g);
    return NULL;
  }
  return g;
}

void ci_gemma_output_free(ci_gemma_output *g) {
  if (!g) return;
  ci_detok_stream_free(g->reasoning);
  free(g->call_ids);
  free(g);
}

int ci_gemma_output_push(ci_gemma_output *g, int32_t id, const ci_gemma_sinks *sinks, void *ctx) {
  switch (g->where) {
  case IN_CHANNEL:
    if (id == g->m.channel_close) {
      channel_close(g, sinks, ctx);
      return 1;
    }
    g->reasoning_tokens++;
    const char *piece;
    size_t len;
    if (ci_detok_stream_push(g->reasoning, id, &piece, &len) < 0) return CI_ERR;
    channel_text(g, piece, len, sinks, ctx);
    return 1;
  case IN_CALL:
    if (id == g->m.call_close) {
      call_close(g, 0, sinks, ctx);
      return 1;
    }
    if (id < 0 || (size_t)id >= ci_tokenizer_vocab_size(g->tok))
      return ci_fail("token id %d is outside the vocabulary", (int)id);
    return call_append(g, id) ? CI_ERR : 1;
  case IN_CONTENT:
    break;
  }
  if (g->o.channels && id == g->m.channel_open) return channel_open(g, 0) ? CI_ERR : 1;
  if (g->o.channels && id == g->m.channel_close) return 1; /* a stray close: nothing to show */
  if (g->o.tool_calls && id == g->m.call_open) {
    g->where = IN_CALL;
    g->n_call = 0;
    return 1;
  }
  return 0;
}

void ci_gemma_output_finish(ci_gemma_output *g, const ci_gemma_sinks *sinks, void *ctx) {
  if (g->where == IN_CHANNEL) channel_close(g, sinks, ctx);
  if (g->where == IN_CALL) call_close(g, 1, sinks, ctx);
}

int ci_gemma_output_reasoning_tokens(const ci_gemma_output *g) {
  return g->reasoning_tokens;
}

/* Last occurrence of needle in hay, or NULL. */
static const char *find_last(const char *hay, size_t len, const char *needle) {
  const size_t n = strlen(needle);
  for (size_t i = len >= n ? len - n + 1 : 0; i-- > 0;)
    if (!memcmp(hay + i, needle, n)) return hay + i;
  return NULL;
}

int ci_gemma_prompt_open(const char *prompt, size_t len, int *name_done) {
  *name_done = 0;
  const char *open = find_last(prompt, len, open_channel);
  const char *close = find_last(prompt, len, close_channel);
  if (!open || (close && close > open)) return 0;
  const char *after = open + strlen(open_channel);
  *name_done = memchr(after, '\n', (size_t)(prompt + len - after)) != NULL;
  return 1;
}
