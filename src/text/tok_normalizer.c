/* Normalizers of tokenizer.json: Unicode forms (NFC, NFD, NFKC, NFKD via utf8proc), Lowercase,
 * Strip, StripAccents, Replace, Prepend, BertNormalizer, Nmt, ByteLevel and Sequence. Each rewrites
 * a whole segment of text from one buffer into another. */
#include "base/error.h"
#include "text/tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

typedef struct normalizer_kind normalizer_kind;

struct tok_normalizer {
  const normalizer_kind *kind;
  int left, right;               /* Strip */
  int clean_text, chinese_chars; /* BertNormalizer */
  int strip_accents, lowercase;  /* BertNormalizer */
  utf8proc_option_t form;        /* NFC/NFD/NFKC/NFKD */
  tok_pattern pattern;           /* Replace */
  char *content;                 /* Replace content, Prepend text */
  size_t content_len;
  tok_normalizer **children; /* Sequence */
  size_t n_children;
};

struct normalizer_kind {
  const char *type;
  int (*parse)(tok_normalizer *nz, json_t *j);
  int (*apply)(const tok_normalizer *nz, const char *in, size_t n, tok_buf *out, int *keeps_start);
};

/* ==== Helpers ==== */

static int append_cp(tok_buf *out, uint32_t cp) {
  char enc[4];
  return tok_buf_append(out, enc, tok_utf8_encode(cp, enc));
}

static int dup_string(json_t *j, const char *key, const char *what, char **out, size_t *len) {
  json_t *v = json_object_get(j, key);
  if (!json_is_string(v)) return ci_fail("%s: \"%s\" must be a string", what, key);
  *len = json_string_length(v);
  *out = malloc(*len + 1);
  if (!*out) return ci_fail("tokenizer: out of memory");
  memcpy(*out, json_string_value(v), *len + 1);
  return CI_OK;
}

/* Rust's char::to_lowercase: the full mapping; U+0130 is the only code point whose lowercase is
 * two characters. */
static int append_lower(tok_buf *out, uint32_t cp) {
  if (cp == 0x130) return tok_buf_append(out, "i\xCC\x87", 3);
  return append_cp(out, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp));
}

static int is_mark(uint32_t cp) {
  utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
  return c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_MC || c == UTF8PROC_CATEGORY_ME;
}

/* ==== Unicode normalization forms ==== */

static int parse_form(tok_normalizer *nz, json_t *j) {
  static const struct {
    const char *type;
    utf8proc_option_t options;
  } forms[] = {
      {"NFC", UTF8PROC_STABLE | UTF8PROC_COMPOSE},
      {"NFD", UTF8PROC_STABLE | UTF8PROC_DECOMPOSE},
      {"NFKC", UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT},
      {"NFKD", UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT},
  };
  for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++)
    if (!strcmp(forms[i].type, nz->kind->type)) nz->form = forms[i].options;
  return CI_OK;
}

static int normalize_chunk(const tok_normalizer *nz, const char *s, size_t n, tok_buf *out) {
  utf8proc_uint8_t *mapped = NULL;
  utf8proc_ssize_t len =
      utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &mapped, nz->form);
  if (len < 0) return ci_fail("normalizer %s: %s", nz->kind->type, utf8proc_errmsg(len));
  int rc = tok_buf_append(out, mapped, (size_t)len);
  free(mapped);
  return rc;
}

/* ASCII characters are starters that never compose with what precedes them, so only the runs of
 * non-ASCII text (with the ASCII character just before, which they may combine with) go through
 * utf8proc; the rest is copied. */
static int apply_form(const tok_normalizer *nz, const char *in, size_t n, tok_buf *out,
                      int *keeps_start) {
  size_t copied = 0, i = 0;
  while (i < n) {
    if (!((unsigned char)in[i] & 0x80)) {
      i++;
      continue;
    }
    size_t start = i > copied ? i - 1 : i;
    size_t end = i;
    while (end < n && ((unsigned char)in[end] & 0x80)) end++;
    if (tok_buf_append(out, in + copied, start - copied) ||
        normalize_chunk(nz, in + start, end - start, out))
      return CI_ERR;
    copied = i = end;
  }
  return tok_buf_append(out, in + copied, n - copied);
}

/* ==== Character maps ==== */

static int apply_lowercase(const tok_normalizer *nz, const char *in, size_t n, tok_buf *out,
                           int *keeps_start) {
  for (size_t i = 0; i < n;) {
    unsigned char c = (unsigned char)in[i];
    if (c < 0x80) {
      char lower = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
      if (tok_buf_append(out, &lower, 1)) return CI_ERR;
      i++;
      continue;
    }
    uint32_t cp;
    i += tok_utf8_next(in, n, i, &cp);
    if (append_lower(out, cp)) return CI_ERR;
  }
  return CI_OK;
}

static int parse_strip(tok_normalizer *nz, json_t *j) {
  nz->left = tok_json_bool(j, "strip_left", 1);
  nz->right = tok_json_bool(j, "strip_right", 1);
  return CI_OK;
}

static int apply_strip(const tok_normalizer *nz, const char *in, size_t n, tok_buf *out,
                       int *keeps_start) {
  size_t start = 0, end = n;
  uint32_t cp;
  if (nz->left)
    while (start < end) {
      size_t l = tok_utf8_next(in, n, start, &cp);
      if (!tok_is_whitespace(cp)) break;
      start += l;
    }
  if (nz->right)
    while (end > start) {
      size_t l = tok_utf8_prev_len(in, end);
      tok_utf8_next(in, n, end - l, &cp);
      if (!tok_is_whitespace(cp)) break;
      end -= l;
    }
  if (start > 0) *keeps_start = 0;
  return tok_buf_append(out, in + start, end - start);
}

static int apply_strip_accents(const tok_normalizer *nz, const char *in, size_t n, tok_buf *out,
                               int *keeps_start) {
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    size_t l = tok_utf8_next(in, n, i, &cp);
    if (!is_mark(cp) && tok_buf_append(out, in + i, l)) return CI_ERR;
    if (i == 0 && is_mark(cp)) *keeps_start = 0;
    i += l;
  }
  return CI_OK;
}

static int apply_nmt(const tok_normalizer *nz, const char *in, size_t n, tok_buf *out,
                     int *keeps_start) {
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    size_t l = tok_utf8_next(in, n, i, &cp);
    i += l;
    if ((cp >= 1 && cp <= 8) || cp == 0x0B || (cp >= 0x0E && cp <= 0x1F) || cp == 0x7F ||
        cp == 0x8F || cp == 0x9F) {
      if (i == l) *keeps_start = 0;
      continue;
    }
    int space = cp == 0x09 || cp == 0x0A || cp == 0x0C || cp == 0x0D || cp == 0x1680 ||
                (cp >= 0x200B && cp <= 0x200F) || cp == 0x2028 || cp == 0x2029 || cp == 0x2581 ||
                cp == 0xFEFF || cp == 0xFFFD;
    if (space ? tok_buf_append(out, " ", 1) : tok_buf_append(out, in + i - l, l)) return CI_ERR;
  }
  return CI_OK;
}

static int apply_bytelevel(const tok_normalizer *nz, const char *in, size_t n, tok_buf *out,
                           int *keeps_start) {
  for (size_t i = 0; i < n; i++)
    if (append_cp(out, tok_bytelevel_char((uint8_t)in[i]))) return CI_ERR;
  return CI_OK;
}

/* ==== BertNormalizer ==== */

static int parse_bert(tok_normalizer *nz, json_t *j) {
  nz->clean_text = tok_json_bool(j, "clean_text", 1);
  nz->chinese_chars = tok_json_bool(j, "handle_chinese_chars", 1);
  nz->lowercase = tok_json_bool(j, "lowercase", 1);
  nz->strip_accents = tok_json_bool(j, "strip_accents", nz->lowercase);
  return CI_OK;
}

static int is_other(uint32_t cp) {
  utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
  return c == UTF8PROC_CATEGORY_CC || c == UTF8PROC_CATEGORY_CF || c == UTF8PROC_CATEGORY_CS ||
         c == UTF8PROC_CATEGORY_CO || c == UTF8PROC_CATEGORY_CN;
}

static int is_chinese_char(uint32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
         (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
         (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

static int apply_bert(const tok_normalizer *nz, const char *in, size_t n, tok_buf *out,
                      int *keeps_start) {
  tok_buf a = {0}, b = {0};
  int rc = CI_ERR;
  if (tok_buf_reserve(&a, n)) goto done;
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    size_t l = tok_utf8_next(in, n, i, &cp);
    i += l;
    int ws = cp == '\t' || cp == '\n' || cp == '\r' || tok_is_whitespace(cp);
    if (nz->clean_text && !ws && (cp == 0 || cp == 0xFFFD || is_other(cp))) {
      if (i == l) *keeps_start = 0;
      continue;
    }
    if (nz->clean_text && ws) {
      if (tok_buf_append(&a, " ", 1)) goto done;
    } else if (nz->chinese_chars && is_chinese_char(cp)) {
      if (tok_buf_append(&a, " ", 1) || tok_buf_append(&a, in + i - l, l) ||
          tok_buf_append(&a, " ", 1))
        goto done;
    } else if (tok_buf_append(&a, in + i - l, l)) {
      goto done;
    }
  }
  if (nz->strip_accents) {
    utf8proc_uint8_t *nfd = NULL;
    utf8proc_ssize_t len =
        a.len ? utf8proc_map((const utf8proc_uint8_t *)a.data, (utf8proc_ssize_t)a.len, &nfd,
                             UTF8PROC_STABLE | UTF8PROC_DECOMPOSE)
              : 0;
    if (len < 0) {
      ci_fail("BertNormalizer: %s", utf8proc_errmsg(len));
      goto done;
    }
    for (size_t i = 0; i < (size_t)len;) {
      uint32_t cp;
      size_t l = tok_utf8_next((const char *)nfd, (size_t)len, i, &cp);
      if (utf8proc_category((utf8proc_int32_t)cp) != UTF8PROC_CATEGORY_MN &&
          tok_buf_append(&b, nfd + i, l)) {
        free(nfd);
        goto done;
      }
      i += l;
    }
    free(nfd);
    tok_buf tmp = a;
    a = b;
    b = tmp;
    b.len = 0;
  }
  rc = nz->lowercase ? apply_lowercase(nz, a.data ? a.data : "", a.len, out, keeps_start)
                     : tok_buf_append(out, a.data, a.len);
done:
  tok_buf_free(&a);
  tok_buf_free(&b);
  return rc;
}

/* ==== Replace and Prepend ==== */

static int parse_replace(tok_normalizer *nz, json_t *j) {
  if (tok_pattern_parse(json_object_get(j, "pattern"), &nz->pattern, "normalizer Replace"))
    return CI_ERR;
  return dup_string(j, "content", "normalizer Replace", &nz->content, &nz->content_len);
}

static int apply_replace(const tok_normalizer *nz, const char *in, size_t n, tok_buf *out,
                         int *keeps_start) {
  tok_spans m = {0};
  if (tok_pattern_find_all(&nz->pattern, in, n, &m)) return CI_ERR;
  size_t at = 0;
  int rc = CI_OK;
  for (size_t k = 0; k < m.n && rc == CI_OK; k++) {
    if (m.v[k].off == 0 && m.v[k].len > 0 && nz->content_len == 0) *keeps_start = 0;
    rc = tok_buf_append(out, in + at, m.v[k].off - at);
    if (rc == CI_OK) rc = tok_buf_append(out, nz->content, nz->content_len);
    at = m.v[k].off + m.v[k].len;
  }
  if (rc == CI_OK) rc = tok_buf_append(out, in + at, n - at);
  tok_spans_free(&m);
  return rc;
}

static int parse_prepend(tok_normalizer *nz, json_t *j) {
  return dup_string(j, "prepend", "normalizer Prepend", &nz->content, &nz->content_len);
}

static int apply_prepend(const tok_normalizer *nz, const char *in, size_t n, tok_buf *out,
                         int *keeps_start) {
  if (n && tok_buf_append(out, nz->content, nz->content_len)) return CI_ERR;
  return tok_buf_append(out, in, n);
}

/* ==== Sequence ==== */

static int parse_sequence(tok_normalizer *nz, json_t *j) {
  json_t *list = json_object_get(j, "normalizers");
  if (!json_is_array(list)) return ci_fail("normalizer Sequence: \"normalizers\" must be a list");
  nz->children = calloc(json_array_size(list) + 1, sizeof *nz->children);
  if (!nz->children) return ci_fail("tokenizer: out of memory");
  for (size_t i = 0; i < json_array_size(list); i++) {
    nz->children[i] = tok_normalizer_parse(json_array_get(list, i));
    if (!nz->children[i]) return ci_fail_context("normalizer Sequence item %zu", i);
    nz->n_children = i + 1;
  }
  return CI_OK;
}

static int apply_sequence(const tok_normalizer *nz, const char *in, size_t n, tok_buf *out,
                          int *keeps_start) {
  if (nz->n_children == 0) return tok_buf_append(out, in, n);
  tok_buf tmp[2] = {{0}, {0}};
  int rc = CI_OK;
  const char *src = in;
  size_t src_len = n;
  for (size_t i = 0; i < nz->n_children && rc == CI_OK; i++) {
    tok_buf *dst = i + 1 == nz->n_children ? out : &tmp[i % 2];
    dst->len = 0;
    rc = tok_normalizer_apply(nz->children[i], src, src_len, dst, keeps_start);
    src = dst->data ? dst->data : "";
    src_len = dst->len;
  }
  tok_buf_free(&tmp[0]);
  tok_buf_free(&tmp[1]);
  return rc;
}

/* ==== Kind table, parse, apply ==== */

static const normalizer_kind kinds[] = {
    {"NFC", parse_form, apply_form},
    {"NFD", parse_form, apply_form},
    {"NFKC", parse_form, apply_form},
    {"NFKD", parse_form, apply_form},
    {"Lowercase", NULL, apply_lowercase},
    {"Strip", parse_strip, apply_strip},
    {"StripAccents", NULL, apply_strip_accents},
    {"Replace", parse_replace, apply_replace},
    {"Prepend", parse_prepend, apply_prepend},
    {"BertNormalizer", parse_bert, apply_bert},
    {"Nmt", NULL, apply_nmt},
    {"ByteLevel", NULL, apply_bytelevel},
    {"Sequence", parse_sequence, apply_sequence},
};

tok_normalizer *tok_normalizer_parse(json_t *j) {
  if (!json_is_object(j)) {
    ci_fail("normalizer must be an object");
    return NULL;
  }
  const char *type = tok_json_str(j, "type");
  if (!type) {
    ci_fail("normalizer has no \"type\"");
    return NULL;
  }
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
    if (strcmp(kinds[i].type, type)) continue;
    tok_normalizer *nz = calloc(1, sizeof *nz);
    if (!nz) {
      ci_fail("tokenizer: out of memory");
      return NULL;
    }
    nz->kind = &kinds[i];
    if (nz->kind->parse && nz->kind->parse(nz, j)) {
      tok_normalizer_free(nz);
      return NULL;
    }
    return nz;
  }
  ci_fail("unsupported normalizer type \"%s\"", type);
  return NULL;
}

void tok_normalizer_free(tok_normalizer *nz) {
  if (!nz) return;
  for (size_t i = 0; i < nz->n_children; i++) tok_normalizer_free(nz->children[i]);
  free(nz->children);
  tok_pattern_free(&nz->pattern);
  free(nz->content);
  free(nz);
}

int tok_normalizer_apply(const tok_normalizer *nz, const char *in, size_t n, tok_buf *out,
                         int *keeps_start) {
  out->len = 0;
  if (tok_buf_reserve(out, n)) return CI_ERR;
  out->data[0] = '\0';
  return nz->kind->apply(nz, in, n, out, keeps_start);
}
