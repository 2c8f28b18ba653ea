/* Gemma 4 tool-call syntax (docs/server.md "Output formats", Gemma 4 tool calls). The text of one
 * tool-call segment — what the model writes between the <|tool_call> and <tool_call|> tokens,
 * decoded with special tokens kept — is one or more `call:NAME{key:value,…}`: strings are delimited
 * by the <|"|> token, keys are bare, numbers, true/false/null, arrays and objects are JSON-like.
 * This file turns that text into OpenAI-style calls {name, arguments: compact JSON string}. */
#ifndef CI_TEXT_GEMMA_TOOL_CALL_H
#define CI_TEXT_GEMMA_TOOL_CALL_H

#include <jansson.h>
#include <stddef.h>

/* The string delimiter token of the Gemma 4 vocabulary. */
#define CI_GEMMA_STRING_QUOTE "<|\"|>"

/* Converts one Gemma value (an object, array, <|"|>string<|"|>, JSON string, number or literal)
 * to JSON: <|"|> strings become JSON-escaped strings, bare keys are quoted, and a bare word that
 * is not a JSON number or literal becomes a string. truncated: the text was cut (max_tokens), so
 * an open string, a dangling key or value and open containers are closed best effort. Returns a
 * new reference, or NULL when the text does not parse. */
json_t *ci_gemma_value_to_json(const char *text, size_t len, int truncated);

/* Parses a whole segment and appends one {name, arguments} object per call to `calls` (arguments
 * re-serialised as compact JSON). tools: the request's OpenAI tool array; when it is non-empty a
 * call must name one of its functions (NULL or empty: any name). truncated: the segment was cut
 * by max_tokens; its last call is closed best effort. Returns the number of calls appended, or -1
 * with nothing appended when the segment is malformed (fail soft: the caller releases its text). */
int ci_gemma_tool_calls_parse(const json_t *tools, const char *text, size_t len, int truncated,
                              json_t *calls);

#endif
