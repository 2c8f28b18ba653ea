/* Decoders of tokenizer.json: ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, WordPiece,
 * BPEDecoder, CTC and Sequence, each a decode_chain step from a list of token strings to a list of
 * strings (HF concatenates the final list). Every step writes a fresh arena. */
#include "base/error.h"
#include "text/tok_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct decoder_kind decoder_kind;

struct tok_decoder {
  const decoder_kind *kind;
  uint32_t ch;          /* Metaspace replacement, Strip content */
  int keep_first_space; /* Metaspace: prepend_scheme == never */
  size_t start, stop;   /* Strip */
  tok_pattern pattern;  /* Replace */
  char *text;           /* Replace content, WordPiece prefix, BPEDecoder suffix, CTC pad */
  size_t text_len;
  char *text2; /* CTC word delimiter */
  size_t text2_len;
  int cleanup; /* WordPiece, CTC */
  tok_decoder **children;
  size_t n_children;
};

/* One decode step: reads tokens from `in` (spans into in_arena), writes to out/out_arena. */
typedef int (*decode_fn)(const tok_decoder *d, const tok_buf *in_arena, const tok_spans *in,
                         tok_buf *out_arena, tok_spans *out);

struct decoder_kind {
  const char *type;
  int (*parse)(tok_decoder *d, json_t *j);
  decode_fn apply; /* NULL for Sequence */
};

/* ==== Helpers ==== */

static int emit(tok_buf *arena, tok_spans *out, const char *s, size_t n) {
  size_t off = arena->len;
  if (tok_buf_append(arena, s, n)) return CI_ERR;
  return tok_spans_push(out, off, n, 0);
}

static int copy_string(json_t *j, const char *key, const char *fallback, const char *what,
                       char **out, size_t *len) {
  const char *s = tok_json_str(j, key);
  if (!s && !fallback) return ci_fail("decoder %s: \"%s\" must be a string", what, key);
  if (!s) s = fallback;
  *len = strlen(s);
  *out = strdup(s);
  return *out ? CI_OK : ci_fail("tokenizer: out of memory");
}

static int one_char(const char *s, uint32_t *cp) {
  size_t n = s ? strlen(s) : 0;
  return n && tok_utf8_valid_prefix(s, n) == n && tok_utf8_next(s, n, 0, cp) == n;
}

/* Appends s with every occurrence of `from` replaced by `to`. */
static int replace_all(tok_buf *out, const char *s, size_t n, const char *from, size_t from_len,
                       const char *to, size_t to_len) {
  size_t at = 0;
  while (from_len && at + from_len <= n) {
    const char *hit = memmem(s + at, n - at, from, from_len);
    if (!hit) break;
    size_t pos = (size_t)(hit - s);
    if (tok_buf_append(out, s + at, pos - at) || tok_buf_append(out, to, to_len)) return CI_ERR;
    at = pos + from_len;
  }
  return tok_buf_append(out, s + at, n - at);
}

/* HF's wordpiece::cleanup: undo the spaces BERT-style tokenization puts before punctuation. */
static int cleanup_text(tok_buf *out, const char *s, size_t n) {
  static const char *const rules[][2] = {{" .", "."},     {" ?", "?"},           {" !", "!"},
                                         {" ,", ","},     {" ' ", "'"},          {" n't", "n't"},
                                         {" 'm", "'m"},   {" do not", " don't"}, {" 's", "'s"},
                                         {" 've", "'ve"}, {" 're", "'re"}};
  tok_buf a = {0}, b = {0};
  int rc = tok_buf_append(&a, s, n);
  for (size_t r = 0; r < sizeof rules / sizeof rules[0] && rc == CI_OK; r++) {
    b.len = 0;
    rc = replace_all(&b, a.data, a.len, rules[r][0], strlen(rules[r][0]), rules[r][1],
                     strlen(rules[r][1]));
    tok_buf t = a;
    a = b;
    b = t;
  }
  if (rc == CI_OK) rc = tok_buf_append(out, a.data, a.len);
  tok_buf_free(&a);
  tok_buf_free(&b);
  return rc;
}

/* ==== ByteLevel ==== */

static int apply_bytelevel(const tok_decoder *d, const tok_buf *ia, const tok_spans *in,
                           tok_buf *oa, tok_spans *out) {
  tok_buf bytes = {0};
  int rc = CI_OK;
  for (size_t k = 0; k < in->n && rc == CI_OK; k++) {
    const char *s = ia->data + in->v[k].off;
    size_t n = in->v[k].len, start = bytes.len;
    for (size_t i = 0; i < n && rc == CI_OK;) {
      uint32_t cp;
      i += tok_utf8_next(s, n, i, &cp);
      int b = tok_bytelevel_byte(cp);
      if (b < 0) { /* a character outside the alphabet: the token's own bytes */
        bytes.len = start;
        rc = tok_buf_append(&bytes, s, n);
        break;
      }
      char c = (char)b;
      rc = tok_buf_append(&bytes, &c, 1);
    }
  }
  size_t off = oa->len;
  if (rc == CI_OK) rc = tok_utf8_lossy_append(oa, bytes.data ? bytes.data : "", bytes.len);
  if (rc == CI_OK) rc = tok_spans_push(out, off, oa->len - off, 0);
  tok_buf_free(&bytes);
  return rc;
}

/* ==== Metaspace ==== */

static int parse_metaspace(tok_decoder *d, json_t *j) {
  if (!one_char(tok_json_str(j, "replacement"), &d->ch))
    return ci_fail("decoder Metaspace: \"replacement\" must be one character");
  const char *scheme = tok_json_str(j, "prepend_scheme");
  if (scheme) {
    if (strcmp(scheme, "always") && strcmp(scheme, "first") && strcmp(scheme, "never"))
      return ci_fail("decoder Metaspace: unknown prepend_scheme \"%s\"", scheme);
    d->keep_first_space = !strcmp(scheme, "never");
  } else {
    d->keep_first_space = !tok_json_bool(j, "add_prefix_space", 1);
  }
  return CI_OK;
}

static int apply_metaspace(const tok_decoder *d, const tok_buf *ia, const tok_spans *in,
                           tok_buf *oa, tok_spans *out) {
  for (size_t k = 0; k < in->n; k++) {
    const char *s = ia->data + in->v[k].off;
    size_t n = in->v[k].len, off = oa->len;
    for (size_t i = 0; i < n;) {
      uint32_t cp;
      size_t l = tok_utf8_next(s, n, i, &cp);
      int rc = CI_OK;
      if (cp != d->ch)
        rc = tok_buf_append(oa, s + i, l);
      else if (k != 0 || d->keep_first_space)
        rc = tok_buf_append(oa, " ", 1);
      if (rc) return CI_ERR;
      i += l;
    }
    if (tok_spans_push(out, off, oa->len - off, 0)) return CI_ERR;
  }
  return CI_OK;
}

/* ==== ByteFallback and Fuse ==== */

static int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* "<0xXX>" -> the byte (Rust's u8::from_str_radix also takes "+X"), else -1. */
static int byte_token(const char *s, size_t n) {
  if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
  if (s[3] == '+') return hex_digit(s[4]);
  int hi = hex_digit(s[3]), lo = hex_digit(s[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

static int flush_bytes(tok_buf *bytes, tok_buf *oa, tok_spans *out) {
  if (!bytes->len) return CI_OK;
  int rc;
  if (tok_utf8_valid_prefix(bytes->data, bytes->len) == bytes->len) {
    rc = emit(oa, out, bytes->data, bytes->len);
  } else {
    rc = CI_OK;
    for (size_t i = 0; i < bytes->len && rc == CI_OK; i++) rc = emit(oa, out, "\xEF\xBF\xBD", 3);
  }
  bytes->len = 0;
  return rc;
}

static int apply_bytefallback(const tok_decoder *d, const tok_buf *ia, const tok_spans *in,
                              tok_buf *oa, tok_spans *out) {
  tok_buf bytes = {0};
  int rc = CI_OK;
  for (size_t k = 0; k < in->n && rc == CI_OK; k++) {
    const char *s = ia->data + in->v[k].off;
    int b = byte_token(s, in->v[k].len);
    if (b >= 0) {
      char c = (char)b;
      rc = tok_buf_append(&bytes, &c, 1);
    } else {
      rc = flush_bytes(&bytes, oa, out);
      if (rc == CI_OK) rc = emit(oa, out, s, in->v[k].len);
    }
  }
  if (rc == CI_OK) rc = flush_bytes(&bytes, oa, out);
  tok_buf_free(&bytes);
  return rc;
}

static int apply_fuse(const tok_decoder *d, const tok_buf *ia, const tok_spans *in, tok_buf *oa,
                      tok_spans *out) {
  size_t off = oa->len;
  for (size_t k = 0; k < in->n; k++)
    if (tok_buf_append(oa, ia->data + in->v[k].off, in->v[k].len)) return CI_ERR;
  return tok_spans_push(out, off, oa->len - off, 0);
}

/* ==== Strip ==== */

static int parse_strip(tok_decoder *d, json_t *j) {
  json_t *start = json_object_get(j, "start"), *stop = json_object_get(j, "stop");
  if (!one_char(tok_json_str(j, "content"), &d->ch) || !json_is_integer(start) ||
      !json_is_integer(stop) || json_integer_value(start) < 0 || json_integer_value(stop) < 0)
    return ci_fail("decoder Strip: needs one-character \"content\" and counts \"start\", \"stop\"");
  d->start = (size_t)json_integer_value(start);
  d->stop = (size_t)json_integer_value(stop);
  return CI_OK;
}

static int apply_strip(const tok_decoder *d, const tok_buf *ia, const tok_spans *in, tok_buf *oa,
                       tok_spans *out) {
  for (size_t k = 0; k < in->n; k++) {
    const char *s = ia->data + in->v[k].off;
    size_t n = in->v[k].len, a = 0, b = n;
    uint32_t cp;
    for (size_t c = 0; c < d->start && a < n; c++) {
      size_t l = tok_utf8_next(s, n, a, &cp);
      if (cp != d->ch) break;
      a += l;
    }
    for (size_t c = 0; c < d->stop && b > a; c++) {
      size_t l = tok_utf8_prev_len(s, b);
      tok_utf8_next(s, n, b - l, &cp);
      if (cp != d->ch) break;
      b -= l;
    }
    if (emit(oa, out, s + a, b - a)) return CI_ERR;
  }
  return CI_OK;
}

/* ==== Replace ==== */

static int parse_replace(tok_decoder *d, json_t *j) {
  if (tok_pattern_parse(json_object_get(j, "pattern"), &d->pattern, "decoder Replace"))
    return CI_ERR;
  return copy_string(j, "content", NULL, "Replace", &d->text, &d->text_len);
}

static int apply_replace(const tok_decoder *d, const tok_buf *ia, const tok_spans *in, tok_buf *oa,
                         tok_spans *out) {
  tok_spans m = {0};
  int rc = CI_OK;
  for (size_t k = 0; k < in->n && rc == CI_OK; k++) {
    const char *s = ia->data + in->v[k].off;
    size_t n = in->v[k].len, at = 0, off = oa->len;
    m.n = 0;
    rc = tok_pattern_find_all(&d->pattern, s, n, &m);
    for (size_t i = 0; i < m.n && rc == CI_OK; i++) {
      rc = tok_buf_append(oa, s + at, m.v[i].off - at);
      if (rc == CI_OK) rc = tok_buf_append(oa, d->text, d->text_len);
      at = m.v[i].off + m.v[i].len;
    }
    if (rc == CI_OK) rc = tok_buf_append(oa, s + at, n - at);
    if (rc == CI_OK) rc = tok_spans_push(out, off, oa->len - off, 0);
  }
  tok_spans_free(&m);
  return rc;
}

/* ==== WordPiece, BPEDecoder, CTC ==== */

static int parse_wordpiece(tok_decoder *d, json_t *j) {
  d->cleanup = tok_json_bool(j, "cleanup", 1);
  return copy_string(j, "prefix", "##", "WordPiece", &d->text, &d->text_len);
}

static int apply_wordpiece(const tok_decoder *d, const tok_buf *ia, const tok_spans *in,
                           tok_buf *oa, tok_spans *out) {
  tok_buf t = {0};
  int rc = CI_OK;
  for (size_t k = 0; k < in->n && rc == CI_OK; k++) {
    const char *s = ia->data + in->v[k].off;
    size_t n = in->v[k].len;
    t.len = 0;
    if (k != 0 && n >= d->text_len && !memcmp(s, d->text, d->text_len))
      rc = tok_buf_append(&t, s + d->text_len, n - d->text_len);
    else if (k != 0)
      rc = (tok_buf_append(&t, " ", 1) || tok_buf_append(&t, s, n)) ? CI_ERR : CI_OK;
    else
      rc = tok_buf_append(&t, s, n);
    size_t off = oa->len;
    if (rc == CI_OK)
      rc = d->cleanup ? cleanup_text(oa, t.data, t.len) : tok_buf_append(oa, t.data, t.len);
    if (rc == CI_OK) rc = tok_spans_push(out, off, oa->len - off, 0);
  }
  tok_buf_free(&t);
  return rc;
}

static int parse_bpe(tok_decoder *d, json_t *j) {
  return copy_string(j, "suffix", "</w>", "BPEDecoder", &d->text, &d->text_len);
}

static int apply_bpe(const tok_decoder *d, const tok_buf *ia, const tok_spans *in, tok_buf *oa,
                     tok_spans *out) {
  for (size_t k = 0; k < in->n; k++) {
    size_t off = oa->len;
    const char *to = k + 1 == in->n ? "" : " ";
    if (replace_all(oa, ia->data + in->v[k].off, in->v[k].len, d->text, d->text_len, to,
                    strlen(to)) ||
        tok_spans_push(out, off, oa->len - off, 0))
      return CI_ERR;
  }
  return CI_OK;
}

static int parse_ctc(tok_decoder *d, json_t *j) {
  d->cleanup = tok_json_bool(j, "cleanup", 1);
  if (copy_string(j, "pad_token", "<pad>", "CTC", &d->text, &d->text_len)) return CI_ERR;
  return copy_string(j, "word_delimiter_token", "|", "CTC", &d->text2, &d->text2_len);
}

static int apply_ctc(const tok_decoder *d, const tok_buf *ia, const tok_spans *in, tok_buf *oa,
                     tok_spans *out) {
  tok_buf a = {0}, b = {0};
  int rc = CI_OK;
  for (size_t k = 0; k < in->n && rc == CI_OK; k++) {
    const char *s = ia->data + in->v[k].off;
    size_t n = in->v[k].len;
    if (k > 0 && in->v[k - 1].len == n && !memcmp(ia->data + in->v[k - 1].off, s, n)) continue;
    a.len = b.len = 0;
    rc = replace_all(&a, s, n, d->text, d->text_len, "", 0);
    if (rc == CI_OK && d->cleanup) {
      rc = cleanup_text(&b, a.data, a.len);
      a.len = 0;
      if (rc == CI_OK) rc = replace_all(&a, b.data, b.len, d->text2, d->text2_len, " ", 1);
    }
    if (rc == CI_OK && a.len) rc = emit(oa, out, a.data, a.len);
  }
  tok_buf_free(&a);
  tok_buf_free(&b);
  return rc;
}

/* ==== Sequence ==== */

static int parse_sequence(tok_decoder *d, json_t *j) {
  json_t *list = json_object_get(j, "decoders");
  if (!json_is_array(list)) return ci_fail("decoder Sequence: \"decoders\" must be a list");
  d->children = calloc(json_array_size(list) + 1, sizeof *d->children);
  if (!d->children) return ci_fail("tokenizer: out of memory");
  for (size_t i = 0; i < json_array_size(list); i++) {
    d->children[i] = tok_decoder_parse(json_array_get(list, i));
    if (!d->children[i]) return ci_fail_context("decoder Sequence item %zu", i);
    d->n_children = i + 1;
  }
  return CI_OK;
}

/* ==== Kind table, parse, apply ==== */

static const decoder_kind kinds[] = {
    {"ByteLevel", NULL, apply_bytelevel},
    {"Metaspace", parse_metaspace, apply_metaspace},
    {"ByteFallback", NULL, apply_bytefallback},
    {"Fuse", NULL, apply_fuse},
    {"Strip", parse_strip, apply_strip},
    {"Replace", parse_replace, apply_replace},
    {"WordPiece", parse_wordpiece, apply_wordpiece},
    {"BPEDecoder", parse_bpe, apply_bpe},
    {"CTC", parse_ctc, apply_ctc},
    {"Sequence", parse_sequence, NULL},
};

tok_decoder *tok_decoder_parse(json_t *j) {
  const char *type = tok_json_str(j, "type");
  if (!json_is_object(j) || !type) {
    ci_fail("decoder must be an object with a \"type\"");
    return NULL;
  }
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
    if (strcmp(kinds[i].type, type)) continue;
    tok_decoder *d = calloc(1, sizeof *d);
    if (!d) {
      ci_fail("tokenizer: out of memory");
      return NULL;
    }
    d->kind = &kinds[i];
    if (d->kind->parse && d->kind->parse(d, j)) {
      tok_decoder_free(d);
      return NULL;
    }
    return d;
  }
  ci_fail("unsupported decoder type \"%s\"", type);
  return NULL;
}

void tok_decoder_free(tok_decoder *d) {
  if (!d) return;
  for (size_t i = 0; i < d->n_children; i++) tok_decoder_free(d->children[i]);
  free(d->children);
  tok_pattern_free(&d->pattern);
  free(d->text);
  free(d->text2);
  free(d);
}

int tok_decoder_apply(const tok_decoder *d, tok_buf *arena, tok_spans *tokens, tok_spans *scratch) {
  if (!d->kind->apply) {
    for (size_t i = 0; i < d->n_children; i++)
      if (tok_decoder_apply(d->children[i], arena, tokens, scratch)) return CI_ERR;
    return CI_OK;
  }
  tok_buf fresh = {0};
  scratch->n = 0;
  if (tok_buf_reserve(&fresh, arena->len) || d->kind->apply(d, arena, tokens, &fresh, scratch)) {
    tok_buf_free(&fresh);
    return CI_ERR;
  }
  tok_buf_free(arena);
  *arena = fresh;
  tok_spans tmp = *tokens;
  *tokens = *scratch;
  *scratch = tmp;
  return CI_OK;
}

/* ==== One token's bytes ==== */

/* The per-token part of one decoder step on s[0..n) as it acts on a token in the middle of a
 * text: ByteLevel and ByteFallback give raw bytes (no U+FFFD for a partial character), Metaspace
 * turns its replacement into a space, Replace and BPEDecoder act as on any token, Strip and
 * Fuse change nothing (Strip acts on the text's ends only), WordPiece drops its prefix or adds a
 * space. */
static int token_bytes_step(const tok_decoder *d, const char *s, size_t n, tok_buf *out) {
  const char *type = d->kind->type;
  if (!strcmp(type, "Sequence")) {
    tok_buf cur = {0};
    int rc = tok_buf_append(&cur, s, n);
    for (size_t i = 0; i < d->n_children && rc == CI_OK; i++) {
      tok_buf next = {0};
      rc = token_bytes_step(d->children[i], cur.data ? cur.data : "", cur.len, &next);
      tok_buf_free(&cur);
      cur = next;
    }
    if (rc == CI_OK) rc = tok_buf_append(out, cur.data ? cur.data : "", cur.len);
    tok_buf_free(&cur);
    return rc;
  }
  if (!strcmp(type, "ByteLevel")) {
    const size_t start = out->len;
    for (size_t i = 0; i < n;) {
      uint32_t cp;
      i += tok_utf8_next(s, n, i, &cp);
      const int b = tok_bytelevel_byte(cp);
      if (b < 0) { /* outside the alphabet: the token's own bytes */
        out->len = start;
        return tok_buf_append(out, s, n);
      }
      const char c = (char)b;
      if (tok_buf_append(out, &c, 1)) return CI_ERR;
    }
    return CI_OK;
  }
  if (!strcmp(type, "ByteFallback")) {
    const int b = byte_token(s, n);
    if (b < 0) return tok_buf_append(out, s, n);
    const char c = (char)b;
    return tok_buf_append(out, &c, 1);
  }
  if (!strcmp(type, "Metaspace")) {
    for (size_t i = 0; i < n;) {
      uint32_t cp;
      const size_t l = tok_utf8_next(s, n, i, &cp);
      if (cp == d->ch ? tok_buf_append(out, " ", 1) : tok_buf_append(out, s + i, l)) return CI_ERR;
      i += l;
    }
    return CI_OK;
  }
  if (!strcmp(type, "Strip") || !strcmp(type, "Fuse") || !strcmp(type, "CTC"))
    return tok_buf_append(out, s, n);
  if (!strcmp(type, "WordPiece")) {
    if (n >= d->text_len && !memcmp(s, d->text, d->text_len))
      return tok_buf_append(out, s + d->text_len, n - d->text_len);
    return tok_buf_append(out, " ", 1) || tok_buf_append(out, s, n) ? CI_ERR : CI_OK;
  }
  /* Replace, BPEDecoder: the step itself on a one-token list that is not the last */
  tok_buf in = {0}, oa = {0};
  tok_spans one = {0}, res = {0};
  int rc = tok_buf_append(&in, s, n);
  if (rc == CI_OK) rc = tok_spans_push(&one, 0, n, 0);
  if (rc == CI_OK) rc = tok_spans_push(&one, n, 0, 0); /* a following empty token */
  if (rc == CI_OK) rc = tok_buf_reserve(&oa, n + 8);
  if (rc == CI_OK) rc = d->kind->apply(d, &in, &one, &oa, &res);
  if (rc == CI_OK && res.n > 0) rc = tok_buf_append(out, oa.data + res.v[0].off, res.v[0].len);
  tok_buf_free(&in);
  tok_buf_free(&oa);
  tok_spans_free(&one);
  tok_spans_free(&res);
  return rc;
}

int tok_decoder_token_bytes(const tok_decoder *d, const char *s, size_t n, tok_buf *out) {
  return token_bytes_step(d, s, n, out);
}
