/* The vocabulary as the grammar sees it: the byte string of every token id, in a trie laid out in
 * preorder so that a token mask is one pass over the nodes that skips every subtree the grammar
 * rejects (grammar/matcher.h). Built once per tokenizer (or from explicit byte strings, for
 * synthetic vocabularies) and shared: immutable and reference-counted.
 *
 * Tokens with no bytes (special added tokens, ids the tokenizer lacks) are not in the trie: a
 * grammar never allows them (EOS ids are the caller's business, allowed when the grammar is
 * complete). */
#ifndef CI_GRAMMAR_VOCAB_H
#define CI_GRAMMAR_VOCAB_H

#include "text/tokenizer.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* One trie node (12 bytes, so the walk streams through one array). */
typedef struct {
  int32_t end;      /* one past the last node of its subtree */
  int32_t tokens;   /* first index into token_ids of the tokens whose bytes end here */
  uint16_t depth;   /* bytes from the root */
  uint8_t byte;     /* the byte on the edge into the node */
  uint8_t n_tokens; /* tokens whose bytes end here */
} ci_grammar_trie_node;

typedef struct {
  _Atomic int refs;
  int n_vocab;
  char *bytes;    /* every token's bytes, concatenated */
  size_t *offset; /* [n_vocab + 1] token id's bytes are bytes[offset[id] .. offset[id + 1]) */
  /* trie in preorder; node 0 is the root (the empty string) */
  int n_nodes;
  int max_depth;
  ci_grammar_trie_node *nodes; /* [n_nodes] */
  uint8_t *plain;     /* [n_nodes] 1 when the node's byte and every byte below it is plain text
                         (ci_grammar_plain_byte): a state that every plain byte leads back to
                         allows the whole subtree */
  int32_t *token_ids; /* ids sorted by their bytes */
  int32_t n_sorted;   /* ids in token_ids (those with bytes) */
} ci_grammar_vocab;

/* Printable ASCII other than '"' and '\\' (what a JSON string takes as itself). */
static inline int ci_grammar_plain_byte(uint8_t b) {
  return b >= 0x20 && b <= 0x7E && b != '"' && b != '\\';
}

/* From a tokenizer, for a model of n_vocab ids (>= the tokenizer's; ids it lacks get no bytes).
 * Special added tokens get no bytes. NULL with ci_last_error on failure. */
ci_grammar_vocab *ci_grammar_vocab_from_tokenizer(const ci_tokenizer *tok, int n_vocab);

/* From explicit byte strings: token i is bytes[i][0..lens[i]) (lens[i] 0: never allowed). */
ci_grammar_vocab *ci_grammar_vocab_from_bytes(const char *const *bytes, const size_t *lens,
                                              int n_vocab);

/* Adds a reference; returns v. */
ci_grammar_vocab *ci_grammar_vocab_retain(ci_grammar_vocab *v);

/* Drops a reference; the last one frees it. NULL is a no-op. */
void ci_grammar_vocab_free(ci_grammar_vocab *v);

/* Token id's bytes and their count. */
const char *ci_grammar_vocab_token(const ci_grammar_vocab *v, int32_t id, size_t *len);

#endif
