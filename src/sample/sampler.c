/* The sampler: processors, log-softmax and the §4.3 chain over a candidate list (see
 * sampler.h).
 *
 * Candidates are kept as 64-bit rank keys — an order-preserving encoding of lp in the high
 * half (descending) and the token id in the low half — so "higher lp first, ties to the lower
 * id" is plain integer order. Filters shrink the list; top-k and the min-p keep-guard use a
 * partial selection (no full sort), and top-p sorts only the prefix it keeps, widening it
 * until the kept mass reaches p. */
#include "sample/sampler.h"

#include "base/error.h"
#include "sample/greedy.h"
#include "sample/logprobs.h"
#include "sample/rng.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct ci_sampler {
  ci_sampler_params params; /* pointer fields point at bias / exempt below */
  ci_logit_bias *bias;      /* owned copy, [params.n_logit_bias] */
  int32_t *exempt;          /* owned copy, [params.n_xtc_exempt] */
  int vocab;
  ci_rng rng;
  uint64_t next_index; /* output index s of the next ci_sampler_next */
  float *lp;           /* [vocab] log_softmax of the processed logits of the last call */
  uint64_t *cand;      /* [vocab] rank keys of the surviving tokens */
  int32_t *counts;     /* [vocab] zeroed scratch for the penalty windows */
};

/* First top-p round looks at this many best candidates; each further round widens 8x. */
enum { TOP_P_FIRST_ROUND = 256, TOP_P_WIDEN = 8 };

/* ==== Parameters ==== */

void ci_sampler_params_default(ci_sampler_params *p) {
  memset(p, 0, sizeof *p);
  p->temperature = 0.7f;
  p->top_p = 1.0f;
  p->top_k = 0;
  p->min_p = 0.0f;
  p->min_tokens_to_keep = 1;
  p->xtc_probability = 0.0f;
  p->xtc_threshold = 0.1f;
  p->penalties = (ci_penalties){1.0f, 20, 0.0f, 20, 0.0f, 20};
}

/* Range checks of §4.1 as a table: field name, value, inclusive bounds. */
typedef struct {
  const char *name;
  float value;
  float min, max;
} float_range;

int ci_sampler_params_validate(const ci_sampler_params *p, int vocab) {
  const float_range ranges[] = {
      {"temperature", p->temperature, 0.0f, 5.0f},
      {"top_p", p->top_p, 0.0f, 1.0f},
      {"min_p", p->min_p, 0.0f, 1.0f},
      {"xtc_probability", p->xtc_probability, 0.0f, 1.0f},
      {"xtc_threshold", p->xtc_threshold, 0.0f, 0.5f},
      {"presence_penalty", p->penalties.presence, -2.0f, 2.0f},
      {"frequency_penalty", p->penalties.frequency, -2.0f, 2.0f},
  };
  for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++)
    if (!(ranges[i].value >= ranges[i].min && ranges[i].value <= ranges[i].max))
      return ci_fail("%s must be in [%g, %g]", ranges[i].name, (double)ranges[i].min,
                     (double)ranges[i].max);
  if (!(p->penalties.repetition > 0.0f) || !isfinite(p->penalties.repetition))
    return ci_fail("repetition_penalty must be a positive number");
  if (p->top_k < 0) return ci_fail("top_k must be an integer >= 0");
  if (p->min_tokens_to_keep < 1) return ci_fail("min_tokens_to_keep must be an integer >= 1");
  if (p->penalties.repetition_context < 0) return ci_fail("repetition_context_size must be >= 0");
  if (p->penalties.presence_context < 0) return ci_fail("presence_context_size must be >= 0");
  if (p->penalties.frequency_context < 0) return ci_fail("frequency_context_size must be >= 0");
  if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && !p->logit_bias))
    return ci_fail("logit_bias: bad entry count");
  for (int i = 0; i < p->n_logit_bias; i++) {
    const ci_logit_bias *b = &p->logit_bias[i];
    int bias_ok = (b->bias >= -100.0f && b->bias <= 100.0f) || b->bias == -INFINITY;
    if (b->id < 0 || b->id >= vocab || !bias_ok)
      return ci_fail("logit_bias must map token ids (< vocab size %d) to numbers in [-100, 100] "
                     "(entry %d: id %d, bias %g)",
                     vocab, i, (int)b->id, (double)b->bias);
  }
  if (p->n_xtc_exempt < 0 || (p->n_xtc_exempt > 0 && !p->xtc_exempt))
    return ci_fail("xtc exempt ids: bad entry count");
  return CI_OK;
}

/* ==== Creation ==== */

ci_sampler *ci_sampler_create(const ci_sampler_params *params, int vocab) {
  if (vocab < 1) {
    ci_fail("sampler: vocabulary size %d must be >= 1", vocab);
    return NULL;
  }
  if (ci_sampler_params_validate(params, vocab)) return NULL;
  ci_sampler *s = calloc(1, sizeof *s);
  if (!s) {
    ci_fail("out of memory");
    return NULL;
  }
  s->params = *params;
  s->vocab = vocab;
  s->lp = calloc((size_t)vocab, sizeof *s->lp);
  s->cand = malloc((size_t)vocab * sizeof *s->cand);
  s->counts = calloc((size_t)vocab, sizeof *s->counts);
  s->bias = malloc(((size_t)params->n_logit_bias + 1) * sizeof *s->bias);
  s->exempt = malloc(((size_t)params->n_xtc_exempt + 1) * sizeof *s->exempt);
  if (!s->lp || !s->cand || !s->counts || !s->bias || !s->exempt) {
    ci_sampler_free(s);
    ci_fail("out of memory for a sampler over %d tokens", vocab);
    return NULL;
  }
  if (params->n_logit_bias)
    memcpy(s->bias, params->logit_bias, (size_t)params->n_logit_bias * sizeof *s->bias);
  if (params->n_xtc_exempt)
    memcpy(s->exempt, params->xtc_exempt, (size_t)params->n_xtc_exempt * sizeof *s->exempt);
  s->params.logit_bias = s->bias;
  s->params.xtc_exempt = s->exempt;
  if (params->has_seed) {
    ci_rng_init(&s->rng, params->seed);
  } else if (ci_rng_init_os(&s->rng)) {
    ci_sampler_free(s);
    return NULL;
  }
  s->params.seed = s->rng.seed;
  s->params.has_seed = 1;
  return s;
}

void ci_sampler_free(ci_sampler *s) {
  if (!s) return;
  free(s->lp);
  free(s->cand);
  free(s->counts);
  free(s->bias);
  free(s->exempt);
  free(s);
}

const float *ci_sampler_logprobs(const ci_sampler *s) {
  return s->lp;
}

uint64_t ci_sampler_seed(const ci_sampler *s) {
  return s->rng.seed;
}

uint64_t ci_sampler_index(const ci_sampler *s) {
  return s->next_index;
}

const ci_sampler_params *ci_sampler_get_params(const ci_sampler *s) {
  return &s->params;
}

/* ==== Rank keys and partial selection ==== */

/* Ascending key order = descending lp, then ascending id. lp is never NaN here and -0 is
 * folded into +0 so that equal values tie on the id. */
static uint64_t rank_key(float lp, int32_t id) {
  uint32_t bits;
  if (lp == 0.0f) lp = 0.0f;
  memcpy(&bits, &lp, sizeof bits);
  uint32_t ascending = bits & 0x80000000u ? ~bits : bits | 0x80000000u;
  return (uint64_t)(~ascending) << 32 | (uint32_t)id;
}

static int32_t key_id(uint64_t key) {
  return (int32_t)(uint32_t)key;
}

static int compare_keys(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

static void swap_keys(uint64_t *a, uint64_t *b) {
  uint64_t t = *a;
  *a = *b;
  *b = t;
}

/* Rearranges a[0..n) so that a[0..k) hold the k smallest keys (the k best tokens), in no
 * particular order (0 < k < n). Quickselect with a median-of-three pivot; falls back to a sort
 * if it degenerates. */
static void select_best(uint64_t *a, size_t n, size_t k) {
  size_t lo = 0, hi = n - 1;
  int budget = 64;
  while (hi > lo) {
    if (budget-- == 0) {
      qsort(a + lo, hi - lo + 1, sizeof *a, compare_keys);
      return;
    }
    size_t mid = lo + (hi - lo) / 2;
    if (a[mid] < a[lo]) swap_keys(&a[mid], &a[lo]);
    if (a[hi] < a[lo]) swap_keys(&a[hi], &a[lo]);
    if (a[hi] < a[mid]) swap_keys(&a[hi], &a[mid]);
    swap_keys(&a[mid], &a[hi]); /* median as pivot at hi */
    const uint64_t pivot = a[hi];
    size_t store = lo;
    for (size_t i = lo; i < hi; i++)
      if (a[i] < pivot) swap_keys(&a[i], &a[store++]);
    swap_keys(&a[store], &a[hi]);
    if (store == k || store + 1 == k) return;
    if (store > k)
      hi = store - 1;
    else
      lo = store + 1;
  }
}

/* ==== The chain (§4.3) ==== */

/* The candidate list of one step. */
typedef struct {
  uint64_t *keys;
  size_t n;
  int sorted; /* keys[0..n) in rank order */
} candidates;

/* Position of the best candidate. */
static size_t best_position(const candidates *c) {
  if (c->sorted) return 0;
  size_t best = 0;
  for (size_t i = 1; i < c->n; i++)
    if (c->keys[i] < c->keys[best]) best = i;
  return best;
}

/* top-p: keep rank r iff the mass of ranks < r is < p; sorts only the kept prefix. */
static void filter_top_p(candidates *c, const float *lp, float top_p) {
  size_t done = 0; /* keys[0..done) are the best `done`, sorted */
  double mass = 0.0;
  size_t want = c->n < TOP_P_FIRST_ROUND ? c->n : TOP_P_FIRST_ROUND;
  for (;;) {
    if (want < c->n) select_best(c->keys + done, c->n - done, want - done);
    qsort(c->keys + done, want - done, sizeof *c->keys, compare_keys);
    for (size_t r = done; r < want; r++) {
      if (r > 0 && mass >= (double)top_p) {
        c->n = r;
        c->sorted = 1;
        return;
      }
      mass += exp((double)lp[key_id(c->keys[r])]);
    }
    done = want;
    if (done == c->n) {
      c->sorted = 1;
      return;
    }
    want = c->n / TOP_P_WIDEN < want ? c->n : want * TOP_P_WIDEN;
  }
}

/* min-p: drop t with lp_t < max(lp) + ln(min_p), except the min_keep best. */
static void filter_min_p(candidates *c, const float *lp, float min_p, int min_tokens_to_keep) {
  const float threshold = lp[key_id(c->keys[best_position(c)])] + logf(min_p);
  const size_t min_keep = (size_t)min_tokens_to_keep < c->n ? (size_t)min_tokens_to_keep : c->n;
  size_t survivors = 0;
  for (size_t i = 0; i < c->n; i++) survivors += !(lp[key_id(c->keys[i])] < threshold);
  if (survivors < min_keep) {
    /* The survivors are a rank prefix, so the protected set is just the min_keep best. */
    if (!c->sorted && min_keep < c->n) select_best(c->keys, c->n, min_keep);
    c->n = min_keep;
    return;
  }
  size_t kept = 0;
  for (size_t i = 0; i < c->n; i++)
    if (!(lp[key_id(c->keys[i])] < threshold)) c->keys[kept++] = c->keys[i];
  c->n = kept;
}

static int is_exempt(const ci_sampler_params *p, int32_t id) {
  for (int i = 0; i < p->n_xtc_exempt; i++)
    if (p->xtc_exempt[i] == id) return 1;
  return 0;
}

/* XTC: with probability xtc_probability, drop every non-exempt candidate whose renormalised
 * probability exceeds the threshold except the least likely of those, when there are >= 2. */
static void filter_xtc(candidates *c, const float *lp, const ci_sampler_params *p, uint64_t key) {
  if (ci_rng_uniform(key, CI_RNG_STREAM_XTC, 0) > (double)p->xtc_probability) return;
  const double max = lp[key_id(c->keys[best_position(c)])];
  double sum = 0.0;
  for (size_t i = 0; i < c->n; i++) sum += exp(lp[key_id(c->keys[i])] - max);
  size_t above = 0;
  double least = INFINITY;
  for (size_t i = 0; i < c->n; i++) {
    double prob = exp(lp[key_id(c->keys[i])] - max) / sum;
    if (prob > (double)p->xtc_threshold) {
      above++;
      if (prob < least) least = prob;
    }
  }
  if (above < 2) return;
  size_t kept = 0;
  for (size_t i = 0; i < c->n; i++) {
    int32_t id = key_id(c->keys[i]);
    if (exp(lp[id] - max) / sum > least && !is_exempt(p, id)) continue;
    c->keys[kept++] = c->keys[i];
  }
  c->n = kept;
}

/* top-k: keep the k best (partial selection unless already sorted). */
static void filter_top_k(candidates *c, int top_k) {
  if (top_k <= 0 || (size_t)top_k >= c->n) return;
  if (!c->sorted) select_best(c->keys, c->n, (size_t)top_k);
  c->n = (size_t)top_k;
}

/* Gumbel-max: argmax over candidates of lp_t / T + G_t, G_t = -ln(-ln u_t), u_t =
 * uniform(K_s, 0, t), in double; ties to the lower id. Since u <= 1 - 2^-25, G_t <= 17.33
 * (g_max, padded against libm rounding), so a candidate with lp_t / T + g_max below the best
 * score so far cannot win and its noise is never computed. */
static int32_t draw_gumbel(const candidates *c, const float *lp, double temperature, uint64_t key) {
  const double g_max = -log(-log(1.0 - 0x1p-25)) + 1e-6;
  const size_t first = best_position(c);
  int32_t best = key_id(c->keys[first]);
  double best_score =
      (double)lp[best] / temperature - log(-log(ci_rng_uniform(key, CI_RNG_STREAM_DRAW, best)));
  for (size_t i = 0; i < c->n; i++) {
    int32_t t = key_id(c->keys[i]);
    double base = (double)lp[t] / temperature;
    if (base + g_max < best_score || t == best) continue;
    double score = base - log(-log(ci_rng_uniform(key, CI_RNG_STREAM_DRAW, (uint64_t)t)));
    if (score > best_score || (score == best_score && t < best)) {
      best = t;
      best_score = score;
    }
  }
  return best;
}

/* ==== Sampling ==== */

int32_t ci_sampler_sample_at(ci_sampler *s, float *logits, const int32_t *history, size_t n_history,
                             uint64_t index) {
  const ci_sampler_params *p = &s->params;
  const int vocab = s->vocab;
  /* §4.2: processors in order (the grammar mask, processor 5, belongs to its caller). */
  ci_logits_apply_bias(logits, vocab, p->logit_bias, p->n_logit_bias);
  ci_logits_apply_penalties(logits, vocab, &p->penalties, history, n_history, s->counts);
  if (ci_log_softmax(logits, vocab, s->lp)) return -1;
  const float *lp = s->lp;
  if (p->temperature == 0.0f) return ci_argmax(lp, vocab);

  candidates c = {s->cand, 0, 0};
  for (int32_t t = 0; t < vocab; t++)
    if (lp[t] > -INFINITY) c.keys[c.n++] = rank_key(lp[t], t);
  const uint64_t key = ci_rng_key(&s->rng, index);
  if (p->top_p > 0.0f && p->top_p < 1.0f) filter_top_p(&c, lp, p->top_p);
  if (p->min_p > 0.0f) filter_min_p(&c, lp, p->min_p, p->min_tokens_to_keep);
  if (p->xtc_probability > 0.0f) filter_xtc(&c, lp, p, key);
  filter_top_k(&c, p->top_k);
  if (c.n == 1) return key_id(c.keys[0]);
  return draw_gumbel(&c, lp, (double)p->temperature, key);
}

int32_t ci_sampler_next(ci_sampler *s, float *logits, const int32_t *history, size_t n_history) {
  int32_t token = ci_sampler_sample_at(s, logits, history, n_history, s->next_index);
  if (token >= 0) s->next_index++;
  return token;
}
