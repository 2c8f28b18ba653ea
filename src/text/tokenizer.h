/* Tokenizer: the Hugging Face tokenizer.json format (normalizer, pre-tokenizer, model,
 * post-processor, decoder, added tokens), byte-exact with the `tokenizers` library. A loaded
 * tokenizer is immutable, so one instance may encode and decode from many threads at once. */
#ifndef CI_TEXT_TOKENIZER_H
#define CI_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct ci_tokenizer ci_tokenizer;

/* Loads DIR/tokenizer.json (and DIR/tokenizer_config.json when present: its added_tokens_decoder
 * entries missing from tokenizer.json are added, and its bos/eos/pad/unk token names are kept for
 * ci_tokenizer_config_token_id). NULL + ci_last_error() on failure. The caller frees. */
ci_tokenizer *ci_tokenizer_load_dir(const char *model_dir);

/* Loads one tokenizer.json file. NULL + ci_last_error() on failure. The caller frees. */
ci_tokenizer *ci_tokenizer_load_file(const char *tokenizer_json_path);

/* Loads a tokenizer from the text of a tokenizer.json held in memory (len bytes). */
ci_tokenizer *ci_tokenizer_load_json(const char *json_text, size_t len);

void ci_tokenizer_free(ci_tokenizer *tok);

/* Encodes `len` bytes of UTF-8 text; *ids_out is malloc'd (caller frees, also when *n_out is 0).
 * add_special applies the post-processor's special tokens (HF add_special_tokens=True).
 * Invalid UTF-8 is an error. Returns CI_OK or CI_ERR. */
int ci_tokenizer_encode(const ci_tokenizer *tok, const char *text, size_t len, int add_special,
                        int32_t **ids_out, size_t *n_out);

/* Decodes ids to a malloc'd NUL-terminated string (caller frees); skip_special drops special added
 * tokens (HF skip_special_tokens). An id outside the vocabulary is an error. */
int ci_tokenizer_decode(const ci_tokenizer *tok, const int32_t *ids, size_t n, int skip_special,
                        char **text_out, size_t *len_out);

/* The bytes token `id` stands for in the middle of a decoded text (GPT-2 byte-level characters
 * and <0xNN> byte-fallback tokens as raw bytes, so a token may hold part of a UTF-8 character):
 * *bytes is malloc'd (caller frees) with *len bytes. Special added tokens give their content. An
 * id outside the vocabulary is an error. */
int ci_tokenizer_token_bytes(const ci_tokenizer *tok, int32_t id, char **bytes, size_t *len);

/* One past the largest token id, added tokens included. */
size_t ci_tokenizer_vocab_size(const ci_tokenizer *tok);

/* The id of a token string (added tokens first, then the model vocabulary); -1 if absent. */
int32_t ci_tokenizer_token_to_id(const ci_tokenizer *tok, const char *token);

/* The token string of an id (owned by the tokenizer); NULL if absent. */
const char *ci_tokenizer_id_to_token(const ci_tokenizer *tok, int32_t id);

/* 1 if id is a special added token (skipped by skip_special), else 0. */
int ci_tokenizer_is_special(const ci_tokenizer *tok, int32_t id);

/* The id named by tokenizer_config.json's `key` ("bos_token", "eos_token", "pad_token",
 * "unk_token"); -1 when the config or the key is absent or names no token. */
int32_t ci_tokenizer_config_token_id(const ci_tokenizer *tok, const char *key);

#endif
