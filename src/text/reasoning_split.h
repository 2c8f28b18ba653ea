/* Reasoning split for the think-tag format (docs/server.md "Output formats"): streamed visible text
 * is divided into reasoning (between <think> and </think>) and content, with partial tags held back
 * and the tags themselves never emitted. */
#ifndef CI_TEXT_REASONING_SPLIT_H
#define CI_TEXT_REASONING_SPLIT_H

#include <stddef.h>

typedef struct ci_reasoning_split ci_reasoning_split;

/* A splitter; in_reasoning = 1 when the prompt ends inside an open <think> (the template primed
 * it). NULL on out of memory. The caller frees. */
ci_reasoning_split *ci_reasoning_split_create(int in_reasoning);
void ci_reasoning_split_free(ci_reasoning_split *s);

/* Receives the pieces of one push (or of finish). The strings are owned by the splitter and valid
 * until the next call. */
typedef void (*ci_reasoning_sink)(void *ctx, int is_reasoning, const char *text, size_t len);

/* Feeds a piece of visible text; emits the parts that became final to `sink`. */
void ci_reasoning_split_push(ci_reasoning_split *s, const char *text, size_t len,
                             ci_reasoning_sink sink, void *ctx);

/* End of the text: releases a held-back partial tag as text of the current kind. */
void ci_reasoning_split_finish(ci_reasoning_split *s, ci_reasoning_sink sink, void *ctx);

/* Whether a prompt ends inside an open <think> (its last <think> has no </think> after it). */
int ci_reasoning_prompt_open(const char *prompt, size_t len);

#endif
