/* Grammar mask benchmark: the time the structured-output token mask costs per generated token.
 * For one tokenizer.json it builds the grammar vocabulary (token bytes + trie), compiles a JSON
 * Schema, tokenizes a JSON document the schema accepts, and walks it token by token as a
 * generation would: at each step the mask is computed (the per-state cache on, as in serving) and
 * applied to a logits row, then the token is accepted. The same walk is repeated with every cache
 * dropped before each mask (the cold cost: a state never seen). Prints one JSON object.
 * Usage: mask_bench TOKENIZER_JSON [--reps N] */
#include "base/error.h"
#include "base/timing.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/vocab.h"
#include "text/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char SCHEMA[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"id\":{\"type\":\"string\",\"format\":\"uuid\"},"
    "\"name\":{\"type\":\"string\",\"maxLength\":64},"
    "\"email\":{\"type\":\"string\"},"
    "\"age\":{\"type\":\"integer\"},"
    "\"score\":{\"type\":\"number\"},"
    "\"active\":{\"type\":\"boolean\"},"
    "\"role\":{\"enum\":[\"admin\",\"editor\",\"viewer\"]},"
    "\"joined\":{\"type\":\"string\",\"format\":\"date\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":8},"
    "\"address\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\"},"
    "\"city\":{\"type\":\"string\"},\"zip\":{\"type\":\"string\"}},"
    "\"required\":[\"street\",\"city\"],\"additionalProperties\":false},"
    "\"notes\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}},"
    "\"required\":[\"id\",\"name\",\"email\",\"age\",\"score\",\"active\",\"role\",\"joined\","
    "\"tags\",\"address\",\"notes\"],\"additionalProperties\":false}";

static const char DOCUMENT[] =
    "{\"id\": \"123e4567-e89b-12d3-a456-426614174000\", \"name\": \"Ada Lovelace\", "
    "\"email\": \"ada@example.com\", \"age\": 36, \"score\": 97.25, \"active\": true, "
    "\"role\": \"editor\", \"joined\": \"1843-09-01\", \"tags\": [\"math\", \"engines\", "
    "\"poetry\"], \"address\": {\"street\": \"12 St James's Square\", \"city\": \"London\", "
    "\"zip\": \"SW1Y 4JH\"}, \"notes\": \"Wrote the first published algorithm for the "
    "Analytical Engine; translated Menabrea's memoir and added notes A to G.\"}";

static int compare_doubles(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

typedef struct {
  double mean_ms, p50_ms, p99_ms, max_ms;
} summary;

static summary summarize(double *t, int n) {
  summary s = {0};
  for (int i = 0; i < n; i++) s.mean_ms += t[i];
  s.mean_ms = s.mean_ms / n * 1e3;
  qsort(t, (size_t)n, sizeof *t, compare_doubles);
  s.p50_ms = t[n / 2] * 1e3;
  s.p99_ms = t[(int)((n - 1) * 0.99)] * 1e3;
  s.max_ms = t[n - 1] * 1e3;
  return s;
}

/* One walk over ids; cold drops the matcher's caches before each mask. Fills t[0..n]
 * (mask + apply per step, the final EOS step included). */
static int walk(ci_grammar *g, ci_grammar_vocab *v, const int32_t *ids, size_t n, int cold,
                float *logits, double *t) {
  ci_grammar_matcher *m = ci_grammar_matcher_create(g, v);
  if (!m) return CI_ERR;
  const int32_t eos = -1;
  for (size_t i = 0; i <= n; i++) {
    for (int k = 0; k < v->n_vocab; k++) logits[k] = (float)(k & 15);
    if (cold && ci_grammar_matcher_clear_cache(m)) return CI_ERR;
    const double t0 = ci_now_seconds();
    const int allowed = ci_grammar_matcher_apply(m, logits, &eos, 0);
    t[i] = ci_now_seconds() - t0;
    if (allowed < 0) return CI_ERR;
    if (i == n) break;
    if (logits[ids[i]] == -1.0f / 0.0f) {
      ci_grammar_matcher_free(m);
      return ci_fail("token %zu (id %d) of the document is masked", i, (int)ids[i]);
    }
    if (ci_grammar_matcher_accept_token(m, ids[i])) return CI_ERR;
  }
  const int complete = ci_grammar_matcher_is_complete(m);
  ci_grammar_matcher_free(m);
  return complete ? CI_OK : ci_fail("the document does not complete the grammar");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: mask_bench TOKENIZER_JSON [--reps N]\n");
    return 2;
  }
  int reps = 5;
  if (argc == 4 && !strcmp(argv[2], "--reps")) reps = atoi(argv[3]);
  if (reps < 1) reps = 1;
  ci_tokenizer *tok = ci_tokenizer_load_file(argv[1]);
  if (!tok) {
    fprintf(stderr, "mask_bench: %s\n", ci_last_error());
    return 1;
  }
  const int n_vocab = (int)ci_tokenizer_vocab_size(tok);
  double t0 = ci_now_seconds();
  ci_grammar_vocab *v = ci_grammar_vocab_from_tokenizer(tok, n_vocab);
  const double vocab_s = ci_now_seconds() - t0;
  t0 = ci_now_seconds();
  ci_grammar *g = ci_grammar_from_json_schema(SCHEMA, strlen(SCHEMA), 1);
  const double compile_s = ci_now_seconds() - t0;
  int32_t *ids = NULL;
  size_t n = 0;
  if (!v || !g || ci_tokenizer_encode(tok, DOCUMENT, strlen(DOCUMENT), 0, &ids, &n)) {
    fprintf(stderr, "mask_bench: %s\n", ci_last_error());
    return 1;
  }
  float *logits = malloc((size_t)n_vocab * sizeof *logits);
  const int steps = (int)(n + 1) * reps;
  double *warm = malloc((size_t)steps * sizeof *warm), *cold = malloc((size_t)steps * sizeof *cold);
  int rc = !logits || !warm || !cold ? ci_fail("out of memory") : CI_OK;
  for (int r = 0; r < reps && !rc; r++) {
    rc = walk(g, v, ids, n, 0, logits, warm + (size_t)r * (n + 1));
    if (!rc) rc = walk(g, v, ids, n, 1, logits, cold + (size_t)r * (n + 1));
  }
  if (rc) {
    fprintf(stderr, "mask_bench: %s\n", ci_last_error());
    return 1;
  }
  const summary w = summarize(warm, steps), c = summarize(cold, steps);
  printf("{\"tokenizer\": \"%s\", \"vocab\": %d, \"trie_nodes\": %d, \"vocab_build_ms\": %.1f, "
         "\"schema_compile_ms\": %.2f, \"document_tokens\": %zu, \"reps\": %d,\n"
         " \"warm\": {\"mean_ms\": %.4f, \"p50_ms\": %.4f, \"p99_ms\": %.4f, \"max_ms\": %.4f},\n"
         " \"cold\": {\"mean_ms\": %.4f, \"p50_ms\": %.4f, \"p99_ms\": %.4f, \"max_ms\": %.4f}}\n",
         argv[1], n_vocab, v->n_nodes, vocab_s * 1e3, compile_s * 1e3, n, reps, w.mean_ms, w.p50_ms,
         w.p99_ms, w.max_ms, c.mean_ms, c.p50_ms, c.p99_ms, c.max_ms);
  free(ids);
  free(logits);
  free(warm);
  free(cold);
  ci_grammar_free(g);
  ci_grammar_vocab_free(v);
  ci_tokenizer_free(tok);
  return 0;
}
