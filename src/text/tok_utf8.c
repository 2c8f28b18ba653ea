/* UTF-8 for the tokenizer: validation, decoding, Rust-compatible lossy conversion, the Unicode
 * character classes HF's components test (whitespace, punctuation, numeric, word), and the GPT-2
 * byte-level alphabet. */
#include "base/error.h"
#include "text/tok_internal.h"

#include <utf8proc.h>

/* ==== Decoding and validation ==== */

/* Accepted range of the second byte for each lead byte (RFC 3629 table). */
static int second_byte_ok(unsigned char lead, unsigned char b) {
  if (lead == 0xE0) return b >= 0xA0 && b <= 0xBF;
  if (lead == 0xED) return b >= 0x80 && b <= 0x9F;
  if (lead == 0xF0) return b >= 0x90 && b <= 0xBF;
  if (lead == 0xF4) return b >= 0x80 && b <= 0x8F;
  return b >= 0x80 && b <= 0xBF;
}

static int lead_width(unsigned char b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

static int is_cont(unsigned char b) {
  return (b & 0xC0) == 0x80;
}

/* Length of the valid character at s[i], or 0 when invalid; *prefix gets how many bytes form a
 * valid-but-interrupted prefix (at least 1), as Rust's Utf8Chunks counts them. */
static size_t char_at(const unsigned char *s, size_t n, size_t i, size_t *prefix) {
  int w = lead_width(s[i]);
  *prefix = 1;
  if (w == 1) return 1;
  if (w == 0) return 0;
  if (i + 1 >= n) return *prefix = n - i, 0;
  if (!second_byte_ok(s[i], s[i + 1])) return 0;
  for (int k = 2; k < w; k++) {
    *prefix = (size_t)k;
    if (i + k >= n) return *prefix = n - i, 0;
    if (!is_cont(s[i + k])) return 0;
  }
  if (w == 2) *prefix = 2;
  return (size_t)w;
}

size_t tok_utf8_valid_prefix(const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0, prefix;
  while (i < n) {
    if (u[i] < 0x80) {
      i++;
      continue;
    }
    size_t w = char_at(u, n, i, &prefix);
    if (!w) return i;
    i += w;
  }
  return n;
}

size_t tok_utf8_next(const char *s, size_t n, size_t i, uint32_t *cp) {
  const unsigned char *u = (const unsigned char *)s + i;
  size_t rest = n - i;
  if (u[0] < 0x80 || rest < 2) return *cp = u[0], 1;
  if (u[0] < 0xE0) return *cp = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F), 2;
  if (u[0] < 0xF0 || rest < 4) {
    if (rest < 3) return *cp = u[0], 1;
    return *cp = ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F),
           3;
  }
  *cp = ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) |
        ((uint32_t)(u[2] & 0x3F) << 6) | (u[3] & 0x3F);
  return 4;
}

size_t tok_utf8_prev_len(const char *s, size_t i) {
  size_t k = 1;
  while (k < i && k < 4 && is_cont((unsigned char)s[i - k])) k++;
  return k;
}

size_t tok_utf8_encode(uint32_t cp, char out[4]) {
  if (cp < 0x80) return out[0] = (char)cp, 1;
  if (cp < 0x800) {
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (char)(0xE0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (char)(0xF0 | (cp >> 18));
  out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
  out[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

int tok_utf8_lossy_append(tok_buf *out, const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0, run = 0, prefix;
  if (tok_buf_reserve(out, n)) return CI_ERR;
  while (i < n) {
    if (u[i] < 0x80) {
      i++;
      continue;
    }
    size_t w = char_at(u, n, i, &prefix);
    if (w) {
      i += w;
      continue;
    }
    if (tok_buf_append(out, s + run, i - run) || tok_buf_append(out, "\xEF\xBF\xBD", 3))
      return CI_ERR;
    i += prefix;
    run = i;
  }
  return tok_buf_append(out, s + run, n - run);
}

/* ==== Character classes ==== */

int tok_is_whitespace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

int tok_is_punctuation(uint32_t cp) {
  if (cp < 0x80)
    return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
           (cp >= 0x7B && cp <= 0x7E);
  utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
  return c == UTF8PROC_CATEGORY_PC || c == UTF8PROC_CATEGORY_PD || c == UTF8PROC_CATEGORY_PS ||
         c == UTF8PROC_CATEGORY_PE || c == UTF8PROC_CATEGORY_PI || c == UTF8PROC_CATEGORY_PF ||
         c == UTF8PROC_CATEGORY_PO;
}

int tok_is_numeric(uint32_t cp) {
  utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
  return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

int tok_is_word_char(uint32_t cp) {
  if (cp < 0x80)
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
           cp == '_';
  if (cp == 0x200C || cp == 0x200D || (cp >= 0x24B6 && cp <= 0x24E9) ||
      (cp >= 0x1F130 && cp <= 0x1F189))
    return 1;
  switch (utf8proc_category((utf8proc_int32_t)cp)) {
  case UTF8PROC_CATEGORY_LU:
  case UTF8PROC_CATEGORY_LL:
  case UTF8PROC_CATEGORY_LT:
  case UTF8PROC_CATEGORY_LM:
  case UTF8PROC_CATEGORY_LO:
  case UTF8PROC_CATEGORY_NL:
  case UTF8PROC_CATEGORY_MN:
  case UTF8PROC_CATEGORY_MC:
  case UTF8PROC_CATEGORY_ME:
  case UTF8PROC_CATEGORY_ND:
  case UTF8PROC_CATEGORY_PC:
    return 1;
  default:
    return 0;
  }
}

/* ==== GPT-2 byte-level alphabet ==== */

/* Printable Latin-1 bytes stand for themselves; the other 68 bytes (0-32, 127-160, 173) take
 * the code points 256.. in byte order. */
uint32_t tok_bytelevel_char(uint8_t b) {
  if (b <= 32) return 256u + b;
  if (b >= 127 && b <= 160) return 289u + (b - 127u);
  if (b == 173) return 323;
  return b;
}

int tok_bytelevel_byte(uint32_t cp) {
  if (cp < 256) {
    if (cp <= 32 || (cp >= 127 && cp <= 160) || cp == 173) return -1;
    return (int)cp;
  }
  if (cp <= 288) return (int)(cp - 256);
  if (cp <= 322) return (int)(cp - 289 + 127);
  if (cp == 323) return 173;
  return -1;
}
