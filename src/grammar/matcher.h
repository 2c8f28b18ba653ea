/* The incremental grammar matcher of one sequence: a pushdown automaton over the bytes of the
 * generated text, and the token mask it allows next.
 *
 * A state is a set of parse stacks (llama.cpp's formulation: each stack a list of positions in the
 * grammar, its top always a terminal; the empty stack means the start rule is complete) plus a
 * partial UTF-8 character. States are interned, and a byte transition between interned states is
 * computed once and then looked up, so the automaton becomes a lazily built DFA: on the trie of
 * token byte strings (grammar/vocab.h) a mask costs one table lookup per visited trie node, and a
 * rejected node prunes its whole subtree. Masks are cached per state too (a JSON string body, for
 * one, comes back to the same state after every character). The tables are bounded: past a limit
 * they are dropped and rebuilt from the current state.
 *
 * Ownership: the matcher holds a reference to its grammar and its vocabulary; one thread at a
 * time. */
#ifndef CI_GRAMMAR_MATCHER_H
#define CI_GRAMMAR_MATCHER_H

#include "grammar/grammar.h"
#include "grammar/vocab.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ci_grammar_matcher ci_grammar_matcher;

/* A matcher at the start of the grammar. vocab may be NULL (then only byte-level calls work). NULL
 * with ci_last_error on failure (out of memory). */
ci_grammar_matcher *ci_grammar_matcher_create(ci_grammar *grammar, ci_grammar_vocab *vocab);

/* NULL is a no-op. */
void ci_grammar_matcher_free(ci_grammar_matcher *m);

/* Whether the grammar allows bytes[0..n) next (without advancing). */
int ci_grammar_matcher_allows(ci_grammar_matcher *m, const char *bytes, size_t n);

/* Advances over bytes[0..n). CI_OK, or CI_ERR naming the byte the grammar rejects (the matcher
 * then stays where it was). */
int ci_grammar_matcher_accept_bytes(ci_grammar_matcher *m, const char *bytes, size_t n);

/* Advances over token id's bytes (ci_grammar_matcher_accept_bytes). */
int ci_grammar_matcher_accept_token(ci_grammar_matcher *m, int32_t id);

/* 1 when the text so far is a complete sentence of the grammar (EOS may end it). */
int ci_grammar_matcher_is_complete(const ci_grammar_matcher *m);

/* 1 when nothing can follow the text so far (complete, and no byte is allowed). */
int ci_grammar_matcher_is_finished(ci_grammar_matcher *m);

/* The mask over the vocabulary: bit id of bits[(n_vocab + 31) / 32] is set when the grammar
 * allows token id next. EOS is not included (the caller allows it when the matcher is complete).
 * Returns a pointer valid until the next call on the matcher (the per-state cache), or NULL with
 * ci_last_error (out of memory). */
const uint32_t *ci_grammar_matcher_mask(ci_grammar_matcher *m);

/* Applies the mask to logits[n_vocab]: every token the grammar does not allow gets -inf, except
 * the eos ids when the matcher is complete. Returns the number of tokens left, or -1 with
 * ci_last_error. */
int ci_grammar_matcher_apply(ci_grammar_matcher *m, float *logits, const int32_t *eos, int n_eos);

/* Interned states and cached masks so far (for tests and the benchmark). */
int ci_grammar_matcher_n_states(const ci_grammar_matcher *m);

/* Drops every cached transition and mask (the benchmark measures cold masks with it). */
int ci_grammar_matcher_clear_cache(ci_grammar_matcher *m);

#endif
