/* Utility routes (docs/server.md "Routes"): GET /v1/models/{id}, POST /tokenize, POST /detokenize
 * (llama-server's shapes) and Anthropic's POST /v1/messages/count_tokens lives in anthropic.c.
 * Text goes through the model's tokenizer (cinfer.h), nothing is generated. */
#include "server/server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bad(json_t **out, const char *msg) {
  *out = ci_server_error_body(0, 400, "invalid_value", msg);
  return 400;
}

int ci_openai_model(ci_server *s, const char *id, json_t **out) {
  if (strcmp(id, s->o.model_id)) {
    char msg[300];
    snprintf(msg, sizeof msg, "model '%.200s' does not exist (this server serves '%.60s')", id,
             s->o.model_id);
    *out = ci_server_error_body(0, 404, "model_not_found", msg);
    return 404;
  }
  json_t *list = NULL;
  ci_openai_models(s, &list);
  *out = json_incref(json_array_get(json_object_get(list, "data"), 0));
  json_decref(list);
  if (!*out) {
    *out = ci_server_error_body(0, 500, "internal_error", "out of memory");
    return 500;
  }
  return 200;
}

/* {"content": "text", "add_special": false, "with_pieces": false} ->
 * {"tokens": [ids]} or, with pieces, {"tokens": [{"id": n, "piece": "text"}]}. */
int ci_server_tokenize(ci_server *s, const json_t *body, json_t **out) {
  const json_t *content = json_object_get(body, "content");
  const json_t *add_special = json_object_get(body, "add_special");
  const json_t *with_pieces = json_object_get(body, "with_pieces");
  if (!json_is_string(content)) return bad(out, "content must be a string");
  if (add_special && !json_is_boolean(add_special))
    return bad(out, "add_special must be a boolean");
  if (with_pieces && !json_is_boolean(with_pieces))
    return bad(out, "with_pieces must be a boolean");
  int32_t *ids = NULL;
  size_t n = 0;
  if (cinfer_tokenizer_encode(s->o.tokenizer, json_string_value(content),
                              json_string_length(content), json_is_true(add_special), &ids,
                              &n) != CINFER_OK)
    return bad(out, cinfer_last_error());
  json_t *tokens = json_array();
  int failed = !tokens;
  for (size_t i = 0; i < n && !failed; i++) {
    if (!json_is_true(with_pieces)) {
      failed = json_array_append_new(tokens, json_integer(ids[i])) != 0;
      continue;
    }
    char *piece = NULL;
    size_t len = 0;
    failed = cinfer_tokenizer_decode(s->o.tokenizer, &ids[i], 1, 0, &piece, &len) != CINFER_OK;
    /* a piece that is part of a UTF-8 sequence is not valid JSON text: give its bytes instead */
    json_t *p = failed ? NULL : json_stringn(piece, len);
    if (!failed && !p) {
      p = json_array();
      for (size_t k = 0; p && k < len; k++)
        json_array_append_new(p, json_integer((unsigned char)piece[k]));
    }
    cinfer_free(piece);
    failed = failed || !p ||
             json_array_append_new(tokens, json_pack("{s:i, s:o}", "id", ids[i], "piece", p));
  }
  cinfer_free(ids);
  if (failed) {
    json_decref(tokens);
    *out = ci_server_error_body(0, 500, "internal_error", "out of memory");
    return 500;
  }
  *out = json_pack("{s:o}", "tokens", tokens);
  return 200;
}

/* {"tokens": [ids]} -> {"content": "text"} (special tokens kept). */
int ci_server_detokenize(ci_server *s, const json_t *body, json_t **out) {
  const json_t *tokens = json_object_get(body, "tokens");
  if (!json_is_array(tokens)) return bad(out, "tokens must be an array of token ids");
  const size_t n = json_array_size(tokens);
  int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
  if (!ids) {
    *out = ci_server_error_body(0, 500, "internal_error", "out of memory");
    return 500;
  }
  for (size_t i = 0; i < n; i++) {
    const json_t *t = json_array_get(tokens, i);
    const json_int_t v = json_integer_value(t);
    if (!json_is_integer(t) || v < 0 || v >= s->o.vocab) {
      free(ids);
      char msg[160];
      snprintf(msg, sizeof msg, "tokens[%zu] is not a token id (integers 0..%d)", i,
               s->o.vocab - 1);
      return bad(out, msg);
    }
    ids[i] = (int32_t)v;
  }
  char *text = NULL;
  size_t len = 0;
  const cinfer_status st = cinfer_tokenizer_decode(s->o.tokenizer, ids, n, 0, &text, &len);
  free(ids);
  if (st != CINFER_OK) return bad(out, cinfer_last_error());
  *out = json_pack("{s:s%}", "content", text ? text : "", len);
  cinfer_free(text);
  if (!*out) { /* bytes that are not UTF-8 (a cut multi-byte character) */
    *out = ci_server_error_body(0, 400, "invalid_value",
                                "the tokens decode to bytes that are not valid UTF-8");
    return 400;
  }
  return 200;
}
