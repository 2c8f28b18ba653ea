/* Text in and out for the generating verbs: prompts built from plain text or chat messages with
 * the model's tokenizer and chat template, and a streaming printer that turns generated ids into
 * text (cinfer_detokenizer: UTF-8 safe, stop strings never printed). */
#ifndef CI_CLI_TEXT_SESSION_H
#define CI_CLI_TEXT_SESSION_H

#include "cinfer.h"

#include <jansson.h>
#include <stdint.h>

/* Token ids of plain text with the tokenizer's special tokens (BOS), like llama.cpp's prompt.
 * Returns an array (free with cinfer_free) or NULL (error printed). */
int32_t *ci_text_prompt_plain(const cinfer_model *model, const char *text, int *n_ids);

/* Token ids of a chat: renders {messages, add_generation_prompt: true} with own_template (from
 * --chat-template), else the model's chat template, and encodes the rendering without adding
 * special tokens (transformers' apply_chat_template). Returns an array (free with cinfer_free) or
 * NULL (error printed). */
int32_t *ci_text_prompt_chat(const cinfer_model *model, const cinfer_chat_template *own_template,
                             json_t *messages, int *n_ids);

/* Streams generated ids as text to stdout. */
typedef struct {
  cinfer_detokenizer *detok;
  char *text; /* everything printed (for --json and chat history); malloc'd */
  size_t len, cap;
  int echo;    /* print to stdout as it comes */
  int stopped; /* a stop string completed */
} ci_text_printer;

/* A printer over the model's tokenizer with up to n_stop stop strings. Prints the error and
 * returns 1 on failure. */
int ci_text_printer_init(ci_text_printer *p, const cinfer_model *model, const char *const *stop,
                         size_t n_stop, int echo);
void ci_text_printer_free(ci_text_printer *p);

/* cinfer_token_callback: feeds one id; returns 1 when a stop string completed (generation
 * stops), -1 on error. */
int ci_text_printer_on_token(void *ctx, int32_t id);

/* Flushes held-back text at the end of generation. Returns 0 or -1. */
int ci_text_printer_finish(ci_text_printer *p);

#endif
