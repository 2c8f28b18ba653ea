/* Feeding a prompt with progress on a terminal (see feed_progress.h). */
#include "cli/feed_progress.h"

#include <stdio.h>

cinfer_status ci_cli_feed(cinfer_session *session, const int32_t *ids, size_t n_ids, int show,
                          const volatile sig_atomic_t *interrupted) {
  if (!show || n_ids <= CI_CLI_FEED_STEP) return cinfer_session_feed(session, ids, n_ids, NULL, 0);
  cinfer_status status = CINFER_OK;
  size_t done = 0;
  while (status == CINFER_OK && done < n_ids) {
    if (interrupted && *interrupted) {
      status = CINFER_CANCELLED;
      break;
    }
    fprintf(stderr, "\rprefill %zu/%zu tokens (%d%%)", done, n_ids, (int)(100 * done / n_ids));
    fflush(stderr);
    const size_t n = n_ids - done < CI_CLI_FEED_STEP ? n_ids - done : CI_CLI_FEED_STEP;
    status = cinfer_session_feed(session, ids + done, n, NULL, 0);
    done += n;
  }
  fputs("\r\033[K", stderr); /* erase the progress line */
  fflush(stderr);
  return status;
}
