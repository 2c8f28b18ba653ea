/* Internal interfaces of the tokenizer engine, shared by its files: buffers and maps, UTF-8
 * helpers, regex patterns, and the five pipeline stages (normalizer, pre-tokenizer, model,
 * post-processor, decoder) plus added tokens. Not part of the public API.
 *
 * Text travels through the pipeline as spans (offset, length) into one growable arena, so stages
 * that split only record offsets and stages that rewrite text append to the arena. */
#ifndef CI_TEXT_TOK_INTERNAL_H
#define CI_TEXT_TOK_INTERNAL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* ==== Buffers and vectors (tok_util.c) ==== */

/* Growable byte buffer; data is kept NUL-terminated once anything was appended. Zero-init. */
typedef struct {
  char *data;
  size_t len, cap;
} tok_buf;

int tok_buf_reserve(tok_buf *b, size_t extra); /* room for len + extra bytes and a NUL */
int tok_buf_append(tok_buf *b, const void *bytes, size_t n);
void tok_buf_free(tok_buf *b);

/* Growable int32 vector. Zero-init. */
typedef struct {
  int32_t *v;
  size_t n, cap;
} tok_ids;

int tok_ids_push(tok_ids *ids, int32_t id);
int tok_ids_append(tok_ids *ids, const int32_t *src, size_t n);
void tok_ids_free(tok_ids *ids);

/* A piece of text inside an arena; at_start marks a piece that begins at offset 0 of the
 * original input (Metaspace's prepend_scheme "first" needs it). */
typedef struct {
  size_t off, len;
  int at_start;
} tok_span;

typedef struct {
  tok_span *v;
  size_t n, cap;
} tok_spans;

int tok_spans_push(tok_spans *s, size_t off, size_t len, int at_start);
void tok_spans_free(tok_spans *s);

/* ==== String -> int32 hash map (tok_util.c) ==== */

/* Keys are copied into an internal arena (NUL-terminated, so tok_strmap_key is a C string).
 * Values are >= 0. Zero-init. */
typedef struct {
  tok_buf keys;
  size_t *key_off;
  uint32_t *key_len;
  uint32_t *key_hash;
  int32_t *value;
  size_t n, cap;
  uint32_t *slots; /* entry index + 1; 0 = empty */
  size_t mask;
} tok_strmap;

uint64_t tok_hash_bytes(const void *bytes, size_t n);
/* Inserts or overwrites; *entry_out (may be NULL) receives the entry index. */
int tok_strmap_put(tok_strmap *m, const char *key, size_t len, int32_t value, size_t *entry_out);
/* The value for key, or -1. */
int32_t tok_strmap_get(const tok_strmap *m, const char *key, size_t len);
/* The entry index for key, or -1. */
long tok_strmap_find(const tok_strmap *m, const char *key, size_t len);
const char *tok_strmap_key(const tok_strmap *m, size_t entry);
void tok_strmap_free(tok_strmap *m);

/* Token vocabulary: token <-> id, ids may have holes. */
typedef struct {
  tok_strmap map;
  long *entry_of_id; /* -1 for holes */
  size_t n_ids;      /* one past the largest id */
  size_t cap_ids;
} tok_vocab;

/* Adds token -> id; a repeated token keeps the last id (as serde's map does). */
int tok_vocab_add(tok_vocab *v, const char *token, size_t len, int32_t id);
int32_t tok_vocab_get(const tok_vocab *v, const char *token, size_t len);
const char *tok_vocab_token(const tok_vocab *v, int32_t id, size_t *len_out);
void tok_vocab_free(tok_vocab *v);

/* ==== UTF-8 (tok_utf8.c) ==== */

/* Length of the longest valid UTF-8 prefix (== n when all valid). */
size_t tok_utf8_valid_prefix(const char *s, size_t n);
/* Decodes the character at s[i] of valid UTF-8; returns its length. */
size_t tok_utf8_next(const char *s, size_t n, size_t i, uint32_t *cp);
/* Length in bytes of the character before s[i] (i > 0) of valid UTF-8. */
size_t tok_utf8_prev_len(const char *s, size_t i);
size_t tok_utf8_encode(uint32_t cp, char out[4]);
/* Appends s with each maximal invalid subsequence replaced by U+FFFD (Rust from_utf8_lossy). */
int tok_utf8_lossy_append(tok_buf *out, const char *s, size_t n);
/* 1 if the code point is Unicode White_Space (Rust char::is_whitespace). */
int tok_is_whitespace(uint32_t cp);
/* 1 for Unicode general categories P* or ASCII punctuation (Rust is_ascii_punctuation ||
 * is_punctuation). */
int tok_is_punctuation(uint32_t cp);
/* 1 for general categories Nd, Nl, No (Rust char::is_numeric). */
int tok_is_numeric(uint32_t cp);
/* 1 for a regex-crate word character (\w: alphabetic, marks, Nd, Pc, join controls). */
int tok_is_word_char(uint32_t cp);

/* GPT-2 byte-level alphabet: the printable code point standing for each byte, and back (-1). */
uint32_t tok_bytelevel_char(uint8_t byte);
int tok_bytelevel_byte(uint32_t cp);

/* ==== Regex and literal patterns (tok_regex.c) ==== */

typedef struct tok_regex tok_regex;

/* Compiles with PCRE2_UTF | PCRE2_UCP and JIT. NULL + error on a bad pattern. */
tok_regex *tok_regex_compile(const char *pattern, size_t len);
void tok_regex_free(tok_regex *re);

/* A tokenizer.json pattern: {"String": s} (literal) or {"Regex": r}. */
typedef struct {
  char *literal;
  size_t literal_len;
  tok_regex *re;
} tok_pattern;

/* Parses {"String": ...} / {"Regex": ...}; `what` names the owner in errors. */
int tok_pattern_parse(json_t *j, tok_pattern *out, const char *what);
void tok_pattern_free(tok_pattern *p);
/* Appends the matches in s[0:n) (valid UTF-8) as spans (off relative to s), iterating like Rust's
 * regex/onig find_iter (no empty match right after the previous match). */
int tok_pattern_find_all(const tok_pattern *p, const char *s, size_t n, tok_spans *matches);

/* ==== JSON helpers (tok_util.c) ==== */

/* The string member `key` of object j, or NULL (a non-string value is NULL too). */
const char *tok_json_str(json_t *j, const char *key);
/* Boolean member with default (a JSON null counts as absent). */
int tok_json_bool(json_t *j, const char *key, int fallback);

/* ==== Split behaviours shared by pre-tokenizers (tok_pretokenizer.c) ==== */

typedef enum {
  TOK_SPLIT_REMOVED,
  TOK_SPLIT_ISOLATED,
  TOK_SPLIT_MERGED_WITH_PREVIOUS,
  TOK_SPLIT_MERGED_WITH_NEXT,
  TOK_SPLIT_CONTIGUOUS
} tok_split_behavior;

/* ==== Pipeline stages ==== */

typedef struct tok_normalizer tok_normalizer;
/* Parses a "normalizer" object (JSON null is not accepted here: callers skip it). */
tok_normalizer *tok_normalizer_parse(json_t *j);
void tok_normalizer_free(tok_normalizer *n);
/* Writes the normalized form of in[0:n) to out (reset first). Clears *keeps_start when text at
 * the start of the input was removed (so the first piece no longer starts at offset 0). */
int tok_normalizer_apply(const tok_normalizer *nz, const char *in, size_t n, tok_buf *out,
                         int *keeps_start);

typedef struct tok_pretok tok_pretok;
tok_pretok *tok_pretok_parse(json_t *j);
void tok_pretok_free(tok_pretok *p);
/* Splits/rewrites the pieces (spans into arena); scratch is working space. */
int tok_pretok_apply(const tok_pretok *p, tok_buf *arena, tok_spans *pieces, tok_spans *scratch);

typedef struct tok_model tok_model;
tok_model *tok_model_parse(json_t *j);
void tok_model_free(tok_model *m);
/* Per-encode-call working memory of a model (word cache, merge heap); created lazily. */
typedef struct tok_model_work tok_model_work;
void tok_model_work_free(const tok_model *m, tok_model_work *w);
/* Appends the ids of one pre-tokenized piece. */
int tok_model_tokenize(const tok_model *m, const char *s, size_t n, tok_model_work **work,
                       tok_ids *out);
const tok_vocab *tok_model_vocab(const tok_model *m);

typedef struct tok_postproc tok_postproc;
tok_postproc *tok_postproc_parse(json_t *j);
void tok_postproc_free(tok_postproc *p);
/* out = ids with the processor's special tokens when add_special. */
int tok_postproc_apply(const tok_postproc *p, int add_special, const int32_t *ids, size_t n,
                       tok_ids *out);

typedef struct tok_decoder tok_decoder;
tok_decoder *tok_decoder_parse(json_t *j);
void tok_decoder_free(tok_decoder *d);
/* Rewrites the token strings (spans into arena) as HF's decode_chain does. */
int tok_decoder_apply(const tok_decoder *d, tok_buf *arena, tok_spans *tokens, tok_spans *scratch);
/* Appends the bytes token string s[0..n) stands for in the middle of a decoded text (raw bytes,
 * never U+FFFD for a partial character) to out. */
int tok_decoder_token_bytes(const tok_decoder *d, const char *s, size_t n, tok_buf *out);

/* ==== Added tokens (tok_added_tokens.c) ==== */

typedef struct {
  char *content;
  size_t len;
  int32_t id;
  int special, lstrip, rstrip, single_word, normalized;
} tok_added_token;

typedef struct tok_trie tok_trie;

typedef struct {
  tok_added_token *tokens;
  size_t n, cap;
  tok_strmap by_content; /* content -> index in tokens */
  int32_t *index_of_id;  /* id -> index in tokens, or -1 */
  size_t n_ids;          /* size of index_of_id */
  tok_trie *raw_trie;    /* contents of tokens with normalized = false */
  tok_trie *norm_trie;   /* normalized contents of tokens with normalized = true */
  char **norm_contents;  /* owned normalized forms, indexed like tokens (NULL for raw) */
  size_t *norm_lens;
} tok_added_vocab;

/* A segment of text: a run of plain text (id -1) or one added token. */
typedef struct {
  size_t off, len;
  int32_t id;
} tok_segment;

typedef struct {
  tok_segment *v;
  size_t n, cap;
} tok_segments;

void tok_segments_free(tok_segments *s);

/* Adds one token (later duplicates of a content replace the earlier entry, like HF). */
int tok_added_add(tok_added_vocab *av, const char *content, size_t len, int32_t id, int special,
                  int lstrip, int rstrip, int single_word, int normalized);
/* Builds the matching tries; the normalized set is matched after normalizer `nz` (may be NULL). */
int tok_added_build(tok_added_vocab *av, const tok_normalizer *nz);
void tok_added_free(tok_added_vocab *av);
const tok_added_token *tok_added_by_id(const tok_added_vocab *av, int32_t id);
const tok_added_token *tok_added_by_content(const tok_added_vocab *av, const char *s, size_t n);
/* Splits s[0:n) (offsets relative to s) on the raw (normalized = 0) or normalized set. */
int tok_added_split(const tok_added_vocab *av, int normalized_set, const char *s, size_t n,
                    tok_segments *out);

#endif
