/* Pre-tokenizers of tokenizer.json: Split (regex or literal, five delimiter behaviours, invert),
 * ByteLevel, Metaspace, Digits, Whitespace, WhitespaceSplit, Punctuation, BertPreTokenizer,
 * CharDelimiterSplit and Sequence. Each turns every piece into zero or more pieces; empty pieces
 * are dropped, as HF's PreTokenizedString::split does. */
#include "base/error.h"
#include "text/tok_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct pretok_kind pretok_kind;

enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };

struct tok_pretok {
  const pretok_kind *kind;
  tok_pattern pattern; /* Split */
  int invert;
  tok_split_behavior behavior; /* Split, Punctuation */
  int add_prefix_space;        /* ByteLevel */
  int use_regex;
  tok_regex *re;       /* ByteLevel's GPT-2 regex */
  uint32_t delimiter;  /* CharDelimiterSplit, Metaspace replacement */
  char replacement[4]; /* Metaspace */
  size_t replacement_len;
  int prepend_scheme, split; /* Metaspace */
  int individual_digits;     /* Digits */
  tok_pretok **children;     /* Sequence */
  size_t n_children;
};

typedef int (*piece_fn)(const tok_pretok *p, tok_buf *arena, const tok_span *piece, tok_spans *out);

struct pretok_kind {
  const char *type;
  int (*parse)(tok_pretok *p, json_t *j);
  piece_fn apply; /* NULL for Sequence */
};

static const char gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ==== Splitting a piece by matches, with a delimiter behaviour ==== */

typedef struct {
  size_t start, end;
  int is_match;
} event;

typedef struct {
  event *v;
  size_t n, cap;
} events;

static int events_push(events *e, size_t start, size_t end, int is_match) {
  if (e->n == e->cap) {
    size_t cap = e->cap ? e->cap * 2 : 64;
    event *v = realloc(e->v, cap * sizeof *v);
    if (!v) return ci_fail("tokenizer: out of memory");
    e->v = v;
    e->cap = cap;
  }
  e->v[e->n++] = (event){start, end, is_match};
  return CI_OK;
}

/* Turns matches (sorted, non-overlapping, relative to the piece) into HF's covering list of
 * (offsets, is_match), then folds it by `behavior` and emits the non-empty pieces. */
static int split_piece(const tok_span *piece, const tok_spans *matches, int invert,
                       tok_split_behavior behavior, tok_spans *out) {
  events ev = {0}, folded = {0};
  int rc = CI_ERR;
  size_t len = piece->len, prev = 0;
  if (len == 0) {
    if (events_push(&ev, 0, 0, 0)) goto done;
  } else {
    for (size_t k = 0; k < matches->n; k++) {
      size_t s = matches->v[k].off, e = s + matches->v[k].len;
      if (prev != s && events_push(&ev, prev, s, 0)) goto done;
      if (events_push(&ev, s, e, 1)) goto done;
      prev = e;
    }
    if (prev != len && events_push(&ev, prev, len, 0)) goto done;
  }
  if (invert)
    for (size_t k = 0; k < ev.n; k++) ev.v[k].is_match = !ev.v[k].is_match;

  int previous_match = 0;
  switch (behavior) {
  case TOK_SPLIT_REMOVED:
    for (size_t k = 0; k < ev.n; k++)
      if (!ev.v[k].is_match && events_push(&folded, ev.v[k].start, ev.v[k].end, 0)) goto done;
    break;
  case TOK_SPLIT_ISOLATED:
    for (size_t k = 0; k < ev.n; k++)
      if (events_push(&folded, ev.v[k].start, ev.v[k].end, 0)) goto done;
    break;
  case TOK_SPLIT_MERGED_WITH_PREVIOUS:
    for (size_t k = 0; k < ev.n; k++) {
      if (ev.v[k].is_match && !previous_match && folded.n)
        folded.v[folded.n - 1].end = ev.v[k].end;
      else if (events_push(&folded, ev.v[k].start, ev.v[k].end, 0))
        goto done;
      previous_match = ev.v[k].is_match;
    }
    break;
  case TOK_SPLIT_MERGED_WITH_NEXT:
    for (size_t k = ev.n; k-- > 0;) {
      if (ev.v[k].is_match && !previous_match && folded.n)
        folded.v[folded.n - 1].start = ev.v[k].start;
      else if (events_push(&folded, ev.v[k].start, ev.v[k].end, 0))
        goto done;
      previous_match = ev.v[k].is_match;
    }
    for (size_t a = 0, b = folded.n; a + 1 < b; a++, b--) {
      event t = folded.v[a];
      folded.v[a] = folded.v[b - 1];
      folded.v[b - 1] = t;
    }
    break;
  case TOK_SPLIT_CONTIGUOUS:
    for (size_t k = 0; k < ev.n; k++) {
      if (ev.v[k].is_match == previous_match && folded.n)
        folded.v[folded.n - 1].end = ev.v[k].end;
      else if (events_push(&folded, ev.v[k].start, ev.v[k].end, 0))
        goto done;
      previous_match = ev.v[k].is_match;
    }
    break;
  }
  for (size_t k = 0; k < folded.n; k++) {
    size_t s = folded.v[k].start, e = folded.v[k].end;
    if (e > s && tok_spans_push(out, piece->off + s, e - s, piece->at_start && s == 0)) goto done;
  }
  rc = CI_OK;
done:
  free(ev.v);
  free(folded.v);
  return rc;
}

/* Matches of a character predicate: every matching character is its own match. */
static int char_matches(const char *s, size_t n, int (*pred)(const tok_pretok *, uint32_t),
                        const tok_pretok *p, tok_spans *m) {
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    size_t l = tok_utf8_next(s, n, i, &cp);
    if (pred(p, cp) && tok_spans_push(m, i, l, 0)) return CI_ERR;
    i += l;
  }
  return CI_OK;
}

static int split_by_pred(const tok_pretok *p, tok_buf *arena, const tok_span *piece,
                         int (*pred)(const tok_pretok *, uint32_t), tok_split_behavior behavior,
                         tok_spans *out) {
  tok_spans m = {0};
  int rc = char_matches(arena->data + piece->off, piece->len, pred, p, &m);
  if (rc == CI_OK) rc = split_piece(piece, &m, 0, behavior, out);
  tok_spans_free(&m);
  return rc;
}

static int parse_behavior(json_t *j, tok_split_behavior fallback, tok_split_behavior *out,
                          const char *what) {
  static const struct {
    const char *name;
    tok_split_behavior behavior;
  } names[] = {{"Removed", TOK_SPLIT_REMOVED},
               {"Isolated", TOK_SPLIT_ISOLATED},
               {"MergedWithPrevious", TOK_SPLIT_MERGED_WITH_PREVIOUS},
               {"MergedWithNext", TOK_SPLIT_MERGED_WITH_NEXT},
               {"Contiguous", TOK_SPLIT_CONTIGUOUS}};
  json_t *v = json_object_get(j, "behavior");
  if (!v || json_is_null(v)) return *out = fallback, CI_OK;
  const char *name = json_string_value(v);
  for (size_t i = 0; name && i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(names[i].name, name)) return *out = names[i].behavior, CI_OK;
  return ci_fail("%s: unknown \"behavior\" %s", what, name ? name : "(not a string)");
}

/* ==== Split ==== */

static int parse_split(tok_pretok *p, json_t *j) {
  p->invert = tok_json_bool(j, "invert", 0);
  if (parse_behavior(j, TOK_SPLIT_ISOLATED, &p->behavior, "pre_tokenizer Split")) return CI_ERR;
  if (!json_object_get(j, "behavior")) return ci_fail("pre_tokenizer Split: missing \"behavior\"");
  return tok_pattern_parse(json_object_get(j, "pattern"), &p->pattern, "pre_tokenizer Split");
}

static int apply_split(const tok_pretok *p, tok_buf *arena, const tok_span *piece, tok_spans *out) {
  tok_spans m = {0};
  int rc = tok_pattern_find_all(&p->pattern, arena->data + piece->off, piece->len, &m);
  if (rc == CI_OK) rc = split_piece(piece, &m, p->invert, p->behavior, out);
  tok_spans_free(&m);
  return rc;
}

/* ==== ByteLevel ==== */

static int parse_bytelevel(tok_pretok *p, json_t *j) {
  p->add_prefix_space = tok_json_bool(j, "add_prefix_space", 1);
  p->use_regex = tok_json_bool(j, "use_regex", 1);
  if (p->use_regex && !(p->re = tok_regex_compile(gpt2_regex, sizeof gpt2_regex - 1)))
    return CI_ERR;
  return CI_OK;
}

/* Rewrites arena[off:off+len) into the byte-level alphabet, appended to the arena. */
static int bytelevel_map(tok_buf *arena, const tok_span *src, int prefix_space, tok_spans *out) {
  if (tok_buf_reserve(arena, 2 * (src->len + 1))) return CI_ERR;
  size_t start = arena->len;
  char *dst = arena->data + arena->len;
  const unsigned char *s = (const unsigned char *)arena->data + src->off;
  size_t k = 0;
  if (prefix_space) dst[k++] = (char)0xC4, dst[k++] = (char)0xA0; /* U+0120 for ' ' */
  for (size_t i = 0; i < src->len; i++) {
    uint32_t cp = tok_bytelevel_char(s[i]);
    if (cp < 0x80) {
      dst[k++] = (char)cp;
    } else {
      dst[k++] = (char)(0xC0 | (cp >> 6));
      dst[k++] = (char)(0x80 | (cp & 0x3F));
    }
  }
  arena->len += k;
  arena->data[arena->len] = '\0';
  return tok_spans_push(out, start, k, src->at_start);
}

static int apply_bytelevel(const tok_pretok *p, tok_buf *arena, const tok_span *piece,
                           tok_spans *out) {
  if (piece->len == 0) return CI_OK; /* HF's prepend does nothing to an empty string */
  int prefix = p->add_prefix_space && arena->data[piece->off] != ' ';
  if (!p->use_regex) return bytelevel_map(arena, piece, prefix, out);
  tok_span src = *piece;
  if (prefix) { /* materialize " " + piece so the regex sees the space */
    if (tok_buf_reserve(arena, piece->len + 1)) return CI_ERR;
    src.off = arena->len;
    src.len = piece->len + 1;
    arena->data[arena->len] = ' ';
    memcpy(arena->data + arena->len + 1, arena->data + piece->off, piece->len);
    arena->len += src.len;
    arena->data[arena->len] = '\0';
  }
  tok_spans m = {0}, parts = {0};
  int rc = CI_ERR;
  tok_pattern pat = {NULL, 0, p->re};
  if (tok_pattern_find_all(&pat, arena->data + src.off, src.len, &m) ||
      split_piece(&src, &m, 0, TOK_SPLIT_ISOLATED, &parts))
    goto done;
  for (size_t k = 0; k < parts.n; k++)
    if (bytelevel_map(arena, &parts.v[k], 0, out)) goto done;
  rc = CI_OK;
done:
  tok_spans_free(&m);
  tok_spans_free(&parts);
  return rc;
}

/* ==== Metaspace ==== */

static int parse_metaspace(tok_pretok *p, json_t *j) {
  const char *rep = tok_json_str(j, "replacement");
  if (!rep) return ci_fail("pre_tokenizer Metaspace: \"replacement\" must be a string");
  size_t n = strlen(rep);
  if (n == 0 || n > 4 || tok_utf8_valid_prefix(rep, n) != n ||
      tok_utf8_next(rep, n, 0, &p->delimiter) != n)
    return ci_fail("pre_tokenizer Metaspace: \"replacement\" must be one character");
  memcpy(p->replacement, rep, n);
  p->replacement_len = n;
  const char *scheme = tok_json_str(j, "prepend_scheme");
  if (scheme) {
    static const char *names[] = {"always", "first", "never"};
    p->prepend_scheme = -1;
    for (int i = 0; i < 3; i++)
      if (!strcmp(scheme, names[i])) p->prepend_scheme = i;
    if (p->prepend_scheme < 0)
      return ci_fail("pre_tokenizer Metaspace: unknown prepend_scheme \"%s\"", scheme);
  } else {
    p->prepend_scheme = tok_json_bool(j, "add_prefix_space", 1) ? PREPEND_ALWAYS : PREPEND_NEVER;
  }
  p->split = tok_json_bool(j, "split", 1);
  return CI_OK;
}

static int is_delimiter(const tok_pretok *p, uint32_t cp) {
  return cp == p->delimiter;
}

static int apply_metaspace(const tok_pretok *p, tok_buf *arena, const tok_span *piece,
                           tok_spans *out) {
  if (piece->len == 0) return CI_OK;
  if (tok_buf_reserve(arena, (piece->len + 1) * 4)) return CI_ERR;
  const char *s = arena->data + piece->off;
  char *dst = arena->data + arena->len;
  size_t k = 0;
  int starts_with_rep = piece->len >= p->replacement_len && s[0] != ' ' &&
                        !memcmp(s, p->replacement, p->replacement_len);
  if (piece->len > 0 && s[0] == ' ') starts_with_rep = 1; /* the space becomes the replacement */
  if (!starts_with_rep && (p->prepend_scheme == PREPEND_ALWAYS ||
                           (p->prepend_scheme == PREPEND_FIRST && piece->at_start))) {
    memcpy(dst, p->replacement, p->replacement_len);
    k += p->replacement_len;
  }
  for (size_t i = 0; i < piece->len; i++) {
    if (s[i] == ' ') {
      memcpy(dst + k, p->replacement, p->replacement_len);
      k += p->replacement_len;
    } else {
      dst[k++] = s[i];
    }
  }
  tok_span mapped = {arena->len, k, piece->at_start};
  arena->len += k;
  arena->data[arena->len] = '\0';
  if (!p->split) return k ? tok_spans_push(out, mapped.off, k, mapped.at_start) : CI_OK;
  return split_by_pred(p, arena, &mapped, is_delimiter, TOK_SPLIT_MERGED_WITH_NEXT, out);
}

/* ==== Character-class splitters ==== */

static int parse_digits(tok_pretok *p, json_t *j) {
  p->individual_digits = tok_json_bool(j, "individual_digits", 0);
  return CI_OK;
}

static int is_numeric(const tok_pretok *p, uint32_t cp) {
  return tok_is_numeric(cp);
}

static int apply_digits(const tok_pretok *p, tok_buf *arena, const tok_span *piece,
                        tok_spans *out) {
  return split_by_pred(p, arena, piece, is_numeric,
                       p->individual_digits ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS, out);
}

static int is_whitespace(const tok_pretok *p, uint32_t cp) {
  return tok_is_whitespace(cp);
}

static int apply_whitespace_split(const tok_pretok *p, tok_buf *arena, const tok_span *piece,
                                  tok_spans *out) {
  return split_by_pred(p, arena, piece, is_whitespace, TOK_SPLIT_REMOVED, out);
}

/* Whitespace: the regex \w+|[^\w\s]+ kept, the rest removed, i.e. maximal runs of word
 * characters and maximal runs of other non-space characters. */
static int apply_whitespace(const tok_pretok *p, tok_buf *arena, const tok_span *piece,
                            tok_spans *out) {
  const char *s = arena->data + piece->off;
  size_t n = piece->len, i = 0;
  while (i < n) {
    uint32_t cp;
    size_t l = tok_utf8_next(s, n, i, &cp);
    if (tok_is_whitespace(cp)) {
      i += l;
      continue;
    }
    int word = tok_is_word_char(cp);
    size_t start = i;
    i += l;
    while (i < n) {
      l = tok_utf8_next(s, n, i, &cp);
      if (tok_is_whitespace(cp) || tok_is_word_char(cp) != word) break;
      i += l;
    }
    if (tok_spans_push(out, piece->off + start, i - start, piece->at_start && start == 0))
      return CI_ERR;
  }
  return CI_OK;
}

static int parse_punctuation(tok_pretok *p, json_t *j) {
  return parse_behavior(j, TOK_SPLIT_ISOLATED, &p->behavior, "pre_tokenizer Punctuation");
}

static int is_punctuation(const tok_pretok *p, uint32_t cp) {
  return tok_is_punctuation(cp);
}

static int apply_punctuation(const tok_pretok *p, tok_buf *arena, const tok_span *piece,
                             tok_spans *out) {
  return split_by_pred(p, arena, piece, is_punctuation, p->behavior, out);
}

static int apply_bert(const tok_pretok *p, tok_buf *arena, const tok_span *piece, tok_spans *out) {
  tok_spans words = {0};
  int rc = split_by_pred(p, arena, piece, is_whitespace, TOK_SPLIT_REMOVED, &words);
  for (size_t k = 0; k < words.n && rc == CI_OK; k++)
    rc = split_by_pred(p, arena, &words.v[k], is_punctuation, TOK_SPLIT_ISOLATED, out);
  tok_spans_free(&words);
  return rc;
}

static int parse_char_delimiter(tok_pretok *p, json_t *j) {
  const char *d = tok_json_str(j, "delimiter");
  size_t n = d ? strlen(d) : 0;
  if (!n || tok_utf8_valid_prefix(d, n) != n || tok_utf8_next(d, n, 0, &p->delimiter) != n)
    return ci_fail("pre_tokenizer CharDelimiterSplit: \"delimiter\" must be one character");
  return CI_OK;
}

static int apply_char_delimiter(const tok_pretok *p, tok_buf *arena, const tok_span *piece,
                                tok_spans *out) {
  return split_by_pred(p, arena, piece, is_delimiter, TOK_SPLIT_REMOVED, out);
}

/* ==== Sequence ==== */

static int parse_sequence(tok_pretok *p, json_t *j) {
  json_t *list = json_object_get(j, "pretokenizers");
  if (!json_is_array(list))
    return ci_fail("pre_tokenizer Sequence: \"pretokenizers\" must be a list");
  p->children = calloc(json_array_size(list) + 1, sizeof *p->children);
  if (!p->children) return ci_fail("tokenizer: out of memory");
  for (size_t i = 0; i < json_array_size(list); i++) {
    p->children[i] = tok_pretok_parse(json_array_get(list, i));
    if (!p->children[i]) return ci_fail_context("pre_tokenizer Sequence item %zu", i);
    p->n_children = i + 1;
  }
  return CI_OK;
}

/* ==== Kind table, parse, apply ==== */

static const pretok_kind kinds[] = {
    {"Split", parse_split, apply_split},
    {"ByteLevel", parse_bytelevel, apply_bytelevel},
    {"Metaspace", parse_metaspace, apply_metaspace},
    {"Digits", parse_digits, apply_digits},
    {"Whitespace", NULL, apply_whitespace},
    {"WhitespaceSplit", NULL, apply_whitespace_split},
    {"Punctuation", parse_punctuation, apply_punctuation},
    {"BertPreTokenizer", NULL, apply_bert},
    {"CharDelimiterSplit", parse_char_delimiter, apply_char_delimiter},
    {"Sequence", parse_sequence, NULL},
};

tok_pretok *tok_pretok_parse(json_t *j) {
  if (!json_is_object(j)) {
    ci_fail("pre_tokenizer must be an object");
    return NULL;
  }
  const char *type = tok_json_str(j, "type");
  if (!type) {
    ci_fail("pre_tokenizer has no \"type\"");
    return NULL;
  }
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
    if (strcmp(kinds[i].type, type)) continue;
    tok_pretok *p = calloc(1, sizeof *p);
    if (!p) {
      ci_fail("tokenizer: out of memory");
      return NULL;
    }
    p->kind = &kinds[i];
    if (p->kind->parse && p->kind->parse(p, j)) {
      tok_pretok_free(p);
      return NULL;
    }
    return p;
  }
  ci_fail("unsupported pre_tokenizer type \"%s\"", type);
  return NULL;
}

void tok_pretok_free(tok_pretok *p) {
  if (!p) return;
  for (size_t i = 0; i < p->n_children; i++) tok_pretok_free(p->children[i]);
  free(p->children);
  tok_pattern_free(&p->pattern);
  tok_regex_free(p->re);
  free(p);
}

int tok_pretok_apply(const tok_pretok *p, tok_buf *arena, tok_spans *pieces, tok_spans *scratch) {
  if (!p->kind->apply) {
    for (size_t i = 0; i < p->n_children; i++)
      if (tok_pretok_apply(p->children[i], arena, pieces, scratch)) return CI_ERR;
    return CI_OK;
  }
  scratch->n = 0;
  for (size_t k = 0; k < pieces->n; k++) {
    tok_span piece = pieces->v[k];
    if (p->kind->apply(p, arena, &piece, scratch)) return CI_ERR;
  }
  tok_spans tmp = *pieces;
  *pieces = *scratch;
  *scratch = tmp;
  return CI_OK;
}
