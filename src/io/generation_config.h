/* generation_config.json: the model's own sampling defaults and extra EOS ids (docs/generation.md
 * §3, §4.1). Each field carries a has_ flag, because precedence (request > CLI flag >
 * generation_config.json > built-in) needs to know what the file actually set. Also the EOS
 * set E: config.json's ids (already parsed into the model spec) ∪ generation_config.json's ∪
 * any the caller adds (the tokenizer's eos_token). */
#ifndef CI_IO_GENERATION_CONFIG_H
#define CI_IO_GENERATION_CONFIG_H

#include <jansson.h>
#include <stdint.h>

enum { CI_GEN_MAX_EOS = 16, CI_EOS_SET_MAX = 32 };

typedef struct {
  int has_temperature;
  float temperature; /* do_sample: false forces 0 (greedy) */
  int has_top_p;
  float top_p;
  int has_top_k;
  int top_k;
  int has_min_p;
  float min_p;
  int has_repetition_penalty;
  float repetition_penalty;
  int has_max_new_tokens;
  int max_new_tokens;
  int n_eos;
  int32_t eos_ids[CI_GEN_MAX_EOS]; /* eos_token_id, scalar or list */
} ci_generation_config;

/* Reads DIR/generation_config.json into *out. A missing file leaves every has_ flag 0 and is
 * not an error. Unknown keys are ignored; null values count as absent. Returns CI_ERR with a
 * message naming the file and the key for malformed JSON, a non-object top level, wrong types
 * or out-of-range values (temperature >= 0, top_p and min_p in [0, 1], top_k >= 0,
 * repetition_penalty > 0, max_new_tokens >= 1, eos ids >= 0). */
int ci_generation_config_load(const char *model_dir, ci_generation_config *out);

/* The same from a parsed object; `what` names the source in messages. */
int ci_generation_config_from_json(json_t *root, const char *what, ci_generation_config *out);

/* The EOS set: distinct ids in insertion order. */
typedef struct {
  int n;
  int32_t ids[CI_EOS_SET_MAX];
} ci_eos_set;

/* E = config_ids[0..n_config) (config.json, as the model spec parsed them: top level over
 * text_config) ∪ gen's eos ids (gen may be NULL). Returns CI_ERR only if more than
 * CI_EOS_SET_MAX distinct ids are given. */
int ci_eos_set_build(ci_eos_set *set, const int *config_ids, int n_config,
                     const ci_generation_config *gen);

/* Adds one id (the tokenizer's eos_token, stop_token_ids); duplicates and negative ids are
 * ignored. Returns CI_ERR when the set is full. */
int ci_eos_set_add(ci_eos_set *set, int32_t id);

/* Whether id is in the set. */
int ci_eos_set_contains(const ci_eos_set *set, int32_t id);

#endif
