/* Model dispatch: picks the model kind named by "type" (BPE, Unigram, WordPiece, WordLevel) and
 * routes tokenize/free calls to it. */
#include "base/error.h"
#include "text/tok_model.h"

#include <stdlib.h>
#include <string.h>

static const tok_model_kind *const kinds[] = {&tok_bpe_kind, &tok_unigram_kind, &tok_wordpiece_kind,
                                              &tok_wordlevel_kind};

int tok_model_read_vocab_object(json_t *vocab, tok_vocab *v, const char *what) {
  if (!json_is_object(vocab)) return ci_fail("model %s: \"vocab\" must be an object", what);
  for (void *it = json_object_iter(vocab); it; it = json_object_iter_next(vocab, it)) {
    const char *key = json_object_iter_key(it);
    json_t *value = json_object_iter_value(it);
    if (!json_is_integer(value) || json_integer_value(value) < 0 ||
        json_integer_value(value) > INT32_MAX)
      return ci_fail("model %s: vocab entry \"%.80s\" has no valid id", what, key);
    if (tok_vocab_add(v, key, json_object_iter_key_len(it), (int32_t)json_integer_value(value)))
      return CI_ERR;
  }
  return CI_OK;
}

tok_model *tok_model_parse(json_t *j) {
  if (!json_is_object(j)) {
    ci_fail("\"model\" must be an object");
    return NULL;
  }
  const char *type = tok_json_str(j, "type");
  const tok_model_kind *kind = NULL;
  if (!type) { /* old files omit the type: guess from the fields, as HF does */
    if (json_object_get(j, "merges"))
      kind = &tok_bpe_kind;
    else if (json_is_array(json_object_get(j, "vocab")))
      kind = &tok_unigram_kind;
    else if (json_object_get(j, "continuing_subword_prefix"))
      kind = &tok_wordpiece_kind;
    else
      kind = &tok_wordlevel_kind;
  }
  for (size_t i = 0; type && i < sizeof kinds / sizeof kinds[0]; i++)
    if (!strcmp(kinds[i]->type, type)) kind = kinds[i];
  if (!kind) {
    ci_fail("unsupported model type \"%s\"", type);
    return NULL;
  }
  tok_model *m = calloc(1, sizeof *m);
  if (!m) {
    ci_fail("tokenizer: out of memory");
    return NULL;
  }
  m->kind = kind;
  if (kind->parse(m, j)) {
    tok_model_free(m);
    return NULL;
  }
  return m;
}

void tok_model_free(tok_model *m) {
  if (!m) return;
  if (m->impl) m->kind->free_impl(m->impl);
  tok_vocab_free(&m->vocab);
  free(m);
}

void tok_model_work_free(const tok_model *m, tok_model_work *w) {
  if (w && m->kind->free_work) m->kind->free_work(w);
}

int tok_model_tokenize(const tok_model *m, const char *s, size_t n, tok_model_work **work,
                       tok_ids *out) {
  return m->kind->tokenize(m, s, n, work, out);
}

const tok_vocab *tok_model_vocab(const tok_model *m) {
  return &m->vocab;
}
