/* WordLevel model: each pre-tokenized piece is looked up whole; unknown pieces become unk. */
#include "base/error.h"
#include "text/tok_model.h"

#include <stdlib.h>
#include <string.h>

static void wordlevel_free(void *impl) {
  free(impl);
}

static int wordlevel_parse(tok_model *m, json_t *j) {
  const char *unk = tok_json_str(j, "unk_token");
  m->impl = strdup(unk ? unk : "<unk>");
  if (!m->impl) return ci_fail("tokenizer: out of memory");
  return tok_model_read_vocab_object(json_object_get(j, "vocab"), &m->vocab, "WordLevel");
}

static int wordlevel_tokenize(const tok_model *m, const char *s, size_t n, tok_model_work **work,
                              tok_ids *out) {
  int32_t id = tok_vocab_get(&m->vocab, s, n);
  if (id < 0) id = tok_vocab_get(&m->vocab, m->impl, strlen(m->impl));
  if (id < 0)
    return ci_fail("model WordLevel: unk_token \"%s\" is not in the vocab", (char *)m->impl);
  return tok_ids_push(out, id);
}

const tok_model_kind tok_wordlevel_kind = {"WordLevel", wordlevel_parse, wordlevel_free,
                                           wordlevel_tokenize, NULL};
