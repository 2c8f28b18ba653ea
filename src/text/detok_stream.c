/* Streaming detokenizer (docs/generation.md §3.1, §3.2): a window of ids from prefix_offset (at
 * least five visible tokens of left context, never starting inside a run of byte-fallback tokens,
 * which HF's ByteFallback decodes as one group) is decoded with and without the newest ids; the
 * difference is the new text. Text ending in U+FFFD waits for the bytes that may complete it (a
 * genuine U+FFFD waits for the next clean token, at most MAX_FFFD_WAIT tokens), and a run of byte
 * tokens waits until it is closed. Stop strings are searched in the unemitted text; the longest
 * suffix that could start one is held back. */
#include "text/detok_stream.h"

#include "base/error.h"
#include "text/tok_internal.h"

#include <stdlib.h>
#include <string.h>

enum { CONTEXT_TOKENS = 5, MAX_FFFD_WAIT = 64, TRIM_AT = 1024 };

struct ci_detok_stream {
  const ci_tokenizer *tok;
  int skip_special;
  char **stops;
  size_t *stop_lens;
  size_t n_stop;
  tok_ids ids;          /* ids from the window start on (older ones are dropped) */
  size_t prefix_offset; /* window start in ids */
  size_t read_offset;   /* ids before this are already turned into text */
  tok_buf pending;      /* decoded text not yet emitted (held for stop strings) */
  tok_buf piece;        /* the last returned piece */
  int stopped;
  const char *fired; /* the stop string that completed (one of stops) */
};

void ci_detok_stream_free(ci_detok_stream *s) {
  if (!s) return;
  for (size_t i = 0; i < s->n_stop; i++) free(s->stops[i]);
  free(s->stops);
  free(s->stop_lens);
  tok_ids_free(&s->ids);
  tok_buf_free(&s->pending);
  tok_buf_free(&s->piece);
  free(s);
}

ci_detok_stream *ci_detok_stream_create(const ci_tokenizer *tok, const char *const *stop_strings,
                                        size_t n_stop, int skip_special) {
  ci_detok_stream *s = calloc(1, sizeof *s);
  if (!s || (n_stop && (!(s->stops = calloc(n_stop, sizeof *s->stops)) ||
                        !(s->stop_lens = calloc(n_stop, sizeof *s->stop_lens))))) {
    ci_detok_stream_free(s);
    ci_fail("detok stream: out of memory");
    return NULL;
  }
  s->tok = tok;
  s->skip_special = skip_special;
  for (size_t i = 0; i < n_stop; i++) {
    if (!stop_strings[i] || !stop_strings[i][0]) continue;
    if (!(s->stops[s->n_stop] = strdup(stop_strings[i]))) {
      ci_detok_stream_free(s);
      ci_fail("detok stream: out of memory");
      return NULL;
    }
    s->stop_lens[s->n_stop++] = strlen(stop_strings[i]);
  }
  if (tok_buf_reserve(&s->pending, 64) || tok_buf_reserve(&s->piece, 64)) {
    ci_detok_stream_free(s);
    return NULL;
  }
  return s;
}

/* ==== Incremental decode ==== */

static int is_byte_token(const ci_tokenizer *tok, int32_t id) {
  const char *t = ci_tokenizer_id_to_token(tok, id);
  return t && strlen(t) == 6 && !memcmp(t, "<0x", 3) && t[5] == '>';
}

static int ends_with_fffd(const char *t, size_t n) {
  return n >= 3 && !memcmp(t + n - 3, "\xEF\xBF\xBD", 3);
}

/* Decodes the window with and without the ids after read_offset and appends the new text to
 * pending. With `force` the text is taken even if it ends in U+FFFD (end of generation). */
static int advance(ci_detok_stream *s, int force) {
  size_t n = s->ids.n;
  if (s->read_offset == n) return CI_OK;
  /* HF's ByteFallback decodes a run of byte tokens as one group (all U+FFFD if the group is not
   * valid UTF-8), so a run's text is final only once a non-byte token closes it. */
  if (!force && is_byte_token(s->tok, s->ids.v[n - 1])) return CI_OK;
  const int32_t *w = s->ids.v + s->prefix_offset;
  char *before = NULL, *after = NULL;
  size_t before_len, after_len;
  if (ci_tokenizer_decode(s->tok, w, s->read_offset - s->prefix_offset, s->skip_special, &before,
                          &before_len) ||
      ci_tokenizer_decode(s->tok, w, n - s->prefix_offset, s->skip_special, &after, &after_len)) {
    free(before);
    return CI_ERR;
  }
  int rc = CI_OK;
  if (!force && ends_with_fffd(after, after_len) && n - s->read_offset < MAX_FFFD_WAIT) {
    free(before);
    free(after);
    return CI_OK; /* a later byte may complete the character */
  }
  size_t common = 0;
  while (common < before_len && common < after_len && before[common] == after[common]) common++;
  /* The window's old text is normally a prefix of the new one; otherwise resume at the first
   * difference, backed up to a character boundary. */
  while (common > 0 && common < after_len && ((unsigned char)after[common] & 0xC0) == 0x80)
    common--;
  rc = tok_buf_append(&s->pending, after + common, after_len - common);
  free(before);
  free(after);
  if (rc) return rc;
  s->read_offset = n;
  /* New window start: CONTEXT_TOKENS visible tokens back, then out of any byte-token run. */
  size_t p = n, visible = 0;
  while (p > 0 && visible < CONTEXT_TOKENS) {
    p--;
    if (!s->skip_special || !ci_tokenizer_is_special(s->tok, s->ids.v[p])) visible++;
  }
  while (p > 0 && is_byte_token(s->tok, s->ids.v[p]) && is_byte_token(s->tok, s->ids.v[p - 1])) p--;
  if (p < s->prefix_offset) p = s->prefix_offset;
  s->prefix_offset = p;
  if (s->prefix_offset >= TRIM_AT) { /* forget ids left of the window */
    memmove(s->ids.v, s->ids.v + p, (n - p) * sizeof *s->ids.v);
    s->ids.n -= p;
    s->read_offset -= p;
    s->prefix_offset = 0;
  }
  return CI_OK;
}

/* ==== Stop strings ==== */

/* Moves pending[0:n) to the returned piece and drops it from pending. */
static void take(ci_detok_stream *s, size_t n, const char **piece, size_t *len) {
  s->piece.len = 0;
  tok_buf_append(&s->piece, s->pending.data, n); /* capacity reserved by the caller */
  memmove(s->pending.data, s->pending.data + n, s->pending.len - n);
  s->pending.len -= n;
  s->pending.data[s->pending.len] = '\0';
  *piece = s->piece.data;
  *len = n;
}

/* Emits what is safe from pending; returns 1 if a stop string was found. */
static int emit(ci_detok_stream *s, int final, const char **piece, size_t *len) {
  if (tok_buf_reserve(&s->piece, s->pending.len)) return CI_ERR;
  size_t n = s->pending.len, earliest = n;
  const char *fired = NULL;
  for (size_t k = 0; k < s->n_stop; k++) {
    const char *hit = memmem(s->pending.data, n, s->stops[k], s->stop_lens[k]);
    if (hit && (size_t)(hit - s->pending.data) < earliest) {
      earliest = (size_t)(hit - s->pending.data);
      fired = s->stops[k];
    }
  }
  if (fired) {
    take(s, earliest, piece, len);
    s->pending.len = 0;
    s->stopped = 1;
    s->fired = fired;
    return 1;
  }
  size_t hold = 0;
  for (size_t k = 0; !final && k < s->n_stop; k++)
    for (size_t l = s->stop_lens[k] - 1; l > hold; l--)
      if (l <= n && !memcmp(s->pending.data + n - l, s->stops[k], l)) {
        hold = l;
        break;
      }
  take(s, n - hold, piece, len);
  return 0;
}

int ci_detok_stream_push(ci_detok_stream *s, int32_t id, const char **piece, size_t *len) {
  *piece = "";
  *len = 0;
  if (s->stopped) return 1;
  if (id < 0 || !ci_tokenizer_id_to_token(s->tok, id))
    return ci_fail("detok stream: token id %d is not in the vocabulary", (int)id);
  if (tok_ids_push(&s->ids, id) || advance(s, 0)) return CI_ERR;
  return emit(s, 0, piece, len);
}

int ci_detok_stream_finish(ci_detok_stream *s, const char **piece, size_t *len) {
  *piece = "";
  *len = 0;
  if (s->stopped) return 1;
  if (advance(s, 1)) return CI_ERR;
  return emit(s, 1, piece, len);
}

const char *ci_detok_stream_stop_string(const ci_detok_stream *s) {
  return s->fired;
}
