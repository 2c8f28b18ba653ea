/* Prompt lookup drafting: a backwards scan for the latest earlier match of the context's suffix
 * (see lookup.h). */
#include "engine/lookup.h"

#include <string.h>

int ci_lookup_draft(const int32_t *context, int64_t n, int ngram_max, int ngram_min, int max_drafts,
                    int32_t *drafts) {
  if (ngram_min < 1) ngram_min = 1;
  if (max_drafts < 1) return 0;
  for (int m = ngram_max; m >= ngram_min; m--) {
    if (n < (int64_t)m + 1) continue;
    const int32_t *suffix = context + n - m;
    /* the most recent start i < n - m whose m tokens equal the suffix */
    for (int64_t i = n - m - 1; i >= 0; i--) {
      if (memcmp(context + i, suffix, (size_t)m * sizeof *context)) continue;
      int64_t avail = n - (i + m);
      if (avail > max_drafts) avail = max_drafts;
      memcpy(drafts, context + i + m, (size_t)avail * sizeof *drafts);
      return (int)avail;
    }
  }
  return 0;
}
