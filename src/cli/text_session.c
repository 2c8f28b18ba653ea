/* Text in and out for the generating verbs (see text_session.h). */
#include "cli/text_session.h"

#include "base/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ci_text_session_open(const char *model_dir, int need_template, ci_text_session *out) {
  memset(out, 0, sizeof *out);
  out->tokenizer = ci_tokenizer_load_dir(model_dir);
  if (!out->tokenizer) {
    fprintf(stderr, "cinfer: %s\n", ci_last_error());
    return 1;
  }
  out->chat_template = ci_chat_template_load_dir(model_dir);
  if (!out->chat_template && need_template) {
    fprintf(stderr, "cinfer: %s\n", ci_last_error());
    ci_text_session_close(out);
    return 1;
  }
  return 0;
}

void ci_text_session_close(ci_text_session *s) {
  ci_tokenizer_free(s->tokenizer);
  ci_chat_template_free(s->chat_template);
  memset(s, 0, sizeof *s);
}

static int32_t *encode(const ci_text_session *s, const char *text, size_t len, int add_special,
                       int *n_ids) {
  int32_t *ids = NULL;
  size_t n = 0;
  if (ci_tokenizer_encode(s->tokenizer, text, len, add_special, &ids, &n)) {
    fprintf(stderr, "cinfer: %s\n", ci_last_error());
    return NULL;
  }
  if (n == 0) {
    free(ids);
    fprintf(stderr, "cinfer: the prompt encodes to no tokens\n");
    return NULL;
  }
  *n_ids = (int)n;
  return ids;
}

int32_t *ci_text_session_plain(const ci_text_session *s, const char *text, int *n_ids) {
  return encode(s, text, strlen(text), 1, n_ids);
}

int32_t *ci_text_session_chat(const ci_text_session *s, json_t *messages, int *n_ids) {
  if (!s->chat_template) {
    fprintf(stderr, "cinfer: the model has no chat template\n");
    return NULL;
  }
  json_t *request = json_pack("{s:O, s:b}", "messages", messages, "add_generation_prompt", 1);
  char *rendered = NULL;
  size_t len = 0;
  int status = request ? ci_chat_template_render(s->chat_template, request, &rendered, &len)
                       : ci_fail("out of memory");
  json_decref(request);
  if (status) {
    fprintf(stderr, "cinfer: chat template: %s\n", ci_last_error());
    return NULL;
  }
  int32_t *ids = encode(s, rendered, len, 0, n_ids);
  free(rendered);
  return ids;
}

int ci_text_printer_init(ci_text_printer *p, const ci_text_session *s, const char *const *stop,
                         size_t n_stop, int echo) {
  memset(p, 0, sizeof *p);
  p->echo = echo;
  p->stream = ci_detok_stream_create(s->tokenizer, stop, n_stop, 1);
  if (!p->stream) {
    fprintf(stderr, "cinfer: %s\n", ci_last_error());
    return 1;
  }
  return 0;
}

void ci_text_printer_free(ci_text_printer *p) {
  ci_detok_stream_free(p->stream);
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
  const int r = ci_detok_stream_push(p->stream, id, &piece, &len);
  if (r < 0) return -1;
  if (emit(p, piece, len)) return -1;
  if (r == 1) p->stopped = 1;
  return r == 1 ? 1 : 0;
}

int ci_text_printer_finish(ci_text_printer *p) {
  if (p->stopped) return 0;
  const char *piece;
  size_t len;
  if (ci_detok_stream_finish(p->stream, &piece, &len) < 0) return -1;
  return emit(p, piece, len);
}
