/* Tokenizer loading and the encode/decode pipelines: tokenizer.json (+ tokenizer_config.json) into
 * the five stages and the added vocabulary; encode = split on added tokens, normalize, split on
 * normalized added tokens, pre-tokenize, model, post-process; decode = ids to token strings,
 * decoder chain, concatenation. */
#include "text/tokenizer.h"

#include "base/error.h"
#include "text/tok_internal.h"
#include "text/tok_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { CONFIG_BOS, CONFIG_EOS, CONFIG_PAD, CONFIG_UNK, CONFIG_N };
static const char *const config_keys[CONFIG_N] = {"bos_token", "eos_token", "pad_token",
                                                  "unk_token"};

struct ci_tokenizer {
  tok_normalizer *normalizer; /* each may be NULL */
  tok_pretok *pretok;
  tok_model *model;
  tok_postproc *post;
  tok_decoder *decoder;
  tok_added_vocab added;
  size_t vocab_size;
  char *config_tokens[CONFIG_N]; /* from tokenizer_config.json, NULL when absent */
};

/* ==== Loading ==== */

void ci_tokenizer_free(ci_tokenizer *tok) {
  if (!tok) return;
  if (tok->normalizer) tok_normalizer_free(tok->normalizer);
  if (tok->pretok) tok_pretok_free(tok->pretok);
  tok_model_free(tok->model);
  if (tok->post) tok_postproc_free(tok->post);
  if (tok->decoder) tok_decoder_free(tok->decoder);
  tok_added_free(&tok->added);
  for (int i = 0; i < CONFIG_N; i++) free(tok->config_tokens[i]);
  free(tok);
}

/* HF's AddedVocabulary::add_tokens id rule: an existing id for the content (added tokens, then
 * the model), else the next free id after the model vocabulary and the added tokens. */
static int32_t added_token_id(const ci_tokenizer *tok, const char *content, size_t len) {
  const tok_added_token *t = tok_added_by_content(&tok->added, content, len);
  if (t) return t->id;
  int32_t id = tok_vocab_get(tok_model_vocab(tok->model), content, len);
  if (id >= 0) return id;
  size_t model_size = tok_model_vocab(tok->model)->map.n;
  int64_t max = -1;
  for (size_t i = 0; i < tok->added.n; i++)
    if (tok->added.tokens[i].id > max) max = tok->added.tokens[i].id;
  if (max < 0) return (int32_t)model_size;
  if ((size_t)max >= model_size || model_size == 0) return (int32_t)(max + 1);
  return (int32_t)model_size;
}

static int add_token_json(ci_tokenizer *tok, json_t *t, const char *where, size_t i) {
  json_t *content = json_object_get(t, "content");
  if (!json_is_object(t) || !json_is_string(content))
    return ci_fail("%s entry %zu needs a string \"content\"", where, i);
  int special = tok_json_bool(t, "special", 0);
  const char *s = json_string_value(content);
  size_t len = json_string_length(content);
  int32_t id = added_token_id(tok, s, len);
  return tok_added_add(&tok->added, s, len, id, special, tok_json_bool(t, "lstrip", 0),
                       tok_json_bool(t, "rstrip", 0), tok_json_bool(t, "single_word", 0),
                       tok_json_bool(t, "normalized", !special));
}

/* Parses an optional stage: absent or null leaves *out NULL. */
#define PARSE_STAGE(root, key, parse, out, name)                                                   \
  do {                                                                                             \
    json_t *stage_ = json_object_get(root, key);                                                   \
    if (stage_ && !json_is_null(stage_) && !((out) = parse(stage_))) {                             \
      ci_fail_context("\"%s\"", name);                                                             \
      goto fail;                                                                                   \
    }                                                                                              \
  } while (0)

static ci_tokenizer *tokenizer_from_root(json_t *root) {
  if (!json_is_object(root)) {
    ci_fail("tokenizer.json must hold a JSON object");
    return NULL;
  }
  ci_tokenizer *tok = calloc(1, sizeof *tok);
  if (!tok) {
    ci_fail("tokenizer: out of memory");
    return NULL;
  }
  json_t *model = json_object_get(root, "model");
  if (!model) {
    ci_fail("tokenizer.json has no \"model\"");
    goto fail;
  }
  if (!(tok->model = tok_model_parse(model))) {
    ci_fail_context("\"model\"");
    goto fail;
  }
  PARSE_STAGE(root, "normalizer", tok_normalizer_parse, tok->normalizer, "normalizer");
  PARSE_STAGE(root, "pre_tokenizer", tok_pretok_parse, tok->pretok, "pre_tokenizer");
  PARSE_STAGE(root, "post_processor", tok_postproc_parse, tok->post, "post_processor");
  PARSE_STAGE(root, "decoder", tok_decoder_parse, tok->decoder, "decoder");
  json_t *added = json_object_get(root, "added_tokens");
  if (added && !json_is_null(added) && !json_is_array(added)) {
    ci_fail("\"added_tokens\" must be a list");
    goto fail;
  }
  for (size_t i = 0; i < json_array_size(added); i++)
    if (add_token_json(tok, json_array_get(added, i), "\"added_tokens\"", i)) goto fail;
  return tok;
fail:
  ci_tokenizer_free(tok);
  return NULL;
}

/* Builds the added-token tries and the vocabulary size once everything is in. */
static int tokenizer_finish(ci_tokenizer *tok) {
  if (tok_added_build(&tok->added, tok->normalizer)) return CI_ERR;
  tok->vocab_size = tok_model_vocab(tok->model)->n_ids;
  if (tok->added.n_ids > tok->vocab_size) tok->vocab_size = tok->added.n_ids;
  return CI_OK;
}

ci_tokenizer *ci_tokenizer_load_json(const char *json_text, size_t len) {
  json_error_t err;
  json_t *root = json_loadb(json_text, len, JSON_ALLOW_NUL, &err);
  if (!root) {
    ci_fail("tokenizer.json: invalid JSON at line %d column %d: %s", err.line, err.column,
            err.text);
    return NULL;
  }
  ci_tokenizer *tok = tokenizer_from_root(root);
  json_decref(root);
  if (tok && tokenizer_finish(tok)) {
    ci_tokenizer_free(tok);
    return NULL;
  }
  if (!tok) ci_fail_context("tokenizer.json");
  return tok;
}

static ci_tokenizer *load_path(const char *path) {
  json_error_t err;
  json_t *root = json_load_file(path, JSON_ALLOW_NUL, &err);
  if (!root) {
    if (!ci_fail_if_unopenable(path))
      ci_fail("%s: %s (line %d column %d)", path, err.text, err.line, err.column);
    return NULL;
  }
  ci_tokenizer *tok = tokenizer_from_root(root);
  json_decref(root);
  if (!tok) ci_fail_context("%s", path);
  return tok;
}

ci_tokenizer *ci_tokenizer_load_file(const char *tokenizer_json_path) {
  ci_tokenizer *tok = load_path(tokenizer_json_path);
  if (tok && tokenizer_finish(tok)) {
    ci_fail_context("%s", tokenizer_json_path);
    ci_tokenizer_free(tok);
    return NULL;
  }
  return tok;
}

/* tokenizer_config.json: added_tokens_decoder entries unknown to tokenizer.json, and the names of
 * the bos/eos/pad/unk tokens (a string or {"content": ...}). */
static int apply_config(ci_tokenizer *tok, const char *path) {
  json_error_t err;
  json_t *root = json_load_file(path, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &err);
  if (!root)
    return ci_fail_if_unopenable(path)
               ? CI_ERR
               : ci_fail("%s: %s (line %d column %d)", path, err.text, err.line, err.column);
  int rc = CI_OK;
  json_t *decoder = json_object_get(root, "added_tokens_decoder");
  const char *key;
  json_t *entry;
  size_t i = 0;
  json_object_foreach(decoder, key, entry) {
    const char *content = tok_json_str(entry, "content");
    if (content && !tok_added_by_content(&tok->added, content, strlen(content)) &&
        tok_vocab_get(tok_model_vocab(tok->model), content, strlen(content)) < 0 &&
        (rc = add_token_json(tok, entry, "\"added_tokens_decoder\"", i)))
      break;
    i++;
  }
  for (int k = 0; k < CONFIG_N && rc == CI_OK; k++) {
    json_t *v = json_object_get(root, config_keys[k]);
    const char *name = json_is_string(v) ? json_string_value(v) : tok_json_str(v, "content");
    if (name && !(tok->config_tokens[k] = strdup(name))) rc = ci_fail("tokenizer: out of memory");
  }
  json_decref(root);
  if (rc) ci_fail_context("%s", path);
  return rc;
}

ci_tokenizer *ci_tokenizer_load_dir(const char *model_dir) {
  size_t n = strlen(model_dir) + 32;
  char *path = malloc(n);
  if (!path) {
    ci_fail("tokenizer: out of memory");
    return NULL;
  }
  snprintf(path, n, "%s/tokenizer.json", model_dir);
  ci_tokenizer *tok = load_path(path);
  struct stat st;
  snprintf(path, n, "%s/tokenizer_config.json", model_dir);
  if (tok && stat(path, &st) == 0 && apply_config(tok, path)) {
    ci_tokenizer_free(tok);
    tok = NULL;
  }
  if (tok && tokenizer_finish(tok)) {
    ci_fail_context("%s/tokenizer.json", model_dir);
    ci_tokenizer_free(tok);
    tok = NULL;
  }
  free(path);
  return tok;
}

/* ==== Encode ==== */

typedef struct {
  tok_buf norm, arena;
  tok_spans pieces, scratch;
  tok_segments raw, sub;
  tok_model_work *work;
  tok_ids ids, final;
} encode_state;

static void encode_state_free(const ci_tokenizer *tok, encode_state *st) {
  tok_buf_free(&st->norm);
  tok_buf_free(&st->arena);
  tok_spans_free(&st->pieces);
  tok_spans_free(&st->scratch);
  tok_segments_free(&st->raw);
  tok_segments_free(&st->sub);
  tok_model_work_free(tok->model, st->work);
  tok_ids_free(&st->ids);
  tok_ids_free(&st->final);
}

/* Pre-tokenizes and models one run of normalized text. */
static int encode_run(const ci_tokenizer *tok, encode_state *st, const char *s, size_t n,
                      int at_start) {
  st->arena.len = 0;
  st->pieces.n = 0;
  if (tok_buf_append(&st->arena, s, n) || tok_spans_push(&st->pieces, 0, n, at_start))
    return CI_ERR;
  if (tok->pretok && tok_pretok_apply(tok->pretok, &st->arena, &st->pieces, &st->scratch))
    return CI_ERR;
  for (size_t k = 0; k < st->pieces.n; k++)
    if (tok_model_tokenize(tok->model, st->arena.data + st->pieces.v[k].off, st->pieces.v[k].len,
                           &st->work, &st->ids))
      return CI_ERR;
  return CI_OK;
}

static int encode_segments(const ci_tokenizer *tok, encode_state *st, const char *text,
                           size_t len) {
  if (tok_added_split(&tok->added, 0, text, len, &st->raw)) return CI_ERR;
  for (size_t i = 0; i < st->raw.n; i++) {
    tok_segment seg = st->raw.v[i];
    if (seg.id >= 0) {
      if (tok_ids_push(&st->ids, seg.id)) return CI_ERR;
      continue;
    }
    if (seg.len == 0) continue;
    const char *s = text + seg.off;
    size_t n = seg.len;
    int keeps_start = 1;
    if (tok->normalizer) {
      if (tok_normalizer_apply(tok->normalizer, s, n, &st->norm, &keeps_start)) return CI_ERR;
      s = st->norm.data;
      n = st->norm.len;
    }
    st->sub.n = 0;
    if (tok_added_split(&tok->added, 1, s, n, &st->sub)) return CI_ERR;
    for (size_t k = 0; k < st->sub.n; k++) {
      tok_segment sub = st->sub.v[k];
      if (sub.id >= 0) {
        if (tok_ids_push(&st->ids, sub.id)) return CI_ERR;
      } else if (sub.len && encode_run(tok, st, s + sub.off, sub.len,
                                       seg.off == 0 && keeps_start && sub.off == 0)) {
        return CI_ERR;
      }
    }
  }
  return CI_OK;
}

int ci_tokenizer_encode(const ci_tokenizer *tok, const char *text, size_t len, int add_special,
                        int32_t **ids_out, size_t *n_out) {
  *ids_out = NULL;
  *n_out = 0;
  size_t valid = tok_utf8_valid_prefix(text, len);
  if (valid != len) return ci_fail("tokenize: input is not valid UTF-8 (byte %zu)", valid);
  encode_state st = {0};
  int rc = encode_segments(tok, &st, text, len);
  tok_ids *result = &st.ids;
  if (rc == CI_OK && tok->post) {
    rc = tok_postproc_apply(tok->post, add_special, st.ids.v, st.ids.n, &st.final);
    result = &st.final;
  }
  if (rc == CI_OK) {
    *n_out = result->n;
    *ids_out = malloc((result->n + 1) * sizeof **ids_out);
    if (!*ids_out)
      rc = ci_fail("tokenizer: out of memory");
    else if (result->n)
      memcpy(*ids_out, result->v, result->n * sizeof **ids_out);
  }
  if (rc) *n_out = 0;
  encode_state_free(tok, &st);
  return rc;
}

/* ==== Decode ==== */

/* The token string of id (added tokens first), or NULL. */
static const char *token_of(const ci_tokenizer *tok, int32_t id, size_t *len) {
  const tok_added_token *t = tok_added_by_id(&tok->added, id);
  if (t) return *len = t->len, t->content;
  return tok_vocab_token(tok_model_vocab(tok->model), id, len);
}

static int is_special_content(const ci_tokenizer *tok, const char *s, size_t n) {
  const tok_added_token *t = tok_added_by_content(&tok->added, s, n);
  return t && t->special;
}

int ci_tokenizer_decode(const ci_tokenizer *tok, const int32_t *ids, size_t n, int skip_special,
                        char **text_out, size_t *len_out) {
  *text_out = NULL;
  if (len_out) *len_out = 0;
  tok_buf arena = {0}, out = {0};
  tok_spans tokens = {0}, scratch = {0};
  int rc = tok_buf_reserve(&arena, 64) || tok_buf_reserve(&out, 64) ? CI_ERR : CI_OK;
  for (size_t i = 0; i < n && rc == CI_OK; i++) {
    size_t len;
    const char *s = token_of(tok, ids[i], &len);
    if (!s) {
      rc = ci_fail("detokenize: token id %d is not in the vocabulary (size %zu)", (int)ids[i],
                   tok->vocab_size);
      break;
    }
    if (skip_special && is_special_content(tok, s, len)) continue;
    size_t off = arena.len;
    rc = tok_buf_append(&arena, s, len);
    if (rc == CI_OK) rc = tok_spans_push(&tokens, off, len, 0);
  }
  if (rc == CI_OK && tok->decoder) rc = tok_decoder_apply(tok->decoder, &arena, &tokens, &scratch);
  for (size_t k = 0; k < tokens.n && rc == CI_OK; k++) {
    if (!tok->decoder && k > 0) rc = tok_buf_append(&out, " ", 1);
    if (rc == CI_OK) rc = tok_buf_append(&out, arena.data + tokens.v[k].off, tokens.v[k].len);
  }
  tok_buf_free(&arena);
  tok_spans_free(&tokens);
  tok_spans_free(&scratch);
  if (rc) {
    tok_buf_free(&out);
    return CI_ERR;
  }
  *text_out = out.data;
  if (len_out) *len_out = out.len;
  return CI_OK;
}

int ci_tokenizer_token_bytes(const ci_tokenizer *tok, int32_t id, char **bytes, size_t *len) {
  *bytes = NULL;
  *len = 0;
  size_t n;
  const char *s = token_of(tok, id, &n);
  if (!s)
    return ci_fail("token id %d is not in the vocabulary (size %zu)", (int)id, tok->vocab_size);
  tok_buf out = {0};
  int rc = tok_buf_reserve(&out, n + 1);
  if (rc == CI_OK)
    rc = tok->decoder ? tok_decoder_token_bytes(tok->decoder, s, n, &out)
                      : tok_buf_append(&out, s, n);
  if (rc) {
    tok_buf_free(&out);
    return CI_ERR;
  }
  *bytes = out.data;
  *len = out.len;
  return CI_OK;
}

/* ==== Vocabulary queries ==== */

size_t ci_tokenizer_vocab_size(const ci_tokenizer *tok) {
  return tok->vocab_size;
}

int32_t ci_tokenizer_token_to_id(const ci_tokenizer *tok, const char *token) {
  size_t n = strlen(token);
  const tok_added_token *t = tok_added_by_content(&tok->added, token, n);
  if (t) return t->id;
  return tok_vocab_get(tok_model_vocab(tok->model), token, n);
}

const char *ci_tokenizer_id_to_token(const ci_tokenizer *tok, int32_t id) {
  size_t len;
  return token_of(tok, id, &len);
}

int ci_tokenizer_is_special(const ci_tokenizer *tok, int32_t id) {
  size_t len;
  const char *s = token_of(tok, id, &len);
  return s && is_special_content(tok, s, len);
}

int32_t ci_tokenizer_config_token_id(const ci_tokenizer *tok, const char *key) {
  for (int k = 0; k < CONFIG_N; k++)
    if (!strcmp(config_keys[k], key))
      return tok->config_tokens[k] ? ci_tokenizer_token_to_id(tok, tok->config_tokens[k]) : -1;
  return -1;
}
