/* OpenAI embeddings route (docs/server.md "Embeddings"): POST /v1/embeddings — a string, an array
 * of strings, a token-id array or an array of token-id arrays; each input tokenized (with the
 * tokenizer's special tokens) and embedded by the engine (cinfer_engine_embed: final hidden
 * states pooled as the model folder says, L2-normalized); float arrays or base64 of little-endian
 * float32. */
#include "server/server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_INPUTS = 2048 };

static int bad(json_t **out, int status, const char *code, const char *msg) {
  *out = ci_server_error_body(0, status, code, msg);
  return status;
}

/* base64 (RFC 4648, padded) of n bytes; malloc'd, NULL when out of memory. */
static char *base64(const unsigned char *p, size_t n) {
  static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  char *out = malloc((n + 2) / 3 * 4 + 1), *o = out;
  if (!out) return NULL;
  for (size_t i = 0; i < n; i += 3) {
    const unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) |
                       (i + 2 < n ? (unsigned)p[i + 2] : 0);
    *o++ = digits[v >> 18 & 63];
    *o++ = digits[v >> 12 & 63];
    *o++ = i + 1 < n ? digits[v >> 6 & 63] : '=';
    *o++ = i + 2 < n ? digits[v & 63] : '=';
  }
  *o = '\0';
  return out;
}

/* The token ids of one input (a string, or an array of ids); malloc'd in *ids. Returns 0, or -1
 * with msg filled. */
static int input_ids(ci_server *s, const json_t *in, size_t index, int32_t **ids, size_t *n,
                     char *msg, size_t msg_size) {
  *ids = NULL;
  *n = 0;
  if (json_is_string(in)) {
    if (json_string_length(in) == 0) {
      snprintf(msg, msg_size, "input[%zu] is an empty string", index);
      return -1;
    }
    int32_t *got = NULL;
    if (cinfer_tokenizer_encode(s->o.tokenizer, json_string_value(in), json_string_length(in), 1,
                                &got, n) != CINFER_OK) {
      snprintf(msg, msg_size, "input[%zu]: %s", index, cinfer_last_error());
      return -1;
    }
    *ids = malloc((*n ? *n : 1) * sizeof **ids);
    if (*ids) memcpy(*ids, got, *n * sizeof **ids);
    cinfer_free(got);
    if (!*ids) snprintf(msg, msg_size, "out of memory");
    return *ids ? 0 : -1;
  }
  if (!json_is_array(in) || json_array_size(in) == 0) {
    snprintf(msg, msg_size, "input[%zu] must be a non-empty string or array of token ids", index);
    return -1;
  }
  *n = json_array_size(in);
  *ids = malloc(*n * sizeof **ids);
  if (!*ids) {
    snprintf(msg, msg_size, "out of memory");
    return -1;
  }
  for (size_t i = 0; i < *n; i++) {
    const json_t *t = json_array_get(in, i);
    const json_int_t v = json_integer_value(t);
    if (!json_is_integer(t) || v < 0 || v >= s->o.vocab) {
      snprintf(msg, msg_size, "input[%zu][%zu] is not a token id (integers 0..%d)", index, i,
               s->o.vocab - 1);
      free(*ids);
      *ids = NULL;
      return -1;
    }
    (*ids)[i] = (int32_t)v;
  }
  return 0;
}

int ci_openai_embeddings(ci_server *s, json_t *body, json_t **out) {
  const json_t *input = json_object_get(body, "input");
  const json_t *format = json_object_get(body, "encoding_format");
  const json_t *dims = json_object_get(body, "dimensions");
  const int hidden = cinfer_model_hidden_size(s->o.model);
  if (format && !json_is_null(format) &&
      (!json_is_string(format) ||
       (strcmp(json_string_value(format), "float") && strcmp(json_string_value(format), "base64"))))
    return bad(out, 400, "invalid_value", "encoding_format must be \"float\" or \"base64\"");
  const int as_base64 = json_is_string(format) && !strcmp(json_string_value(format), "base64");
  if (dims && !json_is_null(dims) && json_integer_value(dims) != hidden) {
    char msg[160];
    snprintf(msg, sizeof msg, "dimensions must be this model's embedding size, %d", hidden);
    return bad(out, 400, "invalid_value", msg);
  }
  /* the inputs: one string or id array, or an array of them */
  json_t *list = NULL;
  if (json_is_string(input) || (json_is_array(input) && json_array_size(input) > 0 &&
                                json_is_integer(json_array_get(input, 0))))
    list = json_pack("[O]", input);
  else if (json_is_array(input) && json_array_size(input) > 0)
    list = json_incref((json_t *)input);
  else
    return bad(out, 400, "invalid_value",
               "input must be a string, an array of strings, an array of token ids or an array "
               "of token-id arrays (non-empty)");
  if (!list) return bad(out, 500, "internal_error", "out of memory");
  if (json_array_size(list) > MAX_INPUTS) {
    json_decref(list);
    char msg[96];
    snprintf(msg, sizeof msg, "at most %d inputs per request", MAX_INPUTS);
    return bad(out, 400, "invalid_value", msg);
  }
  json_t *data = json_array();
  float *vec = malloc((size_t)hidden * sizeof *vec);
  long long tokens = 0;
  int status = data && vec ? 200 : 500;
  char msg[300] = "out of memory";
  const char *code = "internal_error";
  size_t i;
  json_t *in;
  json_array_foreach(list, i, in) {
    if (status != 200) break;
    int32_t *ids = NULL;
    size_t n = 0;
    if (input_ids(s, in, i, &ids, &n, msg, sizeof msg)) {
      status = strcmp(msg, "out of memory") ? 400 : 500;
      code = status == 400 ? "invalid_value" : "internal_error";
      break;
    }
    const cinfer_status st =
        cinfer_engine_embed(s->o.engine, ids, n, cinfer_model_pooling(s->o.model), vec);
    free(ids);
    if (st != CINFER_OK) {
      status = st == CINFER_CONTEXT_EXCEEDED || st == CINFER_INVALID_ARGUMENT ? 400 : 503;
      code = st == CINFER_CONTEXT_EXCEEDED ? "context_length_exceeded"
             : status == 400               ? "invalid_value"
                                           : "overloaded";
      snprintf(msg, sizeof msg, "input[%zu]: %s", i, cinfer_last_error());
      break;
    }
    tokens += (long long)n;
    json_t *embedding = NULL;
    if (as_base64) {
      char *text = base64((const unsigned char *)vec, (size_t)hidden * sizeof *vec);
      embedding = text ? json_string(text) : NULL;
      free(text);
    } else {
      embedding = json_array();
      for (int k = 0; embedding && k < hidden; k++)
        if (json_array_append_new(embedding, json_real(vec[k]))) {
          json_decref(embedding);
          embedding = NULL;
        }
    }
    if (!embedding ||
        json_array_append_new(data, json_pack("{s:s, s:I, s:o}", "object", "embedding", "index",
                                              (json_int_t)i, "embedding", embedding))) {
      status = 500;
      code = "internal_error";
      snprintf(msg, sizeof msg, "out of memory");
    }
  }
  json_decref(list);
  free(vec);
  if (status != 200) {
    json_decref(data);
    return bad(out, status, code, msg);
  }
  *out = json_pack("{s:s, s:o, s:s, s:{s:I, s:I}}", "object", "list", "data", data, "model",
                   s->o.model_id, "usage", "prompt_tokens", (json_int_t)tokens, "total_tokens",
                   (json_int_t)tokens);
  return *out ? 200 : bad(out, 500, "internal_error", "out of memory");
}
