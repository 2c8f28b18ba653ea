/* The input side of `cinfer chat`: one user message at a time. On a terminal, lines are read
 * with libedit (line editing, and a history of the messages sent, recalled with the arrow keys);
 * piped input is read line by line. A message spans several lines when each but the last ends
 * in a backslash, or when it is a block between two lines holding only three double quotes. */
#ifndef CI_CLI_CHAT_INPUT_H
#define CI_CLI_CHAT_INPUT_H

typedef struct {
  int tty;    /* standard input is a terminal: libedit */
  char *line; /* getline's buffer (piped input) */
  unsigned long cap;
} ci_chat_input;

/* Sets the reader up for standard input. */
void ci_chat_input_init(ci_chat_input *in);
void ci_chat_input_free(ci_chat_input *in);

/* Reads one message. Returns it (malloc'd, without the final newline; a multi-line message keeps
 * its inner newlines), or NULL at end of input, when a line could not be read (libedit returns
 * none after an interrupt) or when out of memory (*oom set). A message read from a terminal goes
 * into the history. */
char *ci_chat_input_read(ci_chat_input *in, int *oom);

#endif
