/* WordPiece model (BERT): greedy longest-match-first from the start of the word, continuation
 * pieces carrying the "##" prefix; a word with no full cover, or longer than
 * max_input_chars_per_word, becomes the unk token. */
#include "base/error.h"
#include "text/tok_model.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  char *unk_token;
  char *prefix;
  size_t prefix_len;
  size_t max_chars;
} wordpiece;

static void wordpiece_free(void *impl) {
  wordpiece *w = impl;
  free(w->unk_token);
  free(w->prefix);
  free(w);
}

static char *dup_or(json_t *j, const char *key, const char *fallback) {
  const char *s = tok_json_str(j, key);
  return strdup(s ? s : fallback);
}

static int wordpiece_parse(tok_model *m, json_t *j) {
  wordpiece *w = calloc(1, sizeof *w);
  if (!w) return ci_fail("tokenizer: out of memory");
  m->impl = w;
  if (tok_model_read_vocab_object(json_object_get(j, "vocab"), &m->vocab, "WordPiece"))
    return CI_ERR;
  w->unk_token = dup_or(j, "unk_token", "[UNK]");
  w->prefix = dup_or(j, "continuing_subword_prefix", "##");
  if (!w->unk_token || !w->prefix) return ci_fail("tokenizer: out of memory");
  w->prefix_len = strlen(w->prefix);
  json_t *max = json_object_get(j, "max_input_chars_per_word");
  w->max_chars =
      json_is_integer(max) && json_integer_value(max) >= 0 ? (size_t)json_integer_value(max) : 100;
  return CI_OK;
}

static int push_unk(const tok_model *m, const wordpiece *w, tok_ids *out) {
  int32_t id = tok_vocab_get(&m->vocab, w->unk_token, strlen(w->unk_token));
  if (id < 0) return ci_fail("model WordPiece: unk_token \"%s\" is not in the vocab", w->unk_token);
  return tok_ids_push(out, id);
}

static int wordpiece_tokenize(const tok_model *m, const char *s, size_t n, tok_model_work **work,
                              tok_ids *out) {
  const wordpiece *w = m->impl;
  size_t chars = 0;
  for (size_t i = 0; i < n; i++) chars += ((unsigned char)s[i] & 0xC0) != 0x80;
  if (chars > w->max_chars) return push_unk(m, w, out);
  tok_buf candidate = {0};
  size_t first_out = out->n, start = 0;
  int rc = CI_OK, bad = 0;
  while (start < n && rc == CI_OK && !bad) {
    size_t end = n;
    int32_t found = -1;
    while (start < end) {
      candidate.len = 0;
      if ((start > 0 && tok_buf_append(&candidate, w->prefix, w->prefix_len)) ||
          tok_buf_append(&candidate, s + start, end - start)) {
        rc = CI_ERR;
        break;
      }
      found = tok_vocab_get(&m->vocab, candidate.data, candidate.len);
      if (found >= 0) break;
      end -= tok_utf8_prev_len(s, end);
    }
    if (rc) break;
    if (found < 0) {
      bad = 1;
      break;
    }
    rc = tok_ids_push(out, found);
    start = end;
  }
  tok_buf_free(&candidate);
  if (rc) return rc;
  if (bad) {
    out->n = first_out;
    return push_unk(m, w, out);
  }
  return CI_OK;
}

const tok_model_kind tok_wordpiece_kind = {"WordPiece", wordpiece_parse, wordpiece_free,
                                           wordpiece_tokenize, NULL};
