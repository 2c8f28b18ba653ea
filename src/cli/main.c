/* cinfer command line: dispatches to one verb per file. */
#include <stdio.h>

int main(int argc, char **argv) {
  (void)argv;
  if (argc < 2) fprintf(stderr, "usage: cinfer <verb> [flags]\n");
  return 2;
}
