/* Text in and out for the generating verbs: a model folder's tokenizer and chat template,
 * prompts built from plain text or chat messages, and a streaming printer that turns generated
 * ids into text (UTF-8 safe, stop strings never printed). */
#ifndef CI_CLI_TEXT_SESSION_H
#define CI_CLI_TEXT_SESSION_H

#include "text/chat_template.h"
#include "text/detok_stream.h"
#include "text/tokenizer.h"

#include <jansson.h>
#include <stdint.h>

typedef struct {
  ci_tokenizer *tokenizer;
  ci_chat_template *chat_template; /* NULL when the model has none */
} ci_text_session;

/* Loads DIR's tokenizer (required) and chat template (when `need_template`, required; else
 * optional). Prints the error and returns 1 on failure. */
int ci_text_session_open(const char *model_dir, int need_template, ci_text_session *out);
void ci_text_session_close(ci_text_session *s);

/* Token ids of plain text with the tokenizer's special tokens (BOS), like llama.cpp's prompt.
 * Returns a malloc'd array or NULL (error printed). */
int32_t *ci_text_session_plain(const ci_text_session *s, const char *text, int *n_ids);

/* Token ids of a chat: renders {messages, add_generation_prompt: true} with the chat template and
 * encodes the rendering without adding special tokens (transformers' apply_chat_template).
 * Returns a malloc'd array or NULL (error printed). */
int32_t *ci_text_session_chat(const ci_text_session *s, json_t *messages, int *n_ids);

/* Streams generated ids as text to stdout. */
typedef struct {
  ci_detok_stream *stream;
  char *text; /* everything printed (for --json and chat history); malloc'd */
  size_t len, cap;
  int echo;    /* print to stdout as it comes */
  int stopped; /* a stop string completed */
} ci_text_printer;

/* A printer over the session's tokenizer with up to n_stop stop strings. 1 on failure. */
int ci_text_printer_init(ci_text_printer *p, const ci_text_session *s, const char *const *stop,
                         size_t n_stop, int echo);
void ci_text_printer_free(ci_text_printer *p);

/* ci_token_callback: feeds one id; returns 1 when a stop string completed, -1 on error. */
int ci_text_printer_on_token(void *ctx, int32_t id);

/* Flushes held-back text at the end of generation. Returns 0 or -1. */
int ci_text_printer_finish(ci_text_printer *p);

#endif
