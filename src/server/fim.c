/* Fill-in-the-middle prompts for /v1/completions `suffix` (docs/server.md "Completions"): finds
 * the tokenizer's FIM markers and lays a prefix and a suffix out around them for the model to
 * write the middle. Three conventions, all prefix-suffix-middle: Qwen / StarCoder
 * (<|fim_prefix|> <|fim_suffix|> <|fim_middle|>, or without the bars), CodeLlama (▁<PRE> ▁<SUF>
 * ▁<MID>) and DeepSeek-Coder (<｜fim▁begin｜> <｜fim▁hole｜> <｜fim▁end｜>). The tokens FIM models
 * end a middle with (<|fim_pad|>, <|file_sep|>, ▁<EOT>, ...) join the request's stop tokens. */
#include "server/server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Marker triples: prefix, suffix, middle. */
static const char *const fim_markers[][3] = {
    {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"},
    {"<fim_prefix>", "<fim_suffix>", "<fim_middle>"},
    {"\xe2\x96\x81<PRE>", "\xe2\x96\x81<SUF>", "\xe2\x96\x81<MID>"},
    {"<PRE>", "<SUF>", "<MID>"},
    {"<\xef\xbd\x9c"
     "fim\xe2\x96\x81"
     "begin\xef\xbd\x9c>",
     "<\xef\xbd\x9c"
     "fim\xe2\x96\x81"
     "hole\xef\xbd\x9c>",
     "<\xef\xbd\x9c"
     "fim\xe2\x96\x81"
     "end\xef\xbd\x9c>"},
};

/* Tokens that end a middle (when the vocabulary has them). */
static const char *const fim_ends[] = {"<|endoftext|>", "<|fim_pad|>", "<|file_sep|>",
                                       "<|repo_name|>", "<file_sep>",  "\xe2\x96\x81<EOT>",
                                       "<EOT>"};

int ci_srv_fim_markers(const cinfer_tokenizer *tok, int32_t ids[3]) {
  for (size_t m = 0; m < sizeof fim_markers / sizeof fim_markers[0]; m++) {
    int found = 1;
    for (int k = 0; k < 3 && found; k++)
      found = (ids[k] = cinfer_tokenizer_token_id(tok, fim_markers[m][k])) >= 0;
    if (found) return 1;
  }
  return 0;
}

int ci_srv_fim_prompt(ci_server *s, const char *prefix, size_t prefix_len, const char *suffix,
                      size_t suffix_len, ci_srv_job *job, char **err) {
  const cinfer_tokenizer *tok = s->o.tokenizer;
  int32_t marks[3];
  if (!ci_srv_fim_markers(tok, marks))
    return *err = strdup("suffix (fill-in-the-middle) needs a model whose tokenizer has FIM tokens "
                         "(<|fim_prefix|> <|fim_suffix|> <|fim_middle|>, or CodeLlama's <PRE> "
                         "<SUF> <MID>); this model's has none"),
           -1;
  /* the prefix: the prompt's text, or its token ids as given */
  int32_t *pre = NULL, *suf = NULL, *lead = NULL;
  size_t n_pre = 0, n_suf = 0, n_lead = 0;
  int failed = 0;
  if (prefix) {
    failed = cinfer_tokenizer_encode(tok, prefix, prefix_len, 0, &pre, &n_pre) != CINFER_OK;
  } else {
    pre = job->prompt; /* taken over */
    n_pre = (size_t)job->n_prompt;
    job->prompt = NULL;
    job->n_prompt = 0;
  }
  /* what the tokenizer puts before any text (a BOS), as llama.cpp's infill does */
  failed = failed ||
           cinfer_tokenizer_encode(tok, suffix, suffix_len, 0, &suf, &n_suf) != CINFER_OK ||
           cinfer_tokenizer_encode(tok, "", 0, 1, &lead, &n_lead) != CINFER_OK;
  const size_t n = n_lead + n_pre + n_suf + 3;
  int32_t *ids = failed ? NULL : malloc(n * sizeof *ids);
  if (ids) {
    size_t k = 0;
    for (size_t i = 0; i < n_lead; i++) ids[k++] = lead[i];
    ids[k++] = marks[0];
    for (size_t i = 0; i < n_pre; i++) ids[k++] = pre[i];
    ids[k++] = marks[1];
    for (size_t i = 0; i < n_suf; i++) ids[k++] = suf[i];
    ids[k++] = marks[2];
    cinfer_free(job->prompt);
    job->prompt = ids;
    job->n_prompt = (int)n;
  }
  cinfer_free(pre);
  cinfer_free(suf);
  cinfer_free(lead);
  if (!ids) return *err = strdup("out of memory"), -1;
  for (size_t i = 0; i < sizeof fim_ends / sizeof fim_ends[0]; i++) {
    const int32_t id = cinfer_tokenizer_token_id(tok, fim_ends[i]);
    if (id >= 0 && job->n_stop_ids < CI_SRV_MAX_STOP_IDS) job->stop_ids[job->n_stop_ids++] = id;
  }
  return 0;
}
