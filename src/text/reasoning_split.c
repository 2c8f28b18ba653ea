/* Reasoning split on <think> / </think> tags (see reasoning_split.h). */
#include "text/reasoning_split.h"

#include <stdlib.h>
#include <string.h>

static const char open_tag[] = "<think>";
static const char close_tag[] = "</think>";

struct ci_reasoning_split {
  int in_reasoning;
  char *pending; /* text not yet emitted: a possible partial tag at its end */
  size_t len, cap;
};

ci_reasoning_split *ci_reasoning_split_create(int in_reasoning) {
  ci_reasoning_split *s = calloc(1, sizeof *s);
  if (s) s->in_reasoning = in_reasoning;
  return s;
}

void ci_reasoning_split_free(ci_reasoning_split *s) {
  if (!s) return;
  free(s->pending);
  free(s);
}

/* Length of the longest suffix of text that is a proper prefix of tag. */
static size_t partial_suffix(const char *text, size_t len, const char *tag) {
  const size_t tag_len = strlen(tag);
  for (size_t k = tag_len - 1; k > 0; k--)
    if (k <= len && !memcmp(text + len - k, tag, k)) return k;
  return 0;
}

static const char *find(const char *hay, size_t len, const char *needle) {
  const size_t n = strlen(needle);
  for (size_t i = 0; i + n <= len; i++)
    if (!memcmp(hay + i, needle, n)) return hay + i;
  return NULL;
}

void ci_reasoning_split_push(ci_reasoning_split *s, const char *text, size_t len,
                             ci_reasoning_sink sink, void *ctx) {
  if (s->len + len + 1 > s->cap) {
    size_t cap = s->cap ? s->cap : 64;
    while (cap < s->len + len + 1) cap *= 2;
    char *bigger = realloc(s->pending, cap);
    if (!bigger) return;
    s->pending = bigger;
    s->cap = cap;
  }
  memcpy(s->pending + s->len, text, len);
  s->len += len;
  size_t start = 0;
  for (;;) {
    const char *tag = s->in_reasoning ? close_tag : open_tag;
    const char *hit = find(s->pending + start, s->len - start, tag);
    if (!hit) break;
    const size_t at = (size_t)(hit - s->pending);
    if (at > start) sink(ctx, s->in_reasoning, s->pending + start, at - start);
    start = at + strlen(tag);
    s->in_reasoning = !s->in_reasoning;
  }
  const char *tag = s->in_reasoning ? close_tag : open_tag;
  const size_t hold = partial_suffix(s->pending + start, s->len - start, tag);
  if (s->len - start > hold) sink(ctx, s->in_reasoning, s->pending + start, s->len - start - hold);
  memmove(s->pending, s->pending + s->len - hold, hold);
  s->len = hold;
}

void ci_reasoning_split_finish(ci_reasoning_split *s, ci_reasoning_sink sink, void *ctx) {
  if (s->len) sink(ctx, s->in_reasoning, s->pending, s->len);
  s->len = 0;
}

int ci_reasoning_prompt_open(const char *prompt, size_t len) {
  const char *last_open = NULL, *last_close = NULL;
  for (const char *p = prompt; (p = find(p, len - (size_t)(p - prompt), open_tag)); p++)
    last_open = p;
  for (const char *p = prompt; (p = find(p, len - (size_t)(p - prompt), close_tag)); p++)
    last_close = p;
  return last_open && (!last_close || last_close < last_open);
}
