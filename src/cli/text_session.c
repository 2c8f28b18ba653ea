/* Text in and out for the generating verbs (see text_session.h). */
#include "cli/text_session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Encodes text; NULL (error printed) on failure or when it gives no tokens. */
static int32_t *encode(const cinfer_model *model, const char *text, size_t len, int add_special,
                       int *n_ids) {
  int32_t *ids = NULL;
  size_t n = 0;
  if (cinfer_tokenize(model, text, len, add_special, &ids, &n) != CINFER_OK) {
    fprintf(stderr, "cinfer: %s\n", cinfer_last_error());
    return NULL;
  }
  if (n == 0) {
    cinfer_free(ids);
    fprintf(stderr, "cinfer: the prompt encodes to no tokens\n");
    return NULL;
  }
  *n_ids = (int)n;
  return ids;
}

int32_t *ci_text_prompt_plain(const cinfer_model *model, const char *text, int *n_ids) {
  return encode(model, text, strlen(text), 1, n_ids);
}

int32_t *ci_text_prompt_chat(const cinfer_model *model, const cinfer_chat_template *own_template,
                             json_t *messages, int *n_ids) {
  const cinfer_chat_template *chat_template =
      own_template ? own_template : cinfer_model_chat_template(model);
  if (!chat_template) {
    fprintf(stderr, "cinfer: the model has no chat template\n");
    return NULL;
  }
  json_t *request = json_pack("{s:O, s:b}", "messages", messages, "add_generation_prompt", 1);
  char *request_text = request ? json_dumps(request, JSON_COMPACT) : NULL;
  json_decref(request);
  if (!request_text) {
    fprintf(stderr, "cinfer: out of memory\n");
    return NULL;
  }
  char *rendered = NULL;
  size_t len = 0;
  const cinfer_status status =
      cinfer_chat_template_render(chat_template, request_text, &rendered, &len);
  free(request_text);
  if (status != CINFER_OK) {
    fprintf(stderr, "cinfer: chat template: %s\n", cinfer_last_error());
    return NULL;
  }
  int32_t *ids = encode(model, rendered, len, 0, n_ids);
  cinfer_free(rendered);
  return ids;
}

int ci_text_printer_init(ci_text_printer *p, const cinfer_model *model, const char *const *stop,
                         size_t n_stop, int echo) {
  memset(p, 0, sizeof *p);
  p->echo = echo;
  const cinfer_tokenizer *tokenizer = cinfer_model_tokenizer(model);
  if (!tokenizer) {
    fprintf(stderr, "cinfer: the model folder has no tokenizer.json\n");
    return 1;
  }
  if (cinfer_detokenizer_create(tokenizer, stop, n_stop, 1, &p->detok) != CINFER_OK) {
    fprintf(stderr, "cinfer: %s\n", cinfer_last_error());
    return 1;
  }
  return 0;
}

void ci_text_printer_free(ci_text_printer *p) {
  cinfer_detokenizer_free(p->detok);
  free(p->text);
  memset(p, 0, sizeof *p);
}

/* Appends a piece to the transcript and prints it. */
static int emit(ci_text_printer *p, const char *piece, size_t len) {
  if (len == 0) return 0;
  if (p->len + len + 1 > p->cap) {
    size_t cap = p->cap ? p->cap : 256;
    while (cap < p->len + len + 1) cap *= 2;
    char *bigger = realloc(p->text, cap);
    if (!bigger) return -1;
    p->text = bigger;
    p->cap = cap;
  }
  memcpy(p->text + p->len, piece, len);
  p->len += len;
  p->text[p->len] = '\0';
  if (p->echo && (fwrite(piece, 1, len, stdout) != len || fflush(stdout) != 0)) return -1;
  return 0;
}

int ci_text_printer_on_token(void *ctx, int32_t id) {
  ci_text_printer *p = ctx;
  const char *piece;
  size_t len;
  const cinfer_status status = cinfer_detokenizer_push(p->detok, id, &piece, &len);
  if (status != CINFER_OK && status != CINFER_DONE) return -1;
  if (emit(p, piece, len)) return -1;
  if (status == CINFER_DONE) p->stopped = 1;
  return status == CINFER_DONE ? 1 : 0;
}

int ci_text_printer_finish(ci_text_printer *p) {
  if (p->stopped) return 0;
  const char *piece;
  size_t len;
  const cinfer_status status = cinfer_detokenizer_finish(p->detok, &piece, &len);
  if (status != CINFER_OK && status != CINFER_DONE) return -1;
  return emit(p, piece, len);
}
