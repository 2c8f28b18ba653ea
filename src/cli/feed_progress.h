/* Feeding a prompt with progress: on a terminal, a long prompt is fed chunk by chunk with a
 * "prefill N/M tokens" line on stderr (erased when done), and an interrupt between chunks stops
 * it. Elsewhere it is one cinfer_session_feed. */
#ifndef CI_CLI_FEED_PROGRESS_H
#define CI_CLI_FEED_PROGRESS_H

#include "cinfer.h"

#include <signal.h>
#include <stddef.h>

/* Tokens per progress step. */
enum { CI_CLI_FEED_STEP = 512 };

/* Feeds ids to the session. show: print the progress line (the caller passes whether stderr is a
 * terminal); it appears only for prompts longer than one step. interrupted (may be NULL): when it
 * becomes non-zero between steps, feeding stops with CINFER_CANCELLED. Returns the feed's status
 * (the error in cinfer_last_error). */
cinfer_status ci_cli_feed(cinfer_session *session, const int32_t *ids, size_t n_ids, int show,
                          const volatile sig_atomic_t *interrupted);

#endif
