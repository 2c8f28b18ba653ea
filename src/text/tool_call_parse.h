/* Tool calls in generated text (docs/server.md "Output formats",
 * text tool-call parser): hermes JSON
 * `<tool_call>{"name":…,"arguments":…}</tool_call>` and the Qwen XML format of Qwen3-Coder and
 * Qwen3.5 `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n
 * </tool_call>` (wrapper optional; values typed by the tool's schema as vLLM's qwen3_coder parser
 * does). Streamed content passes through until a marker; a suffix that could start a marker is
 * held back; each block is parsed when it closes and becomes a call, or (fail soft: malformed,
 * unknown tool) is released as content. Whitespace between and after calls is not content. */
#ifndef CI_TEXT_TOOL_CALL_PARSE_H
#define CI_TEXT_TOOL_CALL_PARSE_H

#include <jansson.h>
#include <stddef.h>

typedef struct ci_tool_parser ci_tool_parser;

/* tools: the request's OpenAI tool array ({type, function:{name, parameters}}), borrowed (must
 * outlive the parser); names outside it make a block fail soft. NULL on out of memory. */
ci_tool_parser *ci_tool_parser_create(const json_t *tools);
void ci_tool_parser_free(ci_tool_parser *p);

/* Output of a push: content text (owned by the parser, valid until the next call) and tool calls
 * appended to `calls` as {name, arguments: compact JSON string}. */
typedef void (*ci_tool_content_sink)(void *ctx, const char *text, size_t len);

void ci_tool_parser_push(ci_tool_parser *p, const char *text, size_t len, json_t *calls,
                         ci_tool_content_sink sink, void *ctx);

/* End of text: an unclosed block is parsed best effort, else released as content. */
void ci_tool_parser_finish(ci_tool_parser *p, json_t *calls, ci_tool_content_sink sink, void *ctx);

/* Parses one complete block (markers included). Returns a new {name, arguments} object or NULL. */
json_t *ci_tool_call_parse_block(const json_t *tools, const char *block, size_t len);

#endif
