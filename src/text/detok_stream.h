/* Streaming detokenizer: turns generated token ids into text deltas as soon as the text is stable
 * (never inside a UTF-8 character, never a trailing U+FFFD a later byte token could complete), with
 * stop strings matched across token boundaries and never emitted. The concatenation of all deltas
 * equals ci_tokenizer_decode of all pushed ids (cut before the first stop string). */
#ifndef CI_TEXT_DETOK_STREAM_H
#define CI_TEXT_DETOK_STREAM_H

#include "text/tokenizer.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ci_detok_stream ci_detok_stream;

/* Creates a stream over `tok` (borrowed; must outlive the stream). stop_strings (copied; empty ones
 * are ignored) may be NULL when n_stop is 0. skip_special drops special added tokens, as in
 * ci_tokenizer_decode. NULL + ci_last_error() on failure. The caller frees. */
ci_detok_stream *ci_detok_stream_create(const ci_tokenizer *tok, const char *const *stop_strings,
                                        size_t n_stop, int skip_special);
void ci_detok_stream_free(ci_detok_stream *s);

/* Feeds one id. Sets *piece and *len to the text that became final (may be empty; owned by the
 * stream, valid until the next call). Returns 0 to continue, 1 when a stop string completed (piece
 * = text before it; nothing after it is ever emitted, later calls return 1 with an empty piece),
 * CI_ERR on error (an id outside the vocabulary). */
int ci_detok_stream_push(ci_detok_stream *s, int32_t id, const char **piece, size_t *len);

/* End of generation: releases any held-back text (a stop string completed by it still cuts the
 * text and makes the call return 1). */
int ci_detok_stream_finish(ci_detok_stream *s, const char **piece, size_t *len);

/* The stop string that completed (the stream's copy; the earliest in the text, the first given on
 * a tie), or NULL while none has. */
const char *ci_detok_stream_stop_string(const ci_detok_stream *s);

#endif
