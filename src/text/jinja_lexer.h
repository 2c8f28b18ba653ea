/* Jinja lexer: template source → tokens (text runs, tag delimiters, names, literals, operators),
 * applying whitespace control ({%- -%}, {{- -}}, {%+ +%}) and transformers' trim_blocks=True /
 * lstrip_blocks=True, dropping comments and expanding {% raw %} blocks. Internal to src/text. */
#ifndef CI_TEXT_JINJA_LEXER_H
#define CI_TEXT_JINJA_LEXER_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
  JT_TEXT,
  JT_VAR_BEGIN,
  JT_VAR_END,
  JT_BLOCK_BEGIN,
  JT_BLOCK_END,
  JT_NAME,
  JT_STRING,
  JT_INT,
  JT_FLOAT,
  JT_OP,
  JT_EOF,
} jtok_kind;

typedef struct {
  jtok_kind kind;
  int line, col;
  char *text; /* JT_TEXT, JT_NAME, JT_STRING (decoded), JT_OP (the operator); malloc'd */
  size_t len;
  int64_t i; /* JT_INT */
  double f;  /* JT_FLOAT */
} jtok;

typedef struct {
  jtok *toks;
  size_t n, cap;
} jtok_list;

/* Tokenizes source (len bytes, need not be NUL-terminated). 0 ok; -1 with ci_fail("line L,
 * column C: ...") on a lexical error. The list is filled either way: free it with
 * ci_jinja_tokens_free. */
int ci_jinja_tokenize(const char *source, size_t len, jtok_list *out);
void ci_jinja_tokens_free(jtok_list *list);

#endif
