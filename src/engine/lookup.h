/* Prompt lookup drafting (docs/generation.md "Speculative decoding"): the n-gram drafter proposes
 * the tokens that followed the most recent earlier occurrence of the context's last m tokens, for
 * m from ngram_max down to ngram_min; no second model. */
#ifndef CI_ENGINE_LOOKUP_H
#define CI_ENGINE_LOOKUP_H

#include <stdint.h>

/* Writes up to max_drafts proposed continuations of context[0..n) to drafts and returns how many
 * (0 when no n-gram of length ngram_min..ngram_max recurs with a token after it). */
int ci_lookup_draft(const int32_t *context, int64_t n, int ngram_max, int ngram_min, int max_drafts,
                    int32_t *drafts);

#endif
