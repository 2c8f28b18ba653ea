/* Error reporting: a thread-local last-error buffer (see error.h). */
#include "base/error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

enum { CI_ERROR_CAP = 1024 };
static _Thread_local char last_error[CI_ERROR_CAP];

int ci_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return CI_ERR;
}

int ci_fail_if_unopenable(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f) {
    fclose(f);
    return 0;
  }
  ci_fail("cannot open %s: %s", path, strerror(errno));
  return 1;
}

int ci_fail_context(const char *fmt, ...) {
  char prefix[CI_ERROR_CAP];
  char previous[CI_ERROR_CAP];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(previous, last_error, sizeof previous);
  size_t used = strnlen(prefix, sizeof last_error - 3);
  memcpy(last_error, prefix, used);
  memcpy(last_error + used, ": ", 2);
  used += 2;
  size_t rest = strnlen(previous, sizeof last_error - used - 1);
  memcpy(last_error + used, previous, rest);
  last_error[used + rest] = '\0';
  return CI_ERR;
}

const char *ci_last_error(void) {
  return last_error;
}

void ci_clear_error(void) {
  last_error[0] = '\0';
}
