/* Public API basics: version, status names, the last error, freeing returned memory. */
#include "api/api_internal.h"

#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define CINFER_STR2(x) #x
#define CINFER_STR(x) CINFER_STR2(x)

const char *cinfer_version(void) {
  return CINFER_STR(CINFER_VERSION_MAJOR) "." CINFER_STR(CINFER_VERSION_MINOR) "." CINFER_STR(
      CINFER_VERSION_PATCH);
}

const char *cinfer_status_name(cinfer_status status) {
  switch (status) {
  case CINFER_OK:
    return "ok";
  case CINFER_DONE:
    return "done";
  case CINFER_TIMEOUT:
    return "timeout";
  case CINFER_ERROR:
    return "error";
  case CINFER_INVALID_ARGUMENT:
    return "invalid argument";
  case CINFER_UNSUPPORTED:
    return "unsupported";
  case CINFER_CANCELLED:
    return "cancelled";
  case CINFER_QUEUE_FULL:
    return "queue full";
  case CINFER_REJECTED:
    return "rejected";
  case CINFER_STOPPED:
    return "stopped";
  case CINFER_CONTEXT_EXCEEDED:
    return "context exceeded";
  case CINFER_OVER_BUDGET:
    return "over budget";
  }
  return "unknown status";
}

const char *cinfer_last_error(void) {
  return ci_last_error();
}

void cinfer_free(void *memory) {
  free(memory);
}

cinfer_status ci_api_fail(cinfer_status status, const char *fmt, ...) {
  char message[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(message, sizeof message, fmt, ap);
  va_end(ap);
  ci_fail("%s", message);
  return status;
}
