/* Gemma 4 output segments at the token level (docs/server.md "Output formats": Gemma 4 tool
 * calls, gemma-channel). The
 * special tokens <|channel> … <channel|> enclose reasoning, whose first line is the channel name
 * (e.g. "thought\n") and is dropped; <|tool_call> … <tool_call|> enclose tool calls. The router
 * takes each generated token id: markers and enclosed tokens are consumed — reasoning decoded by
 * its own incremental decoder and streamed, a tool-call segment decoded with special tokens kept
 * and parsed when it closes (gemma_tool_call.h) — and every other token is content, left to the
 * caller's detokenizer (which applies stop strings). Markers are looked up by their strings, so
 * other vocabularies simply have none. */
#ifndef CI_TEXT_GEMMA_OUTPUT_H
#define CI_TEXT_GEMMA_OUTPUT_H

#include "text/tokenizer.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* The marker token ids; -1 where the vocabulary lacks the token. */
typedef struct {
  int32_t channel_open;  /* <|channel> */
  int32_t channel_close; /* <channel|> */
  int32_t call_open;     /* <|tool_call> */
  int32_t call_close;    /* <tool_call|> */
  int32_t response_open; /* <|tool_response>: ends generation after calls (an EOS id) */
} ci_gemma_markers;

/* Looks the markers up in tok. */
void ci_gemma_markers_find(const ci_tokenizer *tok, ci_gemma_markers *markers);

/* Whether both channel markers, resp. both tool-call markers, exist. */
int ci_gemma_markers_have_channels(const ci_gemma_markers *markers);
int ci_gemma_markers_have_calls(const ci_gemma_markers *markers);

typedef struct {
  int channels;        /* route <|channel> segments to reasoning (else they stay content) */
  int tool_calls;      /* parse <|tool_call> segments (else their text stays content) */
  int in_channel;      /* the prompt ends inside an open channel ... */
  int name_done;       /* ... whose name line it already holds */
  const json_t *tools; /* declared tools (borrowed, must outlive the router); NULL: any name */
} ci_gemma_output_options;

/* Where the router's output goes. Strings are valid during the call only. */
typedef struct {
  void (*reasoning)(void *ctx, const char *text, size_t len);
  void (*content)(void *ctx, const char *text, size_t len); /* a segment that failed to parse */
  void (*call)(void *ctx, json_t *call);                    /* {name, arguments}, borrowed */
} ci_gemma_sinks;

typedef struct ci_gemma_output ci_gemma_output;

/* A router over tok and markers (both borrowed). NULL with ci_last_error on out of memory. */
ci_gemma_output *ci_gemma_output_create(const ci_tokenizer *tok, const ci_gemma_markers *markers,
                                        const ci_gemma_output_options *options);
void ci_gemma_output_free(ci_gemma_output *g);

/* Feeds one generated token. Returns 0 when it is content (the caller decodes it), 1 when the
 * router consumed it, CI_ERR on a decoding error (an id outside the vocabulary). */
int ci_gemma_output_push(ci_gemma_output *g, int32_t id, const ci_gemma_sinks *sinks, void *ctx);

/* End of generation: an open channel surfaces the reasoning it holds; an open tool-call segment
 * (cut by max_tokens) is closed best effort and parsed, else released as content. */
void ci_gemma_output_finish(ci_gemma_output *g, const ci_gemma_sinks *sinks, void *ctx);

/* Tokens generated inside channels so far (markers excluded): usage's reasoning_tokens. */
int ci_gemma_output_reasoning_tokens(const ci_gemma_output *g);

/* Whether a rendered prompt ends inside an open <|channel> (its last one has no <channel|>
 * after it); *name_done tells whether the channel name line is complete in the prompt. */
int ci_gemma_prompt_open(const char *prompt, size_t len, int *name_done);

#endif
