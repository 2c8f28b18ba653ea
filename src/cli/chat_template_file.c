/* --chat-template FILE (render, serve, generate, chat): a chat template read from a Jinja file,
 * its bos_token/eos_token taken from another template (the model's) when one is given. */
#include "cinfer.h"
#include "cli/verbs.h"

#include <stdio.h>
#include <stdlib.h>

cinfer_chat_template *ci_cli_chat_template_file(const char *verb, const char *path,
                                                const cinfer_chat_template *tokens_from) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "cinfer %s: cannot open the chat template %s\n", verb, path);
    return NULL;
  }
  char *src = NULL;
  size_t len = 0, cap = 0;
  int oom = 0;
  for (;;) {
    if (len + 4097 > cap) {
      cap = cap ? cap * 2 : 65536;
      char *grown = realloc(src, cap);
      if (!grown) {
        oom = 1;
        break;
      }
      src = grown;
    }
    size_t got = fread(src + len, 1, cap - len - 1, f);
    len += got;
    if (!got) break;
  }
  fclose(f);
  if (!src || oom) {
    free(src);
    fprintf(stderr, "cinfer %s: out of memory reading %s\n", verb, path);
    return NULL;
  }
  src[len] = '\0';
  const char *bos = tokens_from ? cinfer_chat_template_bos_token(tokens_from) : NULL;
  const char *eos = tokens_from ? cinfer_chat_template_eos_token(tokens_from) : NULL;
  cinfer_chat_template *t = NULL;
  if (cinfer_chat_template_from_source(src, bos && *bos ? bos : NULL, eos && *eos ? eos : NULL,
                                       &t) != CINFER_OK)
    fprintf(stderr, "cinfer %s: %s: %s\n", verb, path, cinfer_last_error());
  free(src);
  return t;
}
