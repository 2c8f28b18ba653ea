/* Public API streaming detokenizer: the internal detok stream (UTF-8 safe pieces, stop strings
 * matched across tokens and held back) behind an opaque handle. */
#include "api/api_internal.h"

#include "base/error.h"
#include "text/detok_stream.h"

#include <stdlib.h>

struct cinfer_detokenizer {
  ci_detok_stream *stream; /* owned */
};

cinfer_status cinfer_detokenizer_create(const cinfer_tokenizer *tokenizer, const char *const *stop,
                                        size_t n_stop, int skip_special, cinfer_detokenizer **out) {
  if (!out) return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_detokenizer_create: out is NULL");
  *out = NULL;
  if (!tokenizer || (!stop && n_stop))
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_detokenizer_create: NULL argument");
  for (size_t i = 0; i < n_stop; i++)
    if (!stop[i]) return ci_api_fail(CINFER_INVALID_ARGUMENT, "stop string %zu is NULL", i);
  cinfer_detokenizer *d = calloc(1, sizeof *d);
  if (!d) return ci_api_fail(CINFER_ERROR, "out of memory for a detokenizer");
  d->stream = ci_detok_stream_create(tokenizer->impl, stop, n_stop, skip_special);
  if (!d->stream) {
    free(d);
    return CINFER_ERROR;
  }
  *out = d;
  return CINFER_OK;
}

void cinfer_detokenizer_free(cinfer_detokenizer *detokenizer) {
  if (!detokenizer) return;
  ci_detok_stream_free(detokenizer->stream);
  free(detokenizer);
}

/* Maps a detok stream result (0, 1, CI_ERR) to a status. */
static cinfer_status result_of(int r) {
  return r < 0 ? CINFER_INVALID_ARGUMENT : r == 1 ? CINFER_DONE : CINFER_OK;
}

cinfer_status cinfer_detokenizer_push(cinfer_detokenizer *detokenizer, int32_t token,
                                      const char **piece, size_t *len) {
  if (!detokenizer || !piece || !len)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_detokenizer_push: NULL argument");
  *piece = "";
  *len = 0;
  return result_of(ci_detok_stream_push(detokenizer->stream, token, piece, len));
}

cinfer_status cinfer_detokenizer_finish(cinfer_detokenizer *detokenizer, const char **piece,
                                        size_t *len) {
  if (!detokenizer || !piece || !len)
    return ci_api_fail(CINFER_INVALID_ARGUMENT, "cinfer_detokenizer_finish: NULL argument");
  *piece = "";
  *len = 0;
  return result_of(ci_detok_stream_finish(detokenizer->stream, piece, len));
}

const char *cinfer_detokenizer_stop_string(const cinfer_detokenizer *detokenizer) {
  return detokenizer ? ci_detok_stream_stop_string(detokenizer->stream) : NULL;
}
