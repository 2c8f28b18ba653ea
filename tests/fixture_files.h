/* Reading the files of a test fixture folder (tests/fixtures/NAME): a whole file, and the token
 * ids of ids.txt. Header-only, for the test programs that compare against the fixtures' logits. */
#ifndef CI_TESTS_FIXTURE_FILES_H
#define CI_TESTS_FIXTURE_FILES_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Reads a whole file; returns a malloc'd buffer (NUL-terminated) and its size, or NULL. */
static inline char *fixture_read_file(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  if (buf) buf[n] = '\0';
  if (size) *size = buf ? (size_t)n : 0;
  return buf;
}

/* The comma- or space-separated ids of DIR/ids.txt (malloc'd, *n of them), or NULL. */
static inline int32_t *fixture_read_ids(const char *dir, int *n) {
  *n = 0;
  char path[1024];
  snprintf(path, sizeof path, "%s/ids.txt", dir);
  char *text = fixture_read_file(path, NULL);
  if (!text) return NULL;
  int32_t *ids = malloc((strlen(text) + 1) * sizeof *ids);
  int count = 0;
  for (char *tok = strtok(text, ",\n "); ids && tok; tok = strtok(NULL, ",\n "))
    ids[count++] = atoi(tok);
  free(text);
  *n = count;
  return ids;
}

#endif
