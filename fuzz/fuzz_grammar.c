/* libFuzzer target: the fuzz input is a grammar — GBNF text, or (first byte '{') a JSON Schema
 * compiled to one — and, when it compiles, a matcher runs a fixed sample text through it byte by
 * byte. Any input, however malformed or hostile, must give a grammar or an error, and the matcher
 * an answer per byte — never a crash, a leak or a hang. */
#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static const char sample[] =
    "{\"a\": [1, -2.5e3, true, null], \"b\": \"x\\u00e9\xc3\xa9\xe4\xb8\xad\"}"
    " root ::= ab* | (\"c\")+ 123 \n\t";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 1 << 14) return 0;
  ci_grammar *g = size > 0 && data[0] == '{'
                      ? ci_grammar_from_json_schema((const char *)data, size, data[size - 1] & 1)
                      : ci_grammar_parse((const char *)data, size, "root");
  if (!g) return 0;
  ci_grammar_matcher *m = ci_grammar_matcher_create(g, NULL);
  if (m) {
    for (size_t i = 0; i + 1 < sizeof sample; i++) {
      if (!ci_grammar_matcher_allows(m, sample + i, 1)) continue;
      if (ci_grammar_matcher_accept_bytes(m, sample + i, 1)) break;
    }
    (void)ci_grammar_matcher_is_complete(m);
    ci_grammar_matcher_free(m);
  }
  ci_grammar_free(g);
  return 0;
}
