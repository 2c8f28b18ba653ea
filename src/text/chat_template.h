/* Chat templates: a model's Jinja chat template (DIR/chat_template.jinja, else
 * tokenizer_config.json's "chat_template" as a string or a named list) rendered over a chat
 * request with the variables transformers passes (messages, tools, documents,
 * add_generation_prompt, the special tokens, and every extra request key). */
#ifndef CI_TEXT_CHAT_TEMPLATE_H
#define CI_TEXT_CHAT_TEMPLATE_H

#include <jansson.h>
#include <stddef.h>

typedef struct ci_chat_template ci_chat_template;

/* Loads the chat template of a model folder: DIR/chat_template.jinja, else tokenizer_config.json's
 * chat_template (string or named list), plus bos_token/eos_token. NULL + ci_last_error() on failure
 * (including "model has no chat template"). Caller frees with ci_chat_template_free. */
ci_chat_template *ci_chat_template_load_dir(const char *model_dir);
/* Template from source text (tests, --chat-template FILE); bos/eos may be NULL. */
ci_chat_template *ci_chat_template_from_source(const char *source, const char *bos_token,
                                               const char *eos_token);
void ci_chat_template_free(ci_chat_template *t);
/* Renders a request object (jansson json_t*: {messages, tools?, add_generation_prompt?, ...extra}).
 * *out is malloc'd (caller frees). On raise_exception returns CI_ERR with the template's message as
 * ci_last_error() (exactly the message, so the CLI can print it). With a named template list, the
 * "tool_use" template is used when the request has tools and it exists, else "default" (as
 * transformers does). */
int ci_chat_template_render(const ci_chat_template *t, const json_t *request, char **out,
                            size_t *out_len);
/* Whether any of the template's sources contains needle (reasoning-format detection,
 * docs/server.md "Output formats": "<|channel>" means gemma-channel). */
int ci_chat_template_mentions(const ci_chat_template *t, const char *needle);
const char *ci_chat_template_bos_token(const ci_chat_template *t); /* may be NULL */
const char *ci_chat_template_eos_token(const ci_chat_template *t); /* may be NULL */

#endif
