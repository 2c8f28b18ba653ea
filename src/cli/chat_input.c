/* Reading chat messages from a terminal (libedit) or a pipe (see chat_input.h). */
#include "cli/chat_input.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <editline/readline.h>

static const char block_mark[] = "\"\"\"";

void ci_chat_input_init(ci_chat_input *in) {
  memset(in, 0, sizeof *in);
  in->tty = isatty(STDIN_FILENO);
  if (in->tty) {
    rl_readline_name = "cinfer"; /* ~/.editrc entries for `cinfer:` apply */
    using_history();
  }
}

void ci_chat_input_free(ci_chat_input *in) {
  free(in->line);
  in->line = NULL;
  if (in->tty) clear_history();
}

/* One line without its newline (malloc'd), or NULL at end of input. */
static char *read_line(ci_chat_input *in, const char *prompt) {
  if (in->tty) return readline(prompt);
  size_t cap = in->cap;
  const ssize_t n = getline(&in->line, &cap, stdin);
  in->cap = cap;
  if (n < 0) return NULL;
  size_t len = (size_t)n;
  while (len > 0 && (in->line[len - 1] == '\n' || in->line[len - 1] == '\r')) len--;
  return strndup(in->line, len);
}

/* Appends a line of text to *msg (a newline first unless it is the first line). 0, or -1 when out
 * of memory. */
static int append(char **msg, size_t *len, const char *text, size_t n) {
  const size_t sep = *msg ? 1 : 0;
  char *bigger = realloc(*msg, *len + sep + n + 1);
  if (!bigger) return -1;
  if (sep) bigger[(*len)++] = '\n';
  memcpy(bigger + *len, text, n);
  *len += n;
  bigger[*len] = '\0';
  *msg = bigger;
  return 0;
}

char *ci_chat_input_read(ci_chat_input *in, int *oom) {
  *oom = 0;
  char *line = read_line(in, "> ");
  if (!line) return NULL;
  char *msg = NULL;
  size_t len = 0;
  int failed = 0;
  if (!strcmp(line, block_mark)) {
    /* a block: every line up to the closing mark, as typed */
    free(line);
    while (!failed && (line = read_line(in, "... "))) {
      const int closing = !strcmp(line, block_mark);
      if (!closing && append(&msg, &len, line, strlen(line))) failed = 1;
      free(line);
      if (closing) break;
    }
    if (!msg && !failed) msg = strdup("");
    if (!msg) failed = 1;
  } else {
    /* backslash continuation */
    for (;;) {
      size_t n = strlen(line);
      const int more = n > 0 && line[n - 1] == '\\';
      if (append(&msg, &len, line, more ? n - 1 : n)) failed = 1;
      free(line);
      if (failed || !more) break;
      if (!(line = read_line(in, "... "))) break;
    }
  }
  if (failed) {
    free(msg);
    *oom = 1;
    return NULL;
  }
  if (in->tty && len > 0 && msg[0] != '/') add_history(msg);
  return msg;
}
