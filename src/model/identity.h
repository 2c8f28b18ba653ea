/* Model identity: a 128-bit fingerprint of what a model computes with — its config.json and its
 * weights (every tensor's name, dtype, shape and place, and a sample of its bytes) — so that
 * KV blocks persisted by one model are never handed to another (engine/prompt_cache.h). Two
 * fine-tunes of one architecture share config and tensor layout but not their weight bytes. */
#ifndef CI_MODEL_IDENTITY_H
#define CI_MODEL_IDENTITY_H

#include "io/safetensors.h"

#include <stdint.h>

/* Fills out[0..2) with the fingerprint of the model in model_dir whose weights are w. Returns
 * CI_OK, or CI_ERR when config.json cannot be read. */
int ci_model_identity(const char *model_dir, const ci_weights *w, uint64_t out[2]);

#endif
