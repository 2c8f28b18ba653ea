/* Unigram model (SentencePiece): Viterbi over all vocabulary pieces that start at each character,
 * unknown characters scored min_score - 10 and fused, then byte fallback or unk per piece, as HF's
 * Unigram::encode_optimized and tokenize do. */
#include "base/error.h"
#include "text/tok_model.h"

#include <float.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  double *scores; /* by id */
  int32_t unk_id; /* -1 when absent */
  int byte_fallback;
  double min_score;
  size_t max_piece_len; /* bytes */
  int32_t byte_ids[256];
} unigram;

typedef struct {
  int32_t id;
  double score;
  long starts_at; /* -1 = unreached */
} path_node;

static void unigram_free(void *impl) {
  unigram *u = impl;
  free(u->scores);
  free(u);
}

static int unigram_parse(tok_model *m, json_t *j) {
  unigram *u = calloc(1, sizeof *u);
  if (!u) return ci_fail("tokenizer: out of memory");
  m->impl = u;
  json_t *vocab = json_object_get(j, "vocab");
  if (!json_is_array(vocab)) return ci_fail("model Unigram: \"vocab\" must be a list");
  size_t n = json_array_size(vocab);
  if (n == 0) return ci_fail("model Unigram: \"vocab\" is empty");
  u->scores = malloc(n * sizeof *u->scores);
  if (!u->scores) return ci_fail("tokenizer: out of memory");
  u->min_score = DBL_MAX;
  for (size_t i = 0; i < n; i++) {
    json_t *e = json_array_get(vocab, i);
    json_t *piece = json_array_get(e, 0), *score = json_array_get(e, 1);
    if (!json_is_array(e) || !json_is_string(piece) || !json_is_number(score))
      return ci_fail("model Unigram: vocab entry %zu must be [piece, score]", i);
    size_t len = json_string_length(piece);
    if (tok_vocab_add(&m->vocab, json_string_value(piece), len, (int32_t)i)) return CI_ERR;
    u->scores[i] = json_number_value(score);
    if (u->scores[i] < u->min_score) u->min_score = u->scores[i];
    if (len > u->max_piece_len) u->max_piece_len = len;
  }
  json_t *unk = json_object_get(j, "unk_id");
  u->unk_id = -1;
  if (json_is_integer(unk)) {
    if (json_integer_value(unk) < 0 || (size_t)json_integer_value(unk) >= n)
      return ci_fail("model Unigram: unk_id %lld is outside the vocab", json_integer_value(unk));
    u->unk_id = (int32_t)json_integer_value(unk);
  }
  u->byte_fallback = tok_json_bool(j, "byte_fallback", 0);
  for (int i = 0; i < 256; i++) {
    char name[8];
    static const char hex[] = "0123456789ABCDEF";
    memcpy(name, "<0x", 3);
    name[3] = hex[i >> 4];
    name[4] = hex[i & 15];
    name[5] = '>';
    u->byte_ids[i] = tok_vocab_get(&m->vocab, name, 6);
  }
  return CI_OK;
}

/* Emits one piece string: its id, else its bytes' <0xXX> tokens, else unk. */
static int emit_piece(const tok_model *m, const unigram *u, const char *s, size_t len,
                      tok_ids *out) {
  int32_t id = tok_vocab_get(&m->vocab, s, len);
  if (id >= 0) return tok_ids_push(out, id);
  if (u->byte_fallback) {
    int all = 1;
    for (size_t k = 0; k < len; k++) all &= u->byte_ids[(unsigned char)s[k]] >= 0;
    if (all) {
      for (size_t k = 0; k < len; k++)
        if (tok_ids_push(out, u->byte_ids[(unsigned char)s[k]])) return CI_ERR;
      return CI_OK;
    }
  }
  if (u->unk_id < 0) return ci_fail("model Unigram: unknown text and no unk_id");
  return tok_ids_push(out, u->unk_id);
}

static int unigram_tokenize(const tok_model *m, const char *s, size_t n, tok_model_work **work,
                            tok_ids *out) {
  const unigram *u = m->impl;
  if (n == 0) return CI_OK;
  path_node *best = malloc((n + 1) * sizeof *best);
  size_t *bounds = malloc((n + 1) * sizeof *bounds);
  if (!best || !bounds) {
    free(best);
    free(bounds);
    return ci_fail("tokenizer: out of memory");
  }
  for (size_t i = 0; i <= n; i++) best[i] = (path_node){-1, 0.0, -1};
  best[0].starts_at = 0;
  double unk_score = u->min_score - 10.0;
  int rc = CI_OK;
  for (size_t start = 0; start < n && rc == CI_OK;) {
    uint32_t cp;
    size_t mblen = tok_utf8_next(s, n, start, &cp);
    double here = best[start].score;
    int single = 0;
    for (size_t end = start + mblen; end <= n && end - start <= u->max_piece_len;) {
      int32_t id = tok_vocab_get(&m->vocab, s + start, end - start);
      if (id >= 0) {
        double cand = u->scores[id] + here;
        if (best[end].starts_at < 0 || cand > best[end].score)
          best[end] = (path_node){id, cand, (long)start};
        if (end - start == mblen) single = 1;
      }
      if (end == n) break;
      end += tok_utf8_next(s, n, end, &cp);
    }
    if (!single) {
      if (u->unk_id < 0) rc = ci_fail("model Unigram: unknown character and no unk_id");
      double cand = unk_score + here;
      if (best[start + mblen].starts_at < 0 || cand > best[start + mblen].score)
        best[start + mblen] = (path_node){u->unk_id, cand, (long)start};
    }
    start += mblen;
  }
  /* Walk back from the end collecting pieces (right to left), then emit them left to right
   * with consecutive unknown pieces fused into one string. */
  size_t np = 0, end = n;
  while (rc == CI_OK && end > 0) {
    size_t st = (size_t)best[end].starts_at;
    bounds[np++] = end;
    end = st;
  }
  size_t piece_start = 0;
  for (size_t k = np; rc == CI_OK && k-- > 0;) {
    size_t piece_end = bounds[k];
    int unk = u->unk_id >= 0 && best[piece_end].id == u->unk_id;
    while (unk && k > 0 && best[bounds[k - 1]].id == u->unk_id) piece_end = bounds[--k];
    rc = emit_piece(m, u, s + piece_start, piece_end - piece_start, out);
    piece_start = piece_end;
  }
  free(best);
  free(bounds);
  return rc;
}

const tok_model_kind tok_unigram_kind = {"Unigram", unigram_parse, unigram_free, unigram_tokenize,
                                         NULL};
