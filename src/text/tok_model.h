/* Internal interface between the model dispatcher (tok_model.c) and the model kinds (BPE, Unigram,
 * WordPiece, WordLevel): each kind parses its JSON into `impl` and tokenizes one piece. */
#ifndef CI_TEXT_TOK_MODEL_H
#define CI_TEXT_TOK_MODEL_H

#include "text/tok_internal.h"

typedef struct tok_model_kind tok_model_kind;

struct tok_model {
  const tok_model_kind *kind;
  tok_vocab vocab; /* token <-> id of the model itself (added tokens live elsewhere) */
  void *impl;      /* kind-specific state */
};

struct tok_model_kind {
  const char *type;
  /* Fills m->vocab and m->impl from the "model" object. */
  int (*parse)(tok_model *m, json_t *j);
  void (*free_impl)(void *impl);
  /* Appends the ids of the piece s[0:n); *work is the kind's per-call memory (NULL at first). */
  int (*tokenize)(const tok_model *m, const char *s, size_t n, tok_model_work **work, tok_ids *out);
  void (*free_work)(tok_model_work *work);
};

extern const tok_model_kind tok_bpe_kind;
extern const tok_model_kind tok_unigram_kind;
extern const tok_model_kind tok_wordpiece_kind;
extern const tok_model_kind tok_wordlevel_kind;

/* Reads a {"token": id, ...} vocabulary object into v; `what` names the model in errors. */
int tok_model_read_vocab_object(json_t *vocab, tok_vocab *v, const char *what);

#endif
