/* A compiled context-free grammar over Unicode code points, parsed from GBNF (the grammar format
 * of llama.cpp): rules `name ::= alternatives`, sequences, groups, `*` `+` `?` `{m}` `{m,}`
 * `{m,n}`, string literals, character classes with ranges and negation, `.` (any character) and
 * `#` comments. Repetitions and groups are expanded into generated rules, so a compiled grammar
 * holds only sequences of terminals and rule references.
 *
 * Layout (one flat element array, as in llama.cpp): rule r's body starts at rule_start[r] and is
 * its alternatives, each a run of elements, separated by ALT and closed by END. A terminal is a
 * CHAR / CHAR_NOT / CHAR_ANY element followed by any number of CHAR_RNG_UPPER (turning the
 * previous character into a range) and CHAR_ALT (one more character or range) elements.
 *
 * Ownership: a grammar is immutable once built and reference-counted, so the requests of an
 * engine and the caller that compiled it may share it from any threads (ci_grammar_retain,
 * ci_grammar_free drops one reference). */
#ifndef CI_GRAMMAR_GRAMMAR_H
#define CI_GRAMMAR_GRAMMAR_H

#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>

typedef enum {
  CI_GE_END = 0,        /* end of a rule body */
  CI_GE_ALT,            /* start of the next alternative */
  CI_GE_RULE_REF,       /* value: the rule index */
  CI_GE_CHAR,           /* value: a code point */
  CI_GE_CHAR_NOT,       /* value: a code point; the whole class is negated */
  CI_GE_CHAR_RNG_UPPER, /* value: upper bound of a range whose lower bound precedes */
  CI_GE_CHAR_ALT,       /* value: another code point of the class */
  CI_GE_CHAR_ANY        /* any code point */
} ci_grammar_etype;

typedef struct {
  uint8_t type; /* ci_grammar_etype */
  uint32_t value;
} ci_grammar_element;

typedef struct ci_grammar ci_grammar;

struct ci_grammar {
  _Atomic int refs;
  ci_grammar_element *elements;
  int n_elements;
  int *rule_start;   /* [n_rules] element index of each rule's body */
  char **rule_names; /* [n_rules] owned */
  int n_rules;
  int root; /* index of the start rule */
};

/* Parses GBNF text of len bytes with start rule `root_rule` (usually "root"). Returns NULL with
 * ci_last_error on a syntax error ("grammar line L, column C: ..."), an undefined rule, a missing
 * start rule, or left recursion (a rule that can reach itself without consuming a character). */
ci_grammar *ci_grammar_parse(const char *text, size_t len, const char *root_rule);

/* Adds a reference; returns g. */
ci_grammar *ci_grammar_retain(ci_grammar *g);

/* Drops a reference; the last one frees the grammar. NULL is a no-op. */
void ci_grammar_free(ci_grammar *g);

/* Whether code point c matches the terminal whose first element is at `pos`. */
int ci_grammar_char_matches(const ci_grammar *g, int pos, uint32_t c);

/* Whether some code point in [lo, hi] may match the terminal at `pos` (an over-approximation for
 * negated classes: used to keep a partial UTF-8 character only when it can still complete). */
int ci_grammar_char_range_may_match(const ci_grammar *g, int pos, uint32_t lo, uint32_t hi);

/* Index of the element after the terminal at `pos`. */
int ci_grammar_after_terminal(const ci_grammar *g, int pos);

#endif
